//! One line of the decision log: what a check asked, and what each rule said.
//!
//! A record holds only the descriptor entries the applied rules match or key on, never the
//! others a client sent, and a descriptor whose name looks like a credential
//! (`authorization`, `cookie`, … see [`Redact`]) is written as a keyed hash, in the
//! descriptors and in the identities, so the log can be read by people who may not see
//! tokens. The field names are the stable format docs/decision-log.md documents; `v` says
//! which version of it a line is.

use serde::Serialize;
use sluice_core::Micros;
use sluice_core::decision::{Code, Decision, Plan, Via};
use sluice_core::matching::{Applied, Descriptors};
use sluice_core::rules::Mode;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};

/// The format version written in `v`.
pub const VERSION: u32 = 1;

/// One check, as written.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Record {
    /// Format version.
    pub v: u32,
    /// When it was decided, epoch µs.
    pub ts: Micros,
    /// The rules domain.
    pub domain: String,
    /// The identity the record was sampled under (the deciding rule's, else the first
    /// applied rule's).
    pub identity: String,
    /// The check's request id (what a release names).
    pub request_id: String,
    /// Units asked for.
    pub cost: u64,
    /// `OK`, `OVER_LIMIT` or `UNAVAILABLE`.
    pub code: &'static str,
    /// The rule set version that decided.
    pub rules_version: u64,
    /// The descriptor entries the applied rules match or key on.
    pub descriptors: BTreeMap<String, String>,
    /// Each applied rule's verdict, in rule order.
    pub rules: Vec<RuleOutcome>,
    /// Checks this record stands for: itself and those of its identity and kind (allowed,
    /// or refusal) the sampler did not keep since the last kept one (see [`super::sample`]).
    pub weight: u64,
    /// The store its counts live in: the region on a shared store, `daemon:<id>` on the
    /// memory store (a what-if replays each store apart). Absent when not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counts_in: Option<String>,
}

/// One rule's verdict on the check.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RuleOutcome {
    /// Rule id.
    pub id: String,
    /// `enforce` or `shadow`.
    pub mode: &'static str,
    /// `allowed`, `refused` (enforced) or `would_refuse` (shadow).
    pub outcome: &'static str,
    /// The identity it counted against.
    pub identity: String,
    /// How an enforced rule's verdict was reached: `store`, `local`, `failed_open`,
    /// `failed_closed` (absent for shadow rules).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<&'static str>,
    /// An enforced rule's units left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// An enforced rule's wait before a retry could pass, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// Which descriptor names are credentials, and the key their values are hashed under.
#[derive(Debug, Clone)]
pub struct Redact {
    /// Lower-case substrings: a name containing one is redacted.
    pub names: Vec<String>,
    /// The hash key (drawn at start: the same value hashes alike within one process).
    pub key: std::collections::hash_map::RandomState,
}

impl Redact {
    /// Whether descriptor `name` holds a credential.
    pub fn secret(&self, name: &str) -> bool {
        let lower = name.to_ascii_lowercase();
        self.names.iter().any(|n| lower.contains(n.as_str()))
    }

    /// `redacted:<16 hex>`: equal values stay equal, the value does not show.
    pub fn hash(&self, value: &str) -> String {
        let mut h = self.key.build_hasher();
        h.write(value.as_bytes());
        format!("redacted:{:016x}", h.finish())
    }

    /// A rule's identity as the log writes it: as the core made it (`domain|name=value|…`,
    /// values escaped so `|` and `=` only separate), with each credential's value hashed.
    pub fn identity(&self, identity: &str) -> String {
        let mut parts = identity.split('|');
        let mut out = String::with_capacity(identity.len());
        out.push_str(parts.next().unwrap_or_default());
        for part in parts {
            out.push('|');
            match part.split_once('=') {
                Some((name, value)) if self.secret(name) => {
                    out.push_str(name);
                    out.push('=');
                    out.push_str(&self.hash(value));
                }
                _ => out.push_str(part),
            }
        }
        out
    }
}

/// The descriptor names of a rule's identity (`domain|name=value|…`).
fn key_names(identity: &str) -> impl Iterator<Item = &str> {
    identity
        .split('|')
        .skip(1)
        .filter_map(|p| p.split_once('=').map(|(n, _)| n))
}

/// The identity a check is sampled under: the deciding rule's, else the first shadow rule
/// that would refuse, else the first applied rule's (`None`: no rule applied).
pub fn sampled_identity<'p, 'r>(p: &'p Plan<'r>, decision: &Decision) -> Option<&'p Applied<'r>> {
    let by = |id: &str| p.applied.iter().find(|a| &*a.rule.id == id);
    decision
        .decided_by
        .as_deref()
        .and_then(by)
        .or_else(|| decision.shadow_denied.first().and_then(|id| by(id)))
        .or_else(|| p.applied.first())
}

