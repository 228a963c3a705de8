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

#[test]
fn steady_state_decisions_allocate_nothing() {
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
