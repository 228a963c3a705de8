//! Helpers shared by the Redis store's integration tests.
//!
//! Every test starts its own `redis-server` on a free port through sluice-testkit (never the
//! shared 6379) and fails loudly, with the install hint, when `redis-server` is missing.

#![allow(dead_code)]

pub mod cases;
pub mod script;

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

/// The wall clock in epoch µs, for the tests whose subject is Redis's real-time expiry or
/// its own clock (`TIME`): the daemon's clock, as the store gets it in `now`.
pub fn epoch_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A connection to `server` with `check.lua` loaded, and the script's SHA: for tests that
/// run the script by hand with the store's own encoding.
pub fn script_loaded(server: &RedisServer) -> (redis::Connection, String) {
    let mut conn = sync_conn(&server.url());
    let sha = load(&mut conn, sluice_store::redis::CHECK_SCRIPT);
    (conn, sha)
}

/// `SCRIPT LOAD`s a script, answering its SHA.
pub fn load(conn: &mut redis::Connection, body: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(body)
        .query(conn)
        .expect("SCRIPT LOAD")
}
