//! The rule format (docs/rules.md) parsed into validated, immutable rule sets.
//!
//! Rules arrive as YAML from a file or as JSON from the admin API; both go through the same
//! [`serde_json::Value`] tree, so the checks and the messages are the same. Validation
//! collects every problem, each naming the rule id and the field, and refuses the set as a
//! whole: the daemon keeps serving its last good set.

use crate::algo::{Calendar, CalendarUnit, MAX_LIMIT, MAX_LOG_LIMIT, Params, Window};
use crate::matching::Index;
use crate::time::{MILLI, SECOND, Span, parse_span};
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
    /// `(field, Some(value))` must equal; `(field, None)` is `"*"`: present, any value.
    pub matchers: Vec<(String, Option<String>)>,
    /// Descriptor fields forming the identity counted against.
    pub key: Vec<String>,
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
    /// What the client is told.
    pub headers: HeaderMode,
    /// Refused requests cost quota too.
    pub charge_rejected: bool,
    /// Share a global key once its local count passes this fraction of the limit (percent).
    pub share_threshold_pct: u8,
    /// The hot-key layer's settings (`hot_keys`).
    pub hot_keys: crate::hotkeys::HotKeys,
    /// The rule as written, for listing, diffs and history.
    pub source: Value,
}

impl Rule {
    /// Non-wildcard matchers: the rule's specificity within a group.
    pub fn specificity(&self) -> usize {
        self.matchers.iter().filter(|(_, v)| v.is_some()).count()
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
    /// Replacement `rate_per_s`.
    pub rate_per_s: Option<u64>,
    /// Replacement `burst`.
    pub burst: Option<u64>,
    /// As written.
    pub source: Value,
}

impl Override {
    /// The rule's params with this override's numbers.
    pub fn apply(&self, params: &Params) -> Params {
        let mut p = params.clone();
        match &mut p {
            Params::TokenBucket { rate_per_s, burst } | Params::Gcra { rate_per_s, burst } => {
                *rate_per_s = self.rate_per_s.unwrap_or(*rate_per_s);
                *burst = self.burst.unwrap_or(*burst);
            }
            Params::FixedWindow { limit, .. }
            | Params::SlidingWindow { limit, .. }
            | Params::SlidingLog { limit, .. }
            | Params::Concurrency { limit, .. } => *limit = self.limit.unwrap_or(*limit),
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
}

impl PartialEq for Domain {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.rules == other.rules && self.overrides == other.overrides
    }
}

impl Domain {
    /// Builds and indexes a domain from validated parts.
    pub fn new(name: String, rules: Vec<Rule>, overrides: Vec<Override>) -> Domain {
        let index = Index::build(&rules, &overrides);
        Domain {
            name,
            rules,
            overrides,
            index,
        }
    }

    /// The rule with this id.
    pub fn rule(&self, id: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| &*r.id == id)
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

/// Field access that records a problem for every missing, mistyped or unknown field.
pub(crate) struct Fields<'a> {
    at: String,
    obj: &'a Map<String, Value>,
    used: HashSet<&'static str>,
    problems: &'a mut Vec<Problem>,
}

impl<'a> Fields<'a> {
    fn new(at: &str, obj: &'a Map<String, Value>, problems: &'a mut Vec<Problem>) -> Fields<'a> {
        Fields {
            at: at.to_string(),
            obj,
            used: HashSet::new(),
            problems,
        }
    }

