//! sluice-sim: a deterministic discrete-event simulator of Sluice across regions.
//!
//! An SRE runs it before changing a ship interval, a share threshold or a region layout, to
//! see what overshoot, false rejections and gossip volume the change costs. Its numbers are
//! only worth something because it runs the *same* code as the daemon: matching, planning and
//! deciding (`sluice_core::decision`), the algorithms and the atomic multi-rule store call
//! (`sluice_store::MemoryStore::check_sync`, one store per region shared by its daemons, as
//! they share a Redis), the merge of remote counts (`sluice_core::merge`), the busy-key
//! selection of the shipper (`sluice_core::ship`) and the hot-key layer in front of the store
//! (`sluice_core::hotkeys::Layer`, one per daemon: deny cache, leases, give-backs) and the
//! store guard around each store call (`sluice_core::guard`: the breaker, the local
//! fallback). Only time, the network and the stores' latency and failures are modelled.
//!
//! # Layout
//!
//! - [`scenario`]: the TOML scenario format (`file`), its validation (`fields`, `check`,
//!   `check_traffic`) into the checked form (`model`), and `--set`/`--param` overrides
//!   (`params`).
//! - [`engine`]: the run's state and setup (`mod.rs`), the event loop (`events`, virtual
//!   microseconds), a request's path (`request`), store calls (`store`), regions and
//!   daemons (`region`), gossip (`gossip`), convergence after heals (`heal`); an observer
//!   thread (`observer`) keeps the ground truth and the shippers' tables, fed in decision
//!   order.
//! - [`traffic`]: arrival processes, key popularity, moving clients.
//! - [`metrics`]: ground truth (an exact global limiter per counter) and counters.
//! - [`report`]: the measures, as a table, JSON and CSV; [`per_store`]: the figures per
//!   store of a scenario with named stores.
//! - [`svg`]: the plots.
//! - [`rng`], [`fx`]: a pinned PRNG and a fixed-seed hasher, for byte-identical reruns.

pub mod engine;
pub mod fx;
pub mod metrics;
pub mod per_store;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod svg;
pub mod traffic;

pub use engine::{Progress, run};
pub use report::Report;
pub use scenario::{Scenario, ScenarioError, load, parse};

/// Splits a sweep spec `name=v1,v2,...` into the name and its values.
pub fn sweep_spec(spec: &str) -> Result<(String, Vec<String>), ScenarioError> {
    let (name, values) = spec
        .split_once('=')
        .ok_or_else(|| ScenarioError::Param(format!("{spec:?}: expected NAME=V1,V2,... ")))?;
    let name = name.trim();
    let values: Vec<String> = values
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if name.is_empty() || values.is_empty() {
        return Err(ScenarioError::Param(format!(
            "{spec:?}: expected NAME=V1,V2,... with at least one value"
        )));
    }
    Ok((name.to_string(), values))
}

/// Splits `name=value`.
pub fn set_spec(spec: &str) -> Result<(String, String), ScenarioError> {
    match spec.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(ScenarioError::Param(format!(
            "{spec:?}: expected NAME=VALUE"
        ))),
    }
}
