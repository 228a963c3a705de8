//! A real Redis Cluster: 3 primaries with a replica each, built by sluice-testkit with
//! `redis-cli --cluster create`.
//!
//! Shows that one identity's keys (every algorithm, window suffixes included) share one slot,
//! that the store's shard numbers name the node owning the slot, that the conformance suite
//! holds on a cluster, and that migrating the identity's slot while checks run loses no
//! decision: every check answers, and the final counts equal the admissions exactly.

mod common;

use common::cases::{self, T0, call, check, item};
use sluice_core::Params;
use sluice_core::Rate;
use sluice_core::algo::Window;
use sluice_core::time::SECOND;
use sluice_store::redis::{RedisClusterStore, RedisConfig, item_keys, key_slot};
use sluice_store::{Store, StoreError};
use sluice_testkit::RedisCluster;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn start_cluster() -> RedisCluster {
    match RedisCluster::start(3, 1) {
        Ok(c) => c,
        Err(e) => panic!("this test needs redis-server and redis-cli for a real cluster: {e:#}"),
    }
}

async fn cluster_store(cluster: &RedisCluster) -> RedisClusterStore {
    let cfg = RedisConfig {
        timeout_ms: 2_000,
        connect_timeout_ms: 2_000,
        ..RedisConfig::cluster(cluster.urls())
    };
    let store = RedisClusterStore::connect(&cfg)
        .await
        .expect("cluster store");
    assert_eq!(store.kind(), "redis_cluster");
    store
}

