//! The rule format (docs/rules.md) parsed into validated, immutable rule sets.
//!
//! Rules arrive as YAML from a file or as JSON from the admin API; both go through the same
//! [`serde_json::Value`] tree, so the checks and the messages are the same. Validation
//! collects every problem, each naming the rule id and the field, and refuses the set as a
//! whole: the daemon keeps serving its last good set.
//!
//! This file holds the types and the entry points; `fields` reads one mapping's fields,
//! `rule` validates a rule, `overrides` an override, `algorithms` is the table of the
//! numbers each algorithm takes, `matchers` the `match` conditions and `key` fields beyond
//! plain names and values, and `cost` a rule's cost factors.

mod algorithms;
mod cost;
mod fair_share;
mod fields;
mod matchers;
mod overrides;
mod rule;

pub use algorithms::{ALGORITHM_FIELDS, ALGORITHMS, AlgorithmFields};
pub use cost::{Cost, scaled};
pub(crate) use fields::Fields;
pub use matchers::{IpMask, KeyField, Match};
use overrides::override_;
use rule::rule;

use crate::algo::{Params, Rate};
use crate::matching::Index;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

/// Whether a rule refuses, only records, or is switched off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Refuses requests over the limit.
    Enforce,
    /// Counts and records would-be refusals; never refuses.
    Shadow,
    /// Not evaluated at all.
    Off,
}

impl Mode {
    /// The name in the rule format (`enforce`, `shadow`, `off`): how status and metrics
    /// show the mode a rule runs in.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Off => "off",
        }
    }
}

/// What a rule does when its store cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureMode {
    /// Allow (and count the decision).
    Open,
    /// Refuse with `UNAVAILABLE` (HTTP 503, `Retry-After: 1`).
    Closed,
    /// Decide on an in-memory bucket per daemon.
    Local,
}

/// Whether counts stay in one region or are shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Counted in this region only.
    Region,
    /// Shared with other regions by the delta shipper.
    Global,
}

/// How much a rule reveals to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeaderMode {
    /// `RateLimit-Policy`, `RateLimit`, `X-RateLimit-*` and `Retry-After`.
    Full,
    /// Only `Retry-After` (login, OTP: don't tell an attacker the budget).
    RetryOnly,
}

/// One validated rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Unique id: `[A-Za-z0-9_.:-]{1,64}`; names the policy in headers.
    pub id: Arc<str>,
    /// Within a group only the most specific matching rule applies.
    pub group: Option<String>,
    /// Every `(descriptor, condition)` must hold ([`Match::holds`]).
    pub matchers: Vec<(String, Match)>,
    /// Descriptor fields forming the identity counted against.
    pub key: Vec<KeyField>,
    /// Units a request takes: the caller's cost times this factor (`None`: times 1).
    pub cost: Option<Cost>,
    /// Algorithm and numbers.
    pub params: Params,
    /// Enforce, shadow or off.
    pub mode: Mode,
    /// Behaviour when the store fails.
    pub on_store_failure: FailureMode,
    /// Region or global.
    pub scope: Scope,
    /// Applies to identities whose stable hash falls in the first N percent.
    pub rollout_pct: u8,
    /// The daemons that enforce it (`enforce_on`; `None`: every daemon): the others run it as
    /// shadow, so a changed rule's mistakes refuse traffic on a share of the fleet only
    /// ([`crate::canary`]).
    pub enforce_on: Option<crate::canary::EnforceOn>,
    /// Set by [`RuleSet::for_daemon`] on a rule written to enforce that this daemon's
    /// `enforce_on` turned to shadow (`mode` is then `Shadow`): what the daemon's status and
    /// metrics report as "shadowed here".
    pub canary_shadowed: bool,
    /// What the client is told.
    pub headers: HeaderMode,
    /// A short human sentence naming the limit ("Login attempts per account"), for the
    /// problem body of a refusal ([`crate::decision::problem_json`]).
    pub title: Option<Arc<str>>,
    /// Refused requests cost quota too.
    pub charge_rejected: bool,
    /// Share a global key once its local count passes this fraction of the limit (percent).
    pub share_threshold_pct: u8,
    /// The hot-key layer's settings (`hot_keys`).
    pub hot_keys: crate::hotkeys::HotKeys,
    /// The named store its counts live in (`store:`; `None`: the main one), so a large
    /// tenant's counts stay off the shared shards ([`crate::stores`]).
    pub store: Option<Arc<str>>,
    /// The rule as written, for listing, diffs and history.
    pub source: Value,
}

