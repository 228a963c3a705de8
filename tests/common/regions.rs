//! What the multi-region tests share: the wall clock in epoch milliseconds (the daemons'
//! windows are epoch-aligned), a metric read, an HTTP check, and load paced on an absolute
//! schedule that stays clear of window boundaries.

use serde_json::Value;
use sluice_testkit::{Daemon, Metrics, cargo_bin, http_request};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Now, epoch milliseconds: what a daemon's windows are aligned to.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A metric's value (`name` or `name{labels}` exactly), 0 when absent or unreadable.
pub fn metric(http: SocketAddr, series: &str) -> f64 {
    Metrics::scrape(http)
        .ok()
        .and_then(|m| m.get(series))
        .unwrap_or(0.0)
}

/// Cross-region datagrams a daemon sent, from its metrics: what tells a region's one sender
/// from a second one.
pub const CROSS_SENT: &str = "sluice_gossip_scope_packets_sent_total{scope=\"cross_region\"}";

/// `POST /v1/limits:check` with `body`; the answer when it is a 200 with JSON.
pub fn check(http: SocketAddr, body: &Value) -> Option<Value> {
    let r = http_request(
        http,
        "POST",
        "/v1/limits:check",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .ok()?;
    (r.status == 200)
        .then(|| serde_json::from_slice(&r.body).ok())
        .flatten()
}

/// Calls `each` `rate` times a second on an absolute schedule (a slow call is caught up on,
/// not skipped) until `stop`, with the call's time in epoch ms, and keeps what it returns.
/// Calls that would fall within 15 ms of a boundary of `window_ms` are left out, so the
/// client and the daemon agree on the window of every request.
pub fn pace<T>(
    rate: f64,
    window_ms: u64,
    stop: &AtomicBool,
    mut each: impl FnMut(u64) -> Option<T>,
) -> Vec<T> {
    let mut out = Vec::new();
    let start = Instant::now();
    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let due = start + gap * n;
        n += 1;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = now_ms();
        if !(15..window_ms - 15).contains(&(t % window_ms)) {
            continue;
        }
        out.extend(each(t));
    }
    out
}

/// Waits until `f` holds, polling; a timeout is a test failure naming `what`, never a
/// measurement.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One global rule for the gossip tests of whole fleets: 1,000 a minute per API key on
/// `GET /global`, a sliding window shared by every region.
pub const GLOBAL_RULES: &str = r#"
domain: public-api
rules:
  - id: global-1m
    match: { route: "GET /global" }
    key: [api_key]
    algorithm: sliding_window
    limit: 1000
    window: 1m
    scope: global
"#;

/// Starts `sluiced` on `config` with gossip frames keyed by `key`, logging gossip at info
/// (its sender election's pass-overs and takeovers show in a failed test's output), and
/// waits until `http` says it is healthy.
pub fn gossip_daemon(config: &Path, key: &str, http: SocketAddr) -> Daemon {
    let bin = cargo_bin("sluiced").expect("sluiced is built (cargo build --workspace --bins)");
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn,sluice_gossip=info")
        .env("SLUICE_GOSSIP_KEY", key);
    let mut daemon = Daemon::from_command(cmd).expect("spawn sluiced");
    daemon
        .wait_http_ok(http, "/healthz", Duration::from_secs(30))
        .expect("sluiced becomes healthy");
    daemon
}
