//! `rediss://`: the standalone store and the Cluster store (every per-node connection) over
//! TLS to real `redis-server`s serving `--tls-port` with certificates made at test time.
//!
//! The server's certificate is signed by a throwaway CA the system does not trust, so a
//! store given no CA file must fail to connect (a retryable outage), and one given the CA file
//! must count as over plain TCP.

mod common;

use common::cases::{self, T0, call, check, item};
use sluice_core::Params;
use sluice_core::Rate;
use sluice_store::redis::{RedisConfig, RedisTlsConfig};
use sluice_testkit::{ClusterOptions, RedisCluster, RedisServer, RedisTls, TestPki};
use std::collections::BTreeSet;

fn pki() -> TestPki {
    TestPki::new().expect("test certificates")
}

fn trusting(pki: &TestPki) -> RedisTlsConfig {
    RedisTlsConfig {
        ca_file: Some(pki.ca_file()),
        ..RedisTlsConfig::default()
    }
}

fn gcra() -> Params {
    Params::Gcra {
        rate: Rate::per_second(1),
        burst: 3,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_over_tls_counts_and_refuses_an_untrusted_server() {
    let pki = pki();
    let server = RedisServer::start_tls(&RedisTls::from_pki(&pki))
        .unwrap_or_else(|e| panic!("this test needs a redis-server built with TLS: {e:#}"));
    let url = server.tls_url().expect("a TLS port");

    let store = sluice_store::redis::connect(&RedisConfig {
        tls: trusting(&pki),
        ..common::config(url.clone())
    })
    .await
    .expect("store");
    store.warm_up().await.expect("warm-up over TLS");
    cases::burst_of_25_on_20(store.as_ref(), "tls").await;
    // The counts are in the server behind the TLS port.
    let keys = server.cmd(&["KEYS", "sl:*"]).expect("KEYS");
    assert!(keys.contains("tlsburst"), "{keys}");

    // Without the CA the system's roots do not know the test CA: every call is an outage.
    let untrusted = sluice_store::redis::connect(&common::config(url))
        .await
        .expect("a lazy store");
    let err = untrusted
        .check(&call(T0, 1, "r", vec![item("sl:{x}:g", gcra())]))
        .await
        .expect_err("an untrusted certificate");
    assert!(err.retryable(), "{err:?}");
}

#[test]
fn a_missing_ca_file_or_half_a_client_pair_is_a_config_error() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for tls in [
        RedisTlsConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..RedisTlsConfig::default()
        },
        RedisTlsConfig {
            cert_file: Some("/nonexistent/client.pem".into()),
            ..RedisTlsConfig::default()
        },
    ] {
        for cfg in [
            RedisConfig::standalone("rediss://127.0.0.1:1/"),
            RedisConfig::cluster(["rediss://127.0.0.1:1/"]),
        ] {
            let cfg = RedisConfig {
                tls: tls.clone(),
                ..cfg
            };
            let err = rt
                .block_on(sluice_store::redis::connect(&cfg))
                .err()
                .expect("refused");
            assert!(!err.retryable(), "{cfg:?} gave {err:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_reaches_every_primary() {
    let pki = pki();
    let cluster = RedisCluster::start_with_tls(
        ClusterOptions {
            primaries: 3,
            ..ClusterOptions::default()
        },
        Some(RedisTls::from_pki(&pki)),
    )
    .unwrap_or_else(|e| panic!("this test needs redis-server (with TLS) and redis-cli: {e:#}"));
    let urls = cluster.tls_urls().expect("TLS ports");
    let store = sluice_store::redis::connect(&RedisConfig {
        timeout_ms: 2_000,
        connect_timeout_ms: 2_000,
        tls: trusting(&pki),
        ..RedisConfig::cluster(urls)
    })
    .await
    .expect("cluster store");
    store
        .warm_up()
        .await
        .expect("warm-up of every primary over TLS");

    // Identities until every primary owns one of them: the calls reach all three nodes,
    // each over its own TLS connection.
    let mut owners = BTreeSet::new();
    let mut n = 0;
    while owners.len() < 3 {
        n += 1;
        assert!(
            n < 1_000,
            "3 primaries own the slots of a thousand identities"
        );
        let key = format!("sl:{{id{n}}}:g");
        let node = cluster.node_for_key(&key).expect("slot owner");
        let r = check(store.as_ref(), &call(T0, 1, "r", vec![item(&key, gcra())])).await;
        assert!(r.allowed, "{key}");
        let stored = cluster.node(node).cmd(&["EXISTS", &key]).expect("EXISTS");
        assert_eq!(stored, "1", "{key} counted on node {node}");
        owners.insert(node);
    }
}
