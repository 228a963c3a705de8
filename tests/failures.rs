//! Never the reason the API is down: Redis paused, killed and restarted under a real daemon.

use serde_json::{Value, json};
use sluice_testkit::{Daemon, Metrics, RedisServer, cargo_bin, free_ports, http_request};
use sluice_tests::common::inside_an_hour;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const RULES: &str = r#"
domain: api
rules:
  - { id: open, match: { route: open }, key: [k], algorithm: fixed_window, limit: 1000, window: 1h, on_store_failure: open }
  - { id: closed, match: { route: closed }, key: [k], algorithm: fixed_window, limit: 1000, window: 1h, on_store_failure: closed }
  - { id: local, match: { route: local }, key: [k], algorithm: fixed_window, limit: 10, window: 1h, on_store_failure: local }
  - { id: daily, match: { route: quota }, key: [k], algorithm: fixed_window, limit: 100, window: 1d, on_store_failure: local }
"#;

struct Sluiced {
    daemon: Daemon,
    http: SocketAddr,
}

/// `timeout_ms` is the store deadline: 3 ms (the default) where latency is the point, more
/// where a busy 2-core test machine must not turn a slow call into a failure.
fn start(redis: &RedisServer, dir: &Path, journal: &Path, timeout_ms: u64) -> Sluiced {
    std::fs::create_dir_all(dir).expect("dir");
    let ports = free_ports(2);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let config = dir.join("sluiced.yaml");
    std::fs::write(
        &config,
        format!(
            "http_addr: {http}\ngrpc_addr: 127.0.0.1:{}\nrules: {}\nstore: {{ kind: redis, url: \"{}\" }}\nstore_timeout_ms: {}\nbreaker_cool_off_ms: 1000\nbreaker_min_calls: 10\njournal: {}\n",
            ports[1],
            rules.display(),
            redis.url(),
            timeout_ms,
            journal.display()
        ),
    )
    .expect("config");
    let mut daemon = Daemon::spawn(
        cargo_bin("sluiced").expect("sluiced built"),
        &["--config", config.to_str().expect("utf-8")],
        &[("RUST_LOG", "info")],
    )
    .expect("spawn");
    daemon
        .wait_http_ok(http, "/healthz", Duration::from_secs(20))
        .expect("healthy");
    Sluiced { daemon, http }
}

fn check(http: SocketAddr, route: &str, k: &str) -> (Value, Duration) {
    let t = Instant::now();
    let body = json!({"domain": "api", "descriptors": {"route": route, "k": k}}).to_string();
    let r = http_request(http, "POST", "/v1/limits:check", &[], body.as_bytes()).expect("request");
    let took = t.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    (serde_json::from_slice(&r.body).expect("json"), took)
}

/// One series of the daemon's metrics; absent is a failure.
fn metric(http: SocketAddr, name: &str) -> u64 {
    Metrics::scrape(http).expect("metrics").count(name)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("sluice-failures-{}-{name}", std::process::id()))
}

