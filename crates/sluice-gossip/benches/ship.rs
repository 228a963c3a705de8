//! How many busy keys one region ships per interval, and the lag from a count changing in one
//! region to being used in another, at 1k, 10k and 100k busy keys (docs/regions.md).
//!
//! ```text
//! cargo bench -p sluice-gossip --bench ship            # 1k, 10k, 100k
//! cargo bench -p sluice-gossip --bench ship -- 100000  # one size
//! ```
//!
//! Two real nodes on loopback (regions `a` and `b`, one process, framed and HMAC-tagged
//! datagrams of at most 1,400 bytes, a 1 s ship interval). In `a`, every busy key's count
//! rises once per interval, the changes spread evenly over the interval (as traffic would);
//! a prober in `b` watches a sample of keys every 5 ms through `remote_for`, the call a
//! decision makes, and records for each change the time until `b` would use it. The lag is
//! therefore what a decision sees: the wait for the next shipment (up to one interval), the
//! packing, the datagrams, and the merge.

use sluice_core::algo::{Kind, Window};
use sluice_core::matching::store_key;
use sluice_core::ship::Observed;
use sluice_core::{Micros, Params};
use sluice_gossip::{Config, Node, RuleLookup, now_micros};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

struct Lookup;

fn params() -> Params {
    Params::FixedWindow {
        limit: 1_000,
        window: Window::Epoch(3_600_000_000),
    }
}

impl RuleLookup for Lookup {
    fn global_params(&self, _identity: &str, rule: &str) -> Option<Params> {
        (rule == "g").then(params)
    }
}

fn key(i: usize) -> String {
    store_key(&format!("bench|api_key=k_{i:06}"), "g", Kind::FixedWindow)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn run(n: usize, intervals: u64) {
    let key_bytes = b"bench gossip key of 32 bytes ...".to_vec();
    let mut ca = Config::new("a", "a-1", ([127, 0, 0, 1], 0).into());
    ca.key = Some(key_bytes.clone());
    let a = Node::start(ca, Arc::new(Lookup)).await.expect("a starts");
    let mut cb = Config::new("b", "b-1", ([127, 0, 0, 1], 0).into());
    cb.key = Some(key_bytes);
    cb.seeds = vec![a.local_addr().to_string()];
    let b = Node::start(cb, Arc::new(Lookup)).await.expect("b starts");
    while a.members().len() < 2 || b.members().len() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = Arc::new(a);
    let b = Arc::new(b);
    let keys: Arc<Vec<String>> = Arc::new((0..n).map(key).collect());
    // Per key: the count last set in `a` and when.
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let changed: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let p = params();

    // The feeder: every key once per second, in 100 slices of 10 ms.
    let feeder = {
        let (a, keys, counts, changed, stop, p) = (
            a.clone(),
            keys.clone(),
            counts.clone(),
            changed.clone(),
            stop.clone(),
            p.clone(),
        );
        tokio::spawn(async move {
            let mut round = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let slices = 100;
            while !stop.load(Ordering::Relaxed) {
                for s in 0..slices {
                    tick.tick().await;
                    let now = now_micros();
                    for i in (s * n / slices)..((s + 1) * n / slices) {
                        let c = 200 + round;
                        counts[i].store(c, Ordering::Relaxed);
                        changed[i].store(now, Ordering::Relaxed);
                        a.observe(&keys[i], &p, now, Observed::count(c, 10));
                    }
                }
                round += 1;
            }
        })
    };

    // The prober: a sample of keys every 5 ms.
    let sample: Vec<usize> = (0..n).step_by((n / 1000).max(1)).collect();
    let prober = {
        let (b, keys, counts, changed, stop, p) = (
            b.clone(),
            keys.clone(),
            counts.clone(),
            changed.clone(),
            stop.clone(),
            p.clone(),
        );
        tokio::spawn(async move {
            let mut seen: Vec<u64> = vec![0; sample.len()];
            let mut lags: Vec<u64> = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let now = now_micros();
                for (j, &i) in sample.iter().enumerate() {
                    let want = counts[i].load(Ordering::Relaxed);
                    let at: Micros = changed[i].load(Ordering::Relaxed);
                    if want == 0 || want <= seen[j] {
                        continue;
                    }
                    if b.remote_for(&keys[i], &p, now).cur >= want {
                        seen[j] = want;
                        lags.push(now.saturating_sub(at) / 1000);
                    }
                }
            }
            lags
        })
    };

    // Warm up two intervals, then measure.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (s0, d0) = (a.metrics().shipped(), a.metrics().deferred());
    let bytes0 = sent_bytes(&a);
    tokio::time::sleep(Duration::from_secs(intervals)).await;
    let (s1, d1) = (a.metrics().shipped(), a.metrics().deferred());
    let bytes1 = sent_bytes(&a);
    stop.store(true, Ordering::Relaxed);
    let _ = feeder.await;
    let mut lags = prober.await.unwrap_or_default();
    lags.sort_unstable();
    let mut out = String::new();
    b.render_metrics(&mut out);
    let overload = out
        .lines()
        .find(|l| l.starts_with("sluice_gossip_frames_rejected_total{reason=\"overload\"}"))
        .unwrap_or("")
        .to_string();
    println!(
        "{n:>7} busy keys | shipped/interval {:>7} | deferred/interval {:>5} | KB/interval {:>7.1} ({:.1} B/figure) | lag ms p50 {:>4} p99 {:>4} max {:>4} (n={}) | {}",
        (s1 - s0) / intervals,
        (d1 - d0) / intervals,
        (bytes1 - bytes0) as f64 / intervals as f64 / 1024.0,
        (bytes1 - bytes0) as f64 / (s1 - s0).max(1) as f64,
        percentile(&lags, 0.5),
        percentile(&lags, 0.99),
        lags.last().copied().unwrap_or(0),
        lags.len(),
        overload,
    );
    a.shutdown().await;
    b.shutdown().await;
}

fn sent_bytes(n: &Node) -> u64 {
    let mut out = String::new();
    n.render_metrics(&mut out);
    out.lines()
        .find_map(|l| l.strip_prefix("sluice_gossip_bytes_sent_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for n in sizes {
        rt.block_on(run(n, 8));
    }
}
