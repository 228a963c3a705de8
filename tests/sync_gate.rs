//! The sync gate and the tiered limiter end to end: real `sluiced` processes on a real
//! `redis-server` (docs/hot-keys.md, "The sync gate and the local share").
//!
//! - `sync_gate_through_two_daemons`: one key offered 10× its limit through two daemons,
//!   `sync_interval` 1 s and then 200 ms: what they admit lies between the limit and the
//!   design's bound (below), Redis sees a few calls per second instead of one per request,
//!   and once the daemons' last syncs are in, Redis holds exactly what was admitted.
//! - `pending_units_survive_a_redis_stall`: Redis stopped (SIGSTOP) under a gated key: the
//!   gate keeps deciding while its last answer is under three intervals old, its syncs fail
//!   and keep their units, then it stops deciding and the rule's `on_store_failure` answers;
//!   after SIGCONT the units admitted during the stall reach Redis.
//! - `tiered_share_across_three_daemons`: `local_share: true` with three daemons of one
//!   region (gossip): balanced, each admits at most its third by itself and most of the limit
//!   is admitted without a store call; all on one daemon, it still reaches the limit, past
//!   its share through the store.
//!
//! Every assertion is on answers, `/metrics` and what Redis saw (`MONITOR`, the counts it
//! holds), never on how long something took; the loads run for a bounded time and every wait
//! is for a counter, bounded.
//!
//! # The bounds
//!
//! A daemon admits by itself while its unsynced units (pending, plus the sync in flight) fit
//! the *budget* its last store answer left: L − C(a), C(a) the shared count at that answer.
//! So whatever it admits is within the limit but for what the other daemons added that the
//! answer did not see: units they had not synced yet at `a`, and those they admitted since.
//! Each daemon's unsynced units are at most two sync calls' worth (the one in flight and the
//! next one's pending), so with `m` the largest sync call Redis saw for the key:
//!
//! - sync gate, D daemons: admitted ≤ L + 2·(D − 1)·m, plus the requests the store admitted
//!   in the same span (each daemon's first few, before its gate exists: `to_store`);
//! - tiered: a request past the share is admitted by the store only while its count is
//!   under L, with every daemon's unsynced units not in it yet: admitted ≤ L + 2·D·m.
//!
//! And never fewer than L once a request was refused: a gate refuses only when its unsynced
//! units fill the budget (then C(a) + those units ≥ L were admitted), the store only when its
//! count is at L.

use sluice_proto::sluice::v1::{Code, limiter_client::LimiterClient};
use sluice_testkit::{Monitor, RedisServer, free_ports};
use sluice_tests::common::load::{self, Load, channel, check_request, grpc_runtime};
use sluice_tests::common::node::{Node, start};
use sluice_tests::common::{HANG, inside_an_hour, serial};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::transport::Channel;

/// The hourly window every rule here counts in.
const HOUR_US: u64 = 3_600_000_000;

/// The gate's counters of one daemon.
#[derive(Debug, Default, Clone, Copy)]
struct GateCounters {
    admitted: u64,
    refused: u64,
    to_store: u64,
    sync_calls: u64,
    synced_units: u64,
    sync_failures: u64,
    gates: u64,
    /// Requests refused from the deny cache (on by default): a store refusal remembered,
    /// so a request the gate sent on need not reach Redis.
    deny_hits: u64,
}

impl GateCounters {
    fn of(n: &Node) -> GateCounters {
        let m = n.metrics();
        GateCounters {
            admitted: m.count("sluice_gate_admitted_total"),
            refused: m.count("sluice_gate_refused_total"),
            to_store: m.count("sluice_gate_to_store_total"),
            sync_calls: m.count("sluice_sync_calls_total"),
            synced_units: m.count("sluice_synced_units_total"),
            sync_failures: m.count("sluice_sync_failures_total"),
            gates: m.count("sluice_gates"),
            deny_hits: m.count("sluice_deny_cache_hits_total"),
        }
    }

    fn sum(all: &[GateCounters]) -> GateCounters {
        all.iter()
            .fold(GateCounters::default(), |a, c| GateCounters {
                admitted: a.admitted + c.admitted,
                refused: a.refused + c.refused,
                to_store: a.to_store + c.to_store,
                sync_calls: a.sync_calls + c.sync_calls,
                synced_units: a.synced_units + c.synced_units,
                sync_failures: a.sync_failures + c.sync_failures,
                gates: a.gates + c.gates,
                deny_hits: a.deny_hits + c.deny_hits,
            })
    }
}

