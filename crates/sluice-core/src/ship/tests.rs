//! Tests of the parent module (unit and property tests), kept apart so the module reads
//! as its one job.

use super::*;
use crate::algo::{Rate, Window};
use crate::time::SECOND;

const MIN: Micros = 60 * SECOND;

fn fixed(limit: u64) -> Params {
    Params::FixedWindow {
        limit,
        window: Window::Epoch(MIN),
    }
}

/// What [`observed`] would give for a region figure `figure`, busy on `busy`, against
/// `pct` percent.
fn ob(figure: u64, busy: u64, pct: u8) -> Observed {
    Observed {
        figure,
        busy,
        rank: busy,
        threshold: Threshold::percent(pct),
        generation: 0,
    }
}

fn unbounded() -> Budget {
    Budget {
        max_bytes: usize::MAX,
        max_entries: usize::MAX,
        resend_after: 0,
    }
}

#[test]
fn only_busy_changed_figures_ship() {
    let mut u = LocalUsage::new(0);
    let p = fixed(1000);
    u.observe("quiet", &p, 1, ob(100, 100, 10)); // exactly 10%: not above
    u.observe("busy", &p, 1, ob(101, 101, 10));
    let b = u.select(2, &unbounded());
    assert_eq!(b.entries.len(), 1);
    assert_eq!(b.entries[0].key, "busy");
    assert_eq!(b.quiet, 1);
    // Unchanged: nothing to send.
    assert!(u.select(3, &unbounded()).entries.is_empty());
    u.observe("busy", &p, 4, ob(150, 150, 10));
    assert_eq!(u.select(5, &unbounded()).entries[0].count, 150);
    // A threshold of 0 shares every key with any usage.
    u.observe("quiet", &p, 6, ob(100, 100, 0));
    assert_eq!(u.select(7, &unbounded()).entries[0].key, "quiet");
}

#[test]
fn quiet_keys_are_not_held() {
    let mut u = LocalUsage::new(0);
    for i in 0..1000 {
        u.observe(&format!("k{i}"), &fixed(1000), 1, ob(50, 50, 10));
    }
    assert!(u.is_empty());
    // Once busy, the key is tracked, and its next window too (quiet or not); the
    // window that ended is dropped.
    u.observe("k1", &fixed(1000), 2, ob(150, 150, 10));
    assert_eq!(u.len(), 1);
    u.observe("k1", &fixed(1000), MIN + 1, ob(3, 3, 10));
    assert_eq!(u.len(), 1);
    let b = u.select(MIN + 2, &unbounded());
    assert_eq!(b.entries.len(), 0, "window 0 is over, window 1 is quiet");
    assert_eq!(b.quiet, 1000 + 1);
}

#[test]
fn nearest_the_limit_first_and_the_rest_deferred() {
    let mut u = LocalUsage::new(0);
    u.observe("a", &fixed(1000), 1, ob(200, 200, 10)); // 20%
    u.observe("b", &fixed(100), 1, ob(90, 90, 10)); // 90%
    u.observe("c", &fixed(1000), 1, ob(500, 500, 10)); // 50%
    let budget = Budget {
        max_entries: 2,
        ..unbounded()
    };
    let b = u.select(2, &budget);
    let keys: Vec<&str> = b.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["b", "c"]);
    assert_eq!(b.deferred, 1);
    // The deferred one goes next interval.
    let b = u.select(3, &budget);
    assert_eq!(b.entries[0].key, "a");
    assert_eq!(b.deferred, 0);
}

#[test]
fn the_byte_budget_bounds_an_interval() {
    let mut u = LocalUsage::new(0);
    for i in 0..1000 {
        u.observe(&format!("sl:{{k{i}}}:r"), &fixed(100), 1, ob(50, 50, 10));
    }
    let budget = Budget {
        max_bytes: 1_000,
        ..unbounded()
    };
    let b = u.select(2, &budget);
    assert!(b.bytes <= 1_000);
    assert_eq!(b.entries.len() + b.deferred, 1000);
    assert_eq!(
        b.bytes,
        b.entries.iter().map(ShipEntry::bytes).sum::<usize>()
    );
}

