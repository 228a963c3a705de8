//! `/metrics` as a scraper reads it: series a dashboard can tell apart and sum correctly.

use sluice_control::Published;
use sluice_core::rules::parse_yaml;
use sluice_store::MemoryStore;
use sluiced::engine::Engine;
use sluiced::limits::Guard;
use sluiced::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;

/// Two domains, one rule id in each: rule ids are unique per domain only.
const RULES: &str = "domain: a
rules:
  - { id: per-key, key: [k], algorithm: fixed_window, limit: 10, window: 1h }
---
domain: b
rules:
  - { id: per-key, key: [k], algorithm: fixed_window, limit: 10, window: 1h }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_are_labelled_by_domain_and_rule_and_counters_are_counters() {
    let engine = Arc::new(Engine::new(
        Published::new(parse_yaml(RULES).expect("valid rules")),
        Arc::new(MemoryStore::default()),
        Arc::new(Metrics::default()),
        500,
        Duration::from_millis(3),
        "t".into(),
        Default::default(),
    ));
    for (domain, n) in [("a", 1), ("b", 2)] {
        for _ in 0..n {
            engine
                .check(domain, vec![("k".into(), "x".into())], 1)
                .await
                .expect("a valid check");
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = sluiced::http::router(engine, Arc::new(Guard::new(Default::default())));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let text = tokio::task::spawn_blocking(move || {
        sluice_testkit::http_get(addr, "/metrics").expect("GET /metrics")
    })
    .await
    .expect("join")
    .text();
    for line in [
        "sluice_decisions_total{domain=\"a\",rule=\"per-key\",outcome=\"allowed\"} 1",
        "sluice_decisions_total{domain=\"b\",rule=\"per-key\",outcome=\"allowed\"} 2",
        "# TYPE sluice_store_noscript_reloads_total counter",
        "sluice_store_late_calls_total{result=\"ran\"} 0",
        "sluice_store_late_calls_total{result=\"stale\"} 0",
        "sluice_store_late_calls_total{result=\"lost\"} 0",
        "sluice_store_skewed_calls_total 0",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    // Every series of a counter family ends in _total (Prometheus' rule for counters).
    for l in text.lines() {
        if let Some(name) = l
            .strip_prefix("# TYPE ")
            .and_then(|t| t.strip_suffix(" counter"))
        {
            assert!(
                name.ends_with("_total"),
                "counter {name} is not named _total"
            );
        }
    }
}