/// Whether a check counts as a refusal for sampling: refused, unavailable, or a shadow rule
/// would have refused.
pub fn refused(decision: &Decision) -> bool {
    decision.code != Code::Ok || !decision.shadow_denied.is_empty()
}

/// The inputs of a record besides the plan and decision.
pub struct Check<'a> {
    /// The request's descriptors.
    pub descriptors: &'a Descriptors,
    /// Units asked for.
    pub cost: u64,
    /// Its request id.
    pub request_id: &'a str,
    /// When it was decided.
    pub now: Micros,
}

fn via(v: Via) -> &'static str {
    match v {
        Via::Store => "store",
        Via::Local => "local",
        Via::FailedOpen => "failed_open",
        Via::FailedClosed => "failed_closed",
    }
}

/// Builds the record of a kept check.
pub fn build(
    domain: &str,
    p: &Plan<'_>,
    decision: &Decision,
    c: &Check<'_>,
    redact: &Redact,
) -> Record {
    let d = c.descriptors;
    let mut descriptors = BTreeMap::new();
    let mut rules = Vec::with_capacity(p.applied.len());
    for a in &p.applied {
        let names = key_names(&a.identity).chain(a.rule.matchers.iter().map(|m| m.0.as_str()));
        for name in names {
            if descriptors.contains_key(name) {
                continue;
            }
            if let Some(v) = d.get(name) {
                let v = if redact.secret(name) {
                    redact.hash(v)
                } else {
                    v.to_string()
                };
                descriptors.insert(name.to_string(), v);
            }
        }
        let identity = redact.identity(&a.identity);
        let out = if a.rule.mode == Mode::Shadow {
            let denied = decision.shadow_denied.contains(&a.rule.id);
            RuleOutcome {
                id: a.rule.id.to_string(),
                mode: "shadow",
                outcome: if denied { "would_refuse" } else { "allowed" },
                identity,
                via: None,
                remaining: None,
                retry_after_ms: None,
            }
        } else {
            let policy = decision.policies.iter().find(|s| s.id == a.rule.id);
            RuleOutcome {
                id: a.rule.id.to_string(),
                mode: "enforce",
                outcome: match policy {
                    Some(s) if !s.allowed => "refused",
                    _ => "allowed",
                },
                identity,
                via: policy.map(|s| via(s.via)),
                remaining: policy.map(|s| s.remaining),
                retry_after_ms: policy.map(|s| s.retry_after_ms),
            }
        };
        rules.push(out);
    }
    let identity = sampled_identity(p, decision)
        .map(|a| redact.identity(&a.identity))
        .unwrap_or_default();
    Record {
        v: VERSION,
        ts: c.now,
        domain: domain.to_string(),
        identity,
        request_id: c.request_id.to_string(),
        cost: c.cost,
        code: decision.code.as_str(),
        rules_version: decision.rules_version,
        descriptors,
        rules,
        weight: 1,
        counts_in: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::decision::plan;

    const RULES: &str = r#"
domain: api
rules:
  - id: per-token
    match: { route: "GET /x" }
    key: [authorization]
    algorithm: fixed_window
    limit: 1
    window: 1m
  - id: per-user
    key: [user]
    algorithm: fixed_window
    limit: 5
    window: 1m
    mode: shadow
"#;

    fn redact() -> Redact {
        Redact {
            names: vec!["authorization".into(), "cookie".into()],
            key: Default::default(),
        }
    }

    #[test]
    fn a_record_holds_only_what_rules_use_and_no_credential() {
        let set = sluice_core::rules::parse_yaml(RULES).expect("rules");
        let dom = set.domain("api").expect("domain");
        let d = Descriptors::new(vec![
            ("route".into(), "GET /x".into()),
            ("authorization".into(), "Bearer hunter2".into()),
            ("user".into(), "alice".into()),
            ("cookie".into(), "session=s3cret".into()),
            ("other".into(), "not used".into()),
        ])
        .expect("descriptors");
        let now = 1_700_000_000_000_000;
        let p = plan(dom, &d, now, 1, "r-1", |_| Default::default());
        let decision = Decision::unlimited(7);
        let c = Check {
            descriptors: &d,
            cost: 1,
            request_id: "r-1",
            now,
        };
        let r = build("api", &p, &decision, &c, &redact());
        let line = serde_json::to_string(&r).expect("json");
        assert!(!line.contains("hunter2"), "{line}");
        assert!(
            !line.contains("s3cret") && !line.contains("cookie"),
            "{line}"
        );
        assert!(!line.contains("not used"), "{line}");
        assert_eq!(r.descriptors["user"], "alice");
        assert_eq!(r.descriptors["route"], "GET /x");
        assert!(r.descriptors["authorization"].starts_with("redacted:"));
        assert_eq!(r.rules.len(), 2);
        assert!(
            r.rules[0]
                .identity
                .starts_with("api|authorization=redacted:")
        );
        assert_eq!(r.rules[1].mode, "shadow");
        assert_eq!(r.identity, r.rules[0].identity);
    }
}
