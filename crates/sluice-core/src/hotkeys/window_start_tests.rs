//! The hot-key layer over `window_start: first_request` rules: a cached refusal is held until
//! the key's own window end (the outcome's `retry_after`), never the epoch's, and the deny
//! cache and split stay exact.

use super::tests::{Mem, desc};
use super::*;
use crate::decision::plan;
use crate::rules::{RuleSet, parse_yaml};
use crate::time::MILLI;
use proptest::prelude::*;

const RULES: &str = r#"
domain: api
rules:
  - { id: fw, key: [k], match: { k: fw }, algorithm: fixed_window, limit: 30, window: 1s, window_start: first_request }
  - { id: split, key: [k], match: { k: split }, algorithm: fixed_window, limit: 20, window: 2s, window_start: first_request, hot_keys: { split: 2 } }
  - { id: two-a, key: [k], match: { k: two }, algorithm: token_bucket, rate_per_s: 50, burst: 10 }
  - { id: two-b, key: [k], match: { k: two }, algorithm: fixed_window, limit: 25, window: 2s, window_start: first_request }
"#;

/// One request through `layer` (or straight to the store): allowed or not.
fn check(
    set: &RuleSet,
    layer: Option<&mut Layer>,
    store: &mut Mem,
    key: &str,
    id: &str,
    now: Micros,
) -> bool {
    let dom = set.domain("api").expect("domain");
    let p = plan(dom, &desc(&[("k", key)]), now, 1, id, |_| {
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

#[test]
fn a_cached_refusal_lasts_until_the_keys_own_window_end() {
    let set = parse_yaml(RULES).expect("valid");
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 10));
    // The key's first request at 10.3 s: its window is [10.3 s, 11.3 s), not [10 s, 11 s).
    let first = 10 * SECOND + 300 * MILLI;
    for _ in 0..30 {
        assert!(check(&set, Some(&mut layer), &mut store, "fw", "r", first));
    }
    assert!(!check(&set, Some(&mut layer), &mut store, "fw", "r", first));
    let calls = store.calls;
    // Past the epoch's second, still the key's own window: refused from the cache.
    for t in [11 * SECOND, 11 * SECOND + 299 * MILLI, first + SECOND - 1] {
        assert!(
            !check(&set, Some(&mut layer), &mut store, "fw", "r", t),
            "{t}"
        );
    }
    assert_eq!(store.calls, calls, "refusals answered from the cache");
    // At the key's own window end the store is asked again and admits.
    assert!(check(
        &set,
        Some(&mut layer),
        &mut store,
        "fw",
        "r",
        first + SECOND
    ));
    assert_eq!(store.calls, calls + 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Two daemons with deny caches on one store decide every request exactly as two
    /// daemons without them, on first-request windows (split ones too).
    #[test]
    fn the_deny_cache_is_exact_on_first_request_windows(
        steps in prop::collection::vec(
            (0usize..3, 0u64..30_000, 0u64..8, any::<bool>()), 1..300)
    ) {
        let set = parse_yaml(RULES).expect("valid");
        let keys = ["fw", "split", "two"];
        let (mut plain, mut cached) = (Mem::default(), Mem::default());
        let mut layers = [Layer::new(1000, 100), Layer::new(1000, 100)];
        let mut now = 10 * SECOND;
        for (k, dt, id, second) in steps {
            now += dt;
            let id = format!("r{id}");
            let a = check(&set, None, &mut plain, keys[k], &id, now);
            let b = check(&set, Some(&mut layers[usize::from(second)]), &mut cached, keys[k], &id, now);
            prop_assert_eq!(a, b, "key {} at {}", keys[k], now);
        }
        prop_assert!(cached.calls <= plain.calls);
    }
}
