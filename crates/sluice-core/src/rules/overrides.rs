//! One override validated against its domain's rules into an [`Override`].

use super::{Fields, Override, Problem, Rule};
use crate::algo::{MAX_LIMIT, Params};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

pub(super) fn override_(
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
    use crate::rules::parse_yaml;

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
}
