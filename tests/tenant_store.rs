//! A store per tenant, end to end: one real `sluiced` over two real Redis servers, the main
//! one and `bigcorp` (`stores:` in its config), with an override moving `k_big`'s counts to
//! `bigcorp`. `k_big` counts there and nowhere else; with `bigcorp` paused (SIGSTOP) only
//! `k_big` degrades (its rule's failure mode, the breaker of store `bigcorp` open) while every
//! other tenant is still decided by the main Redis, limit included; resumed, `k_big` is
//! decided by `bigcorp` again with its counts intact. A rule set naming a store the daemon
//! lacks is refused, at start and at a reload.

use serde_json::{Value, json};
use sluice_testkit::{Daemon, Metrics, RedisServer, cargo_bin, free_ports, http_request};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A bucket of 3 refilling one token an hour: no refill within the test, whatever the
/// wall clock's minute or hour, so a fourth request is refused by whichever store counts.
/// Without the deny cache every check asks its store (a cached refusal would answer k_big's
/// first checks after the pause without one).
const RULES: &str = r#"
domain: api
rules:
  - { id: pay, key: [api_key], algorithm: token_bucket, rate: 1/1h, burst: 3, on_store_failure: closed, hot_keys: { deny_cache: false } }
overrides:
  - { identity: { api_key: k_big }, rule: pay, store: bigcorp }
"#;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-tenant-store-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("dir");
    d
}

/// The config of a daemon over `main` with `bigcorp` as a named store; returns it and the
/// HTTP address.
fn config(
    dir: &Path,
    main: &RedisServer,
    bigcorp: &RedisServer,
    rules: &Path,
) -> (PathBuf, SocketAddr) {
    let ports = free_ports(2);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let config = dir.join("sluiced.yaml");
    // Deadlines generous for a busy 2-core machine: a slow call must not look like an outage.
    std::fs::write(
        &config,
        format!(
            "http_addr: {http}\ngrpc_addr: 127.0.0.1:{}\nrules: {}\nrules_poll_ms: 100\n\
             store: {{ kind: redis, url: \"{}\" }}\nstore_timeout_ms: 200\n\
             breaker_min_calls: 5\nbreaker_cool_off_ms: 500\n\
             stores:\n  bigcorp: {{ kind: redis, url: \"{}\", store_timeout_ms: 100 }}\n",
            ports[1],
            rules.display(),
            main.url(),
            bigcorp.url(),
        ),
    )
    .expect("config");
    (config, http)
}

fn spawn(config: &Path) -> Daemon {
    Daemon::spawn(
        cargo_bin("sluiced").expect("sluiced built (cargo build -p sluiced --bins)"),
        &["--config", config.to_str().expect("utf-8")],
        &[("RUST_LOG", "info")],
    )
    .expect("spawn sluiced")
}

fn check(http: SocketAddr, key: &str) -> String {
    let body = json!({"domain": "api", "descriptors": {"api_key": key}}).to_string();
    let r = http_request(http, "POST", "/v1/limits:check", &[], body.as_bytes()).expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).expect("json");
    v["code"].as_str().expect("code").to_string()
}

fn metrics(http: SocketAddr) -> Metrics {
    Metrics::scrape(http).expect("metrics")
}

/// The keys of a Redis holding `needle`.
fn keys(redis: &RedisServer, needle: &str) -> String {
    redis.cmd(&["KEYS", &format!("*{needle}*")]).expect("KEYS")
}

const BIG_BREAKER: &str = "sluice_breaker_state{store=\"bigcorp\",shard=\"0\"}";
const MAIN_BREAKER: &str = "sluice_breaker_state{store=\"default\",shard=\"0\"}";

