//! Tests of the parent module (unit and property tests), kept apart so the module reads
//! as its one job.

use super::*;
use crate::algo::{self, Rate, Request, State, Window};
use crate::time::SECOND;
use proptest::prelude::*;

const MIN: Micros = 60 * SECOND;

fn fixed() -> Params {
    Params::FixedWindow {
        limit: 1000,
        window: Window::Epoch(MIN),
    }
}

fn sliding() -> Params {
    Params::SlidingWindow {
        limit: 1000,
        window: MIN,
        start: Default::default(),
    }
}

fn bucket() -> Params {
    Params::TokenBucket {
        rate: Rate::per_second(1),
        burst: 100,
    }
}

#[test]
fn fixed_windows_sum_other_regions_and_expire_at_the_window_end() {
    let mut rc = RemoteCounts::new("us", 100, 0);
    let p = fixed();
    assert_eq!(rc.merge("eu", "k", &p, MIN, 30, MIN + 1), Merged::New);
    assert_eq!(rc.merge("ap", "k", &p, MIN, 20, MIN + 2), Merged::New);
    assert_eq!(
        rc.merge("us", "k", &p, MIN, 500, MIN + 2),
        Merged::OwnRegion
    );
    assert_eq!(rc.remote_for("k", &p, MIN + 3, 3).cur, 50);
    // Silent regions keep their counts until the window ends, then weigh nothing.
    assert_eq!(rc.remote_for("k", &p, 2 * MIN - 1, 3).cur, 50);
    assert_eq!(rc.remote_for("k", &p, 2 * MIN, 3).cur, 0);
    assert_eq!(rc.merge("eu", "k", &p, MIN, 40, 2 * MIN), Merged::Expired);
    assert_eq!(rc.sweep(2 * MIN), 2);
    assert!(rc.is_empty());
}

#[test]
fn sliding_windows_carry_the_previous_window() {
    let mut rc = RemoteCounts::new("us", 100, 0);
    let p = sliding();
    rc.merge("eu", "k", &p, 0, 70, 10 * SECOND);
    rc.merge("eu", "k", &p, MIN, 5, MIN + SECOND);
    let r = rc.remote_for("k", &p, MIN + 2 * SECOND, 3);
    assert_eq!((r.cur, r.prev), (5, 70));
    // A third window pushes out the oldest.
    rc.merge("eu", "k", &p, 2 * MIN, 1, 2 * MIN + 1);
    let r = rc.remote_for("k", &p, 2 * MIN + 2, 3);
    assert_eq!((r.cur, r.prev), (1, 5));
    assert!(rc.slots() <= 2);
    // A report for a window older than both held is not news.
    assert_eq!(rc.merge("eu", "k", &p, MIN, 9, 2 * MIN + 3), Merged::Raised);
    assert_eq!(rc.merge("eu", "k", &p, 0, 9, 2 * MIN + 3), Merged::Expired);
}

#[test]
fn misaligned_or_far_future_windows_and_unshared_rules_are_rejected() {
    let mut rc = RemoteCounts::new("us", 100, 0);
    assert_eq!(
        rc.merge("eu", "k", &fixed(), MIN + 1, 5, MIN),
        Merged::Rejected
    );
    assert_eq!(
        rc.merge("eu", "k", &fixed(), 10 * MIN, 5, MIN),
        Merged::Rejected
    );
    assert_eq!(rc.merge("eu", "k", &bucket(), 5, 5, MIN), Merged::Rejected);
    let log = Params::SlidingLog {
        limit: 5,
        window: MIN,
    };
    assert_eq!(rc.merge("eu", "k", &log, 0, 5, MIN), Merged::Rejected);
    assert!(rc.is_empty());
}

#[test]
fn the_key_bound_drops_and_counts() {
    let mut rc = RemoteCounts::new("us", 2, 0);
    rc.merge("eu", "a", &fixed(), 0, 1, 1);
    rc.merge("eu", "b", &fixed(), 0, 1, 1);
    assert_eq!(rc.merge("eu", "c", &fixed(), 0, 1, 1), Merged::Full);
    assert_eq!(rc.merge("eu", "a", &fixed(), 0, 2, 1), Merged::Raised);
    assert_eq!(rc.dropped(), 1);
}

#[test]
fn held_state_grows_with_regions_not_daemons() {
    // 50 daemons in each of 2 other regions all ship their region's figure.
    let mut rc = RemoteCounts::new("us", 100, 0);
    for d in 0..50u64 {
        for r in ["eu", "ap"] {
            rc.merge(r, "k", &fixed(), 0, 100 + d, 1);
        }
    }
    assert_eq!(rc.slots(), 2);
    assert_eq!(rc.remote_for("k", &fixed(), 2, 3).cur, 2 * 149);
}

