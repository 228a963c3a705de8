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
//! - [`whatif`]: replays decision log records through the current and a candidate set.

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
pub mod whatif;

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
    daemon: std::sync::OnceLock<Arc<str>>,
    admission: std::sync::OnceLock<Admission>,
}

/// What a daemon asks of a set beyond validation, which only it can answer (that the
/// stores the set names are in its config): `Err` names every problem.
pub type Admit = Box<dyn Fn(&RuleSet) -> Result<(), String> + Send + Sync>;

struct Admission(Admit);

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admission")
    }
}

impl Published {
    /// Publishes an initial set.
    pub fn new(initial: RuleSet) -> Arc<Published> {
        let (changed, _) = watch::channel(initial.version);
        Arc::new(Published {
            current: ArcSwap::from_pointee(initial),
            changed,
            refused: std::sync::atomic::AtomicU64::new(0),
            daemon: std::sync::OnceLock::new(),
            admission: std::sync::OnceLock::new(),
        })
    }

    /// Serves every set from now on as the daemon `daemon_id` runs it
    /// ([`RuleSet::for_daemon`]: rules whose `enforce_on` leaves it out shadow here), the
    /// current one included. Called once, before the source's task publishes: the daemon
    /// knows its id, the sources and the core do not read it. A second call is ignored (a
    /// daemon's id does not change while it runs).
    pub fn serve_as(&self, daemon_id: &str) {
        if self.daemon.set(Arc::from(daemon_id)).is_err() {
            return;
        }
        let cur = self.load();
        self.publish(RuleSet {
            version: cur.version,
            domains: cur.domains.clone(),
        });
    }

    /// Sources refuse every set from now on that `admit` refuses, as they refuse an invalid
    /// one (the last good set keeps serving). Called once, before the source's task
    /// publishes; a second call is ignored.
    pub fn admit_only(&self, admit: Admit) {
        let _ = self.admission.set(Admission(admit));
    }

    /// Whether the daemon takes `set` ([`Published::admit_only`]); every set without a check.
    pub fn admits(&self, set: &RuleSet) -> Result<(), String> {
        self.admission.get().map_or(Ok(()), |a| (a.0)(set))
    }

    /// The daemon id sets are served as ([`Published::serve_as`]), if any.
    pub fn daemon(&self) -> Option<&str> {
        self.daemon.get().map(|d| &**d)
    }

    /// The current set (a cheap, lock-free load).
    pub fn load(&self) -> Arc<RuleSet> {
        self.current.load_full()
    }

    /// Swaps in a new set atomically and wakes watchers; as this daemon runs it, once
    /// [`Published::serve_as`] named it.
    pub fn publish(&self, set: RuleSet) {
        let set = match self.daemon.get() {
            Some(d) => set.for_daemon(d),
            None => set,
        };
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

/// What each rule does on the daemon serving `set` (a set [`Published`] served as that
/// daemon): `[{domain, rule, mode, canary_shadowed}]`, `mode` the one it runs in here and
/// `canary_shadowed` when its `enforce_on` is what left it in shadow. The daemon's status
/// (`GET /v1/rules:status`, the report to PostgreSQL) carries it, so an operator raising a
/// canary sees which daemons enforce.
pub fn placements_json(set: &RuleSet) -> serde_json::Value {
    serde_json::Value::Array(
        set.placements()
            .into_iter()
            .map(|p| {
                serde_json::json!({
                    "domain": p.domain,
                    "rule": &*p.rule,
                    "mode": p.mode.name(),
                    "canary_shadowed": p.canary_shadowed,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::rules::{Mode, parse_yaml};

    const RULES: &str = "domain: d\nrules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 1, window: 1m, enforce_on: { daemons: [eu-1] } }\n";

    fn mode(p: &Published) -> Mode {
        p.load().domains["d"].rules[0].mode
    }

    #[test]
    fn a_set_is_served_as_the_daemon_runs_it_from_serve_as_on() {
        let p = Published::new(parse_yaml(RULES).expect("valid"));
        assert_eq!(
            mode(&p),
            Mode::Enforce,
            "before the daemon names itself: as written"
        );
        p.serve_as("eu-2");
        assert_eq!(p.daemon(), Some("eu-2"));
        assert_eq!(
            mode(&p),
            Mode::Shadow,
            "the current set is served as eu-2 runs it"
        );
        let mut next = parse_yaml(RULES).expect("valid");
        next.version = 7;
        p.publish(next);
        assert_eq!(
            (p.version(), mode(&p)),
            (7, Mode::Shadow),
            "and every set after"
        );
        p.serve_as("eu-1");
        assert_eq!(
            p.daemon(),
            Some("eu-2"),
            "a daemon's id does not change while it runs"
        );
        let placed = placements_json(&p.load());
        assert_eq!(placed[0]["mode"], "shadow");
        assert_eq!(placed[0]["canary_shadowed"], true);
    }
}
