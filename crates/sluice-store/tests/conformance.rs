//! The conformance suite (tests/common/cases.rs) against the memory store and a standalone
//! Redis: the same behaviour whichever store the daemon is configured with.
//!
//! Plus what only Redis shows: keys expire in real time once they carry no information, a
//! lagging daemon's clock never rewinds a newer window, NOSCRIPT is survived and counted, and
//! the 3 ms default deadline is in effect.

mod common;

use common::cases::{self, T0, call, check, item};
use sluice_core::Params;
use sluice_core::Rate;
use sluice_core::algo::Window;
use sluice_core::batch::GiveBack;
use sluice_core::time::SECOND;
use sluice_store::redis::{RedisConfig, RedisStore, item_keys};
use sluice_store::{MemoryStore, Store, StoreError};
use sluice_testkit::RedisServer;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A store under test and whatever must outlive it.
struct Fixture {
    store: Arc<dyn Store>,
    _server: Option<RedisServer>,
}

async fn memory() -> Fixture {
    Fixture {
        store: Arc::new(MemoryStore::default()),
        _server: None,
    }
}

async fn redis() -> Fixture {
    let server = common::redis();
    let store = sluice_store::redis::connect(&common::config(server.url()))
        .await
        .expect("a store for the test redis-server");
    assert_eq!(store.kind(), "redis");
    Fixture {
        store,
        _server: Some(server),
    }
}

