//! What-if end to end: two real `sluiced` daemons on one PostgreSQL and one Redis (one
//! region), loaded with a few seconds of traffic by three identities at known rates. A
//! candidate that tightens the rule 10× gets a report from both daemons' decision logs
//! (`sluicectl apply --what-if --decisions A --decisions B`) naming the identities it would
//! refuse, with counts; then it is applied and the same traffic sent again, and the report's
//! per-identity refusals are compared with the refusals the daemons actually answered.
//!
//! The bucket refills one token in 36 s, so what a 4 s run admits does not depend on timing:
//! the actual refusals are 400 − 100 and 150 − 100 (one more admitted at most). The report
//! is an estimate from sampled records (4 a second per identity kept, with weights), and
//! misses what each identity sent after its last kept record on each daemon: at most a
//! quarter second of its traffic there. So the bound asserted is 10% of an identity's
//! checks (plus 2). Without the weights the report would see about 40 of the heavy
//! identity's 400 checks and predict no refusal at all.
//!
//! Needs the daemon built: `cargo build -p sluiced`.

use serde_json::Value;
use sluice_testkit::{Daemon, Postgres, RedisServer, cargo_bin, free_ports, http_request};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const RULES: &str = "domain: api\nrules:\n  - { id: per-user, key: [user], algorithm: token_bucket, rate: 1000/1h, burst: 1000 }\n";

/// (identity, checks it sends in the run).
const LOAD: [(&str, u64); 3] = [("light", 50), ("mid", 150), ("heavy", 400)];

struct Node {
    http: SocketAddr,
    admin: SocketAddr,
    daemon: Daemon,
}

fn start(dir: &Path, n: usize, pg: &Postgres, redis: &RedisServer) -> Result<Node> {
    let ports = free_ports(3);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let admin: SocketAddr = ([127, 0, 0, 1], ports[2]).into();
    let config = format!(
        "postgres: {url}\nhttp_addr: {http}\ngrpc_addr: 127.0.0.1:{grpc}\nadmin_addr: {admin}\n\
         region: e2e\ndaemon_id: d{n}\nstore:\n  kind: redis\n  url: {redis}\n\
         decision_log:\n  dir: {log}\n  sample:\n    per_identity: 4/1s\n    per_identity_burst: 4\n",
        url = pg.url(),
        grpc = ports[1],
        redis = redis.url(),
        log = dir.join(format!("decisions-{n}")).display(),
    );
    let path = dir.join(format!("sluiced-{n}.yaml"));
    std::fs::write(&path, config)?;
    let arg = path.to_string_lossy().into_owned();
    let mut daemon = Daemon::spawn(
        cargo_bin("sluiced")?,
        &["--config", &arg],
        &[("RUST_LOG", "info")],
    )?;
    daemon.wait_http_ok(http, "/healthz", Duration::from_secs(30))?;
    Ok(Node {
        http,
        admin,
        daemon,
    })
}

fn ctl(admin: SocketAddr, args: &[&str]) -> Result<(bool, String, String)> {
    let server = format!("http://{admin}");
    let mut all = vec!["--server", server.as_str()];
    all.extend_from_slice(args);
    let mut d = Daemon::spawn(cargo_bin("sluicectl")?, &all, &[("SLUICE_ACTOR", "e2e")])?;
    let status = d.wait(Duration::from_secs(60))?;
    Ok((status.success(), d.stdout(), d.stderr()))
}

fn rules_version(http: SocketAddr) -> Result<u64> {
    let r = sluice_testkit::http_get(http, "/healthz")?;
    let v: Value = serde_json::from_slice(&r.body)?;
    Ok(v["rules_version"].as_u64().unwrap_or(0))
}