    pub(crate) fn bad(&mut self, field: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            at: self.at.clone(),
            field: field.into(),
            message: message.into(),
        });
    }

    fn take(&mut self, field: &'static str) -> Option<&'a Value> {
        self.used.insert(field);
        self.obj.get(field).filter(|v| !v.is_null())
    }

    fn string(&mut self, field: &'static str, required: bool) -> Option<String> {
        match self.take(field) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(Value::Bool(b)) => Some(b.to_string()),
            Some(other) => {
                self.bad(field, format!("expected a string, got {other}"));
                None
            }
            None => {
                if required {
                    self.bad(field, "is required");
                }
                None
            }
        }
    }

    fn count(&mut self, field: &'static str, max: u64) -> Option<u64> {
        match self.take(field) {
            Some(Value::Number(n)) => match n.as_u64() {
                Some(0) => {
                    self.bad(field, "must be greater than zero");
                    None
                }
                Some(v) if v > max => {
                    self.bad(field, format!("must be at most {max}, got {v}"));
                    None
                }
                Some(v) => Some(v),
                None => {
                    self.bad(field, format!("expected a positive whole number, got {n}"));
                    None
                }
            },
            Some(other) => {
                self.bad(
                    field,
                    format!("expected a positive whole number, got {other}"),
                );
                None
            }
            None => None,
        }
    }

    fn need<T>(&mut self, field: &str, v: Option<T>, algorithm: &str) -> Option<T> {
        if v.is_none()
            && !self
                .problems
                .iter()
                .any(|p| p.at == self.at && p.field == field)
        {
            self.bad(field, format!("is required for {algorithm}"));
        }
        v
    }

    fn span(&mut self, field: &'static str) -> Option<Span> {
        let s = self.string(field, false)?;
        match parse_span(&s) {
            Ok(sp) => Some(sp),
            Err(e) => {
                self.bad(field, e.to_string());
                None
            }
        }
    }

    fn choice<T: Copy>(&mut self, field: &'static str, default: T, options: &[(&str, T)]) -> T {
        let Some(s) = self.string(field, false) else {
            return default;
        };
        match options.iter().find(|(n, _)| *n == s) {
            Some((_, v)) => *v,
            None => {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                self.bad(
                    field,
                    format!("expected one of {}, got {s:?}", names.join(" | ")),
                );
                default
            }
        }
    }

    fn boolean(&mut self, field: &'static str) -> Option<bool> {
        match self.take(field) {
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                self.bad(field, format!("expected true or false, got {other}"));
                None
            }
            None => None,
        }
    }

    fn finish(mut self) {
        let unknown: Vec<String> = self
            .obj
            .keys()
            .filter(|k| !self.used.contains(k.as_str()))
            .cloned()
            .collect();
        for k in unknown {
            // A YAML key that is no string (`? ` alone, `~:`) arrives empty: quoted, the
            // problem still says which field.
            let name = if k.is_empty() { "\"\"" } else { k.as_str() };
            self.bad(name, "unknown field");
        }
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

fn valid_field(f: &str) -> bool {
    !f.is_empty()
        && f.len() <= 64
        && f.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn rule(v: &Value, pos: usize, problems: &mut Vec<Problem>) -> Option<Rule> {
    let Some(obj) = v.as_object() else {
        problems.push(Problem {
            at: format!("rules[{pos}]"),
            field: "rule".into(),
            message: "expected a mapping".into(),
        });
        return None;
    };
    // Problems are reported under the rule id when it is a usable one, else its position.
    let id = match obj.get("id") {
        Some(Value::String(s)) if valid_id(s) => s.clone(),
        _ => format!("rules[{pos}]"),
    };
    let before = problems.len();
    let mut f = Fields::new(&id, obj, problems);
    let id_field = f.string("id", true);
    if let Some(i) = &id_field
        && !valid_id(i)
    {
        f.bad("id", "must be 1 to 64 characters of A-Z a-z 0-9 _ . : -");
    }
    let group = f.string("group", false);
    let mut matchers = Vec::new();
    match f.take("match") {
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let val = match v {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    other => {
                        f.bad(
                            "match",
                            format!("value of {k:?} must be a string, got {other}"),
                        );
                        continue;
                    }
                };
                if !valid_field(k) {
                    f.bad("match", format!("{k:?} is not a descriptor name"));
                }
                matchers.push((k.clone(), (val != "*").then_some(val)));
            }
        }
        None => {}
        Some(other) => f.bad(
            "match",
            format!("expected a mapping of descriptor to value, got {other}"),
        ),
    }
    let mut key = Vec::new();
    match f.take("key") {
        Some(Value::Array(items)) => {
            for it in items {
                match it.as_str() {
                    Some(s) if valid_field(s) => key.push(s.to_string()),
                    _ => f.bad("key", format!("{it} is not a descriptor name")),
                }
            }
        }
        Some(Value::String(s)) if valid_field(s) => key.push(s.clone()),
        None => f.bad(
            "key",
            "is required (a list of descriptor names; [] for one counter shared by all)",
        ),
        Some(other) => f.bad(
            "key",
            format!("expected a list of descriptor names, got {other}"),
        ),
    }
    let algorithm = f.string("algorithm", true);
    let rate = f.count("rate_per_s", MAX_LIMIT);
    let burst = f.count("burst", MAX_LIMIT);
    let limit_max = if algorithm.as_deref() == Some("sliding_log") {
        MAX_LOG_LIMIT
    } else {
        MAX_LIMIT
    };
    let limit = f.count("limit", limit_max);
    let window = f.span("window");
    let timeout = f.span("timeout");
    let tz = f.string("calendar_tz", false);
    let mode = f.choice(
        "mode",
        Mode::Enforce,
        &[
            ("enforce", Mode::Enforce),
            ("shadow", Mode::Shadow),
            ("off", Mode::Off),
        ],
    );
    let on_store_failure = f.choice(
        "on_store_failure",
        FailureMode::Open,
        &[
            ("open", FailureMode::Open),
            ("closed", FailureMode::Closed),
            ("local", FailureMode::Local),
        ],
    );
    let scope = f.choice(
        "scope",
        Scope::Region,
        &[("region", Scope::Region), ("global", Scope::Global)],
    );
    let rollout_pct = match f.take("rollout_pct") {
        None => 100,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(p) if p <= 100 => p as u8,
            _ => {
                f.bad(
                    "rollout_pct",
                    format!("must be a whole number from 0 to 100, got {n}"),
                );
                100
            }
        },
        Some(other) => {
            f.bad(
                "rollout_pct",
                format!("must be a whole number from 0 to 100, got {other}"),
            );
            100
        }
    };
    let headers = f.choice(
        "headers",
        HeaderMode::Full,
        &[
            ("full", HeaderMode::Full),
            ("retry_only", HeaderMode::RetryOnly),
        ],
    );
    let charge_rejected = f.boolean("charge_rejected").unwrap_or(false);
    let share_threshold_pct = match f.take("share_threshold") {
        None => 10,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if (0.0..=1.0).contains(&x) => (x * 100.0).round() as u8,
            _ => {
                f.bad(
                    "share_threshold",
                    format!("must be a fraction from 0 to 1, got {n}"),
                );
                10
            }
        },
        Some(other) => {
            f.bad(
                "share_threshold",
                format!("must be a fraction from 0 to 1, got {other}"),
            );
            10
        }
    };

    let hot_keys_v = f.take("hot_keys");

    let fixed = |f: &mut Fields<'_>, field: &str, s: Option<Span>| -> Option<u64> {
        match s? {
            Span::Fixed(us) => Some(us),
            Span::Months(_) => {
                f.bad(
                    field,
                    "months only make sense with calendar_tz on a fixed_window",
                );
                None
            }
        }
    };
    let unused = |f: &mut Fields<'_>, alg: &str, fields: &[(&str, bool)]| {
        for (name, present) in fields {
            if *present {
                f.bad(name, format!("does not apply to {alg}"));
            }
        }
    };
    let params = match algorithm.as_deref() {
        Some(alg @ ("token_bucket" | "gcra")) => {
            unused(
                &mut f,
                alg,
                &[
                    ("limit", limit.is_some()),
                    ("window", window.is_some()),
                    ("calendar_tz", tz.is_some()),
                    ("timeout", timeout.is_some()),
                ],
            );
            let rate = f.need("rate_per_s", rate, alg);
            let burst = f.need("burst", burst, alg);
            match (rate, burst) {
                (Some(rate_per_s), Some(burst)) if alg == "gcra" => {
                    Some(Params::Gcra { rate_per_s, burst })
                }
                (Some(rate_per_s), Some(burst)) => Some(Params::TokenBucket { rate_per_s, burst }),
                _ => None,
            }
        }
        Some(alg @ "fixed_window") => {
            unused(
                &mut f,
                alg,
                &[
                    ("rate_per_s", rate.is_some()),
                    ("burst", burst.is_some()),
                    ("timeout", timeout.is_some()),
                ],
            );
            let limit = f.need("limit", limit, alg);
            let window = f.need("window", window, alg);
            let w = match (window, tz) {
                (Some(sp), Some(tz)) => {
                    let unit = match sp {
                        Span::Fixed(us) if us == 3_600 * SECOND => Some(CalendarUnit::Hour),
                        Span::Fixed(us) if us == 86_400 * SECOND => Some(CalendarUnit::Day),
                        Span::Fixed(us) if us == 7 * 86_400 * SECOND => Some(CalendarUnit::Week),
                        Span::Months(1) => Some(CalendarUnit::Month),
                        _ => {
                            f.bad(
                                "window",
                                "with calendar_tz the window must be 1h, 1d, 1w or 1mo",
                            );
                            None
                        }
                    };
                    match unit.map(|u| (u, Calendar::new(u, &tz))) {
                        Some((_, Some(c))) => Some(Window::Calendar(c)),
                        Some((_, None)) => {
                            f.bad("calendar_tz", format!("unknown IANA time zone {tz:?}"));
                            None
                        }
                        None => None,
                    }
                }
                (sp, None) => fixed(&mut f, "window", sp).map(Window::Epoch),
                (None, Some(_)) => None,
            };
            match (limit, w) {
                (Some(limit), Some(window)) => Some(Params::FixedWindow { limit, window }),
                _ => None,
            }
        }
        Some(alg @ ("sliding_window" | "sliding_log")) => {
            unused(
                &mut f,
                alg,
                &[
                    ("rate_per_s", rate.is_some()),
                    ("burst", burst.is_some()),
                    ("calendar_tz", tz.is_some()),
                    ("timeout", timeout.is_some()),
                ],
            );
            let limit = f.need("limit", limit, alg);
            let window = f.need("window", window, alg);
            let window = fixed(&mut f, "window", window);
            if let Some(w) = window {
                if w % MILLI != 0 {
                    f.bad("window", "must be a whole number of milliseconds");
                }
                if let Some(l) = limit
                    && alg == "sliding_window"
                    && l.saturating_mul(w / MILLI) > (1 << 51)
                {
                    f.bad("limit", "limit × window in ms must stay below 2^51; use a fixed_window for large quotas");
                }
            }
            match (limit, window) {
                (Some(limit), Some(window)) if alg == "sliding_log" => {
                    Some(Params::SlidingLog { limit, window })
                }
                (Some(limit), Some(window)) => Some(Params::SlidingWindow { limit, window }),
                _ => None,
            }
        }
        Some(alg @ "concurrency") => {
            unused(
                &mut f,
                alg,
                &[
                    ("rate_per_s", rate.is_some()),
                    ("burst", burst.is_some()),
                    ("calendar_tz", tz.is_some()),
                    ("window", window.is_some()),
                ],
            );
            let limit = f.need("limit", limit, alg);
            let timeout = match timeout {
                Some(t) => fixed(&mut f, "timeout", Some(t)),
                None => Some(60 * SECOND),
            };
            match (limit, timeout) {
                (Some(limit), Some(timeout)) => Some(Params::Concurrency { limit, timeout }),
                _ => None,
            }
        }
        Some(other) => {
            f.bad(
                "algorithm",
                format!("unknown algorithm {other:?}; expected token_bucket | gcra | fixed_window | sliding_window | sliding_log | concurrency"),
            );
            None
        }
        None => None,
    };
    let hot_keys =
        crate::hotkeys::config::block(&mut f, hot_keys_v, params.as_ref(), charge_rejected);
    f.finish();
    if problems.len() > before {
        return None;
    }
    Some(Rule {
        id: Arc::from(id_field?.as_str()),
        group,
        matchers,
        key,
        params: params?,
        mode,
        on_store_failure,
        scope,
        rollout_pct,
        headers,
        charge_rejected,
        share_threshold_pct,
        hot_keys: hot_keys?,
        source: v.clone(),
    })
}