#[test]
fn unchanged_figures_are_resent_after_a_while() {
    let mut u = LocalUsage::new(0);
    u.observe("k", &fixed(100), 1, ob(50, 50, 10));
    let budget = Budget {
        resend_after: SECOND,
        ..unbounded()
    };
    assert_eq!(u.select(10, &budget).entries.len(), 1);
    assert!(u.select(SECOND, &budget).entries.is_empty());
    assert_eq!(u.select(SECOND + 10, &budget).entries.len(), 1);
}

#[test]
fn a_clock_stepped_back_resends_what_it_shipped_once() {
    // Shipped at 40 s; the wall clock then steps back to 20 s. The time since the shipment
    // is unknown, so the figure is due again (a lost datagram is repaired), once.
    let mut u = LocalUsage::new(0);
    u.observe("k", &fixed(100), 30 * SECOND, ob(50, 50, 10));
    let budget = Budget {
        resend_after: 5 * SECOND,
        ..unbounded()
    };
    assert_eq!(u.select(40 * SECOND, &budget).entries.len(), 1);
    assert!(u.select(41 * SECOND, &budget).entries.is_empty());
    assert_eq!(u.select(20 * SECOND, &budget).entries.len(), 1);
    assert!(u.select(21 * SECOND, &budget).entries.is_empty());
    assert_eq!(u.select(25 * SECOND, &budget).entries.len(), 1);
}

#[test]
fn resend_all_ships_unchanged_busy_figures_again() {
    let mut u = LocalUsage::new(0);
    u.observe("busy", &fixed(100), 1, ob(50, 50, 10));
    u.observe("quiet", &fixed(100), 1, ob(5, 5, 10));
    assert_eq!(u.select(2, &unbounded()).entries.len(), 1);
    assert!(u.select(3, &unbounded()).entries.is_empty());
    u.resend_all();
    let b = u.select(4, &unbounded());
    assert_eq!(b.entries.len(), 1);
    assert_eq!(b.entries[0].key, "busy");
}

#[test]
fn windows_roll_and_expire() {
    let mut u = LocalUsage::new(0);
    let p = fixed(100);
    u.observe("k", &p, 1, ob(50, 50, 10));
    u.observe("k", &p, MIN + 1, ob(20, 20, 10));
    // The old window is over: only the new one ships.
    let b = u.select(MIN + 2, &unbounded());
    assert_eq!(b.entries.len(), 1);
    assert_eq!(b.entries[0].window_start, MIN);
    assert_eq!(u.len(), 1);
    // A sliding window's previous count still matters after it rolls.
    let s = Params::SlidingWindow {
        limit: 100,
        window: MIN,
        start: Default::default(),
    };
    u.observe("s", &s, MIN - 1, ob(60, 60, 10));
    u.observe("s", &s, MIN + 1, ob(1, 1, 10));
    let b = u.select(MIN + 2, &unbounded());
    assert!(
        b.entries
            .iter()
            .any(|e| e.key == "s" && e.window_start == 0 && e.count == 60)
    );
    assert_eq!(u.select(3 * MIN, &unbounded()).entries.len(), 0);
    assert!(u.is_empty());
}

#[test]
fn buckets_ship_cumulative_figures_by_depletion() {
    let mut u = LocalUsage::new(0);
    let p = Params::TokenBucket {
        rate: Rate::per_second(10),
        burst: 100,
    };
    u.observe("b", &p, 1, ob(500, 50, 10));
    u.observe("b", &p, 2, ob(480, 5, 10)); // figures never go down; depletion may
    let b = u.select(3, &unbounded());
    assert!(b.entries.is_empty(), "5% drained is not busy");
    u.observe("b", &p, 4, ob(530, 40, 10));
    let b = u.select(5, &unbounded());
    assert_eq!(
        b.entries,
        vec![ShipEntry {
            key: "b".into(),
            window_start: 0,
            count: 530
        }]
    );
}

fn outcome(limit: u64, remaining: u64, usage: u64) -> Outcome {
    Outcome {
        allowed: true,
        limit,
        remaining,
        reset: 0,
        retry_after: 0,
        window: MIN,
        usage,
        generation: 0,
    }
}

