//! The conformance suite: behaviour every [`Store`] must show, whatever it runs on.
//!
//! Each case takes a store and a key prefix of its own, so the same cases run against the
//! memory store, a standalone Redis and a Redis Cluster (tests/conformance.rs,
//! tests/cluster.rs). Time is virtual (`now` is an argument), so expiry is tested by moving
//! `now`, exactly as the daemon and the simulator drive the stores.

#![allow(dead_code)]

use sluice_core::algo::{Rate, Window};
use sluice_core::batch::{Call, CallResult, GiveBack, Item};
use sluice_core::time::{MILLI, SECOND};
use sluice_core::{Micros, Params, Remote};
use sluice_store::Store;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A fixed instant, far from any window boundary that matters to the cases.
pub const T0: Micros = 1_800_000_000 * SECOND;

/// An enforced item with no remote counts.
pub fn item(key: &str, params: Params) -> Item {
    Item {
        key: key.to_string(),
        params,
        enforce: true,
        charge_rejected: false,
        remote: Remote::default(),
    }
}

/// A call of `cost` at `now`.
pub fn call(now: Micros, cost: u64, id: &str, items: Vec<Item>) -> Call {
    Call {
        now,
        cost,
        request_id: id.to_string(),
        items,
    }
}

/// Runs a call that must succeed.
pub async fn check(store: &dyn Store, c: &Call) -> CallResult {
    match store.check(c).await {
        Ok(r) => r,
        Err(e) => panic!("{} store failed a check: {e}", store.kind()),
    }
}

fn tb(rate_per_s: u64, burst: u64) -> Params {
    Params::TokenBucket {
        rate: Rate::per_second(rate_per_s),
        burst,
    }
}

/// `rate: 10/1m, burst: 10` (token bucket and GCRA) admits 10 at once, then one more every
/// 6 s exactly: refused a microsecond before each, with `retry_after` counting to it.
pub async fn ten_per_minute(store: &dyn Store, p: &str) {
    let rate = Rate::new(10, 60 * SECOND).expect("10/1m");
    for (name, params) in [
        ("tb", Params::TokenBucket { rate, burst: 10 }),
        ("gcra", Params::Gcra { rate, burst: 10 }),
    ] {
        let key = format!("sl:{{{p}minute}}:{name}");
        let at = |now: Micros| call(now, 1, "r", vec![item(&key, params.clone())]);
        for i in 0..10 {
            let r = check(store, &at(T0)).await;
            assert!(r.allowed, "{name} {}: request {i}", store.kind());
            assert_eq!(r.outcomes[0].remaining, 9 - i);
        }
        let refused = check(store, &at(T0)).await;
        assert!(!refused.allowed, "{name} {}", store.kind());
        assert_eq!(refused.outcomes[0].retry_after, 6 * SECOND, "{name}");
        assert_eq!(refused.outcomes[0].window, 60 * SECOND, "{name}");
        for k in 1..=5 {
            let due = T0 + k * 6 * SECOND;
            let early = check(store, &at(due - 1)).await;
            assert!(!early.allowed, "{name} {}: token {k} early", store.kind());
            assert_eq!(early.outcomes[0].retry_after, 1, "{name}");
            let on_time = check(store, &at(due)).await;
            assert!(on_time.allowed, "{name} {}: token {k}", store.kind());
            assert_eq!(on_time.outcomes[0].remaining, 0, "{name}");
        }
    }
}

