//! Key splitting on a real Redis Cluster (3 primaries, built by sluice-testkit with
//! `redis-cli --cluster create`): one hot identity under a rule with `hot_keys: { split: 4 }`,
//! offered twice its limit, spreads its script calls over every primary (counted by each
//! node's `INFO commandstats`) and still admits at least 95% of the limit, never more than
//! the limit. The same identity unsplit puts every call on one primary.
//!
//! Requests go through the core's `plan` (the daemon's path: the sub-count is picked from the
//! request id) and the cluster store, one call at a time, at a fixed virtual `now` inside one
//! window.

mod common;

use common::cases::T0;
use sluice_core::decision::{Answer, plan};
use sluice_core::matching::Descriptors;
use sluice_core::rules::parse_yaml;
use sluice_store::Store;
use sluice_store::redis::{RedisClusterStore, RedisConfig};
use sluice_testkit::RedisCluster;

const LIMIT: u64 = 3_000;

fn rules() -> sluice_core::rules::RuleSet {
    parse_yaml(&format!(
        "domain: api
rules:
  - {{ id: hot, match: {{ tier: split }}, key: [api_key], algorithm: fixed_window, limit: {LIMIT}, window: 1h, hot_keys: {{ split: 4 }} }}
  - {{ id: whole, match: {{ tier: whole }}, key: [api_key], algorithm: fixed_window, limit: {LIMIT}, window: 1h }}
"
    ))
    .expect("valid rules")
}

fn desc(tier: &str) -> Descriptors {
    Descriptors::new(vec![
        ("tier".into(), tier.into()),
        ("api_key".into(), "k_hot".into()),
    ])
    .expect("valid descriptors")
}

/// Script calls (`EVALSHA`, and `EVAL` after a `NOSCRIPT`) each primary has run since its
/// last `CONFIG RESETSTAT`, from `INFO commandstats` (`cmdstat_evalsha:calls=N,...`).
fn script_calls(cluster: &RedisCluster, primaries: &[usize]) -> Vec<u64> {
    primaries
        .iter()
        .map(|&i| {
            let info = cluster
                .node(i)
                .cmd(&["INFO", "commandstats"])
                .expect("INFO commandstats");
            info.lines()
                .filter_map(|l| {
                    let rest = l
                        .strip_prefix("cmdstat_evalsha:")
                        .or_else(|| l.strip_prefix("cmdstat_eval:"))?;
                    rest.split(',')
                        .find_map(|f| f.strip_prefix("calls="))
                        .and_then(|n| n.parse::<u64>().ok())
                })
                .sum()
        })
        .collect()
}

/// `offered` checks of the identity under the rule its tier selects: admitted, and the
/// script calls per primary they cost.
async fn offer(
    store: &RedisClusterStore,
    cluster: &RedisCluster,
    primaries: &[usize],
    tier: &str,
    offered: u64,
) -> (u64, Vec<u64>) {
    let set = rules();
    let dom = set.domain("api").expect("domain");
    let d = desc(tier);
    for &i in primaries {
        cluster
            .node(i)
            .cmd(&["CONFIG", "RESETSTAT"])
            .expect("CONFIG RESETSTAT");
    }
    let mut admitted = 0;
    for i in 0..offered {
        // The daemon's request ids: `<daemon tag>-<sequence>`.
        let p = plan(dom, &d, T0 + i, 1, &format!("d7f3-{i}"), |_| {
            Default::default()
        });
        assert_eq!(p.calls.len(), 1);
        let r = match store.check(&p.calls[0].call).await {
            Ok(r) => r,
            Err(e) => panic!("cluster store failed a check: {e}"),
        };
        if p.decide(set.version, &[Answer::Done(r)]).allowed() {
            admitted += 1;
        }
    }
    (admitted, script_calls(cluster, primaries))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_key_spreads_over_the_primaries_and_keeps_its_limit() {
    let cluster = match RedisCluster::start(3, 0) {
        Ok(c) => c,
        Err(e) => panic!("this test needs redis-server and redis-cli for a real cluster: {e:#}"),
    };
    let primaries = cluster.primaries().expect("primaries");
    assert_eq!(primaries.len(), 3);
    let cfg = RedisConfig {
        timeout_ms: 2_000,
        connect_timeout_ms: 2_000,
        ..RedisConfig::cluster(cluster.urls())
    };
    let store = RedisClusterStore::connect(&cfg)
        .await
        .expect("cluster store");

    // The sub-counts' tags: 4 slots, owned by all three primaries.
    let owners: Vec<usize> = (0..4)
        .map(|part| {
            let identity = sluice_core::keys::sub_identity("api|api_key=k_hot", part);
            let key = sluice_core::keys::store_key(
                &identity,
                "hot",
                sluice_core::algo::Kind::FixedWindow,
            );
            cluster.node_for_key(&key).expect("owner")
        })
        .collect();
    eprintln!("sub-count owners (node index): {owners:?}");
    for p in &primaries {
        assert!(
            owners.contains(p),
            "primary {p} owns no sub-count: {owners:?}"
        );
    }

    let offered = 2 * LIMIT;
    let (admitted, calls) = offer(&store, &cluster, &primaries, "split", offered).await;
    let total: u64 = calls.iter().sum();
    eprintln!(
        "split 4: offered {offered}, admitted {admitted} of {LIMIT}; script calls of primaries {primaries:?}: {calls:?} (total {total})"
    );
    assert!(admitted <= LIMIT, "never more than the limit: {admitted}");
    assert!(
        admitted * 100 >= LIMIT * 95,
        "at least 95% of the limit: {admitted}"
    );
    assert_eq!(total, offered, "one script call per check");
    for (p, c) in primaries.iter().zip(&calls) {
        assert!(
            *c * 100 >= total * 15,
            "primary {p} ran {c} of {total} calls: {calls:?}"
        );
    }

    // The control: the same identity unsplit is one slot, so one primary runs every call.
    let (admitted, calls) = offer(&store, &cluster, &primaries, "whole", offered).await;
    eprintln!(
        "unsplit: admitted {admitted} of {LIMIT}; script calls of primaries {primaries:?}: {calls:?}"
    );
    assert_eq!(admitted, LIMIT);
    assert_eq!(calls.iter().filter(|&&c| c > 0).count(), 1, "{calls:?}");
    assert_eq!(calls.iter().sum::<u64>(), offered);
}
