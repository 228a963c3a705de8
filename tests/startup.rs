//! A daemon that says it is ready is ready: right after a start, against a healthy Redis, the
//! first checks of a fail-closed rule answer from Redis, not `UNAVAILABLE` (a rolling restart
//! must not turn a login endpoint's traffic into 503s). Before `/healthz` answers 200 the
//! store is connected, its scripts are loaded and each script has run once; a Redis that is
//! down at start delays readiness boundedly, then the rules' failure modes answer.

use serde_json::{Value, json};
use sluice_testkit::{
    Daemon, RedisCluster, RedisServer, TcpProxy, cargo_bin, free_ports, http_get, http_request,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const RULES: &str = r#"
domain: api
rules:
  - { id: login, match: { route: login }, key: [k], algorithm: fixed_window, limit: 1000000, window: 1h, on_store_failure: closed }
"#;

/// The scripts' SHA1s, as `SCRIPT EXISTS` takes them.
const SCRIPTS: [&str; 2] = [
    sluice_store::redis::CHECK_SCRIPT,
    sluice_store::redis::RELEASE_SCRIPT,
];

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-startup-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("rules.yaml"), RULES).expect("rules");
    dir
}

/// Spawns `sluiced` on free ports with `store` (a `--redis` / `--redis-cluster` pair or a
/// `--config` file) and the rules in `dir`, without waiting for it.
fn spawn(dir: &Path, store: &[&str]) -> (Daemon, SocketAddr) {
    let ports = free_ports(2);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let (http_s, grpc_s) = (http.to_string(), format!("127.0.0.1:{}", ports[1]));
    let rules = dir.join("rules.yaml");
    let mut args = vec![
        "--http-addr",
        &http_s,
        "--grpc-addr",
        &grpc_s,
        "--rules",
        rules.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(store);
    let daemon = Daemon::spawn(
        cargo_bin("sluiced").expect("sluiced built (cargo build -p sluiced --bins)"),
        &args,
        &[("RUST_LOG", "info")],
    )
    .expect("spawn");
    (daemon, http)
}

/// A config file for `store` (its YAML) whose calls have `timeout_ms` and whose connection
/// set-up may take `connect_ms`.
fn config(dir: &Path, store: &str, timeout_ms: u64, connect_ms: u64) -> String {
    let path = dir.join("sluiced.yaml");
    std::fs::write(
        &path,
        format!(
            "store: {store}\nstore_timeout_ms: {timeout_ms}\nstore_connect_timeout_ms: {connect_ms}\n"
        ),
    )
    .expect("config");
    path.to_str().expect("utf-8").to_string()
}

fn check(http: SocketAddr, k: &str) -> Value {
    let body = json!({"domain": "api", "descriptors": {"route": "login", "k": k}}).to_string();
    let r = http_request(http, "POST", "/v1/limits:check", &[], body.as_bytes()).expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_slice(&r.body).expect("json")
}

/// `EVALSHA` calls a Redis has run, from `INFO commandstats`.
fn evalsha_calls(redis: &RedisServer) -> u64 {
    redis
        .cmd(&["INFO", "commandstats"])
        .expect("INFO")
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Whether both scripts are in a Redis's script cache.
fn scripts_loaded(redis: &RedisServer) -> bool {
    let shas: Vec<String> = SCRIPTS
        .iter()
        .map(|s| sluice_store::redis::script_sha(s))
        .collect();
    let mut cmd = vec!["SCRIPT", "EXISTS"];
    cmd.extend(shas.iter().map(String::as_str));
    redis.cmd(&cmd).expect("SCRIPT EXISTS") == "1\n1"
}

/// 20 starts against an idle Redis on loopback, the default 3 ms deadline: each time
/// `/healthz` first says ready, Redis has run the scripts already (connection, script cache
/// and the first call's one-time costs are behind the daemon), and the first 5 checks follow
/// at once. Before the fix the first call of a start was the first script run over its
/// connection, and up to 2 of the 100 first checks (15 under load) answered `UNAVAILABLE`.
#[test]
fn each_start_is_warm_before_it_says_ready() {
    const STARTS: usize = 20;
    const FIRST_CHECKS: usize = 5;
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir = tmp("warm");
    let url = redis.url();
    let mut unavailable = Vec::new();
    for start in 0..STARTS {
        let before = evalsha_calls(&redis);
        let (mut daemon, http) = spawn(&dir, &["--redis", &url]);
        daemon
            .wait_http_ok(http, "/healthz", Duration::from_secs(20))
            .expect("healthy");
        let warm = evalsha_calls(&redis) - before;
        assert!(
            warm >= 3,
            "start {start}: /healthz said ready after {warm} script runs (want both check forms and the release run first)"
        );
        for n in 0..FIRST_CHECKS {
            let v = check(http, &format!("s{start}"));
            if v["code"] != "OK" {
                unavailable.push(format!("start {start}, check {n}: {}", v["code"]));
            }
        }
        daemon.kill().expect("kill");
    }
    // A 3 ms deadline on a 2-core machine shared with compilers can miss in steady state too,
    // so this count is reported, not asserted; the assertion above is the cause.
    eprintln!(
        "{} of {} first checks UNAVAILABLE: {unavailable:?}",
        unavailable.len(),
        STARTS * FIRST_CHECKS
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection set-up that takes a second (a far or loaded Redis, a TLS handshake) against
/// a 100 ms deadline: the daemon waits for it (within its connect timeout) before it says it
/// is ready, so none of the first checks fails. Before the fix the script load at start gave
/// up after 500 ms, the daemon said ready, and the first checks timed out.
#[test]
fn a_slow_connection_set_up_is_waited_for_before_ready() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let proxy = TcpProxy::start(redis.addr()).expect("proxy");
    proxy.delay_new_links(Duration::from_secs(1));
    let dir = tmp("slow");
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let cfg = config(
        &dir,
        &format!("{{ kind: redis, url: \"{url}\" }}"),
        100,
        3_000,
    );
    let mut failed = Vec::new();
    for start in 0..3 {
        let (mut daemon, http) = spawn(&dir, &["--config", &cfg]);
        daemon
            .wait_http_ok(http, "/healthz", Duration::from_secs(20))
            .expect("healthy");
        for n in 0..5 {
            let v = check(http, &format!("slow{start}"));
            if v["code"] != "OK" {
                failed.push(format!("start {start}, check {n}: {}", v["code"]));
            }
        }
        daemon.kill().expect("kill");
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failed.is_empty(),
        "{} of 15 first checks failed: {failed:?}",
        failed.len()
    );
}

/// Redis unreachable at start: `/healthz` answers 503 `starting` while the daemon waits, then
/// (after the bounded start-up wait) the daemon serves with the rules' failure modes and says
/// so in its log; once Redis is reachable, checks answer from it.
#[test]
fn redis_down_at_start_delays_readiness_boundedly_then_the_rules_decide() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let proxy = TcpProxy::start(redis.addr()).expect("proxy");
    proxy.cut();
    let dir = tmp("down");
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let (mut daemon, http) = spawn(&dir, &["--redis", &url]);
    // The first answer /healthz gives is "starting".
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        if let Ok(r) = http_get(http, "/healthz") {
            break r;
        }
        assert!(
            daemon.try_wait().expect("daemon").is_none(),
            "{}",
            daemon.logs()
        );
        assert!(
            Instant::now() < deadline,
            "no /healthz answer\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(first.status, 503, "{}", first.text());
    assert!(first.text().contains("starting"), "{}", first.text());
    daemon
        .wait_http_ok(http, "/healthz", Duration::from_secs(20))
        .expect("ready after the start-up wait");
    assert!(
        daemon.logs().contains("store not ready in time"),
        "{}",
        daemon.logs()
    );
    assert_eq!(
        check(http, "down")["code"],
        "UNAVAILABLE",
        "the closed rule decides"
    );

    proxy.restore();
    daemon
        .wait_log_contains("store warmed up after the start", Duration::from_secs(20))
        .expect("the background warm-up succeeds");
    // Failures meanwhile opened the breaker; it closes after its cool-off (10 s by default).
    let deadline = Instant::now() + Duration::from_secs(30);
    while check(http, "down")["code"] != "OK" {
        assert!(
            Instant::now() < deadline,
            "never answered from Redis\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Redis Cluster: every primary has its connection, both scripts and a script run before
/// `/healthz` says ready, and the first check on each shard answers from Redis.
#[test]
fn every_cluster_primary_is_warm_before_ready() {
    let cluster = RedisCluster::start(3, 0)
        .expect("redis cluster (apt-get install redis-server redis-tools)");
    let primaries = cluster.primaries().expect("primaries");
    let before: Vec<u64> = primaries
        .iter()
        .map(|&i| evalsha_calls(cluster.node(i)))
        .collect();
    let dir = tmp("cluster");
    let urls = cluster
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    // A 100 ms deadline: the first checks below must not miss on a busy test machine.
    let cfg = config(
        &dir,
        &format!("{{ kind: redis_cluster, urls: [{urls}] }}"),
        100,
        1_000,
    );
    let (mut daemon, http) = spawn(&dir, &["--config", &cfg]);
    daemon
        .wait_http_ok(http, "/healthz", Duration::from_secs(30))
        .expect("healthy");
    for (&i, b) in primaries.iter().zip(&before) {
        let node = cluster.node(i);
        assert!(
            scripts_loaded(node),
            "node {i}: scripts not loaded at ready"
        );
        let warm = evalsha_calls(node) - b;
        assert!(warm >= 3, "node {i}: {warm} script runs at ready");
    }
    // One identity per primary (the key's hash tag decides its node): the first check on
    // each shard answers from Redis.
    let mut todo: Vec<usize> = primaries.clone();
    let mut n = 0;
    while !todo.is_empty() {
        assert!(n < 10_000, "no identity found for every primary");
        let k = format!("c{n}");
        n += 1;
        let owner = cluster
            .node_for_key(&format!("{{api|k={k}}}"))
            .expect("slot owner");
        if let Some(pos) = todo.iter().position(|&p| p == owner) {
            todo.remove(pos);
            assert_eq!(check(http, &k)["code"], "OK", "first check on node {owner}");
        }
    }
    daemon.kill().expect("kill");
    let _ = std::fs::remove_dir_all(&dir);
}