#[test]
fn a_tenants_store_takes_its_counts_and_its_outage_stays_its_own() {
    let main = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let bigcorp = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir = tmp("outage");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let (config, http) = config(&dir, &main, &bigcorp, &rules);
    let mut daemon = spawn(&config);
    daemon
        .wait_http_ok(http, "/healthz", Duration::from_secs(20))
        .expect("healthy");

    // Both tenants have their limit, each counted in its own store.
    for key in ["k_big", "k_small"] {
        let got: Vec<String> = (0..4).map(|_| check(http, key)).collect();
        assert_eq!(got, ["OK", "OK", "OK", "OVER_LIMIT"], "{key}");
    }
    let (big_there, big_main) = (keys(&bigcorp, "k_big"), keys(&main, "k_big"));
    assert!(
        big_there.contains("k_big"),
        "k_big's bucket is in bigcorp: {big_there:?}"
    );
    assert!(
        !big_main.contains("k_big"),
        "and not in the main Redis: {big_main:?}"
    );
    let (small_main, small_big) = (keys(&main, "k_small"), keys(&bigcorp, "k_small"));
    assert!(small_main.contains("k_small"), "{small_main:?}");
    assert!(!small_big.contains("k_small"), "{small_big:?}");
    let m = metrics(http);
    assert_eq!(
        m.count("sluice_store_duration_seconds_count{store=\"bigcorp\"}"),
        4,
        "k_big's four calls went to bigcorp"
    );
    assert_eq!(
        m.count("sluice_store_duration_seconds_count{store=\"default\"}"),
        4
    );

    // bigcorp paused: k_big answers its failure mode (closed) until bigcorp's breaker opens.
    bigcorp.pause().expect("SIGSTOP bigcorp");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut unavailable = 0;
    while metrics(http).count_or_zero(BIG_BREAKER) != 2 {
        assert!(Instant::now() < deadline, "bigcorp's breaker never opened");
        assert_eq!(check(http, "k_big"), "UNAVAILABLE", "k_big fails closed");
        unavailable += 1;
    }
    // Refused by the open breaker now, without waiting for the paused Redis.
    assert_eq!(check(http, "k_big"), "UNAVAILABLE");
    unavailable += 1;

    // Everyone else: decided by the main Redis exactly as before, limit included.
    let got: Vec<String> = (0..4).map(|_| check(http, "k_other")).collect();
    assert_eq!(
        got,
        ["OK", "OK", "OK", "OVER_LIMIT"],
        "k_other, bigcorp paused"
    );
    assert_eq!(
        check(http, "k_small"),
        "OVER_LIMIT",
        "k_small's count is still there"
    );
    let m = metrics(http);
    eprintln!(
        "bigcorp paused: {unavailable} k_big checks answered UNAVAILABLE; failure answers bigcorp {}, default {}",
        m.count("sluice_store_failure_answers_total{store=\"bigcorp\",mode=\"closed\"}"),
        m.count("sluice_store_failure_answers_total{store=\"default\",mode=\"closed\"}"),
    );
    assert_eq!(
        m.count(MAIN_BREAKER),
        0,
        "the main store's breaker stays closed"
    );
    assert_eq!(m.count(BIG_BREAKER), 2);
    assert_eq!(
        m.count("sluice_breaker_opened_total{store=\"bigcorp\",shard=\"0\"}"),
        1
    );
    assert_eq!(
        m.count("sluice_breaker_opened_total{store=\"default\",shard=\"0\"}"),
        0
    );
    assert_eq!(
        m.count("sluice_store_failure_answers_total{store=\"bigcorp\",mode=\"closed\"}"),
        unavailable,
        "every k_big answer while paused was its failure mode"
    );
    assert_eq!(
        m.count("sluice_store_failure_answers_total{store=\"default\",mode=\"closed\"}"),
        0,
        "no other tenant got a failure-mode answer"
    );

    // Resumed: k_big is decided by bigcorp again, its spent bucket still spent there.
    bigcorp.resume().expect("SIGCONT bigcorp");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let code = check(http, "k_big");
        if code == "OVER_LIMIT" && metrics(http).count_or_zero(BIG_BREAKER) == 0 {
            break;
        }
        assert!(
            code == "UNAVAILABLE" || code == "OVER_LIMIT",
            "k_big answered {code}: its bucket was spent before the outage"
        );
        assert!(
            Instant::now() < deadline,
            "k_big did not recover after SIGCONT"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metrics(http).count(MAIN_BREAKER), 0);

    // A reload naming a store the daemon lacks is refused whole; the last good set serves.
    std::fs::write(&rules, RULES.replace("store: bigcorp", "store: smallcorp")).expect("rules");
    let deadline = Instant::now() + Duration::from_secs(20);
    while metrics(http).count_or_zero("sluice_rules_refused_total") == 0 {
        assert!(Instant::now() < deadline, "the reload was never refused");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        daemon.logs().contains("names store \\\"smallcorp\\\"")
            || daemon.logs().contains("names store \"smallcorp\""),
        "the refusal names the store: {}",
        daemon.logs()
    );
    let before = metrics(http).count("sluice_store_duration_seconds_count{store=\"bigcorp\"}");
    assert_eq!(check(http, "k_big"), "OVER_LIMIT");
    assert_eq!(
        metrics(http).count("sluice_store_duration_seconds_count{store=\"bigcorp\"}"),
        before + 1,
        "k_big still counts in bigcorp"
    );
    let _ = daemon.terminate(Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_daemon_refuses_to_start_on_rules_naming_a_store_it_lacks() {
    let main = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let bigcorp = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir = tmp("start");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES.replace("store: bigcorp", "store: smallcorp")).expect("rules");
    let (config, _) = config(&dir, &main, &bigcorp, &rules);
    let mut daemon = spawn(&config);
    let status = daemon.wait(Duration::from_secs(20)).expect("sluiced exits");
    assert!(!status.success(), "{}", daemon.logs());
    let logs = daemon.logs();
    assert!(
        logs.contains("overrides[0] (rule \"pay\") names store \"smallcorp\""),
        "the error names the override and the store: {logs}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
