//! The hot-key layer's shell: the core's [`Layer`] sharded behind locks, a wake-up for
//! requests waiting on a lease call, and the give-backs and sync calls sent to the store.
//!
//! All decisions are the core's (`sluice_core::hotkeys`); this file only holds the state,
//! runs [`Layer::sweep`] on a timer and sends what it returns.

use sluice_core::Micros;
use sluice_core::batch::{Call, GiveBack};
use sluice_core::hotkeys::gate::SyncCall;
use sluice_core::hotkeys::{Layer, Stats, lease};
use sluice_store::Store;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

/// Shards: a key always lands on the same one, so its lease and its cached refusals live
/// under one lock, and distinct keys rarely contend.
const SHARDS: usize = 16;

/// The daemon's hot-key state.
#[derive(Debug)]
pub struct HotKeys {
    shards: Vec<Mutex<Layer>>,
    /// Woken when a lease call of the shard is answered.
    wake: Vec<Notify>,
    give_back_failures: AtomicU64,
    sync_failures: AtomicU64,
}

impl HotKeys {
    /// Room for `deny_entries` cached refusals and `leases` leases in all.
    pub fn new(deny_entries: usize, leases: usize) -> HotKeys {
        use std::hash::BuildHasher as _;
        // The OS's randomness, through std's randomly keyed hasher: a secret seed per daemon.
        let seed = std::collections::hash_map::RandomState::new().hash_one(0x407_u64);
        HotKeys {
            shards: (0..SHARDS)
                .map(|i| {
                    Mutex::new(Layer::with_seed(
                        deny_entries / SHARDS,
                        leases / SHARDS,
                        seed ^ i as u64,
                    ))
                })
                .collect(),
            wake: (0..SHARDS).map(|_| Notify::new()).collect(),
            give_back_failures: AtomicU64::new(0),
            sync_failures: AtomicU64::new(0),
        }
    }

    /// The shard of a call.
    pub fn shard_of(&self, call: &Call) -> usize {
        (lease::fingerprint(call) % SHARDS as u64) as usize
    }

    /// The shard's layer, locked (a panic while it was held left it usable: every step of a
    /// layer leaves it consistent).
    pub fn lock(&self, shard: usize) -> MutexGuard<'_, Layer> {
        self.shards[shard].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The wake-up of a shard's lease waiters.
    pub fn wake(&self, shard: usize) -> &Notify {
        &self.wake[shard]
    }

    /// The region's live daemons now, for local shares.
    pub fn set_daemons(&self, daemons: u64) {
        for s in 0..SHARDS {
            self.lock(s).set_daemons(daemons);
        }
    }

    /// Sends every give-back (each under `timeout`) and sync call due at `now` (all of them
    /// at shutdown). Sync calls take the engine's store path: its breaker and deadline, so a
    /// store that is down fails them at once and their units stay pending.
    pub async fn sweep(
        &self,
        engine: &crate::engine::Engine,
        now: Micros,
        timeout: Duration,
        all: bool,
    ) {
        let store: &dyn Store = engine.store.as_ref();
        let mut backs: Vec<GiveBack> = Vec::new();
        let mut syncs: Vec<(usize, SyncCall)> = Vec::new();
        for s in 0..SHARDS {
            let mut l = self.lock(s);
            backs.extend(if all { l.drain(now) } else { l.sweep(now) });
            let due = if all {
                l.drain_syncs(now)
            } else {
                l.syncs(now)
            };
            syncs.extend(due.into_iter().map(|c| (s, c)));
        }
        self.sync(engine, syncs, now).await;
        for g in &backs {
            let ok = matches!(
                tokio::time::timeout(timeout, store.give_back(g)).await,
                Ok(Ok(_))
            );
            if !ok {
                let n = self.give_back_failures.fetch_add(1, Ordering::Relaxed) + 1;
                if n % 1_000 == 1 {
                    tracing::warn!(
                        failures = n,
                        "a lease's give-back failed; its units stay taken until the window or bucket refills"
                    );
                }
            }
        }
    }

    /// Sends sync calls, many at a time (the store pipelines them on its connections), and
    /// hands each answer back to its shard: a failed one keeps its units pending.
    /// An answer counts from `now`, when the calls were taken (the engine's clock, not read
    /// here): a gate's budget then ages from before the store answered, never after.
    async fn sync(
        &self,
        engine: &crate::engine::Engine,
        syncs: Vec<(usize, SyncCall)>,
        now: Micros,
    ) {
        const AT_ONCE: usize = 256;
        for chunk in syncs.chunks(AT_ONCE) {
            let answers = futures_util::future::join_all(
                chunk
                    .iter()
                    .map(|(_, c)| async move { engine.call_store(&c.call).await.ok() }),
            )
            .await;
            for ((s, c), r) in chunk.iter().zip(answers) {
                if r.is_none() {
                    let n = self.sync_failures.fetch_add(1, Ordering::Relaxed) + 1;
                    if n % 1_000 == 1 {
                        tracing::warn!(
                            failures = n,
                            "a sync call failed; its units stay pending for the next one"
                        );
                    }
                }
                self.lock(*s).synced(c, r, now);
            }
        }
    }

