//! The control plane's state as stored entries, and the pure operations on it: building a
//! [`RuleSet`], diffing two states, and refusing a drastic tightening.
//!
//! PostgreSQL stores rules and overrides as separate rows (one per rule, one per override),
//! each with a position that keeps the file order (order breaks ties within a group). The
//! admin API, the daemon's watcher and the on-disk snapshot all work on the same [`State`], so
//! a set is assembled and validated in exactly one way, by sluice-core, wherever it is built.
//! Nothing here performs I/O.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sluice_core::Params;
use sluice_core::rules::{RuleSet, RulesError};
use sluice_core::time::SECOND;
use std::collections::{BTreeMap, BTreeSet};

/// A tightening by more than this factor is refused unless forced: turning 100 a minute into
/// 10 is an incident response; turning it into 1 is more likely a typo that locks out users.
pub const MAX_TIGHTENING: u64 = 10;

/// What a stored entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A rule, keyed by its id.
    Rule,
    /// An override, keyed by [`override_key`].
    Override,
    /// A domain's settings ([`crate::domains::SETTINGS`]), keyed by [`SETTINGS_KEY`].
    Domain,
}

/// The key of a domain's settings entry (one per domain).
pub const SETTINGS_KEY: &str = "settings";

impl Kind {
    /// The name stored in the `kind` column and shown in diffs.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Rule => "rule",
            Kind::Override => "override",
            Kind::Domain => "domain",
        }
    }

    /// Parses a stored `kind` column.
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "rule" => Some(Kind::Rule),
            "override" => Some(Kind::Override),
            "domain" => Some(Kind::Domain),
            _ => None,
        }
    }
}

/// Where an entry lives: its domain, kind and key (rule id, or override key).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EntryKey {
    /// The domain name.
    pub domain: String,
    /// Rule or override.
    pub kind: Kind,
    /// Rule id, or the override key (`rule/name=value,...`).
    pub key: String,
}

impl EntryKey {
    /// A rule's key.
    pub fn rule(domain: &str, id: &str) -> EntryKey {
        EntryKey {
            domain: domain.to_string(),
            kind: Kind::Rule,
            key: id.to_string(),
        }
    }

    /// An override's key.
    pub fn override_(domain: &str, key: &str) -> EntryKey {
        EntryKey {
            domain: domain.to_string(),
            kind: Kind::Override,
            key: key.to_string(),
        }
    }
}

/// A stored entry: its body in the rule format and its place in the file order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Sort position within its domain and kind (ties broken by key).
    pub position: i32,
    /// The rule or override as written (JSON tree of the rule format).
    pub body: Value,
}

/// Every rule and override, as stored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    /// By domain, kind, key.
    pub entries: BTreeMap<EntryKey, Entry>,
}

/// One entry as a flat record (the snapshot's and the history's shape).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Domain name.
    pub domain: String,
    /// Rule or override.
    pub kind: Kind,
    /// Rule id or override key.
    pub key: String,
    /// Sort position.
    pub position: i32,
    /// The body; `None` is a tombstone (deleted) in history.
    pub body: Option<Value>,
}

/// What a change does to one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// New entry.
    Add,
    /// Body or position changed.
    Change,
    /// Entry removed.
    Delete,
}

/// One entry's difference between two states: what `sluicectl apply` shows before applying.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// Add, change or delete.
    pub op: Op,
    /// Rule or override.
    pub kind: Kind,
    /// Domain name.
    pub domain: String,
    /// Rule id or override key.
    pub key: String,
    /// The body before (absent for an add).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    /// The body after (absent for a delete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
    /// Only the position (the order within the domain) changed, or it changed too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub moved: bool,
    /// The new position (for an add or change), so the change can be stored as is.
    #[serde(default)]
    pub position: i32,
}