fn every_algorithm(identity: &str) -> Vec<sluice_core::batch::Item> {
    let k = |r: &str| format!("sl:{{{identity}}}:{r}");
    vec![
        item(
            &k("tb"),
            Params::TokenBucket {
                rate: Rate::per_second(1),
                burst: 1_000_000,
            },
        ),
        item(
            &k("gcra"),
            Params::Gcra {
                rate: Rate::per_second(1_000),
                burst: 1_000,
            },
        ),
        item(
            &k("fw"),
            Params::FixedWindow {
                limit: 1_000_000,
                window: Window::Epoch(3_600 * SECOND),
            },
        ),
        item(
            &k("sw"),
            Params::SlidingWindow {
                limit: 1_000_000,
                window: 60 * SECOND,
                start: Default::default(),
            },
        ),
        item(
            &k("sl"),
            Params::SlidingLog {
                limit: 10_000,
                window: 60 * SECOND,
            },
        ),
        item(
            &k("cc"),
            Params::Concurrency {
                limit: 1_000_000,
                timeout: 60 * SECOND,
            },
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_slots_conformance_and_live_migration() {
    let cluster = start_cluster();
    let store = Arc::new(cluster_store(&cluster).await);
    assert_eq!(cluster.primaries().expect("primaries").len(), 3);

    // One identity, every algorithm: one slot, so one script call.
    let items = every_algorithm("d|api_key=k_8f2a");
    let keys: Vec<String> = items.iter().flat_map(|i| item_keys(i, T0)).collect();
    let slot = key_slot(&keys[0]);
    for k in &keys {
        assert_eq!(key_slot(k), slot, "{k}");
        assert_eq!(cluster.slot_of(k).expect("CLUSTER KEYSLOT"), slot, "{k}");
    }
    let r = check(&*store, &call(T0, 1, "r1", items.clone())).await;
    assert!(r.allowed);

    // Shard numbers name the node that owns the slot.
    assert!(store.refresh_shards().await);
    let nodes = store.shard_nodes();
    for probe in ["sl:{a}:x", "sl:{b}:x", "sl:{c}:x", "sl:{d}:x", &keys[0]] {
        let owner = cluster.node_for_key(probe).expect("owner");
        let port = cluster.node(owner).port();
        let shard = store.shard_of(probe);
        assert_eq!(nodes[shard], format!("127.0.0.1:{port}"), "{probe}");
    }
    let distinct: std::collections::HashSet<usize> = (0..200)
        .map(|i| store.shard_of(&format!("sl:{{id{i}}}:r")))
        .collect();
    assert_eq!(distinct.len(), 3, "keys spread over the three primaries");

    // The conformance suite holds on a cluster.
    let dynstore: Arc<dyn Store> = store.clone();
    cases::burst_of_25_on_20(&*dynstore, "cl").await;
    cases::concurrent_burst(dynstore.clone(), "cl").await;
    cases::contention_exact(dynstore.clone(), "cl").await;
    cases::check_all_then_take_all(&*dynstore, "cl").await;
    cases::peek_takes_nothing(&*dynstore, "cl").await;
    cases::release_and_expiry_of_slots(&*dynstore, "cl").await;
    cases::expiry_with_time(&*dynstore, "cl").await;
    cases::shadow_and_charge_rejected(&*dynstore, "cl").await;
    cases::give_back_returns_unspent_units(&*dynstore, "cl").await;

    // A node that lost its scripts (a restart, SCRIPT FLUSH): reloaded within the call, counted.
    let before = store.noscript_reloads();
    let probe = every_algorithm("d|api_key=k_noscript").remove(0);
    let owner = cluster.node_for_key(&probe.key).expect("owner");
    cluster
        .node(owner)
        .cmd(&["SCRIPT", "FLUSH"])
        .expect("SCRIPT FLUSH");
    assert!(
        check(&*store, &call(T0, 1, "ns", vec![probe.clone()]))
            .await
            .allowed
    );
    assert!(
        check(&*store, &call(T0, 1, "ns", vec![probe]))
            .await
            .allowed
    );
    assert_eq!(store.noscript_reloads(), before + 1, "once: EVAL cached it");

    // Migrate the identity's slot while 8 clients keep checking, with a deadline that lets
    // the client ride out TRYAGAIN: no error at all, and exact counts.
    let identity = "d|api_key=k_migrate";
    let mig_items = every_algorithm(identity);
    let mig_slot = key_slot(&mig_items[0].key);
    let from = cluster.node_for_slot(mig_slot).expect("owner");
    let to = *cluster
        .primaries()
        .expect("primaries")
        .iter()
        .find(|p| **p != from)
        .expect("another primary");
    let cluster = Arc::new(cluster);
    let a = migrate_under_load(store.clone(), &cluster, &mig_items, mig_slot, from, to).await;
    eprintln!("migration with a 2 s deadline: {a:?}");
    assert!(a.moved >= 6, "the identity's keys were in the slot: {a:?}");
    assert!(a.during > 0, "checks ran while the slot moved: {a:?}");
    assert_eq!(a.errors, 0, "no decision lost: {a:?}");
    assert_eq!(a.admitted, a.calls, "limits far away: every check admitted");
    assert_eq!(cluster.node_for_slot(mig_slot).expect("owner"), to);
    let peek = check(&*store, &call(T0 + 1_000_000, 0, "peek", mig_items.clone())).await;
    assert_eq!(
        peek.outcomes[0].remaining,
        1_000_000 - a.admitted,
        "token bucket"
    );
    assert_eq!(peek.outcomes[2].usage, a.admitted, "fixed window");
    assert_eq!(peek.outcomes[4].usage, a.admitted, "sliding log");
    assert_eq!(peek.outcomes[5].usage, a.admitted, "concurrency slots");
    let fw_key = &item_keys(&mig_items[2], T0)[0];
    let on_target = cluster
        .node(to)
        .cmd(&["GET", fw_key])
        .expect("GET on the new owner");
    assert_eq!(on_target, a.admitted.to_string());
    assert!(store.refresh_shards().await);
    let port = cluster.node(to).port();
    assert_eq!(
        store.shard_nodes()[store.shard_of(&mig_items[0].key)],
        format!("127.0.0.1:{port}"),
        "the shard map follows the slot"
    );

    // And back, with the production deadline (3 ms): calls that meet TRYAGAIN past their
    // deadline fail as retryable errors for the rule's on_store_failure, and still no
    // admission goes uncounted: admitted <= counted <= admitted + timed-out calls (a call
    // may time out after its script ran).
    let tight = Arc::new(
        RedisClusterStore::connect(&RedisConfig::cluster(cluster.urls()))
            .await
            .expect("cluster store"),
    );
    // A light call (a bucket, a window, a sliding window whose previous-window key does not
    // exist): the concurrency rule above scans its live slots, thousands by now, which is
    // no test of the deadline.
    let fresh: Vec<_> = every_algorithm("d|api_key=k_migrate_back")
        .into_iter()
        .take(4)
        .collect();
    let back_slot = key_slot(&fresh[0].key);
    let owner = cluster.node_for_slot(back_slot).expect("owner");
    let other = *cluster
        .primaries()
        .expect("primaries")
        .iter()
        .find(|p| **p != owner)
        .expect("another primary");
    let b = migrate_under_load(tight.clone(), &cluster, &fresh, back_slot, owner, other).await;
    eprintln!("migration with the 3 ms default: {b:?}");
    assert_eq!(
        b.errors, b.retryable_errors,
        "every failure is retryable: {b:?}"
    );
    assert!(
        b.slowest_ms < 100,
        "no call waits far past its 3 ms deadline: {b:?}"
    );
    let peek = check(&*store, &call(T0 + 1_000_000, 0, "peek", fresh.clone())).await;
    let counted = peek.outcomes[2].usage;
    assert!(b.admitted > 0, "the 3 ms store works at all: {b:?}");
    assert!(
        b.admitted <= counted && counted <= b.admitted + b.timeouts,
        "admitted {} counted {counted}: {b:?}",
        b.admitted
    );

    ask_redirection_by_hand(&store, &cluster).await;
}

/// `ASK`, deterministically: a slot half migrated by hand (MIGRATING on its owner, IMPORTING on
/// another primary) and an identity with no key yet, so its owner answers `ASK`. The store
/// sends `ASKING` + the script to the importing node and the key is created there; once the
/// slot is handed over, the old owner answers `MOVED` and the count continues on the new one.
async fn ask_redirection_by_hand(store: &RedisClusterStore, cluster: &RedisCluster) {
    let items = vec![every_algorithm("d|api_key=k_ask").remove(0)];
    let key = items[0].key.clone();
    let slot = key_slot(&key);
    let src = cluster.node_for_slot(slot).expect("owner");
    let dst = *cluster
        .primaries()
        .expect("primaries")
        .iter()
        .find(|p| **p != src)
        .expect("another primary");
    let (src_id, dst_id) = (
        cluster.node_id(src).expect("id"),
        cluster.node_id(dst).expect("id"),
    );
    let slot_s = slot.to_string();
    cluster
        .node(dst)
        .cmd(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &src_id])
        .expect("IMPORTING");
    cluster
        .node(src)
        .cmd(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &dst_id])
        .expect("MIGRATING");

    let r = check(store, &call(T0, 1, "ask-1", items.clone())).await;
    assert!(r.allowed);
    assert_eq!(r.outcomes[0].remaining, 999_999);
    let on_src = cluster.node(src).cmd(&["EXISTS", &key]);
    assert!(
        on_src
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("ASK")),
        "the source has no key and redirects: {on_src:?}"
    );
    let mut dst_conn = cluster.node(dst).connect().expect("connect");
    dst_conn.cmd(&["ASKING"]).expect("ASKING");
    assert_eq!(
        dst_conn.cmd(&["EXISTS", &key]).expect("EXISTS"),
        "1",
        "written on the importing node"
    );

    for p in cluster.primaries().expect("primaries") {
        cluster
            .node(p)
            .cmd(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id])
            .expect("SETSLOT NODE");
    }
    let r = check(store, &call(T0, 1, "ask-2", items.clone())).await;
    assert_eq!(
        r.outcomes[0].remaining, 999_998,
        "the count continues on the new owner"
    );
}

