//! Leasing a fair share (the parent is a hot key by construction): three daemons, each with
//! its own layer, lease batches of a fair share's tenants from one store. The parent is never
//! exceeded, busy tenants keep to their shares within a batch per daemon, store calls drop
//! by about the batch, and what a lease gives back returns to the parent only.

use super::tests::{Mem, desc};
use super::*;
use crate::algo::{Remote, Request, evaluate};
use crate::decision::plan;
use crate::rules::{RuleSet, parse_yaml};

/// Parent 100/s, burst 100 (borrowing down to 50); tenant a has half, b and c a quarter.
const RULES: &str = r#"
domain: api
rules:
  - id: backend
    key: [k]
    algorithm: token_bucket
    rate_per_s: 100
    burst: 100
    fair_share: { by: tier, values: { a: 0.5 }, default: 0.25 }
    hot_keys: { lease: LEASE }
"#;

const T0: Micros = 10 * SECOND;
const BATCH: u64 = 5;

fn rules(lease: &str) -> RuleSet {
    parse_yaml(&RULES.replace("LEASE", lease)).expect("valid rules")
}

/// One request of tenant `k` through `layer`: allowed or not.
fn check(set: &RuleSet, layer: &mut Layer, store: &mut Mem, k: &str, now: Micros) -> bool {
    let dom = set.domain("api").expect("domain");
    let p = plan(dom, &desc(&[("k", k), ("tier", k)]), now, 1, "r", |_| {
        Default::default()
    });
    assert_eq!(p.calls.len(), 1, "one rule, one call");
    layer
        .call_sync(&p.calls[0], CallPolicy::of(&p, 0), set.version, |c| {
            Some(store.check(c))
        })
        .expect("no failures")
        .allowed
}

/// Tokens at `now` in the bucket of `rate`/s and `burst` stored under `key` (each half of a
/// fair share is stored as a plain token bucket).
fn tokens(store: &Mem, key: &str, rate: u64, burst: u64, now: Micros) -> u64 {
    let params = Params::TokenBucket {
        rate: crate::algo::Rate::per_second(rate),
        burst,
    };
    let req = Request {
        now,
        cost: 0,
        request_id: "",
        remote: Remote::default(),
    };
    evaluate(&params, store.states.get(key), &req).remaining
}

/// The parent's tokens at `now`.
fn parent_tokens(store: &Mem, now: Micros) -> u64 {
    tokens(store, "sl:{api}:t:backend", 100, 100, now)
}

/// Whether tenant b's own bucket (25/s, burst 25) is full at `now`.
fn child_full(store: &Mem, now: Micros) -> bool {
    tokens(store, "sl:{api}:t:backend|api|k=b", 25, 25, now) == 25
}

/// What a run admitted: per tenant, every admission's time, and the store calls.
struct Run {
    admitted: [u64; 3],
    times: Vec<Micros>,
    calls: u64,
    returned: u64,
}

/// Three tenants each asking 300/s (three times the parent) for `secs`, one request in turn
/// to each of three daemons; every daemon sweeps every 100 ms and its give-backs reach the
/// store.
fn busy_run(lease: &str, secs: u64) -> Run {
    let set = rules(lease);
    let mut store = Mem::default();
    let mut layers: Vec<Layer> = (0..3).map(|_| Layer::new(100, 100)).collect();
    let mut run = Run {
        admitted: [0; 3],
        times: Vec::new(),
        calls: 0,
        returned: 0,
    };
    let step = SECOND / 900;
    let mut next_sweep = T0 + lease::SWEEP;
    for n in 0..900 * secs {
        let now = T0 + n * step;
        if now >= next_sweep {
            for l in &mut layers {
                for g in l.sweep(now) {
                    run.returned += g.units;
                    store.give_back(&g);
                }
            }
            next_sweep += lease::SWEEP;
        }
        let t = (n % 3) as usize;
        let d = ((n / 3) % 3) as usize;
        if check(&set, &mut layers[d], &mut store, ["a", "b", "c"][t], now) {
            run.admitted[t] += 1;
            run.times.push(now);
        }
    }
    run.calls = store.calls;
    run
}

#[test]
fn a_lease_batch_fits_every_share_and_a_fixed_one_must() {
    let set = rules("auto");
    let r = set.domain("api").expect("domain");
    let p = plan(r, &desc(&[("k", "b"), ("tier", "b")]), T0, 1, "r", |_| {
        Default::default()
    });
    // auto: 1% of the parent's 100/s is 1, within b's burst of 25.
    assert_eq!(
        CallPolicy::of(&p, 0).lease.map(|l| l.batch),
        Some(1),
        "auto batch"
    );
    let err = parse_yaml(&RULES.replace("LEASE", "30")).expect_err("30 > b's burst of 25");
    assert!(
        err.to_string()
            .contains("more than the burst of the smallest share (\"default\": 25)"),
        "{err}"
    );
}

