//! The layer against a store run in-process with the core's own `batch::apply`: exactness of
//! the deny cache (decisions identical to asking the store every time) and leasing's total.

use super::*;
use crate::State;
use crate::batch::{Write, apply};
use crate::decision::plan;
use crate::rules::{RuleSet, parse_yaml};
use crate::time::MILLI;
use proptest::prelude::*;
use std::collections::HashMap;

/// A store in-process: the core's own `batch::apply` over a map (shared with split_tests).
#[derive(Default)]
pub(super) struct Mem {
    pub(super) states: HashMap<String, State>,
    pub(super) calls: u64,
}

impl Mem {
    /// A fair share's state is its two halves, each under its own key (the parent's shared
    /// by every tenant), as the stores keep it.
    pub(super) fn check(&mut self, call: &Call) -> CallResult {
        self.calls += 1;
        let cur: Vec<Option<State>> = call
            .items
            .iter()
            .map(|i| match i.params {
                Params::FairShare(_) => Some(State::FairShare {
                    child: self.states.get(&i.key).cloned().map(Box::new),
                    parent: self
                        .states
                        .get(crate::keys::fair_share_parent(&i.key))
                        .cloned()
                        .map(Box::new),
                }),
                _ => self.states.get(&i.key).cloned(),
            })
            .collect();
        let (r, w) = apply(call, &cur);
        for (i, w) in call.items.iter().zip(w) {
            match w {
                Write::Put(State::FairShare { child, parent }, _) => {
                    let parent_key = crate::keys::fair_share_parent(&i.key).to_string();
                    for (k, half) in [(i.key.clone(), child), (parent_key, parent)] {
                        if let Some(h) = half {
                            self.states.insert(k, *h);
                        }
                    }
                }
                Write::Put(_, 0) => {
                    self.states.remove(&i.key);
                }
                Write::Put(s, _) => {
                    self.states.insert(i.key.clone(), s);
                }
                Write::Keep => {}
            }
        }
        r
    }

    /// Applies a lease's give-back as a store does.
    pub(super) fn give_back(&mut self, g: &GiveBack) {
        if let Write::Put(s, _) = g.write(self.states.get(&g.key)) {
            self.states.insert(g.key.clone(), s);
        }
    }
}

pub(super) use crate::matching::desc;

/// One request through `layer` (or straight to the store without one): allowed or not.
fn check(
    set: &RuleSet,
    layer: Option<&mut Layer>,
    store: &mut Mem,
    key: &str,
    cost: u64,
    now: Micros,
) -> bool {
    let dom = set.domain("api").expect("domain");
    let p = plan(dom, &desc(&[("k", key)]), now, cost, "r", |_| {
        Default::default()
    });
    let mut allowed = true;
    let mut layer = layer;
    for i in 0..p.calls.len() {
        let pc = &p.calls[i];
        let r = match layer.as_deref_mut() {
            Some(l) => l
                .call_sync(pc, CallPolicy::of(&p, i), set.version, |c| {
                    Some(store.check(c))
                })
                .expect("no failures"),
            None => store.check(&pc.call),
        };
        allowed &= r.allowed;
    }
    allowed
}

const RULES: &str = r#"
domain: api
rules:
  - { id: tb, key: [k], match: { k: tb }, algorithm: token_bucket, rate_per_s: 10, burst: 20 }
  - { id: gc, key: [k], match: { k: gc }, algorithm: gcra, rate_per_s: 10, burst: 5 }
  - { id: fw, key: [k], match: { k: fw }, algorithm: fixed_window, limit: 30, window: 1s }
  - { id: sw, key: [k], match: { k: sw }, algorithm: sliding_window, limit: 30, window: 1s }
  - { id: sl, key: [k], match: { k: sl }, algorithm: sliding_log, limit: 10, window: 500ms }
  - { id: two-a, key: [k], match: { k: two }, algorithm: token_bucket, rate_per_s: 50, burst: 10 }
  - { id: two-b, key: [k], match: { k: two }, algorithm: fixed_window, limit: 25, window: 2s }
  - { id: shadow, key: [k], match: { k: two }, algorithm: fixed_window, limit: 3, window: 1s, mode: shadow }
