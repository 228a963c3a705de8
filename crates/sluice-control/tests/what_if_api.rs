//! `POST /v1/rules:what-if` over a daemon whose rules come from a YAML file, with a decision
//! log handed in as records: the report, one read only in part, and the errors for a bad
//! candidate, a bad window and an unreadable log.

use anyhow::Result;
use serde_json::{Value, json};
use sluice_control::Published;
use sluice_control::admin::{
    AdminConfig, AdminState, DecisionSource, LogWindow, router, what_if_routes,
};
use sluice_core::Micros;
use sluice_core::rules::parse_yaml;
use sluice_testkit::http_request;
use std::sync::Arc;

const RULES: &str = "domain: api\nrules:\n  - { id: per-user, key: [user], algorithm: token_bucket, rate: 1000/1h, burst: 1000 }\n";

/// 40 records of one user a second apart, ending now, each but the first standing for 10
/// checks (the sampler keeps an identity's first check, so its first record stands alone).
#[derive(Debug)]
struct Log {
    fail: bool,
    partial: bool,
}

impl DecisionSource for Log {
    fn window(&self, since: Option<Micros>, _: Option<Micros>) -> Result<LogWindow, String> {
        if self.fail {
            return Err("disk on fire".into());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_micros() as Micros;
        let first = now - 40_000_000;
        assert!(since.is_some_and(|s| s < first), "the last hour by default");
        let records = (0..40u64)
            .map(|i| {
                json!({"v": 1, "ts": first + i * 1_000_000, "domain": "api",
                       "identity": "api|user=heavy", "request_id": format!("r{i}"), "cost": 1,
                       "code": "OK", "rules_version": 1, "descriptors": {"user": "heavy"},
                       "rules": [{"id": "per-user", "mode": "enforce", "outcome": "allowed",
                                  "identity": "api|user=heavy"}],
                       "weight": if i == 0 { 1 } else { 10 }, "counts_in": "eu"})
            })
            .collect();
        Ok(LogWindow {
            records,
            partial: self
                .partial
                .then(|| "only part of the log was read".to_string()),
        })
    }
}

fn candidate(rule: &str) -> Vec<u8> {
    let doc =
        json!({"domain": "api", "rules": [serde_json::from_str::<Value>(rule).expect("rule")]});
    json!({"domains": [doc]}).to_string().into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_if_reports_and_refuses_bad_input_clearly() -> Result<()> {
    let mut set = parse_yaml(RULES)?;
    set.version = 3;
    let published = Published::new(set);
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for (fail, partial) in [(false, false), (true, false), (false, true)] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addrs.push(listener.local_addr()?);
        let state = AdminState::read_only(published.clone(), AdminConfig::default());
        let app =
            router(state.clone()).merge(what_if_routes(&state, Arc::new(Log { fail, partial })));
        servers.push(tokio::spawn(
            async move { axum::serve(listener, app).await },
        ));
    }
    let call = |i: usize, body: Vec<u8>| {
        let addr = addrs[i];
        tokio::task::spawn_blocking(move || {
            http_request(
                addr,
                "POST",
                "/v1/rules:what-if",
                &[("content-type", "application/json")],
                &body,
            )
        })
    };
    let tight = r#"{"id": "per-user", "key": ["user"], "algorithm": "token_bucket", "rate": "100/1h", "burst": 100}"#;
    let r = call(0, candidate(tight)).await??;
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["current_version"], 3);
    assert_eq!(v["checks"], 391);
    assert_eq!(v["stores"], json!(["eu"]));
    let rule = &v["rules"][0];
    assert_eq!(rule["change"], "changed");
    assert_eq!(rule["current"]["refused"], 0);
    let heavy = rule["candidate"]["refused_by"][0]["refused"]
        .as_u64()
        .unwrap_or(0);
    // 391 checks in 40 s against a burst of 100 (one token back every 36 s).
    assert!((290..=291).contains(&heavy), "{v}");
    assert!(
        v["note"]
            .as_str()
            .unwrap_or("")
            .contains("40 records standing for 391 checks")
    );

    let broken = tight.replace("token_bucket", "leaky_bucket");
    let r = call(0, candidate(&broken)).await??;
    assert_eq!(r.status, 422, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["error"]["code"], "INVALID_RULES");
    assert!(v["error"]["problems"][0]["field"].is_string(), "{v}");

    let mut body: Value = serde_json::from_slice(&candidate(tight))?;
    body["since"] = json!("yesterday");
    let r = call(0, body.to_string().into_bytes()).await??;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("since:"), "{}", r.text());
    let r = call(0, b"{}".to_vec()).await??;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("domains"), "{}", r.text());

    let r = call(1, candidate(tight)).await??;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("disk on fire"), "{}", r.text());
    // A log read only in part says so, in the note and on its own.
    let r = call(2, candidate(tight)).await??;
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["partial"], "only part of the log was read");
    assert!(
        v["note"]
            .as_str()
            .unwrap_or("")
            .ends_with("; only part of the log was read"),
        "{v}"
    );
    for s in servers {
        s.abort();
    }
    Ok(())
}