#[test]
fn cumulative_slots_expire_together() {
    let mut rc = RemoteCounts::new("us", 100, 0);
    let p = bucket(); // full period 100 s
    rc.merge("eu", "k", &p, 0, 10, 0);
    rc.merge("ap", "k", &p, 0, 10, 50 * SECOND);
    // eu's slot is past its period, ap's is not: both stay, the sum does not dip.
    assert_eq!(rc.sweep(120 * SECOND), 0);
    assert_eq!(rc.remote_for("k", &p, 120 * SECOND, 3).cur, 20);
    assert_eq!(rc.sweep(150 * SECOND), 2);
    assert!(rc.is_empty());
}

#[test]
fn a_bucket_figure_is_marked_shared_heard_or_not() {
    // The daemon and the simulator both plan with this figure: a global bucket's store
    // call must count the region's `used` from its first take, before any region was
    // heard of, or the region would ship nothing (and the simulator decide differently).
    let mut rc = RemoteCounts::new("us", 100, 0);
    let gcra = Params::Gcra {
        rate: Rate::per_second(1),
        burst: 100,
    };
    for p in [bucket(), gcra] {
        assert_eq!(
            rc.remote_for("k", &p, MIN, 3),
            Remote::shared_bucket(0, 3),
            "{p:?}"
        );
        rc.merge("eu", "k", &p, 0, 30, MIN);
        rc.merge("ap", "k", &p, 0, 12, MIN);
        assert_eq!(
            rc.remote_for("k", &p, MIN, 3),
            Remote::shared_bucket(42, 3),
            "{p:?}"
        );
        rc.sweep(10_000 * MIN);
    }
    // Windows carry no flag: `prev` is the previous window's count.
    assert_eq!(rc.remote_for("k", &fixed(), MIN, 3), Remote::default());
    rc.merge("eu", "k", &sliding(), 0, 7, 1);
    assert_eq!(
        rc.remote_for("k", &sliding(), MIN + 1, 3),
        Remote { cur: 0, prev: 7 }
    );
}

#[test]
fn a_global_bucket_decision_ships_what_the_store_took() {
    // One region's store (states, `batch::apply`), planned as the daemon and the
    // simulator plan: the figure recorded for shipping is the units this region took,
    // read from the store's answer, while other regions' figures drain the bucket.
    use crate::batch::{Call, Item, Write, apply};
    use crate::ship::{BusyOn, BusyRule, observed};
    let p = Params::TokenBucket {
        rate: Rate::per_second(10),
        burst: 20,
    };
    let mut rc = RemoteCounts::new("us", 100, 0);
    let mut state: Option<(State, Micros)> = None;
    let mut took = 0;
    for i in 0..200u64 {
        let now = MIN + i * 50_000; // 20/s, twice the rate
        state = state.filter(|(_, expires)| *expires > now);
        if i % 20 == 10 {
            // Another region reports 3 more units every second.
            rc.merge("eu", "k", &p, 0, 3 * (i / 20 + 1), now);
        }
        let call = Call {
            now,
            cost: 1,
            request_id: String::new(),
            items: vec![Item {
                key: "k".into(),
                params: p.clone(),
                enforce: true,
                charge_rejected: false,
                remote: rc.remote_for("k", &p, now, 2),
            }],
        };
        let (res, writes) = apply(&call, &[state.as_ref().map(|(st, _)| st.clone())]);
        if let Some(Write::Put(st, ttl)) = writes.into_iter().next() {
            state = (ttl > 0).then_some((st, now + ttl));
        }
        took += u64::from(res.allowed);
        let o = res.outcomes[0];
        assert_eq!(o.usage, took, "request {i}: the store's `used`");
        let rule = BusyRule {
            on: BusyOn::RegionCount,
            regions: 2,
        };
        let rec = observed(&p, &o, rule, 10).expect("shared");
        assert_eq!((rec.figure, rec.busy), (took, o.limit - o.remaining));
    }
    // Alone: the burst and 10 s of refill. The other region's units cost tokens.
    assert!(took < 20 + 100, "{took}");
}

