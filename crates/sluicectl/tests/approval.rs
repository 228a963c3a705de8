//! A second approver end to end: a real `sluiced` whose config names two principals
//! (`admin_tokens` with token files), driven by the real `sluicectl` as each of them. A
//! forced 100× tightening is held, its proposer cannot approve it, the other principal can,
//! and the daemon then enforces it; the history names both.
//!
//! Needs the daemon built: `cargo build -p sluiced`.

use sluice_testkit::{Daemon, Postgres, cargo_bin, free_ports, http_request};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const RULES: &str = "domain: public-api\nrules:\n  - { id: login, match: { route: \"POST /v1/login\" }, key: [ip], algorithm: sliding_window, limit: 100, window: 1m }\n";

/// Runs `sluicectl` as the holder of `token`; returns (success, stdout, stderr).
fn ctl(admin: SocketAddr, token: &str, args: &[&str]) -> Result<(bool, String, String)> {
    let server = format!("http://{admin}");
    let mut all = vec!["--server", server.as_str()];
    all.extend_from_slice(args);
    let mut d = Daemon::spawn(
        cargo_bin("sluicectl")?,
        &all,
        &[("SLUICE_ADMIN_TOKEN", token), ("SLUICE_ACTOR", "e2e")],
    )?;
    let status = d.wait(Duration::from_secs(30))?;
    Ok((status.success(), d.stdout(), d.stderr()))
}

fn rules_version(http: SocketAddr) -> Result<u64> {
    let r = sluice_testkit::http_get(http, "/healthz")?;
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    Ok(v["rules_version"].as_u64().unwrap_or(0))
}

#[test]
fn a_held_tightening_is_applied_by_the_second_principal() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let dir = std::env::temp_dir().join(format!("sluice-approval-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    for (who, secret) in [("alice", "alice-e2e-secret"), ("bob", "bob-e2e-secret")] {
        std::fs::write(dir.join(who), format!("{secret}\n"))?;
    }
    let ports = free_ports(3);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let admin: SocketAddr = ([127, 0, 0, 1], ports[2]).into();
    let config = format!(
        "postgres: {url}\nhttp_addr: {http}\ngrpc_addr: 127.0.0.1:{grpc}\nadmin_addr: {admin}\n\
         region: e2e\nadmin_tokens:\n  - {{principal: alice, token_file: {a}}}\n  - {{principal: bob, token_file: {b}}}\n\
         decision_log:\n  dir: {log}\n",
        url = pg.url(),
        log = dir.join("decisions").display(),
        grpc = ports[1],
        a = dir.join("alice").display(),
        b = dir.join("bob").display(),
    );
    let config_path = dir.join("sluiced.yaml");
    std::fs::write(&config_path, config)?;
    let config_arg = config_path.to_string_lossy().into_owned();
    let mut daemon = Daemon::spawn(
        cargo_bin("sluiced")?,
        &["--config", &config_arg],
        &[("RUST_LOG", "info")],
    )?;
    daemon.wait_http_ok(http, "/healthz", Duration::from_secs(30))?;
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES)?;
    let tight = dir.join("tight.yaml");
    std::fs::write(&tight, RULES.replace("limit: 100", "limit: 1"))?;
    let (rules, tight) = (
        rules.to_string_lossy().into_owned(),
        tight.to_string_lossy().into_owned(),
    );

    let (ok, _, err) = ctl(admin, "alice-e2e-secret", &["apply", "-f", &rules])?;
    assert!(ok, "{err}");
    let (ok, out, err) = ctl(
        admin,
        "alice-e2e-secret",
        &["apply", "-f", &tight, "--force"],
    )?;
    assert!(ok, "{err}");
    assert!(
        out.contains("held as pending change 1 (proposed by alice"),
        "{out}"
    );
    // The hold shows the what-if report: no traffic yet, so it says the window is empty.
    assert!(
        out.contains("what-if: no decision log records in the window"),
        "{out}"
    );
    let (ok, out, _) = ctl(admin, "bob-e2e-secret", &["pending"])?;
    assert!(
        ok && out.contains("limit: 100 → 1") && out.contains("100×"),
        "{out}"
    );
    let (ok, out, _) = ctl(admin, "bob-e2e-secret", &["pending", "--what-if"])?;
    assert!(
        ok && out.contains("what-if: no decision log records"),
        "{out}"
    );

    let (ok, _, err) = ctl(admin, "alice-e2e-secret", &["approve", "1"])?;
    assert!(!ok);
    assert!(
        err.contains("403 PERMISSION_DENIED")
            && err.contains("a different principal must approve it"),
        "{err}"
    );
    let (ok, out, err) = ctl(admin, "bob-e2e-secret", &["approve", "1"])?;
    assert!(ok, "{err}");
    assert!(
        out.contains("version 2 (was 1)") && out.contains("approved by bob"),
        "{out}"
    );

    let start = Instant::now();
    while rules_version(http)? < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "version 2 never served"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let body = r#"{"domain":"public-api","descriptors":{"route":"POST /v1/login","ip":"1.2.3.4"},"cost":1}"#;
    let mut allowed = 0;
    for _ in 0..3 {
        let r = http_request(
            http,
            "POST",
            "/v1/limits:check",
            &[("content-type", "application/json")],
            body.as_bytes(),
        )?;
        let v: serde_json::Value = serde_json::from_slice(&r.body)?;
        allowed += usize::from(v["allowed"].as_bool() == Some(true));
    }
    assert_eq!(allowed, 1, "the approved limit of 1 is enforced");
    let (ok, out, _) = ctl(admin, "bob-e2e-secret", &["history"])?;
    assert!(ok && out.contains("alice + bob"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
