//! deploy/grafana/sluice.json and deploy/prometheus/sluice-alerts.yaml against a running
//! daemon: every metric a panel or an alert queries is one a real `sluiced` (on Redis, with
//! gossip on) exports, by the name and type the query assumes. A renamed or dropped series
//! would otherwise leave a dashboard blank and an alert silent, and nobody would notice until
//! the outage it was meant to catch.

use serde_json::Value;
use sluice_testkit::{RedisServer, free_ports, http_get};
use sluice_tests::common;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

const RULES: &str = "domain: api\nrules:\n  - id: per-user\n    match: {}\n    key: [user]\n    algorithm: fixed_window\n    limit: 10\n    window: 1s\n";

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The metric names in a PromQL expression: identifiers starting `sluice_`.
fn names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("sluice_") {
        let start = i + at;
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        if start > 0 && word(b[start - 1]) {
            i = start + 1;
            continue;
        }
        let end = (start..b.len()).find(|&j| !word(b[j])).unwrap_or(b.len());
        out.push(expr[start..end].to_string());
        i = end;
    }
    out
}

/// Family name and type from the exposition's `# TYPE` lines.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (n, t) = l.split_once(' ')?;
            Some((n.to_string(), t.trim().to_string()))
        })
        .collect()
}

/// Whether `name` as written in a query is exported: a family itself, or a histogram's
/// `_bucket` / `_sum` / `_count` series.
fn exported(name: &str, fam: &BTreeMap<String, String>) -> Result<(), String> {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && let Some(t) = fam.get(base)
        {
            return if t == "histogram" {
                Ok(())
            } else {
                Err(format!("{name}: {base} is a {t}, not a histogram"))
            };
        }
    }
    match fam.get(name).map(String::as_str) {
        Some("histogram") => Err(format!("{name} is a histogram: query its _bucket series")),
        Some(_) => Ok(()),
        None => Err(format!("{name} is not exported")),
    }
}

/// Every `expr` string in a dashboard or rule file.
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                match (k.as_str(), c) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(c, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|c| exprs(c, out)),
        _ => {}
    }
}

fn dashboard() -> Value {
    serde_json::from_str(&read("deploy/grafana/sluice.json")).expect("the dashboard is JSON")
}

fn alerts() -> Value {
    serde_norway::from_str(&read("deploy/prometheus/sluice-alerts.yaml"))
        .expect("the alert rules are YAML")
}

#[test]
fn every_queried_metric_is_exported_by_a_running_daemon() {
    let _serial = common::serial();
    let redis = RedisServer::start().expect("redis-server (apt install redis-server)");
    let gossip = free_ports(1)[0];
    let node = common::node::start(
        &redis,
        RULES,
        &format!(
            "region: eu\ngossip: {{ addr: \"127.0.0.1:{gossip}\", cluster_id: deploy, key: \"a deploy test gossip key\" }}\n"
        ),
    );
    let text = http_get(node.http, "/metrics").expect("metrics").text();
    let fam = families(&text);
    let mut queries = Vec::new();
    exprs(&dashboard(), &mut queries);
    let from_dashboard = queries.len();
    exprs(&alerts(), &mut queries);
    assert!(from_dashboard >= 20, "dashboard queries: {from_dashboard}");
    assert!(queries.len() - from_dashboard >= 10, "alert rules");
    let mut used = BTreeSet::new();
    let mut wrong = Vec::new();
    for q in &queries {
        let ns = names(q);
        assert!(!ns.is_empty(), "a query on no sluice metric: {q}");
        for n in ns {
            if let Err(e) = exported(&n, &fam) {
                wrong.push(e);
            }
            used.insert(n);
        }
    }
    assert!(wrong.is_empty(), "not as exported: {wrong:#?}");
    // What the dashboards exist for: breakers, store latency, failure modes, rule versions
    // and refusals, gossip lag.
    for must in [
        "sluice_breaker_state",
        "sluice_store_duration_seconds_bucket",
        "sluice_decisions_total",
        "sluice_rules_version",
        "sluice_rules_refused_total",
        "sluice_gossip_lag_seconds_bucket",
    ] {
        assert!(used.contains(must), "nothing queries {must}");
    }
}

#[test]
fn the_files_are_well_formed() {
    let d = dashboard();
    assert_eq!(d["uid"], "sluice-overview");
    let panels = d["panels"].as_array().expect("panels");
    let ids: BTreeSet<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "every panel has a unique id");
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let refs: Vec<&str> = p["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .map(|t| t["refId"].as_str().expect("refId"))
            .collect();
        let unique: BTreeSet<&&str> = refs.iter().collect();
        assert_eq!(unique.len(), refs.len(), "{}: refIds repeat", p["title"]);
    }
    let rules = alerts()["groups"][0]["rules"]
        .as_array()
        .expect("one group of rules")
        .clone();
    let mut seen = BTreeSet::new();
    for r in &rules {
        let name = r["alert"].as_str().expect("every rule is an alert");
        assert!(seen.insert(name.to_string()), "{name} twice");
        assert!(
            ["page", "ticket"].contains(&r["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity page or ticket"
        );
        assert!(r["annotations"]["summary"].is_string(), "{name}: a summary");
    }
}

#[test]
fn names_are_read_from_queries() {
    assert_eq!(
        names("max(sluice_rules_version) - min(xsluice_a) + rate(sluice_x_bucket{a=\"b\"}[5m])"),
        ["sluice_rules_version", "sluice_x_bucket"]
    );
}