#[test]
fn a_restarted_region_is_drained_from_its_first_unit() {
    let mut rc = RemoteCounts::new("us", 100, 0);
    let p = bucket();
    let (l1, l2, l3) = (1_000 * MILLI, 500_000 * MILLI, 900_000 * MILLI);
    assert_eq!(rc.merge("eu", "k", &p, l1, 500, l1), Merged::New);
    assert_eq!(rc.merge("ap", "k", &p, l1, 7, l1), Merged::New);
    // eu's key expired and started again: its new figures add to the old one's.
    assert_eq!(rc.merge("eu", "k", &p, l2, 1, l2), Merged::New);
    assert_eq!(rc.remote_for("k", &p, l2, 3).cur, 507 + 1);
    assert_eq!(rc.merge("eu", "k", &p, l2, 30, l2), Merged::Raised);
    // A late figure of the generation before still counts (two are held)...
    assert_eq!(rc.merge("eu", "k", &p, l1, 520, l2), Merged::Raised);
    assert_eq!(rc.remote_for("k", &p, l2, 3).cur, 527 + 30);
    // ...and a third folds the oldest into the base: the sum does not move.
    assert_eq!(rc.merge("eu", "k", &p, l3, 0, l3), Merged::Unchanged);
    assert_eq!(rc.remote_for("k", &p, l3, 3).cur, 557);
    assert_eq!(rc.merge("eu", "k", &p, l3, 4, l3), Merged::Raised);
    assert_eq!(rc.remote_for("k", &p, l3, 3).cur, 561);
    // The folded generation arriving late changes nothing: its units are in the base.
    assert_eq!(rc.merge("eu", "k", &p, l1, 600, l3), Merged::Unchanged);
    assert_eq!(rc.remote_for("k", &p, l3, 3).cur, 561);
    assert_eq!(rc.slots(), 3, "eu holds two generations, ap one");
    // A label that is not a whole ms, or far ahead of this clock, is refused.
    assert_eq!(rc.merge("eu", "k", &p, l3 + 1, 9, l3), Merged::Rejected);
    let far = l3 + LABEL_AHEAD.max(p.window()) + MILLI;
    assert_eq!(rc.merge("eu", "k", &p, far, 9, l3), Merged::Rejected);
    // Dropped together, base and all, once none rose for a refill period.
    assert_eq!(rc.sweep(l3 + 2 * p.window()), 3);
    assert!(rc.is_empty());
}

#[test]
fn unlabelled_figures_keep_the_max_and_never_add_to_labelled_ones() {
    let p = bucket();
    let t = 1_000 * MILLI;
    // A region of older daemons: one generation, the max, as before labels.
    let mut rc = RemoteCounts::new("us", 100, 0);
    rc.merge("eu", "k", &p, 0, 40, t);
    rc.merge("eu", "k", &p, 0, 10, t);
    assert_eq!(rc.remote_for("k", &p, t, 3).cur, 40);
    // An upgraded daemon of that region labels the same key: the same units, the max.
    assert_eq!(rc.merge("eu", "k", &p, t, 42, t), Merged::Raised);
    assert_eq!(rc.remote_for("k", &p, t, 3).cur, 42);
    // Once labelled, an older daemon's unlabelled figure is not added (nor max-merged).
    assert_eq!(rc.merge("eu", "k", &p, 0, 50, t), Merged::Unchanged);
    assert_eq!(rc.remote_for("k", &p, t, 3).cur, 42);
    // Labelled first, then unlabelled: the same.
    let mut rc = RemoteCounts::new("us", 100, 0);
    rc.merge("eu", "k", &p, t, 50, t);
    assert_eq!(rc.merge("eu", "k", &p, 0, 52, t), Merged::Unchanged);
    assert_eq!(rc.remote_for("k", &p, t, 3).cur, 50);
}

/// One bucket figure: (region 0..3, generation 1..=4, figure within it).
type GenReport = (u8, u64, u64);

/// Every region's generations, each a rising series of figures: what regions ship.
fn generations() -> impl Strategy<Value = Vec<GenReport>> {
    prop::collection::vec((0u8..3, 1u64..=4, 0u64..200), 0..80).prop_map(|mut v| {
        // Figures rise within a generation, as `used` does: sort each (region,
        // generation)'s figures, in the order the region made them.
        v.sort_by_key(|&(r, g, c)| (r, g, c));
        v
    })
}

/// Σ over regions of Σ over generations of the largest figure in `reps`: every unit
/// the regions took, each once.
fn generations_truth(reps: &[GenReport]) -> u64 {
    let mut best = std::collections::BTreeMap::new();
    for &(r, g, c) in reps {
        let e = best.entry((r, g)).or_insert(0u64);
        *e = (*e).max(c);
    }
    best.values().sum()
}

fn label(g: u64) -> Micros {
    g * 100_000 * MILLI
}