fn rule(on: BusyOn, regions: usize) -> BusyRule {
    BusyRule { on, regions }
}

#[test]
fn what_is_recorded_per_algorithm() {
    // A window saw 70 (30 of them remote), the region counted 40.
    let w = outcome(100, 30, 40);
    let rec = |p: &Params, o: &Outcome, on| {
        observed(p, o, rule(on, 4), 10).map(|r| (r.figure, r.busy, r.rank, r.threshold.ppm()))
    };
    for p in [
        fixed(100),
        Params::SlidingWindow {
            limit: 100,
            window: MIN,
            start: Default::default(),
        },
    ] {
        assert_eq!(
            rec(&p, &w, BusyOn::RegionCount),
            Some((40, 40, 40, 100_000))
        );
        assert_eq!(rec(&p, &w, BusyOn::SeenCount), Some((40, 70, 70, 100_000)));
        // Heard of (the decision saw more than the region's count): always shipped.
        assert_eq!(rec(&p, &w, BusyOn::Heard), Some((40, 40, 70, 0)));
        let alone = outcome(100, 60, 40);
        assert_eq!(rec(&p, &alone, BusyOn::Heard), Some((40, 40, 40, 100_000)));
        // A quarter of the threshold in each of 4 regions.
        assert_eq!(rec(&p, &w, BusyOn::RegionShare), Some((40, 40, 40, 25_000)));
        assert_eq!(rec(&p, &w, BusyOn::SeenShare), Some((40, 70, 70, 25_000)));
    }
    // A bucket ships the store's `used`, is ranked on how drained it is, and is busy on
    // how drained it is, on `used` with `region_share`, on the larger with `seen_share`.
    let b = outcome(100, 25, 500);
    for p in [
        Params::TokenBucket {
            rate: Rate::per_second(10),
            burst: 100,
        },
        Params::Gcra {
            rate: Rate::per_second(10),
            burst: 100,
        },
    ] {
        for on in [BusyOn::RegionCount, BusyOn::SeenCount, BusyOn::Heard] {
            assert_eq!(rec(&p, &b, on), Some((500, 75, 75, 100_000)));
        }
        assert_eq!(
            rec(&p, &b, BusyOn::RegionShare),
            Some((500, 500, 75, 25_000))
        );
        assert_eq!(rec(&p, &b, BusyOn::SeenShare), Some((500, 500, 75, 25_000)));
        let fresh = outcome(100, 25, 3);
        assert_eq!(
            rec(&p, &fresh, BusyOn::SeenShare),
            Some((3, 75, 75, 25_000))
        );
    }
    let log = Params::SlidingLog {
        limit: 100,
        window: MIN,
    };
    assert_eq!(rec(&log, &w, BusyOn::RegionCount), None);
}

/// What one region leaves unshipped of a window: the most it can count without its key
/// becoming busy, for a 1,000 limit at 10%.
fn hidden(on: BusyOn, regions: usize) -> u64 {
    let mut u = LocalUsage::new(0);
    let p = fixed(1000);
    for c in 1..=1000 {
        let o = observed(&p, &outcome(1000, 1000 - c, c), rule(on, regions), 10).expect("shared");
        u.observe("k", &p, 1, o);
        if !u.select(2, &unbounded()).entries.is_empty() {
            return c - 1;
        }
    }
    1000
}

#[test]
fn region_share_hides_under_the_threshold_in_all_regions() {
    for regions in [1, 3, 10, 30, 200] {
        let h = hidden(BusyOn::RegionShare, regions);
        assert_eq!(h, 100 / regions as u64, "{regions} regions");
        assert_eq!(hidden(BusyOn::SeenShare, regions), h, "{regions} regions");
        // All the other regions together: under θ × L for any number of regions,
        // where the region's own count hides (R − 1) × θ × L.
        assert!((regions as u64 - 1) * h < 100, "{regions} regions");
        assert_eq!(hidden(BusyOn::RegionCount, regions), 100);
    }
    // The default is a bounded rule; a threshold of 0 splits to 0.
    assert_eq!(BusyOn::default(), BusyOn::SeenShare);
    assert_eq!(
        rule(BusyOn::RegionShare, 3).threshold(0),
        Threshold::percent(0)
    );
    assert_eq!(
        rule(BusyOn::RegionShare, 0).threshold(10),
        Threshold::percent(10)
    );
}

