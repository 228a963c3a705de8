//! Differential test: `lua/check.lua` on a real redis-server against the Rust core.
//!
//! Seeded random sequences of (time step, cost, request id, remote counts, parameter change)
//! run through `sluice_core::batch::apply` over a map of states and through the script, with
//! the store's own encoder and decoder, interleaved with give-backs of leased units
//! (`GiveBack::write` against `lua/give_back.lua`: whether it wrote, the TTL and the state
//! must agree too). After every call the outcomes must be identical field
//! by field, the TTL the script set must be the TTL `take` returned (in ms, rounded up), and
//! the state stored in Redis must decode to the core's state. Every algorithm alone, calls
//! mixing algorithms with shadow and charge_rejected flags, calendar windows, and (for the
//! algorithms whose core clamps time) clocks that step backwards. Bucket keys now and then
//! expire (a restart: the next call starts a new generation, labelled with its birth) or are
//! rewritten as a key from before generation labels (`born` 0), on both sides alike.
//!
//! Each call runs in MULTI/EXEC together with its PTTL reads and a PERSIST of its keys: the
//! sequences run in virtual time, so a key must never expire in real time behind the model's
//! back; the PTTL read inside the same transaction sees the TTL exactly as the script set it.
//!
//! A failure prints the sequence's seed; `SLUICE_DIFF_SEED=<seed>` replays that one sequence.

mod common;

