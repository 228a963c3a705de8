//! What-if: replays decision log records through the current rule set and a candidate one
//! and reports, per rule, who each would refuse and how often, and which checks the
//! candidate newly refuses or newly admits.
//!
//! Sans-IO and in one place: [`replay`] takes the records (as the decision log writes them,
//! docs/decision-log.md), the two sets and the window, and returns a [`Report`]. The admin
//! API's `POST /v1/rules:what-if` (over the daemon's own log) and `sluicectl apply --what-if`
//! (over every daemon's log it is pointed at) both call it. It decides nothing itself: every
//! check goes through the core's own [`plan`] and [`Plan::decide`](sluice_core::decision::Plan::decide),
//! its calls through the memory store (`sluice_store::MemoryStore`, the core's batch step),
//! in virtual time (each check's timestamp is its `now`).
//!
//! Each record stands for `weight` checks of its identity (the kept one and the ones the
//! sampler skipped since the identity's previous kept record of the same kind); the skipped
//! ones are spread evenly between that previous record and this one. Records are replayed
//! per store (`counts_in`: a region on a shared store, one daemon on the memory store),
//! because a rule's count lives in its store.

mod figures;
pub use figures::{Delta, Figures, IdentityCount, RuleReport};

use serde::{Deserialize, Serialize};
use sluice_core::Micros;
use sluice_core::decision::{Answer, Code, plan};
use sluice_core::matching::Descriptors;
use sluice_core::rules::{Mode, RuleSet};
use sluice_store::MemoryStore;
use std::collections::{BTreeMap, HashMap};

/// The decision log format version this replay reads.
pub const FORMAT: u32 = 1;

/// Identities listed per rule and per delta at most (the counts cover all of them).
pub const TOP: usize = 50;

/// Why records cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhatIfError {
    /// A record is not a decision log record this replay reads (permanent: fix the input).
    #[error("decision record {index}: {reason}")]
    BadRecord {
        /// Its position in the input (0-based).
        index: usize,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// A window bound that is not a time (permanent).
    #[error("{field}: {reason}")]
    BadWindow {
        /// `since` or `until`.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// One rule's verdict in a record (only what the replay reads).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LoggedRule {
    /// Rule id.
    pub id: String,
    /// `allowed`, `refused` or `would_refuse`.
    pub outcome: String,
}

/// One decision log record, as much of it as a replay needs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LoggedCheck {
    /// Format version ([`FORMAT`]).
    pub v: u32,
    /// When it was decided, epoch µs: the replay's `now` for it.
    pub ts: Micros,
    /// The rules domain.
    pub domain: String,
    /// The identity it was sampled under.
    pub identity: String,
    /// Its request id (split rules pick their sub-count by it).
    #[serde(default)]
    pub request_id: String,
    /// Units asked for.
    pub cost: u64,
    /// `OK`, `OVER_LIMIT` or `UNAVAILABLE`.
    pub code: String,
    /// The descriptor entries the rules of its time matched or keyed on.
    pub descriptors: BTreeMap<String, String>,
    /// Each applied rule's verdict.
    #[serde(default)]
    pub rules: Vec<LoggedRule>,
    /// Checks it stands for (itself and the ones sampled out before it); 1 when absent.
    #[serde(default = "one")]
    pub weight: u64,
    /// The store its counts live in; absent: one store for every record.
    #[serde(default)]
    pub counts_in: Option<String>,
}

fn one() -> u64 {
    1
}

impl LoggedCheck {
    /// Reads record `index` of an input (a `GET /v1/decisions` answer's `decisions[i]`, or a
    /// line of a log file).
    pub fn from_value(index: usize, v: serde_json::Value) -> Result<LoggedCheck, WhatIfError> {
        let r: LoggedCheck = serde_json::from_value(v).map_err(|e| WhatIfError::BadRecord {
            index,
            reason: e.to_string(),
        })?;
        if r.v != FORMAT {
            return Err(WhatIfError::BadRecord {
                index,
                reason: format!("v: format version {} (this replay reads {FORMAT})", r.v),
            });
        }
        if r.weight == 0 {
            return Err(WhatIfError::BadRecord {
                index,
                reason: "weight: must be at least 1".into(),
            });
        }
        Ok(r)
    }

    /// Whether the sampler kept it as a refusal (its refusal budget, not the allowed one).
    fn refusal(&self) -> bool {
        self.code != "OK" || self.rules.iter().any(|r| r.outcome == "would_refuse")
    }
}

