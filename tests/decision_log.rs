//! The decision log end to end: a real `sluiced` keeps its checks on disk, the admin API
//! serves them back newest first behind the read token, and a credential sent as a
//! descriptor never reaches the files.

use serde_json::{Value, json};
use sluice_testkit::{Daemon, Metrics, TempDir, cargo_bin, free_ports, http_request};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Turns a hang into a failure; never an assertion on how long something took.
const HANG: Duration = Duration::from_secs(60);

const RULES: &str = r#"
domain: api
rules:
  - id: per-token
    match: { route: "GET /orders" }
    key: [authorization]
    algorithm: fixed_window
    limit: 2
    window: 1h
  - id: per-user
    key: [user]
    algorithm: fixed_window
    limit: 3
    window: 1h
    mode: shadow
"#;

const SECRET: &str = "Bearer hunter2-do-not-log";
const COOKIE: &str = "session=s3cret-cookie";

/// The check's code (the JSON API answers 200 with the decision in the body).
fn check(http: SocketAddr) -> String {
    let req = json!({"domain": "api", "descriptors": {
        "route": "GET /orders",
        "authorization": SECRET,
        "cookie": COOKIE,
        "user": "alice",
        "unused": "not-a-rule-field",
    }});
    let r = http_request(
        http,
        "POST",
        "/v1/limits:check",
        &[("content-type", "application/json")],
        req.to_string().as_bytes(),
    )
    .expect("check");
    let v: Value = serde_json::from_slice(&r.body).expect("json");
    v["code"].as_str().unwrap_or_default().to_string()
}

fn decisions(admin: SocketAddr, query: &str, token: Option<&str>) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    let r = http_request(
        admin,
        "GET",
        &format!("/v1/decisions{query}"),
        &headers,
        b"",
    )
    .expect("GET /v1/decisions");
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

#[test]
fn checks_are_logged_served_newest_first_and_hold_no_credential() {
    let ports = free_ports(3);
    let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let (http, grpc, admin) = (addr(ports[0]), addr(ports[1]), addr(ports[2]));
    let dir = TempDir::new("decision-log").expect("temp dir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let log_dir = dir.path().join("decisions");
    let config = dir.path().join("sluiced.yaml");
    std::fs::write(
        &config,
        format!("decision_log:\n  dir: {}\n", log_dir.display()),
    )
    .expect("config");
    let (h, g, a) = (http.to_string(), grpc.to_string(), admin.to_string());
    let args = [
        "--config",
        config.to_str().expect("utf-8"),
        "--rules",
        rules.to_str().expect("utf-8"),
        "--http-addr",
        &h,
        "--grpc-addr",
        &g,
        "--admin-addr",
        &a,
    ];
    let bin = cargo_bin("sluiced").expect("sluiced is built (cargo build --workspace --bins)");
    let mut daemon = Daemon::spawn(
        bin,
        &args,
        &[
            ("RUST_LOG", "warn"),
            ("SLUICE_ADMIN_TOKEN", "the-admin-token"),
            ("SLUICE_READ_TOKEN", "the-read-token"),
        ],
    )
    .expect("start sluiced");
    daemon
        .wait_http_ok(http, "/healthz", Duration::from_secs(30))
        .expect("healthy");

    // Two allowed, then three refused by the per-token window; the shadow rule would refuse
    // the fourth and fifth.
    let codes: Vec<String> = (0..5).map(|_| check(http)).collect();
    assert_eq!(
        codes,
        ["OK", "OK", "OVER_LIMIT", "OVER_LIMIT", "OVER_LIMIT"]
    );

    // The writer flushes when its queue is empty: wait for its counter, not a time.
    let start = Instant::now();
    while Metrics::scrape(http)
        .expect("metrics")
        .count_or_zero("sluice_decision_log_written_total")
        < 5
    {
        assert!(start.elapsed() < HANG, "the log never wrote 5 records");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Reads need a token, the read token is enough.
    assert_eq!(decisions(admin, "", None).0, 401);
    let (status, v) = decisions(admin, "?rule=per-token&limit=10", Some("the-read-token"));
    assert_eq!(status, 200, "{v}");
    let got = v["decisions"].as_array().expect("decisions").clone();
    assert_eq!(got.len(), 5, "{v}");
    let ts: Vec<u64> = got.iter().map(|r| r["ts"].as_u64().expect("ts")).collect();
    assert!(ts.windows(2).all(|w| w[0] >= w[1]), "newest first: {ts:?}");
    let codes: Vec<&str> = got
        .iter()
        .map(|r| r["code"].as_str().expect("code"))
        .collect();
    assert_eq!(
        codes,
        ["OVER_LIMIT", "OVER_LIMIT", "OVER_LIMIT", "OK", "OK"]
    );
    let newest = &got[0];
    assert_eq!(newest["v"], 1);
    assert_eq!(newest["domain"], "api");
    assert_eq!(newest["descriptors"]["user"], "alice");
    assert_eq!(newest["descriptors"]["route"], "GET /orders");
    assert!(
        newest["descriptors"].get("unused").is_none()
            && newest["descriptors"].get("cookie").is_none(),
        "only the fields rules use: {newest}"
    );
    let outcome = |r: &Value, id: &str| {
        r["rules"]
            .as_array()
            .and_then(|rs| rs.iter().find(|x| x["id"] == id))
            .map(|x| (x["mode"].clone(), x["outcome"].clone()))
    };
    assert_eq!(
        outcome(newest, "per-token"),
        Some((json!("enforce"), json!("refused")))
    );
    assert_eq!(
        outcome(newest, "per-user"),
        Some((json!("shadow"), json!("would_refuse")))
    );
    assert_eq!(
        outcome(&got[4], "per-token"),
        Some((json!("enforce"), json!("allowed")))
    );

    // Filters: by identity (the user's), since, limit.
    let (_, v) = decisions(
        admin,
        "?identity=api%7Cuser%3Dalice&limit=2",
        Some("the-read-token"),
    );
    assert_eq!(v["count"], 2, "{v}");
    let (_, v) = decisions(
        admin,
        &format!("?since={}", ts[0] + 1),
        Some("the-read-token"),
    );
    assert_eq!(v["count"], 0, "{v}");
    assert_eq!(decisions(admin, "?limit=0", Some("the-read-token")).0, 400);

    // Nothing on disk holds the credential, the cookie or the unused field.
    let mut text = String::new();
    for e in std::fs::read_dir(&log_dir).expect("log dir") {
        let path = e.expect("entry").path();
        text.push_str(&std::fs::read_to_string(&path).expect("read a log file"));
    }
    assert_eq!(text.lines().count(), 5, "{text}");
    for secret in ["hunter2", SECRET, "s3cret", "not-a-rule-field"] {
        assert!(!text.contains(secret), "{secret:?} in the log: {text}");
    }
    assert!(text.contains("redacted:"), "{text}");
    daemon
        .terminate(Duration::from_secs(10))
        .expect("stops on SIGTERM");
}
