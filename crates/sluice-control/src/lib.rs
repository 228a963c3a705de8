//! Where a daemon's rules come from and how a new set goes live.
//!
//! A rule set is published with one atomic pointer swap ([`Published`]): a request sees the old
//! set or the new one, never half of each. Sources (the YAML file, PostgreSQL) validate a
//! change as a whole before publishing it; an invalid change is refused with its problems
//! logged and the last good set keeps serving.
//!
//! # Layout
//!
//! - [`Published`]: the live rule set and its change notifications.
//! - [`file`]: the embedded default: a YAML file, reloaded when it changes.
//! - [`model`]: rules, overrides and domain settings as stored entries; diffs; the tightening
//!   check.
//! - [`domains`]: domain settings (`require_default`) and the validation every source uses.
//! - [`edit`]: the admin API's changes as pure functions on that state.
//! - [`db`]: PostgreSQL connections, errors, and the schema with its migrations.
//! - [`pgtls`]: TLS to PostgreSQL (`sslmode`, `sslrootcert`) over rustls.
//! - [`store`]: the admin side of PostgreSQL: reads, history, status, versioned commits.
//! - [`pending`]: changes held until a second principal approves them.
//! - [`postgres`]: the daemon side: [`postgres::PgSource`] (load, push, pull, cache, status).
//! - [`snapshot`]: the atomic on-disk copy of the last loaded set.
//! - [`admin`]: the admin HTTP API ([`admin::router`], [`admin::serve_admin`]): routing and
//!   auth, request parsing, and one file of handlers per resource (rules, versions, overrides).

pub mod admin;
pub mod db;
pub mod domains;
pub mod edit;
pub mod file;
pub mod model;
pub mod pending;
pub mod pgtls;
pub mod postgres;
pub mod snapshot;
pub mod store;

use arc_swap::ArcSwap;
use sluice_core::rules::RuleSet;
use std::sync::Arc;
use tokio::sync::watch;

/// The live rule set: read on every request without a lock, replaced whole.
#[derive(Debug)]
pub struct Published {
    current: ArcSwap<RuleSet>,
    changed: watch::Sender<u64>,
    refused: std::sync::atomic::AtomicU64,
}

impl Published {
    /// Publishes an initial set.
    pub fn new(initial: RuleSet) -> Arc<Published> {
        let (changed, _) = watch::channel(initial.version);
        Arc::new(Published {
            current: ArcSwap::from_pointee(initial),
            changed,
            refused: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The current set (a cheap, lock-free load).
    pub fn load(&self) -> Arc<RuleSet> {
        self.current.load_full()
    }

    /// Swaps in a new set atomically and wakes watchers.
    pub fn publish(&self, set: RuleSet) {
        let v = set.version;
        self.current.store(Arc::new(set));
        self.changed.send_replace(v);
    }

    /// The version currently served.
    pub fn version(&self) -> u64 {
        self.current.load().version
    }

    /// Counts a rule set refused by validation (the last good one keeps serving): an
    /// operator's signal that a change did not take, and a test's event to wait on.
    pub fn refuse(&self) {
        self.refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Rule sets refused so far.
    pub fn refusals(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notified with the version on every publish.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}
