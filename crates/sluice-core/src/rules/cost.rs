//! A rule's `cost`: how many units one request takes from it, by route or method (any
//! descriptor), multiplying the cost the caller asked for. An export that costs the backend
//! 25 times a read counts 25 times against the same quota, without every caller knowing it.

use super::Fields;
use crate::algo::MAX_LIMIT;
use serde_json::Value;

/// A rule's cost factor for a request: `values[descriptor]`, else `default`.
pub type Cost = crate::pick::ByValue;

/// The units a request takes from a rule: the caller's `cost` times the rule's factor, or
/// `None` past [`MAX_LIMIT`] (the largest number a rule holds, and far below what wraps or
/// what the store's Lua counts exactly).
pub fn scaled(cost: u64, factor: u64) -> Option<u64> {
    cost.checked_mul(factor).filter(|&c| c <= MAX_LIMIT)
}

/// Reads a rule's `cost`: a whole number (the factor of every request), or
/// `{by: <descriptor>, values: {<value>: N, ...}, default: N}` (`default` 1 when left out).
pub(super) fn cost(
    f: &mut Fields<'_>,
    v: Option<&Value>,
    valid_name: impl Fn(&str) -> bool,
) -> Option<Cost> {
    let factor = |f: &mut Fields<'_>, what: &str, v: &Value| -> Option<u64> {
        match v.as_u64() {
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Some(n),
            _ => {
                f.bad(
                    "cost",
                    format!("{what} must be a whole number from 1 to {MAX_LIMIT}, got {v}"),
                );
                None
            }
        }
    };
    match v? {
        n @ Value::Number(_) => factor(f, "a cost", n).map(|n| Cost {
            by: None,
            values: Vec::new(),
            default: n,
        }),
        Value::Object(m) => {
            let mut out = Cost {
                by: None,
                values: Vec::new(),
                default: 1,
            };
            let mut ok = true;
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("by", Value::String(s)) if valid_name(s) => out.by = Some(s.clone()),
                    ("by", other) => {
                        f.bad("cost", format!("by must be a descriptor name, got {other}"));
                        ok = false;
                    }
                    ("default", v) => match factor(f, "default", v) {
                        Some(n) => out.default = n,
                        None => ok = false,
                    },
                    ("values", Value::Object(vals)) if !vals.is_empty() => {
                        for (value, n) in vals {
                            match factor(f, &format!("the cost of {value:?}"), n) {
                                Some(n) => out.values.push((value.clone(), n)),
                                None => ok = false,
                            }
                        }
                    }
                    ("values", other) => {
                        f.bad(
                            "cost",
                            format!(
                                "values must be a mapping of descriptor value to cost, got {other}"
                            ),
                        );
                        ok = false;
                    }
                    (other, _) => {
                        f.bad(
                            "cost",
                            format!("unknown field {other:?} (expected by, values, default)"),
                        );
                        ok = false;
                    }
                }
            }
            match (&out.by, out.values.is_empty()) {
                (None, false) => {
                    f.bad(
                        "cost",
                        "values need by: the descriptor whose value they are",
                    );
                    ok = false;
                }
                (Some(_), true) if ok => {
                    f.bad("cost", "by needs values: {<value>: <cost>, ...}");
                    ok = false;
                }
                _ => {}
            }
            ok.then_some(out)
        }
        other => {
            f.bad(
                "cost",
                format!("expected a whole number or {{by: <descriptor>, values: {{...}}, default: N}}, got {other}"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::parse_yaml;
    use proptest::prelude::*;

    fn rule_with(cost: &str) -> Result<crate::rules::Rule, String> {
        parse_yaml(&format!(
            "domain: d\nrules:\n  - {{ id: r, key: [api_key], algorithm: fixed_window, limit: 100, window: 1m, cost: {cost} }}\n"
        ))
        .map(|s| s.domain("d").expect("domain").rules[0].clone())
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_cost_table_picks_by_the_descriptor() {
        let r = rule_with(
            r#"{ by: route, values: { "GET /v1/export": 25, "POST /v1/bulk": 10 }, default: 2 }"#,
        )
        .expect("valid");
        let c = r.cost.expect("a cost");
        assert_eq!(c.by.as_deref(), Some("route"));
        assert_eq!(c.pick(Some("GET /v1/export")), 25);
        assert_eq!(c.pick(Some("GET /v1/other")), 2);
        assert_eq!(c.pick(None), 2);
        assert_eq!(c.max(), 25);
        let one = rule_with("{ by: method, values: { POST: 3 } }").expect("valid");
        assert_eq!(one.cost.expect("a cost").default, 1, "default is 1");
        let flat = rule_with("4").expect("valid").cost.expect("a cost");
        assert_eq!(
            (flat.by.clone(), flat.pick(Some("x")), flat.pick(None)),
            (None, 4, 4)
        );
        assert_eq!(rule_with("null").expect("valid").cost, None);
    }

    #[test]
    fn bad_costs_are_named() {
        for (bad, why) in [
            ("0", "from 1 to"),
            ("-1", "from 1 to"),
            ("1.5", "from 1 to"),
            ("1000000001", "from 1 to"),
            ("x", "expected a whole number"),
            ("{ values: { a: 2 } }", "values need by"),
            ("{ by: route }", "by needs values"),
            ("{ by: route, values: {} }", "values must be a mapping"),
            ("{ by: route, values: { a: 0 } }", "the cost of \"a\""),
            (
                "{ by: \"a b\", values: { a: 2 } }",
                "by must be a descriptor name",
            ),
            (
                "{ by: route, values: { a: 2 }, default: 0 }",
                "default must be",
            ),
            (
                "{ by: route, values: { a: 2 }, per: 3 }",
                "unknown field \"per\"",
            ),
        ] {
            let err = rule_with(bad).expect_err(bad);
            assert!(
                err.contains("r: cost: ") && err.contains(why),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_store_call_asks_for_the_cost_times_the_factor() {
        use crate::Remote;
        use crate::decision::plan;
        use crate::matching::desc;
        let set = parse_yaml(
            r#"
domain: d
rules:
  - { id: reads, key: [api_key], algorithm: fixed_window, limit: 1000, window: 1m }
  - { id: units, key: [api_key], algorithm: fixed_window, limit: 1000, window: 1d, cost: { by: route, values: { "GET /v1/export": 25 } } }
  - { id: methods, key: [api_key], algorithm: token_bucket, rate_per_s: 10, burst: 100, cost: { by: method, values: { POST: 3 }, default: 1 } }
"#,
        )
        .expect("valid");
        let dom = set.domain("d").expect("domain");
        let calls = |route: &str, method: &str, cost: u64| -> Vec<(u64, Vec<String>)> {
            let d = desc(&[("api_key", "k"), ("route", route), ("method", method)]);
            plan(dom, &d, 0, cost, "r", |_| Remote::default())
                .calls
                .iter()
                .map(|pc| {
                    let ids = pc.rules.iter().map(|&i| format!("{}", i)).collect();
                    (pc.call.cost, ids)
                })
                .collect()
        };
        // Every rule asks the same: one call, checked and taken together.
        assert_eq!(
            calls("GET /v1/users", "GET", 2),
            [(2, vec!["0".into(), "1".into(), "2".into()])]
        );
        // The export costs 25 in its rule, POST 3 in its: a call per cost.
        assert_eq!(
            calls("GET /v1/export", "GET", 2),
            [(2, vec!["0".into(), "2".into()]), (50, vec!["1".into()])]
        );
        assert_eq!(
            calls("POST /v1/export", "POST", 1),
            [(1, vec!["0".into(), "1".into()]), (3, vec!["2".into()])]
        );
        // A peek stays a peek.
        assert_eq!(
            calls("GET /v1/export", "GET", 0),
            [(0, vec!["0".into(), "1".into(), "2".into()])]
        );
        // Past the largest limit a caller that did not check is capped, never wrapped.
        assert_eq!(calls("GET /v1/export", "GET", u64::MAX)[1].0, MAX_LIMIT);
    }

    proptest! {
        #[test]
        fn scaled_is_the_product_or_none_past_the_largest_limit(cost in any::<u64>(), factor in any::<u64>()) {
            let exact = u128::from(cost) * u128::from(factor);
            match scaled(cost, factor) {
                Some(c) => prop_assert_eq!(u128::from(c), exact),
                None => prop_assert!(exact > u128::from(MAX_LIMIT)),
            }
        }
    }
}
