//! Runs N decisions over the 1,000-rule set of the criterion bench, for instruction counts
//! that do not depend on machine load:
//! `valgrind --tool=callgrind target/release/examples/decide_loop 100000` vs `... 0`.

use sluice_core::Remote;
use sluice_core::batch::{Write, apply};
use sluice_core::decision::{Answer, plan};
use sluice_core::matching::Descriptors;
use sluice_core::rules::parse_yaml;
use std::collections::HashMap;
use std::hint::black_box;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let mut y = String::from("domain: bench\nrules:\n");
    let algs = [
        "algorithm: token_bucket, rate_per_s: 100, burst: 200",
        "algorithm: fixed_window, limit: 10000, window: 1d",
        "algorithm: sliding_window, limit: 600, window: 1m",
        "algorithm: gcra, rate_per_s: 50, burst: 10",
    ];
    for i in 0..1000 {
        let tier = ["free", "growth", "enterprise"][i % 3];
        y.push_str(&format!(
            "  - {{ id: r{i}, match: {{ route: \"GET /v1/r{}\", tier: {tier} }}, key: [api_key], {} }}\n",
            i / 3,
            algs[i % algs.len()]
        ));
    }
    y.push_str("  - { id: per-key, group: g, match: { tier: \"*\" }, key: [api_key], algorithm: sliding_window, limit: 6000, window: 1m }\n");
    let set = parse_yaml(&y).expect("valid rules");
    let dom = set.domain("bench").expect("domain");
    let d = Descriptors::new(vec![
        ("route".into(), "GET /v1/r42".into()),
        ("tier".into(), "growth".into()),
        ("api_key".into(), "k_8f2a".into()),
        ("ip".into(), "49.36.1.7".into()),
    ])
    .expect("valid");
    let mut states = HashMap::new();
    let mut now = 1_700_000_000_000_000u64;
    let mut allowed = 0u64;
    for _ in 0..n {
        now += 1_000;
        let p = plan(dom, black_box(&d), now, 1, "req", |_| Remote::default());
        let answers: Vec<Answer> = p
            .calls
            .iter()
            .map(|pc| {
                let cur: Vec<_> = pc
                    .call
                    .items
                    .iter()
                    .map(|i| states.get(&i.key).cloned())
                    .collect();
                let (r, w) = apply(&pc.call, &cur);
                for (i, w) in pc.call.items.iter().zip(w) {
                    if let Write::Put(s, _) = w {
                        states.insert(i.key.clone(), s);
                    }
                }
                Answer::Done(r)
            })
            .collect();
        if p.decide(1, &answers).allowed() {
            allowed += 1;
        }
    }
    println!("{n} decisions, {allowed} allowed");
}