proptest! {
    /// Figures of several generations per region, in any order, lost or repeated: the
    /// sum never goes down and never counts a unit twice (it stays within what was
    /// delivered, each generation's max once). Delivered in the order they were made,
    /// it is exactly that: a new generation is drained from its first unit. Fails on
    /// the merge before labels (a labelled figure was refused; unlabelled, a region
    /// held only its largest figure of any generation).
    #[test]
    fn generations_sum_monotonically_and_never_twice(
        reps in generations(),
        seed in any::<u64>(),
        dup in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
        lost in prop::collection::vec(any::<bool>(), 80),
    ) {
        let p = Params::Gcra { rate: Rate::per_second(1), burst: 1_000_000 };
        let now = label(4);
        let feed = |msgs: &[GenReport]| {
            let mut rc = RemoteCounts::new("us", 10, 0);
            let mut last = 0;
            for &(r, g, c) in msgs {
                rc.merge(REGIONS[usize::from(r)], "k", &p, label(g), c, now);
                let cur = rc.remote_for("k", &p, now, 3).cur;
                assert!(cur >= last, "the sum went down: {last} -> {cur}");
                last = cur;
            }
            last
        };
        // In order: exact.
        prop_assert_eq!(feed(&reps), generations_truth(&reps));
        // Lost, repeated and shuffled: monotone (checked in `feed`), never above.
        let mut msgs: Vec<GenReport> = reps
            .iter()
            .zip(&lost)
            .filter(|(_, l)| !**l)
            .map(|(x, _)| *x)
            .collect();
        let delivered = generations_truth(&msgs);
        for ix in &dup {
            if !msgs.is_empty() {
                msgs.push(msgs[ix.index(msgs.len())]);
            }
        }
        let mut s = seed;
        for i in (1..msgs.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            msgs.swap(i, (s >> 33) as usize % (i + 1));
        }
        let got = feed(&msgs);
        prop_assert!(got <= delivered, "{got} > {delivered} delivered");
    }

    /// A bucket planned on the merged figure after every delivery drains every unit the
    /// other regions took across their generations exactly once, and its `seen` never
    /// lags the sum (the burst is larger than everything taken).
    #[test]
    fn a_bucket_drains_every_generation_once(reps in generations()) {
        let p = Params::TokenBucket { rate: Rate::per_second(1), burst: 1_000_000 };
        let now = label(4);
        let mut rc = RemoteCounts::new("us", 10, 0);
        let peek = |remote| Request { now, cost: 0, request_id: "", remote };
        let mut st = Some(algo::take(&p, None, &Request { cost: 1, ..peek(Remote::shared_bucket(0, 1)) }).0);
        for &(r, g, c) in &reps {
            rc.merge(REGIONS[usize::from(r)], "k", &p, label(g), c, now);
            let remote = rc.remote_for("k", &p, now, 1);
            st = Some(algo::take(&p, st.as_ref(), &Request { cost: 0, ..peek(remote) }).0);
            if let Some(State::TokenBucket { seen, .. }) = &st {
                prop_assert_eq!(*seen, remote.cur, "seen lags the sum");
            }
        }
        let left = algo::evaluate(&p, st.as_ref(), &peek(rc.remote_for("k", &p, now, 1)));
        prop_assert_eq!(left.remaining, 1_000_000 - 1 - generations_truth(&reps));
    }
}

/// One report: (region 0..3, key 0..3, window 0..3, count).
type Report = (u8, u8, u64, u64);

fn reports() -> impl Strategy<Value = Vec<Report>> {
    prop::collection::vec((0u8..3, 0u8..3, 0u64..3, 0u64..500), 0..60)
}

const REGIONS: [&str; 3] = ["eu", "ap", "sa"];

fn apply_all(params: &Params, reps: &[Report], now: Micros) -> RemoteCounts {
    let mut rc = RemoteCounts::new("us", 1000, 0);
    for &(r, k, w, c) in reps {
        let start = if params.kind() == crate::algo::Kind::TokenBucket {
            0
        } else {
            w * MIN
        };
        rc.merge(
            REGIONS[usize::from(r)],
            &format!("k{k}"),
            params,
            start,
            c,
            now,
        );
    }
    rc
}

/// The remote figure of every key at a few instants.
fn view(rc: &RemoteCounts, params: &Params) -> Vec<Remote> {
    let mut v = Vec::new();
    for k in 0..3 {
        for t in [0, MIN + 5, 2 * MIN + 5, 3 * MIN - 1] {
            v.push(rc.remote_for(&format!("k{k}"), params, t, 3));
        }
    }
    v
}

