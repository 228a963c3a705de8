//! Differential test of `window_start: first_request` (`Window::FirstRequest`): `lua/check.lua`
//! on a real redis-server against the Rust core, as tests/differential.rs does for every
//! algorithm.
//!
//! Seeded random sequences of first-request fixed and sliding windows, alone and in calls with an epoch
//! fixed window and a token bucket (shadow and charge_rejected flags, costs above the limit,
//! peeks, clocks stepping back), run through `sluice_core::batch::apply` and through the
//! script with the store's own encoder and decoder. After every call the outcomes must be
//! identical, every written key's TTL the core's (in ms, rounded up, plus the script's second
//! of late-call cover), and the state in Redis ("start count" under the rule key itself, no
//! window index) the core's. A key whose TTL has run out in the sequence's virtual time is
//! either deleted on both sides (Redis's expiry: the next request starts a fresh origin) or
//! kept on both (Redis keeps a key past its TTL for late calls), which must decide alike.
//!
//! Each call runs in MULTI/EXEC with PTTL and PERSIST of its keys, so no key expires in real
//! time behind the model's back. `SLUICE_DIFF_SEED=<seed>` replays one sequence.

mod common;

use common::script::{run_script, seeds, stored, ttl_matches};
use common::{redis, script_loaded, sync_conn};
use redis::Value;
use sluice_core::algo::{Kind, Rate, Window, WindowStart};
use sluice_core::batch::{Call, Item, Write, apply};
use sluice_core::time::{MILLI, SECOND};
use sluice_core::{Micros, Params, Remote, State};
use sluice_rng::Rng;
use sluice_store::redis::{encode_check, item_keys};

fn first_request(limit: u64, len: Micros) -> Params {
    Params::FixedWindow {
        limit,
        window: Window::FirstRequest(len),
    }
}

fn sliding_first_request(limit: u64, len: Micros) -> Params {
    Params::SlidingWindow {
        limit,
        window: len,
        start: WindowStart::FirstRequest,
    }
}

fn per_key(p: &Params) -> bool {
    p.per_key_window()
}

/// The start of a first-request window's state.
fn start_of(st: &State) -> Option<Micros> {
    match st {
        State::FixedWindow { start, .. } | State::SlidingWindow { start, .. } => Some(*start),
        _ => None,
    }
}

#[derive(Default, Debug)]
struct Tally {
    calls: u64,
    refused: u64,
    /// First-request items refused, and admitted into a window that began at that call.
    fr_refused: u64,
    fr_new_windows: u64,
    /// Keys past their TTL: deleted (a fresh origin) or kept (a late call's cover).
    expired_deleted: u64,
    expired_kept: u64,
    /// Calls behind the stored window's start (a lagging clock).
    behind: u64,
    /// Costs above the item's limit.
    over_limit: u64,
    /// Calls exactly at the first rule's window end (a retry at its `Retry-After`).
    at_window_end: u64,
    /// First-request sliding window items checked.
    sliding: u64,
}

fn gap(rng: &mut Rng, len: Micros) -> Micros {
    match rng.range(0, 99) {
        0..=29 => 0,
        30..=59 => rng.range(0, 2_000),
        60..=84 => rng.range(0, len / 2 + 1),
        _ => rng.range(0, 3 * len),
    }
}

fn cost(rng: &mut Rng) -> u64 {
    match rng.range(0, 99) {
        0..=54 => 1,
        55..=69 => 0,
        70..=89 => rng.range(2, 5),
        _ => rng.range(5, 40),
    }
}

