//! The engine's store guard: the circuit breaker per shard, the local fallback, the hot-key
//! layer's answers through an outage, and what a bug or a cancelled check does to them.
//! Driven in-process against a scripted store whose answers the test sets per identity, so
//! every path is reached on purpose.

use sluice_control::Published;
use sluice_core::breaker::BreakerConfig;
use sluice_core::decision::{Code, Via};
use sluice_core::rules::parse_yaml;
use sluice_core::time::SECOND;
use sluice_core::{Micros, Params, Remote};
use sluice_store::{BoxFuture, MemoryStore, Store, StoreError};
use sluiced::clock::ManualClock;
use sluiced::engine::{Engine, RemoteSource};
use sluiced::metrics::Metrics;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the scripted store does for one identity's calls.
#[derive(Clone, Debug)]
enum Act {
    /// Answer from an in-memory store.
    Answer,
    /// Fail with this error.
    Fail(StoreError),
    /// Never answer.
    Hang,
    /// Answer from the in-memory store after this long.
    Slow(Duration),
}

/// A store that answers as told per identity (`k` descriptor value), places identities whose
/// value starts with `s1` on shard 1 (the rest on shard 0), and counts the calls it received.
struct Scripted {
    inner: MemoryStore,
    acts: Mutex<HashMap<String, Act>>,
    received: AtomicU64,
    no_outages: bool,
}

impl Scripted {
    fn new() -> Arc<Scripted> {
        Arc::new(Scripted {
            inner: MemoryStore::default(),
            acts: Mutex::new(HashMap::new()),
            received: AtomicU64::new(0),
            no_outages: false,
        })
    }

    fn set(&self, k: &str, act: Act) {
        self.acts
            .lock()
            .expect("lock")
            .insert(format!("k={k}}}"), act);
    }

    fn act(&self, key: &str) -> Act {
        let acts = self.acts.lock().expect("lock");
        acts.iter()
            .find(|(tag, _)| key.contains(tag.as_str()))
            .map(|(_, a)| a.clone())
            .unwrap_or(Act::Answer)
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }
}

impl Store for Scripted {
    fn check<'a>(
        &'a self,
        call: &'a sluice_core::batch::Call,
    ) -> BoxFuture<'a, Result<sluice_core::batch::CallResult, StoreError>> {
        self.received.fetch_add(1, Ordering::SeqCst);
        let act = self.act(&call.items[0].key);
        Box::pin(async move {
            match act {
                Act::Answer => self.inner.check_sync(call),
                Act::Fail(e) => Err(e),
                Act::Hang => std::future::pending().await,
                Act::Slow(d) => {
                    tokio::time::sleep(d).await;
                    self.inner.check_sync(call)
                }
            }
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        request_id: &'a str,
        now: Micros,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let r = match self.act(key) {
            Act::Fail(e) => Err(e),
            _ => Ok(self.inner.release_sync(key, request_id, now)),
        };
        Box::pin(std::future::ready(r))
    }

    fn shard_of(&self, key: &str) -> usize {
        usize::from(key.contains("k=s1"))
    }

    fn outages(&self) -> bool {
        !self.no_outages
    }

    fn kind(&self) -> &'static str {
        "scripted"
    }
}

const RULES: &str = "domain: d
rules:
  - { id: open, match: { route: open }, key: [k], algorithm: fixed_window, limit: 1000, window: 1h, on_store_failure: open }
  - { id: closed, match: { route: closed }, key: [k], algorithm: fixed_window, limit: 1000, window: 1h, on_store_failure: closed }
  - { id: local, match: { route: local }, key: [k], algorithm: fixed_window, limit: 4, window: 1h, on_store_failure: local }
  - { id: conc, match: { route: conc }, key: [k], algorithm: concurrency, limit: 2, timeout: 10s, on_store_failure: open }
  - { id: global, match: { route: global }, key: [k], algorithm: fixed_window, limit: 5, window: 1m, scope: global, on_store_failure: closed }
";