/// Waits (bounded) until `done` holds for the counters of every node; the last ones read.
fn wait_counters(
    nodes: &[&Node],
    what: &str,
    done: impl Fn(&GateCounters) -> bool,
) -> Vec<GateCounters> {
    let deadline = Instant::now() + HANG;
    loop {
        let c: Vec<GateCounters> = nodes.iter().map(|n| GateCounters::of(n)).collect();
        if c.iter().all(&done) {
            return c;
        }
        assert!(Instant::now() < deadline, "{what}: {c:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The Redis key of `user`'s count under rule `rule` of domain `sg` in this hour.
fn window_key(rule: &str, user: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    format!("sl:{{sg|user={user}}}:f:{rule}:{}", now / HOUR_US * HOUR_US)
}

/// The count Redis holds at `key` (0: no key).
fn count(redis: &RedisServer, key: &str) -> u64 {
    let v = redis.cmd(&["GET", key]).expect("GET");
    if v.is_empty() {
        0
    } else {
        v.parse().expect("a count")
    }
}

/// `tasks` tasks, task `t` on the daemon of `nodes[t % len]`, together offering `rate`
/// checks a second for `user` until `run` has passed ([`load::paced`]).
fn paced(nodes: &[&Node], user: &str, tasks: usize, rate: f64, run: Duration) -> Load {
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.grpc).collect();
    grpc_runtime().block_on(async {
        let mut chans = Vec::new();
        for a in &addrs {
            chans.push(channel(*a).await);
        }
        let period = Duration::from_secs_f64(tasks as f64 / rate);
        load::paced(chans, "sg".into(), user.into(), tasks, period, run).await
    })
}

// ---------------------------------------------------------------------------------------
// 1. The sync gate through two daemons.
// ---------------------------------------------------------------------------------------

const GATE_LIMIT: u64 = 1000;
/// 10× the limit over the run.
const GATE_RATE: f64 = 1_600.0;
const GATE_RUN: Duration = Duration::from_secs(6);

fn gate_rules(interval: &str) -> String {
    format!(
        "domain: sg\nrules:\n  - {{ id: gate, key: [user], algorithm: fixed_window, limit: {GATE_LIMIT}, window: 1h, on_store_failure: closed, hot_keys: {{ sync_interval: {interval} }} }}\n"
    )
}

fn sync_gate_run(interval: &str) {
    inside_an_hour();
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let rules = gate_rules(interval);
    let nodes = [start(&redis, &rules, ""), start(&redis, &rules, "")];
    let refs: Vec<&Node> = nodes.iter().collect();
    let user = "one-key";
    let key = window_key("gate", user);
    let monitor = Monitor::start(redis.addr(), vec![key.clone()]);
    // Four clients per daemon.
    let load = paced(&refs, user, 8, GATE_RATE, GATE_RUN);
    // Every unit a gate admitted is synced, and the gates go quiet (no sync after that).
    let after = wait_counters(&refs, "the daemons' last syncs", |c| {
        c.synced_units >= c.admitted && c.gates == 0
    });
    let (seen, _) = monitor.finish();
    let held = count(&redis, &key);
    let t = GateCounters::sum(&after);
    let k = &seen[&key];
    let d = nodes.len() as u64;
    let bound = GATE_LIMIT + 2 * (d - 1) * k.max_cost + t.to_store;
    eprintln!(
        "sync gate {interval}, {d} daemons: {} requests over {:.2} s ({:.0}/s, {:.1}x the limit in all), admitted {} of limit {GATE_LIMIT} ({:+.1}%, bound {bound}: largest sync call {} units), refused {}, errors {}; by the gates: admitted {}, refused {}, to the store {} (deny-cache hits {}); sync calls {} ({} units, {} failed); Redis: {} check calls for the key ({:.4} per request), holds {held}",
        load.requests,
        load.span().as_secs_f64(),
        load.rate(),
        load.requests as f64 / GATE_LIMIT as f64,
        load.allowed,
        (load.allowed as f64 / GATE_LIMIT as f64 - 1.0) * 100.0,
        k.max_cost,
        load.denied,
        load.errors,
        t.admitted,
        t.refused,
        t.to_store,
        t.deny_hits,
        t.sync_calls,
        t.synced_units,
        t.sync_failures,
        k.checks,
        k.checks as f64 / load.requests as f64,
    );
    assert_eq!(load.errors, 0, "{load:?}");
    assert!(
        load.requests >= 5 * GATE_LIMIT,
        "the key must be far over its limit: {load:?}"
    );
    assert!(load.denied > 0, "{load:?}");
    assert!(
        load.allowed >= GATE_LIMIT,
        "a refusal means the limit was reached: admitted {}",
        load.allowed
    );
    assert!(
        load.allowed <= bound,
        "admitted {} past the bound {bound}",
        load.allowed
    );
    // Every answer but a key's first few was the gate's.
    assert_eq!(t.admitted + t.refused + t.to_store, load.requests, "{t:?}");
    assert_eq!(t.sync_failures, 0, "{t:?}");
    // Every admitted unit reached the shared count, once.
    assert_eq!(t.synced_units, t.admitted, "{t:?}");
    assert_eq!(held, load.allowed, "Redis holds what was admitted");
    // Redis saw the sync calls and the requests sent on to the store, nothing else.
    assert_eq!(k.checks, t.sync_calls + t.to_store - t.deny_hits, "{t:?}");
    assert!(
        k.checks * 20 <= load.requests,
        "{} check calls for {} requests",
        k.checks,
        load.requests
    );
}

#[test]
fn sync_gate_through_two_daemons() {
    let _serial = serial();
    sync_gate_run("1s");
    sync_gate_run("200ms");
}

// ---------------------------------------------------------------------------------------
// 2. Pending units survive a Redis stall.
// ---------------------------------------------------------------------------------------

/// One check on `client`: its code.
async fn one(client: &mut LimiterClient<Channel>, user: &str) -> Code {
    let r = tokio::time::timeout(HANG, client.check(check_request("sg", user)))
        .await
        .expect("answered")
        .expect("check");
    r.get_ref().code()
}

#[test]
fn pending_units_survive_a_redis_stall() {
    let _serial = serial();
    inside_an_hour();
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    // Two seconds: the gate decides for six after its last answer.
    let node = start(&redis, &gate_rules("2s"), "");
    let user = "stalled";
    let key = window_key("gate", user);
    let rt = grpc_runtime();
    let mut client = rt.block_on(async { LimiterClient::new(channel(node.grpc).await) });
    let mut admitted = 0u64;

    // The first request makes the gate; five more are its own; their sync is answered.
    for _ in 0..6 {
        assert_eq!(rt.block_on(one(&mut client, user)), Code::Ok);
        admitted += 1;
    }
    let before = wait_counters(&[&node], "the first sync", |c| c.sync_calls >= 1)[0];
    assert_eq!(before.admitted, 5, "{before:?}");
    assert_eq!(count(&redis, &key), 6);

    redis.pause().expect("SIGSTOP");
    // The gate decides while its last answer is fresh: these never wait for Redis.
    for _ in 0..10 {
        assert_eq!(rt.block_on(one(&mut client, user)), Code::Ok);
        admitted += 1;
    }
    let during = GateCounters::of(&node);
    assert_eq!(during.admitted, before.admitted + 10, "{during:?}");
    // Its sync fails and keeps the units.
    let failed = wait_counters(&[&node], "a failed sync", |c| c.sync_failures >= 1)[0];
    // Three intervals after its last answer the gate stops deciding: the next request goes
    // to the (stopped) store and the rule's on_store_failure (closed) answers.
    // One request every 50 ms (pacing, not a wait): far from the budget.
    let mut stall_admitted = 10;
    let deadline = Instant::now() + HANG;
    let unavailable = loop {
        match rt.block_on(one(&mut client, user)) {
            Code::Ok => {
                admitted += 1;
                stall_admitted += 1;
            }
            c => break c,
        }
        assert!(Instant::now() < deadline, "the gate never stopped deciding");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stale = GateCounters::of(&node);
    eprintln!(
        "Redis stopped: {stall_admitted} requests admitted by the gate ({} syncs failed by then), then {unavailable:?}; gate counters {stale:?}",
        failed.sync_failures
    );
    assert_eq!(unavailable, Code::Unavailable, "on_store_failure: closed");
    assert_eq!(stale.to_store, before.to_store + 1, "{stale:?}");
    assert_eq!(stale.synced_units, before.synced_units, "{stale:?}");
    assert_eq!(
        stale.admitted,
        before.admitted + stall_admitted,
        "{stale:?}"
    );

    redis.resume().expect("SIGCONT");
    let after = wait_counters(&[&node], "the units synced after SIGCONT", |c| {
        c.synced_units >= c.admitted
    })[0];
    let held = count(&redis, &key);
    eprintln!(
        "after SIGCONT: gate counters {after:?}; Redis holds {held} for {admitted} admitted ({stall_admitted} during the stall)"
    );
    assert_eq!(after.synced_units, after.admitted, "{after:?}");
    assert_eq!(
        held, admitted,
        "the units admitted during the stall reached Redis, once"
    );
    // And the gate decides again.
    assert_eq!(rt.block_on(one(&mut client, user)), Code::Ok);
    let again = GateCounters::of(&node);
    assert_eq!(again.admitted, after.admitted + 1, "{again:?}");
}

// ---------------------------------------------------------------------------------------
// 3. Tiered across three daemons of one region.
// ---------------------------------------------------------------------------------------

const SHARE_LIMIT: u64 = 900;
const REGION_DAEMONS: usize = 3;
/// 2× the limit over the run.
const SHARE_RATE: f64 = 600.0;
const SHARE_RUN: Duration = Duration::from_secs(3);

fn share_rules() -> String {
    format!(
        "domain: sg\nrules:\n  - {{ id: share, key: [user], algorithm: fixed_window, limit: {SHARE_LIMIT}, window: 1h, hot_keys: {{ local_share: true }} }}\n"
    )
}

/// Three daemons of region `eu` on one Redis, gossiping: each one's membership has three.
fn region(redis: &RedisServer) -> Vec<Node> {
    let gossip: Vec<u16> = free_ports(REGION_DAEMONS);
    let nodes: Vec<Node> = (0..REGION_DAEMONS)
        .map(|i| {
            let seeds: Vec<String> = gossip
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, p)| format!("\"127.0.0.1:{p}\""))
                .collect();
            let extra = format!(
                "region: eu\ndaemon_id: eu-{i}\ngossip: {{ addr: \"127.0.0.1:{}\", seeds: [{}], cluster_id: e2e-sync-gate, key: \"e2e sync gate gossip key, 32 b!\" }}\n",
                gossip[i],
                seeds.join(", ")
            );
            start(redis, &share_rules(), &extra)
        })
        .collect();
    let deadline = Instant::now() + HANG;
    loop {
        let live: Vec<u64> = nodes
            .iter()
            .map(|n| n.metrics().count("sluice_gossip_live_nodes"))
            .collect();
        if live.iter().all(|&l| l == REGION_DAEMONS as u64) {
            break;
        }
        assert!(Instant::now() < deadline, "membership: {live:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    nodes
}

/// What one tiered run measured.
#[derive(Debug)]
struct ShareRun {
    load: Load,
    /// Per daemon, over the run.
    counters: Vec<GateCounters>,
    held: u64,
    checks: u64,
    max_cost: u64,
}

/// `user` offered 2× the limit through `loaded` (indices into `nodes`).
fn share_run(redis: &RedisServer, nodes: &[Node], loaded: &[usize], user: &str) -> ShareRun {
    let all: Vec<&Node> = nodes.iter().collect();
    let on: Vec<&Node> = loaded.iter().map(|&i| &nodes[i]).collect();
    let key = window_key("share", user);
    let before: Vec<GateCounters> = all.iter().map(|n| GateCounters::of(n)).collect();
    let monitor = Monitor::start(redis.addr(), vec![key.clone()]);
    let load = paced(&on, user, 3 * on.len(), SHARE_RATE, SHARE_RUN);
    let after = wait_counters(&all, "the daemons' last syncs", |c| {
        c.synced_units >= c.admitted && c.gates == 0
    });
    let (seen, _) = monitor.finish();
    let counters = after
        .iter()
        .zip(&before)
        .map(|(a, b)| GateCounters {
            admitted: a.admitted - b.admitted,
            refused: a.refused - b.refused,
            to_store: a.to_store - b.to_store,
            sync_calls: a.sync_calls - b.sync_calls,
            synced_units: a.synced_units - b.synced_units,
            sync_failures: a.sync_failures - b.sync_failures,
            gates: a.gates,
            deny_hits: a.deny_hits - b.deny_hits,
        })
        .collect();
    ShareRun {
        load,
        counters,
        held: count(redis, &key),
        checks: seen[&key].checks,
        max_cost: seen[&key].max_cost,
    }
}

/// What every tiered run must show: the limit reached and not passed by more than the lag,
/// no daemon past its share by itself, every admitted unit in Redis once.
fn share_holds(name: &str, r: &ShareRun) {
    let t = GateCounters::sum(&r.counters);
    let d = REGION_DAEMONS as u64;
    let share = SHARE_LIMIT / d;
    let bound = SHARE_LIMIT + 2 * d * r.max_cost;
    let store_admitted = r.load.allowed - t.admitted;
    eprintln!(
        "tiered, {name}: {} requests over {:.2} s ({:.0}/s, {:.1}x the limit), admitted {} of limit {SHARE_LIMIT} ({:+.1}%, bound {bound}: largest sync call {} units), refused {}, errors {}; admitted locally {} (per daemon {:?}, share {share}), by the store {store_admitted}; past the gates {} ({} of them refused from the deny cache), sync calls {}; Redis: {} check calls for the key ({:.3} per request), holds {}",
        r.load.requests,
        r.load.span().as_secs_f64(),
        r.load.rate(),
        r.load.requests as f64 / SHARE_LIMIT as f64,
        r.load.allowed,
        (r.load.allowed as f64 / SHARE_LIMIT as f64 - 1.0) * 100.0,
        r.max_cost,
        r.load.denied,
        r.load.errors,
        t.admitted,
        r.counters.iter().map(|c| c.admitted).collect::<Vec<_>>(),
        t.to_store,
        t.deny_hits,
        t.sync_calls,
        r.checks,
        r.checks as f64 / r.load.requests as f64,
        r.held,
    );
    assert_eq!(r.load.errors, 0, "{name}: {:?}", r.load);
    assert!(
        r.load.requests >= 3 * SHARE_LIMIT / 2,
        "{name}: the key must be over its limit: {:?}",
        r.load
    );
    assert!(r.load.denied > 0, "{name}: {:?}", r.load);
    // Only the store refuses, and only at the limit.
    assert_eq!(t.refused, 0, "{name}: {t:?}");
    assert!(
        r.load.allowed >= SHARE_LIMIT,
        "{name}: admitted {} of {SHARE_LIMIT}",
        r.load.allowed
    );
    assert!(
        r.load.allowed <= bound,
        "{name}: admitted {} past the bound {bound}",
        r.load.allowed
    );
    // A share counts every admission of its daemon: none admits more than it by itself.
    for (i, c) in r.counters.iter().enumerate() {
        assert!(
            c.admitted <= share,
            "{name}: daemon {i} admitted {} by itself, its share is {share}",
            c.admitted
        );
    }
    assert_eq!(t.sync_failures, 0, "{name}: {t:?}");
    assert_eq!(t.synced_units, t.admitted, "{name}: {t:?}");
    assert_eq!(
        r.held, r.load.allowed,
        "{name}: Redis holds what was admitted"
    );
    assert_eq!(
        r.checks,
        t.sync_calls + t.to_store - t.deny_hits,
        "{name}: {t:?}"
    );
}

#[test]
fn tiered_share_across_three_daemons() {
    let _serial = serial();
    inside_an_hour();
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let nodes = region(&redis);

    let balanced = share_run(&redis, &nodes, &[0, 1, 2], "balanced");
    share_holds("balanced", &balanced);
    let t = GateCounters::sum(&balanced.counters);
    // Most of the limit admitted without a store call: each daemon's share, less its first
    // requests (to the store before its gate exists) and what the store admitted past the
    // shares of the others.
    assert!(
        2 * t.admitted > balanced.load.allowed,
        "admitted locally {} of {}",
        t.admitted,
        balanced.load.allowed
    );

    let one = share_run(&redis, &nodes, &[0], "unbalanced");
    share_holds("all on one daemon", &one);
    let t = GateCounters::sum(&one.counters);
    // Past its share the store decides: the rest of the limit came through it.
    assert!(
        one.load.allowed - t.admitted >= SHARE_LIMIT - SHARE_LIMIT / REGION_DAEMONS as u64,
        "the store admitted {} past the share",
        one.load.allowed - t.admitted
    );
}
