//! The decision path allocates nothing once a key has been seen: every request goes through
//! it, and an allocation (and its free) costs more than the rest of a decision's arithmetic.
//! Runs the 1,000-rule workload of `benches/decide.rs` under a counting allocator.

use sluice_core::rules::parse_yaml;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[path = "../benches/support/workload.rs"]
mod workload;
use workload::{Scratch, decide_once, descriptors, rules};

/// Decisions counted after the warm-up.
const N: u64 = 1_000;

/// The counts are the whole process's: one test counts at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn steady_state_decisions_allocate_nothing() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let set = parse_yaml(&rules(1000)).expect("valid rules");
    let dom = set.domain("bench").expect("domain");
    let d = descriptors();
    let mut scratch = Scratch::new();
    let mut now = 1_700_000_000_000_000u64;
    // The first requests create the key's states (and size the buffers).
    for _ in 0..10 {
        now += 1_000;
        decide_once(dom, &d, now, &mut scratch);
    }
    let region = Region::new(GLOBAL);
    let mut allowed = 0;
    for _ in 0..N {
        now += 1_000;
        if decide_once(dom, &d, now, &mut scratch).allowed() {
            allowed += 1;
        }
    }
    let s = region.change();
    // Both verdicts were taken: the refusal path is held to it too.
    assert!(allowed > 0 && allowed < N, "{allowed} of {N} allowed");
    assert_eq!(
        (s.allocations, s.reallocations),
        (0, 0),
        "{} allocations, {} reallocations in {N} decisions",
        s.allocations,
        s.reallocations
    );
}

/// A plan recycled through [`Spare`] (as the daemon keeps one per finished check, its rule
/// snapshot loaded anew each time) plans without allocating either.
#[test]
fn plans_from_a_spare_allocate_nothing() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    use sluice_core::Remote;
    use sluice_core::decision::{Plan, Spare, plan_into};
    let set = parse_yaml(&rules(1000)).expect("valid rules");
    let dom = set.domain("bench").expect("domain");
    let d = descriptors();
    let mut spare = Spare::default();
    let plan_once = |spare: Spare, now: u64| {
        let mut p = Plan::from_spare(spare);
        plan_into(&mut p, dom, &d, now, 1, "req", |_| Remote::default());
        assert_eq!(p.calls.len(), 1);
        p.into_spare()
    };
    for now in 0..10 {
        spare = plan_once(spare, now);
    }
    let region = Region::new(GLOBAL);
    for now in 10..10 + N {
        spare = plan_once(spare, now);
    }
    let s = region.change();
    assert_eq!(
        (s.allocations, s.reallocations),
        (0, 0),
        "{} allocations, {} reallocations in {N} plans",
        s.allocations,
        s.reallocations
    );
}