impl Rule {
    /// Non-wildcard matchers (values, prefixes, absences): the rule's specificity within a
    /// group.
    pub fn specificity(&self) -> usize {
        self.matchers
            .iter()
            .filter(|(_, m)| *m != Match::Any)
            .count()
    }

    /// The rule's cost factor for a request ([`Cost::factor`]; 1 without a `cost`).
    pub fn cost_factor(&self, d: &crate::matching::Descriptors) -> u64 {
        match &self.cost {
            None => 1,
            Some(c) => c.pick(c.by.as_deref().and_then(|b| d.get(b))),
        }
    }
}

/// Per-identity numbers for one rule, or an exemption.
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    /// Descriptor values that must all equal.
    pub identity: BTreeMap<String, String>,
    /// The rule it changes; `None` = every rule (only with `exempt`).
    pub rule: Option<Arc<str>>,
    /// Skip the rule(s) entirely.
    pub exempt: bool,
    /// Replacement `limit`.
    pub limit: Option<u64>,
    /// Replacement rate (`rate`, or `rate_per_s` as a rate per second).
    pub rate: Option<Rate>,
    /// Replacement `burst`.
    pub burst: Option<u64>,
    /// Moves this identity's counts of the rule to that store (`store:`; `None`: the rule's).
    pub store: Option<Arc<str>>,
    /// As written.
    pub source: Value,
}

impl Override {
    /// The rule's params with this override's numbers.
    pub fn apply(&self, params: &Params) -> Params {
        let mut p = params.clone();
        match &mut p {
            Params::TokenBucket { rate, burst } | Params::Gcra { rate, burst } => {
                *rate = self.rate.unwrap_or(*rate);
                *burst = self.burst.unwrap_or(*burst);
            }
            Params::FixedWindow { limit, .. }
            | Params::SlidingWindow { limit, .. }
            | Params::SlidingLog { limit, .. }
            | Params::Concurrency { limit, .. } => *limit = self.limit.unwrap_or(*limit),
            Params::LeakyQueue { rate, .. } => *rate = self.rate.unwrap_or(*rate),
            // Validation refuses numbers for it: the parent is every tenant's, not one's.
            Params::FairShare(_) => {}
        }
        p
    }
}

/// One domain's rules, validated and indexed for matching.
#[derive(Debug)]
pub struct Domain {
    /// The domain name requests carry.
    pub name: String,
    /// Rules in file order (order breaks ties within a group).
    pub rules: Vec<Rule>,
    /// Overrides in file order.
    pub overrides: Vec<Override>,
    pub(crate) index: Index,
    /// Rule numbers by id, for a domain of more than [`SCAN_RULES`] rules: every gossiped
    /// figure a daemon receives looks its rule up by id, and a scan of a thousand rules per
    /// figure was a thousand string comparisons.
    by_id: Option<std::collections::HashMap<Arc<str>, u32, foldhash::fast::FixedState>>,
}

/// Rules a lookup by id scans rather than hashes.
const SCAN_RULES: usize = 8;

impl PartialEq for Domain {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.rules == other.rules && self.overrides == other.overrides
    }
}

impl Domain {
    /// Builds and indexes a domain from validated parts.
    pub fn new(name: String, rules: Vec<Rule>, overrides: Vec<Override>) -> Domain {
        let index = Index::build(&name, &rules, &overrides);
        // Ids are unique in a domain (validation refuses a repeat); the first wins anyway.
        let by_id = (rules.len() > SCAN_RULES).then(|| {
            let mut m = std::collections::HashMap::with_capacity_and_hasher(
                rules.len(),
                foldhash::fast::FixedState::default(),
            );
            for (i, r) in rules.iter().enumerate() {
                m.entry(r.id.clone()).or_insert(i as u32);
            }
            m
        });
        Domain {
            name,
            rules,
            overrides,
            index,
            by_id,
        }
    }

    /// The rule with this id.
    pub fn rule(&self, id: &str) -> Option<&Rule> {
        match &self.by_id {
            Some(m) => m
                .get(id)
                .and_then(|&i| self.rules.get(i as usize))
                .filter(|r| &*r.id == id),
            None => self.rules.iter().find(|r| &*r.id == id),
        }
    }

