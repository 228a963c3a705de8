//! Canary by daemon (`enforce_on`), end to end: two real `sluiced` processes on one rules
//! file, each with its own memory store. A rule enforced on the first daemon only refuses
//! over its limit there and only shadows on the second (admitted, the would-refusal counted
//! and reported); raised to 100% through the rules file, it refuses on both. Every wait is
//! for an event (the reloaded version, a counter), each with a bound that turns a hang into
//! a failure.

use serde_json::{Value, json};
use sluice_testkit::{Daemon, Metrics, TempDir, cargo_bin, free_ports, http_get, http_request};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Turns a hang into a failure; never an assertion on how long something took.
const HANG: Duration = Duration::from_secs(60);

fn rules(enforce_on: &str) -> String {
    format!(
        "domain: api\nrules:\n  - id: per-key\n    key: [api_key]\n    algorithm: fixed_window\n    limit: 2\n    window: 1h\n    enforce_on: {enforce_on}\n"
    )
}

struct Node {
    daemon: Daemon,
    http: SocketAddr,
    admin: SocketAddr,
}

fn start(dir: &Path, id: &str, rules: &Path) -> Node {
    let ports = free_ports(3);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let grpc: SocketAddr = ([127, 0, 0, 1], ports[1]).into();
    let admin: SocketAddr = ([127, 0, 0, 1], ports[2]).into();
    let config = dir.join(format!("{id}.yaml"));
    std::fs::write(
        &config,
        format!(
            "daemon_id: {id}\nhttp_addr: {http}\ngrpc_addr: {grpc}\nadmin_addr: {admin}\nrules: {}\nrules_poll_ms: 50\ndecision_log: {{ enabled: false }}\n",
            rules.display()
        ),
    )
    .expect("write config");
    let bin = cargo_bin("sluiced").expect("sluiced is built (cargo build --workspace --bins)");
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--config").arg(&config).env("RUST_LOG", "info");
    let mut daemon = Daemon::from_command(cmd).expect("spawn sluiced");
    daemon
        .wait_http_ok(http, "/healthz", HANG)
        .expect("sluiced becomes healthy");
    Node {
        daemon,
        http,
        admin,
    }
}

fn check(n: &Node, api_key: &str) -> (u16, Value) {
    let body = json!({"domain": "api", "descriptors": {"api_key": api_key}}).to_string();
    let r = http_request(n.http, "POST", "/v1/limits:check", &[], body.as_bytes())
        .expect("check request");
    let v = serde_json::from_str(&r.text()).expect("JSON answer");
    (r.status, v)
}

/// What `n` reports for the rule in its own status: `(mode, canary_shadowed)`.
fn placement(n: &Node) -> (String, bool) {
    let r = http_get(n.admin, "/v1/rules:status").expect("status");
    let v: Value = serde_json::from_str(&r.text()).expect("JSON status");
    let rule = v["this_daemon"]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["rule"] == "per-key")
        .unwrap_or_else(|| panic!("per-key in the status: {v}"))
        .clone();
    (
        rule["mode"].as_str().unwrap_or("").to_string(),
        rule["canary_shadowed"] == true,
    )
}

/// Three checks of one key against a limit of 2: the answers' `allowed`, and what the third
/// said.
fn three(n: &Node, key: &str) -> (Vec<bool>, Value) {
    let mut allowed = Vec::new();
    let mut last = Value::Null;
    for _ in 0..3 {
        let (status, v) = check(n, key);
        assert_eq!(status, 200, "{v}");
        allowed.push(v["allowed"] == true);
        last = v;
    }
    (allowed, last)
}

fn wait_version(n: &Node, version: u64) {
    let deadline = Instant::now() + HANG;
    loop {
        let r = http_get(n.http, "/healthz").expect("healthz");
        let v: Value = serde_json::from_str(&r.text()).expect("JSON health");
        if v["rules_version"].as_u64() >= Some(version) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "version {version} not served: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn shadow_denied(n: &Node) -> u64 {
    Metrics::scrape(n.http).expect("metrics").count_or_zero(
        "sluice_decisions_total{domain=\"api\",rule=\"per-key\",outcome=\"shadow_denied\"}",
    )
}

fn enforced_gauge(n: &Node) -> u64 {
    Metrics::scrape(n.http)
        .expect("metrics")
        .count("sluice_rule_enforced{domain=\"api\",rule=\"per-key\"}")
}

#[test]
fn a_rule_enforced_on_one_daemon_shadows_on_the_other_until_raised_to_100() {
    let dir = TempDir::new("canary").expect("temp dir");
    let file: PathBuf = dir.path().join("rules.yaml");
    std::fs::write(&file, rules("{daemons: [canary-1]}")).expect("write rules");
    let one = start(dir.path(), "canary-1", &file);
    let two = start(dir.path(), "canary-2", &file);

    // The canary refuses over the limit.
    let (allowed, third) = three(&one, "k1");
    assert_eq!(allowed, [true, true, false], "{third}");
    assert_eq!(third["decided_by"], "per-key", "{third}");
    assert_eq!(placement(&one), ("enforce".into(), false));
    assert_eq!(enforced_gauge(&one), 1);
    assert_eq!(shadow_denied(&one), 0);

    // The other daemon admits, and counts and reports the would-refusal.
    let (allowed, third) = three(&two, "k1");
    assert_eq!(allowed, [true, true, true], "{third}");
    assert_eq!(third["shadow_denied"], json!(["per-key"]), "{third}");
    assert_eq!(shadow_denied(&two), 1);
    assert_eq!(placement(&two), ("shadow".into(), true));
    assert_eq!(enforced_gauge(&two), 0);

    // Raised to every daemon through the rules file: both refuse.
    std::fs::write(&file, rules("{daemons: 100%}")).expect("write rules");
    wait_version(&one, 1);
    wait_version(&two, 1);
    for n in [&one, &two] {
        let (allowed, third) = three(n, "k2");
        assert_eq!(allowed, [true, true, false], "{third}");
        assert_eq!(third["decided_by"], "per-key", "{third}");
        assert_eq!(placement(n), ("enforce".into(), false));
        assert_eq!(enforced_gauge(n), 1);
    }
    assert_eq!(shadow_denied(&two), 1, "no would-refusal once enforced");
    drop(one.daemon);
    drop(two.daemon);
}

#[test]
fn a_share_enforces_on_the_daemons_the_core_picks() {
    // Ids on both sides of 50% for this rule, found with the core's own function: each
    // daemon computes the same answer from the rule id and its own id.
    let ids: Vec<String> = (0..)
        .map(|i| format!("share-{i}"))
        .take(64)
        .collect::<Vec<_>>();
    let inside = ids
        .iter()
        .find(|d| sluice_core::canary::enforces("per-key", d, 50))
        .expect("a daemon inside 50%");
    let outside = ids
        .iter()
        .find(|d| !sluice_core::canary::enforces("per-key", d, 50))
        .expect("a daemon outside 50%");
    let dir = TempDir::new("canary-share").expect("temp dir");
    let file: PathBuf = dir.path().join("rules.yaml");
    std::fs::write(&file, rules("{daemons: 50%}")).expect("write rules");
    let a = start(dir.path(), inside, &file);
    let b = start(dir.path(), outside, &file);
    assert_eq!(three(&a, "k").0, [true, true, false]);
    assert_eq!(placement(&a), ("enforce".into(), false));
    assert_eq!(three(&b, "k").0, [true, true, true]);
    assert_eq!(placement(&b), ("shadow".into(), true));
    assert_eq!(shadow_denied(&b), 1);
}