/// A burst of 25 on a bucket of 20 admits exactly 20; the rest are told to wait one refill.
pub async fn burst_of_25_on_20(store: &dyn Store, p: &str) {
    let key = format!("sl:{{{p}burst}}:tb");
    let mut admitted = 0;
    for i in 0..25 {
        let r = check(store, &call(T0, 1, "r", vec![item(&key, tb(1, 20))])).await;
        if r.allowed {
            admitted += 1;
            assert_eq!(r.outcomes[0].remaining, 19 - i);
        } else {
            assert_eq!(r.outcomes[0].remaining, 0);
            assert_eq!(r.outcomes[0].retry_after, SECOND);
        }
    }
    assert_eq!(admitted, 20, "{}", store.kind());
    // One token a second: one more fits a second later, not a microsecond before.
    let early = check(
        store,
        &call(T0 + SECOND - 1, 1, "r", vec![item(&key, tb(1, 20))]),
    )
    .await;
    assert!(!early.allowed);
    let later = check(
        store,
        &call(T0 + SECOND, 1, "r", vec![item(&key, tb(1, 20))]),
    )
    .await;
    assert!(later.allowed);
}

/// 25 concurrent checks on a bucket of 20: exactly 20 admitted (the call is atomic).
pub async fn concurrent_burst(store: Arc<dyn Store>, p: &str) {
    let key = format!("sl:{{{p}cburst}}:tb");
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..25)
        .map(|i| {
            let (store, key, admitted) = (store.clone(), key.clone(), admitted.clone());
            tokio::spawn(async move {
                let c = call(T0, 1, &format!("r{i}"), vec![item(&key, tb(1, 20))]);
                if check(&*store, &c).await.allowed {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 20, "{}", store.kind());
}

/// 64 concurrent clients on one fixed window of 1,000: exactly 1,000 admitted.
pub async fn contention_exact(store: Arc<dyn Store>, p: &str) {
    let key = format!("sl:{{{p}hot}}:fw");
    let params = Params::FixedWindow {
        limit: 1_000,
        window: Window::Epoch(3_600 * SECOND),
    };
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|c| {
            let (store, key, admitted, params) =
                (store.clone(), key.clone(), admitted.clone(), params.clone());
            tokio::spawn(async move {
                for i in 0..20 {
                    let cl = call(
                        T0 + i,
                        1,
                        &format!("c{c}-{i}"),
                        vec![item(&key, params.clone())],
                    );
                    if check(&*store, &cl).await.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 1_000, "{}", store.kind());
}

/// Every rule is checked before any is taken from: a request refused by the daily quota burns
/// no burst token, and the burst rule reports what it still has.
pub async fn check_all_then_take_all(store: &dyn Store, p: &str) {
    let burst = format!("sl:{{{p}all}}:burst");
    let daily = format!("sl:{{{p}all}}:daily");
    let items = || {
        vec![
            item(&burst, tb(1, 10)),
            item(
                &daily,
                Params::FixedWindow {
                    limit: 2,
                    window: Window::Epoch(86_400 * SECOND),
                },
            ),
        ]
    };
    for _ in 0..2 {
        assert!(check(store, &call(T0, 1, "r", items())).await.allowed);
    }
    let refused = check(store, &call(T0, 1, "r", items())).await;
    assert!(!refused.allowed);
    assert!(refused.outcomes[0].allowed && !refused.outcomes[1].allowed);
    assert_eq!(
        refused.outcomes[0].remaining, 8,
        "the refusal gives the token back"
    );
    // Nothing was taken from the bucket: a peek still sees 8.
    let peek = check(store, &call(T0, 0, "r", vec![item(&burst, tb(1, 10))])).await;
    assert_eq!(peek.outcomes[0].remaining, 8);
}

/// A peek (cost 0) reports as if for one unit and takes nothing.
pub async fn peek_takes_nothing(store: &dyn Store, p: &str) {
    let key = format!("sl:{{{p}peek}}:w");
    let params = Params::SlidingWindow {
        limit: 3,
        window: 10 * SECOND,
        start: Default::default(),
    };
    for _ in 0..5 {
        let r = check(store, &call(T0, 0, "r", vec![item(&key, params.clone())])).await;
        assert!(r.allowed);
        assert_eq!(r.outcomes[0].remaining, 3);
        assert_eq!(r.outcomes[0].usage, 0);
    }
    let r = check(store, &call(T0, 3, "r", vec![item(&key, params.clone())])).await;
    assert!(r.allowed);
    let r = check(store, &call(T0, 0, "r", vec![item(&key, params)])).await;
    assert!(!r.allowed, "a peek on a full window says no");
    assert_eq!(r.outcomes[0].remaining, 0);
}

/// Concurrency slots are held, released by id, renewed by a repeated id, and expire.
pub async fn release_and_expiry_of_slots(store: &dyn Store, p: &str) {
    let key = format!("sl:{{{p}cc}}:cc");
    let params = Params::Concurrency {
        limit: 2,
        timeout: 30 * SECOND,
    };
    let one = |now, id: &str| call(now, 1, id, vec![item(&key, params.clone())]);
    assert!(check(store, &one(T0, "a")).await.allowed);
    assert!(check(store, &one(T0 + 1, "b")).await.allowed);
    // "a" again renews its own slot instead of taking a third.
    assert!(check(store, &one(T0 + 2, "a")).await.allowed);
    let full = check(store, &one(T0 + 3, "c")).await;
    assert!(!full.allowed);
    assert_eq!(
        full.outcomes[0].retry_after,
        30 * SECOND - 2,
        "b expires first"
    );
    let freed = store.release(&key, "a", T0 + 4).await.expect("release");
    assert!(freed);
    assert!(!store.release(&key, "a", T0 + 4).await.expect("release"));
    assert!(!store.release(&key, "zz", T0 + 4).await.expect("release"));
    assert!(check(store, &one(T0 + 5, "c")).await.allowed);
    // At T0 + 1 + 30 s "b" has expired without a release; "c" holds until T0 + 5 + 30 s.
    assert!(check(store, &one(T0 + 1 + 30 * SECOND, "d")).await.allowed);
    assert!(!check(store, &one(T0 + 1 + 30 * SECOND, "e")).await.allowed);
    // A slot past its expiry cannot be released any more.
    assert!(
        !store
            .release(&key, "c", T0 + 5 + 30 * SECOND)
            .await
            .expect("release")
    );
    assert!(
        !store
            .release(&format!("sl:{{{p}cc}}:none"), "x", T0)
            .await
            .expect("release")
    );
}

/// Windows end on their boundary; buckets refill; logs age out: state expires with time.
pub async fn expiry_with_time(store: &dyn Store, p: &str) {
    let fw = format!("sl:{{{p}exp}}:fw");
    let fwp = Params::FixedWindow {
        limit: 1,
        window: Window::Epoch(SECOND),
    };
    let start = T0 - T0 % SECOND;
    assert!(
        check(store, &call(start, 1, "r", vec![item(&fw, fwp.clone())]))
            .await
            .allowed
    );
    let r = check(
        store,
        &call(start + 400 * MILLI, 1, "r", vec![item(&fw, fwp.clone())]),
    )
    .await;
    assert!(!r.allowed);
    assert_eq!(r.outcomes[0].retry_after, 600 * MILLI);
    assert!(
        check(store, &call(start + SECOND, 1, "r", vec![item(&fw, fwp)]))
            .await
            .allowed
    );

    let sl = format!("sl:{{{p}exp}}:sl");
    let slp = Params::SlidingLog {
        limit: 2,
        window: SECOND,
    };
    let at = |t| call(t, 1, "r", vec![item(&sl, slp.clone())]);
    assert!(check(store, &at(T0)).await.allowed);
    assert!(check(store, &at(T0 + 500 * MILLI)).await.allowed);
    let r = check(store, &at(T0 + 999 * MILLI)).await;
    assert!(!r.allowed);
    assert_eq!(r.outcomes[0].retry_after, MILLI);
    assert!(check(store, &at(T0 + SECOND)).await.allowed);

    let g = format!("sl:{{{p}exp}}:gcra");
    let gp = Params::Gcra {
        rate: Rate::per_second(10),
        burst: 2,
    };
    let at = |t| call(t, 1, "r", vec![item(&g, gp.clone())]);
    assert!(check(store, &at(T0)).await.allowed);
    assert!(check(store, &at(T0)).await.allowed);
    let r = check(store, &at(T0)).await;
    assert!(!r.allowed);
    assert_eq!(r.outcomes[0].retry_after, 100 * MILLI);
    assert!(check(store, &at(T0 + 100 * MILLI)).await.allowed);
}

/// Shadow rules count as if enforced and never refuse; charge_rejected rules count refusals.
pub async fn shadow_and_charge_rejected(store: &dyn Store, p: &str) {
    let shadow_key = format!("sl:{{{p}flags}}:shadow");
    let charged_key = format!("sl:{{{p}flags}}:charged");
    let window = || Params::FixedWindow {
        limit: 1,
        window: Window::Epoch(60 * SECOND),
    };
    let mut shadow = item(&shadow_key, window());
    shadow.enforce = false;
    for i in 0..3 {
        let r = check(store, &call(T0, 1, "r", vec![shadow.clone()])).await;
        assert!(r.allowed, "shadow never refuses");
        assert_eq!(
            r.outcomes[0].allowed,
            i == 0,
            "but reports what it would do"
        );
    }
    let mut charged = item(&charged_key, window());
    charged.charge_rejected = true;
    for _ in 0..3 {
        check(store, &call(T0, 1, "r", vec![charged.clone()])).await;
    }
    let peek = check(store, &call(T0, 0, "r", vec![charged])).await;
    assert_eq!(peek.outcomes[0].usage, 3, "refusals were charged");
}

/// Global rules add other regions' counts.
pub async fn remote_counts_add(store: &dyn Store, p: &str) {
    let key = format!("sl:{{{p}remote}}:fw");
    let mut it = item(
        &key,
        Params::FixedWindow {
            limit: 10,
            window: Window::Epoch(60 * SECOND),
        },
    );
    it.remote = Remote { cur: 9, prev: 0 };
    let r = check(store, &call(T0, 1, "r", vec![it.clone()])).await;
    assert!(r.allowed);
    assert_eq!((r.outcomes[0].remaining, r.outcomes[0].usage), (0, 1));
    assert!(!check(store, &call(T0, 1, "r", vec![it])).await.allowed);
}

/// A shared bucket (token bucket and GCRA, 10/s, burst 100) taken under its rate, one every
/// 111 ms: full again before each take, its key is kept a refill period past full, so the
/// region's cumulative `usage` counts every take. A region-scope one reports how drained it
/// is: one token, each time.
pub async fn shared_bucket_under_its_rate_keeps_counting(store: &dyn Store, p: &str) {
    let rate = Rate::per_second(10);
    for (name, params) in [
        ("tb", tb(10, 100)),
        ("gcra", Params::Gcra { rate, burst: 100 }),
    ] {
        let key = format!("sl:{{{p}under}}:{name}");
        let region = format!("sl:{{{p}under}}:{name}-region");
        let mut shared = item(&key, params.clone());
        shared.remote = Remote::shared_bucket(0, 1);
        for k in 1..=20u64 {
            let now = T0 + k * 111 * MILLI;
            let r = check(store, &call(now, 1, "r", vec![shared.clone()])).await;
            assert!(r.allowed, "{name}: take {k}");
            assert_eq!(r.outcomes[0].usage, k, "{name}: take {k}");
            let r = check(
                store,
                &call(now, 1, "r", vec![item(&region, params.clone())]),
            )
            .await;
            assert_eq!(r.outcomes[0].usage, 1, "{name} (region): take {k}");
        }
    }
}

/// 3 regions each see a new global bucket (token bucket and GCRA, 1/s, burst 10; one store
/// per region, here one key each): each admits ceil(10 / 3) = 4 at once, not 10, so the key
/// new everywhere admits 12 in all, the burst plus the rounding. A region-scope bucket and a
/// global one counted in one region start full. Refill then tops a region up to the whole
/// burst: 10 s later each admits 10 at once.
pub async fn new_global_bucket_in_3_regions(store: &dyn Store, p: &str) {
    let rate = Rate::per_second(1);
    for (name, params) in [
        ("tb", tb(1, 10)),
        ("gcra", Params::Gcra { rate, burst: 10 }),
    ] {
        // Unit requests at `now` until one is refused.
        let at_once = |it: Item, now: Micros| async move {
            let mut n = 0;
            while n <= 20
                && check(store, &call(now, 1, "r", vec![it.clone()]))
                    .await
                    .allowed
            {
                n += 1;
            }
            n
        };
        let mut total = 0;
        for region in ["us", "eu", "ap"] {
            let mut it = item(&format!("sl:{{{p}first-{region}}}:{name}"), params.clone());
            it.remote = Remote::shared_bucket(0, 3);
            let n = at_once(it.clone(), T0).await;
            assert_eq!(n, 4, "{name} in {region}: its share of the burst");
            total += n;
            assert_eq!(
                at_once(it, T0 + 10 * SECOND).await,
                10,
                "{name} in {region}: refilled"
            );
        }
        assert_eq!(total, 12, "{name}");
        let mut alone = item(&format!("sl:{{{p}first-one}}:{name}"), params.clone());
        alone.remote = Remote::shared_bucket(0, 1);
        assert_eq!(at_once(alone, T0).await, 10, "{name} in one region");
        let regional = item(&format!("sl:{{{p}first-regional}}:{name}"), params.clone());
        assert_eq!(at_once(regional, T0).await, 10, "{name}, region scope");
    }
}

/// A shared bucket's outcome carries its generation's label, the key's birth (a whole ms of
/// the call that created it; 0 for a region-scope rule), and a key that expired and started
/// again (a refill period past full, here 2 ms on 1,000/s with burst 2) is a new generation:
/// a newer label and `used` from 0. Redis expires keys in real time (with the late-call
/// cover, which a call's stale bound measures from its `now`), the memory store by the calls'
/// clock: so this case runs on the wall clock and peeks until the key is gone, within a
/// bounded number of tries.
pub async fn restarted_shared_bucket_is_a_new_generation(store: &dyn Store, p: &str) {
    let rate = Rate::per_second(1_000);
    for (name, params) in [
        ("tb", tb(1_000, 2)),
        ("gcra", Params::Gcra { rate, burst: 2 }),
    ] {
        let mut it = item(&format!("sl:{{{p}gen}}:{name}"), params.clone());
        it.remote = Remote::shared_bucket(0, 1);
        let wall = super::epoch_us();
        let born = wall - wall % MILLI;
        let t0 = born + 456; // the label is the whole ms
        for k in 1..=2u64 {
            let o = check(store, &call(t0, 1, "r", vec![it.clone()]))
                .await
                .outcomes[0];
            assert_eq!((o.usage, o.generation), (k, born), "{name}: take {k}");
        }
        let regional = item(&format!("sl:{{{p}gen}}:{name}-region"), params.clone());
        let o = check(store, &call(t0, 1, "r", vec![regional]))
            .await
            .outcomes[0];
        assert_eq!(
            o.generation, 0,
            "{name}: a region-scope bucket carries no label"
        );
        // Peeks (cost 0) write nothing, so the key's TTL runs out under them.
        let mut restarted = None;
        for k in 1..=200u64 {
            let now = super::epoch_us().max(t0 + k * MILLI);
            let o = check(store, &call(now, 0, "r", vec![it.clone()]))
                .await
                .outcomes[0];
            if o.generation != born {
                restarted = Some(now);
                break;
            }
            assert_eq!(o.usage, 2, "{name}: the same generation, try {k}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let now = restarted.expect("the key expired within 200 tries (10 s)");
        let o = check(store, &call(now, 1, "r", vec![it.clone()]))
            .await
            .outcomes[0];
        assert_eq!(
            o.generation,
            now - now % MILLI,
            "{name}: born at the call that made it"
        );
        assert_eq!(o.usage, 1, "{name}: a new generation counts from 0");
    }
}

/// Identities do not share counts.
pub async fn identities_are_isolated(store: &dyn Store, p: &str) {
    for who in ["a", "b"] {
        let key = format!("sl:{{{p}iso{who}}}:tb");
        assert!(
            check(store, &call(T0, 1, "r", vec![item(&key, tb(1, 1))]))
                .await
                .allowed
        );
        assert!(
            !check(store, &call(T0, 1, "r", vec![item(&key, tb(1, 1))]))
                .await
                .allowed
        );
    }
}

/// A charged refusal of a huge cost on a sliding log stays bounded (no billion entries, no
/// endless script) and blocks the log for one window, as a charge past the limit should.
pub async fn huge_charged_refusal_on_a_log(store: &dyn Store, p: &str) {
    let key = format!("sl:{{{p}hugelog}}:sl");
    let mut it = item(
        &key,
        Params::SlidingLog {
            limit: 5,
            window: SECOND,
        },
    );
    it.charge_rejected = true;
    let started = std::time::Instant::now();
    let r = check(store, &call(T0, 1_000_000_000, "r", vec![it.clone()])).await;
    assert!(!r.allowed);
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    let r = check(store, &call(T0 + 1, 1, "r", vec![it.clone()])).await;
    assert!(!r.allowed);
    assert_eq!(r.outcomes[0].retry_after, SECOND - 1);
    assert_eq!(r.outcomes[0].usage, 5);
    assert!(
        check(store, &call(T0 + SECOND, 1, "r", vec![it]))
            .await
            .allowed
    );
}

/// One rule id under each of the six algorithms, in the rule format.
const RULE_OF_KIND: [&str; 6] = [
    "algorithm: token_bucket, rate_per_s: 1, burst: 5",
    "algorithm: gcra, rate_per_s: 1, burst: 5",
    "algorithm: fixed_window, limit: 5, window: 1m",
    "algorithm: sliding_window, limit: 5, window: 1m",
    "algorithm: sliding_log, limit: 5, window: 1m",
    "algorithm: concurrency, limit: 5, timeout: 1m",
];

/// The call the rule with id `r` makes for `api_key` when it has algorithm `RULE_OF_KIND[k]`:
/// the key and numbers come from the core's matching, exactly as the daemon builds them.
fn call_of_kind(rule: &str, api_key: &str, now: Micros, id: &str) -> Call {
    let yaml = format!("domain: d\nrules:\n  - {{ id: r, key: [api_key], {rule} }}\n");
    let set = sluice_core::rules::parse_yaml(&yaml).expect("a valid rule");
    let dom = set.domain("d").expect("domain d");
    let desc = sluice_core::matching::Descriptors::new(vec![("api_key".into(), api_key.into())])
        .expect("descriptors");
    let applied = sluice_core::matching::applicable(dom, &desc);
    let a = applied.first().expect("the rule applies");
    call(
        now,
        1,
        id,
        vec![item(&a.key, a.params.clone().into_owned())],
    )
}

/// An operator edits one rule's algorithm and keeps its id: the keys its old algorithm wrote
/// are never read as the new algorithm's state, and are no error either. Every identity
/// answers as a fresh one would, on every store alike.
pub async fn algorithm_change_under_one_id(store: &dyn Store, p: &str) {
    for (o, old) in RULE_OF_KIND.iter().enumerate() {
        for (n, new) in RULE_OF_KIND.iter().enumerate() {
            if o == n {
                continue;
            }
            let used = format!("{p}u{o}{n}");
            for i in 0..3 {
                check(store, &call_of_kind(old, &used, T0, &format!("o{i}"))).await;
            }
            let later = T0 + 10 * MILLI;
            let c = call_of_kind(new, &used, later, "n");
            let after_edit = match store.check(&c).await {
                Ok(r) => r,
                Err(e) => panic!(
                    "{} store: {} -> {}: an edited rule's first check failed: {e}",
                    store.kind(),
                    old,
                    new
                ),
            };
            let fresh = check(
                store,
                &call_of_kind(new, &format!("{p}f{o}{n}"), later, "n"),
            )
            .await;
            assert_eq!(
                after_edit,
                fresh,
                "{} store: {} -> {}: the old algorithm's state was read as the new one's",
                store.kind(),
                old,
                new
            );
        }
    }
}

/// A give-back that must succeed.
pub async fn give_back(store: &dyn Store, g: &GiveBack) -> bool {
    match store.give_back(g).await {
        Ok(wrote) => wrote,
        Err(e) => panic!("{} store failed a give-back: {e}", store.kind()),
    }
}

/// Units a check of cost `lease` left unspent come back: a fixed window of 100 leased 10 and
/// given 7 back admits exactly 97 more. Once the window ends there is nothing to give back
/// to; a bucket given back its whole lease at once is as before; a sliding log cannot be
/// leased.
pub async fn give_back_returns_unspent_units(store: &dyn Store, p: &str) {
    let key = format!("sl:{{{p}lease}}:fw");
    let fw = Params::FixedWindow {
        limit: 100,
        window: Window::Epoch(60 * SECOND),
    };
    let taken_at = T0 + SECOND;
    let leased = check(
        store,
        &call(taken_at, 10, "lease", vec![item(&key, fw.clone())]),
    )
    .await;
    assert!(leased.allowed);
    assert_eq!(leased.outcomes[0].usage, 10);
    let g = GiveBack {
        key: key.clone(),
        params: fw.clone(),
        units: 7,
        taken_at,
        now: taken_at + MILLI,
    };
    assert!(
        give_back(store, &g).await,
        "{}: the window holds the units",
        store.kind()
    );
    let mut admitted = 0;
    for i in 0..200 {
        let c = call(
            taken_at + 2 * MILLI + i,
            1,
            "r",
            vec![item(&key, fw.clone())],
        );
        if check(store, &c).await.allowed {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 97, "{}", store.kind());
    // The next window: the units expired with the window they counted in.
    let late = GiveBack {
        now: T0 + 60 * SECOND,
        ..g
    };
    assert!(!give_back(store, &late).await, "{}", store.kind());
    let fresh = check(
        store,
        &call(T0 + 60 * SECOND, 0, "peek", vec![item(&key, fw)]),
    )
    .await;
    assert_eq!(fresh.outcomes[0].remaining, 100, "{}", store.kind());

    // A bucket given back its whole lease at once answers as before the lease.
    let bkey = format!("sl:{{{p}lease}}:tb");
    let bucket = tb(1, 20);
    let peek = |now| call(now, 0, "peek", vec![item(&bkey, bucket.clone())]);
    assert!(
        check(store, &call(T0, 5, "r", vec![item(&bkey, bucket.clone())]))
            .await
            .allowed
    );
    assert!(
        check(
            store,
            &call(T0, 10, "lease", vec![item(&bkey, bucket.clone())])
        )
        .await
        .allowed
    );
    assert_eq!(check(store, &peek(T0)).await.outcomes[0].remaining, 5);
    let g = GiveBack {
        key: bkey.clone(),
        params: bucket.clone(),
        units: 10,
        taken_at: T0,
        now: T0,
    };
    assert!(give_back(store, &g).await);
    assert_eq!(
        check(store, &peek(T0)).await.outcomes[0].remaining,
        15,
        "{}",
        store.kind()
    );
    // Absent state is a full bucket: nothing to give back to.
    let none = GiveBack {
        key: format!("sl:{{{p}lease}}:none"),
        ..g
    };
    assert!(!give_back(store, &none).await);

    let log = GiveBack {
        key: format!("sl:{{{p}lease}}:sl"),
        params: Params::SlidingLog {
            limit: 5,
            window: SECOND,
        },
        units: 1,
        taken_at: T0,
        now: T0,
    };
    let err = store
        .give_back(&log)
        .await
        .expect_err("a log is not leasable");
    assert!(!err.retryable(), "{err:?}");
}
