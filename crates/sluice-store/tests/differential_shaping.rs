//! Differential test of `algorithm: leaky_queue` (shaping): `lua/check.lua` on a real
//! redis-server against the Rust core, as tests/differential.rs does for every algorithm.
//!
//! Seeded random sequences of shaping queues, alone and in calls with a second queue and a
//! token bucket of the same identity (shadow flags, costs 1 to 3, peeks, now and then a cost
//! far past the queue, clocks stepping back), with gaps from none (the queue grows, delays
//! climb past `max_delay` and are refused) to idle gaps past the queue's end (it empties).
//! After every call the outcomes must be identical (an admitted outcome's `retry_after` is
//! its delay), every written key's TTL the core's (until the queue is empty, in ms rounded
//! up, plus the script's second of late-call cover), and the state in Redis ("tat") the
//! core's. A key whose TTL has run out in virtual time is deleted (Redis's expiry) or kept
//! (a late call's cover), which must decide alike.
//!
//! Each call runs in MULTI/EXEC with PTTL and PERSIST of its keys, so no key expires in real
//! time behind the model's back. `SLUICE_DIFF_SEED=<seed>` replays one sequence.

mod common;

use common::script::{run_script, seeds, stored, ttl_matches};
use common::{redis, script_loaded};
use sluice_core::algo::{Kind, Rate};
use sluice_core::batch::{Call, Item, Write, apply};
use sluice_core::time::{MILLI, SECOND};
use sluice_core::{Micros, Params, Remote, State};
use sluice_rng::Rng;
use sluice_store::redis::item_keys;

fn shaped(p: &Params) -> bool {
    matches!(p, Params::LeakyQueue { .. })
}

#[derive(Default, Debug)]
struct Tally {
    calls: u64,
    refused: u64,
    /// Queue items admitted with a delay, admitted at once, and refused.
    delayed: u64,
    immediate: u64,
    queue_refused: u64,
    /// Calls that found a queue already empty again (an idle gap past its `tat`).
    drained: u64,
    /// Keys past their TTL: deleted (Redis's expiry) or kept (a late call's cover).
    expired_deleted: u64,
    expired_kept: u64,
    /// Calls behind a queue's stored departure by more than its interval (a lagging clock).
    behind: u64,
}

/// A shaping rule's numbers: a rate a second, or a count over another period.
fn queue(rng: &mut Rng) -> Params {
    let rate = if rng.chance(0.6) {
        Rate::per_second(rng.range(1, 500))
    } else {
        let per = [250 * MILLI, SECOND, 7 * SECOND, 60 * SECOND][rng.range(0, 3) as usize];
        Rate::new(rng.range(1, 100), per).expect("a valid rate")
    };
    let max_delay = match rng.range(0, 2) {
        0 => rng.range(1, 50) * MILLI,
        1 => rng.range(1, 3_000) * MILLI,
        _ => rng.range(1, 120) * SECOND,
    };
    Params::LeakyQueue { rate, max_delay }
}

fn gap(rng: &mut Rng, interval: Micros, max_delay: Micros) -> Micros {
    match rng.range(0, 99) {
        0..=34 => 0,
        35..=59 => rng.range(0, interval),
        60..=84 => rng.range(0, max_delay + interval),
        _ => rng.range(0, 3 * (max_delay + interval)),
    }
}

fn cost(rng: &mut Rng) -> u64 {
    match rng.range(0, 99) {
        0..=59 => 1,
        60..=69 => 0,
        70..=95 => rng.range(2, 3),
        _ => rng.range(4, 5_000),
    }
}

fn run_sequence(conn: &mut redis::Connection, sha: &str, seed: u64, tally: &mut Tally) {
    let mut rng = Rng::stream(seed, 11);
    let first = queue(&mut rng);
    let (interval, max_delay) = match &first {
        Params::LeakyQueue { rate, max_delay } => (rate.interval(), *max_delay),
        _ => unreachable!(),
    };
    let mut items = vec![Item {
        key: format!("sl:{{lq{seed}}}:q:shape"),
        params: first,
        enforce: true,
        charge_rejected: false,
        remote: Remote::default(),
    }];
    if rng.chance(0.3) {
        items.push(Item {
            key: format!("sl:{{lq{seed}}}:q:second"),
            params: queue(&mut rng),
            enforce: rng.chance(0.7),
            charge_rejected: false,
            remote: Remote::default(),
        });
    }
    if rng.chance(0.3) {
        items.push(Item {
            key: format!("sl:{{lq{seed}}}:t:bucket"),
            params: Params::TokenBucket {
                rate: Rate::per_second(rng.range(1, 50)),
                burst: rng.range(1, 30),
            },
            enforce: rng.chance(0.7),
            charge_rejected: rng.chance(0.3),
            remote: Remote::default(),
        });
    }
    let skew = rng.chance(0.4);
    let mut states: Vec<Option<State>> = vec![None; items.len()];
    let mut expires: Vec<Micros> = vec![0; items.len()];
    let mut now: Micros = 1_700_000_000 * SECOND + rng.range(0, 86_400 * SECOND);
    for step in 0..rng.range(20, 80) {
        if skew && rng.chance(0.2) {
            now -= rng.range(0, 2 * interval.min(SECOND));
        } else {
            now += gap(&mut rng, interval, max_delay);
        }
        for (i, item) in items.iter().enumerate() {
            if states[i].is_some() && now >= expires[i] {
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
                states[i] = (*ttl > 0).then(|| st.clone());
                expires[i] = now + ttl;
            }
            k += item_keys(item, now).len();
        }
        for (i, item) in call.items.iter().enumerate() {
            if !shaped(&item.params) {
                continue;
            }
            assert_eq!(
                stored(conn, &item.key, Kind::LeakyQueue),
                states[i],
                "stored state of {}: {}",
                item.key,
                ctx()
            );
            let o = &want.outcomes[i];
            match (o.allowed, o.delay()) {
                (false, _) => tally.queue_refused += 1,
                (true, 0) => tally.immediate += 1,
                (true, _) => tally.delayed += 1,
            }
            if let Some(State::LeakyQueue { tat }) = &before[i] {
                tally.drained += u64::from(now >= *tat);
                tally.behind += u64::from(now + interval < *tat && skew);
            }
        }
        tally.calls += 1;
        tally.refused += u64::from(!want.allowed);
    }
}