"#;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Two daemons with deny caches on one store decide every request exactly as two
    /// daemons without them: the cache never refuses what the store would admit.
    #[test]
    fn the_deny_cache_is_exact(
        steps in prop::collection::vec(
            (0usize..6, 0u64..30_000, 1u64..4, any::<bool>()), 1..300)
    ) {
        let set = parse_yaml(RULES).expect("valid");
        let keys = ["tb", "gc", "fw", "sw", "sl", "two"];
        let (mut plain, mut cached) = (Mem::default(), Mem::default());
        let mut layers = [Layer::new(1000, 100), Layer::new(1000, 100)];
        let mut now = 10 * SECOND;
        for (k, dt, cost, second) in steps {
            now += dt;
            let a = check(&set, None, &mut plain, keys[k], cost, now);
            let b = check(&set, Some(&mut layers[usize::from(second)]), &mut cached, keys[k], cost, now);
            prop_assert_eq!(a, b, "key {} cost {} at {}", keys[k], cost, now);
        }
        prop_assert!(cached.calls <= plain.calls);
    }
}

#[test]
fn a_refusal_is_repeated_without_the_store() {
    let set = parse_yaml(RULES).expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 10));
    let t = 10 * SECOND;
    for _ in 0..30 {
        assert!(check(&set, Some(&mut layer), &mut store, "fw", 1, t));
    }
    assert!(!check(&set, Some(&mut layer), &mut store, "fw", 1, t));
    let calls = store.calls;
    for i in 0..100 {
        assert!(!check(
            &set,
            Some(&mut layer),
            &mut store,
            "fw",
            1,
            t + i * MILLI
        ));
    }
    assert_eq!(store.calls, calls, "refusals answered from the cache");
    assert_eq!(layer.stats().deny_hits, 100);
    // The window ends at 11 s: the store is asked again and admits.
    assert!(check(
        &set,
        Some(&mut layer),
        &mut store,
        "fw",
        1,
        11 * SECOND
    ));
}

#[test]
fn a_smaller_cost_asks_the_store() {
    let set = parse_yaml(RULES).expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 10));
    let t = 10 * SECOND;
    for _ in 0..18 {
        assert!(check(&set, Some(&mut layer), &mut store, "tb", 1, t));
    }
    // 2 tokens left: a cost of 3 is refused and cached, a cost of 2 still fits.
    assert!(!check(&set, Some(&mut layer), &mut store, "tb", 3, t));
    let calls = store.calls;
    assert!(!check(&set, Some(&mut layer), &mut store, "tb", 5, t));
    assert_eq!(
        store.calls, calls,
        "a bigger cost is refused from the cache"
    );
    assert!(check(&set, Some(&mut layer), &mut store, "tb", 2, t));
}

#[test]
fn an_override_with_bigger_numbers_is_another_request() {
    let base = "domain: api\nrules:\n  - { id: fw, key: [k], algorithm: fixed_window, limit: 2, window: 1m }\n";
    let small = parse_yaml(base).expect("valid");
    let mut big = parse_yaml(&format!(
        "{base}overrides:\n  - {{ identity: {{ k: vip }}, rule: fw, limit: 10 }}\n"
    ))
    .expect("valid");
    // Same version on purpose: the numbers alone must tell the entries apart.
    big.version = small.version;
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 10));
    let t = 60 * SECOND;
    for _ in 0..2 {
        assert!(check(&small, Some(&mut layer), &mut store, "vip", 1, t));
    }
    assert!(!check(&small, Some(&mut layer), &mut store, "vip", 1, t));
    // The override raises vip's limit: the store admits, and so must the daemon.
    assert!(check(&big, Some(&mut layer), &mut store, "vip", 1, t));
}