#[derive(Debug, Default)]
struct Migration {
    moved: usize,
    calls: u64,
    during: u64,
    admitted: u64,
    errors: u64,
    retryable_errors: u64,
    timeouts: u64,
    slowest_ms: u64,
}

/// Runs 8 clients checking `items` while `slot` moves from `from` to `to`, with traffic
/// before, during and after the move.
async fn migrate_under_load(
    store: Arc<RedisClusterStore>,
    cluster: &Arc<RedisCluster>,
    items: &[sluice_core::batch::Item],
    slot: u16,
    from: usize,
    to: usize,
) -> Migration {
    let admitted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let retryable = Arc::new(AtomicU64::new(0));
    let timeouts = Arc::new(AtomicU64::new(0));
    let slowest = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (store, items) = (store.clone(), items.to_vec());
            let (admitted, errors, retryable, timeouts, slowest, calls, stop) = (
                admitted.clone(),
                errors.clone(),
                retryable.clone(),
                timeouts.clone(),
                slowest.clone(),
                calls.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    // Distinct ids: concurrency slots stay, so the slot set grows too.
                    let cl = call(T0 + i, 1, &format!("c{c}-{i}"), items.clone());
                    let started = Instant::now();
                    match store.check(&cl).await {
                        Ok(r) if r.allowed => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            if e.retryable() {
                                retryable.fetch_add(1, Ordering::Relaxed);
                            }
                            if matches!(e, StoreError::Timeout(_)) {
                                timeouts.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    slowest.fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Let the clients get going on the source node first.
    while calls.load(Ordering::Relaxed) < 200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = calls.load(Ordering::Relaxed);
    let c2 = cluster.clone();
    let moved = tokio::task::spawn_blocking(move || c2.migrate_slot(slot, from, to))
        .await
        .expect("join")
        .expect("slot migration");
    let during = calls.load(Ordering::Relaxed) - before;
    // And keep going on the target for a while.
    let after_start = calls.load(Ordering::Relaxed);
    while calls.load(Ordering::Relaxed) < after_start + 200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }
    Migration {
        moved,
        calls: calls.load(Ordering::Relaxed),
        during,
        admitted: admitted.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        retryable_errors: retryable.load(Ordering::Relaxed),
        timeouts: timeouts.load(Ordering::Relaxed),
        slowest_ms: slowest.load(Ordering::Relaxed),
    }
}
