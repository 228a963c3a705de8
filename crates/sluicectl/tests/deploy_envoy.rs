//! deploy/envoy/envoy.yaml against deploy/rules.yaml: the rate limit filter asks for the rules'
//! domain, every descriptor its actions can produce is one a shipped rule matches and keys on,
//! every rule is reached, and the filter's cluster is sluiced's default gRPC port. Envoy is not
//! run here; this keeps the file and the rules from drifting apart.

use serde::Deserialize as _;
use serde_json::Value;
use std::path::PathBuf;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let doc = serde_norway::Deserializer::from_str(&text)
        .next()
        .unwrap_or_else(|| panic!("{path}: empty"));
    Value::deserialize(doc).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every object in the tree for which `pick` is true.
fn find<'a>(v: &'a Value, pick: &dyn Fn(&Value) -> bool, out: &mut Vec<&'a Value>) {
    if pick(v) {
        out.push(v);
    }
    match v {
        Value::Object(m) => m.values().for_each(|c| find(c, pick, out)),
        Value::Array(a) => a.iter().for_each(|c| find(c, pick, out)),
        _ => {}
    }
}

/// One descriptor entry: its key and its value when fixed by the config (a header's is not).
type Entry = (String, Option<String>);

fn descriptor(actions: &Value) -> Vec<Entry> {
    let s = |v: &Value, k: &str| v[k].as_str().map(str::to_string);
    actions
        .as_array()
        .expect("actions is a list")
        .iter()
        .map(|a| {
            if let Some(g) = a.get("generic_key") {
                (
                    s(g, "descriptor_key").unwrap_or_else(|| "generic_key".into()),
                    Some(s(g, "descriptor_value").expect("generic_key has a value")),
                )
            } else if let Some(h) = a.get("request_headers") {
                (s(h, "descriptor_key").expect("descriptor_key"), None)
            } else if let Some(h) = a.get("header_value_match") {
                (
                    s(h, "descriptor_key").unwrap_or_else(|| "header_match".into()),
                    Some(s(h, "descriptor_value").expect("descriptor_value")),
                )
            } else if a.get("remote_address").is_some() {
                ("remote_address".into(), None)
            } else {
                panic!("an action this test does not know: {a}")
            }
        })
        .collect()
}

/// Whether `rule` applies to and counts a descriptor of `entries`.
fn applies(rule: &Value, entries: &[Entry]) -> bool {
    let value = |k: &str| entries.iter().find(|(ek, _)| ek == k).map(|(_, v)| v);
    let matched = rule["match"]
        .as_object()
        .map(|m| {
            m.iter().all(|(k, want)| match value(k) {
                None => false,
                Some(None) => true, // a header can carry any value
                Some(Some(v)) => want == "*" || want.as_str() == Some(v),
            })
        })
        .unwrap_or(true);
    let keyed = rule["key"]
        .as_array()
        .expect("rule key")
        .iter()
        .all(|k| k.as_str().is_some_and(|k| value(k).is_some()));
    matched && keyed
}

#[test]
fn envoy_asks_for_what_the_shipped_rules_key_on() {
    let envoy = yaml("deploy/envoy/envoy.yaml");
    let rules = yaml("deploy/rules.yaml");

    let mut filters = Vec::new();
    find(
        &envoy,
        &|v| v["name"] == "envoy.filters.http.ratelimit",
        &mut filters,
    );
    assert_eq!(filters.len(), 1, "one rate limit filter");
    let f = &filters[0]["typed_config"];
    assert_eq!(
        f["domain"], rules["domain"],
        "the filter's domain is the rules'"
    );
    assert_eq!(f["failure_mode_deny"], false);
    assert!(f["timeout"].is_string(), "a timeout is set");
    assert_eq!(f["rate_limit_service"]["transport_api_version"], "V3");
    let cluster = f["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .expect("the filter names a cluster");

    // The cluster is sluiced's default gRPC port, over HTTP/2.
    let config = std::fs::read_to_string(repo("crates/sluiced/src/config.rs")).expect("config.rs");
    let line = config
        .lines()
        .find(|l| l.trim_start().starts_with("grpc_addr: SocketAddr::from(("))
        .expect("sluiced's default grpc_addr");
    // `grpc_addr: SocketAddr::from(([127, 0, 0, 1], 8081)),`: the number before `))`.
    let port: u64 = line
        .split("))")
        .next()
        .and_then(|s| s.rsplit(',').next())
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("a port in {line:?}"));
    let mut clusters = Vec::new();
    find(
        &envoy,
        &|v| v["name"] == cluster && v.get("load_assignment").is_some(),
        &mut clusters,
    );
    assert_eq!(clusters.len(), 1, "cluster {cluster}");
    let mut ports = Vec::new();
    find(clusters[0], &|v| v.get("port_value").is_some(), &mut ports);
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["port_value"], port, "sluiced's default gRPC port");
    let mut h2 = Vec::new();
    find(
        clusters[0],
        &|v| v.get("http2_protocol_options").is_some(),
        &mut h2,
    );
    assert_eq!(h2.len(), 1, "gRPC needs HTTP/2 to sluiced");

    // Every descriptor is counted by a rule; every rule is reached by a descriptor.
    let mut limits = Vec::new();
    find(&envoy, &|v| v.get("rate_limits").is_some(), &mut limits);
    let descriptors: Vec<Vec<Entry>> = limits
        .iter()
        .flat_map(|v| v["rate_limits"].as_array().expect("rate_limits").iter())
        .map(|r| descriptor(&r["actions"]))
        .collect();
    assert!(descriptors.len() >= 4, "{descriptors:?}");
    let rules = rules["rules"].as_array().expect("rules");
    for d in &descriptors {
        assert!(
            rules.iter().any(|r| applies(r, d)),
            "no shipped rule counts the descriptor {d:?}"
        );
    }
    for r in rules {
        assert!(
            descriptors.iter().any(|d| applies(r, d)),
            "rule {} is reached by no descriptor of deploy/envoy/envoy.yaml",
            r["id"]
        );
    }
}
