//! One override validated against its domain's rules into an [`Override`]: the numbers it
//! may replace are the ones its rule's algorithm takes (`rules::ALGORITHMS`).

use super::{AlgorithmFields, Fields, Override, Problem, Rule};
use crate::algo::{MAX_LIMIT, Params, Rate};
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
    let store = f.string("store", false);
    let limit = f.count("limit", MAX_LIMIT);
    let rate_per_s = f.count("rate_per_s", MAX_LIMIT);
    let rate_text = f.rate("rate");
    let burst = f.count("burst", MAX_LIMIT);
    if rate_per_s.is_some() && rate_text.is_some() {
        f.bad("rate", "give rate or rate_per_s, not both");
    }
    let rate = rate_text.or(rate_per_s.map(Rate::per_second));
    let numbers = limit.is_some() || rate.is_some() || burst.is_some();
    let target = rule_id
        .as_deref()
        .and_then(|id| rules.iter().find(|r| &*r.id == id));
    if let Some(id) = &rule_id
        && target.is_none()
    {
        f.bad("rule", format!("no rule {id:?} in this domain"));
    }
    if let Some(s) = &store {
        if let Some(m) = crate::stores::name_problem(s) {
            f.bad("store", m);
        } else if exempt {
            f.bad("store", "an exemption counts nowhere: it takes no store");
        } else if rule_id.is_none() {
            f.bad(
                "store",
                "moving counts to a store needs the rule whose counts move",
            );
        } else if let Some(what) = target
            .filter(|_| s != crate::stores::DEFAULT)
            .and_then(|r| crate::stores::hot_keys_conflict(&r.hot_keys))
        {
            f.bad("store", crate::stores::hot_keys_message(what));
        }
    }
    if exempt && numbers {
        f.bad("exempt", "an exemption carries no numbers");
    } else if !exempt && !numbers && store.is_none() {
        f.bad(
            "exempt",
            "an override needs exempt: true, new numbers (limit, rate or rate_per_s, burst) or a store",
        );
    } else if numbers {
        match target {
            None if rule_id.is_none() => f.bad("rule", "new numbers need the rule they replace"),
            Some(r) if matches!(r.params, Params::FairShare(_)) => f.bad(
                "rule",
                format!(
                    "rule {} has a fair_share: its rate and burst are the parent's, shared by every tenant, so one identity cannot change them (give the tenant a larger share instead)",
                    r.id
                ),
            ),
            Some(r) => {
                let fields = AlgorithmFields::of(r.params.kind());
                let given = [
                    ("limit", limit.is_some()),
                    ("rate_per_s", rate_per_s.is_some()),
                    ("rate", rate_text.is_some()),
                    ("burst", burst.is_some()),
                ];
                // The numbers this rule's algorithm takes, the ones an override may replace.
                let takes: Vec<&str> = given
                    .iter()
                    .map(|(n, _)| *n)
                    .filter(|n| fields.takes(n))
                    .collect();
                for (field, present) in given {
                    if present && !fields.takes(field) {
                        f.bad(
                            field,
                            format!(
                                "rule {} is a {} (use {})",
                                r.id,
                                fields.name(),
                                takes.join(", ")
                            ),
                        );
                    }
                }
                let split = r.hot_keys.split;
                let ours = Override {
                    identity: BTreeMap::new(),
                    rule: None,
                    exempt: false,
                    limit,
                    rate,
                    burst,
                    store: None,
                    source: Value::Null,
                };
                // New numbers at the rule's rate (or the rule's burst at a new rate) must stay
                // in the exact range the rule's own do.
                if let Params::TokenBucket { rate, burst } | Params::Gcra { rate, burst } =
                    ours.apply(&r.params)
                    && let Err(e) = rate.fits(burst)
                {
                    f.bad("burst", e.to_string());
                }
                if split > 1
                    && let Some(problem) =
                        crate::hotkeys::config::split_leaves_zero(&ours.apply(&r.params), split)
                {
                    f.bad(
                        takes.first().copied().unwrap_or("limit"),
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
        rate,
        burst,
        store: store.map(|s| Arc::from(s.as_str())),
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

    #[test]
    fn each_number_the_rule_does_not_take_is_named() {
        let bad = r#"
domain: api
rules:
  - { id: w, key: [k], algorithm: fixed_window, limit: 5, window: 1m }
  - { id: b, key: [k], algorithm: gcra, rate_per_s: 5, burst: 5 }
overrides:
  - { identity: { k: a }, rule: w, burst: 3 }
  - { identity: { k: b }, rule: w, rate_per_s: 3, burst: 3 }
  - { identity: { k: c }, rule: b, limit: 3 }
"#;
        let err = parse_yaml(bad).expect_err("invalid");
        let got: Vec<String> = err.problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "overrides[0]: burst: rule w is a fixed_window (use limit)",
                "overrides[1]: rate_per_s: rule w is a fixed_window (use limit)",
                "overrides[1]: burst: rule w is a fixed_window (use limit)",
                "overrides[2]: limit: rule b is a gcra (use rate_per_s, rate, burst)",
            ]
        );
    }

    #[test]
    fn an_override_may_give_a_rate_over_any_period() {
        let doc = |o: &str| {
            format!(
                "domain: api\nrules:\n  - {{ id: b, key: [k], algorithm: token_bucket, rate_per_s: 5, burst: 5 }}\noverrides:\n  - {{ identity: {{ k: a }}, rule: b, {o} }}\n"
            )
        };
        let set = parse_yaml(&doc("rate: 10/1m")).expect("valid");
        let o = &set.domain("api").expect("domain").overrides[0];
        assert_eq!(
            o.rate,
            crate::algo::Rate::new(10, 60 * crate::time::SECOND).ok()
        );
        for (bad, field, why) in [
            ("rate: 10/1m, rate_per_s: 3", "rate", "not both"),
            ("rate: 10 per minute", "rate", "expected a rate like 10/1m"),
            ("rate: 1/1d, burst: 1000000", "burst", "above 2^53"),
        ] {
            let err = parse_yaml(&doc(bad)).expect_err(bad);
            assert!(
                err.problems
                    .iter()
                    .any(|p| p.field == field && p.message.contains(why)),
                "{bad}: {err}"
            );
        }
    }
}