#[test]
fn a_new_rule_version_forgets_refusals() {
    let mut set = parse_yaml(RULES).expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 10));
    let t = 10 * SECOND;
    for _ in 0..30 {
        check(&set, Some(&mut layer), &mut store, "fw", 1, t);
    }
    assert!(!check(&set, Some(&mut layer), &mut store, "fw", 1, t));
    assert_eq!(layer.deny_entries(), 1);
    set.version += 1;
    let calls = store.calls;
    assert!(!check(&set, Some(&mut layer), &mut store, "fw", 1, t));
    assert_eq!(
        store.calls,
        calls + 1,
        "asked the store under the new version"
    );
}

#[test]
fn refusals_that_charge_or_hold_slots_are_never_cached() {
    let set = parse_yaml(
        "domain: api\nrules:\n  - { id: pen, key: [k], algorithm: fixed_window, limit: 1, window: 1m, charge_rejected: true }\n  - { id: conc, key: [c], algorithm: concurrency, limit: 1 }\n",
    )
    .expect("valid");
    let dom = set.domain("api").expect("domain");
    let p = plan(dom, &desc(&[("k", "a"), ("c", "b")]), 1, 1, "r", |_| {
        Default::default()
    });
    assert!(
        p.calls
            .iter()
            .enumerate()
            .all(|(i, _)| !CallPolicy::of(&p, i).deny_cache)
    );
}

#[test]
fn a_shadow_refusal_alone_is_not_cached() {
    let set = parse_yaml(RULES).expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 10));
    let t = 10 * SECOND;
    // The shadow rule (3 a second) would refuse from the 4th; the enforced ones allow.
    for _ in 0..5 {
        assert!(check(&set, Some(&mut layer), &mut store, "two", 1, t));
    }
    assert_eq!(layer.deny_entries(), 0);
}

const LEASED: &str = r#"
domain: api
rules:
  - { id: tb, key: [k], match: { k: tb }, algorithm: token_bucket, rate_per_s: 1, burst: 100, hot_keys: { lease: 7 } }
  - { id: fw, key: [k], match: { k: fw }, algorithm: fixed_window, limit: 100, window: 1m, hot_keys: { lease: 8 } }
  - { id: sw, key: [k], match: { k: sw }, algorithm: sliding_window, limit: 100, window: 1m, hot_keys: { lease: 9 } }
  - { id: gc, key: [k], match: { k: gc }, algorithm: gcra, rate_per_s: 1, burst: 100, hot_keys: { lease: 6 } }
"#;

/// Four daemons leasing from one shared count of 100 admit 100 in all, never more, and
/// ask the store about once per batch.
#[test]
fn leasing_never_overshoots() {
    let set = parse_yaml(LEASED).expect("valid");
    for key in ["tb", "fw", "sw", "gc"] {
        let mut store = Mem::default();
        let mut layers: Vec<Layer> = (0..4).map(|_| Layer::new(100, 100)).collect();
        let t = 60 * SECOND;
        let mut admitted = 0;
        // 1,000 requests within 1 ms: nothing refills meaningfully (1 token a second).
        for i in 0..1_000u64 {
            if check(
                &set,
                Some(&mut layers[(i % 4) as usize]),
                &mut store,
                key,
                1,
                t + i,
            ) {
                admitted += 1;
            }
        }
        assert!(admitted <= 100, "{key}: admitted {admitted}");
        assert!(admitted >= 95, "{key}: admitted only {admitted}");
        assert!(store.calls < 100, "{key}: {} store calls", store.calls);
    }
}

#[test]
fn a_lease_gives_back_when_the_key_goes_quiet() {
    let set = parse_yaml(LEASED).expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
    let t = 60 * SECOND;
    assert!(check(&set, Some(&mut layer), &mut store, "fw", 1, t));
    assert_eq!(layer.stats().leased_units, 8);
    assert!(layer.sweep(t + lease::QUIET / 2).is_empty(), "still in use");
    let back = layer.sweep(t + lease::QUIET);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].units, 7);
    assert_eq!(layer.stats().returned_units, 7);
}

