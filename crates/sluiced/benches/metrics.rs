//! The metrics' share of a check: counting a decision's policies in their rules' counters
//! (`Metrics::count`, what `Engine::count` does) and one latency observation, on one thread
//! and on two at once (`cargo bench -p sluiced --bench metrics`).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_control::Published;
use sluice_core::decision::{Code, Decision, PolicyStatus, QuotaUnit, Via};
use sluice_core::rules::{HeaderMode, parse_yaml};
use sluiced::metrics::{Histogram, Metrics};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Eight domains of sixteen rules each.
fn rules() -> String {
    let mut y = String::new();
    for d in 0..8 {
        y.push_str(&format!("---\ndomain: domain-{d}\nrules:\n"));
        for r in 0..16 {
            y.push_str(&format!(
                "  - {{ id: rule-{r}, key: [k], algorithm: fixed_window, limit: 10, window: 1h }}\n"
            ));
        }
    }
    y
}

/// A decision by three of a domain's rules, their ids shared with the rules as the core does.
fn decision(dom: &sluice_core::rules::Domain) -> Decision {
    let policies = [3, 7, 11]
        .iter()
        .map(|&i| PolicyStatus {
            id: dom.rules[i].id.clone(),
            limit: 10,
            window_s: 3600,
            remaining: 9,
            reset_s: 1,
            allowed: true,
            retry_after_ms: 0,
            headers: HeaderMode::Full,
            via: Via::Store,
            unit: QuotaUnit::Requests,
            title: None,
        })
        .collect();
    Decision {
        code: Code::Ok,
        decided_by: None,
        retry_after_ms: 0,
        delay_ms: 0,
        policies,
        shadow_denied: Vec::new(),
        rules_version: 0,
        holds_slot: false,
    }
}

/// `per_thread` calls of `f` on each of `threads` threads at once; wall time per call.
fn threaded(threads: u32, per_thread: u64, f: &(impl Fn() + Sync)) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..per_thread {
                    f();
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let published = Published::new(parse_yaml(&rules()).expect("valid rules"));
    let metrics = Metrics::default();
    metrics.resolve(&published);
    let set = published.load();
    let dom = set.domain("domain-5").expect("domain");
    let d = decision(dom);
    let count = || metrics.count(&published, black_box(dom), black_box(&d));
    c.bench_function("count 3 policies", |b| b.iter(count));
    c.bench_function("count 3 policies, 2 threads", |b| {
        b.iter_custom(|iters| threaded(2, iters, &count))
    });
    let h = Histogram::default();
    c.bench_function("observe 0.3 ms", |b| {
        b.iter(|| h.observe(black_box(0.0003)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