fn wait_version(nodes: &[Node], version: u64) -> Result<()> {
    let start = Instant::now();
    for n in nodes {
        while rules_version(n.http)? < version {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "version {version} never served"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

/// Four seconds of traffic, 200 rounds 20 ms apart: `heavy` twice a round, `mid` three
/// rounds in four, `light` one in four; requests alternate between the daemons. Returns the
/// refusals each identity got.
fn load(nodes: &[Node], suffix: &str) -> Result<BTreeMap<String, u64>> {
    let mut refused = BTreeMap::new();
    let mut sent = 0usize;
    let t0 = Instant::now();
    for round in 0..200u32 {
        let at = t0 + Duration::from_millis(20) * round;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let mut who = vec!["heavy", "heavy"];
        if round % 4 != 3 {
            who.push("mid");
        }
        if round % 4 == 0 {
            who.push("light");
        }
        for user in who {
            let name = format!("{user}{suffix}");
            let body = format!(r#"{{"domain":"api","descriptors":{{"user":"{name}"}},"cost":1}}"#);
            let node = &nodes[sent % nodes.len()];
            sent += 1;
            let r = http_request(
                node.http,
                "POST",
                "/v1/limits:check",
                &[("content-type", "application/json")],
                body.as_bytes(),
            )?;
            let v: Value = serde_json::from_slice(&r.body)?;
            let allowed = v["allowed"]
                .as_bool()
                .ok_or_else(|| format!("no verdict in {v}"))?;
            *refused.entry(user.to_string()).or_insert(0) += u64::from(!allowed);
        }
    }
    assert_eq!(sent, 600);
    Ok(refused)
}

/// Waits until both logs hold every record written (the writer flushes when its queue is
/// empty): the number of records stops changing between two reads 200 ms apart, within 10 s.
fn settled_records(nodes: &[Node]) -> Result<()> {
    let count = |n: &Node| -> Result<u64> {
        let r = sluice_testkit::http_get(n.admin, "/v1/decisions?since=1h&limit=1000")?;
        let v: Value = serde_json::from_slice(&r.body)?;
        Ok(v["count"].as_u64().unwrap_or(0))
    };
    let start = Instant::now();
    let mut last = (u64::MAX, u64::MAX);
    loop {
        let now = (count(&nodes[0])?, count(&nodes[1])?);
        if now == last && now.0 > 0 && now.1 > 0 {
            return Ok(());
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "logs never settled"
        );
        last = now;
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_what_if_report_predicts_what_a_10x_tightening_refuses() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let redis = RedisServer::start()
        .map_err(|e| format!("redis-server is needed (apt-get install redis-server): {e}"))?;
    let dir = std::env::temp_dir().join(format!("sluice-what-if-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut nodes = vec![start(&dir, 1, &pg, &redis)?, start(&dir, 2, &pg, &redis)?];
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES)?;
    let tight = dir.join("tight.yaml");
    std::fs::write(
        &tight,
        RULES.replace("rate: 1000/1h, burst: 1000", "rate: 100/1h, burst: 100"),
    )?;
    let broken = dir.join("broken.yaml");
    std::fs::write(&broken, RULES.replace("token_bucket", "leaky_bucket"))?;
    let (rules, tight, broken) = (
        rules.to_string_lossy().into_owned(),
        tight.to_string_lossy().into_owned(),
        broken.to_string_lossy().into_owned(),
    );
    let admin = nodes[0].admin;
    let (d1, d2) = (
        format!("http://{}", nodes[0].admin),
        format!("http://{}", nodes[1].admin),
    );

    let (ok, _, err) = ctl(admin, &["apply", "-f", &rules])?;
    assert!(ok, "{err}");
    wait_version(&nodes, 1)?;
    let (ok, out, _) = ctl(admin, &["apply", "-f", &tight, "--what-if"])?;
    assert!(ok && out.contains("no decision log records"), "{out}");

    let before = load(&nodes, "-1")?;
    assert_eq!(
        before.values().sum::<u64>(),
        0,
        "nothing refused at 1000/1h"
    );
    settled_records(&nodes)?;

    let fleet = ["--decisions", d1.as_str(), "--decisions", d2.as_str()];
    let mut args = vec!["-o", "json", "apply", "-f", &tight, "--what-if"];
    args.extend(fleet);
    let (ok, out, err) = ctl(admin, &args)?;
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&out)?;
    let rule = report["rules"]
        .as_array()
        .and_then(|r| r.iter().find(|x| x["rule"] == "per-user"))
        .ok_or("per-user in the report")?;
    assert_eq!(rule["change"], "changed");
    assert_eq!(rule["current"]["refused"], 0);
    assert_eq!(report["stores"], serde_json::json!(["e2e"]));
    // What each identity sent after its last kept record is missing: at most a quarter
    // second of its traffic per daemon (4 records a second kept), about 40 checks here.
    let checks = report["checks"].as_u64().unwrap_or(0);
    assert!((530..=600).contains(&checks), "{checks} checks: {report}");
    let predicted: BTreeMap<String, u64> = rule["candidate"]["refused_by"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let id = c["identity"].as_str()?.strip_prefix("api|user=")?;
            Some((id.strip_suffix("-1")?.to_string(), c["refused"].as_u64()?))
        })
        .collect();
    assert!(!predicted.contains_key("light"), "{predicted:?}");

    // The server alone answers from its own log: its half of the fleet's records.
    let (ok, out, err) = ctl(admin, &["-o", "json", "apply", "-f", &tight, "--what-if"])?;
    assert!(ok, "{err}");
    let own: Value = serde_json::from_str(&out)?;
    let (mine, all) = (own["records"].as_u64(), report["records"].as_u64());
    assert!(
        mine.zip(all).is_some_and(|(m, a)| m > 0 && m < a),
        "one daemon's {mine:?} of the fleet's {all:?} records"
    );
    assert_eq!(own["daemon"], "d1");

    // The table says it too, and a bad candidate gets apply's own error.
    let mut args = vec!["apply", "-f", &tight, "--what-if"];
    args.extend(fleet);
    let (ok, table, _) = ctl(admin, &args)?;
    println!("{table}");
    assert!(ok && table.contains("api|user=heavy-1  refused"), "{table}");
    assert!(table.contains("standing for"), "{table}");
    let (ok, _, err) = ctl(admin, &["apply", "-f", &broken, "--what-if"])?;
    assert!(!ok && err.contains("422 INVALID_RULES"), "{err}");
    let (_, _, apply_err) = ctl(admin, &["apply", "-f", &broken])?;
    assert_eq!(err, apply_err, "the same error as apply");

    let (ok, _, err) = ctl(admin, &["apply", "-f", &tight])?;
    assert!(ok, "{err}");
    wait_version(&nodes, 2)?;
    let actual = load(&nodes, "-2")?;
    println!(
        "what-if: predicted {predicted:?}, actual {actual:?}, report {}",
        report["note"]
    );
    for (user, checks) in LOAD {
        let p = predicted.get(user).copied().unwrap_or(0);
        let a = actual.get(user).copied().unwrap_or(0);
        assert!(
            p.abs_diff(a) <= checks / 10 + 2,
            "{user}: predicted {p}, actually refused {a} of {checks}"
        );
    }
    assert_eq!(actual.get("light").copied().unwrap_or(0), 0);
    for n in &mut nodes {
        n.daemon.terminate(Duration::from_secs(10))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A daemon serving a rules file on the memory store (no PostgreSQL), at the default
/// sampling: the fleet path
/// validates the candidate itself (the server has no apply) and replays the daemon's log as
/// that daemon's own store; the server's endpoint answers too; a bad candidate is refused
/// with the field named.
#[test]
fn a_file_source_daemon_on_the_memory_store() -> Result<()> {
    let port = free_ports(1)[0];
    let admin = format!("127.0.0.1:{port}");
    let node =
        sluice_testkit::sluiced::SluicedOnRules::start_with_args(RULES, &["--admin-addr", &admin])?;
    let user = format!("solo-{}", std::process::id());
    // 300 checks over about 3 s: the default sampling keeps one a second (after a burst of
    // 5), so what came in the last second after the last kept record is in no weight.
    for _ in 0..300 {
        std::thread::sleep(Duration::from_millis(10));
        let body = format!(r#"{{"domain":"api","descriptors":{{"user":"{user}"}},"cost":1}}"#);
        let r = http_request(
            node.http,
            "POST",
            "/v1/limits:check",
            &[("content-type", "application/json")],
            body.as_bytes(),
        )?;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let admin: SocketAddr = admin.parse()?;
    let identity = format!("api|user={user}");
    let path = format!("/v1/decisions?identity=api%7Cuser%3D{user}&limit=1000");
    let start = Instant::now();
    let mut last = 0;
    loop {
        let r = sluice_testkit::http_get(admin, &path)?;
        let v: Value = serde_json::from_slice(&r.body)?;
        let n = v["count"].as_u64().unwrap_or(0);
        if n > 0 && n == last {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no records");
        last = n;
        std::thread::sleep(Duration::from_millis(200));
    }
    let dir = std::env::temp_dir().join(format!("sluice-what-if-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let tight = dir.join("tight.yaml");
    std::fs::write(
        &tight,
        RULES.replace("rate: 1000/1h, burst: 1000", "rate: 100/1h, burst: 100"),
    )?;
    let broken = dir.join("broken.yaml");
    std::fs::write(&broken, RULES.replace("token_bucket", "leaky_bucket"))?;
    let (tight, broken) = (
        tight.to_string_lossy().into_owned(),
        broken.to_string_lossy().into_owned(),
    );
    let url = format!("http://{admin}");
    for fleet in [true, false] {
        let mut args = vec!["-o", "json", "apply", "-f", &tight, "--what-if"];
        if fleet {
            args.extend(["--decisions", url.as_str()]);
        }
        let (ok, out, err) = ctl(admin, &args)?;
        assert!(ok, "{err}");
        let report: Value = serde_json::from_str(&out)?;
        assert!(
            report["stores"].as_array().is_some_and(|s| s
                .iter()
                .all(|x| x.as_str().is_some_and(|x| x.starts_with("daemon:")))),
            "{report}"
        );
        let refused = report["rules"][0]["candidate"]["refused_by"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["identity"] == identity.as_str())
            .and_then(|c| c["refused"].as_u64())
            .unwrap_or(0);
        // 300 checks against a burst of 100 refuse 200, less what came after the last kept
        // record (at most a second's worth, about 100).
        assert!(
            (90..=200).contains(&refused),
            "fleet {fleet}: {refused}: {report}"
        );
    }
    let (ok, _, err) = ctl(
        admin,
        &["apply", "-f", &broken, "--what-if", "--decisions", &url],
    )?;
    assert!(!ok && err.contains("leaky_bucket"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    drop(node);
    Ok(())
}
