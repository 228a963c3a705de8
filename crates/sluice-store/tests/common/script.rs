//! Running `lua/check.lua` on a real Redis the way the differential tests compare it with
//! the core: one call in MULTI/EXEC with the PTTL of each key, so the state and the TTLs the
//! script wrote are read in the same atomic step. One copy for every differential test.

#![allow(dead_code)]

use redis::Value;
use sluice_core::algo::Kind;
use sluice_core::batch::{Call, CallResult};
use sluice_core::time::{MILLI, SECOND};
use sluice_core::{Micros, State};
use sluice_store::redis::{decode_check, encode_check};

/// How far below the expected figure a PTTL read may be (real time passing).
pub const TTL_SLACK_MS: i64 = 250;

/// The late-call cover the script adds to every TTL with no stale bound in the call.
pub const UNBOUNDED_LATE: Micros = SECOND;

/// Runs one call through the script (in MULTI/EXEC with PTTL and PERSIST of its keys, so
/// nothing expires while the test compares) and returns the decoded result and the PTTL of
/// each key.
pub fn run_script(conn: &mut redis::Connection, sha: &str, call: &Call) -> (CallResult, Vec<i64>) {
    let enc = encode_check(call).expect("encodable call");
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd("EVALSHA")
        .arg(sha)
        .arg(enc.keys.len())
        .arg(&enc.keys)
        .arg(&enc.args);
    for k in &enc.keys {
        pipe.cmd("PTTL").arg(k);
    }
    for k in &enc.keys {
        pipe.cmd("PERSIST").arg(k).ignore();
    }
    let vals: Vec<Value> = pipe.query(conn).expect("MULTI/EXEC with the script");
    let result = decode_check(call, &vals[0]).expect("a well-formed reply");
    let pttls = vals[1..]
        .iter()
        .map(|v| match v {
            Value::Int(n) => *n,
            other => panic!("PTTL answered {other:?}"),
        })
        .collect();
    (result, pttls)
}

/// Whether a key's PTTL is what the core's TTL (plus the late-call cover) says; a TTL of 0
/// means the key was deleted.
pub fn ttl_matches(pttl: i64, ttl: Micros) -> bool {
    if ttl == 0 {
        return pttl == -2;
    }
    // The script caps the sum at 2^53 - 1, as it caps every figure it must hold exactly.
    let expected = ttl
        .saturating_add(UNBOUNDED_LATE)
        .min((1 << 53) - 1)
        .div_ceil(MILLI) as i64;
    pttl <= expected && pttl >= (expected - TTL_SLACK_MS).max(0)
}

/// What Redis holds under a string key, decoded as the core's state of `kind`.
pub fn stored(conn: &mut redis::Connection, key: &str, kind: Kind) -> Option<State> {
    let v: Option<String> = redis::cmd("GET").arg(key).query(conn).expect("GET");
    v.map(|v| {
        State::decode(kind, &v).unwrap_or_else(|e| panic!("{key} holds {v:?}, not {kind:?}: {e}"))
    })
}

/// The seeds of a randomised run: `base..base + n`, or only `SLUICE_DIFF_SEED` to replay one.
pub fn seeds(base: u64, n: u64) -> Vec<u64> {
    match std::env::var("SLUICE_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("SLUICE_DIFF_SEED is a number")],
        Err(_) => (0..n).map(|i| base + i).collect(),
    }
}