macro_rules! suite {
    ($name:ident, $fixture:ident) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn burst_of_25_on_20_admits_20() {
                let f = $fixture().await;
                cases::burst_of_25_on_20(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ten_per_minute_admits_one_every_6_s() {
                let f = $fixture().await;
                cases::ten_per_minute(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_burst_admits_20() {
                let f = $fixture().await;
                cases::concurrent_burst(f.store.clone(), "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn contention_admits_exactly_the_limit() {
                let f = $fixture().await;
                cases::contention_exact(f.store.clone(), "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn check_all_then_take_all() {
                let f = $fixture().await;
                cases::check_all_then_take_all(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn peek_takes_nothing() {
                let f = $fixture().await;
                cases::peek_takes_nothing(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn release_and_expiry_of_slots() {
                let f = $fixture().await;
                cases::release_and_expiry_of_slots(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn expiry_with_time() {
                let f = $fixture().await;
                cases::expiry_with_time(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn shadow_and_charge_rejected() {
                let f = $fixture().await;
                cases::shadow_and_charge_rejected(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn remote_counts_add() {
                let f = $fixture().await;
                cases::remote_counts_add(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn shared_bucket_under_its_rate_keeps_counting() {
                let f = $fixture().await;
                cases::shared_bucket_under_its_rate_keeps_counting(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn new_global_bucket_in_3_regions_admits_a_share_each() {
                let f = $fixture().await;
                cases::new_global_bucket_in_3_regions(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_restarted_shared_bucket_is_a_new_generation() {
                let f = $fixture().await;
                cases::restarted_shared_bucket_is_a_new_generation(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn huge_charged_refusal_on_a_log() {
                let f = $fixture().await;
                cases::huge_charged_refusal_on_a_log(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn identities_are_isolated() {
                let f = $fixture().await;
                cases::identities_are_isolated(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn give_back_returns_unspent_units() {
                let f = $fixture().await;
                cases::give_back_returns_unspent_units(&*f.store, "").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn algorithm_change_under_one_id() {
                let f = $fixture().await;
                cases::algorithm_change_under_one_id(&*f.store, "").await;
            }
        }
    };
}

suite!(memory_store, memory);
suite!(redis_store, redis);

/// Every key written carries a TTL, and a bucket's key is gone once it would be full and no
/// call stamped earlier can still run (the stale bound: tests/late_calls.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keys_expire_once_they_carry_nothing() {
    let server = common::redis();
    let cfg = RedisConfig {
        stale_after_ms: Some(STALE_MS),
        ..common::config(server.url())
    };
    let store = RedisStore::connect(&cfg).await.expect("store");
    let tb = item(
        "sl:{ttl}:tb",
        Params::TokenBucket {
            rate: Rate::per_second(100),
            burst: 5,
        },
    );
    let fw = item(
        "sl:{ttl}:fw",
        Params::FixedWindow {
            limit: 5,
            window: Window::Epoch(SECOND),
        },
    );
    // Time from the real clock, so Redis's real-time expiry and the daemon's clock agree.
    let now = common::epoch_us();
    let c = call(now, 1, "r", vec![tb.clone(), fw.clone()]);
    assert!(check(&store, &c).await.allowed);
    let tb_key = &item_keys(&tb, now)[0];
    let fw_key = &item_keys(&fw, now)[0];
    for k in [tb_key, fw_key] {
        let pttl: i64 = server
            .cmd(&["PTTL", k.as_str()])
            .expect("PTTL")
            .parse()
            .expect("an integer");
        assert!(pttl > 0, "{k} has a TTL, got {pttl}");
    }
    // One token at 100/s refills in 10 ms: the full bucket's key is gone a bound later.
    tokio::time::sleep(Duration::from_millis(10 + 2 * STALE_MS)).await;
    assert_eq!(
        server.cmd(&["EXISTS", tb_key.as_str()]).expect("EXISTS"),
        "0"
    );
    // The fixed window's key lives until its window ends (at most a second), and a bound.
    tokio::time::sleep(Duration::from_millis(1_000 + STALE_MS)).await;
    assert_eq!(
        server.cmd(&["EXISTS", fw_key.as_str()]).expect("EXISTS"),
        "0"
    );
}

/// The stale bound of `redis_keys_expire_once_they_carry_nothing`: long enough that no call
/// of a loaded machine runs past it (and is sent again unbounded, covered for a second).
const STALE_MS: u64 = 200;

/// A daemon whose clock is behind counts in its own (previous) window and never rewinds the
/// newer window another daemon already counts in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_clock_never_rewinds_a_newer_window() {
    let server = common::redis();
    let store = RedisStore::connect(&common::config(server.url()))
        .await
        .expect("store");
    let p = Params::FixedWindow {
        limit: 3,
        window: Window::Epoch(60 * SECOND),
    };
    let boundary = T0 + 60 * SECOND;
    for _ in 0..3 {
        assert!(
            check(
                &store,
                &call(boundary + 5, 1, "a", vec![item("sl:{lag}:fw", p.clone())])
            )
            .await
            .allowed
        );
    }
    // 10 µs behind, across the boundary: the previous window, which is empty.
    let behind = check(
        &store,
        &call(boundary - 5, 1, "b", vec![item("sl:{lag}:fw", p.clone())]),
    )
    .await;
    assert!(behind.allowed);
    // The newer window still holds its 3.
    let again = check(
        &store,
        &call(boundary + 6, 1, "a", vec![item("sl:{lag}:fw", p)]),
    )
    .await;
    assert!(!again.allowed);
    assert_eq!(again.outcomes[0].usage, 3);
}

/// A give-back to a key holding something that is not the rule's state is a Corrupt error
/// naming the key, and writes nothing; a give-back after SCRIPT FLUSH reloads its script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_reports_corrupt_state_and_survives_noscript() {
    let server = common::redis();
    let store = RedisStore::connect(&common::config(server.url()))
        .await
        .expect("store");
    let g = GiveBack {
        key: "sl:{gb}:tb".into(),
        params: Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 10,
        },
        units: 3,
        taken_at: T0,
        now: T0,
    };
    for (kind, setup) in [
        ("list", vec!["RPUSH", "sl:{gb}:tb", "x"]),
        ("junk", vec!["SET", "sl:{gb}:tb", "1 2"]),
    ] {
        server.cmd(&["DEL", "sl:{gb}:tb"]).expect("DEL");
        server.cmd(&setup).expect("setup");
        match store.give_back(&g).await {
            Err(StoreError::Corrupt { key, .. }) => assert_eq!(key, "sl:{gb}:tb", "{kind}"),
            other => panic!("{kind}: {other:?}"),
        }
    }
    assert_eq!(
        server.cmd(&["GET", "sl:{gb}:tb"]).expect("GET"),
        "1 2",
        "nothing written"
    );
    server.cmd(&["DEL", "sl:{gb}:tb"]).expect("DEL");
    let c = call(T0, 5, "r", vec![item("sl:{gb}:tb", g.params.clone())]);
    assert!(check(&store, &c).await.allowed);
    server.cmd(&["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH");
    let before = store.noscript_reloads();
    assert_eq!(store.give_back(&g).await, Ok(true));
    assert_eq!(store.noscript_reloads(), before + 1);
    let peek = call(T0, 0, "p", vec![item("sl:{gb}:tb", g.params.clone())]);
    assert_eq!(check(&store, &peek).await.outcomes[0].remaining, 8);
}

/// A Redis that lost its script cache (restart, failover, SCRIPT FLUSH) answers NOSCRIPT; the
/// store reloads the script within the same call and counts the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_is_reloaded_and_counted() {
    let server = common::redis();
    let store = RedisStore::connect(&common::config(server.url()))
        .await
        .expect("store");
    let c = call(
        T0,
        1,
        "r",
        vec![item(
            "sl:{ns}:tb",
            Params::TokenBucket {
                rate: Rate::per_second(1),
                burst: 3,
            },
        )],
    );
    assert!(check(&store, &c).await.allowed);
    assert_eq!(store.noscript_reloads(), 0);
    server.cmd(&["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH");
    let r = check(&store, &c).await;
    assert!(r.allowed);
    assert_eq!(r.outcomes[0].remaining, 1, "the reloaded script counted on");
    assert_eq!(store.noscript_reloads(), 1);
    assert!(check(&store, &c).await.allowed);
    assert_eq!(store.noscript_reloads(), 1, "cached again after the reload");
    assert!(
        !store
            .release("sl:{ns}:none", "r", T0)
            .await
            .expect("release")
    );
}

/// With the production defaults (3 ms), a stalled Redis costs a call (a check or a
/// give-back) 3 ms and a clear Timeout, never the redis crate's 500 ms; the store recovers
/// when Redis does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_times_out_at_the_configured_deadline() {
    let server = common::redis();
    let cfg = RedisConfig::standalone(server.url());
    assert_eq!((cfg.timeout_ms, cfg.connect_timeout_ms), (3, 100));
    let store = RedisStore::connect(&cfg).await.expect("store");
    let c = call(
        T0,
        1,
        "r",
        vec![item(
            "sl:{stall}:tb",
            Params::TokenBucket {
                rate: Rate::per_second(1),
                burst: 100,
            },
        )],
    );
    // Warm the connection (a loaded CI machine may need a few tries within 3 ms).
    let mut warmed = false;
    for _ in 0..50 {
        if store.check(&c).await.is_ok() {
            warmed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(warmed, "the store never answered within 3 ms");
    server.pause().expect("SIGSTOP redis");
    let started = Instant::now();
    let err = store
        .check(&c)
        .await
        .expect_err("a stalled Redis cannot answer");
    let took = started.elapsed();
    // A give-back is off the hot path but bound by the same deadline.
    let started = Instant::now();
    let gave = store
        .give_back(&GiveBack {
            key: "sl:{stall}:tb".into(),
            params: c.items[0].params.clone(),
            units: 1,
            taken_at: T0,
            now: T0,
        })
        .await;
    let gave_took = started.elapsed();
    server.resume().expect("SIGCONT redis");
    assert_eq!(gave, Err(StoreError::Timeout(3)));
    assert!(gave_took < Duration::from_millis(100), "took {gave_took:?}");
    assert_eq!(err, StoreError::Timeout(3));
    assert!(err.retryable());
    assert!(took < Duration::from_millis(100), "took {took:?}");
    let mut recovered = false;
    for _ in 0..100 {
        if store.check(&c).await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(recovered, "the store recovers once Redis answers again");
}

/// A Redis that is down at start is not a start failure: calls fail as Unavailable or
/// Timeout (retryable) until it answers. Bad configuration is a permanent error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_at_start_and_bad_config() {
    let port = sluice_testkit::free_port();
    let cfg = RedisConfig {
        timeout_ms: 200,
        ..RedisConfig::standalone(format!("redis://127.0.0.1:{port}/"))
    };
    let store = sluice_store::redis::connect(&cfg)
        .await
        .expect("lazy connect");
    let err = store
        .check(&call(
            T0,
            1,
            "r",
            vec![item(
                "sl:{down}:tb",
                Params::Gcra {
                    rate: Rate::per_second(1),
                    burst: 1,
                },
            )],
        ))
        .await
        .expect_err("nothing listens there");
    assert!(err.retryable(), "{err:?}");

    for bad in [
        RedisConfig {
            urls: vec![],
            ..RedisConfig::default()
        },
        RedisConfig::standalone("http://nope"),
        // One Cluster speaks TLS on every node or on none.
        RedisConfig::cluster(["rediss://127.0.0.1:6380/", "redis://127.0.0.1:6381/"]),
        RedisConfig {
            timeout_ms: 0,
            ..RedisConfig::default()
        },
        RedisConfig {
            urls: vec!["redis://a/".into(), "redis://b/".into()],
            ..RedisConfig::default()
        },
    ] {
        let err = sluice_store::redis::connect(&bad)
            .await
            .err()
            .expect("refused");
        assert!(!err.retryable(), "{bad:?} gave {err:?}");
    }
}
