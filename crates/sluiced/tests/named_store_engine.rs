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

/// A store that is down until it is switched up, then a memory store.
struct Switch {
    up: std::sync::atomic::AtomicBool,
    mem: MemoryStore,
}

impl Store for Switch {
    fn check<'a>(
        &'a self,
        call: &'a sluice_core::batch::Call,
    ) -> BoxFuture<'a, Result<sluice_core::batch::CallResult, StoreError>> {
        if self.up.load(Ordering::SeqCst) {
            self.mem.check(call)
        } else {
            Box::pin(async { Err(StoreError::Unavailable("connection refused".into())) })
        }
    }
    fn release<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Ok(false) })
    }
    fn outages(&self) -> bool {
        true
    }
    fn kind(&self) -> &'static str {
        "switch"
    }
}

/// A daily quota of k=big counts in bigcorp. While bigcorp is down its admissions (decided on
/// the local buckets) go to bigcorp's journal, not the main store's; once bigcorp is up, that
/// journal replays them into bigcorp, so the day's total there holds the outage's admissions.
#[tokio::test]
async fn a_named_stores_journal_replays_its_outages_admissions_into_that_store() {
    const QUOTA: &str = r#"
domain: api
rules:
  - { id: day, key: [k], algorithm: fixed_window, limit: 10, window: 1d, on_store_failure: local }
overrides:
  - { identity: { k: big }, rule: day, store: bigcorp }
"#;
    let dir = sluice_testkit::TempDir::new("named-journal").expect("temp dir");
    let main = Arc::new(MemoryStore::new(1000));
    let big = Arc::new(Switch {
        up: false.into(),
        mem: MemoryStore::new(1000),
    });
    let mut e = Engine::new(
        Published::new(parse_yaml(QUOTA).expect("rules")),
        main.clone(),
        Arc::new(Metrics::default()),
        500,
        Duration::from_secs(1),
        "t".into(),
        breaker(),
    );
    let open = |name: &str| {
        Arc::new(sluiced::journal::Journal::open(dir.path().join(name)).expect("a journal"))
    };
    e.journal = Some(open("journal"));
    let mut b = Backend::new(
        "bigcorp",
        big.clone(),
        None,
        Duration::from_secs(1),
        breaker(),
    );
    b.journal = Some(open("journal.bigcorp"));
    e.add_store(b);

    // Local buckets at half: 5 of 10 admitted through the outage, each journaled.
    let got = codes(&e, "big", 7).await;
    assert_eq!(
        got.iter().filter(|(c, _)| *c == Code::Ok).count(),
        5,
        "{got:?}"
    );
    let main_j = e.journal.clone().expect("main journal");
    let big_j = e
        .named_stores()
        .iter()
        .find(|b| &*b.name == "bigcorp")
        .and_then(|b| b.journal.clone())
        .expect("bigcorp's journal");
    assert_eq!((main_j.backlog(), big_j.backlog()), (0, 5));

    // Still down: a replay keeps every entry.
    let now = e.now();
    assert_eq!(
        big_j
            .replay(big.as_ref(), now, Duration::from_secs(1))
            .await,
        (0, 5)
    );
    big.up.store(true, Ordering::SeqCst);
    assert_eq!(
        big_j
            .replay(big.as_ref(), now, Duration::from_secs(1))
            .await,
        (5, 0)
    );
    assert_eq!(big_j.backlog(), 0);
    // bigcorp's day now counts the 5; the main store never saw k=big.
    let key =
        sluice_core::keys::store_key("api|k=big", "day", sluice_core::algo::Kind::FixedWindow);
    let window = sluice_core::algo::Window::Epoch(86_400 * 1_000_000);
    let (start, _) = window.bounds(now);
    let stored = big
        .mem
        .get(&format!("{key}:{start}"), now)
        .or_else(|| big.mem.get(&key, now));
    assert!(
        matches!(
            stored,
            Some(sluice_core::State::FixedWindow { count: 5, .. })
        ),
        "{stored:?}"
    );
    assert!(main.get(&format!("{key}:{start}"), now).is_none());
    assert!(main.get(&key, now).is_none());
}
