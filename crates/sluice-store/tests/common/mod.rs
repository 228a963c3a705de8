//! Helpers shared by the Redis store's integration tests.
//!
//! Every test starts its own `redis-server` on a free port through sluice-testkit (never the
//! shared 6379) and fails loudly, with the install hint, when `redis-server` is missing.

#![allow(dead_code)]

pub mod cases;

use sluice_store::redis::RedisConfig;
use sluice_testkit::RedisServer;

/// A fresh standalone `redis-server`; panics with testkit's message (how to install it) when
/// it cannot start, so a missing server fails the test instead of skipping it.
pub fn redis() -> RedisServer {
    match RedisServer::start() {
        Ok(s) => s,
        Err(e) => panic!("this test needs a real redis-server: {e:#}"),
    }
}

/// A store config for a test server: the production defaults, except a deadline generous
/// enough for a loaded 2-core CI machine (the 3 ms default is tested on its own).
pub fn config(url: String) -> RedisConfig {
    RedisConfig {
        timeout_ms: 2_000,
        connect_timeout_ms: 2_000,
        ..RedisConfig::standalone(url)
    }
}

/// A blocking redis-rs connection for assertions.
pub fn sync_conn(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("a test connection to the test redis-server")
}

/// splitmix64: a tiny seeded generator, so every random sequence can be replayed from its
/// seed printed on failure.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `pct`%.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.next_u64() % 100 < pct
    }
}
