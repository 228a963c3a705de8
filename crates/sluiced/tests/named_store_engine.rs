//! The engine with a named store that is down, in-process: the identity an override moves
//! there is decided by its rule's failure mode (`local`: the named store's own fallback
//! buckets) and opens only that store's breaker, while every other identity is counted in
//! the main store as if nothing happened.

use sluice_control::Published;
use sluice_core::breaker::{BreakerConfig, BreakerState};
use sluice_core::decision::{Code, Via};
use sluice_core::rules::parse_yaml;
use sluice_store::{BoxFuture, MemoryStore, Store, StoreError};
use sluiced::engine::Engine;
use sluiced::metrics::Metrics;
use sluiced::stores::Backend;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A network store that is down: every call fails as an outage, and is counted.
#[derive(Default)]
struct Down {
    calls: AtomicU64,
}

impl Store for Down {
    fn check<'a>(
        &'a self,
        _call: &'a sluice_core::batch::Call,
    ) -> BoxFuture<'a, Result<sluice_core::batch::CallResult, StoreError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(StoreError::Unavailable("connection refused".into())) })
    }
    fn release<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Err(StoreError::Unavailable("connection refused".into())) })
    }
    fn kind(&self) -> &'static str {
        "down"
    }
}

const RULES: &str = r#"
domain: api
rules:
  - { id: q, key: [k], algorithm: fixed_window, limit: 4, window: 1h, on_store_failure: local }
overrides:
  - { identity: { k: big }, rule: q, store: bigcorp }
"#;

fn breaker() -> BreakerConfig {
    BreakerConfig {
        failure_pct: 50,
        window: 3_600_000_000,
        min_calls: 2,
        cool_off: 3_600_000_000,
        probes: 1,
    }
}

async fn codes(e: &Engine, k: &str, n: usize) -> Vec<(Code, Vec<Via>)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let c = e
            .check("api", vec![("k".into(), k.into())], 1)
            .await
            .expect("valid check");
        out.push((
            c.decision.code,
            c.decision.policies.iter().map(|p| p.via).collect(),
        ));
    }
    out
}

#[tokio::test]
async fn a_named_store_down_degrades_only_the_identities_counted_there() {
    let main = Arc::new(MemoryStore::new(1000));
    let down = Arc::new(Down::default());
    let mut e = Engine::new(
        Published::new(parse_yaml(RULES).expect("rules")),
        main.clone(),
        Arc::new(Metrics::default()),
        500,
        Duration::from_secs(1),
        "t".into(),
        breaker(),
    );
    e.add_store(Backend::new(
        "bigcorp",
        down.clone(),
        None,
        Duration::from_secs(1),
        breaker(),
    ));

    // k=big: bigcorp fails, so the rule's local bucket decides: 4 × 0.5 = 2 admitted.
    let big = codes(&e, "big", 4).await;
    let allowed = big.iter().filter(|(c, _)| *c == Code::Ok).count();
    assert_eq!(allowed, 2, "{big:?}");
    assert!(big.iter().all(|(_, v)| v == &[Via::Local]), "{big:?}");
    // Two failed calls opened bigcorp's breaker; the next two never reached it.
    assert_eq!(down.calls.load(Ordering::SeqCst), 2);
    let breakers = e.store_breakers();
    assert!(
        breakers.iter().any(|(s, _, st, opened)| *s == "bigcorp"
            && matches!(st, BreakerState::Open { .. })
            && *opened == 1),
        "{breakers:?}"
    );

    // k=small: counted in the main store to its limit, no failure mode, main breaker: none
    // (a memory store has no outages).
    let small = codes(&e, "small", 5).await;
    let got: Vec<Code> = small.iter().map(|(c, _)| *c).collect();
    assert_eq!(
        got,
        [Code::Ok, Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]
    );
    assert!(
        small.iter().all(|(_, v)| !v.contains(&Via::Local)),
        "{small:?}"
    );
    // The main store holds k=small's count and never saw k=big (the same key, but for big).
    let small_key =
        sluice_core::keys::store_key("api|k=small", "q", sluice_core::algo::Kind::FixedWindow);
    assert!(
        main.get(&small_key, e.now()).is_some(),
        "{small_key} in the main store"
    );
    assert!(
        main.get(&small_key.replace("small", "big"), e.now())
            .is_none()
    );
    let failures: Vec<(String, [(&str, u64); 3])> = e
        .store_failures()
        .into_iter()
        .map(|(s, f)| (s.to_string(), f.all()))
        .collect();
    assert_eq!(
        failures,
        [
            (
                "default".to_string(),
                [("open", 0), ("closed", 0), ("local", 0)]
            ),
            (
                "bigcorp".to_string(),
                [("open", 0), ("closed", 0), ("local", 4)]
            ),
        ]
    );
}