/// The stable key of an override: `rule/name=value,name=value` (names sorted; `*` for an
/// exemption from every rule), or `None` when the body has no usable identity (validation
/// then explains why).
pub fn override_key(body: &Value) -> Option<String> {
    let obj = body.as_object()?;
    let rule = match obj.get("rule") {
        None | Some(Value::Null) => "*".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let identity = obj.get("identity")?.as_object()?;
    if identity.is_empty() {
        return None;
    }
    let pairs: BTreeMap<&str, String> = identity
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.as_str(), v)
        })
        .collect();
    let identity: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Some(format!("{rule}/{}", identity.join(",")))
}

impl State {
    /// Every domain that has at least one entry.
    pub fn domains(&self) -> BTreeSet<&str> {
        self.entries.keys().map(|k| k.domain.as_str()).collect()
    }

    /// The entries of one domain and kind, in file order.
    pub fn list(&self, domain: &str, kind: Kind) -> Vec<(&EntryKey, &Entry)> {
        let mut v: Vec<(&EntryKey, &Entry)> = self
            .entries
            .iter()
            .filter(|(k, _)| k.domain == domain && k.kind == kind)
            .collect();
        v.sort_by(|a, b| (a.1.position, &a.0.key).cmp(&(b.1.position, &b.0.key)));
        v
    }

    /// Domains holding a rule with this id.
    pub fn rule_domains(&self, id: &str) -> Vec<&str> {
        self.entries
            .keys()
            .filter(|k| k.kind == Kind::Rule && k.key == id)
            .map(|k| k.domain.as_str())
            .collect()
    }

    /// One past the highest position in a domain and kind: where a new entry goes.
    pub fn next_position(&self, domain: &str, kind: Kind) -> i32 {
        self.entries
            .iter()
            .filter(|(k, _)| k.domain == domain && k.kind == kind)
            .map(|(_, e)| e.position.saturating_add(1))
            .max()
            .unwrap_or(0)
    }

    /// The domains in the rule format, one document each (domains in name order).
    pub fn to_docs(&self) -> Vec<Value> {
        self.domains()
            .into_iter()
            .map(|d| self.domain_doc(d))
            .collect()
    }

    /// One domain in the rule format.
    pub fn domain_doc(&self, domain: &str) -> Value {
        let mut m = Map::new();
        m.insert("domain".into(), Value::String(domain.to_string()));
        let settings = self.entries.get(&EntryKey {
            domain: domain.to_string(),
            kind: Kind::Domain,
            key: SETTINGS_KEY.to_string(),
        });
        if let Some(Value::Object(s)) = settings.map(|e| &e.body) {
            m.extend(s.clone());
        }
        let rules: Vec<Value> = self
            .list(domain, Kind::Rule)
            .into_iter()
            .map(|(_, e)| e.body.clone())
            .collect();
        m.insert("rules".into(), Value::Array(rules));
        let overrides: Vec<Value> = self
            .list(domain, Kind::Override)
            .into_iter()
            .map(|(_, e)| e.body.clone())
            .collect();
        if !overrides.is_empty() {
            m.insert("overrides".into(), Value::Array(overrides));
        }
        Value::Object(m)
    }

    /// Validates the whole state (sluice-core, then the domain settings) into a rule set of
    /// that version.
    pub fn to_rule_set(&self, version: u64) -> Result<RuleSet, RulesError> {
        crate::domains::validate(&self.to_docs(), version)
    }

