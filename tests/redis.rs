//! Daemons sharing one Redis, end to end: exact counts under contention.

use serde_json::{Value, json};
use sluice_testkit::{Daemon, RedisServer, cargo_bin, free_ports, http_request};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Starts a sluiced on `redis` with `rules`, returning it and its HTTP address.
pub fn daemon(redis: &str, rules: &str, extra: &[&str]) -> (Daemon, SocketAddr) {
    let ports = free_ports(2);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let dir = std::env::temp_dir().join(format!(
        "sluice-redis-e2e-{}-{}",
        std::process::id(),
        ports[0]
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, rules).expect("write rules");
    let grpc = format!("127.0.0.1:{}", ports[1]);
    let http_s = http.to_string();
    let mut args = vec![
        "--rules",
        path.to_str().expect("utf-8"),
        "--http-addr",
        &http_s,
        "--grpc-addr",
        &grpc,
        "--redis",
        redis,
    ];
    args.extend_from_slice(extra);
    let mut d = Daemon::spawn(
        cargo_bin("sluiced").expect("sluiced built"),
        &args,
        &[("RUST_LOG", "info")],
    )
    .expect("spawn sluiced");
    d.wait_http_ok(http, "/healthz", Duration::from_secs(20))
        .expect("healthy");
    (d, http)
}

fn check(http: SocketAddr, body: &Value) -> Value {
    let r = http_request(
        http,
        "POST",
        "/v1/limits:check",
        &[],
        body.to_string().as_bytes(),
    )
    .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_slice(&r.body).expect("json")
}

#[test]
fn two_daemons_64_clients_one_key_exactly_the_limit() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let rules = "domain: api\nrules:\n  - { id: hourly, key: [api_key], algorithm: fixed_window, limit: 1000, window: 1d, on_store_failure: closed }\n";
    // A generous deadline: this test is about exactness, not latency, on a loaded 2-core box.
    let (_a, a) = daemon(&redis.url(), rules, &["--store-timeout-ms", "2000"]);
    let (_b, b) = daemon(&redis.url(), rules, &["--store-timeout-ms", "2000"]);
    let allowed = Arc::new(AtomicU64::new(0));
    let over = Arc::new(AtomicU64::new(0));
    let unavailable = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..64)
        .map(|i| {
            let (allowed, over, unavailable) = (allowed.clone(), over.clone(), unavailable.clone());
            let addr = if i % 2 == 0 { a } else { b };
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let v = check(
                        addr,
                        &json!({"domain": "api", "descriptors": {"api_key": "hot"}}),
                    );
                    match v["code"].as_str() {
                        Some("OK") => allowed.fetch_add(1, Ordering::Relaxed),
                        Some("OVER_LIMIT") => over.fetch_add(1, Ordering::Relaxed),
                        _ => unavailable.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let (ok, over, unav) = (
        allowed.load(Ordering::Relaxed),
        over.load(Ordering::Relaxed),
        unavailable.load(Ordering::Relaxed),
    );
    assert_eq!(unav, 0, "no store failures expected");
    assert_eq!(ok, 1000, "exactly the limit admitted (over {over})");
    assert_eq!(over, 600);
    // Both daemons agree on what Redis holds.
    let v = check(
        a,
        &json!({"domain": "api", "descriptors": {"api_key": "hot"}, "cost": 0}),
    );
    assert_eq!(v["policies"][0]["remaining"], 0);
}
