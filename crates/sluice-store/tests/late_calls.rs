//! A key outlives the calls that may still run late.
//!
//! A state lives in daemon time (`now`), its key's TTL in Redis's. A key set to expire when
//! its bucket is full or its window ends, measured from the call that wrote it, vanishes
//! under a later call that waited longer on the wire (a batch queue, a busy Redis): that call
//! finds no key, starts from a full bucket or an empty window, and admits what the state it
//! should have read would have refused. So each TTL covers the lateness a call may still
//! have: what is left of the writing call's stale bound, or a second for an unbounded call.
//!
//! Real time here, not virtual: what is under test is Redis's own expiry. Each case writes a
//! key, lets real time pass the moment its state alone would have let it expire, then runs a
//! call stamped earlier than that moment, as a queued call is.

mod common;

use common::epoch_us;
use redis::Value;
use sluice_core::Params;
use sluice_core::algo::{Rate, Window};
use sluice_core::batch::{Call, CallResult};
use sluice_core::time::{MILLI, SECOND};
use sluice_store::redis::{decode_check, encode_check};
use std::time::Duration;

use common::cases::{call, item};

/// Sleeps until the wall clock reads `at` (epoch µs).
fn sleep_until(at: u64) {
    let now = epoch_us();
    if at > now {
        std::thread::sleep(Duration::from_micros(at - now));
    }
}

/// Runs one call through the script, bounded by `stale` (0: unbounded).
fn run(conn: &mut redis::Connection, sha: &str, c: &Call, stale: u64) -> CallResult {
    let enc = encode_check(c).expect("encodable call").stale_after(stale);
    let v: Value = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(enc.keys.len())
        .arg(&enc.keys)
        .arg(&enc.args)
        .query(conn)
        .expect("the script runs");
    decode_check(c, &v).expect("a well-formed reply")
}

fn setup() -> (sluice_testkit::RedisServer, redis::Connection, String) {
    let server = common::redis();
    let (conn, sha) = common::script_loaded(&server);
    (server, conn, sha)
}

fn bucket() -> Params {
    // 10/s, burst 10: emptied, full again one second later.
    Params::TokenBucket {
        rate: Rate::per_second(10),
        burst: 10,
    }
}

/// A bucket emptied at t0 is full at t0 + 1 s, so its key's TTL was one second. A call
/// stamped t0 + 0.5 s that reaches Redis at t0 + 1.3 s must find 5 tokens, not a full bucket.
fn late_call_on_a_bucket(stale_budget: u64) {
    let (_server, mut conn, sha) = setup();
    let key = "sl:{late}:t:b";
    let t0 = epoch_us();
    let bound = |now: u64| {
        if stale_budget == 0 {
            0
        } else {
            now + stale_budget
        }
    };
    let first = run(
        &mut conn,
        &sha,
        &call(t0, 10, "a", vec![item(key, bucket())]),
        bound(t0),
    );
    assert!(first.allowed, "a full bucket takes its burst: {first:?}");
    sleep_until(t0 + 1_300 * MILLI);
    let late_now = t0 + 500 * MILLI;
    let late = run(
        &mut conn,
        &sha,
        &call(late_now, 10, "b", vec![item(key, bucket())]),
        bound(late_now),
    );
    assert!(
        !late.allowed && late.outcomes[0].remaining == 5,
        "a call stamped 0.5 s after the bucket emptied holds 5 tokens, whenever it runs: {late:?}"
    );
}

#[test]
fn an_unbounded_late_call_finds_the_bucket_it_was_stamped_against() {
    late_call_on_a_bucket(0);
}

#[test]
fn a_bounded_late_call_finds_the_bucket_it_was_stamped_against() {
    // The writing call could have run up to 3 s late: its key lives 3 s past full.
    late_call_on_a_bucket(3 * SECOND);
}

/// A one-second window holding its limit: a call stamped in that window's last
/// millisecond, run 300 ms after it ended, is refused, not counted in a fresh key.
#[test]
fn a_late_call_finds_the_window_it_was_stamped_in() {
    let (_server, mut conn, sha) = setup();
    let key = "sl:{late}:f:w";
    let fw = || Params::FixedWindow {
        limit: 1,
        window: Window::Epoch(SECOND),
    };
    // A window with most of its second ahead, so the first call runs well inside it.
    let mut t0 = epoch_us();
    if t0 % SECOND > 500 * MILLI {
        sleep_until(t0 - t0 % SECOND + SECOND);
        t0 = epoch_us();
    }
    let end = t0 - t0 % SECOND + SECOND;
    let first = run(&mut conn, &sha, &call(t0, 1, "a", vec![item(key, fw())]), 0);
    assert!(first.allowed, "an empty window admits one: {first:?}");
    sleep_until(end + 300 * MILLI);
    let late = run(
        &mut conn,
        &sha,
        &call(end - MILLI, 1, "b", vec![item(key, fw())]),
        0,
    );
    assert!(
        !late.allowed,
        "the window it was stamped in already holds its limit: {late:?}"
    );
}