    /// The domain back in the rule format, as a JSON tree.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("domain".into(), Value::String(self.name.clone()));
        m.insert(
            "rules".into(),
            Value::Array(self.rules.iter().map(|r| r.source.clone()).collect()),
        );
        if !self.overrides.is_empty() {
            m.insert(
                "overrides".into(),
                Value::Array(self.overrides.iter().map(|o| o.source.clone()).collect()),
            );
        }
        Value::Object(m)
    }
}

/// Every domain a daemon serves, with the version they were published as.
#[derive(Debug, Default, PartialEq)]
pub struct RuleSet {
    /// Bumped by every change (0 for a file that carries none).
    pub version: u64,
    /// By domain name.
    pub domains: BTreeMap<String, Arc<Domain>>,
}

impl RuleSet {
    /// The domain of that name.
    pub fn domain(&self, name: &str) -> Option<&Arc<Domain>> {
        self.domains.get(name)
    }

    /// Number of rules over all domains.
    pub fn rule_count(&self) -> usize {
        self.domains.values().map(|d| d.rules.len()).sum()
    }
}

/// One problem in a rule set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Rule id (or `domain`, `overrides[3]`, `document 2`).
    pub at: String,
    /// Field name.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.at, self.field, self.message)
    }
}

/// A refused rule set: every problem found, not just the first.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct RulesError {
    /// All problems, in document order.
    pub problems: Vec<Problem>,
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid rules ({} problem{})",
            self.problems.len(),
            if self.problems.len() == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "; {p}")?;
        }
        Ok(())
    }
}

impl RulesError {
    fn one(at: &str, field: &str, message: impl Into<String>) -> RulesError {
        RulesError {
            problems: vec![Problem {
                at: at.into(),
                field: field.into(),
                message: message.into(),
            }],
        }
    }
}

/// Parses a YAML rules file: one domain per document (`---` separates documents).
pub fn parse_yaml(text: &str) -> Result<RuleSet, RulesError> {
    use serde::Deserialize;
    let mut docs = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        match Value::deserialize(doc) {
            Ok(Value::Null) => {}
            Ok(v) => docs.push(v),
            Err(e) => {
                return Err(RulesError::one(
                    &format!("document {}", i + 1),
                    "yaml",
                    e.to_string(),
                ));
            }
        }
    }
    if docs.is_empty() {
        return Err(RulesError::one(
            "document 1",
            "domain",
            "the file holds no rules document",
        ));
    }
    from_values(&docs, 0)
}

/// Validates domain documents (the JSON tree of the rule format) into a rule set.
pub fn from_values(docs: &[Value], version: u64) -> Result<RuleSet, RulesError> {
    let mut problems = Vec::new();
    let mut set = RuleSet {
        version,
        domains: BTreeMap::new(),
    };
    for (i, doc) in docs.iter().enumerate() {
        match parse_domain(doc, &mut problems) {
            Some(d) => {
                if set.domains.contains_key(&d.name) {
                    problems.push(Problem {
                        at: format!("document {}", i + 1),
                        field: "domain".into(),
                        message: format!("domain {:?} appears twice", d.name),
                    });
                } else {
                    set.domains.insert(d.name.clone(), Arc::new(d));
                }
            }
            None if problems.is_empty() => problems.push(Problem {
                at: format!("document {}", i + 1),
                field: "domain".into(),
                message: "not a rules document".into(),
            }),
            None => {}
        }
    }
    if problems.is_empty() {
        Ok(set)
    } else {
        Err(RulesError { problems })
    }
}

/// Validates one rule on its own (the admin API's `PUT /v1/rules/{id}`).
pub fn parse_rule(v: &Value) -> Result<Rule, RulesError> {
    let mut problems = Vec::new();
    match rule(v, 0, &mut problems) {
        Some(r) if problems.is_empty() => Ok(r),
        _ => Err(RulesError { problems }),
    }
}

/// Validates one override against a domain's rules.
pub fn parse_override(v: &Value, rules: &[Rule]) -> Result<Override, RulesError> {
    let mut problems = Vec::new();
    match override_(v, 0, rules, &mut problems) {
        Some(o) if problems.is_empty() => Ok(o),
        _ => Err(RulesError { problems }),
    }
}