#[test]
fn a_key_heard_of_stays_shipped_for_its_window() {
    let mut u = LocalUsage::new(0);
    let p = fixed(1000);
    let heard = rule(BusyOn::Heard, 3);
    // 5 of the region's own after 300 from elsewhere: shipped though far under 10%.
    u.observe(
        "k",
        &p,
        1,
        observed(&p, &outcome(1000, 695, 5), heard, 10).expect("w"),
    );
    assert_eq!(u.select(2, &unbounded()).entries[0].count, 5);
    // The remote figure gone from the view (expired elsewhere), the key still ships.
    u.observe(
        "k",
        &p,
        3,
        observed(&p, &outcome(1000, 994, 6), heard, 10).expect("w"),
    );
    assert_eq!(u.select(4, &unbounded()).entries[0].count, 6);
    // The next window starts quiet.
    u.observe(
        "k",
        &p,
        MIN + 1,
        observed(&p, &outcome(1000, 999, 1), heard, 10).expect("w"),
    );
    assert!(u.select(MIN + 2, &unbounded()).entries.is_empty());
}

#[test]
fn observations_are_the_global_rules_the_store_answered() {
    use crate::batch::CallResult;
    use crate::decision::plan;
    use crate::matching::Descriptors;
    let set = crate::rules::parse_yaml(
        r#"
domain: d
rules:
  - { id: g, key: [k], algorithm: token_bucket, rate_per_s: 10, burst: 100, scope: global }
  - { id: r, key: [k], algorithm: fixed_window, limit: 10, window: 1m }
  - { id: u, key: [u], algorithm: fixed_window, limit: 10, window: 1m, scope: global }
"#,
    )
    .expect("valid");
    let dom = set.domain("d").expect("domain");
    let desc =
        Descriptors::new(vec![("k".into(), "a".into()), ("u".into(), "b".into())]).expect("valid");
    let p = plan(dom, &desc, MIN, 1, "r", |_| crate::Remote::default());
    assert_eq!(p.calls.len(), 2, "one call per identity");
    let done = |pc: &crate::decision::PlannedCall| {
        crate::decision::Answer::Done(CallResult {
            allowed: true,
            outcomes: pc
                .rules
                .iter()
                .map(|&ai| match &*p.applied[ai].rule.id {
                    "g" => outcome(100, 90, 7),
                    _ => outcome(10, 6, 4),
                })
                .collect(),
        })
    };
    let ids = |answers: &[crate::decision::Answer]| -> Vec<(String, u64, u64)> {
        observations(&p, answers, rule(BusyOn::RegionCount, 3), None)
            .map(|(a, o)| (a.rule.id.to_string(), o.figure, o.busy))
            .collect()
    };
    let answers: Vec<_> = p.calls.iter().map(done).collect();
    // The region rule is not shipped.
    assert_eq!(ids(&answers), vec![("g".into(), 7, 10), ("u".into(), 4, 4)]);
    // A failed call's rules are not region figures (the second call is `u`'s identity).
    let failed = vec![
        answers[0].clone(),
        crate::decision::Answer::Failed { local: None },
    ];
    assert_eq!(ids(&failed), vec![("g".into(), 7, 10)]);
}

#[test]
fn sizes_follow_protobuf() {
    assert_eq!(varint_len(0), 1);
    assert_eq!(varint_len(127), 1);
    assert_eq!(varint_len(128), 2);
    assert_eq!(varint_len(u64::MAX), 10);
    // 1,700,000,000,000 ms needs 41 bits: 6 bytes.
    let e = entry_bytes("sl:{a}:r", 1_700_000_000_000 * MILLI, 300);
    assert_eq!(e, 1 + 1 + (1 + 1 + 8) + (1 + 6) + (1 + 2));
    assert_eq!(entry_bytes("k", 0, 0), 1 + 1 + 3);
}
