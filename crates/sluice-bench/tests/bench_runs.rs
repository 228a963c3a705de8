//! `sluice-bench` against a real `sluiced`: each API, both loops, bounded to a few hundred
//! requests and about a second, and the counts in its JSON report add up to what the rule
//! allows. (Throughput and latency are measured by running it, never asserted here.)

use serde_json::Value;
use sluice_testkit::SluicedOnRules;
use std::process::Command;

const RULES: &str = r#"
domain: bench
rules:
  - { id: per-user, key: [user], algorithm: fixed_window, limit: 100, window: 1h }
"#;

fn start() -> SluicedOnRules {
    SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)")
}

fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(args)
        .args(["--json", "--quiet", "--timeout-ms", "5000"])
        .output()
        .expect("run sluice-bench");
    assert!(
        out.status.success(),
        "sluice-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

#[test]
fn closed_loop_on_one_hot_key_admits_the_limit_on_every_api() {
    let r = start();
    // One thread, and two (each its own runtime with half the workers): the budget and the
    // counts are shared all the same. Each run its own hot key.
    for (api, addr, user, threads) in [
        ("grpc", r.grpc, "g", "1"),
        ("envoy", r.grpc, "e", "1"),
        ("http", r.http, "h", "1"),
        ("grpc", r.grpc, "g2-", "2"),
        ("envoy", r.grpc, "e2-", "2"),
        ("http", r.http, "h2-", "2"),
    ] {
        let v = bench(&[
            "--api",
            api,
            "--addr",
            &addr.to_string(),
            "--threads",
            threads,
            "--dist",
            "hot",
            "--key-prefix",
            user,
            "--requests",
            "300",
            "--concurrency",
            "4",
            "--warmup",
            "0",
            "--duration",
            "30",
        ]);
        let api = format!("{api} on {threads} thread(s)");
        assert_eq!(n(&v, "errors"), 0, "{api}: {v}");
        assert_eq!(n(&v, "allowed") + n(&v, "denied"), 300, "{api}: {v}");
        // 100 an hour; a run that straddles the hour may see two windows.
        let allowed = n(&v, "allowed");
        assert!(
            allowed == 100 || (allowed > 100 && allowed <= 200),
            "{api}: {v}"
        );
        let p50 = v["latency_us"]["p50"].as_f64().expect("p50");
        let max = v["latency_us"]["max"].as_f64().expect("max");
        assert!(p50 > 0.0 && p50 <= max, "{api}: {v}");
    }
}

#[test]
fn open_loop_sends_what_is_due_and_spreads_keys() {
    let r = start();
    let v = bench(&[
        "--api",
        "envoy",
        "--addr",
        &r.grpc.to_string(),
        "--rate",
        "300",
        "--duration",
        "1",
        "--warmup",
        "0",
        "--dist",
        "zipf",
        "--keys",
        "50",
        "--concurrency",
        "8",
    ]);
    assert_eq!(v["mode"], "open");
    assert_eq!(n(&v, "errors"), 0, "{v}");
    // 300 due in the second; all answered unless the machine stalled past the deadline.
    assert_eq!(
        n(&v, "allowed") + n(&v, "denied") + n(&v, "unsent"),
        300,
        "{v}"
    );
    assert!(
        n(&v, "allowed") >= 250,
        "50 keys × 100 an hour leave room for nearly all: {v}"
    );
}

#[test]
fn a_grpc_error_from_the_server_is_reported_with_its_status() {
    let r = start();
    // An empty domain is INVALID_ARGUMENT: no request answered, and the error says why.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args([
            "--api",
            "envoy",
            "--addr",
            &r.grpc.to_string(),
            "--domain",
            "",
        ])
        .args([
            "--requests",
            "5",
            "--concurrency",
            "1",
            "--warmup",
            "0",
            "--json",
            "--quiet",
        ])
        .output()
        .expect("run sluice-bench");
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(n(&v, "errors"), 5, "{v}");
    assert_eq!(n(&v, "allowed") + n(&v, "denied"), 0, "{v}");
    assert_eq!(v["first_error"], "grpc-status 3: domain is required", "{v}");
}