#[test]
fn redis_paused_every_mode_does_what_it_says_then_recovers() {
    // The rules count in hourly windows and this test compares counts taken seconds apart
    // (the local allowance while paused, the warm-up count after recovery): a window
    // boundary in between would start a fresh count. Start well inside one hour (this waits
    // at most once an hour, for under a minute).
    inside_an_hour();
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir = tmp("pause");
    let s = start(&redis, &dir, &dir.join("quota.journal"), 3);
    for route in ["open", "closed", "local"] {
        // A 3 ms deadline on a busy test machine can miss; what matters is one success.
        let deadline = Instant::now() + Duration::from_secs(10);
        while check(s.http, route, "warm").0["code"] != "OK" {
            assert!(Instant::now() < deadline, "{route} never answered OK");
        }
    }
    redis.pause().expect("SIGSTOP");
    let mut lat = Vec::new();
    let (mut open_ok, mut closed_503, mut local_ok, mut local_429) = (0, 0, 0, 0);
    for _ in 0..40 {
        let (v, t) = check(s.http, "open", "a");
        lat.push(t);
        if v["code"] == "OK" {
            open_ok += 1;
        }
        let (v, t) = check(s.http, "closed", "a");
        lat.push(t);
        if v["code"] == "UNAVAILABLE" {
            assert_eq!(v["headers"]["Retry-After"], "1");
            closed_503 += 1;
        }
        let (v, t) = check(s.http, "local", "a");
        lat.push(t);
        match v["code"].as_str() {
            Some("OK") => local_ok += 1,
            Some("OVER_LIMIT") => local_429 += 1,
            other => panic!("local rule answered {other:?}"),
        }
    }
    let (p50, p99, max) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99), pct(&mut lat, 1.0));
    eprintln!(
        "while paused: p50 {p50:?} p99 {p99:?} max {max:?}; open allowed {open_ok}, closed 503 {closed_503}, local allowed {local_ok} refused {local_429}"
    );
    // No check waits for the paused Redis: the redis crate's own 500 ms would show here.
    assert!(max < Duration::from_millis(250), "a check waited {max:?}");
    assert_eq!(open_ok, 40, "fail-open rules add no errors");
    assert_eq!(closed_503, 40, "fail-closed rules answer UNAVAILABLE");
    assert_eq!(
        local_ok, 5,
        "local buckets keep coarse limits: 10 × local_factor 0.5"
    );
    assert_eq!(local_429, 35);
    assert_eq!(
        metric(
            s.http,
            "sluice_breaker_state{store=\"default\",shard=\"0\"}"
        ),
        2,
        "breaker open"
    );

    redis.resume().expect("SIGCONT");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (v, _) = check(s.http, "closed", "b");
        if v["code"] == "OK"
            && metric(
                s.http,
                "sluice_breaker_state{store=\"default\",shard=\"0\"}",
            ) == 0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "breaker did not close after SIGCONT"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Recovered: decided by Redis again, where the warm-up count still is (a call that
    // timed out may still have counted there, hence at most).
    let (v, _) = check(s.http, "open", "warm");
    let remaining = v["policies"][0]["remaining"].as_u64().expect("remaining");
    assert!(remaining <= 998, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn redis_killed_and_restarted_scripts_reload_and_no_check_fails_after() {
    let mut redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir = tmp("kill");
    let s = start(&redis, &dir, &dir.join("quota.journal"), 100);
    assert_eq!(check(s.http, "closed", "x").0["code"], "OK");
    redis.kill().expect("kill");
    for _ in 0..20 {
        assert_eq!(check(s.http, "closed", "x").0["code"], "UNAVAILABLE");
    }
    redis
        .restart()
        .expect("restart on the same port, empty (no scripts cached)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while check(s.http, "closed", "y").0["code"] != "OK" {
        assert!(Instant::now() < deadline, "did not recover");
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 0..50 {
        let (v, _) = check(s.http, "closed", "z");
        assert_eq!(v["code"], "OK", "check {i} after recovery: {v}");
    }
    assert_eq!(
        check(s.http, "closed", "z").0["policies"][0]["remaining"],
        949
    );
    assert!(
        metric(s.http, "sluice_store_noscript_reloads_total") >= 1,
        "the empty Redis needed the script again"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quota_journal_replays_after_a_daemon_killed_mid_outage() {
    let mut redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir = tmp("journal");
    let journal = dir.join("quota.journal");
    let mut s = start(&redis, &dir, &journal, 100);
    assert_eq!(
        check(s.http, "quota", "q").0["policies"][0]["remaining"],
        99
    );
    redis.kill().expect("kill");
    for _ in 0..4 {
        assert_eq!(
            check(s.http, "quota", "q").0["code"],
            "OK",
            "decided on the local bucket"
        );
    }
    assert_eq!(metric(s.http, "sluice_journal_backlog"), 4);
    s.daemon.kill().expect("SIGKILL");
    redis.restart().expect("restart, empty");
    // Redis lost everything; the daemon that restarts replays what its predecessor journaled.
    let s2 = start(&redis, &dir.join("second"), &journal, 100);
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(s2.http, "sluice_journal_backlog") != 0 {
        assert!(Instant::now() < deadline, "journal not replayed");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (v, _) = check(s2.http, "quota", "q");
    assert_eq!(
        v["policies"][0]["remaining"], 95,
        "4 outage admissions + this one counted: {v}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits until every replica has finished its first sync with its primary. A replica that has
/// not (`master_link_status:down`) refuses to be promoted ("Disconnected from master for
/// longer than allowed", `cluster-replica-validity-factor`), so killing its primary then would
/// leave the shard down for good instead of testing a failover.
fn wait_replicas_in_sync(cluster: &sluice_testkit::RedisCluster, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let synced = cluster.nodes().iter().all(|n| {
            n.cmd(&["INFO", "replication"]).is_ok_and(|info| {
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        });
        if synced {
            return;
        }
        assert!(Instant::now() < deadline, "replicas did not sync");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_cluster_primary_killed_degrades_only_its_shard() {
    use sluice_testkit::{ClusterOptions, RedisCluster};
    let mut cluster = RedisCluster::start_with(ClusterOptions {
        primaries: 3,
        replicas_per_primary: 1,
        node_timeout_ms: 1000,
        extra_args: [
            // Without it Redis itself answers CLUSTERDOWN for every key, on every node, while
            // one slot range has no live primary: no client could keep the other shards up.
            "--cluster-require-full-coverage",
            "no",
            // Replicas start their first sync at once instead of after 5 s.
            "--repl-diskless-sync-delay",
            "0",
        ]
        .map(String::from)
        .to_vec(),
    })
    .expect("redis cluster (apt-get install redis-server redis-tools)");
    let dir = tmp("cluster");
    std::fs::create_dir_all(&dir).expect("dir");
    let ports = free_ports(2);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let urls = cluster.urls().join(",");
    let mut d = Daemon::spawn(
        cargo_bin("sluiced").expect("sluiced built"),
        &[
            "--rules",
            rules.to_str().expect("utf-8"),
            "--http-addr",
            &http.to_string(),
            "--grpc-addr",
            &format!("127.0.0.1:{}", ports[1]),
            "--redis-cluster",
            &urls,
            // Generous: a busy 2-core machine must not turn a slow healthy call into a failure.
            "--store-timeout-ms",
            "100",
        ],
        &[("RUST_LOG", "info")],
    )
    .expect("spawn");
    d.wait_http_ok(http, "/healthz", Duration::from_secs(20))
        .expect("healthy");

    // One identity per primary: the key's hash tag decides its slot and so its node.
    let mut by_node: std::collections::BTreeMap<usize, String> = Default::default();
    for i in 0..200 {
        let k = format!("k{i}");
        let store_key = format!("sl:{{api|k={k}}}:closed");
        let node = cluster.node_for_key(&store_key).expect("slot owner");
        by_node.entry(node).or_insert(k);
    }
    assert_eq!(by_node.len(), 3, "an identity on each primary");
    for k in by_node.values() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while check(http, "closed", k).0["code"] != "OK" {
            assert!(Instant::now() < deadline, "{k} never answered OK");
        }
    }
    wait_replicas_in_sync(&cluster, Duration::from_secs(30));
    let (&victim, victim_key) = by_node.iter().next().expect("a primary");
    let victim_key = victim_key.clone();
    cluster.kill_node(victim).expect("kill a primary");

    // Until the replica is promoted only the victim's keys may fail; the others keep OK.
    // `closed` answers UNAVAILABLE for every failed store call, so each failure shows.
    let start = Instant::now();
    let (mut others_failed, mut victim_failed, mut recovered_after) = (0, 0, None);
    let (mut others_checked, mut victim_failed_after) = (0, 0);
    while start.elapsed() < Duration::from_secs(30) {
        for (node, k) in &by_node {
            let ok = check(http, "closed", k).0["code"] == "OK";
            if *node == victim {
                if ok {
                    if victim_failed > 0 && recovered_after.is_none() {
                        recovered_after = Some(start.elapsed());
                    }
                } else if recovered_after.is_some() {
                    victim_failed_after += 1;
                } else {
                    victim_failed += 1;
                }
            } else {
                others_checked += 1;
                if !ok {
                    others_failed += 1;
                }
            }
        }
        if recovered_after.is_some() && start.elapsed() > Duration::from_secs(5) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "primary killed: victim shard failed {victim_failed} checks, recovered after \
         {recovered_after:?} ({victim_failed_after} failures after that); other shards failed \
         {others_failed} of {others_checked}"
    );
    assert!(victim_failed > 0, "the dead primary's keys degrade");
    assert!(
        recovered_after.is_some(),
        "its replica was promoted and {victim_key} recovered"
    );
    assert_eq!(others_failed, 0, "the other shards never notice");
    let (v, _) = check(http, "closed", &victim_key);
    assert_eq!(v["code"], "OK", "decided by the promoted replica: {v}");
    let _ = std::fs::remove_dir_all(&dir);
}
