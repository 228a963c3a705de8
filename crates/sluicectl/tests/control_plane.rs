//! The control plane end to end: real `sluiced` processes on a real PostgreSQL, driven by the
//! real `sluicectl`. Every daemon gets its own throwaway database on the shared server
//! (127.0.0.1:5432); outages are made with a `TcpProxy` between daemon and PostgreSQL.
//!
//! Needs the daemon built: `cargo build -p sluiced` (cargo test only builds this package's
//! binaries).

use serde_json::{Value, json};
use sluice_testkit::{Daemon, Postgres, TcpProxy, cargo_bin, free_ports, http_request};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const TOKEN: &str = "e2e-admin-token";

const RULES: &str = r#"
domain: public-api
rules:
  - id: login
    match: { route: "POST /v1/login" }
    key: [ip]
    algorithm: sliding_window
    limit: 100
    window: 1m
  - id: burst
    key: [api_key]
    algorithm: token_bucket
    rate_per_s: 50
    burst: 100
"#;

struct Sluiced {
    daemon: Daemon,
    http: SocketAddr,
    admin: SocketAddr,
}

struct Opts<'a> {
    id: &'a str,
    url: String,
    listen_url: Option<String>,
    poll_s: u64,
    cache: PathBuf,
}

fn spawn(o: &Opts<'_>) -> Result<Sluiced> {
    let ports = free_ports(3);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let grpc: SocketAddr = ([127, 0, 0, 1], ports[1]).into();
    let admin: SocketAddr = ([127, 0, 0, 1], ports[2]).into();
    let mut args: Vec<String> = vec![
        "--postgres".into(),
        o.url.clone(),
        "--http-addr".into(),
        http.to_string(),
        "--grpc-addr".into(),
        grpc.to_string(),
        "--admin-addr".into(),
        admin.to_string(),
        "--daemon-id".into(),
        o.id.into(),
        "--region".into(),
        "e2e".into(),
        "--rules-cache".into(),
        o.cache.to_string_lossy().into_owned(),
        "--poll-s".into(),
        o.poll_s.to_string(),
    ];
    if let Some(l) = &o.listen_url {
        args.push("--postgres-listen".into());
        args.push(l.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let bin = cargo_bin("sluiced")?;
    let mut daemon = Daemon::spawn(
        bin,
        &args,
        &[("RUST_LOG", "info"), ("SLUICE_ADMIN_TOKEN", TOKEN)],
    )?;
    daemon.wait_http_ok(http, "/healthz", Duration::from_secs(30))?;
    Ok(Sluiced {
        daemon,
        http,
        admin,
    })
}

fn temp_dir(name: &str) -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("sluice-ctl-e2e-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// The rules version a daemon serves (from `/healthz`).
fn served(http: SocketAddr) -> Result<u64> {
    let r = sluice_testkit::http_get(http, "/healthz")?;
    let v: Value = serde_json::from_slice(&r.body)?;
    v["rules_version"]
        .as_u64()
        .ok_or_else(|| format!("no rules_version in {v}").into())
}

fn check(http: SocketAddr, descriptors: Value) -> Result<Value> {
    let body = json!({"domain": "public-api", "descriptors": descriptors, "cost": 1});
    let r = http_request(
        http,
        "POST",
        "/v1/limits:check",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )?;
    Ok(serde_json::from_slice(&r.body)?)
}

/// How many of `n` login attempts from one IP are allowed.
fn logins_allowed(http: SocketAddr, ip: &str, n: usize) -> Result<usize> {
    let mut ok = 0;
    for _ in 0..n {
        let v = check(http, json!({"route": "POST /v1/login", "ip": ip}))?;
        if v["allowed"].as_bool() == Some(true) {
            ok += 1;
        }
    }
    Ok(ok)
}

/// Runs `sluicectl` against `admin`; returns (success, stdout, stderr).
fn ctl(admin: SocketAddr, args: &[&str]) -> Result<(bool, String, String)> {
    let server = format!("http://{admin}");
    let mut all = vec!["--server", server.as_str()];
    all.extend_from_slice(args);
    let mut d = Daemon::spawn(
        cargo_bin("sluicectl")?,
        &all,
        &[("SLUICE_ADMIN_TOKEN", TOKEN), ("SLUICE_ACTOR", "e2e")],
    )?;
    let status = d.wait(Duration::from_secs(30))?;
    Ok((status.success(), d.stdout(), d.stderr()))
}

fn ctl_ok(admin: SocketAddr, args: &[&str]) -> Result<String> {
    let (ok, out, err) = ctl(admin, args)?;
    if !ok {
        return Err(format!("sluicectl {args:?} failed:\n{out}\n{err}").into());
    }
    Ok(out)
}

fn ctl_json(admin: SocketAddr, args: &[&str]) -> Result<Value> {
    let mut a = vec!["-o", "json"];
    a.extend_from_slice(args);
    Ok(serde_json::from_str(&ctl_ok(admin, &a)?)?)
}

/// An admin write over HTTP (the fast path for timing), returning the new version.
fn admin_write(admin: SocketAddr, method: &str, path: &str, body: &Value) -> Result<u64> {
    let auth = format!("Bearer {TOKEN}");
    let r = http_request(
        admin,
        method,
        path,
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
        body.to_string().as_bytes(),
    )?;
    let v: Value = serde_json::from_slice(&r.body)?;
    if r.status != 200 {
        return Err(format!("{method} {path}: {} {v}", r.status).into());
    }
    v["version"]
        .as_u64()
        .ok_or_else(|| format!("no version in {v}").into())
}

/// Waits until every daemon serves `version`; returns when each got there.
fn wait_all(https: &[SocketAddr], version: u64, within: Duration) -> Result<Vec<Duration>> {
    let start = Instant::now();
    let mut got: Vec<Option<Duration>> = vec![None; https.len()];
    while got.iter().any(Option::is_none) {
        for (i, h) in https.iter().enumerate() {
            if got[i].is_none() && served(*h)? >= version {
                got[i] = Some(start.elapsed());
            }
        }
        if start.elapsed() > within {
            return Err(
                format!("version {version} not everywhere within {within:?}: {got:?}").into(),
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(got.into_iter().flatten().collect())
}

fn write_rules(dir: &Path, name: &str, text: &str) -> Result<String> {
    let p = dir.join(name);
    std::fs::write(&p, text)?;
    Ok(p.to_string_lossy().into_owned())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
fn three_daemons_follow_changes_by_push_in_under_a_second() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let dir = temp_dir("push")?;
    let daemons: Vec<Sluiced> = (1..=3)
        .map(|i| {
            spawn(&Opts {
                id: &format!("d{i}"),
                url: pg.url(),
                listen_url: None,
                poll_s: 30,
                cache: dir.join(format!("cache-{i}.json")),
            })
        })
        .collect::<Result<_>>()?;
    let https: Vec<SocketAddr> = daemons.iter().map(|d| d.http).collect();
    let admin = daemons[0].admin;

    // sluicectl apply shows the diff and applies it as version 1.
    let file = write_rules(&dir, "rules.yaml", RULES)?;
    let out = ctl_ok(admin, &["apply", "-f", &file])?;
    assert!(out.contains("+ rule public-api/login"), "{out}");
    assert!(out.contains("applied: version 1"), "{out}");
    wait_all(&https, 1, Duration::from_secs(1))?;

    // Push latency: 20 changes, each timed from the admin's answer to each daemon serving it.
    let mut lat = Vec::new();
    for i in 1..=20u64 {
        let body = json!({"match": {"route": "POST /v1/login"}, "key": ["ip"],
                          "algorithm": "sliding_window", "limit": 100 - i, "window": "1m"});
        let v = admin_write(admin, "PUT", "/v1/rules/login", &body)?;
        lat.extend(wait_all(&https, v, Duration::from_secs(1))?);
    }
    lat.sort();
    eprintln!(
        "push latency over {} daemon-changes: p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.9),
        percentile(&lat, 0.99),
        lat[lat.len() - 1]
    );
    assert!(lat[lat.len() - 1] < Duration::from_secs(1));

    // The attack: login from 100 down to 10 a minute, live everywhere at once.
    let tighten = write_rules(
        &dir,
        "tight.yaml",
        &RULES.replace("limit: 100", "limit: 10"),
    )?;
    let out = ctl_ok(admin, &["apply", "-f", &tighten])?;
    assert!(out.contains("limit: 80 → 10"), "{out}");
    let v = ctl_json(admin, &["get", "login"])?["version"]
        .as_u64()
        .ok_or("version")?;
    wait_all(&https, v, Duration::from_secs(1))?;
    for h in &https {
        assert_eq!(
            logins_allowed(*h, &format!("ip-{h}"), 12)?,
            10,
            "daemon {h}"
        );
    }

    // status: every daemon at the current version.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let st = ctl_json(admin, &["status"])?;
        let daemons = st["daemons"].as_array().cloned().unwrap_or_default();
        if daemons.len() == 3 && daemons.iter().all(|d| d["version"].as_u64() == Some(v)) {
            break;
        }
        assert!(Instant::now() < deadline, "status never converged: {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let table = ctl_ok(admin, &["status"])?;
    assert!(
        table.contains(&format!("version {v}: 3 of 3 daemons current")),
        "{table}"
    );
    Ok(())
}

#[test]
fn bad_changes_are_refused_and_rollback_restores_the_old_numbers() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let dir = temp_dir("rollback")?;
    let d = spawn(&Opts {
        id: "solo",
        url: pg.url(),
        listen_url: None,
        poll_s: 30,
        cache: dir.join("cache.json"),
    })?;
    let file = write_rules(&dir, "rules.yaml", RULES)?;
    ctl_ok(d.admin, &["apply", "-f", &file])?;
    wait_all(&[d.http], 1, Duration::from_secs(1))?;

    // Invalid: refused with the rule and the field named; nothing changes anywhere.
    let bad = write_rules(
        &dir,
        "bad.yaml",
        &RULES.replace("algorithm: token_bucket", "algorithm: leaky_bucket"),
    )?;
    let (ok, _, err) = ctl(d.admin, &["apply", "-f", &bad])?;
    assert!(!ok);
    assert!(err.contains("INVALID_RULES"), "{err}");
    assert!(err.contains("burst: algorithm: unknown algorithm"), "{err}");
    // Too tight without --force: refused, saying how to force it.
    let typo = write_rules(&dir, "typo.yaml", &RULES.replace("limit: 100", "limit: 1"))?;
    let (ok, _, err) = ctl(d.admin, &["apply", "-f", &typo])?;
    assert!(!ok);
    assert!(
        err.contains("TIGHTENING_REFUSED") && err.contains("100×"),
        "{err}"
    );
    assert_eq!(ctl_json(d.admin, &["status"])?["version"], 1);
    assert_eq!(served(d.http)?, 1);

    // Tighten to 10 (allowed), then roll back to version 1: 100 again, as version 3.
    let tight = write_rules(
        &dir,
        "tight.yaml",
        &RULES.replace("limit: 100", "limit: 10"),
    )?;
    ctl_ok(d.admin, &["apply", "-f", &tight])?;
    wait_all(&[d.http], 2, Duration::from_secs(1))?;
    assert_eq!(logins_allowed(d.http, "10.1.1.1", 15)?, 10);
    let out = ctl_ok(d.admin, &["rollback", "--to", "1"])?;
    assert!(out.contains("limit: 10 → 100"), "{out}");
    assert!(out.contains("version 3 (was 2)"), "{out}");
    wait_all(&[d.http], 3, Duration::from_secs(1))?;
    assert_eq!(logins_allowed(d.http, "10.2.2.2", 15)?, 15);
    let hist = ctl_ok(d.admin, &["history", "login"])?;
    assert!(hist.contains("rollback"), "{hist}");
    assert!(hist.contains("e2e"), "the actor is recorded: {hist}");
    Ok(())
}

#[test]
fn shadow_records_would_denies_and_rejects_nobody() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let dir = temp_dir("shadow")?;
    let d = spawn(&Opts {
        id: "shadow",
        url: pg.url(),
        listen_url: None,
        poll_s: 30,
        cache: dir.join("cache.json"),
    })?;
    let file = write_rules(&dir, "rules.yaml", &RULES.replace("limit: 100", "limit: 3"))?;
    ctl_ok(d.admin, &["apply", "-f", &file, "--force"])?;
    ctl_ok(d.admin, &["shadow", "login"])?;
    wait_all(&[d.http], 2, Duration::from_secs(1))?;
    let mut would = 0;
    for _ in 0..6 {
        let v = check(d.http, json!({"route": "POST /v1/login", "ip": "7.7.7.7"}))?;
        assert_eq!(v["allowed"], true, "shadow never rejects: {v}");
        if v["shadow_denied"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x == "login"))
        {
            would += 1;
        }
    }
    assert_eq!(would, 3, "the 4th to 6th are recorded as would-denies");
    // Enforce: now it rejects.
    ctl_ok(d.admin, &["enforce", "login"])?;
    wait_all(&[d.http], 3, Duration::from_secs(1))?;
    assert_eq!(logins_allowed(d.http, "8.8.8.8", 5)?, 3);
    // The kill switch: everything to shadow, nobody rejected.
    let out = ctl_ok(d.admin, &["shadow-all"])?;
    assert!(out.contains("rollback --to 3"), "{out}");
    wait_all(&[d.http], 4, Duration::from_secs(1))?;
    assert_eq!(logins_allowed(d.http, "8.8.8.8", 5)?, 5);
    // And one call to turn one rule off.
    ctl_ok(d.admin, &["off", "burst"])?;
    wait_all(&[d.http], 5, Duration::from_secs(1))?;
    let v = check(d.http, json!({"api_key": "k"}))?;
    assert!(v["policies"].as_array().is_some_and(Vec::is_empty), "{v}");
    Ok(())
}

#[test]
fn with_listen_cut_changes_arrive_within_one_poll() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let dir = temp_dir("pull")?;
    let proxy = TcpProxy::start(Postgres::server_addr())?;
    let daemons: Vec<Sluiced> = (1..=3)
        .map(|i| {
            spawn(&Opts {
                id: &format!("p{i}"),
                url: pg.url(),
                listen_url: Some(pg.url_via(proxy.port())),
                poll_s: 2,
                cache: dir.join(format!("cache-{i}.json")),
            })
        })
        .collect::<Result<_>>()?;
    let https: Vec<SocketAddr> = daemons.iter().map(|d| d.http).collect();
    let file = write_rules(&dir, "rules.yaml", RULES)?;
    ctl_ok(daemons[0].admin, &["apply", "-f", &file])?;
    wait_all(&https, 1, Duration::from_secs(1))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.open_connections() < 3 {
        assert!(Instant::now() < deadline, "listeners never connected");
        std::thread::sleep(Duration::from_millis(20));
    }
    proxy.cut();
    let body = json!({"match": {"route": "POST /v1/login"}, "key": ["ip"],
                      "algorithm": "sliding_window", "limit": 50, "window": "1m"});
    let v = admin_write(daemons[0].admin, "PUT", "/v1/rules/login", &body)?;
    let lat = wait_all(&https, v, Duration::from_millis(2000 + 1500))?;
    eprintln!("LISTEN cut, poll_s 2: live on 3 daemons after {lat:?}");
    proxy.restore();
    Ok(())
}

#[test]
fn a_daemon_restarted_while_postgres_is_down_serves_its_cache_and_catches_up() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let dir = temp_dir("down")?;
    let proxy = TcpProxy::start(Postgres::server_addr())?;
    // `far` reaches PostgreSQL through the proxy; `near` directly (it hosts the admin API
    // the operator uses during the outage).
    let far_opts = Opts {
        id: "far",
        url: pg.url_via(proxy.port()),
        listen_url: None,
        poll_s: 1,
        cache: dir.join("far.json"),
    };
    let mut far = spawn(&far_opts)?;
    let near = spawn(&Opts {
        id: "near",
        url: pg.url(),
        listen_url: None,
        poll_s: 30,
        cache: dir.join("near.json"),
    })?;
    let file = write_rules(
        &dir,
        "rules.yaml",
        &RULES.replace("limit: 100", "limit: 10"),
    )?;
    ctl_ok(near.admin, &["apply", "-f", &file])?;
    wait_all(&[far.http, near.http], 1, Duration::from_secs(1))?;

    // PostgreSQL unreachable from `far`: it keeps serving.
    proxy.cut();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(logins_allowed(far.http, "1.1.1.1", 12)?, 10);

    // Restarted while it is down: it serves the cache.
    far.daemon.kill()?;
    far = spawn(&far_opts)?;
    assert_eq!(served(far.http)?, 1);
    assert_eq!(logins_allowed(far.http, "2.2.2.2", 12)?, 10);
    far.daemon
        .wait_log_contains("serving the rules cache", Duration::from_secs(5))?;

    // A change meanwhile; `far` cannot see it yet.
    let tight = write_rules(&dir, "tight.yaml", &RULES.replace("limit: 100", "limit: 5"))?;
    ctl_ok(near.admin, &["apply", "-f", &tight])?;
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(served(far.http)?, 1);

    // PostgreSQL is back: `far` catches up, and status says so.
    proxy.restore();
    wait_all(&[far.http], 2, Duration::from_secs(10))?;
    assert_eq!(logins_allowed(far.http, "3.3.3.3", 8)?, 5);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let st = ctl_json(near.admin, &["status"])?;
        let all = st["daemons"].as_array().cloned().unwrap_or_default();
        let far_row = all.iter().find(|d| d["daemon_id"] == "far");
        if far_row.is_some_and(|d| d["version"] == 2 && d["source"] == "postgres") {
            break;
        }
        assert!(Instant::now() < deadline, "status never caught up: {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

#[test]
fn migrate_is_idempotent_and_check_sends_one_check() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let unused: SocketAddr = ([127, 0, 0, 1], free_ports(1)[0]).into();
    let out = ctl_ok(unused, &["migrate", "--postgres", &pg.url()])?;
    assert!(out.contains("applied migration 1"), "{out}");
    let out = ctl_ok(unused, &["migrate", "--postgres", &pg.url()])?;
    assert!(out.contains("schema up to date (version 4)"), "{out}");

    let dir = temp_dir("check")?;
    let d = spawn(&Opts {
        id: "check",
        url: pg.url(),
        listen_url: None,
        poll_s: 30,
        cache: dir.join("cache.json"),
    })?;
    let file = write_rules(&dir, "rules.yaml", &RULES.replace("limit: 100", "limit: 1"))?;
    ctl_ok(d.admin, &["apply", "-f", &file, "--force"])?;
    wait_all(&[d.http], 1, Duration::from_secs(1))?;
    let server = format!("http://{}", d.http);
    let args = [
        "check",
        "--check-server",
        server.as_str(),
        "--domain",
        "public-api",
        "route=POST /v1/login",
        "ip=9.9.9.9",
    ];
    let first = ctl_ok(d.admin, &args)?;
    assert!(first.starts_with("ALLOWED OK"), "{first}");
    assert!(first.contains("login"), "{first}");
    let second = ctl_ok(d.admin, &args)?;
    assert!(
        second.starts_with("DENIED OVER_LIMIT  decided_by=login"),
        "{second}"
    );
    // The daemon's own error, as it wrote it.
    let (ok, _, err) = ctl(
        d.admin,
        &[
            "check",
            "--check-server",
            server.as_str(),
            "--domain",
            "public-api",
            "=x",
        ],
    )?;
    assert!(!ok);
    assert!(err.contains("400"), "{err}");
    Ok(())
}

#[test]
fn without_a_token_the_daemon_refuses_a_public_admin_address() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let ports = free_ports(3);
    let http = format!("127.0.0.1:{}", ports[0]);
    let grpc = format!("127.0.0.1:{}", ports[1]);
    let admin = format!("0.0.0.0:{}", ports[2]);
    let mut cmd = std::process::Command::new(cargo_bin("sluiced")?);
    cmd.args([
        "--postgres",
        &pg.url(),
        "--http-addr",
        &http,
        "--grpc-addr",
        &grpc,
    ])
    .args(["--admin-addr", &admin])
    .env_remove("SLUICE_ADMIN_TOKEN")
    .env_remove("SLUICE_READ_TOKEN");
    let mut d = Daemon::from_command(cmd)?;
    let status = d.wait(Duration::from_secs(30))?;
    assert!(!status.success());
    assert!(
        d.stderr()
            .contains("refusing to serve the admin API on 0.0.0.0"),
        "{}",
        d.logs()
    );
    Ok(())
}

/// The status a daemon last reported for `rule`: `(version, mode, canary_shadowed)`.
fn reported(admin: SocketAddr, daemon: &str, rule: &str) -> Result<(u64, String, bool)> {
    let st = ctl_json(admin, &["status"])?;
    let d = st["daemons"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["daemon_id"] == daemon)
        .ok_or_else(|| format!("no {daemon} in {st}"))?;
    let r = d["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["rule"] == rule)
        .ok_or_else(|| format!("no {rule} reported by {daemon}: {st}"))?;
    Ok((
        d["version"].as_u64().unwrap_or(0),
        r["mode"].as_str().unwrap_or("").to_string(),
        r["canary_shadowed"] == true,
    ))
}

/// Polls until `daemon` reports `version` (its report follows each change it loads).
fn reported_at(
    admin: SocketAddr,
    daemon: &str,
    rule: &str,
    version: u64,
) -> Result<(String, bool)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((v, mode, shadowed)) = reported(admin, daemon, rule)
            && v >= version
        {
            return Ok((mode, shadowed));
        }
        if Instant::now() > deadline {
            return Err(format!("{daemon} never reported version {version}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn canary_enforces_on_a_share_of_the_daemons_and_status_shows_which() -> Result<()> {
    // Two daemon ids on either side of 50% for `login`, by the core's own function.
    let ids: Vec<String> = (0..64).map(|i| format!("canary-{i}")).collect();
    let inside = ids
        .iter()
        .find(|d| sluice_core::canary::enforces("login", d, 50))
        .ok_or("a daemon inside 50%")?;
    let outside = ids
        .iter()
        .find(|d| !sluice_core::canary::enforces("login", d, 50))
        .ok_or("a daemon outside 50%")?;
    let pg = Postgres::throwaway()?;
    let dir = temp_dir("canary")?;
    let opts = |id: &str| Opts {
        id: "",
        url: pg.url(),
        listen_url: None,
        poll_s: 1,
        cache: dir.join(format!("{id}.json")),
    };
    let a = spawn(&Opts {
        id: inside,
        ..opts(inside)
    })?;
    let b = spawn(&Opts {
        id: outside,
        ..opts(outside)
    })?;
    let file = write_rules(&dir, "rules.yaml", &RULES.replace("limit: 100", "limit: 3"))?;
    ctl_ok(a.admin, &["apply", "-f", &file, "--force"])?;

    // An ordinary rule write: a new version, in the rule's history.
    let out = ctl_ok(a.admin, &["canary", "login", "50%"])?;
    assert!(out.contains("version 2 (was 1)"), "{out}");
    assert!(out.contains("50% of the daemons"), "{out}");
    let got = ctl_json(a.admin, &["get", "login"])?;
    assert_eq!(
        got["rule"]["enforce_on"],
        json!({"daemons": "50%"}),
        "{got}"
    );
    assert!(ctl_ok(a.admin, &["history", "login"])?.contains("put"));
    wait_all(&[a.http, b.http], 2, Duration::from_secs(60))?;

    // The daemon inside refuses over the limit; the one outside only shadows.
    assert_eq!(logins_allowed(a.http, "9.9.9.9", 5)?, 3);
    assert_eq!(logins_allowed(b.http, "9.9.9.9", 5)?, 5);
    let v = check(b.http, json!({"route": "POST /v1/login", "ip": "9.9.9.9"}))?;
    assert_eq!(v["shadow_denied"], json!(["login"]), "{v}");
    assert_eq!(
        reported_at(a.admin, inside, "login", 2)?,
        ("enforce".into(), false)
    );
    assert_eq!(
        reported_at(a.admin, outside, "login", 2)?,
        ("shadow".into(), true)
    );
    let table = ctl_ok(a.admin, &["status"])?;
    let row = |id: &str| {
        table
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_default()
            .to_string()
    };
    assert!(row(outside).contains("login"), "{table}");
    assert!(!row(inside).contains("login"), "{table}");
    assert!(
        table.contains(&format!("this daemon ({inside}): enforces")),
        "{table}"
    );

    // Raised to 100%: both refuse, nobody shadows it.
    ctl_ok(a.admin, &["canary", "login", "100"])?;
    wait_all(&[a.http, b.http], 3, Duration::from_secs(60))?;
    assert_eq!(logins_allowed(a.http, "6.6.6.6", 5)?, 3);
    assert_eq!(logins_allowed(b.http, "6.6.6.6", 5)?, 3);
    assert_eq!(
        reported_at(a.admin, outside, "login", 3)?,
        ("enforce".into(), false)
    );
    let (ok, _, err) = ctl(a.admin, &["canary", "login", "101"])?;
    assert!(!ok && err.contains("0 to 100"), "{err}");
    drop((a.daemon, b.daemon));
    Ok(())
}