use common::script::{run_script, seeds, ttl_matches};
use common::{load, redis, script_loaded};
use redis::Value;
use sluice_core::algo::{Calendar, CalendarUnit, Rate, UNLABELLED, Window};
use sluice_core::batch::{Call, GiveBack, Item, Write, apply};
use sluice_core::time::{MILLI, SECOND};
use sluice_core::{Micros, Params, Remote, State};
use sluice_rng::Rng;
use sluice_store::redis::{
    CHECK_SCRIPT, GIVE_BACK_SCRIPT, decode_give_back, encode_give_back, item_keys, script_sha,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alg {
    Tb,
    Gcra,
    Fw,
    FwCalendar,
    Sw,
    Sl,
    Cc,
}

const ALL: [Alg; 7] = [
    Alg::Tb,
    Alg::Gcra,
    Alg::Fw,
    Alg::FwCalendar,
    Alg::Sw,
    Alg::Sl,
    Alg::Cc,
];
/// The algorithms whose core clamps a clock that steps back (max with the stored time).
const CLAMPED: [Alg; 4] = [Alg::Tb, Alg::Gcra, Alg::Sl, Alg::Cc];

fn small_or_big(rng: &mut Rng, small: u64, big: u64) -> u64 {
    if rng.chance(0.7) {
        rng.range(1, small)
    } else {
        rng.range(1, big)
    }
}

/// A rate below one a second: a few per a minute, an hour, a day or any whole number of
/// milliseconds up to two minutes (`10/1m`, `1/1h`, `7/1m`: units of their own per token).
fn gen_slow_rate(rng: &mut Rng) -> Rate {
    let per = match rng.range(0, 3) {
        0 => 60 * SECOND,
        1 => 3_600 * SECOND,
        2 => 86_400 * SECOND,
        _ => rng.range(1, 120_000) * MILLI,
    };
    Rate::new(small_or_big(rng, 30, 600), per).expect("a valid rate")
}

/// A burst the rate takes (`Rate::fits`, as rule validation checks it).
fn gen_burst(rng: &mut Rng, rate: Rate, small: u64, big: u64) -> u64 {
    loop {
        let b = small_or_big(rng, small, big);
        if rate.fits(b).is_ok() {
            return b;
        }
    }
}

fn gen_params(rng: &mut Rng, alg: Alg) -> Params {
    match alg {
        Alg::Tb => {
            // Rates dividing 10^6 (most configured ones) store one integer; others don't.
            let rate = if rng.chance(0.3) {
                gen_slow_rate(rng)
            } else if rng.chance(0.4) {
                Rate::per_second([1, 2, 5, 10, 20, 25, 100, 1_000][rng.range(0, 7) as usize])
            } else {
                Rate::per_second(small_or_big(rng, 50, 1_000_000))
            };
            Params::TokenBucket {
                rate,
                burst: gen_burst(rng, rate, 30, 1_000_000),
            }
        }
        Alg::Gcra => {
            let rate = if rng.chance(0.3) {
                gen_slow_rate(rng)
            } else {
                Rate::per_second(small_or_big(rng, 50, 100_000))
            };
            Params::Gcra {
                rate,
                burst: gen_burst(rng, rate, 30, 10_000),
            }
        }
        Alg::Fw => Params::FixedWindow {
            limit: small_or_big(rng, 30, 1_000_000),
            window: Window::Epoch(small_or_big(rng, 5_000, 86_400_000) * MILLI),
        },
        Alg::FwCalendar => {
            let units = [
                CalendarUnit::Hour,
                CalendarUnit::Day,
                CalendarUnit::Week,
                CalendarUnit::Month,
            ];
            let zones = ["UTC", "Asia/Kolkata", "America/New_York"];
            let unit = units[rng.range(0, 3) as usize];
            let tz = zones[rng.range(0, 2) as usize];
            Params::FixedWindow {
                limit: small_or_big(rng, 30, 10_000),
                window: Window::Calendar(Calendar::new(unit, tz).expect("known zone")),
            }
        }
        Alg::Sw => Params::SlidingWindow {
            limit: small_or_big(rng, 30, 10_000),
            window: small_or_big(rng, 5_000, 86_400_000) * MILLI,
            start: Default::default(),
        },
        Alg::Sl => Params::SlidingLog {
            limit: small_or_big(rng, 30, 200),
            window: small_or_big(rng, 5_000, 600_000) * MILLI,
        },
        Alg::Cc => Params::Concurrency {
            limit: small_or_big(rng, 10, 100),
            timeout: small_or_big(rng, 5_000, 600_000) * MILLI,
        },
    }
}

/// New numbers for the same rule, as an operator's edit would give: the window length of a
/// window algorithm stays (a new length is a new rule: its window keys would not line up).
fn change_params(rng: &mut Rng, alg: Alg, p: &Params) -> Params {
    let fresh = gen_params(rng, alg);
    match (p, fresh) {
        (Params::FixedWindow { window, .. }, Params::FixedWindow { limit, .. }) => {
            Params::FixedWindow {
                limit,
                window: window.clone(),
            }
        }
        (Params::SlidingWindow { window, .. }, Params::SlidingWindow { limit, .. }) => {
            Params::SlidingWindow {
                limit,
                window: *window,
                start: Default::default(),
            }
        }
        (_, f) => f,
    }
}

fn alg_of(p: &Params) -> Alg {
    match p {
        Params::TokenBucket { .. } => Alg::Tb,
        Params::Gcra { .. } => Alg::Gcra,
        Params::FixedWindow {
            window: Window::Epoch(_),
            ..
        } => Alg::Fw,
        Params::FixedWindow { .. } => Alg::FwCalendar,
        Params::SlidingWindow { .. } => Alg::Sw,
        Params::SlidingLog { .. } => Alg::Sl,
        Params::Concurrency { .. } => Alg::Cc,
        // Its own sequences: differential_shaping.rs.
        Params::LeakyQueue { .. } => unreachable!("this test generates no leaky queue"),
        // Its own sequences: differential_fair_share.rs.
        Params::FairShare(_) => unreachable!("this test generates no fair share"),
    }
}

fn gap(rng: &mut Rng) -> Micros {
    match rng.range(0, 99) {
        0..=29 => 0,
        30..=59 => rng.range(0, 2_000),
        60..=84 => rng.range(0, 3 * SECOND),
        85..=94 => rng.range(0, 10 * SECOND),
        _ => rng.range(0, 3 * 86_400 * SECOND),
    }
}

fn cost(rng: &mut Rng) -> u64 {
    match rng.range(0, 99) {
        0..=59 => 1,
        60..=79 => 0,
        80..=94 => rng.range(2, 4),
        _ => rng.range(5, 40),
    }
}

/// The state Redis holds for an item, decoded into the core's terms, next to what the core
/// holds: `(redis, core)` must be equal.
fn stored_vs_model(
    conn: &mut redis::Connection,
    item: &Item,
    state: Option<&State>,
    now: Micros,
) -> (Option<State>, Option<State>) {
    let keys = item_keys(item, now);
    let get = |conn: &mut redis::Connection, k: &str| -> Option<String> {
        redis::cmd("GET").arg(k).query(conn).expect("GET")
    };
    let zrange = |conn: &mut redis::Connection, k: &str| -> Vec<(String, f64)> {
        redis::cmd("ZRANGE")
            .arg(k)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(conn)
            .expect("ZRANGE")
    };
    let count = |conn: &mut redis::Connection, k: &str| -> u64 {
        get(conn, k).map_or(0, |v| v.parse().expect("a counter"))
    };
    match &item.params {
        Params::LeakyQueue { .. } => unreachable!("this test generates no leaky queue"),
        Params::FairShare(_) => unreachable!("this test generates no fair share"),
        Params::TokenBucket { .. } => (
            get(conn, &keys[0]).map(|v| {
                State::decode(sluice_core::algo::Kind::TokenBucket, &v).expect("tb state")
            }),
            state.cloned(),
        ),
        Params::Gcra { .. } => (
            get(conn, &keys[0]).map(|v| {
                // "tat" alone when no remote units were seen.
                let v = if v.contains(' ') { v } else { format!("{v} 0") };
                State::decode(sluice_core::algo::Kind::Gcra, &v).expect("gcra state")
            }),
            state.cloned(),
        ),
        Params::FixedWindow { window, .. } => {
            let (start, _) = window.bounds(now);
            let model = match state {
                Some(State::FixedWindow { start: s, count }) if *s == start => *count,
                _ => 0,
            };
            (
                Some(State::FixedWindow {
                    start,
                    count: count(conn, &keys[0]),
                }),
                Some(State::FixedWindow {
                    start,
                    count: model,
                }),
            )
        }
        Params::SlidingWindow { window, .. } => {
            let start = now - now % window;
            let (cur, prev) = match state {
                Some(State::SlidingWindow {
                    start: s,
                    cur,
                    prev,
                }) if *s == start => (*cur, *prev),
                Some(State::SlidingWindow { start: s, cur, .. }) if *s + window == start => {
                    (0, *cur)
                }
                _ => (0, 0),
            };
            (
                Some(State::SlidingWindow {
                    start,
                    cur: count(conn, &keys[0]),
                    prev: count(conn, &keys[1]),
                }),
                Some(State::SlidingWindow { start, cur, prev }),
            )
        }
        Params::SlidingLog { .. } => {
            let z = zrange(conn, &keys[0]);
            let redis_state = (!z.is_empty()).then(|| State::SlidingLog {
                entries: z.iter().map(|(_, s)| *s as u64).collect(),
            });
            (redis_state, state.cloned())
        }
        Params::Concurrency { .. } => {
            let z = zrange(conn, &keys[0]);
            let mut slots: Vec<(String, Micros, u64)> = z
                .iter()
                .map(|(m, s)| {
                    let (c, id) = m.split_once(':').expect("cost:id member");
                    (id.to_string(), *s as u64, c.parse().expect("cost"))
                })
                .collect();
            slots.sort();
            let redis_state = (!slots.is_empty()).then_some(State::Concurrency { slots });
            let model = state.map(|s| match s {
                State::Concurrency { slots } => {
                    let mut v = slots.clone();
                    v.sort();
                    State::Concurrency { slots: v }
                }
                other => other.clone(),
            });
            (redis_state, model)
        }
    }
}

#[derive(Default, Debug)]
struct Tally {
    sequences: u64,
    calls: u64,
    item_checks: u64,
    refused: u64,
    /// Give-backs that wrote (or deleted) and that found nothing to give back to, per
    /// algorithm (in `ALL`'s order).
    gave_back: [u64; 7],
    gave_nothing: [u64; 7],
    by_alg: [u64; 7],
    /// Token bucket states stored as one integer (the normalized form) and with fields.
    tb_forms: [u64; 2],
    /// Bucket writes kept past full (a shared figure: `seen` or `used`), and of those the
    /// ones written full, whose TTL is the refill period alone.
    kept: u64,
    kept_full: u64,
    /// Calls on a fresh bucket key shared by 2 to 5 regions (which starts with a share).
    fresh_shares: u64,
    /// Bucket keys expired under the sequence (a restart), and outcomes of a shared bucket
    /// labelled with its generation's birth.
    restarts: u64,
    labelled: u64,
    /// Labelled bucket states rewritten as a key from before labels (`born` 0).
    unlabelled: u64,
}

/// Between calls, a bucket key may expire (its generation ends; the next call starts a new
/// one, labelled with its birth) or be rewritten as an older daemon wrote it (no label), in
/// Redis and in the model alike.
fn restart_or_unlabel(
    conn: &mut redis::Connection,
    rng: &mut Rng,
    items: &[Item],
    states: &mut [Option<State>],
    now: Micros,
    tally: &mut Tally,
) {
    for (item, st) in items.iter().zip(states.iter_mut()) {
        if !matches!(alg_of(&item.params), Alg::Tb | Alg::Gcra) || st.is_none() {
            continue;
        }
        if rng.chance(0.08) {
            for k in item_keys(item, now) {
                let _: i64 = redis::cmd("DEL").arg(&k).query(conn).expect("DEL");
            }
            *st = None;
            tally.restarts += 1;
        } else if rng.chance(0.05) {
            let old = match st.take() {
                Some(State::TokenBucket {
                    tokens,
                    ts,
                    seen,
                    used,
                    born,
                }) if born > 0 => State::TokenBucket {
                    tokens,
                    ts,
                    seen,
                    used,
                    born: 0,
                },
                Some(State::Gcra {
                    tat,
                    seen,
                    used,
                    born,
                }) if born > 0 => State::Gcra {
                    tat,
                    seen,
                    used,
                    born: 0,
                },
                other => {
                    *st = other;
                    continue;
                }
            };
            let () = redis::cmd("SET")
                .arg(&item.key)
                .arg(old.encode())
                .query(conn)
                .expect("SET");
            *st = Some(old);
            tally.unlabelled += 1;
        }
    }
}

/// Counts a bucket write whose key outlives its refill (`token_bucket::kept_past_full`).
fn tally_kept(tally: &mut Tally, params: &Params, st: &State, ttl: Micros) {
    if let State::TokenBucket { seen, used, .. } | State::Gcra { seen, used, .. } = st
        && (*seen > 0 || *used > 0)
    {
        tally.kept += 1;
        tally.kept_full += u64::from(ttl == params.window());
    }
}

/// Runs one give-back through `give_back.lua` (in MULTI/EXEC with PTTL and PERSIST of its
/// key, as `run_script`) and returns whether it wrote and the key's PTTL.
fn run_give_back(conn: &mut redis::Connection, sha: &str, g: &GiveBack) -> (bool, i64) {
    let enc = encode_give_back(g).expect("an encodable give-back");
    assert_eq!(enc.keys.len(), 1, "{enc:?}");
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(&enc.keys)
        .arg(&enc.args);
    pipe.cmd("PTTL").arg(&enc.keys[0]);
    pipe.cmd("PERSIST").arg(&enc.keys[0]).ignore();
    let vals: Vec<Value> = pipe.query(conn).expect("MULTI/EXEC with give_back.lua");
    let wrote = decode_give_back(&vals[0]).expect("a 0 or 1 reply");
    let pttl = match &vals[1] {
        Value::Int(n) => *n,
        other => panic!("PTTL answered {other:?}"),
    };
    (wrote, pttl)
}

/// Units a give-back returns: mostly a lease's size, sometimes more than was ever taken,
/// now and then the largest a store accepts.
fn units(rng: &mut Rng) -> u64 {
    match rng.range(0, 99) {
        0..=4 => 0,
        5..=69 => rng.range(1, 10),
        70..=94 => rng.range(10, 200),
        _ => rng.range(1, sluice_core::algo::MAX_LIMIT),
    }
}

/// Which algorithms can be leased (and so given back to).
fn leasable(alg: Alg) -> bool {
    matches!(
        alg,
        Alg::Tb | Alg::Gcra | Alg::Fw | Alg::FwCalendar | Alg::Sw
    )
}

/// Gives back to one leasable item of the sequence, if it has one, and compares the core
/// and the script: whether it wrote, the TTL, the state after.
#[allow(clippy::too_many_arguments)]
fn give_back_step(
    conn: &mut redis::Connection,
    sha: &str,
    rng: &mut Rng,
    items: &[Item],
    states: &mut [Option<State>],
    history: &[Micros],
    now: Micros,
    ctx: &str,
    tally: &mut Tally,
) {
    let candidates: Vec<usize> = (0..items.len())
        .filter(|&i| leasable(alg_of(&items[i].params)))
        .collect();
    if candidates.is_empty() {
        return;
    }
    let i = candidates[rng.range(0, candidates.len() as u64 - 1) as usize];
    let item = &items[i];
    let taken_at = match rng.range(0, 9) {
        0..=4 => now,
        5..=7 => history[rng.range(0, history.len() as u64 - 1) as usize],
        _ => now.saturating_sub(rng.range(0, 10 * SECOND)),
    };
    let g = GiveBack {
        key: item.key.clone(),
        params: item.params.clone(),
        units: units(rng),
        taken_at,
        now,
    };
    let before = states[i].clone();
    let want = g.write(before.as_ref());
    let (wrote, pttl) = run_give_back(conn, sha, &g);
    let ctx = || {
        format!(
            "{ctx}
give-back: {g:#?}
state before: {before:#?}
core: {want:#?}"
        )
    };
    assert_eq!(wrote, matches!(want, Write::Put(..)), "wrote? {}", ctx());
    let a = ALL
        .iter()
        .position(|x| *x == alg_of(&item.params))
        .unwrap_or(0);
    match want.clone() {
        Write::Put(st, ttl) => {
            assert!(
                ttl_matches(pttl, ttl),
                "TTL after a give-back: {pttl} ms, core says {ttl} µs: {}",
                ctx()
            );
            tally_kept(tally, &item.params, &st, ttl);
            states[i] = (ttl > 0).then_some(st);
            tally.gave_back[a] += 1;
        }
        Write::Keep => tally.gave_nothing[a] += 1,
    }
    let (in_redis, in_core) = stored_vs_model(conn, item, states[i].as_ref(), now);
    assert_eq!(
        in_redis,
        in_core,
        "stored state after a give-back: {}",
        ctx()
    );
}

fn run_sequence(
    conn: &mut redis::Connection,
    (sha, gsha): (&str, &str),
    seed: u64,
    algs: &[Alg],
    skew: bool,
    tally: &mut Tally,
) {
    let mut rng = Rng::stream(seed, 0);
    let mixed = algs.len() > 1;
    let mut items: Vec<Item> = algs
        .iter()
        .enumerate()
        .map(|(i, alg)| Item {
            key: format!("sl:{{seq{seed}}}:rule{i}"),
            params: gen_params(&mut rng, *alg),
            enforce: !mixed || rng.chance(0.75),
            charge_rejected: rng.chance(0.3),
            // Half the buckets start shared (they count `used`) among 1 to 5 regions (a
            // fresh key holds its region's share of the burst), a quarter of those with
            // generation labels off; the scope and the labels may flip below.
            remote: {
                let r = Remote {
                    cur: 0,
                    prev: if matches!(alg, Alg::Tb | Alg::Gcra) && rng.chance(0.5) {
                        rng.range(1, 5)
                    } else {
                        0
                    },
                };
                if rng.chance(0.25) {
                    r.without_labels()
                } else {
                    r
                }
            },
        })
        .collect();
    let mut states: Vec<Option<State>> = vec![None; items.len()];
    let mut now: Micros = 1_700_000_000 * SECOND + rng.range(0, 86_400 * SECOND);
    let steps = rng.range(20, 60);
    // Times of earlier calls: when a give-back's units may have been taken.
    let mut history: Vec<Micros> = Vec::with_capacity(steps as usize);
    for step in 0..steps {
        if skew && rng.chance(0.25) {
            now -= rng.range(0, 5_000).min(now);
        } else {
            now += gap(&mut rng);
        }
        restart_or_unlabel(conn, &mut rng, &items, &mut states, now, tally);
        for item in items.iter_mut() {
            let alg = alg_of(&item.params);
            if rng.chance(0.05) {
                item.params = change_params(&mut rng, alg, &item.params);
            }
            if rng.chance(0.1) {
                let limit = item.params.limit();
                item.remote = match alg {
                    // Cumulative consumption elsewhere: monotone. `prev` is 0 or the regions
                    // sharing the rule: a shared bucket counts its own `used` (and stores it),
                    // an unshared one does not; a rule may switch between the two (a changed
                    // scope), and the regions counted may change (a region joins or leaves).
                    Alg::Tb | Alg::Gcra => Remote {
                        cur: item.remote.cur + rng.range(0, 5),
                        prev: if rng.chance(0.2) {
                            if item.remote.prev == 0 {
                                rng.range(1, 5)
                            } else {
                                0
                            }
                        } else if item.remote.prev > 0 && rng.chance(0.2) {
                            rng.range(1, 5)
                        } else {
                            item.remote.prev
                        },
                    },
                    _ => Remote {
                        cur: rng.range(0, limit.min(1_000) + 3),
                        prev: rng.range(0, limit.min(1_000) + 3),
                    },
                };
            }
            // Labels turned off or on again (a region rolled onto a release, or back).
            if matches!(alg, Alg::Tb | Alg::Gcra) && rng.chance(0.05) {
                item.remote = if item.remote.unlabelled() {
                    Remote {
                        prev: item.remote.prev - UNLABELLED,
                        ..item.remote
                    }
                } else {
                    item.remote.without_labels()
                };
            }
        }
        let call = Call {
            now,
            cost: cost(&mut rng),
            request_id: if rng.chance(0.5) {
                format!("r{}", rng.range(0, 3))
            } else {
                format!("u{step}")
            },
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
        tally.labelled += want.outcomes.iter().filter(|o| o.generation > 0).count() as u64;

        // The TTL of every written key is the core's TTL in ms, rounded up, at least 1; a
        // state that carries nothing is deleted. PTTL reads the real clock, which moves a
        // little between the script and the read even inside EXEC (expiry itself is frozen
        // there), hence the slack below the expected figure.
        let mut k = 0;
        for (item, w) in call.items.iter().zip(&writes) {
            if let Write::Put(_, ttl) = w {
                let pttl = pttls[k];
                assert!(
                    ttl_matches(pttl, *ttl),
                    "TTL of {}: {pttl} ms, core says {ttl} µs (0: deleted): {}",
                    item.key,
                    ctx()
                );
            }
            k += item_keys(item, now).len();
        }
        for ((s, w), item) in states.iter_mut().zip(writes).zip(&call.items) {
            if let Write::Put(st, ttl) = w {
                tally_kept(tally, &item.params, &st, ttl);
                *s = (ttl > 0).then_some(st);
            }
        }
        for (i, item) in call.items.iter().enumerate() {
            let (in_redis, in_core) = stored_vs_model(conn, item, states[i].as_ref(), now);
            assert_eq!(
                in_redis,
                in_core,
                "stored state of {} differs after the call: {}",
                item.key,
                ctx()
            );
            if let Some(State::TokenBucket {
                tokens,
                seen,
                used,
                born,
                ..
            }) = &in_core
            {
                tally.tb_forms
                    [usize::from(*tokens != 0 || *seen != 0 || *used != 0 || *born != 0)] += 1;
            }
            tally.by_alg[ALL
                .iter()
                .position(|a| *a == alg_of(&item.params))
                .unwrap_or(0)] += 1;
        }
        // Fresh keys of buckets shared by several regions: they start with a share.
        tally.fresh_shares += call
            .items
            .iter()
            .zip(&before)
            .filter(|(it, st)| {
                st.is_none()
                    && it.remote.prev > 1
                    && matches!(alg_of(&it.params), Alg::Tb | Alg::Gcra)
            })
            .count() as u64;
        tally.calls += 1;
        tally.item_checks += call.items.len() as u64;
        tally.refused += u64::from(!want.allowed);
        history.push(now);
        // Units leased by a check like this one, given back now and then (the call's own
        // now, an earlier call's, or some time ago).
        while rng.chance(0.3) {
            let ctx = format!("seed {seed} step {step}");
            give_back_step(
                conn,
                gsha,
                &mut rng,
                &call.items,
                &mut states,
                &history,
                now,
                &ctx,
                tally,
            );
        }
    }
    tally.sequences += 1;
}

/// `rate: 10/1m, burst: 10` on both buckets: ten at once, then one every 6 s exactly, the
/// script answering and storing what the core does at every step (a microsecond early
/// included).
#[test]
fn ten_per_minute_alike() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    let t0: Micros = 1_700_000_000 * SECOND;
    let rate = Rate::new(10, 60 * SECOND).expect("10/1m");
    let mut times = vec![t0; 11];
    for k in 1..=5 {
        times.extend([t0 + k * 6 * SECOND - 1, t0 + k * 6 * SECOND]);
    }
    for params in [
        Params::TokenBucket { rate, burst: 10 },
        Params::Gcra { rate, burst: 10 },
    ] {
        let key = format!("sl:{{minute}}:{:?}", params.kind());
        let mut state: Option<State> = None;
        let mut admitted = Vec::new();
        for (i, now) in times.iter().copied().enumerate() {
            let call = Call {
                now,
                cost: 1,
                request_id: format!("r{i}"),
                items: vec![Item {
                    key: key.clone(),
                    params: params.clone(),
                    enforce: true,
                    charge_rejected: false,
                    remote: Remote::default(),
                }],
            };
            let (want, writes) = apply(&call, std::slice::from_ref(&state));
            let (got, _) = run_script(&mut conn, &sha, &call);
            assert_eq!(got, want, "{key} step {i}");
            if got.allowed {
                admitted.push(now - t0);
            }
            match &writes[0] {
                Write::Put(st, ttl) if *ttl > 0 => state = Some(st.clone()),
                Write::Put(..) => state = None,
                Write::Keep => {}
            }
            let (in_redis, in_core) =
                stored_vs_model(&mut conn, &call.items[0], state.as_ref(), now);
            assert_eq!(in_redis, in_core, "{key} step {i}");
        }
        let mut want = vec![0; 10];
        want.extend((1..=5).map(|k| k * 6 * SECOND));
        assert_eq!(admitted, want, "{key}");
    }
}

/// A shared bucket's `used` stops at 2^53 − 1 alike (the sequences never get near it): Lua
/// adds past 2^53 inexactly, and its `min` must still land on the same figure.
#[test]
fn used_saturates_alike_near_2_pow_53() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    let now: Micros = 1_700_000_000 * SECOND;
    let max = sluice_core::algo::MAX_USED;
    for (i, (params, stored)) in [
        (
            Params::TokenBucket {
                rate: Rate::per_second(1_000_000_000),
                burst: 1_000_000_000,
            },
            format!("0 {now} 0 {}", max - 3),
        ),
        (
            Params::Gcra {
                rate: Rate::per_second(1_000),
                burst: 1_000_000_000,
            },
            format!("{now} 0 {}", max - 3),
        ),
        (
            Params::TokenBucket {
                rate: Rate::per_second(1),
                burst: 1_000_000_000,
            },
            format!("0 {now} 0 {max}"),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        for cost in [1, 3, 1_000_000_000] {
            let key = format!("sl:{{max{i}}}:rule{cost}");
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg(&stored)
                .query(&mut conn)
                .expect("SET");
            let state = State::decode(params.kind(), &stored).expect("a valid state");
            let call = Call {
                now,
                cost,
                request_id: "r".into(),
                items: vec![Item {
                    key: key.clone(),
                    params: params.clone(),
                    enforce: true,
                    charge_rejected: true,
                    remote: Remote::shared_bucket(0, 1),
                }],
            };
            let states = vec![Some(state)];
            let (want, writes) = apply(&call, &states);
            let (got, _) = run_script(&mut conn, &sha, &call);
            assert_eq!(got, want, "{key}: {stored}, cost {cost}");
            let after = match &writes[0] {
                Write::Put(st, ttl) if *ttl > 0 => Some(st.clone()),
                _ => None,
            };
            if let Some(State::TokenBucket { used, .. } | State::Gcra { used, .. }) = &after {
                assert!(*used <= max && *used >= max - 3, "{used}");
            }
            let (in_redis, in_core) =
                stored_vs_model(&mut conn, &call.items[0], after.as_ref(), now);
            assert_eq!(in_redis, in_core, "{key}: {stored}, cost {cost}");
        }
    }
}

/// A shared bucket a region takes under its rate (1 every 111 ms on 10/s, burst 100) keeps
/// its key between takes alike, so `used` counts every take; a region-scope one is due to
/// expire before the next take, as before (its TTL is the refill of one token).
#[test]
fn a_shared_bucket_under_its_rate_keeps_counting_alike() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    let t0: Micros = 1_700_000_000 * SECOND;
    let gap = 111 * MILLI;
    let rate = Rate::per_second(10);
    for (i, params) in [
        Params::TokenBucket { rate, burst: 100 },
        Params::Gcra { rate, burst: 100 },
    ]
    .into_iter()
    .enumerate()
    {
        for shared in [true, false] {
            let item = Item {
                key: format!("sl:{{under{i}{shared}}}:rule"),
                params: params.clone(),
                enforce: true,
                charge_rejected: false,
                remote: Remote {
                    cur: 0,
                    prev: u64::from(shared),
                },
            };
            let mut state: Option<State> = None;
            for k in 1..=30u64 {
                let now = t0 + k * gap;
                let call = Call {
                    now,
                    cost: 1,
                    request_id: "r".into(),
                    items: vec![item.clone()],
                };
                let states = vec![state.clone()];
                let (want, writes) = apply(&call, &states);
                let (got, pttls) = run_script(&mut conn, &sha, &call);
                assert_eq!(got, want, "{}: take {k}", item.key);
                let Write::Put(st, ttl) = &writes[0] else {
                    panic!("a take writes");
                };
                assert!(
                    ttl_matches(pttls[0], *ttl),
                    "{}: {} ms, {ttl} µs",
                    item.key,
                    pttls[0]
                );
                if shared {
                    assert_eq!(want.outcomes[0].usage, k, "{}", item.key);
                    assert!(*ttl > gap, "{}: {ttl}", item.key);
                } else {
                    assert!(*ttl < gap, "{}: {ttl}", item.key);
                }
                // The key lives to the next take only while its TTL covers the gap.
                state = (*ttl > gap).then(|| st.clone());
                let (in_redis, in_core) = stored_vs_model(&mut conn, &item, Some(st), now);
                assert_eq!(in_redis, in_core, "{}: take {k}", item.key);
                if state.is_none() {
                    let _: () = redis::cmd("DEL")
                        .arg(&item.key)
                        .query(&mut conn)
                        .expect("DEL");
                }
            }
        }
    }
}

#[test]
fn lua_and_rust_agree_on_random_sequences() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    assert_eq!(sha, script_sha(CHECK_SCRIPT));
    let gsha = load(&mut conn, GIVE_BACK_SCRIPT);
    let shas = (sha.as_str(), gsha.as_str());
    let mut tally = Tally::default();

    // Every algorithm alone, time moving forward.
    for seed in seeds(1_000, 420) {
        let alg = ALL[(seed % ALL.len() as u64) as usize];
        run_sequence(&mut conn, shas, seed, &[alg], false, &mut tally);
    }
    // Calls mixing two to four algorithms, with shadow and charge_rejected items.
    for seed in seeds(20_000, 150) {
        let mut rng = Rng::stream(seed ^ 0xA5A5, 0);
        let n = rng.range(2, 4);
        let algs: Vec<Alg> = (0..n).map(|_| ALL[rng.range(0, 6) as usize]).collect();
        run_sequence(&mut conn, shas, seed, &algs, false, &mut tally);
    }
    // Clocks stepping back (another daemon behind), where the core clamps time.
    for seed in seeds(40_000, 80) {
        let mut rng = Rng::stream(seed ^ 0x5A5A, 0);
        let n = rng.range(1, 3);
        let algs: Vec<Alg> = (0..n).map(|_| CLAMPED[rng.range(0, 3) as usize]).collect();
        run_sequence(&mut conn, shas, seed, &algs, true, &mut tally);
    }
    eprintln!("differential: {tally:?}");
    if std::env::var("SLUICE_DIFF_SEED").is_err() {
        assert!(tally.sequences >= 650, "{tally:?}");
        assert!(
            tally.refused > 0 && tally.refused < tally.calls,
            "{tally:?}"
        );
        assert!(tally.by_alg.iter().all(|n| *n > 1_000), "{tally:?}");
        // Both ways a bucket is stored were compared, many times each.
        assert!(tally.tb_forms.iter().all(|n| *n > 200), "{tally:?}");
        // Shared buckets kept past full, some of them written full.
        assert!(tally.kept > 200 && tally.kept_full > 10, "{tally:?}");
        // Fresh shared keys among several regions, compared at their share.
        assert!(tally.fresh_shares > 100, "{tally:?}");
        // Keys restarted and labelled with their new generation's birth, and keys from
        // before labels carried on unlabelled, many times each.
        assert!(tally.restarts > 200 && tally.labelled > 1_000, "{tally:?}");
        assert!(tally.unlabelled > 50, "{tally:?}");
        // Every leasable algorithm was given back to, with and without effect.
        for (i, alg) in ALL.iter().enumerate() {
            if leasable(*alg) {
                assert!(tally.gave_back[i] > 100, "{alg:?}: {tally:?}");
                assert!(tally.gave_nothing[i] > 20, "{alg:?}: {tally:?}");
            }
        }
    }
}