fn run_sequence(conn: &mut redis::Connection, sha: &str, seed: u64, tally: &mut Tally) {
    let mut rng = Rng::stream(seed, 7);
    let len = if rng.chance(0.5) {
        rng.range(1, 5_000) * MILLI
    } else {
        rng.range(1, 86_400) * SECOND
    };
    // Sliding windows are whole milliseconds.
    let sliding = rng.chance(0.5);
    let len = if sliding { len - len % MILLI } else { len };
    let mut items = vec![Item {
        key: format!("sl:{{fr{seed}}}:f:first"),
        params: if sliding {
            sliding_first_request(rng.range(1, 30), len)
        } else {
            first_request(rng.range(1, 30), len)
        },
        enforce: true,
        charge_rejected: rng.chance(0.3),
        remote: Remote::default(),
    }];
    // Now and then a second first-request rule, an epoch window and a bucket of the same
    // identity in the same call, some of them shadow.
    if rng.chance(0.3) {
        let (limit, len) = (rng.range(1, 30), rng.range(1, 5_000) * MILLI);
        items.push(Item {
            key: format!("sl:{{fr{seed}}}:f:second"),
            params: if rng.chance(0.5) {
                sliding_first_request(limit, len)
            } else {
                first_request(limit, len)
            },
            enforce: rng.chance(0.7),
            charge_rejected: rng.chance(0.3),
            remote: Remote::default(),
        });
    }
    if rng.chance(0.3) {
        items.push(Item {
            key: format!("sl:{{fr{seed}}}:f:epoch"),
            params: Params::FixedWindow {
                limit: rng.range(1, 30),
                window: Window::Epoch(rng.range(1, 5_000) * MILLI),
            },
            enforce: rng.chance(0.7),
            charge_rejected: rng.chance(0.3),
            remote: Remote::default(),
        });
    }
    if rng.chance(0.3) {
        items.push(Item {
            key: format!("sl:{{fr{seed}}}:t:bucket"),
            params: Params::TokenBucket {
                rate: Rate::per_second(rng.range(1, 50)),
                burst: rng.range(1, 30),
            },
            enforce: rng.chance(0.7),
            charge_rejected: rng.chance(0.3),
            remote: Remote::default(),
        });
    }
    // Clocks stepping back only when every item clamps time (an epoch window's Redis keys
    // are per window start, where a late call counts in its own window).
    let skew = items.iter().all(|i| {
        !matches!(
            &i.params,
            Params::FixedWindow {
                window: Window::Epoch(_),
                ..
            }
        )
    }) && rng.chance(0.4);
    let mut states: Vec<Option<State>> = vec![None; items.len()];
    let mut expires: Vec<Micros> = vec![0; items.len()];
    let mut now: Micros = 1_700_000_000 * SECOND + rng.range(0, 86_400 * SECOND);
    for step in 0..rng.range(20, 80) {
        if skew && rng.chance(0.2) {
            now -= rng.range(0, 5_000);
        } else if let Some(start) = states[0].as_ref().and_then(start_of)
            && start + len >= now
            && rng.chance(0.15)
        {
            // A client retrying at its Retry-After: exactly the key's own window end, or the
            // end of the window after it (where a sliding window's count stops weighing).
            now = start + len * rng.range(1, 2);
            tally.at_window_end += 1;
        } else {
            now += gap(&mut rng, len);
        }
        for (i, item) in items.iter().enumerate() {
            if per_key(&item.params) && states[i].is_some() && now >= expires[i] {
                if rng.chance(0.5) {
                    let _: i64 = redis::cmd("DEL").arg(&item.key).query(conn).expect("DEL");
                    states[i] = None;
                    tally.expired_deleted += 1;
                } else {
                    tally.expired_kept += 1;
                }
            }
        }
        let call = Call {
            now,
            cost: cost(&mut rng),
            request_id: format!("r{step}"),
            items: items.clone(),
        };
        let (want, writes) = apply(&call, &states);
        let (got, pttls) = run_script(conn, sha, &call);
        let before = states.clone();
        let ctx = || {
            format!(
                "seed {seed} step {step}\ncall: {call:#?}\nstates before: {before:#?}\ncore: {want:#?}\nlua:  {got:#?}"
            )
        };
        assert_eq!(got, want, "outcomes differ: {}", ctx());
        let mut k = 0;
        for (i, (item, w)) in call.items.iter().zip(&writes).enumerate() {
            if let Write::Put(st, ttl) = w {
                assert!(
                    ttl_matches(pttls[k], *ttl),
                    "TTL of {}: {} ms, core says {ttl} µs: {}",
                    item.key,
                    pttls[k],
                    ctx()
                );
                if per_key(&item.params)
                    && let Some(start) = start_of(st)
                {
                    tally.fr_new_windows += u64::from(start == now);
                }
                states[i] = (*ttl > 0).then(|| st.clone());
                expires[i] = now + ttl;
            }
            k += item_keys(item, now).len();
        }
        for (i, item) in call.items.iter().enumerate() {
            if per_key(&item.params) {
                assert_eq!(
                    item_keys(item, now),
                    vec![item.key.clone()],
                    "a first-request window lives under the rule key itself"
                );
                assert_eq!(
                    stored(conn, &item.key, item.params.kind()),
                    states[i],
                    "stored state of {}: {}",
                    item.key,
                    ctx()
                );
                tally.fr_refused += u64::from(!want.outcomes[i].allowed);
                tally.over_limit += u64::from(call.cost > item.params.limit());
                if let Some(start) = before[i].as_ref().and_then(start_of) {
                    tally.behind += u64::from(now < start);
                }
                tally.sliding += u64::from(item.params.kind() == Kind::SlidingWindow);
            }
        }
        tally.calls += 1;
        tally.refused += u64::from(!want.allowed);
    }
}

