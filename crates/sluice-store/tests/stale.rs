//! A call its caller gave up on must not take units later: Redis paused, the calls already on
//! the wire run when it resumes, and a fail-closed rule's client would be refused *and*
//! charged. The store bounds each call (`now` + the stale budget, by Redis's clock), holds a
//! script run's slot until Redis answers (so a stall collects no backlog), and counts what
//! became of the late calls. A clock behind Redis's costs a second round trip, not an answer.

mod common;

use common::cases::{call, item};
use common::epoch_us;
use sluice_core::Params;
use sluice_core::algo::Window;
use sluice_core::time::SECOND;
use sluice_store::redis::{RedisConfig, RedisStore, encode_check};
use sluice_store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;

fn daily(limit: u64) -> Params {
    Params::FixedWindow {
        limit,
        window: Window::Epoch(86_400 * SECOND),
    }
}

/// How many units the key's window holds: a peek (cost 0) answers the count before it.
async fn count(store: &dyn Store, key: &str) -> u64 {
    let r = store
        .check(&call(epoch_us(), 0, "peek", vec![item(key, daily(1_000))]))
        .await
        .expect("a peek once Redis answers");
    r.outcomes[0].usage
}

/// Redis paused under 200 waiting checks: every one times out, and once Redis resumes none
/// of them has been counted. Before the bound and the held slots, the calls on the wire ran
/// on resume: 199 of the 200 were counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_runs_no_call_its_callers_gave_up_on() {
    let server = common::redis();
    let cfg = RedisConfig {
        timeout_ms: 50,
        ..RedisConfig::standalone(server.url())
    };
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&cfg).await.expect("store"));
    let mut ready = false;
    for _ in 0..100 {
        if store.warm_up().await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ready, "the store never warmed up");
    let key = "sl:{paused}:f:quota";
    assert_eq!(count(store.as_ref(), key).await, 0);

    server.pause().expect("SIGSTOP redis");
    let mut waiting = Vec::new();
    for i in 0..200 {
        let store = store.clone();
        waiting.push(tokio::spawn(async move {
            let c = call(
                epoch_us(),
                1,
                &format!("r{i}"),
                vec![item(key, daily(1_000))],
            );
            store.check(&c).await
        }));
    }
    for w in waiting {
        let r = w.await.expect("the check task");
        assert_eq!(r.map(|_| ()), Err(StoreError::Timeout(50)));
    }
    server.resume().expect("SIGCONT redis");

    // The peek is sent after the runs that were on the wire (one connection, in order).
    let mut counted = None;
    for _ in 0..100 {
        match store
            .check(&call(epoch_us(), 0, "peek", vec![item(key, daily(1_000))]))
            .await
        {
            Ok(r) => {
                counted = Some(r.outcomes[0].usage);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert_eq!(counted, Some(0), "calls given up on were counted on resume");

    // The late runs were read and counted as refused by their bound, none as run.
    let mut late = store.late_replies();
    for _ in 0..100 {
        if late.stale > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        late = store.late_replies();
    }
    assert!(late.stale >= 1, "{late:?}");
    assert_eq!((late.ran, late.skewed), (0, 0), "{late:?}");
    assert!(
        late.stale + late.lost <= 4 * 64,
        "at most IN_FLIGHT runs of MAX_BATCH calls were on the wire: {late:?}"
    );
}

/// A daemon whose clock is a minute behind Redis's: its calls reach Redis "late" by the
/// bound while it still waits. They are re-sent unbounded and answered; the skew is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_behind_redis_costs_a_round_trip_not_an_answer() {
    let server = common::redis();
    let store = RedisStore::connect(&common::config(server.url()))
        .await
        .expect("store");
    let behind = epoch_us() - 60 * SECOND;
    let key = "sl:{skew}:f:quota";
    for i in 1..=3 {
        let r = store
            .check(&call(behind, 1, "r", vec![item(key, daily(10))]))
            .await
            .expect("answered despite the skew");
        assert!(r.allowed);
        assert_eq!(r.outcomes[0].usage, i);
    }
    let late = store.late_replies();
    assert_eq!(late.skewed, 3, "{late:?}");
    assert_eq!((late.ran, late.stale, late.lost), (0, 0, 0), "{late:?}");
}

/// The script itself: past its bound a call answers SLUICE_STALE and writes nothing, alone
/// or inside a batch (where the calls around it still run); before its bound it runs.
#[test]
fn the_script_refuses_a_call_past_its_bound_and_writes_nothing() {
    let server = common::redis();
    let (mut conn, sha) = common::script_loaded(&server);
    let now = epoch_us();
    let c = call(now, 1, "r", vec![item("sl:{bound}:f:q", daily(10))]);
    let enc = |at| encode_check(&c).expect("encodable").stale_after(at);

    let past = enc(now - SECOND);
    let err = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(past.keys.len())
        .arg(&past.keys)
        .arg(&past.args)
        .query::<redis::Value>(&mut conn)
        .expect_err("a stale call is refused");
    assert_eq!(err.code(), Some("SLUICE_STALE"), "{err}");
    let exists: u64 = redis::cmd("EXISTS")
        .arg(&past.keys)
        .query(&mut conn)
        .expect("EXISTS");
    assert_eq!(exists, 0, "a stale call wrote its key");

    let fresh = enc(now + 60 * SECOND);
    let v: redis::Value = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(fresh.keys.len())
        .arg(&fresh.keys)
        .arg(&fresh.args)
        .query(&mut conn)
        .expect("a call within its bound runs");
    assert_eq!(
        v,
        redis::Value::Int(0),
        "the window's count before the call"
    );

    // A batch of a stale call between two fresh ones.
    let calls = [
        enc(now + 60 * SECOND),
        enc(now - SECOND),
        enc(now + 60 * SECOND),
    ];
    let mut keys = Vec::new();
    let mut args = vec!["B".to_string(), calls.len().to_string()];
    for sc in &calls {
        args.push(format!("{} {}", sc.keys.len(), sc.args.len()));
        keys.extend(sc.keys.iter().cloned());
        args.extend(sc.args.iter().cloned());
    }
    let v: redis::Value = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(keys.len())
        .arg(&keys)
        .arg(&args)
        .query(&mut conn)
        .expect("a batch runs");
    let redis::Value::Array(replies) = v else {
        panic!("a batch answers an array: {v:?}");
    };
    assert_eq!(replies[0], redis::Value::Int(1));
    match &replies[1] {
        redis::Value::Array(e) => match e.as_slice() {
            [redis::Value::BulkString(t)] => {
                assert!(t.starts_with(b"SLUICE_STALE "), "{t:?}")
            }
            other => panic!("the stale call's error: {other:?}"),
        },
        other => panic!("the stale call's error: {other:?}"),
    }
    assert_eq!(
        replies[2],
        redis::Value::Int(2),
        "the stale call took nothing"
    );
}
