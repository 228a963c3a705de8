//! Fuzzing the rule parser and the request path with proptest: no input may panic, and every
//! refusal names where it is. Run longer with `PROPTEST_CASES=200000 cargo test -p sluice-core
//! --release --test fuzz_rules`.

use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_core::Remote;
use sluice_core::batch::apply;
use sluice_core::decision::{Answer, headers, plan, problem_json};
use sluice_core::matching::Descriptors;
use sluice_core::rules::{from_values, parse_yaml};

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (0u64..2_000_000_000).prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![
            Just("1s"),
            Just("1m"),
            Just("1d"),
            Just("1mo"),
            Just("0s"),
            Just("*"),
            Just("token_bucket"),
            Just("gcra"),
            Just("fixed_window"),
            Just("sliding_window"),
            Just("sliding_log"),
            Just("concurrency"),
            Just("enforce"),
            Just("shadow"),
            Just("off"),
            Just("global"),
            Just("Asia/Kolkata"),
            Just("retry_only"),
            Just("first_request"),
            Just("epoch"),
            Just("closed"),
            Just("api_key"),
            Just("10/1m"),
            Just("1/1d"),
            Just("7/1500ms"),
            Just("1000000000/366d"),
            Just("")
        ]
        .prop_map(|s| json!(s)),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("id"),
        Just("group"),
        Just("match"),
        Just("key"),
        Just("algorithm"),
        Just("rate_per_s"),
        Just("rate"),
        Just("burst"),
        Just("limit"),
        Just("window"),
        Just("timeout"),
        Just("calendar_tz"),
        Just("window_start"),
        Just("mode"),
        Just("on_store_failure"),
        Just("scope"),
        Just("rollout_pct"),
        Just("enforce_on"),
        Just("daemons"),
        Just("headers"),
        Just("charge_rejected"),
        Just("share_threshold"),
        Just("store"),
        Just("identity"),
        Just("rule"),
        Just("exempt"),
        Just("route"),
        Just("tier"),
        Just("api_key")
    ]
    .prop_map(String::from)
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(field(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn document() -> impl Strategy<Value = Value> {
    (
        scalar(),
        prop::collection::vec(value(), 0..4),
        prop::collection::vec(value(), 0..3),
    )
        .prop_map(|(domain, rules, overrides)| {
            json!({"domain": domain, "rules": rules, "overrides": overrides})
        })
}

/// Runs a request through plan → apply → decide → headers on fresh state.
fn serve(dom: &sluice_core::rules::Domain, d: &Descriptors, cost: u64) {
    let p = plan(dom, d, 1_700_000_000_000_000, cost, "req", |_| {
        Remote::default()
    });
    let answers: Vec<Answer> = p
        .calls
        .iter()
        .map(|c| {
            Answer::Done(
                apply(
                    &c.call,
                    &vec![None::<sluice_core::State>; c.call.items.len()],
                )
                .0,
            )
        })
        .collect();
    let dec = p.decide(1, &answers);
    let _ = headers(&dec);
    let _ = problem_json(&dec);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn yaml_text_never_panics(text in ".{0,200}") {
        let _ = parse_yaml(&text);
    }

    #[test]
    fn rule_documents_never_panic_and_refusals_say_where(doc in document()) {
        match from_values(&[doc], 1) {
            Ok(set) => {
                // The stored form (what the admin API and PostgreSQL keep) parses back to it.
                let docs: Vec<Value> = set.domains.values().map(|d| d.to_value()).collect();
                let again = from_values(&docs, set.version);
                prop_assert!(again.as_ref() == Ok(&set), "round trip: {again:?}");
                let d = Descriptors::new(vec![
                    ("api_key".into(), "k".into()),
                    ("route".into(), "r".into()),
                    ("tier".into(), "growth".into()),
                ]).expect("valid descriptors");
                for dom in set.domains.values() {
                    serve(dom, &d, 1);
                }
            }
            Err(e) => {
                prop_assert!(!e.problems.is_empty());
                for p in &e.problems {
                    prop_assert!(!p.at.is_empty() && !p.field.is_empty() && !p.message.is_empty(), "{p}");
                }
            }
        }
    }

    #[test]
    fn descriptors_and_costs_never_panic(
        pairs in prop::collection::vec((".{0,70}", ".{0,300}"), 0..40),
        cost in prop_oneof![Just(0u64), 1u64..5, 0u64..=sluice_core::algo::MAX_LIMIT],
    ) {
        let set = parse_yaml(
            "domain: d\nrules:\n  - { id: a, key: [k], algorithm: token_bucket, rate_per_s: 5, burst: 5 }\n  - { id: b, key: [k], algorithm: sliding_window, limit: 5, window: 1s }\n  - { id: c, algorithm: sliding_log, key: [], limit: 3, window: 1s }\n",
        ).expect("valid");
        let dom = set.domain("d").expect("domain");
        if let Ok(d) = Descriptors::new(pairs) {
            serve(dom, &d, cost);
        }
    }
}