/// The parent holds whatever the leases do: units leave it before they are spent, so the
/// run admits at most its burst plus its rate, and any second at most that plus what the
/// leases held when it began (a batch per tenant per daemon).
#[test]
fn leased_tenants_never_exceed_the_parent_and_keep_their_shares() {
    let secs = 20;
    let leased = busy_run(&BATCH.to_string(), secs);
    let exact = busy_run("off", secs);
    let total: u64 = leased.admitted.iter().sum();
    eprintln!(
        "fair share, 3 tenants at 3x the parent for {secs} s over 3 daemons: leased {:?} \
         ({total} in all, {} store calls, {} units given back); one call a request {:?} \
         ({} calls)",
        leased.admitted, leased.calls, leased.returned, exact.admitted, exact.calls
    );
    assert!(total <= 100 + 100 * secs, "{total} admitted");
    let held = BATCH * 3 * 3;
    for (i, &t) in leased.times.iter().enumerate() {
        let in_second = leased.times[i..]
            .iter()
            .take_while(|&&u| u < t + SECOND)
            .count() as u64;
        assert!(
            in_second <= 100 + 100 + held,
            "{in_second} in the second from {t}"
        );
    }
    // Busy throughout (the tenants' buckets refill at the parent's rate, so it never gets
    // back above its reserve): each tenant about its share of the rate, never more than its
    // own bucket's burst and rate, the 50 there were to borrow at the start, and a batch per
    // daemon (borrowed units still held when the parent turned busy).
    for (t, share) in [(0, 50), (1, 25), (2, 25)] {
        let got = leased.admitted[t];
        assert!(
            got <= share + share * secs + 50 + BATCH * 3,
            "tenant {t}: {got}"
        );
        assert!(got >= share * (secs - 1), "tenant {t} starved: {got}");
    }
    // A store call per batch, not per request (refusals included, each call at most one
    // per batch time while the tenant is spent).
    assert!(
        leased.calls * 3 <= exact.calls,
        "{} calls leased vs {} without",
        leased.calls,
        exact.calls
    );
}

/// A lease taken by borrowing gives back its unspent units to the parent, as a token bucket
/// under the parent's key; the tenant's own bucket was never charged and stays full.
#[test]
fn a_quiet_lease_gives_its_units_back_to_the_parent() {
    let set = rules(&BATCH.to_string());
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
    assert!(check(&set, &mut layer, &mut store, "b", T0));
    assert_eq!(store.calls, 1, "one lease call");
    assert_eq!(parent_tokens(&store, T0), 100 - BATCH);
    assert!(check(&set, &mut layer, &mut store, "b", T0));
    assert_eq!(store.calls, 1, "spent from the lease");
    let at = T0 + lease::QUIET;
    let back = layer.sweep(at);
    assert_eq!(back.len(), 1, "{back:?}");
    let g = &back[0];
    assert_eq!(g.key, "sl:{api}:t:backend", "the parent's key");
    assert!(matches!(g.params, Params::TokenBucket { burst: 100, .. }));
    assert_eq!(g.units, BATCH - 2);
    let before = parent_tokens(&store, at);
    store.give_back(g);
    // Refilled over the quiet time and the three units back: 2 spent in all.
    assert_eq!(parent_tokens(&store, at), (before + BATCH - 2).min(100));
    assert_eq!(
        parent_tokens(&store, at),
        100,
        "25 refilled, 3 back, capped"
    );
    assert!(
        child_full(&store, at),
        "the tenant's own bucket never charged"
    );
}

/// While the parent is busy a lease is taken on the guaranteed path, charging both; what it
/// gives back goes to the parent, and the tenant's bucket keeps the charge (the safe side:
/// a tenant may lose unspent units of its guarantee until its bucket refills, never gain).
#[test]
fn a_guaranteed_lease_gives_back_to_the_parent_only() {
    let set = rules(&BATCH.to_string());
    let (mut store, mut layer) = (Mem::default(), Layer::new(100, 100));
    // Tenant c, unleased, borrows the parent down to its reserve of 50, then spends its own
    // 25: the parent holds 25 and is busy.
    let (exact, mut other) = (rules("off"), Layer::new(100, 100));
    let mut n = 0;
    while check(&exact, &mut other, &mut store, "c", T0) {
        n += 1;
    }
    assert_eq!(n, 75);
    let p0 = parent_tokens(&store, T0);
    assert_eq!(p0, 25, "busy");
    assert!(check(&set, &mut layer, &mut store, "b", T0), "b's share");
    assert_eq!(parent_tokens(&store, T0), p0 - BATCH);
    assert!(!child_full(&store, T0), "b's bucket charged");
    let back = layer.sweep(T0 + lease::QUIET);
    assert_eq!(back.len(), 1);
    assert_eq!(
        (back[0].key.as_str(), back[0].units),
        ("sl:{api}:t:backend", BATCH - 1)
    );
    let child_before = store.states.get("sl:{api}:t:backend|api|k=b").cloned();
    store.give_back(&back[0]);
    assert_eq!(
        store.states.get("sl:{api}:t:backend|api|k=b").cloned(),
        child_before,
        "the tenant's bucket is not credited"
    );
}
