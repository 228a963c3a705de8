//! Figures per store: what the daemon reports per store (`/metrics`' `store` label: breaker
//! openings, failure-mode answers), counted for each of a region's stores, so a scenario with
//! named stores shows whose requests one store's bad day touched. A run without named
//! stores reports none of it (its report is as it was).

use crate::metrics::Metrics;
use crate::report::thousands;
use crate::scenario::Scenario;
use serde::Serialize;
use sluice_core::guard::FailureTally;
use std::fmt::Write as _;

/// The counters of one store (every region's copy of it, every daemon's guard of it), kept
/// by the engine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreCounters {
    /// Calls that reached it (as planned, lease and sync calls), failed ones included.
    pub calls: u64,
    /// Calls answered as failed (it was out, or a daemon's breaker of it refused them).
    pub failures: u64,
    /// Calls the daemons' breakers of it refused (not sent: not in `calls`).
    pub breaker_refused: u64,
    /// Times a daemon's breaker of it opened.
    pub breaker_opened: u64,
    /// Rules answered by `on_store_failure: open` because their call to it failed.
    pub answered_open: u64,
    /// Rules answered by `on_store_failure: closed`.
    pub answered_closed: u64,
    /// Rules answered by `on_store_failure: local` (whatever the local bucket said).
    pub answered_local: u64,
    /// Admissions the daemons journal into its journal (`guard::journaled`).
    pub journaled: u64,
    /// Writes lost in its failovers.
    pub lost_writes: u64,
}

impl StoreCounters {
    /// Counts the rules of one failed call by how they were answered, the daemon's tally
    /// (`guard::failure_tally`).
    pub fn answered(&mut self, t: FailureTally) {
        self.answered_open += t.open;
        self.answered_closed += t.closed;
        self.answered_local += t.local;
    }

    /// Adds `o`'s counts.
    pub fn add(&mut self, o: &StoreCounters) {
        self.calls += o.calls;
        self.failures += o.failures;
        self.breaker_refused += o.breaker_refused;
        self.breaker_opened += o.breaker_opened;
        self.answered_open += o.answered_open;
        self.answered_closed += o.answered_closed;
        self.answered_local += o.answered_local;
        self.journaled += o.journaled;
        self.lost_writes += o.lost_writes;
    }
}

/// Adds the per-store counters of `from` to `into` (slot by slot; `into` takes `from`'s
/// slots when it has none: the observer's metrics keep no store counters).
pub fn add_counts(into: &mut Vec<StoreCounters>, from: &[StoreCounters]) {
    if into.len() < from.len() {
        into.resize(from.len(), StoreCounters::default());
    }
    for (a, b) in into.iter_mut().zip(from) {
        a.add(b);
    }
}

/// One store in the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StoreReport {
    /// Its name (`default`: the main store).
    pub store: String,
    /// Calls that reached it (every region's copy), failed ones included.
    pub calls: u64,
    /// Calls answered as failed.
    pub failures: u64,
    /// Calls the daemons' breakers of it refused.
    pub breaker_refused: u64,
    /// Times a daemon's breaker of it opened.
    pub breaker_opened: u64,
    /// Rules answered by their failure mode because their call to it failed, by mode.
    pub failure_answers: FailureAnswers,
    /// Admissions journaled into its journal (counted, not replayed).
    pub journaled: u64,
    /// Writes lost in its failovers.
    pub lost_writes: u64,
}

/// Failure-mode answers by mode (the daemon's `sluice_store_failure_answers_total`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FailureAnswers {
    /// `on_store_failure: open`.
    pub open: u64,
    /// `on_store_failure: closed`.
    pub closed: u64,
    /// `on_store_failure: local`.
    pub local: u64,
}

/// The report's stores: the main one then each named one, or none when the scenario has
/// no named store (a report without them stays as it was).
pub fn reports(sc: &Scenario, m: &Metrics) -> Vec<StoreReport> {
    if sc.stores.is_empty() {
        return Vec::new();
    }
    (0..sc.store_slots())
        .map(|slot| {
            let c = m.stores.get(slot).cloned().unwrap_or_default();
            StoreReport {
                store: sc.store_name(slot).to_string(),
                calls: c.calls,
                failures: c.failures,
                breaker_refused: c.breaker_refused,
                breaker_opened: c.breaker_opened,
                failure_answers: FailureAnswers {
                    open: c.answered_open,
                    closed: c.answered_closed,
                    local: c.answered_local,
                },
                journaled: c.journaled,
                lost_writes: c.lost_writes,
            }
        })
        .collect()
}

/// The table's lines for the stores, one each (nothing without named stores).
pub fn table(stores: &[StoreReport], out: &mut String) {
    for s in stores {
        let _ = writeln!(
            out,
            "store {}: {} calls · {} failed · {} refused by breakers (opened {} times) · failure answers {} open, {} closed, {} local · {} journaled · {} lost in failovers",
            s.store,
            thousands(s.calls),
            thousands(s.failures),
            thousands(s.breaker_refused),
            thousands(s.breaker_opened),
            thousands(s.failure_answers.open),
            thousands(s.failure_answers.closed),
            thousands(s.failure_answers.local),
            thousands(s.journaled),
            thousands(s.lost_writes),
        );
    }
}