    /// Entries from rule documents (positions in document order). The documents are
    /// validated first, as a set, so every problem is reported at once.
    pub fn from_docs(docs: &[Value]) -> Result<State, RulesError> {
        crate::domains::validate(docs, 0)?;
        let mut state = State::default();
        for doc in docs {
            let Some(domain) = doc.get("domain").and_then(Value::as_str) else {
                continue;
            };
            if let Some(body) = crate::domains::settings_of(doc) {
                state.entries.insert(
                    EntryKey {
                        domain: domain.to_string(),
                        kind: Kind::Domain,
                        key: SETTINGS_KEY.to_string(),
                    },
                    Entry { position: 0, body },
                );
            }
            let lists = [(Kind::Rule, "rules"), (Kind::Override, "overrides")];
            for (kind, field) in lists {
                let items = doc.get(field).and_then(Value::as_array);
                for (i, body) in items.into_iter().flatten().enumerate() {
                    let key = match kind {
                        Kind::Rule => body.get("id").and_then(Value::as_str).map(str::to_string),
                        Kind::Override => override_key(body),
                        Kind::Domain => None,
                    };
                    if let Some(key) = key {
                        state.entries.insert(
                            EntryKey {
                                domain: domain.to_string(),
                                kind,
                                key,
                            },
                            Entry {
                                position: i32::try_from(i).unwrap_or(i32::MAX),
                                body: body.clone(),
                            },
                        );
                    }
                }
            }
        }
        Ok(state)
    }

    /// The state as flat records (for the snapshot file).
    pub fn records(&self) -> Vec<Record> {
        self.entries
            .iter()
            .map(|(k, e)| Record {
                domain: k.domain.clone(),
                kind: k.kind,
                key: k.key.clone(),
                position: e.position,
                body: Some(e.body.clone()),
            })
            .collect()
    }

    /// Applies one stored record: a body replaces or adds, a tombstone removes.
    pub fn apply_record(&mut self, r: Record) {
        let key = EntryKey {
            domain: r.domain,
            kind: r.kind,
            key: r.key,
        };
        match r.body {
            Some(body) => {
                self.entries.insert(
                    key,
                    Entry {
                        position: r.position,
                        body,
                    },
                );
            }
            None => {
                self.entries.remove(&key);
            }
        }
    }

    /// Every entry that differs between `self` (before) and `after`, in key order.
    pub fn diff(&self, after: &State) -> Vec<Change> {
        let mut out = Vec::new();
        let keys: BTreeSet<&EntryKey> = self.entries.keys().chain(after.entries.keys()).collect();
        for k in keys {
            let (b, a) = (self.entries.get(k), after.entries.get(k));
            let (op, moved, position) = match (b, a) {
                (None, None) => continue,
                (None, Some(a)) => (Op::Add, false, a.position),
                (Some(b), None) => (Op::Delete, false, b.position),
                (Some(b), Some(a)) if b == a => continue,
                (Some(b), Some(a)) => (Op::Change, b.position != a.position, a.position),
            };
            out.push(Change {
                op,
                kind: k.kind,
                domain: k.domain.clone(),
                key: k.key.clone(),
                before: b.map(|e| e.body.clone()),
                after: a.map(|e| e.body.clone()),
                moved,
                position,
            });
        }
        out
    }
}

/// How a rule's numbers read to a person: `limit 100 per 1m`, `rate_per_s 20, burst 40`,
/// `rate 10/1m, burst 10`.
pub fn describe(p: &Params) -> String {
    match p {
        Params::TokenBucket { rate, burst } | Params::Gcra { rate, burst } => {
            if rate.per() == sluice_core::time::SECOND {
                format!("rate_per_s {}, burst {burst}", rate.tokens())
            } else {
                format!("rate {rate}, burst {burst}")
            }
        }
        Params::Concurrency { limit, .. } => format!("{limit} concurrent"),
        Params::FairShare(fs) => format!(
            "{}, fair shares",
            describe(&Params::TokenBucket {
                rate: fs.rate,
                burst: fs.burst
            })
        ),
        other => format!("limit {} per {}", other.limit(), span(other.window())),
    }
}

