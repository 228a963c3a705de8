//! A Redis Cluster primary fails while checks run on every shard: only its own slots fail,
//! until its replica is promoted, and then they recover on the replica.
//!
//! Two ways a primary fails, on one cluster (3 primaries, a replica each, node timeout 1 s):
//!
//! 1. **killed**: its port refuses connections, every call to it fails at once;
//! 2. **paused** (SIGSTOP, as a crashed host or a partition looks): connections stay open and
//!    nothing answers, every call to it waits for its deadline. Nothing tells the client the
//!    node is gone, not even a `MOVED`: only the store's own slot map refresh does. (The redis
//!    crate's cluster client, used before, kept routing to the paused node forever.)
//!
//! Checks run sequentially on one identity per primary with a 100 ms deadline (generous, so
//! a busy 2-core machine does not turn a slow healthy call into a failure); counts are exact
//! on the shards that never failed.

mod common;

use common::cases::{T0, call, item};
use sluice_core::Params;
use sluice_core::algo::Window;
use sluice_core::batch::Item;
use sluice_core::time::SECOND;
use sluice_store::Store;
use sluice_store::redis::{RedisClusterStore, RedisConfig};
use sluice_testkit::{ClusterOptions, RedisCluster};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long the failed shard may take to come back: node timeout (1 s) + election + the
/// store's map refresh (1 s), with a wide margin for a loaded machine.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

fn start_cluster() -> RedisCluster {
    let options = ClusterOptions {
        primaries: 3,
        replicas_per_primary: 1,
        node_timeout_ms: 1000,
        // `no`: while one slot range has no live primary the other nodes keep serving theirs
        // (with the default `yes` Redis answers CLUSTERDOWN for every key, on every node).
        // Diskless sync without delay: replicas finish their first sync at once.
        extra_args: [
            "--cluster-require-full-coverage",
            "no",
            "--repl-diskless-sync-delay",
            "0",
        ]
        .map(String::from)
        .to_vec(),
    };
    match RedisCluster::start_with(options) {
        Ok(c) => c,
        Err(e) => panic!("this test needs redis-server and redis-cli for a real cluster: {e:#}"),
    }
}

