//! Domain settings the control plane enforces on top of sluice-core's validation:
//! `require_default: true` refuses a domain's rule set as a whole unless it holds a
//! catch-all rule, so a typo in a `match` cannot leave most requests unlimited.
//!
//! A **catch-all** rule has no `match` conditions (so every request of the domain is
//! evaluated against it, or, in a `group`, against a more specific rule of that group), is
//! not `mode: off` (not evaluated; `shadow` counts, so the kill switch, which shadows every
//! rule, still works) and has `rollout_pct: 100` (a partial rollout leaves identities out). Its key fields are not judged: a request without one is not
//! counted by the rule, so a default rule keys on fields every caller sends, or on none
//! (`key: []`, one budget for the domain).
//!
//! Every source validates through [`validate`] (the file source through [`parse_yaml`]), so
//! the check is the same for a file and for PostgreSQL; the settings are taken out of each
//! domain document before sluice-core sees it.

use serde::Deserialize as _;
use serde_json::Value;
use sluice_core::rules::{Mode, Problem, Rule, RuleSet, RulesError, from_values};

/// The domain-document fields read here rather than by sluice-core.
pub const SETTINGS: &[&str] = &["require_default"];

/// Whether `rule` covers every request of its domain (see the module docs).
pub fn is_catch_all(rule: &Rule) -> bool {
    rule.matchers.is_empty() && rule.mode != Mode::Off && rule.rollout_pct == 100
}

/// A domain document's settings (`{"require_default": true}`), or `None` when it has none.
pub fn settings_of(doc: &Value) -> Option<Value> {
    let obj = doc.as_object()?;
    let m: serde_json::Map<String, Value> = SETTINGS
        .iter()
        .filter_map(|k| obj.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    (!m.is_empty()).then_some(Value::Object(m))
}

/// Validates domain documents (with their settings) into a rule set of `version`: every
/// problem sluice-core finds, plus each domain that requires a default rule and has none.
pub fn validate(docs: &[Value], version: u64) -> Result<RuleSet, RulesError> {
    let mut problems = Vec::new();
    let mut required = Vec::new();
    let stripped: Vec<Value> = docs
        .iter()
        .map(|doc| {
            let mut doc = doc.clone();
            let name = doc
                .get("domain")
                .and_then(Value::as_str)
                .map(str::to_string);
            if let Some(obj) = doc.as_object_mut() {
                match obj.remove("require_default") {
                    None | Some(Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => required.extend(name.clone()),
                    Some(other) => problems.push(Problem {
                        at: name.clone().unwrap_or_else(|| "domain".into()),
                        field: "require_default".into(),
                        message: format!("must be true or false, got {other}"),
                    }),
                }
            }
            doc
        })
        .collect();
    let set = match from_values(&stripped, version) {
        Ok(set) => set,
        Err(mut e) => {
            e.problems.extend(problems);
            return Err(e);
        }
    };
    for name in required {
        let Some(d) = set.domain(&name) else { continue };
        if !d.rules.iter().any(is_catch_all) {
            problems.push(Problem {
                at: name.clone(),
                field: "require_default".into(),
                message: format!(
                    "domain {name:?} requires a default rule, and none of its {} rules is one: \
                     add a rule with no match conditions, not off, with rollout_pct 100",
                    d.rules.len()
                ),
            });
        }
    }
    if problems.is_empty() {
        Ok(set)
    } else {
        Err(RulesError { problems })
    }
}

/// Parses a YAML rules file (one domain per document) and validates it with [`validate`].
pub fn parse_yaml(text: &str) -> Result<RuleSet, RulesError> {
    let one = |doc: usize, message: String| RulesError {
        problems: vec![Problem {
            at: format!("document {doc}"),
            field: "yaml".into(),
            message,
        }],
    };
    let mut docs = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        match Value::deserialize(doc) {
            Ok(Value::Null) => {}
            Ok(v) => docs.push(v),
            Err(e) => return Err(one(i + 1, e.to_string())),
        }
    }
    if docs.is_empty() {
        // sluice-core words this refusal; ask it, so both say the same.
        return sluice_core::rules::parse_yaml(text);
    }
    validate(&docs, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(rules: &str) -> String {
        format!("domain: api\nrequire_default: true\nrules:\n{rules}")
    }

    const LOGIN: &str = "  - { id: login, match: { route: POST /v1/login }, key: [ip], algorithm: fixed_window, limit: 10, window: 1m }\n";
    const ALL: &str =
        "  - { id: all, key: [ip], algorithm: fixed_window, limit: 1000, window: 1m }\n";

    #[test]
    fn a_domain_requiring_a_default_needs_a_catch_all() {
        let err = parse_yaml(&doc(LOGIN)).expect_err("no catch-all");
        assert_eq!(err.problems[0].field, "require_default");
        assert!(
            err.problems[0].message.contains("requires a default rule"),
            "{err}"
        );
        let set = parse_yaml(&doc(&format!("{LOGIN}{ALL}"))).expect("with one");
        assert_eq!(set.rule_count(), 2);
        // Without the setting, nothing changes.
        assert!(parse_yaml(&format!("domain: api\nrules:\n{LOGIN}")).is_ok());
    }

    #[test]
    fn off_partial_and_matching_rules_are_not_catch_alls() {
        let shadow = ALL.replace("limit: 1000", "limit: 1000, mode: shadow");
        assert!(
            parse_yaml(&doc(&shadow)).is_ok(),
            "the kill switch keeps a shadowed default"
        );
        for variant in [
            ALL.replace("limit: 1000", "limit: 1000, mode: off"),
            ALL.replace("limit: 1000", "limit: 1000, rollout_pct: 50"),
            ALL.replace("key: [ip]", "match: { ip: \"*\" }, key: [ip]"),
        ] {
            assert!(parse_yaml(&doc(&variant)).is_err(), "{variant}");
        }
        let bad = parse_yaml("domain: api\nrequire_default: yes please\nrules: []\n")
            .expect_err("not a bool");
        assert!(bad.problems[0].message.contains("true or false"), "{bad}");
    }

    #[test]
    fn settings_are_read_from_a_document() {
        let v: Value = serde_json::json!({"domain": "api", "require_default": true, "rules": []});
        assert_eq!(
            settings_of(&v),
            Some(serde_json::json!({"require_default": true}))
        );
        assert_eq!(settings_of(&serde_json::json!({"domain": "api"})), None);
    }
}
