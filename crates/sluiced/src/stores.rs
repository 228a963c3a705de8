//! Named stores (`stores:` in the config): another Redis or Redis Cluster beside the main
//! one, which a rule or an override names (`store:`), so a large tenant's load and its
//! store's outages stay on its own shards.
//!
//! Each named store is a [`Backend`] with what the main store has in the engine: its own
//! deadline, breakers per shard, local fallback buckets, failure-mode counters, latency
//! histogram and quota journal. Which store an item goes to is the core's choice
//! ([`sluice_core::stores::chosen`], grouped per call by [`sluice_core::decision::plan`]).

use crate::metrics::Histogram;
use sluice_core::breaker::{BreakerConfig, BreakerState};
use sluice_core::guard::{FailureTally, StoreGuard};
use sluice_store::{MemoryStore, Store};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Rules answered by their failure mode because their store call failed, by mode: what an
/// operator reads to see whose requests an outage of one store touched.
#[derive(Debug, Default)]
pub struct FailureAnswers {
    open: AtomicU64,
    closed: AtomicU64,
    local: AtomicU64,
}

impl FailureAnswers {
    /// Counts the rules of one failed call by how they were answered.
    pub fn add(&self, t: FailureTally) {
        self.open.fetch_add(t.open, Ordering::Relaxed);
        self.closed.fetch_add(t.closed, Ordering::Relaxed);
        self.local.fetch_add(t.local, Ordering::Relaxed);
    }

    /// `(mode, count)` for rendering.
    pub fn all(&self) -> [(&'static str, u64); 3] {
        [
            ("open", self.open.load(Ordering::Relaxed)),
            ("closed", self.closed.load(Ordering::Relaxed)),
            ("local", self.local.load(Ordering::Relaxed)),
        ]
    }
}

/// One named store and everything kept per store.
pub struct Backend {
    /// Its name in the config, in rules and in the `store` label.
    pub name: Arc<str>,
    /// The counts.
    pub store: Arc<dyn Store>,
    /// The same store when it is in memory, for the idle sweep.
    pub memory: Option<Arc<MemoryStore>>,
    /// Deadline of one call.
    pub timeout: Duration,
    /// One guard per shard; none for a store without outages.
    pub(crate) guards: Vec<Mutex<StoreGuard>>,
    /// Local fallback buckets of its rules (`on_store_failure: local`).
    pub local: MemoryStore,
    /// Call latency, also rendered by [`crate::metrics::Metrics`].
    pub latency: Arc<Histogram>,
    /// Failure-mode answers.
    pub failures: FailureAnswers,
    /// Its quota journal (a file of its own beside the main one's).
    pub journal: Option<Arc<crate::journal::Journal>>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("kind", &self.store.kind())
            .finish_non_exhaustive()
    }
}

impl Backend {
    /// A named store with its own breakers.
    pub fn new(
        name: &str,
        store: Arc<dyn Store>,
        memory: Option<Arc<MemoryStore>>,
        timeout: Duration,
        breaker: BreakerConfig,
    ) -> Backend {
        Backend {
            name: Arc::from(name),
            guards: guards(store.as_ref(), breaker),
            store,
            memory,
            timeout,
            local: MemoryStore::new(100_000),
            latency: Arc::new(Histogram::default()),
            failures: FailureAnswers::default(),
            journal: None,
        }
    }
}

/// One guard per breaker shard of `store` ([`crate::engine::BREAKERS`]); none for a store
/// without outages, which has nothing to guard.
pub(crate) fn guards(store: &dyn Store, breaker: BreakerConfig) -> Vec<Mutex<StoreGuard>> {
    let shards = if store.outages() {
        crate::engine::BREAKERS
    } else {
        0
    };
    let guard = StoreGuard::for_store(breaker, true);
    (0..shards).map(|_| Mutex::new(guard.clone())).collect()
}

/// Shard `shard`'s guard, locked; `None` for a store without outages.
pub(crate) fn lock(
    guards: &[Mutex<StoreGuard>],
    shard: usize,
) -> Option<MutexGuard<'_, StoreGuard>> {
    guards
        .get(shard % crate::engine::BREAKERS)
        .map(|g| g.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Breaker state per shard (shard 0 and shards whose breaker ever opened).
pub(crate) fn states(guards: &[Mutex<StoreGuard>]) -> Vec<(usize, BreakerState, u64)> {
    guards
        .iter()
        .enumerate()
        .filter_map(|(i, g)| {
            let (state, opened) = g.lock().unwrap_or_else(|p| p.into_inner()).breaker()?;
            (i == 0 || opened > 0).then_some((i, state, opened))
        })
        .collect()
}

/// The per-store series of `/metrics`: breaker state and openings per store and shard, and
/// the rules answered by their failure mode per store and mode.
pub fn render(engine: &crate::engine::Engine, out: &mut String) {
    use sluice_metrics::{Kind, header, sample};
    let breakers = engine.store_breakers();
    let name = "sluice_breaker_state";
    header(
        out,
        name,
        "Store circuit breaker per store and shard: 0 closed, 1 half-open, 2 open.",
        Kind::Gauge,
    );
    for (store, shard, state, _) in &breakers {
        let shard = shard.to_string();
        sample(
            out,
            name,
            &[("store", store), ("shard", &shard)],
            state.gauge(),
        );
    }
    let name = "sluice_breaker_opened_total";
    header(
        out,
        name,
        "Times a store shard's breaker opened.",
        Kind::Counter,
    );
    for (store, shard, _, opened) in &breakers {
        let shard = shard.to_string();
        sample(out, name, &[("store", store), ("shard", &shard)], opened);
    }
    let name = "sluice_store_failure_answers_total";
    header(
        out,
        name,
        "Rules answered by their on_store_failure mode because their store call failed, by store and mode.",
        Kind::Counter,
    );
    for (store, failures) in engine.store_failures() {
        for (mode, n) in failures.all() {
            sample(out, name, &[("store", store), ("mode", mode)], n);
        }
    }
}
