//! The checks of the stores: `[store]`'s breaker, each `[stores.NAME]` (its name, and its
//! settings, the main store's where it leaves them out, as the daemon's `stores:` entries),
//! and the rules' `store:` names against the stores the scenario declares.

use super::fields::dist;
use super::{File, NamedStore, ScenarioError, StoreCfg, invalid};
use sluice_core::breaker::BreakerConfig;
use sluice_core::rules::RuleSet;
use sluice_core::time::MILLI;

/// Most named stores a scenario may declare (each is a store per region, a guard and local
/// buckets per daemon).
pub const MAX_NAMED_STORES: usize = 16;

/// A breaker's four settings as a file writes them (ms), each `None` when left out.
pub(super) struct BreakerFields {
    pub(super) failure_pct: Option<u64>,
    pub(super) window_ms: Option<u64>,
    pub(super) min_calls: Option<u64>,
    pub(super) cool_off_ms: Option<u64>,
}

/// The breaker `b` gives over `defaults`, checked; `at` is the table (`store`,
/// `stores.bigcorp`) the errors name.
pub(super) fn breaker(
    at: &str,
    b: &BreakerFields,
    defaults: &BreakerConfig,
) -> Result<BreakerConfig, ScenarioError> {
    let breaker = BreakerConfig {
        failure_pct: b.failure_pct.unwrap_or(defaults.failure_pct),
        window: b
            .window_ms
            .map_or(defaults.window, |v| v.saturating_mul(MILLI)),
        min_calls: b.min_calls.unwrap_or(defaults.min_calls),
        cool_off: b
            .cool_off_ms
            .map_or(defaults.cool_off, |v| v.saturating_mul(MILLI)),
        probes: defaults.probes,
    };
    if !(1..=100).contains(&breaker.failure_pct) {
        return Err(invalid(
            format!("{at}.breaker_failure_pct"),
            format!("must be from 1 to 100, got {}", breaker.failure_pct),
        ));
    }
    for (field, v) in [
        ("breaker_window_ms", breaker.window),
        ("breaker_cool_off_ms", breaker.cool_off),
    ] {
        if v == 0 {
            return Err(invalid(
                format!("{at}.{field}"),
                "must be greater than zero",
            ));
        }
    }
    Ok(breaker)
}

/// `[stores.NAME]`, checked, in name order: each a valid store name other than `default`,
/// its settings over the main store's.
pub(super) fn named_stores(f: &File, main: &StoreCfg) -> Result<Vec<NamedStore>, ScenarioError> {
    if f.stores.len() > MAX_NAMED_STORES {
        return Err(invalid(
            "stores",
            format!(
                "at most {MAX_NAMED_STORES} named stores, got {}",
                f.stores.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(f.stores.len());
    for (name, s) in &f.stores {
        let at = format!("stores.{name}");
        if name == sluice_core::stores::DEFAULT {
            return Err(invalid(
                at,
                "default is the main store's name (configure it as [store])",
            ));
        }
        if !sluice_core::stores::valid_name(name) {
            return Err(invalid(
                at,
                "a store name is 1 to 64 characters of a-z 0-9 _ -",
            ));
        }
        let latency = match &s.latency_ms {
            Some(d) => dist(&format!("{at}.latency_ms"), d)?,
            None => main.latency,
        };
        let max_keys = match s.max_keys {
            Some(0) => {
                return Err(invalid(
                    format!("{at}.max_keys"),
                    "must be greater than zero",
                ));
            }
            Some(k) => k as usize,
            None => main.max_keys,
        };
        let fields = BreakerFields {
            failure_pct: s.breaker_failure_pct,
            window_ms: s.breaker_window_ms,
            min_calls: s.breaker_min_calls,
            cool_off_ms: s.breaker_cool_off_ms,
        };
        out.push(NamedStore {
            name: name.clone(),
            cfg: StoreCfg {
                latency,
                local_permille: main.local_permille,
                max_keys,
                breaker: breaker(&at, &fields, &main.breaker)?,
            },
        });
    }
    Ok(out)
}

/// Refuses a rule set naming a store the scenario does not declare, naming the rule (or
/// override) and the store, as the daemon refuses a set naming a store its config lacks:
/// counted anywhere else, its counts would be in the wrong store. The places come from
/// `sluice_core::stores::uses`, the daemon's own list.
pub(super) fn known_stores(set: &RuleSet, stores: &[NamedStore]) -> Result<(), ScenarioError> {
    let declared = |s: &str| stores.iter().any(|n| n.name == s);
    match sluice_core::stores::uses(set)
        .into_iter()
        .find(|u| !declared(u.store))
    {
        None => Ok(()),
        Some(u) => Err(invalid(
            "rules",
            format!(
                "{} names store {:?}, which the scenario does not declare (add [stores.{}])",
                u.at, u.store, u.store
            ),
        )),
    }
}