/// The time range replayed: records at or after `since` and before `until`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// Epoch µs, inclusive.
    pub since: Option<Micros>,
    /// Epoch µs, exclusive.
    pub until: Option<Micros>,
}

/// The window replayed when none is given: the last hour.
pub const DEFAULT_SINCE: Micros = 3_600_000_000;

impl Window {
    /// `since` and `until` as an operator writes them at `now`: epoch microseconds, or a
    /// duration back from now (`30m`, `1h`); `since` defaults to an hour back, `until` to
    /// none (up to now). An error names the field.
    pub fn parse(
        since: Option<&str>,
        until: Option<&str>,
        now: Micros,
    ) -> Result<Window, WhatIfError> {
        let at = |field: &'static str, v: &str| -> Result<Micros, WhatIfError> {
            let bad = |reason: String| WhatIfError::BadWindow { field, reason };
            if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                return v.parse().map_err(|_| bad(format!("{v:?} is out of range")));
            }
            let back = sluice_core::time::parse_span(v)
                .ok()
                .and_then(|s| s.fixed())
                .ok_or_else(|| {
                    bad(format!(
                        "expected epoch microseconds or a duration like 30m, got {v:?}"
                    ))
                })?;
            Ok(now.saturating_sub(back))
        };
        let w = Window {
            since: Some(match since {
                Some(v) => at("since", v)?,
                None => now.saturating_sub(DEFAULT_SINCE),
            }),
            until: until.map(|v| at("until", v)).transpose()?,
        };
        if let (Some(s), Some(u)) = (w.since, w.until)
            && s >= u
        {
            return Err(WhatIfError::BadWindow {
                field: "until",
                reason: "must be later than since".into(),
            });
        }
        Ok(w)
    }

    fn holds(&self, ts: Micros) -> bool {
        self.since.is_none_or(|s| ts >= s) && self.until.is_none_or(|u| ts < u)
    }
}

/// The answer: what each set does with the same checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The window asked for.
    pub window: Window,
    /// Records replayed.
    pub records: u64,
    /// Checks they stand for (the sum of their weights).
    pub checks: u64,
    /// The stores replayed apart (`counts_in`), `""` for records that name none.
    pub stores: Vec<String>,
    /// The current set's version.
    pub current_version: u64,
    /// Per rule, current and candidate figures, by (domain, rule id).
    pub rules: Vec<RuleReport>,
    /// Checks the current set admits and the candidate refuses.
    pub newly_refused: Delta,
    /// Checks the current set refuses and the candidate admits.
    pub newly_admitted: Delta,
    /// One line saying what the figures are: an estimate from N records standing for M
    /// checks, or that the window holds no records (and why the window was read only in
    /// part, if it was).
    pub note: String,
    /// Set when not every record of the window could be read, saying why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
}

/// One check to decide: a record, or one of the checks it stands for.
struct Replayed<'r> {
    now: Micros,
    record: &'r LoggedCheck,
    descriptors: &'r Descriptors,
    request_id: String,
}

/// The checks records stand for, each record's weight spread evenly since the previous
/// record of its identity and kind (or since the window's start), in time order.
fn expand<'r>(
    records: &'r [LoggedCheck],
    descriptors: &'r [Descriptors],
    window: Window,
) -> Vec<Replayed<'r>> {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| (records[i].ts, i));
    let mut previous: HashMap<(&str, &str, bool), Micros> = HashMap::new();
    let mut out = Vec::new();
    for i in order {
        let r = &records[i];
        let group = (
            r.counts_in.as_deref().unwrap_or(""),
            r.identity.as_str(),
            r.refusal(),
        );
        let from = previous
            .insert(group, r.ts)
            .or(window.since.filter(|s| *s <= r.ts))
            .unwrap_or(r.ts);
        for k in 1..r.weight {
            let span = u128::from(r.ts - from);
            let at = from + (span * u128::from(k) / u128::from(r.weight)) as Micros;
            out.push(Replayed {
                now: at,
                record: r,
                descriptors: &descriptors[i],
                request_id: format!("{}#{k}", r.request_id),
            });
        }
        out.push(Replayed {
            now: r.ts,
            record: r,
            descriptors: &descriptors[i],
            request_id: r.request_id.clone(),
        });
    }
    out.sort_by_key(|c| c.now);
    out
}