/// A breaker that opens after 2 calls with more than half failed, probes once, and cools
/// off for `cool_off`.
fn breaker(cool_off: Micros) -> BreakerConfig {
    BreakerConfig {
        failure_pct: 50,
        window: 60 * SECOND,
        min_calls: 2,
        cool_off,
        probes: 1,
    }
}

fn engine(store: Arc<Scripted>, cfg: BreakerConfig) -> Engine {
    Engine::new(
        Published::new(parse_yaml(RULES).expect("valid rules")),
        store,
        Arc::new(Metrics::default()),
        500,
        Duration::from_secs(30),
        "t".into(),
        cfg,
    )
}

async fn check(e: &Engine, route: &str, k: &str) -> sluice_core::decision::Decision {
    e.check(
        "d",
        vec![("route".into(), route.into()), ("k".into(), k.into())],
        1,
    )
    .await
    .expect("a valid check")
    .decision
}

fn unavailable() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

/// Opens shard 0's breaker with two failed calls on identity `k`.
async fn open_shard_0(e: &Engine, store: &Scripted, k: &str) {
    store.set(k, Act::Fail(unavailable()));
    for _ in 0..2 {
        assert_eq!(check(e, "open", k).await.policies[0].via, Via::FailedOpen);
    }
}

/// A half-open probe whose check is cancelled while the store call is in flight (client
/// gone, gRPC deadline) gives its probe back: the shard is called again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_probe_is_released() {
    let store = Scripted::new();
    let e = Arc::new(engine(store.clone(), breaker(1)));
    open_shard_0(&e, &store, "a").await;
    store.set("a", Act::Hang);
    let before = store.received();
    let task = {
        let e = e.clone();
        tokio::spawn(async move { check(&e, "open", "a").await })
    };
    // The probe is in the store once the store has received it.
    while store.received() == before {
        assert!(!task.is_finished(), "the probe never reached the store");
        tokio::task::yield_now().await;
    }
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    store.set("a", Act::Answer);
    let before = store.received();
    let d = check(&e, "open", "a").await;
    assert_eq!(
        store.received(),
        before + 1,
        "the shard was never called again after cancelled probes"
    );
    assert_eq!(d.policies[0].via, Via::Store);
}

/// The breaker's cool-off runs on the monotonic clock: the wall clock stepped back an hour
/// (NTP, an operator) while a shard's breaker is open does not keep it open an hour longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_step_back_does_not_stretch_an_outage() {
    const T: Micros = 1_800_000_000 * SECOND;
    let store = Scripted::new();
    let clock = Arc::new(ManualClock::new(T));
    let e = engine(store.clone(), breaker(10 * SECOND)).with_clock(clock.clone());
    open_shard_0(&e, &store, "a").await;
    store.set("a", Act::Answer);
    let before = store.received();
    assert_eq!(
        check(&e, "open", "a").await.policies[0].via,
        Via::FailedOpen
    );
    assert_eq!(store.received(), before, "open: the shard is not called");
    clock.set_wall(T - 3_600 * SECOND);
    clock.advance(10 * SECOND);
    let d = check(&e, "open", "a").await;
    assert_eq!(
        store.received(),
        before + 1,
        "the cool-off was stretched by the wall clock's step"
    );
    assert_eq!(d.policies[0].via, Via::Store);
}

/// Corrupt state and bad arguments are answered by the rule's failure mode but are not
/// outages: they never open the shard's breaker for every other identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_that_are_not_outages_keep_the_breaker_closed() {
    let store = Scripted::new();
    let e = engine(store.clone(), breaker(3_600 * SECOND));
    store.set(
        "bad",
        Act::Fail(StoreError::Corrupt {
            key: "sl:{d|k=bad}:f:closed".into(),
            detail: "holds a zset".into(),
        }),
    );
    store.set(
        "arg",
        Act::Fail(StoreError::Server("SLUICE_BADARG x".into())),
    );
    for k in ["bad", "arg"] {
        for _ in 0..10 {
            let d = check(&e, "closed", k).await;
            assert_eq!(d.code, Code::Unavailable, "the rule's mode answers");
        }
    }
    let before = store.received();
    let d = check(&e, "closed", "fine").await;
    assert_eq!(store.received(), before + 1, "the breaker opened");
    assert_eq!(d.code, Code::Ok);
}