#[test]
fn a_rule_change_retires_leases() {
    let mut set = parse_yaml(LEASED).expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
    let t = 60 * SECOND;
    assert!(check(&set, Some(&mut layer), &mut store, "tb", 1, t));
    set.version += 1;
    // The next request of any key sees the new version and retires every lease.
    assert!(check(&set, Some(&mut layer), &mut store, "fw", 1, t + 1));
    let back = layer.sweep(t + 2);
    assert!(
        back.iter().any(|g| g.key.contains(":t:tb") && g.units == 6),
        "{back:?}"
    );
}

#[test]
fn auto_leases_only_hot_keys() {
    let set = parse_yaml(
        "domain: api\nrules:\n  - { id: tb, key: [k], algorithm: token_bucket, rate_per_s: 100000, burst: 100000, hot_keys: { lease: auto } }\n",
    )
    .expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
    let t = 60 * SECOND;
    // A cold key, 50 a second: every request asks the store.
    for i in 0..50u64 {
        assert!(check(
            &set,
            Some(&mut layer),
            &mut store,
            "cold",
            1,
            t + i * 20 * MILLI
        ));
    }
    assert_eq!(store.calls, 50);
    // A hot key, 20,000 a second: one call per request until it has made 1,000 in a
    // second (the batch), then one per batch of 1,000.
    let before = store.calls;
    for i in 0..20_000u64 {
        assert!(check(
            &set,
            Some(&mut layer),
            &mut store,
            "hot",
            1,
            t + i * 50
        ));
    }
    let first = store.calls - before;
    assert!(
        (1_000..=1_030).contains(&first),
        "{first} store calls in the first second"
    );
    let before = store.calls;
    for i in 20_000..60_000u64 {
        assert!(check(
            &set,
            Some(&mut layer),
            &mut store,
            "hot",
            1,
            t + i * 50
        ));
    }
    let steady = store.calls - before;
    assert!(steady <= 42, "{steady} store calls for 40,000 requests");
}

/// One request through `layer`: the answer of its one store call.
fn answer(set: &RuleSet, layer: &mut Layer, store: &mut Mem, key: &str, now: Micros) -> CallResult {
    let dom = set.domain("api").expect("domain");
    let p = plan(dom, &desc(&[("k", key)]), now, 1, "r", |_| {
        Default::default()
    });
    layer
        .call_sync(&p.calls[0], CallPolicy::of(&p, 0), set.version, |c| {
            Some(store.check(c))
        })
        .expect("no failures")
}

/// A cached refusal speaks for the window its counts were taken in. A sliding window's
/// retry time can lie in the next window; repeated there, the old window's count would be
/// reported as the new one's `usage`, which the shipper sends to other regions as this
/// region's count (sluice-sim's ship-interval.toml: 1,412 false rejections, none without the
/// cache). Past the window's end the store is asked again.
#[test]
fn a_cached_refusal_ends_with_its_window() {
    let set = parse_yaml(RULES).expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 10));
    let t = 10 * SECOND + 900 * MILLI;
    for _ in 0..30 {
        assert!(answer(&set, &mut layer, &mut store, "sw", t).allowed);
    }
    // 30 counted in [10 s, 11 s): refused until the previous window's weight has shrunk
    // enough in the next one, past 11 s.
    let r = answer(&set, &mut layer, &mut store, "sw", t);
    assert!(!r.allowed);
    assert!(t + r.outcomes[0].retry_after > 11 * SECOND);
    assert_eq!(layer.deny_entries(), 1);
    // At 11.01 s the store still refuses (30 x 0.99 + 1 > 30), and counts nothing yet in
    // the new window.
    let next = 11 * SECOND + 10 * MILLI;
    assert!(t + r.outcomes[0].retry_after > next);
    let mut plain = Mem {
        states: store.states.clone(),
        calls: 0,
    };
    let fresh = answer(&set, &mut Layer::new(100, 10), &mut plain, "sw", next);
    assert!(!fresh.allowed);
    assert_eq!(fresh.outcomes[0].usage, 0);
    let calls = store.calls;
    let cached = answer(&set, &mut layer, &mut store, "sw", next);
    assert!(!cached.allowed);
    assert_eq!(
        cached.outcomes[0].usage, fresh.outcomes[0].usage,
        "the new window's count, not the old one's"
    );
    assert_eq!(store.calls, calls + 1, "asked the store in the new window");
}

