//! What the node tests share: a rule lookup that knows one global rule, a node config tuned
//! for fast tests on loopback, and a bounded wait.

use sluice_core::algo::Window;
use sluice_core::{Micros, Params};
use sluice_gossip::{Config, RuleLookup, now_micros};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The rule's window: an hour, so a test (seconds) runs inside one window once
/// [`clear_of_window_end`] has been called; a figure that crossed a boundary would land in
/// another window than the one the test reads.
pub const WINDOW: Micros = 3_600_000_000;

/// Knows one global rule, `g`: 1,000 per hour. Everything else is unknown.
pub struct OneRule;

impl RuleLookup for OneRule {
    fn global_params(&self, _identity: &str, rule: &str) -> Option<Params> {
        (rule == "g").then_some(params())
    }
}

/// The rule `g`'s parameters.
pub fn params() -> Params {
    Params::FixedWindow {
        limit: 1000,
        window: Window::Epoch(WINDOW),
    }
}

/// A node of `region` on a free loopback port, shipping every 100 ms, gossiping every 50 ms.
pub fn cfg(region: &str, id: &str, seeds: &[SocketAddr], key: Option<&[u8]>) -> Config {
    let mut c = Config::new(region, id, ([127, 0, 0, 1], 0).into());
    c.seeds = seeds.iter().map(|s| s.to_string()).collect();
    c.key = key.map(<[u8]>::to_vec);
    c.ship_interval = Duration::from_millis(100);
    c.gossip_interval = Duration::from_millis(50);
    c
}

/// Waits until `f` holds; a timeout is a test failure, never a measurement.
pub async fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Returns at least a minute before the rule's window ends: waits for the next window
/// when the test would otherwise start later than that (once an hour, under a minute).
pub async fn clear_of_window_end() {
    let left = WINDOW - now_micros() % WINDOW;
    if left < 60_000_000 {
        tokio::time::sleep(Duration::from_micros(left + 10_000)).await;
    }
}