/// Σ over regions of the max figure delivered for (key, window): the most any view of
/// those messages may add.
fn truth(reps: &[Report], key: u8, window: u64) -> u64 {
    (0..3u8)
        .map(|r| {
            reps.iter()
                .filter(|x| x.0 == r && x.1 == key && x.2 == window)
                .map(|x| x.3)
                .max()
                .unwrap_or(0)
        })
        .sum()
}

proptest! {
    /// Any shuffle, any duplication: the same view as the messages in order.
    #[test]
    fn reordered_and_repeated_messages_change_nothing(
        reps in reports(),
        seed in any::<u64>(),
        dup in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
    ) {
        for params in [fixed(), sliding(), bucket()] {
            let base = apply_all(&params, &reps, 0);
            let mut shuffled = reps.clone();
            for ix in &dup {
                if !reps.is_empty() {
                    shuffled.push(reps[ix.index(reps.len())]);
                }
            }
            // A deterministic shuffle from the seed (Fisher-Yates over a LCG).
            let mut s = seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (s >> 33) as usize % (i + 1));
            }
            let other = apply_all(&params, &shuffled, 0);
            prop_assert_eq!(view(&base, &params), view(&other, &params));
        }
    }

    /// Merging is commutative and idempotent: a then b = b then a = a, b, a, b.
    #[test]
    fn merge_is_commutative_and_idempotent(a in reports(), b in reports()) {
        for params in [fixed(), sliding(), bucket()] {
            let ab: Vec<Report> = a.iter().chain(&b).copied().collect();
            let ba: Vec<Report> = b.iter().chain(&a).copied().collect();
            let abab: Vec<Report> = ab.iter().chain(&ab).copied().collect();
            let v = view(&apply_all(&params, &ab, 0), &params);
            prop_assert_eq!(&v, &view(&apply_all(&params, &ba, 0), &params));
            prop_assert_eq!(&v, &view(&apply_all(&params, &abab, 0), &params));
        }
    }

    /// Losing messages never adds: the view is exactly the max of what was delivered,
    /// never more than the max of what was sent.
    #[test]
    fn lost_messages_never_double_count(
        reps in reports(),
        lost in prop::collection::vec(any::<bool>(), 60),
    ) {
        // Windows 0 and 1 only: at now = 0 both are live (window 2 is too far ahead).
        let reps: Vec<Report> = reps.iter().map(|&(r, k, w, c)| (r, k, w % 2, c)).collect();
        let delivered: Vec<Report> = reps
            .iter()
            .zip(&lost)
            .filter(|(_, l)| !**l)
            .map(|(r, _)| *r)
            .collect();
        let p = fixed();
        let rc = apply_all(&p, &delivered, 0);
        for k in 0..3u8 {
            for w in 0..2u64 {
                let got = rc.remote_for(&format!("k{k}"), &p, w * MIN + 1, 3).cur;
                prop_assert_eq!(got, truth(&delivered, k, w));
                prop_assert!(got <= truth(&reps, k, w));
            }
        }
    }

    /// A bucket fed the merged cumulative figure after every delivery, in any order with
    /// repeats, drains exactly the max each region reported: never twice.
    #[test]
    fn a_bucket_drains_remote_consumption_once(
        reps in prop::collection::vec((0u8..3, 0u64..40), 1..40),
        seed in any::<u64>(),
    ) {
        let p = Params::TokenBucket { rate: Rate::per_second(1), burst: 1_000 };
        // Deliver each report twice, in a seeded order.
        let mut msgs: Vec<(u8, u64)> = reps.iter().chain(&reps).copied().collect();
        let mut s = seed;
        for i in (1..msgs.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            msgs.swap(i, (s >> 33) as usize % (i + 1));
        }
        let now = 1_000 * SECOND;
        let mut rc = RemoteCounts::new("us", 10, 0);
        let mut st: Option<State> = None;
        // The local bucket exists before any remote figure arrives.
        let peek = |remote| Request { now, cost: 0, request_id: "", remote };
        st = Some(algo::take(&p, st.as_ref(), &peek(Remote::default())).0);
        for (r, c) in &msgs {
            rc.merge(REGIONS[usize::from(*r)], "k", &p, 0, *c, now);
            let remote = rc.remote_for("k", &p, now, 3);
            st = Some(algo::take(&p, st.as_ref(), &peek(remote)).0);
        }
        let expected: u64 = (0..3u8)
            .map(|r| reps.iter().filter(|x| x.0 == r).map(|x| x.1).max().unwrap_or(0))
            .sum();
        let left = algo::evaluate(&p, st.as_ref(), &peek(rc.remote_for("k", &p, now, 3)));
        prop_assert_eq!(left.remaining, 1_000 - expected);
    }
}
