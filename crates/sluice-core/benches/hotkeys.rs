//! The hot-key layer's cost per store call, beside which it saves a Redis round trip: an
//! ordinary key (a miss, the common case), a cached refusal, a lease spend, the detector's
//! count for a key of `lease: auto`, and a request decided by a sync gate and by a local share
//! (`cargo bench -p sluice-core --bench hotkeys`).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::batch::apply;
use sluice_core::decision::plan;
use sluice_core::hotkeys::{CallPolicy, Layer, Next, Route, Sent};
use sluice_core::matching::Descriptors;
use sluice_core::rules::parse_yaml;
use std::hint::black_box;

const RULES: &str = r#"
domain: api
rules:
  - { id: plain, match: { r: plain }, key: [k], algorithm: token_bucket, rate_per_s: 1000000, burst: 1000000 }
  - { id: refused, match: { r: refused }, key: [k], algorithm: fixed_window, limit: 1, window: 1h }
  - { id: leased, match: { r: leased }, key: [k], algorithm: token_bucket, rate_per_s: 1000000000, burst: 1000000000, hot_keys: { lease: 1000000000 } }
  - { id: auto, match: { r: auto }, key: [k], algorithm: token_bucket, rate_per_s: 1000000, burst: 1000000, hot_keys: { lease: auto } }
  - { id: synced, match: { r: synced }, key: [k], algorithm: token_bucket, rate_per_s: 1000000000, burst: 1000000000, hot_keys: { sync_interval: 1s } }
  - { id: shared, match: { r: shared }, key: [k], algorithm: token_bucket, rate_per_s: 1000000000, burst: 1000000000, hot_keys: { local_share: true } }
"#;

fn bench(c: &mut Criterion) {
    let set = parse_yaml(RULES).expect("bench rules are valid");
    let dom = set.domain("api").expect("domain");
    let now = 1_700_000_000_000_000u64;
    let desc = |r: &str| {
        Descriptors::new(vec![
            ("r".into(), r.into()),
            ("k".into(), "key-1234".into()),
        ])
        .expect("valid")
    };
    for (name, r) in [
        ("layer/ordinary key (miss)", "plain"),
        ("layer/cached refusal", "refused"),
        ("layer/lease spend", "leased"),
        ("layer/auto, cold key", "auto"),
        ("layer/sync gate admit", "synced"),
        ("layer/local share admit", "shared"),
    ] {
        let d = desc(r);
        let mut layer = Layer::new(100_000, 10_000);
        layer.set_daemons(4);
        let p = plan(dom, &d, now, 1, "req", |_| Default::default());
        let policy = CallPolicy::of(&p, 0);
        // Prime: the refusal cached, the lease taken.
        for _ in 0..2 {
            let pc = &p.calls[0];
            let sent = match layer.route(pc, policy, set.version) {
                Route::Lease { batch } => Sent::Lease { batch },
                _ => Sent::Plain,
            };
            let mut call = pc.call.clone();
            if let Sent::Lease { batch } = sent {
                call.cost = batch;
            }
            let (mut res, _) = apply(&call, &vec![None::<sluice_core::State>; call.items.len()]);
            if r == "refused" {
                res.allowed = false;
                res.outcomes[0].allowed = false;
                res.outcomes[0].retry_after = 3_600_000_000;
            }
            let _: Next = layer.answered(pc, policy, sent, res);
        }
        // Time stands still: a refusal stays cached, a lease stays young.
        c.bench_function(name, |b| {
            b.iter(|| black_box(layer.route(black_box(&p.calls[0]), policy, set.version)))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
