//! Named stores in the rule format: `store:` on rules and overrides is validated, the plan
//! sends each store's rules in calls of their own, and a set naming a store a daemon lacks
//! is reported with the rule or override and the store.

use sluice_core::decision::plan;
use sluice_core::matching::Descriptors;
use sluice_core::rules::parse_yaml;
use sluice_core::stores;

const RULES: &str = r#"
domain: api
rules:
  - { id: burst, key: [api_key], algorithm: token_bucket, rate_per_s: 10, burst: 10 }
  - { id: daily, key: [api_key], algorithm: fixed_window, limit: 1000, window: 1d }
  - { id: tenant, key: [api_key], algorithm: fixed_window, limit: 50, window: 1m, store: eu_big }
overrides:
  - { identity: { api_key: k_big }, rule: burst, store: bigcorp }
  - { identity: { api_key: k_big }, rule: daily, store: bigcorp, limit: 5000 }
  - { identity: { api_key: k_home }, rule: tenant, store: default }
"#;

fn desc(key: &str) -> Descriptors {
    Descriptors::new(vec![("api_key".into(), key.into())]).expect("valid descriptors")
}

/// (store, rule ids) of each planned call for `key`.
fn calls(key: &str) -> Vec<(Option<String>, Vec<String>)> {
    let set = parse_yaml(RULES).expect("valid rules");
    let dom = set.domain("api").expect("domain");
    let p = plan(dom, &desc(key), 1_000_000, 1, "r-1", |_| Default::default());
    (0..p.calls.len())
        .map(|i| {
            let ids = p.calls[i]
                .rules
                .iter()
                .map(|&r| p.applied[r].rule.id.to_string())
                .collect();
            (p.store_of(i).map(str::to_string), ids)
        })
        .collect()
}

#[test]
fn a_plan_makes_one_call_per_identity_and_store() {
    let s = |n: &str| Some(n.to_string());
    let ids = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        calls("k_small"),
        [
            (None, ids(&["burst", "daily"])),
            (s("eu_big"), ids(&["tenant"]))
        ],
        "without an override each rule counts where it says"
    );
    assert_eq!(
        calls("k_big"),
        [
            (s("bigcorp"), ids(&["burst", "daily"])),
            (s("eu_big"), ids(&["tenant"]))
        ],
        "the overrides move k_big's burst and daily counts, together, to bigcorp"
    );
    assert_eq!(
        calls("k_home"),
        [(None, ids(&["burst", "daily", "tenant"]))],
        "store: default keeps k_home's tenant counts on the main store, in one call"
    );
}

#[test]
fn an_override_that_only_moves_counts_keeps_the_numbers() {
    let set = parse_yaml(RULES).expect("valid rules");
    let dom = set.domain("api").expect("domain");
    let p = plan(dom, &desc("k_big"), 1_000_000, 1, "r-1", |_| {
        Default::default()
    });
    let burst = p
        .applied
        .iter()
        .find(|a| &*a.rule.id == "burst")
        .expect("applied");
    assert_eq!(
        *burst.params, burst.rule.params,
        "a store-only override changes no number"
    );
    assert_eq!(
        burst.key, "sl:{api|api_key=k_big}:t:burst",
        "and no key: the same key, elsewhere"
    );
}

#[test]
fn bad_store_fields_are_refused_naming_the_rule_and_field() {
    let cases = [
        (
            "rules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 5, window: 1m, store: Big.Corp }",
            "r",
            "is not a store name",
        ),
        (
            "rules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 5, window: 1m, store: big, hot_keys: { lease: 5 } }",
            "r",
            "hot_keys.lease",
        ),
        (
            "rules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 5, window: 1m, store: big, hot_keys: { sync_interval: 1s } }",
            "r",
            "hot_keys.sync_interval",
        ),
        (
            "rules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 5, window: 1m }\noverrides:\n  - { identity: { k: a }, rule: r, exempt: true, store: big }",
            "overrides[0]",
            "an exemption counts nowhere",
        ),
        (
            "rules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 5, window: 1m }\noverrides:\n  - { identity: { k: a }, store: big }",
            "overrides[0]",
            "needs the rule",
        ),
        (
            "rules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 5, window: 1m, hot_keys: { lease: 5 } }\noverrides:\n  - { identity: { k: a }, rule: r, store: big }",
            "overrides[0]",
            "hot_keys.lease",
        ),
    ];
    for (rules, at, why) in cases {
        let text = format!("domain: api\n{rules}\n");
        let err = parse_yaml(&text).expect_err(rules);
        assert!(
            err.problems
                .iter()
                .any(|p| p.at == at && p.field == "store" && p.message.contains(why)),
            "{rules}: {err}"
        );
    }
    // The deny cache and sampling answer within the request: they go with a named store.
    parse_yaml("domain: api\nrules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 50, window: 1m, store: big, hot_keys: { sample: 2 } }\n")
        .expect("sampling goes with a named store");
}

#[test]
fn unknown_stores_are_named_with_their_rule_or_override() {
    let set = parse_yaml(RULES).expect("valid rules");
    let used: Vec<(String, &str)> = stores::uses(&set)
        .into_iter()
        .map(|u| (u.at, u.store))
        .collect();
    assert_eq!(
        used,
        [
            ("rule \"tenant\"".to_string(), "eu_big"),
            ("overrides[0] (rule \"burst\")".to_string(), "bigcorp"),
            ("overrides[1] (rule \"daily\")".to_string(), "bigcorp"),
        ],
        "store: default names no store"
    );
    assert!(stores::unknown(&set, |s| s == "eu_big" || s == "bigcorp").is_empty());
    let missing = stores::unknown(&set, |s| s == "eu_big");
    assert_eq!(
        missing,
        [
            "domain \"api\": overrides[0] (rule \"burst\") names store \"bigcorp\", which this daemon's config does not define (stores:)",
            "domain \"api\": overrides[1] (rule \"daily\") names store \"bigcorp\", which this daemon's config does not define (stores:)",
        ]
    );
}

#[test]
fn store_names_are_plain() {
    for ok in ["bigcorp", "eu-big_2", "a", &"x".repeat(64)] {
        assert!(stores::valid_name(ok), "{ok}");
    }
    for bad in ["", "BigCorp", "big.corp", "big corp", &"x".repeat(65)] {
        assert!(!stores::valid_name(bad), "{bad}");
    }
}

#[test]
fn the_documented_example_is_valid_and_routes_as_it_says() {
    let docs = include_str!("../../../docs/rules.md");
    let section = docs
        .split("## A store per tenant")
        .nth(1)
        .expect("docs/rules.md has the section");
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("an example");
    let set = parse_yaml(yaml).expect("the example is valid");
    let used: Vec<&str> = stores::uses(&set).iter().map(|u| u.store).collect();
    assert_eq!(used, ["partners", "bigcorp", "bigcorp"]);
    let dom = set.domain("public-api").expect("domain");
    let d = Descriptors::new(vec![("partner".into(), "p_local".into())]).expect("valid");
    let p = plan(dom, &d, 1_000_000, 1, "r-1", |_| Default::default());
    assert_eq!(
        (p.calls.len(), p.store_of(0)),
        (1, None),
        "p_local stays on the main store"
    );
}