/// A refused lease call blocks the key until its retry time, repeating the refusal; like a
/// cached refusal, that answer's counts are its window's, so the block ends with the window.
#[test]
fn a_refused_lease_blocks_at_most_to_its_window_end() {
    let set = parse_yaml(LEASED).expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
    let t = 119 * SECOND + 900 * MILLI;
    for _ in 0..100 {
        assert!(answer(&set, &mut layer, &mut store, "sw", t).allowed);
    }
    let r = answer(&set, &mut layer, &mut store, "sw", t);
    assert!(!r.allowed);
    assert_eq!(layer.stats().lease_blocked, 0, "the store refused this one");
    // Its retry time lies in the next window; at 120.05 s the store still refuses and has
    // counted nothing in the new window.
    let next = 120 * SECOND + 50 * MILLI;
    assert!(t + r.outcomes[0].retry_after > next);
    let mut plain = Mem {
        states: store.states.clone(),
        calls: 0,
    };
    let fresh = answer(&set, &mut Layer::new(100, 100), &mut plain, "sw", next);
    assert!(!fresh.allowed);
    assert_eq!(fresh.outcomes[0].usage, 0);
    let blocked = answer(&set, &mut layer, &mut store, "sw", next);
    assert!(!blocked.allowed);
    assert_eq!(
        blocked.outcomes[0].usage, fresh.outcomes[0].usage,
        "the new window's count, not the old one's"
    );
}

/// What sampling admits for one key at 10× its limit (1,000 requests a second against 100 a
/// second), with and without the block, and what it asks of the store. Printed for
/// docs/hot-keys.md (`cargo test -p sluice-core --lib sampling_admits -- --nocapture`).
#[test]
fn sampling_admits_about_the_limit_only_with_the_block() {
    let rules = |block: bool| {
        parse_yaml(&format!(
            "domain: api\nrules:\n  - {{ id: fw, key: [k], algorithm: fixed_window, limit: 100, window: 1s, hot_keys: {{ sample: 10, sample_block: {block}, deny_cache: false }} }}\n"
        ))
        .expect("valid")
    };
    let mut figures = Vec::new();
    for block in [true, false] {
        let set = rules(block);
        let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
        let mut admitted = 0u64;
        // 10 s at one request a millisecond.
        for i in 0..10_000u64 {
            if check(
                &set,
                Some(&mut layer),
                &mut store,
                "k",
                1,
                10 * SECOND + i * MILLI,
            ) {
                admitted += 1;
            }
        }
        println!(
            "sample 10, block {block}: admitted {admitted} of 10,000 against a limit of 1,000; {} store calls",
            store.calls
        );
        figures.push((admitted, store.calls));
    }
    let (with, without) = (figures[0], figures[1]);
    assert!(with.0 <= 1_000 + 10 * 9, "with the block: {}", with.0);
    assert!(with.0 >= 900, "with the block: {}", with.0);
    assert!(without.0 > 5_000, "without the block: {}", without.0);
    assert!(with.1 <= 10_000 / 10 + 10, "store calls: {}", with.1);
}