#[test]
fn lua_and_rust_agree_on_first_request_windows() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    let mut tally = Tally::default();
    for seed in seeds(70_000, 400) {
        run_sequence(&mut conn, &sha, seed, &mut tally);
    }
    eprintln!("differential (window_start): {tally:?}");
    if std::env::var("SLUICE_DIFF_SEED").is_err() {
        assert!(tally.calls > 10_000, "{tally:?}");
        assert!(
            tally.refused > 500 && tally.refused < tally.calls,
            "{tally:?}"
        );
        assert!(
            tally.fr_refused > 500 && tally.fr_new_windows > 1_000,
            "{tally:?}"
        );
        assert!(
            tally.expired_deleted > 300 && tally.expired_kept > 300,
            "{tally:?}"
        );
        assert!(tally.behind > 50 && tally.over_limit > 200, "{tally:?}");
        assert!(tally.at_window_end > 500, "{tally:?}");
        assert!(tally.sliding > 5_000, "{tally:?}");
    }
}

/// One key step by step: refused at its limit with a wait to its own window's end (not the
/// epoch's), admitted again at that instant into a window starting there; costs above 1;
/// and after Redis itself expires the key, the next request starts a fresh origin.
#[test]
fn refused_then_a_new_window_then_expiry_alike() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    let len = 60 * SECOND;
    let key = "sl:{one}:f:first".to_string();
    let item = Item {
        key: key.clone(),
        params: first_request(5, len),
        enforce: true,
        charge_rejected: false,
        remote: Remote::default(),
    };
    let t0: Micros = 1_700_000_000 * SECOND + 17 * SECOND + 123;
    let mut state: Option<State> = None;
    let step = |conn: &mut redis::Connection, state: &mut Option<State>, now, cost| {
        let call = Call {
            now,
            cost,
            request_id: "r".into(),
            items: vec![item.clone()],
        };
        let (want, writes) = apply(&call, std::slice::from_ref(state));
        let (got, _) = run_script(conn, &sha, &call);
        assert_eq!(got, want, "at {now}");
        if let Write::Put(st, _) = &writes[0] {
            *state = Some(st.clone());
        }
        assert_eq!(stored(conn, &key, Kind::FixedWindow), *state, "at {now}");
        got.outcomes[0]
    };
    assert!(step(&mut conn, &mut state, t0, 2).allowed);
    assert!(step(&mut conn, &mut state, t0 + SECOND, 2).allowed);
    let o = step(&mut conn, &mut state, t0 + 2 * SECOND, 2);
    assert!(!o.allowed, "4 + 2 > 5");
    assert_eq!(o.retry_after, len - 2 * SECOND, "the key's own window end");
    let o = step(&mut conn, &mut state, t0 + 2 * SECOND, 1);
    assert!(o.allowed && o.remaining == 0);
    assert!(!step(&mut conn, &mut state, t0 + len - 1, 1).allowed);
    let o = step(&mut conn, &mut state, t0 + len, 3);
    assert!(o.allowed && o.remaining == 2 && o.reset == len);
    assert_eq!(
        stored(&mut conn, &key, Kind::FixedWindow),
        Some(State::FixedWindow {
            start: t0 + len,
            count: 3
        })
    );
    // Redis expires the key (here at once), and waits until it is gone.
    let mut c = sync_conn(&server.url());
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(1)
        .query(&mut c)
        .expect("PEXPIRE");
    let mut gone = false;
    for _ in 0..1_000 {
        let n: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut c)
            .expect("EXISTS");
        if n == 0 {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(gone, "Redis expired the key within 5 s");
    state = None;
    let later = t0 + len + 7 * SECOND + 1;
    let o = step(&mut conn, &mut state, later, 1);
    assert!(o.allowed && o.reset == len && o.remaining == 4);
    assert_eq!(
        stored(&mut conn, &key, Kind::FixedWindow),
        Some(State::FixedWindow {
            start: later,
            count: 1
        }),
        "a fresh origin at the next request"
    );
}

/// A first-request window's key holding anything but "start count" fails the call as corrupt
/// (naming the key) and writes nothing, as every state does.
#[test]
fn a_corrupt_first_request_state_is_an_error() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    let key = "sl:{bad}:f:first";
    let call = Call {
        now: 1_700_000_000 * SECOND,
        cost: 1,
        request_id: "r".into(),
        items: vec![Item {
            key: key.into(),
            params: first_request(5, 60 * SECOND),
            enforce: true,
            charge_rejected: false,
            remote: Remote::default(),
        }],
    };
    for bad in ["7", "x 1", "1 2 3"] {
        let () = redis::cmd("SET")
            .arg(key)
            .arg(bad)
            .query(&mut conn)
            .expect("SET");
        let enc = encode_check(&call).expect("encodable call");
        let got: Result<Value, redis::RedisError> = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(enc.keys.len())
            .arg(&enc.keys)
            .arg(&enc.args)
            .query(&mut conn);
        let err = got.expect_err("a corrupt state is an error").to_string();
        assert!(
            err.contains("SLUICE_CORRUPT") && err.contains("1 first-request window value"),
            "{bad}: {err}"
        );
        let v: String = redis::cmd("GET").arg(key).query(&mut conn).expect("GET");
        assert_eq!(v, bad, "nothing written");
    }
}
