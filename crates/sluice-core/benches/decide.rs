//! Core cost per decision: match + plan + the batch arithmetic + decide, over 1,000 rules.
#![allow(missing_docs)] // criterion_group! generates undocumented items
//! Target: under 500 ns on one core (`cargo bench -p sluice-core --bench decide`).

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::Remote;
use sluice_core::batch::{Write, apply};
use sluice_core::decision::{Answer, headers, plan};
use sluice_core::matching::Descriptors;
use sluice_core::rules::parse_yaml;
use std::collections::HashMap;
use std::hint::black_box;

fn rules(n: usize) -> String {
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

fn bench(c: &mut Criterion) {
    let set = parse_yaml(&rules(1000)).expect("bench rules are valid");
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
    c.bench_function("match+decide/1000 rules", |b| {
        b.iter(|| {
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
            black_box(p.decide(1, &answers))
        })
    });
    c.bench_function("match only/1000 rules", |b| {
        b.iter(|| black_box(sluice_core::matching::applicable(dom, black_box(&d))))
    });
    c.bench_function("plan/1000 rules", |b| {
        b.iter(|| {
            black_box(plan(dom, black_box(&d), now, 1, "req", |_| {
                Remote::default()
            }))
        })
    });
    let p = plan(dom, &d, now, 1, "req", |_| Remote::default());
    let answers: Vec<Answer> = p
        .calls
        .iter()
        .map(|pc| Answer::Done(apply(&pc.call, &vec![None; pc.call.items.len()]).0))
        .collect();
    c.bench_function("decide", |b| {
        b.iter(|| black_box(p.decide(1, black_box(&answers))))
    });
    let dec = p.decide(1, &answers);
    c.bench_function("headers", |b| {
        b.iter(|| black_box(headers(black_box(&dec))))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
