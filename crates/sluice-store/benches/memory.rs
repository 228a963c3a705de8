//! The memory store at its key bound: what a new key costs when its shard is full (it must
//! evict), beside a check of a key the store already holds
//! (`cargo bench -p sluice-store --bench memory`).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::algo::Window;
use sluice_core::batch::{Call, Item};
use sluice_core::{Params, Remote};
use sluice_store::MemoryStore;
use std::hint::black_box;

fn call(key: String, now: u64) -> Call {
    Call {
        now,
        cost: 1,
        request_id: "r".into(),
        items: vec![Item {
            key,
            // One window for every key: none expires during the run, so each new key evicts.
            params: Params::FixedWindow {
                limit: 1_000_000_000,
                window: Window::Epoch(3_600_000_000),
            },
            enforce: true,
            charge_rejected: false,
            remote: Remote::default(),
        }],
    }
}

fn bench(c: &mut Criterion) {
    // The daemon's local buckets (100,000 keys) and the embedded default (1,000,000).
    for max_keys in [100_000usize, 1_000_000] {
        let s = MemoryStore::with_seed(max_keys, 1);
        // A quarter more keys than the bound, so every shard is at its bound.
        for i in 0..max_keys + max_keys / 4 {
            s.check_sync(&call(format!("sl:{{k{i}}}:r"), 1))
                .expect("a valid call");
        }
        let mut i = 0u64;
        c.bench_function(&format!("check of a held key/{max_keys} keys"), |b| {
            b.iter(|| {
                i = (i + 7_919) % 1_000;
                let key = format!("sl:{{k{}}}:r", max_keys + i as usize);
                black_box(s.check_sync(&call(key, 2)).expect("a valid call"))
            })
        });
        let mut n = 0u64;
        c.bench_function(&format!("new key at the bound/{max_keys} keys"), |b| {
            b.iter(|| {
                n += 1;
                black_box(
                    s.check_sync(&call(format!("sl:{{n{n}}}:r"), 2))
                        .expect("a valid call"),
                )
            })
        });
        assert!(s.evictions() > 0, "the bound was reached");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
