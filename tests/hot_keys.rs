//! The hot-key layer end to end: real `sluiced` processes on a real `redis-server`.
//!
//! - the deny cache is exact: a key at 10× and 50× its token bucket admits what the bucket
//!   allows, cache on as cache off, for a fraction of the store calls;
//! - leases never overshoot: four daemons leasing batches of one shared count admit at most
//!   the count, and what they did not spend goes back (quiet keys, and at SIGTERM);
//! - `lease: auto` at the highest rate a daemon serves here: the hot key's requests rarely
//!   reach Redis, it admits its limit, and ordinary keys beside it keep one store call per
//!   request (counted per key with `MONITOR`).
//!
//! Every assertion is on answers, on `/metrics` and on what Redis saw (`INFO commandstats`,
//! `MONITOR`, the counts it holds), never on how long something took; the loads run for a
//! bounded time and the only waits are for events, each bounded.

use serde_json::Value;
use sluice_proto::sluice::v1::limiter_client::LimiterClient;
use sluice_testkit::{Monitor, RedisServer, cargo_bin};
use sluice_tests::common::load::{Load, channel, check_request, grpc_runtime, paced};
use sluice_tests::common::node::{Node, start};
use sluice_tests::common::{HANG, inside_an_hour, serial};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Script runs Redis has served (`EVAL*` in `INFO commandstats`), check and give-back
/// scripts alike.
fn script_calls(redis: &RedisServer) -> u64 {
    let info = redis.cmd(&["INFO", "commandstats"]).expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_eval"))
        .filter_map(|l| {
            let calls = l.split_once("calls=")?.1;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// 1. The deny cache is exact.
// ---------------------------------------------------------------------------------------

const BUCKET_RATE: u64 = 100;
const BUCKET_BURST: u64 = 100;

fn bucket_rules(deny_cache: bool) -> String {
    format!(
        "domain: hk\nrules:\n  - {{ id: hot, key: [user], algorithm: token_bucket, rate_per_s: {BUCKET_RATE}, burst: {BUCKET_BURST}, hot_keys: {{ deny_cache: {deny_cache} }} }}\n"
    )
}

/// What one run of the deny-cache comparison measured.
#[derive(Debug)]
struct DenyRun {
    load: Load,
    /// What the bucket allows over the load's span.
    allowance: f64,
    script_calls: u64,
    /// Checks the daemons sent to the store (a script run may carry several).
    store_checks: u64,
    deny_hits: u64,
    /// The daemons' mean store call latency.
    store_latency: Duration,
}

/// One key at `factor` × its bucket's rate for `run`, through two daemons on a fresh Redis.
fn deny_run(deny_cache: bool, factor: u64, run: Duration) -> DenyRun {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let rules = bucket_rules(deny_cache);
    let nodes = [start(&redis, &rules, ""), start(&redis, &rules, "")];
    let before = script_calls(&redis);
    let offered = factor * BUCKET_RATE;
    // Four clients per daemon, each paced: what is in flight at once stays bounded, as
    // from a handful of callers (many more in flight defeat the cache, see the assertion).
    let tasks = 8;
    let period = Duration::from_secs_f64(tasks as f64 / offered as f64);
    let load = grpc_runtime().block_on(async {
        let chans = [channel(nodes[0].grpc).await, channel(nodes[1].grpc).await];
        paced(
            chans.to_vec(),
            "hk".into(),
            "one-key".into(),
            tasks,
            period,
            run,
        )
        .await
    });
    let calls = script_calls(&redis) - before;
    let (mut store_checks, mut deny_hits) = (0, 0);
    let (mut store_s, mut store_n) = (0.0, 0.0);
    for n in &nodes {
        let m = n.metrics();
        store_checks += m.count("sluice_store_batched_calls_total");
        deny_hits += m.count("sluice_deny_cache_hits_total");
        store_s += m["sluice_store_duration_seconds_sum{store=\"default\"}"];
        store_n += m["sluice_store_duration_seconds_count{store=\"default\"}"];
    }
    let store_latency = Duration::from_secs_f64(store_s / store_n.max(1.0));
    let allowance = BUCKET_BURST as f64 + BUCKET_RATE as f64 * load.span().as_secs_f64();
    DenyRun {
        load,
        allowance,
        script_calls: calls,
        store_checks,
        deny_hits,
        store_latency,
    }
}

/// Cache on, then off, at `factor` × the limit: both admit what the bucket allows, and the
/// cache saves most store calls.
fn deny_cache_is_exact_at(factor: u64, run: Duration) {
    let _serial = serial();
    let on = deny_run(true, factor, run);
    let off = deny_run(false, factor, run);
    for (name, r) in [("cache on", &on), ("cache off", &off)] {
        let offered = r.load.requests as f64 / r.load.span().as_secs_f64();
        eprintln!(
            "{factor}x {name}: {} requests over {:.2} s ({offered:.0}/s, {:.1}x the rate), admitted {} of {:.1} the bucket allows, refused {}, errors {}; Redis script runs {} ({:.3} per request), checks sent to the store {} ({:.3} per request, mean store latency {:?}), deny-cache hits {}",
            r.load.requests,
            r.load.span().as_secs_f64(),
            offered / BUCKET_RATE as f64,
            r.load.allowed,
            r.allowance,
            r.load.denied,
            r.load.errors,
            r.script_calls,
            r.script_calls as f64 / r.load.requests as f64,
            r.store_checks,
            r.store_checks as f64 / r.load.requests as f64,
            r.store_latency,
            r.deny_hits,
        );
        assert_eq!(r.load.errors, 0, "{name}: {r:?}");
        // Far over the limit, or the comparison says nothing. Eight clients on this 2-core
        // machine do not always reach 50x (each request without the cache waits for Redis):
        // at least 8x, and the factor reached is printed.
        assert!(
            offered >= 8.0 * BUCKET_RATE as f64,
            "{name}: offered only {offered:.0}/s"
        );
        // Both daemons read the same system clock; two units of slack for the instants
        // between a daemon's reading and the client's.
        assert!(
            r.load.allowed as f64 <= r.allowance + 2.0,
            "{name} admitted {} past the bucket's {:.1}",
            r.load.allowed,
            r.allowance
        );
        assert!(
            r.load.allowed as f64 >= 0.98 * r.allowance,
            "{name} admitted {} of the bucket's {:.1}",
            r.load.allowed,
            r.allowance
        );
    }
    assert!(on.deny_hits > 0, "{on:?}");
    assert_eq!(off.deny_hits, 0, "{off:?}");
    // At best (no store latency) each token costs three calls with two daemons: the one
    // admitted and one refusal per daemon to re-arm its cache, 0.3 per request at 10x and
    // 0.06 at 50x. Requests in flight when a cached refusal lapses all go to the store, so
    // a slow store costs more: half at 10x, a third at 50x.
    let most = if factor >= 50 { 1.0 / 3.0 } else { 0.5 };
    let per_request = |r: &DenyRun| r.script_calls as f64 / r.load.requests as f64;
    assert!(
        per_request(&on) <= per_request(&off) * most,
        "script runs per request: cache on {:.3}, off {:.3}",
        per_request(&on),
        per_request(&off)
    );
}

#[test]
fn deny_cache_is_exact_at_10x() {
    deny_cache_is_exact_at(10, Duration::from_secs(10));
}

#[test]
fn deny_cache_is_exact_at_50x() {
    deny_cache_is_exact_at(50, Duration::from_secs(10));
}

// ---------------------------------------------------------------------------------------
// 2. Leases never overshoot, and what is not spent goes back.
// ---------------------------------------------------------------------------------------

const SHARED_LIMIT: u64 = 100;
const LEASE: u64 = 7;
const DAEMONS: usize = 4;

fn lease_rules() -> String {
    format!(
        "domain: hk\nrules:\n  - {{ id: shared, key: [user], algorithm: fixed_window, limit: {SHARED_LIMIT}, window: 1h, hot_keys: {{ lease: {LEASE} }} }}\n"
    )
}

/// The count Redis holds for `user`'s hourly window (0: no key).
fn window_count(redis: &RedisServer, user: &str) -> u64 {
    let keys = redis
        .cmd(&["KEYS", &format!("sl:{{hk|user={user}}}:f:shared:*")])
        .expect("KEYS");
    let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
    assert!(keys.len() <= 1, "one window: {keys:?}");
    keys.first().map_or(0, |k| {
        redis
            .cmd(&["GET", k])
            .expect("GET")
            .parse()
            .expect("a count")
    })
}

/// `per_daemon` checks for `user` on each daemon, three tasks per daemon at once, all
/// daemons together. The allowed answers per daemon.
fn burst_over(nodes: &[Node], user: &str, per_daemon: u64) -> Vec<u64> {
    grpc_runtime().block_on(async {
        let mut handles = Vec::new();
        for n in nodes {
            let ch = channel(n.grpc).await;
            let mut tasks = Vec::new();
            for t in 0..3u64 {
                let mut client = LimiterClient::new(ch.clone());
                let user = user.to_string();
                let count = per_daemon / 3 + u64::from(t < per_daemon % 3);
                tasks.push(tokio::spawn(async move {
                    let mut allowed = 0u64;
                    for _ in 0..count {
                        let r =
                            tokio::time::timeout(HANG, client.check(check_request("hk", &user)))
                                .await
                                .expect("answered")
                                .expect("check");
                        allowed += u64::from(r.get_ref().allowed);
                    }
                    allowed
                }));
            }
            handles.push(tasks);
        }
        let mut out = Vec::new();
        for tasks in handles {
            let mut allowed = 0;
            for t in tasks {
                allowed += t.await.expect("task");
            }
            out.push(allowed);
        }
        out
    })
}

/// Each daemon's lease counters: (leased units, returned, expired, lease calls, spent).
fn lease_counters(n: &Node) -> (u64, u64, u64, u64, u64) {
    let m = n.metrics();
    (
        m.count("sluice_leased_units_total"),
        m.count("sluice_lease_returned_units_total"),
        m.count("sluice_lease_expired_units_total"),
        m.count("sluice_lease_calls_total"),
        m.count("sluice_lease_spent_total"),
    )
}

/// Waits (bounded) until Redis holds `want` for `user`; the last count read.
fn wait_count(redis: &RedisServer, user: &str, want: u64) -> u64 {
    let deadline = Instant::now() + HANG;
    loop {
        let c = window_count(redis, user);
        if c == want || Instant::now() >= deadline {
            return c;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn leases_never_overshoot_and_unspent_units_go_back() {
    let _serial = serial();
    // The count lives in an hourly window.
    inside_an_hour();
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let rules = lease_rules();
    let mut nodes: Vec<Node> = (0..DAEMONS).map(|_| start(&redis, &rules, "")).collect();

    // Over the count: 4 daemons x 60 requests on one shared count of 100.
    let allowed = burst_over(&nodes, "shared", 60);
    let admitted: u64 = allowed.iter().sum();
    let at_end = window_count(&redis, "shared");
    eprintln!(
        "over the count: 240 requests on {DAEMONS} daemons leasing {LEASE} at a time, admitted {admitted} ({allowed:?}) of {SHARED_LIMIT}; Redis counted {at_end} when the load stopped"
    );
    assert!(
        admitted <= SHARED_LIMIT,
        "admitted {admitted} past {SHARED_LIMIT}"
    );
    // At most a lease's leftover (LEASE - 1) per daemon is unspent when the load stops.
    assert!(
        admitted >= SHARED_LIMIT - DAEMONS as u64 * (LEASE - 1),
        "admitted only {admitted}"
    );
    assert!(at_end <= SHARED_LIMIT, "{at_end}");
    let back = wait_count(&redis, "shared", admitted);
    assert_eq!(
        back, admitted,
        "Redis holds what was admitted once leases went back"
    );
    let admitted_shared = admitted;

    // Under the count: 10 requests per daemon. Each daemon takes two leases (14 units),
    // spends 10 and gives 4 back once the key is quiet.
    let allowed = burst_over(&nodes, "under", 10);
    let admitted: u64 = allowed.iter().sum();
    let at_end = window_count(&redis, "under");
    assert_eq!(admitted, 40, "all under the count: {allowed:?}");
    assert!(at_end >= admitted, "leased before spent: {at_end}");
    let back = wait_count(&redis, "under", admitted);
    let counters: Vec<_> = nodes.iter().map(lease_counters).collect();
    eprintln!(
        "under the count: 40 requests admitted; Redis counted {at_end} when the load stopped and {back} once the quiet leases went back; per daemon (leased, returned, expired, lease calls, spent): {counters:?}"
    );
    assert_eq!(back, admitted, "unspent leased units came back");
    for (i, &(_, returned, expired, _, _)) in counters.iter().enumerate() {
        assert!(returned > 0, "daemon {i} gave nothing back: {counters:?}");
        assert_eq!(expired, 0, "an hourly window does not end in the test");
    }
    // Every unit leased was admitted or came back (both keys, all daemons).
    let leased: u64 = counters.iter().map(|c| c.0).sum();
    let returned: u64 = counters.iter().map(|c| c.1).sum();
    assert_eq!(
        leased - returned,
        admitted_shared + admitted,
        "leased {leased} - returned {returned} = admitted on both keys"
    );

    // At shutdown: a burst, then SIGTERM at once; what the leases held goes back on the way
    // out (or with the quiet sweep, if it came first).
    let allowed = burst_over(&nodes, "term", 10);
    let admitted: u64 = allowed.iter().sum();
    let at_end = window_count(&redis, "term");
    for n in &mut nodes {
        let status = n.daemon.terminate(Duration::from_secs(20)).expect("exits");
        assert!(status.success(), "{status:?}");
    }
    let back = window_count(&redis, "term");
    eprintln!(
        "at SIGTERM: 40 requests admitted {admitted}; Redis counted {at_end} when the load stopped, {back} after the daemons exited"
    );
    assert_eq!(admitted, 40);
    assert_eq!(back, admitted, "shutdown gives back what was not spent");
}

// ---------------------------------------------------------------------------------------
// 3. `lease: auto` at the highest rate a daemon serves here.
// ---------------------------------------------------------------------------------------

fn auto_rules(rate: u64) -> String {
    // A burst of two seconds' rate: a stall of the loaded machine shorter than that loses
    // no tokens, so what the key admits stays what the bucket allows.
    format!(
        "domain: hk\nrules:\n  - {{ id: auto, key: [user], algorithm: token_bucket, rate_per_s: {rate}, burst: {}, hot_keys: {{ lease: auto }} }}\n",
        2 * rate
    )
}

/// A `sluice-bench` run on the one key `<prefix>0` of domain `hk`: its JSON report.
fn bench(grpc: SocketAddr, prefix: &str, args: &[&str]) -> Value {
    let bin =
        cargo_bin("sluice-bench").expect("sluice-bench is built (cargo build --workspace --bins)");
    let out = std::process::Command::new(bin)
        .args([
            "--api",
            "grpc",
            "--addr",
            &grpc.to_string(),
            "--domain",
            "hk",
            "--key-name",
            "user",
            "--key-prefix",
            prefix,
            "--dist",
            "hot",
            "--warmup",
            "0",
            "--timeout-ms",
            "5000",
            "--json",
            "--quiet",
        ])
        .args(args)
        .output()
        .expect("run sluice-bench");
    assert!(
        out.status.success(),
        "sluice-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("sluice-bench JSON")
}

const ORDINARY: usize = 10;
const ORDINARY_RATE: u64 = 20;

#[test]
fn lease_auto_serves_a_hot_key_locally_and_ordinary_keys_exactly() {
    let _serial = serial();
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    // No stale bound: a call refused by it is sent again, and Redis would see two calls for
    // one store call on this busy machine.
    let config = "store_stale_after_ms: 0\n";

    // The highest rate a daemon serves here: a closed loop on one leased key (so Redis is
    // not what limits it), 64 requests in flight.
    let probe = start(&redis, &auto_rules(1_000_000), config);
    let sat = bench(
        probe.grpc,
        "probe",
        &[
            "--concurrency",
            "64",
            "--connections",
            "4",
            "--duration",
            "3",
        ],
    );
    drop(probe);
    redis.cmd(&["FLUSHALL"]).expect("FLUSHALL");
    let max = sat["decisions_per_s"].as_f64().expect("decisions_per_s");
    eprintln!(
        "saturation, one leased key, closed loop: {max:.0} decisions/s (client CPU share {} of 2 cores)",
        sat["client_cpu_share"]
    );
    // Offer 60% of it (an open loop keeps its schedule only below saturation, here beside
    // the ordinary keys' load and MONITOR), and limit the key at half of that.
    let offered = (max * 0.6).floor().max(400.0);
    let rate = (offered / 2.0).floor() as u64;
    let batch = (rate / 100).max(1);
    let seconds = 10.0;
    let node = start(&redis, &auto_rules(rate), config);
    let key = |u: &str| format!("sl:{{hk|user={u}}}:t:auto");
    let ordinary: Vec<String> = (0..ORDINARY).map(|i| format!("o{i}")).collect();
    let mut keys: Vec<String> = ordinary.iter().map(|u| key(u)).collect();
    keys.push(key("hot0"));
    let scripts_before = script_calls(&redis);
    let monitor = Monitor::start(redis.addr(), keys);
    let m0 = node.metrics();

    // The ordinary keys, 20/s each, beside the hot key's load for as long as it runs.
    let grpc = node.grpc;
    let ordinary_load = std::thread::spawn({
        let ordinary = ordinary.clone();
        move || {
            grpc_runtime().block_on(async {
                let ch = channel(grpc).await;
                let runs = ordinary.iter().map(|u| {
                    paced(
                        vec![ch.clone()],
                        "hk".into(),
                        u.clone(),
                        1,
                        Duration::from_millis(1000 / ORDINARY_RATE),
                        Duration::from_secs_f64(seconds + 0.5),
                    )
                });
                join_loads(runs).await
            })
        }
    });
    let hot = bench(
        node.grpc,
        "hot",
        &[
            "--rate",
            &offered.to_string(),
            "--duration",
            &seconds.to_string(),
            "--concurrency",
            "128",
            "--connections",
            "4",
        ],
    );
    let ordinary_loads = ordinary_load.join().expect("ordinary load");
    // Quiet leases go back within a sweep or two; then Redis has seen everything.
    let deadline = Instant::now() + HANG;
    let mut m1 = node.metrics();
    while m1.count("sluice_leases") > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        m1 = node.metrics();
    }
    std::thread::sleep(Duration::from_millis(300));
    let (seen, monitor_scripts) = monitor.finish();
    let scripts = script_calls(&redis) - scripts_before;
    // Before the load a rule's decision series may not exist yet: 0.
    let d = |name: &str| m1.count(name) - m0.count_or_zero(name);

    let ordinary_requests: u64 = ordinary_loads.iter().map(|l| l.requests).sum();
    let checks = d("sluice_checks_total{code=\"OK\"}")
        + d("sluice_checks_total{code=\"OVER_LIMIT\"}")
        + d("sluice_checks_total{code=\"UNAVAILABLE\"}");
    let hot_requests = checks - ordinary_requests;
    let admitted = d("sluice_decisions_total{domain=\"hk\",rule=\"auto\",outcome=\"allowed\"}")
        - ordinary_requests;
    let h = &seen[&key("hot0")];
    let hot_calls = h.checks + h.give_backs;
    let lease_calls = d("sluice_lease_calls_total");
    let store_calls = d("sluice_store_duration_seconds_count{store=\"default\"}");
    // What the bucket allows between the first and the last check Redis saw for the key
    // (the key is fresh: its bucket starts full), on the daemon's own clock.
    let span_us = h.last_now.unwrap_or(0) - h.first_now.unwrap_or(0);
    let allowance = (2 * rate) as f64 + rate as f64 * span_us as f64 / 1e6;
    let served = hot["decisions_per_s"].as_f64().unwrap_or(0.0);
    eprintln!(
        "lease: auto: offered {offered:.0}/s for {seconds} s (bench: {served} decisions/s, allowed {}, denied {}, errors {}, unsent {}, client CPU share {}); limit {rate}/s, burst {}, batch {batch}: admitted {admitted} of the {allowance:.0} the bucket allows over the {:.3} s Redis saw ({:+.3}%); hot requests {hot_requests}, hot-key calls Redis saw {hot_calls} ({:.3}% of them: {} checks, {} give-backs; lease calls {lease_calls}, units leased {}, returned {}, blocked {}, spent {}); ordinary: {ordinary_requests} requests ({:?} per key), Redis checks per key {:?}; daemon store calls {store_calls}, Redis script runs {scripts} (MONITOR saw {monitor_scripts})",
        hot["allowed"],
        hot["denied"],
        hot["errors"],
        hot["unsent"],
        hot["client_cpu_share"],
        2 * rate,
        span_us as f64 / 1e6,
        (admitted as f64 / allowance - 1.0) * 100.0,
        hot_calls as f64 * 100.0 / hot_requests as f64,
        h.checks,
        h.give_backs,
        d("sluice_leased_units_total"),
        d("sluice_lease_returned_units_total"),
        d("sluice_lease_blocked_total"),
        d("sluice_lease_spent_total"),
        ordinary_loads
            .iter()
            .map(|l| l.requests)
            .collect::<Vec<_>>(),
        ordinary
            .iter()
            .map(|u| seen[&key(u)].checks)
            .collect::<Vec<_>>(),
    );
    // The hot key: over its limit, admitted what its bucket allows (never more; at most a
    // batch stranded at the end and the tokens left less).
    assert!(
        hot_requests as f64 >= 1.5 * allowance,
        "the hot key must be over its limit: {hot_requests} requests"
    );
    assert!(
        admitted as f64 <= allowance + 1.0,
        "admitted {admitted}, the bucket allows {allowance:.1}"
    );
    assert!(
        admitted as f64 >= 0.99 * allowance,
        "admitted {admitted}, the bucket allows {allowance:.1}"
    );
    // Rarely at Redis: about one lease call a batch (a grant says what the bucket still
    // holds, so a daemon that spent its batch waits for the next one to be there instead
    // of asking to be refused), plus the requests before the sketch saw the key hot (above
    // one batch a second, at least 100). With `auto`'s batch of 1% of the rate that is
    // ~100 calls a second whatever the rate, so the share of requests falls as the rate
    // rises: 2% or less from about 6,000 requests/s (a release daemon here serves
    // ~13,000-16,000/s closed loop, a debug one ~3,000-4,700/s). The bound below holds at
    // any rate this machine reaches; the share is printed, and measured at 43,000-47,000/s
    // by bench/hot-keys.sh (docs/hot-keys.md).
    assert!(
        h.checks <= admitted / batch + admitted / (4 * batch) + batch.max(100) + 200,
        "{} checks for {admitted} admitted in batches of {batch}",
        h.checks
    );
    eprintln!(
        "{hot_calls} of {hot_requests} hot requests reached Redis ({:.2}%) at {served:.0}/s served",
        100.0 * hot_calls as f64 / hot_requests.max(1) as f64
    );
    // The ordinary keys: every request one store call, none leased or cached.
    for (u, l) in ordinary.iter().zip(&ordinary_loads) {
        assert_eq!(l.errors, 0, "{u}: {l:?}");
        assert_eq!(l.denied, 0, "{u}: {l:?}");
        let c = &seen[&key(u)];
        assert_eq!(
            c.checks, l.requests,
            "{u}: one store call per request ({l:?})"
        );
        assert_eq!(c.give_backs, 0, "{u}: never leased");
    }
    // What the daemon counted agrees: its store calls are the ordinary keys' and the hot
    // key's checks Redis saw.
    assert_eq!(
        store_calls,
        ordinary_requests + h.checks,
        "store calls: ordinary {ordinary_requests}, hot {}",
        h.checks
    );
}

/// Runs the loads together, each on a task of its own.
async fn join_loads<F>(futs: impl Iterator<Item = F>) -> Vec<Load>
where
    F: std::future::Future<Output = Load> + Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("load"));
    }
    out
}