fn parse_domain(doc: &Value, problems: &mut Vec<Problem>) -> Option<Domain> {
    let obj = doc.as_object()?;
    let mut p = Fields::new("domain", obj, problems);
    let name = p.string("domain", true);
    let rules_v = p.take("rules").cloned();
    let overrides_v = p.take("overrides").cloned();
    p.finish();
    let name = name?;
    if name.is_empty() || name.len() > 128 {
        problems.push(Problem {
            at: "domain".into(),
            field: "domain".into(),
            message: "must be 1 to 128 characters".into(),
        });
    }
    let mut rules = Vec::new();
    match rules_v {
        Some(Value::Array(items)) => {
            for (i, v) in items.iter().enumerate() {
                if let Some(r) = rule(v, i, problems) {
                    rules.push(r);
                }
            }
        }
        None | Some(Value::Null) => {}
        Some(_) => problems.push(Problem {
            at: name.clone(),
            field: "rules".into(),
            message: "must be a list".into(),
        }),
    }
    let mut seen = HashSet::new();
    for r in &rules {
        if !seen.insert(r.id.clone()) {
            problems.push(Problem {
                at: r.id.to_string(),
                field: "id".into(),
                message: "duplicate rule id".into(),
            });
        }
    }
    let mut overrides = Vec::new();
    match overrides_v {
        Some(Value::Array(items)) => {
            for (i, v) in items.iter().enumerate() {
                if let Some(o) = override_(v, i, &rules, problems) {
                    overrides.push(o);
                }
            }
        }
        None | Some(Value::Null) => {}
        Some(_) => problems.push(Problem {
            at: name.clone(),
            field: "overrides".into(),
            message: "must be a list".into(),
        }),
    }
    Some(Domain::new(name, rules, overrides))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Window;

    #[test]
    fn rules_are_found_by_id_scanned_or_hashed() {
        for n in [1, SCAN_RULES, SCAN_RULES + 1, 300] {
            let mut y = String::from("domain: d\nrules:\n");
            for i in 0..n {
                y.push_str(&format!(
                    "  - {{ id: r{i}, key: [k], algorithm: fixed_window, limit: {}, window: 1m }}\n",
                    i + 1
                ));
            }
            let set = parse_yaml(&y).expect("valid rules");
            let d = set.domain("d").expect("domain");
            assert_eq!(d.by_id.is_some(), n > SCAN_RULES, "{n} rules");
            for i in 0..n {
                let r = d.rule(&format!("r{i}")).expect("every rule by its id");
                assert_eq!(&*r.id, format!("r{i}"));
                assert_eq!(r.params, d.rules[i].params);
            }
            assert!(d.rule("r").is_none() && d.rule(&format!("r{n}")).is_none());
        }
    }

    pub(crate) const DESIGN_EXAMPLE: &str = r#"
domain: public-api
rules:
  - id: pay-burst
    match: { route: "POST /v1/payments", tier: growth }
    key: [api_key]
    algorithm: token_bucket
    rate_per_s: 20
    burst: 40
    mode: enforce
    on_store_failure: local
    scope: region
    rollout_pct: 100
    headers: full
    charge_rejected: false
  - id: pay-daily
    match: { route: "POST /v1/payments", tier: growth }
    key: [api_key]
    algorithm: fixed_window
    limit: 10000
    window: 1d
    calendar_tz: Asia/Kolkata
  - id: default-per-minute
    group: per-minute
    match: { tier: "*", route: "*" }
    key: [api_key]
    algorithm: sliding_window
    limit: 600
    window: 1m
  - id: growth-per-minute
    group: per-minute
    match: { tier: growth, route: "*" }
    key: [api_key]
    algorithm: sliding_window
    limit: 6000
    window: 1m
overrides:
  - { identity: { api_key: k_bigcorp }, rule: pay-burst, rate_per_s: 200, burst: 400 }
  - { identity: { api_key: k_monitor }, exempt: true }
"#;

    #[test]
    fn design_example_parses() {
        let set = parse_yaml(DESIGN_EXAMPLE).expect("the design's example rule set is valid");
        let d = set.domain("public-api").expect("domain");
        assert_eq!(d.rules.len(), 4);
        assert_eq!(d.overrides.len(), 2);
        assert!(matches!(
            d.rules[1].params,
            Params::FixedWindow {
                limit: 10000,
                window: Window::Calendar(_)
            }
        ));
        assert_eq!(d.rules[2].specificity(), 0);
        assert_eq!(d.rules[3].specificity(), 1);
        // Round trip through the rule format.
        let again = from_values(&[d.to_value()], 0).expect("round trip");
        assert_eq!(again.domain("public-api").map(|d| d.rules.len()), Some(4));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_yaml("").is_err());
        assert!(parse_yaml(": : :").is_err());
        assert!(parse_yaml("[1, 2]").is_err());
        assert!(parse_yaml("domain: x\nrules: 5").is_err());
    }
}