/// Waits until every live replica finished its first sync: one that has not refuses to be
/// promoted (`cluster-replica-validity-factor`), which would test nothing.
fn wait_replicas_in_sync(cluster: &RedisCluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let synced = cluster
            .nodes()
            .iter()
            .filter(|n| n.pid().is_some() && !n.is_paused())
            .all(|n| {
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

/// A counter far from its limit, so every successful check is admitted and counted.
fn counter(identity: &str) -> Item {
    item(
        &format!("sl:{{{identity}}}:fw"),
        Params::FixedWindow {
            limit: 1_000_000,
            window: Window::Epoch(3_600 * SECOND),
        },
    )
}

/// One identity per current primary: node index → identity.
fn identity_per_primary(cluster: &RedisCluster) -> BTreeMap<usize, String> {
    let mut by_node = BTreeMap::new();
    for i in 0..500 {
        let id = format!("id{i}");
        let node = cluster.node_for_key(&counter(&id).key).expect("slot owner");
        by_node.entry(node).or_insert(id);
    }
    assert_eq!(by_node.len(), 3, "an identity on each primary");
    by_node
}

#[derive(Debug, Default)]
struct Outage {
    victim_failed: u64,
    recovered_after: Option<Duration>,
    others_calls: u64,
    others_failed: u64,
    slowest_other: Duration,
}

/// Checks every identity in turn until the victim's answers again (and a little longer), and
/// tallies who failed. `admitted` counts successful checks per identity.
async fn through_outage(
    store: &RedisClusterStore,
    by_node: &BTreeMap<usize, String>,
    victim: usize,
    admitted: &mut BTreeMap<String, u64>,
    seq: &mut u64,
) -> Outage {
    let start = Instant::now();
    let mut o = Outage::default();
    while start.elapsed() < RECOVERY_LIMIT {
        for (node, id) in by_node {
            *seq += 1;
            let c = call(T0 + *seq, 1, &format!("r{seq}"), vec![counter(id)]);
            let t = Instant::now();
            let r = store.check(&c).await;
            if let Ok(res) = &r {
                assert!(res.allowed, "far below the limit");
                *admitted.entry(id.clone()).or_default() += 1;
            }
            if *node == victim {
                match &r {
                    Ok(_) if o.victim_failed > 0 && o.recovered_after.is_none() => {
                        o.recovered_after = Some(start.elapsed());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        assert!(e.retryable(), "a failed node is a retryable failure: {e}");
                        if o.recovered_after.is_none() {
                            o.victim_failed += 1;
                        }
                    }
                }
            } else {
                o.others_calls += 1;
                o.slowest_other = o.slowest_other.max(t.elapsed());
                if let Err(e) = r {
                    eprintln!("healthy shard failed: {e}");
                    o.others_failed += 1;
                }
            }
        }
        if o.recovered_after
            .is_some_and(|t| start.elapsed() > t + Duration::from_secs(1))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    o
}

/// The store's count for `id` (a check of cost 0 takes nothing).
async fn counted(store: &RedisClusterStore, id: &str) -> u64 {
    let c = call(T0 + 1, 0, "peek", vec![counter(id)]);
    store.check(&c).await.expect("peek").outcomes[0].usage
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_primary_degrades_only_its_shard_until_its_replica_takes_over() {
    let mut cluster = start_cluster();
    wait_replicas_in_sync(&cluster);
    let cfg = RedisConfig {
        timeout_ms: 100,
        ..RedisConfig::cluster(cluster.urls())
    };
    let store = RedisClusterStore::connect(&cfg)
        .await
        .expect("cluster store");
    let mut admitted = BTreeMap::new();
    let mut seq = 0;

    // 1. A primary killed.
    let by_node = identity_per_primary(&cluster);
    let (&killed, killed_id) = by_node.iter().next().expect("a primary");
    let killed_id = killed_id.clone();
    for id in by_node.values() {
        assert!(
            store
                .check(&call(T0, 1, "warm", vec![counter(id)]))
                .await
                .is_ok()
        );
        *admitted.entry(id.clone()).or_default() += 1;
    }
    let shards_before: BTreeMap<String, usize> = by_node
        .values()
        .map(|id| (id.clone(), store.shard_of(&counter(id).key)))
        .collect();
    cluster.kill_node(killed).expect("kill a primary");
    let o = through_outage(&store, &by_node, killed, &mut admitted, &mut seq).await;
    eprintln!("primary killed: {o:?}");
    assert!(
        o.victim_failed > 0,
        "the dead primary's keys degrade: {o:?}"
    );
    assert!(o.recovered_after.is_some(), "its replica took over: {o:?}");
    assert_eq!(o.others_failed, 0, "the other shards never notice: {o:?}");

    // The promoted replica is a new shard (a fresh breaker); the others keep their numbers.
    let key = counter(&killed_id).key;
    let new_owner = cluster.node_for_key(&key).expect("new owner");
    assert_ne!(new_owner, killed);
    let shard = store.shard_of(&key);
    assert_ne!(shard, shards_before[&killed_id], "a new node, a new shard");
    assert_eq!(
        store.shard_nodes()[shard],
        format!("127.0.0.1:{}", cluster.node(new_owner).port())
    );
    for (id, before) in &shards_before {
        if *id != killed_id {
            assert_eq!(store.shard_of(&counter(id).key), *before, "{id}");
        }
    }

    // 2. Another primary paused: calls to it hang instead of failing fast.
    wait_replicas_in_sync(&cluster);
    let by_node = identity_per_primary(&cluster);
    let (&paused, paused_id) = by_node
        .iter()
        .find(|(n, _)| **n != new_owner)
        .expect("a primary that still has its replica");
    let paused_id = paused_id.clone();
    cluster.node(paused).pause().expect("SIGSTOP");
    let o = through_outage(&store, &by_node, paused, &mut admitted, &mut seq).await;
    eprintln!("primary paused: {o:?}");
    assert!(
        o.victim_failed > 0,
        "the stalled primary's keys degrade: {o:?}"
    );
    assert!(
        o.recovered_after.is_some(),
        "its replica took over although the stalled node never answered: {o:?}"
    );
    assert_eq!(o.others_failed, 0, "the other shards never notice: {o:?}");

    // Exact counts where nothing failed: every admission counted once, none twice.
    for id in by_node.values() {
        if *id != paused_id && *id != killed_id {
            assert_eq!(counted(&store, id).await, admitted[id], "{id}");
        }
    }
    cluster.node(paused).resume().expect("SIGCONT");
}
