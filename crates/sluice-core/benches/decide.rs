//! Core cost per decision: match + plan + the batch arithmetic + decide, over 1,000 rules.
#![allow(missing_docs)] // criterion_group! generates undocumented items
//! Target: under 500 ns on one core (`cargo bench -p sluice-core --bench decide`).

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::Remote;
use sluice_core::batch::apply;
use sluice_core::decision::{Answer, headers, plan};
use sluice_core::rules::parse_yaml;
use std::hint::black_box;

#[path = "support/workload.rs"]
mod workload;
use workload::{Scratch, decide_once, descriptors, rules};

fn bench(c: &mut Criterion) {
    let set = parse_yaml(&rules(1000)).expect("bench rules are valid");
    let dom = set.domain("bench").expect("domain");
    let d = descriptors();
    let mut scratch = Scratch::new();
    let mut now = 1_700_000_000_000_000u64;
    c.bench_function("match+decide/1000 rules", |b| {
        b.iter(|| {
            now += 1_000;
            black_box(decide_once(dom, &d, now, &mut scratch).allowed())
        })
    });
    // A received gossip figure's rule, looked up by id: the scan it replaced, side by side.
    c.bench_function("rule by id, scan/1000 rules", |b| {
        b.iter(|| black_box(dom.rules.iter().find(|r| &*r.id == black_box("r737"))))
    });
    c.bench_function("rule by id/1000 rules", |b| {
        b.iter(|| black_box(dom.rule(black_box("r737"))))
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
        .map(|pc| {
            Answer::Done(
                apply(
                    &pc.call,
                    &vec![None::<sluice_core::State>; pc.call.items.len()],
                )
                .0,
            )
        })
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
