//! The standalone store's batcher: calls that queue behind the script runs in flight leave
//! together as one `EVALSHA`. Batching must change nothing a caller can see: every call is
//! still atomic and exact, every call gets its own answer, and one call's error (a corrupt
//! key) is that call's alone.

mod common;

use common::cases::{T0, call, item};
use sluice_core::Params;
use sluice_core::algo::Window;
use sluice_core::time::SECOND;
use sluice_store::redis::RedisStore;
use sluice_store::{Store, StoreError};
use std::sync::Arc;

async fn store(server: &sluice_testkit::RedisServer) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::connect(&common::config(server.url()))
            .await
            .expect("store"),
    )
}

fn window(limit: u64) -> Params {
    Params::FixedWindow {
        limit,
        window: Window::Epoch(3_600 * SECOND),
    }
}

/// 600 calls at once: 400 on one key limited to 250, 200 on keys of their own. Exactly 250 of
/// the hot key's pass, every other call passes, and the calls did travel in batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_calls_stay_exact_and_answer_each_caller() {
    let server = common::redis();
    let store = store(&server).await;
    let tasks: Vec<_> = (0..600u64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = if i % 3 == 2 {
                    format!("sl:{{own{i}}}:w")
                } else {
                    "sl:{hot}:w".to_string()
                };
                let c = call(T0 + i, 1, &format!("r{i}"), vec![item(&key, window(250))]);
                (i, store.check(&c).await)
            })
        })
        .collect();
    let (mut hot_ok, mut own_ok) = (0, 0);
    for t in tasks {
        let (i, r) = t.await.expect("task");
        let r = r.expect("no call fails");
        assert_eq!(r.outcomes.len(), 1);
        match (i % 3 == 2, r.allowed) {
            (true, true) => own_ok += 1,
            (true, false) => panic!("call {i} on its own key was refused"),
            (false, true) => hot_ok += 1,
            (false, false) => assert_eq!(r.outcomes[0].remaining, 0),
        }
    }
    assert_eq!(hot_ok, 250, "the hot key admits exactly its limit");
    assert_eq!(own_ok, 200);
    let (runs, calls) = store.batch_stats();
    eprintln!("600 concurrent calls: {runs} script runs, {calls} calls");
    assert_eq!(calls, 600);
    assert!(runs < calls, "calls that queued left together: {runs} runs");
}

/// One corrupt key among many concurrent calls: that call gets `Corrupt` naming its own key,
/// every other call in its batch is answered normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_in_a_batch_is_that_calls_alone() {
    let server = common::redis();
    let store = store(&server).await;
    let bad = "sl:{bad}:w".to_string();
    // A fixed window counts in `<key>:<window start>`: make that key a list.
    let bad_window = sluice_store::redis::item_keys(&item(&bad, window(5)), T0)[0].clone();
    server
        .cmd(&["RPUSH", &bad_window, "x"])
        .expect("a key of the wrong type");
    let mut rounds = 0;
    loop {
        rounds += 1;
        let (runs0, calls0) = store.batch_stats();
        let tasks: Vec<_> = (0..200u64)
            .map(|i| {
                let store = store.clone();
                let bad = bad.clone();
                tokio::spawn(async move {
                    let key = if i == 100 {
                        bad
                    } else {
                        format!("sl:{{ok{i}}}:w")
                    };
                    let c = call(T0, 1, &format!("r{i}"), vec![item(&key, window(5))]);
                    (i, store.check(&c).await)
                })
            })
            .collect();
        for t in tasks {
            match t.await.expect("task") {
                (100, Err(StoreError::Corrupt { key, .. })) => assert_eq!(key, bad_window),
                (100, other) => panic!("the corrupt call got {other:?}"),
                (i, r) => assert!(r.expect("a sound call").allowed, "call {i}"),
            }
        }
        let (runs, calls) = store.batch_stats();
        // Required: this round did batch (so the error shared a script run with others).
        if runs - runs0 < calls - calls0 || rounds == 20 {
            assert!(
                runs - runs0 < calls - calls0,
                "no round batched in {rounds}"
            );
            break;
        }
    }
}