/// A store that has no outages (the in-memory store) is never put behind a breaker: what
/// fails for one rule never refuses another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_outages_has_no_breaker() {
    assert!(!MemoryStore::default().outages());
    let store = Arc::new(Scripted {
        no_outages: true,
        ..Arc::into_inner(Scripted::new()).expect("sole owner")
    });
    let e = engine(store.clone(), breaker(3_600 * SECOND));
    store.set("x", Act::Fail(unavailable()));
    for _ in 0..10 {
        check(&e, "open", "x").await;
    }
    let d = check(&e, "closed", "y").await;
    assert_eq!(d.code, Code::Ok, "one identity's failures refused another");
}

/// When one shard's breaker closes, only that shard's local buckets are dropped: an identity
/// whose shard is still down keeps its (spent) local bucket instead of fresh quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_buckets_are_dropped_per_shard() {
    let store = Scripted::new();
    let e = engine(store.clone(), breaker(1));
    // Shard 1 is down: its identity spends its local bucket (4 × 0.5 = 2).
    store.set("s1b", Act::Fail(unavailable()));
    let vias: Vec<(bool, Via)> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            let d = check(&e, "local", "s1b").await;
            v.push((d.allowed(), d.policies[0].via));
        }
        v
    };
    assert_eq!(
        vias,
        vec![(true, Via::Local), (true, Via::Local), (false, Via::Local)]
    );
    // Shard 0 fails, then recovers: its breaker closes.
    open_shard_0(&e, &store, "a").await;
    store.set("a", Act::Answer);
    assert_eq!(check(&e, "open", "a").await.policies[0].via, Via::Store);
    assert_eq!(check(&e, "open", "a").await.policies[0].via, Via::Store);
    // Shard 1 is still down: its identity is still refused by its local bucket.
    let d = check(&e, "local", "s1b").await;
    assert_eq!(d.policies[0].via, Via::Local);
    assert!(
        !d.allowed(),
        "shard 1's local bucket was dropped by shard 0"
    );
}

/// Panics in a remote source: a bug outside the store call.
struct PanickingRemote;

impl RemoteSource for PanickingRemote {
    fn remote(&self, _key: &str, _params: &Params, _now: Micros) -> Remote {
        panic!("a bug in the merge layer")
    }
}

/// A panic outside the store call (matching, planning, deciding, the merge layer) takes the
/// rules' failure path like a store failure: a decision, never a dropped connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_outside_the_store_call_takes_the_failure_path() {
    let store = Scripted::new();
    let mut e = engine(store.clone(), breaker(3_600 * SECOND));
    e.remote = Some(Arc::new(PanickingRemote));
    let e = Arc::new(e);
    let d = {
        let e = e.clone();
        tokio::spawn(async move { check(&e, "global", "g").await })
            .await
            .expect("the check panicked")
    };
    assert_eq!(d.code, Code::Unavailable, "a fail-closed rule answers 503");
    // The engine keeps serving.
    assert_eq!(check(&e, "open", "o").await.code, Code::Ok);
}

/// A release the store fails frees no slot, answers 0 and is counted (and logged once per
/// 1,000, not once each: an outage fails every release).
#[tokio::test]
async fn a_failed_release_is_counted() {
    let store = Scripted::new();
    let e = engine(store.clone(), breaker(SECOND));
    let d = |k: &str| {
        vec![
            ("route".to_string(), "conc".to_string()),
            ("k".to_string(), k.to_string()),
        ]
    };
    let ok = e.check("d", d("ok"), 1).await.expect("a valid check");
    assert!(ok.decision.allowed());
    assert_eq!(
        e.release("d", d("ok"), &ok.request_id)
            .await
            .expect("release"),
        1
    );
    store.set("bad", Act::Fail(unavailable()));
    for _ in 0..3 {
        assert_eq!(e.release("d", d("bad"), "r1").await.expect("release"), 0);
    }
    assert_eq!(e.metrics.release_failures.load(Ordering::Relaxed), 3);
}