    fn totals(&self) -> (Stats, usize, usize, usize) {
        let mut t = Stats::default();
        let (mut deny, mut leases, mut gates) = (0, 0, 0);
        for s in 0..SHARDS {
            let l = self.lock(s);
            t += &l.stats();
            deny += l.deny_entries();
            leases += l.lease_entries();
            gates += l.gate_entries();
        }
        (t, deny, leases, gates)
    }
}

impl crate::metrics::Exporter for HotKeys {
    fn render(&self, out: &mut String) {
        let (t, deny, leases, gates) = self.totals();
        let series: [(&str, &str, &str, u64); 23] = [
            (
                "sluice_deny_cache_hits_total",
                "counter",
                "Requests refused from the deny cache, without a store call.",
                t.deny_hits,
            ),
            (
                "sluice_deny_cache_inserts_total",
                "counter",
                "Store refusals remembered by the deny cache.",
                t.deny_inserts,
            ),
            (
                "sluice_deny_cache_full_total",
                "counter",
                "Store refusals not remembered because the deny cache was full.",
                t.deny_full,
            ),
            (
                "sluice_deny_cache_entries",
                "gauge",
                "Refusals held by the deny cache.",
                deny as u64,
            ),
            (
                "sluice_lease_spent_total",
                "counter",
                "Requests admitted from leased units, without a store call.",
                t.lease_spent,
            ),
            (
                "sluice_lease_blocked_total",
                "counter",
                "Requests refused while a refused lease call waits for its retry time.",
                t.lease_blocked,
            ),
            (
                "sluice_lease_calls_total",
                "counter",
                "Lease calls the store answered (granted or refused).",
                t.lease_calls,
            ),
            (
                "sluice_leased_units_total",
                "counter",
                "Units taken from the store by lease calls.",
                t.leased_units,
            ),
            (
                "sluice_lease_returned_units_total",
                "counter",
                "Leased units given back to the store unspent.",
                t.returned_units,
            ),
            (
                "sluice_lease_expired_units_total",
                "counter",
                "Leased units that expired unspent with their window.",
                t.expired_units,
            ),
            ("sluice_leases", "gauge", "Leases held.", leases as u64),
            (
                "sluice_samples_total",
                "counter",
                "Sampled checks sent to the store (hot_keys.sample).",
                t.samples,
            ),
            (
                "sluice_sample_skipped_total",
                "counter",
                "Requests answered like their key's last sample, without the store.",
                t.sample_skipped,
            ),
            (
                "sluice_sample_blocked_total",
                "counter",
                "Requests refused by a refused sample's block.",
                t.sample_blocked,
            ),
            (
                "sluice_lease_give_back_failures_total",
                "counter",
                "Give-backs the store did not take (error or deadline).",
                self.give_back_failures.load(Ordering::Relaxed),
            ),
            (
                "sluice_gate_admitted_total",
                "counter",
                "Requests admitted by a sync gate or a local share, counted for the next sync.",
                t.gate_admitted,
            ),
            (
                "sluice_gate_refused_total",
                "counter",
                "Requests refused by a sync gate whose budget is spent until the next sync.",
                t.gate_refused,
            ),
            (
                "sluice_gate_to_store_total",
                "counter",
                "Requests of gated keys sent to the store (first request, past the share, stale).",
                t.gate_to_store,
            ),
            (
                "sluice_sync_calls_total",
                "counter",
                "Sync calls the store answered.",
                t.sync_calls,
            ),
            (
                "sluice_synced_units_total",
                "counter",
                "Units added to shared counts by sync calls.",
                t.synced_units,
            ),
            (
                "sluice_sync_carried_units_total",
                "counter",
                "Units of answered syncs a bucket could not take, sent again with the next sync.",
                t.sync_carried,
            ),
            (
                "sluice_sync_failures_total",
                "counter",
                "Sync calls that failed; their units stay pending for the next one.",
                t.sync_failures,
            ),
            ("sluice_gates", "gauge", "Gated keys held.", gates as u64),
        ];
        for (name, kind, help, v) in series {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    }
}