fn span(us: u64) -> String {
    let s = us / SECOND;
    if !us.is_multiple_of(SECOND) {
        format!("{}ms", us / 1000)
    } else if s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s.is_multiple_of(3_600) {
        format!("{}h", s / 3_600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// How many times tighter `new` is than `old`, by quota or by rate (quota over window),
/// whichever is tighter; `None` when it is not tighter than `max` times.
fn tighter(old: &Params, new: &Params, max: u64) -> Option<u64> {
    let (qo, wo) = (u128::from(old.limit()), u128::from(old.window().max(1)));
    let (qn, wn) = (
        u128::from(new.limit().max(1)),
        u128::from(new.window().max(1)),
    );
    let max = u128::from(max);
    let by_quota = qo > max * qn;
    // rate_old / rate_new = (qo / wo) / (qn / wn) = qo·wn / (qn·wo)
    let by_rate = qo * wn > max * qn * wo;
    if !(by_quota || by_rate) {
        return None;
    }
    let f = (qo / qn).max((qo * wn) / (qn * wo));
    Some(u64::try_from(f).unwrap_or(u64::MAX))
}

/// Every rule or override that `changes` make more than `max` times tighter, as messages
/// naming the domain, the rule and the numbers; empty when the change is acceptable.
///
/// An override counts too: changing an identity's numbers, or deleting its override so it
/// falls back to the rule's numbers, tightens what that identity gets. Exemptions and new
/// rules are not compared (there is nothing finite to compare with).
pub fn tightenings(before: &RuleSet, after: &RuleSet, changes: &[Change], max: u64) -> Vec<String> {
    let mut out = Vec::new();
    for c in changes {
        let (Some(db), Some(da)) = (before.domain(&c.domain), after.domain(&c.domain)) else {
            continue;
        };
        match c.kind {
            // Settings change no numbers.
            Kind::Domain => {}
            Kind::Rule => {
                let (Some(rb), Some(ra)) = (db.rule(&c.key), da.rule(&c.key)) else {
                    continue;
                };
                if let Some(f) = tighter(&rb.params, &ra.params, max) {
                    out.push(format!(
                        "rule {}/{}: {} → {} is {f}× tighter (more than {max}×)",
                        c.domain,
                        c.key,
                        describe(&rb.params),
                        describe(&ra.params)
                    ));
                }
            }
            Kind::Override => {
                let find = |d: &sluice_core::rules::Domain| {
                    d.overrides
                        .iter()
                        .find(|o| override_key(&o.source).as_deref() == Some(c.key.as_str()))
                        .cloned()
                };
                let (ob, oa) = (find(db), find(da));
                let Some(rule_id) = ob
                    .as_ref()
                    .or(oa.as_ref())
                    .and_then(|o| o.rule.as_deref().map(str::to_string))
                else {
                    continue;
                };
                let (Some(rb), Some(ra)) = (db.rule(&rule_id), da.rule(&rule_id)) else {
                    continue;
                };
                if ob.as_ref().is_some_and(|o| o.exempt) || oa.as_ref().is_some_and(|o| o.exempt) {
                    continue;
                }
                let pb = ob.map_or_else(|| rb.params.clone(), |o| o.apply(&rb.params));
                let pa = oa.map_or_else(|| ra.params.clone(), |o| o.apply(&ra.params));
                if let Some(f) = tighter(&pb, &pa, max) {
                    out.push(format!(
                        "override {}/{}: {} → {} is {f}× tighter (more than {max}×)",
                        c.domain,
                        c.key,
                        describe(&pb),
                        describe(&pa)
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state(docs: Value) -> State {
        let docs = match docs {
            Value::Array(v) => v,
            one => vec![one],
        };
        State::from_docs(&docs).expect("valid docs")
    }

    fn login(limit: u64) -> Value {
        json!({"domain": "api", "rules": [
            {"id": "login", "key": ["ip"], "algorithm": "sliding_window", "limit": limit, "window": "1m"},
            {"id": "pay", "key": ["api_key"], "algorithm": "token_bucket", "rate_per_s": 20, "burst": 40},
        ], "overrides": [
            {"identity": {"api_key": "big"}, "rule": "pay", "rate_per_s": 200, "burst": 400},
        ]})
    }

    #[test]
    fn override_keys_are_canonical() {
        let a = json!({"identity": {"b": "2", "a": "1"}, "rule": "r", "limit": 3});
        let b = json!({"rule": "r", "identity": {"a": "1", "b": 2}, "limit": 9});
        assert_eq!(override_key(&a).as_deref(), Some("r/a=1,b=2"));
        assert_eq!(override_key(&a), override_key(&b));
        let exempt = json!({"identity": {"api_key": "m"}, "exempt": true});
        assert_eq!(override_key(&exempt).as_deref(), Some("*/api_key=m"));
        assert_eq!(override_key(&json!({"identity": {}})), None);
    }

    #[test]
    fn docs_round_trip_through_state_in_order() {
        let s = state(login(100));
        let docs = s.to_docs();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0]["rules"][0]["id"], "login");
        assert_eq!(docs[0]["rules"][1]["id"], "pay");
        let set = s.to_rule_set(7).expect("valid");
        assert_eq!(set.version, 7);
        assert_eq!(set.rule_count(), 2);
        assert_eq!(State::from_docs(&docs).expect("again"), s);
    }

    #[test]
    fn diff_reports_adds_changes_moves_and_deletes() {
        let before = state(login(100));
        let mut after = state(login(10));
        after
            .entries
            .remove(&EntryKey::override_("api", "pay/api_key=big"));
        after.entries.insert(
            EntryKey::rule("api", "new"),
            Entry {
                position: 5,
                body: json!({"id": "new", "key": [], "algorithm": "concurrency", "limit": 3}),
            },
        );
        let d = before.diff(&after);
        let ops: Vec<(Op, &str)> = d.iter().map(|c| (c.op, c.key.as_str())).collect();
        assert_eq!(
            ops,
            vec![
                (Op::Change, "login"),
                (Op::Add, "new"),
                (Op::Delete, "pay/api_key=big")
            ]
        );
        assert!(!d[0].moved);
        assert!(before.diff(&before).is_empty());
    }

    #[test]
    fn tightening_over_ten_times_is_caught_and_ten_times_is_not() {
        let before = state(login(100));
        let ok = state(login(10));
        let bad = state(login(9));
        let rs = |s: &State| s.to_rule_set(1).expect("valid");
        assert!(tightenings(&rs(&before), &rs(&ok), &before.diff(&ok), 10).is_empty());
        let msgs = tightenings(&rs(&before), &rs(&bad), &before.diff(&bad), 10);
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(msgs[0].contains("api/login"), "{msgs:?}");
        assert!(
            msgs[0].contains("limit 100 per 1m → limit 9 per 1m"),
            "{msgs:?}"
        );
        // Loosening is never refused.
        assert!(tightenings(&rs(&bad), &rs(&before), &bad.diff(&before), 10).is_empty());
    }

    #[test]
    fn a_longer_window_is_a_tightening_by_rate() {
        let a = Params::SlidingWindow {
            limit: 100,
            window: 60 * SECOND,
            start: Default::default(),
        };
        let b = Params::SlidingWindow {
            limit: 100,
            window: 3_600 * SECOND,
            start: Default::default(),
        };
        assert_eq!(tighter(&a, &b, 10), Some(60));
        assert_eq!(tighter(&b, &a, 10), None);
    }

    #[test]
    fn deleting_a_generous_override_is_a_tightening_for_that_identity() {
        let before = state(login(100));
        let mut after = before.clone();
        after
            .entries
            .remove(&EntryKey::override_("api", "pay/api_key=big"));
        let rs = |s: &State| s.to_rule_set(1).expect("valid");
        // 200/s → 20/s is exactly 10×: allowed.
        assert!(tightenings(&rs(&before), &rs(&after), &before.diff(&after), 10).is_empty());
        let msgs = tightenings(&rs(&before), &rs(&after), &before.diff(&after), 5);
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(
            msgs[0].starts_with("override api/pay/api_key=big"),
            "{msgs:?}"
        );
    }
}