#[test]
fn sampling_is_refused_where_it_cannot_work() {
    for (rule, why) in [
        (
            "algorithm: concurrency, limit: 10, hot_keys: { sample: 2 }",
            "concurrency",
        ),
        (
            "algorithm: fixed_window, limit: 10, window: 1s, hot_keys: { sample: 20 }",
            "capacity",
        ),
        (
            "algorithm: fixed_window, limit: 100, window: 1s, hot_keys: { sample: 2, lease: 5 }",
            "choose lease or sample",
        ),
        (
            "algorithm: fixed_window, limit: 100, window: 1s, hot_keys: { sample: 0 }",
            "expected 1 to 1000",
        ),
    ] {
        let e = parse_yaml(&format!(
            "domain: api\nrules:\n  - {{ id: r, key: [k], {rule} }}\n"
        ))
        .expect_err(rule);
        assert!(e.to_string().contains(why), "{rule}: {e}");
    }
}

/// A sample's answer is its window's: answers repeated from it end with the window, so the
/// new window's first request is a sample and reports the new window's count (the usage the
/// shipper sends to other regions; found by the simulator for the deny cache and leases).
#[test]
fn a_sample_ends_with_its_window() {
    let set = parse_yaml(
        "domain: api\nrules:\n  - { id: sw, key: [k], algorithm: fixed_window, limit: 100, window: 1s, hot_keys: { sample: 10, deny_cache: false } }\n",
    )
    .expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
    let t = 10 * SECOND + 900 * MILLI;
    for _ in 0..11 {
        assert!(answer(&set, &mut layer, &mut store, "k", t).allowed);
    }
    assert_eq!(store.calls, 2, "two samples of 10");
    let next = answer(&set, &mut layer, &mut store, "k", 11 * SECOND);
    assert_eq!(store.calls, 3, "sampled in the new window");
    assert_eq!(next.outcomes[0].usage, 10, "the new window's count");
}

/// A bucket over its limit leases about once per batch, not twice: a granted lease's answer
/// says what the bucket still holds, so a daemon that spends its batch waits until the next
/// batch can be there instead of asking to be refused. Admitted stays at the bucket's rate.
#[test]
fn a_leased_bucket_over_its_limit_asks_once_per_batch() {
    let set = parse_yaml(
        "domain: api\nrules:\n  - { id: tb, key: [k], algorithm: token_bucket, rate_per_s: 1000, burst: 100, hot_keys: { lease: 10, deny_cache: false } }\n",
    )
    .expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
    let mut admitted = 0u64;
    // 2,000 requests a second for 5 s against 1,000 a second.
    for i in 0..10_000u64 {
        if check(
            &set,
            Some(&mut layer),
            &mut store,
            "k",
            1,
            10 * SECOND + i * 500,
        ) {
            admitted += 1;
        }
    }
    // The burst of 100 and 1,000 a second, less at most a batch held at the end.
    assert!((5_080..=5_100).contains(&admitted), "admitted {admitted}");
    assert!(
        store.calls <= admitted / 10 + 20,
        "{} store calls for {admitted} admitted",
        store.calls
    );
}

/// A request that waited behind a lease call carries the time it arrived, before that call's
/// answer: it asks for the next batch rather than being refused by that clock (under a slow
/// store a whole queue of waiters would be, and the key admitted a third less end to end).
#[test]
fn a_waiter_asks_for_the_next_batch() {
    let set = parse_yaml(
        "domain: api\nrules:\n  - { id: tb, key: [k], algorithm: token_bucket, rate_per_s: 1000, burst: 10, hot_keys: { lease: 10, deny_cache: false } }\n",
    )
    .expect("valid");
    let dom = set.domain("api").expect("domain");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
    let t = 10 * SECOND;
    // The batch is the whole bucket: granted, spent by ten requests.
    for _ in 0..10 {
        assert!(check(&set, Some(&mut layer), &mut store, "k", 1, t));
    }
    let p = plan(dom, &desc(&[("k", "k")]), t + 1, 1, "r", |_| {
        Default::default()
    });
    let policy = CallPolicy::of(&p, 0);
    assert!(
        matches!(layer.route(&p.calls[0], policy, set.version), Route::Local(ref r) if !r.allowed),
        "a fresh request before the next batch can be there is refused"
    );
    assert!(matches!(
        layer.route_after_wait(&p.calls[0], policy, set.version),
        Route::Lease { .. }
    ));
}