/// A store's states as the memory store keeps them: each with its expiry, epoch µs.
/// The modelled store: the memory store itself, so a replayed check keeps, expires and
/// writes its states exactly as the daemon's memory store does. Seeded, not drawn from the
/// OS, and unbounded: a replay is reproducible and evicts nothing.
fn model_store() -> MemoryStore {
    MemoryStore::with_seed(usize::MAX, 0)
}

/// One set's verdict on one check, by rule.
struct Verdict {
    /// Per applied rule: its id, the identity it counted against, and whether it refused
    /// (enforced) or would have (shadow).
    rules: Vec<(String, String, bool)>,
    /// The check was refused (`OVER_LIMIT` or `UNAVAILABLE`), and by which rule's identity.
    refused_by: Option<String>,
}

/// Decides one check with `set` on `store`: the core's plan, each call through the memory
/// store (the core's batch step under its lock, writes kept with their TTLs) and the core's
/// decision. `None`: no domain or no
/// rule applies.
fn verdict(store: &MemoryStore, set: &RuleSet, c: &Replayed<'_>) -> Option<Verdict> {
    let domain = set.domain(&c.record.domain)?;
    let p = plan(
        domain,
        c.descriptors,
        c.now,
        c.record.cost,
        &c.request_id,
        |_| Default::default(),
    );
    if p.applied.is_empty() {
        return None;
    }
    let answers: Vec<Answer> = p
        .calls
        .iter()
        .map(|pc| match store.check_sync(&pc.call) {
            Ok(result) => Answer::Done(result),
            Err(_) => Answer::Failed { local: None },
        })
        .collect();
    let d = p.decide(set.version, &answers);
    let rules = p
        .applied
        .iter()
        .map(|a| {
            let refused = match a.rule.mode {
                Mode::Shadow => d.shadow_denied.contains(&a.rule.id),
                _ => d.policies.iter().any(|s| s.id == a.rule.id && !s.allowed),
            };
            (a.rule.id.to_string(), a.identity.clone(), refused)
        })
        .collect();
    let refused_by = (d.code != Code::Ok).then(|| {
        d.decided_by
            .as_deref()
            .and_then(|id| p.applied.iter().find(|a| &*a.rule.id == id))
            .map_or_else(|| c.record.identity.clone(), |a| a.identity.clone())
    });
    Some(Verdict { rules, refused_by })
}

/// Replays `records` (the window's, any order, from any number of daemons) through
/// `current` and `candidate` and compares them. A record of a domain neither set has, or
/// that no rule applies to, is counted in `checks` and changes nothing.
pub fn replay(
    records: &[LoggedCheck],
    current: &RuleSet,
    candidate: &RuleSet,
    window: Window,
) -> Result<Report, WhatIfError> {
    let records: Vec<LoggedCheck> = records
        .iter()
        .filter(|r| window.holds(r.ts))
        .cloned()
        .collect();
    let mut descriptors = Vec::with_capacity(records.len());
    for (index, r) in records.iter().enumerate() {
        let pairs = r
            .descriptors
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        descriptors.push(Descriptors::new(pairs).map_err(|e| WhatIfError::BadRecord {
            index,
            reason: format!("descriptors: {e}"),
        })?);
    }
    let checks = expand(&records, &descriptors, window);
    let mut stores: BTreeMap<String, [MemoryStore; 2]> = BTreeMap::new();
    let mut tally = figures::Tally::new(current, candidate);
    for c in &checks {
        let [now_store, next_store] = stores
            .entry(c.record.counts_in.clone().unwrap_or_default())
            .or_insert_with(|| [model_store(), model_store()]);
        let before = verdict(now_store, current, c);
        let after = verdict(next_store, candidate, c);
        tally.add(&c.record.domain, before.as_ref(), after.as_ref());
    }
    let records_n = records.len() as u64;
    let checks_n = checks.len() as u64;
    let note = if records.is_empty() {
        "no decision log records in the window: nothing to replay".to_string()
    } else if checks_n == records_n {
        format!("replayed {records_n} records, one check each (none sampled out)")
    } else {
        format!(
            "estimated from {records_n} records standing for {checks_n} checks (the sampler's \
             weights; sampled-out checks spread evenly between their identity's records)"
        )
    };
    let (rules, newly_refused, newly_admitted) = tally.finish();
    Ok(Report {
        window,
        records: records_n,
        checks: checks_n,
        stores: stores.into_keys().collect(),
        current_version: current.version,
        rules,
        newly_refused,
        newly_admitted,
        note,
        partial: None,
    })
}

#[cfg(test)]
mod tests;