fn override_(
    v: &Value,
    pos: usize,
    rules: &[Rule],
    problems: &mut Vec<Problem>,
) -> Option<Override> {
    let at = format!("overrides[{pos}]");
    let Some(obj) = v.as_object() else {
        problems.push(Problem {
            at,
            field: "override".into(),
            message: "expected a mapping".into(),
        });
        return None;
    };
    let before = problems.len();
    let mut f = Fields::new(&at, obj, problems);
    let mut identity = BTreeMap::new();
    match f.take("identity") {
        Some(Value::Object(m)) if !m.is_empty() => {
            for (k, v) in m {
                match v {
                    Value::String(s) => {
                        identity.insert(k.clone(), s.clone());
                    }
                    Value::Number(n) => {
                        identity.insert(k.clone(), n.to_string());
                    }
                    other => f.bad(
                        "identity",
                        format!("value of {k:?} must be a string, got {other}"),
                    ),
                }
            }
        }
        _ => f.bad("identity", "is required: a mapping of descriptor to value"),
    }
    let rule_id = f.string("rule", false);
    let exempt = f.boolean("exempt").unwrap_or(false);
    let limit = f.count("limit", MAX_LIMIT);
    let rate_per_s = f.count("rate_per_s", MAX_LIMIT);
    let burst = f.count("burst", MAX_LIMIT);
    let numbers = limit.is_some() || rate_per_s.is_some() || burst.is_some();
    let target = rule_id
        .as_deref()
        .and_then(|id| rules.iter().find(|r| &*r.id == id));
    if let Some(id) = &rule_id
        && target.is_none()
    {
        f.bad("rule", format!("no rule {id:?} in this domain"));
    }
    if exempt && numbers {
        f.bad("exempt", "an exemption carries no numbers");
    } else if !exempt && !numbers {
        f.bad(
            "exempt",
            "an override needs exempt: true or new numbers (limit, rate_per_s, burst)",
        );
    } else if numbers {
        match target {
            None if rule_id.is_none() => f.bad("rule", "new numbers need the rule they replace"),
            Some(r) => {
                let bucket = matches!(r.params, Params::TokenBucket { .. } | Params::Gcra { .. });
                if bucket && limit.is_some() {
                    f.bad(
                        "limit",
                        format!(
                            "rule {} is a {} (use rate_per_s, burst)",
                            r.id,
                            r.params.kind().name()
                        ),
                    );
                }
                if !bucket && (rate_per_s.is_some() || burst.is_some()) {
                    f.bad(
                        "rate_per_s",
                        format!("rule {} is a {} (use limit)", r.id, r.params.kind().name()),
                    );
                }
                let split = r.hot_keys.split;
                let ours = Override {
                    identity: BTreeMap::new(),
                    rule: None,
                    exempt: false,
                    limit,
                    rate_per_s,
                    burst,
                    source: Value::Null,
                };
                if split > 1
                    && let Some(problem) =
                        crate::hotkeys::config::split_leaves_zero(&ours.apply(&r.params), split)
                {
                    f.bad(
                        if bucket { "rate_per_s" } else { "limit" },
                        format!("rule {} is split (hot_keys.split): {problem}", r.id),
                    );
                }
            }
            None => {}
        }
    }
    f.finish();
    if problems.len() > before {
        return None;
    }
    Some(Override {
        identity,
        rule: rule_id.map(|s| Arc::from(s.as_str())),
        exempt,
        limit,
        rate_per_s,
        burst,
        source: v.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_rule_that_names_no_failure_mode_fails_open() {
        let set = parse_yaml(
            "domain: d\nrules:\n  - { id: r, key: [api_key], algorithm: gcra, rate_per_s: 1, burst: 1 }\n",
        )
        .expect("valid");
        let r = &set.domain("d").expect("domain").rules[0];
        assert_eq!(r.on_store_failure, FailureMode::Open);
    }

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
    fn every_problem_is_reported_with_rule_and_field() {
        let bad = r#"
domain: api
rules:
  - id: a
    key: [api_key]
    algorithm: token_bucket
    rate_per_s: 0
  - id: b
    key: [user]
    algorithm: fixed_window
    limit: 10
    window: 1x
    colour: red
  - id: c
    key: [user]
    algorithm: leaky
  - id: a
    key: [user]
    algorithm: sliding_log
    limit: 100000
    window: 1m
  - id: tz
    key: [user]
    algorithm: fixed_window
    limit: 5
    window: 1d
    calendar_tz: Mars/Olympus
"#;
        let err = parse_yaml(bad).expect_err("invalid");
        let got: Vec<(String, String)> = err
            .problems
            .iter()
            .map(|p| (p.at.clone(), p.field.clone()))
            .collect();
        for want in [
            ("a", "rate_per_s"),
            ("a", "burst"),
            ("b", "window"),
            ("b", "colour"),
            ("c", "algorithm"),
            ("a", "limit"),
            ("tz", "calendar_tz"),
        ] {
            assert!(
                got.contains(&(want.0.to_string(), want.1.to_string())),
                "missing {want:?} in {err}"
            );
        }
    }

    #[test]
    fn overrides_are_checked_against_rules() {
        let bad = r#"
domain: api
rules:
  - { id: w, key: [k], algorithm: fixed_window, limit: 5, window: 1m }
overrides:
  - { identity: { k: a }, rule: nope, limit: 3 }
  - { identity: { k: b }, rule: w, burst: 3 }
  - { identity: { k: c } }
  - { identity: {}, exempt: true }
"#;
        let err = parse_yaml(bad).expect_err("invalid");
        assert_eq!(err.problems.len(), 4, "{err}");
    }

    #[test]
    fn a_bad_id_is_reported_at_the_rule_position() {
        // Found by the fuzzer: an empty id used to yield a problem located at "".
        let err = parse_yaml("domain: a\nrules:\n  - { id: \"\" }\n").expect_err("invalid");
        assert!(err.problems.iter().all(|p| p.at == "rules[0]"), "{err}");
        assert!(err.problems.iter().any(|p| p.field == "id"), "{err}");
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_yaml("").is_err());
        assert!(parse_yaml(": : :").is_err());
        assert!(parse_yaml("[1, 2]").is_err());
        assert!(parse_yaml("domain: x\nrules: 5").is_err());
    }
}