#[test]
fn lua_and_rust_agree_on_shaping_queues() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    let mut tally = Tally::default();
    for seed in seeds(90_000, 400) {
        run_sequence(&mut conn, &sha, seed, &mut tally);
    }
    eprintln!("differential (leaky_queue): {tally:?}");
    if std::env::var("SLUICE_DIFF_SEED").is_err() {
        assert!(tally.calls > 10_000, "{tally:?}");
        assert!(
            tally.refused > 500 && tally.refused < tally.calls,
            "{tally:?}"
        );
        assert!(
            tally.delayed > 2_000 && tally.immediate > 1_000 && tally.queue_refused > 500,
            "{tally:?}"
        );
        assert!(tally.drained > 500, "{tally:?}");
        assert!(
            tally.expired_deleted > 300 && tally.expired_kept > 300,
            "{tally:?}"
        );
        assert!(tally.behind > 20, "{tally:?}");
    }
}

/// One queue step by step on both sides: delays of one interval each up to `max_delay`,
/// refused past it with the wait until it fits, a refusal that leaves "tat" as it was, and an
/// idle gap that empties the queue (the key's TTL ends at its last departure).
#[test]
fn delays_refusal_and_an_emptied_queue_alike() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    let key = "sl:{one}:q:otp".to_string();
    let item = Item {
        key: key.clone(),
        params: Params::LeakyQueue {
            rate: Rate::per_second(100),
            max_delay: 2 * SECOND,
        },
        enforce: true,
        charge_rejected: false,
        remote: Remote::default(),
    };
    let t0: Micros = 1_700_000_000 * SECOND + 123;
    let mut state: Option<State> = None;
    let step = |conn: &mut redis::Connection, state: &mut Option<State>, now, cost| {
        let call = Call {
            now,
            cost,
            request_id: "r".into(),
            items: vec![item.clone()],
        };
        let (want, writes) = apply(&call, std::slice::from_ref(state));
        let (got, pttls) = run_script(conn, &sha, &call);
        assert_eq!(got, want, "at {now}");
        if let Write::Put(st, ttl) = &writes[0] {
            assert!(
                ttl_matches(pttls[0], *ttl),
                "TTL {} ms, core {ttl} µs",
                pttls[0]
            );
            *state = Some(st.clone());
        }
        assert_eq!(stored(conn, &key, Kind::LeakyQueue), *state, "at {now}");
        got.outcomes[0]
    };
    // 201 single departures fit: delays 0, 10 ms, ..., 2 s.
    for n in 0..=200 {
        let o = step(&mut conn, &mut state, t0, 1);
        assert!(o.allowed, "departure {n}");
        assert_eq!(o.delay(), n * 10 * MILLI);
    }
    let held = state.clone();
    let o = step(&mut conn, &mut state, t0, 3);
    assert!(!o.allowed);
    assert_eq!(o.retry_after, 10 * MILLI, "until the wait is back to 2 s");
    assert_eq!(
        stored(&mut conn, &key, Kind::LeakyQueue),
        held,
        "a refusal moves nothing"
    );
    // Cost 3 once it fits: it waits 2 s and holds three intervals.
    let o = step(&mut conn, &mut state, t0 + 10 * MILLI, 3);
    assert!(o.allowed && o.delay() == 2 * SECOND);
    assert_eq!(
        stored(&mut conn, &key, Kind::LeakyQueue),
        Some(State::LeakyQueue {
            tat: t0 + 2_040 * MILLI
        })
    );
    // Idle past the last departure: an empty queue, whether or not the key is still there.
    let o = step(&mut conn, &mut state, t0 + 3 * SECOND, 1);
    assert!(o.allowed && o.delay() == 0 && o.reset == 10 * MILLI);
}
