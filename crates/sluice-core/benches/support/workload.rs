//! The 1,000-rule workload shared by the criterion bench (`benches/decide.rs`) and the
//! callgrind example (`examples/decide_loop.rs`), so both measure the same thing.

use sluice_core::batch::{Write, apply};
use sluice_core::decision::{Answer, Decision, plan};
use sluice_core::matching::Descriptors;
use sluice_core::rules::Domain;
use sluice_core::{Micros, Remote, State};
use std::collections::HashMap;
use std::hint::black_box;

/// A rules file of `n` rules (routes × tiers, four algorithms) plus one grouped catch-all.
pub fn rules(n: usize) -> String {
    let mut y = String::from("domain: bench\nrules:\n");
    let algs = [
        "algorithm: token_bucket, rate_per_s: 100, burst: 200",
        "algorithm: fixed_window, limit: 10000, window: 1d",
        "algorithm: sliding_window, limit: 600, window: 1m",
        "algorithm: gcra, rate_per_s: 50, burst: 10",
    ];
    for i in 0..n {
        let tier = ["free", "growth", "enterprise"][i % 3];
        y.push_str(&format!(
            "  - {{ id: r{i}, match: {{ route: \"GET /v1/r{}\", tier: {tier} }}, key: [api_key], {} }}\n",
            i / 3,
            algs[i % algs.len()]
        ));
    }
    y.push_str("  - { id: per-key, group: g, match: { tier: \"*\" }, key: [api_key], algorithm: sliding_window, limit: 6000, window: 1m }\n");
    y
}

/// A typical request's descriptors.
pub fn descriptors() -> Descriptors {
    Descriptors::new(vec![
        ("route".into(), "GET /v1/r42".into()),
        ("tier".into(), "growth".into()),
        ("api_key".into(), "k_8f2a".into()),
        ("ip".into(), "49.36.1.7".into()),
    ])
    .expect("valid descriptors")
}

/// One whole decision: plan, the batch arithmetic over `states` (as the memory store does),
/// decide.
pub fn decide_once(
    dom: &Domain,
    d: &Descriptors,
    now: Micros,
    states: &mut HashMap<String, State>,
) -> Decision {
    let p = plan(dom, black_box(d), now, 1, "req", |_| Remote::default());
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
    p.decide(1, &answers)
}