const HOT_RULES: &str = "domain: d
rules:
  - { id: leased, match: { route: leased }, key: [k], algorithm: fixed_window, limit: 100, window: 1h, on_store_failure: closed, hot_keys: { lease: 10 } }
  - { id: refused, match: { route: refused }, key: [k], algorithm: fixed_window, limit: 1, window: 1h, on_store_failure: open }
";

fn hot_engine(store: Arc<Scripted>, clock: Arc<ManualClock>) -> Engine {
    let mut e = Engine::new(
        Published::new(parse_yaml(HOT_RULES).expect("valid rules")),
        store,
        Arc::new(Metrics::default()),
        500,
        Duration::from_secs(30),
        "t".into(),
        breaker(SECOND),
    )
    .with_clock(clock);
    e.hot = Some(Arc::new(sluiced::hot::HotKeys::new(1_000, 100)));
    e
}

/// Leased units keep serving while the store is down; once they are spent the rule's
/// failure mode answers.
#[tokio::test]
async fn leased_units_serve_through_an_outage() {
    let store = Scripted::new();
    let clock = Arc::new(ManualClock::new(3_600 * SECOND));
    let e = hot_engine(store.clone(), clock);
    assert_eq!(check(&e, "leased", "a").await.code, Code::Ok);
    assert_eq!(store.received(), 1, "one lease call of 10");
    store.set("a", Act::Fail(unavailable()));
    for i in 0..9 {
        let d = check(&e, "leased", "a").await;
        assert_eq!(d.code, Code::Ok, "request {i} of the lease");
        assert_eq!(d.policies[0].via, Via::Store);
    }
    assert_eq!(store.received(), 1, "the lease answered without the store");
    let d = check(&e, "leased", "a").await;
    assert_eq!(
        d.code,
        Code::Unavailable,
        "lease spent: on_store_failure closed"
    );
}

/// A cached refusal keeps refusing while the store is down, until its retry time (at most a
/// second); then the rule's failure mode decides.
#[tokio::test]
async fn cached_refusals_hold_through_an_outage_until_they_expire() {
    let store = Scripted::new();
    let clock = Arc::new(ManualClock::new(3_600 * SECOND));
    let e = hot_engine(store.clone(), clock.clone());
    assert_eq!(check(&e, "refused", "b").await.code, Code::Ok);
    assert_eq!(check(&e, "refused", "b").await.code, Code::OverLimit);
    store.set("b", Act::Fail(unavailable()));
    let calls = store.received();
    clock.advance(SECOND - 1);
    assert_eq!(check(&e, "refused", "b").await.code, Code::OverLimit);
    assert_eq!(store.received(), calls, "refused from the cache");
    clock.advance(1);
    let d = check(&e, "refused", "b").await;
    assert_eq!(
        store.received(),
        calls + 1,
        "asked the store once the entry expired"
    );
    assert_eq!((d.code, d.policies[0].via), (Code::Ok, Via::FailedOpen));
}

/// Requests that find a lease call in flight wait for it, and when its batch is spent before
/// their turn, for the next one: they go to the store themselves only past the store
/// deadline. 100 requests at once on a key leasing 10 at a time take 10 lease calls and are
/// all admitted. Sending the ones a batch did not reach as plain calls (what a single wait
/// did) cost 91 store calls for them, the flood leasing is there to stop, and refused 9
/// under the limit (their units were in a lease).
#[tokio::test]
async fn waiters_for_a_lease_wait_for_the_next_batch_not_the_store() {
    let store = Scripted::new();
    let clock = Arc::new(ManualClock::new(3_600 * SECOND));
    let e = hot_engine(store.clone(), clock);
    store.set("w", Act::Slow(Duration::from_millis(5)));
    let all = futures_util::future::join_all((0..100).map(|_| check(&e, "leased", "w"))).await;
    let ok = all.iter().filter(|d| d.code == Code::Ok).count();
    assert_eq!(
        (store.received(), ok),
        (10, 100),
        "(store calls, admitted): one lease call per 10 requests, all within the limit"
    );
}
