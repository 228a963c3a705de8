//! Runs N decisions over the 1,000-rule set of the criterion bench, for instruction counts
//! that do not depend on machine load:
//! `valgrind --tool=callgrind target/release/examples/decide_loop 100000` vs `... 0`.

use sluice_core::rules::parse_yaml;

#[path = "../benches/support/workload.rs"]
mod workload;
use workload::{Scratch, decide_once, descriptors, rules};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let set = parse_yaml(&rules(1000)).expect("valid rules");
    let dom = set.domain("bench").expect("domain");
    let d = descriptors();
    let mut scratch = Scratch::new();
    let mut now = 1_700_000_000_000_000u64;
    let mut allowed = 0u64;
    for _ in 0..n {
        now += 1_000;
        if decide_once(dom, &d, now, &mut scratch).allowed() {
            allowed += 1;
        }
    }
    println!("{n} decisions, {allowed} allowed");
}
