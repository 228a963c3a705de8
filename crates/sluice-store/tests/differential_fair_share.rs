//! Differential test of fair shares: `lua/check.lua` on a real redis-server against the Rust
//! core (`batch::apply` over a map of states) and against the memory store, on the same
//! seeded sequences.
//!
//! Each sequence is one rule: a parent bucket and three or four tenants of different shares
//! (a share of the whole parent among them), requests of cost 0 to 3 from random tenants,
//! gaps from none (the parent drained and busy) to a minute (idle, refilled), now and then a
//! charged refusal or a shadow rule. After every call the outcomes must be identical field by
//! field on all three, the child's and the parent's keys in Redis must hold the core's
//! states, and their TTLs the core's (each half its own). Each call runs in MULTI/EXEC with
//! its PTTL reads and a PERSIST of its keys, as `differential.rs` does: the sequence runs in
//! virtual time. A failure prints the seed; `SLUICE_DIFF_SEED=<seed>` replays it.

mod common;

use common::script::{run_script, stored, ttl_matches};
use common::{redis, script_loaded};
use sluice_core::algo::fair_share::{self, FairShare, SHARE_SCALE, Shares};
use sluice_core::algo::{Kind, Path, Rate};
use sluice_core::batch::{Call, Item, Write, apply};
use sluice_core::keys::{fair_share_key, fair_share_parent};
use sluice_core::time::{MILLI, SECOND};
use sluice_core::{Params, Remote, State};
use sluice_rng::Rng;
use sluice_store::memory::MemoryStore;
use sluice_store::redis::encode_check;
use std::collections::HashMap;
use std::sync::Arc;

/// What the sequences went through, so a run that never reached a case fails.
#[derive(Default, Debug)]
struct Tally {
    borrowed: u64,
    guaranteed: u64,
    refused: u64,
    busy: u64,
    charged_refusals: u64,
    deleted: u64,
}

/// A rule's numbers and its tenants: (tenant identity, its params).
fn rule(rng: &mut Rng) -> Vec<(String, Params)> {
    let rate = match rng.below(3) {
        0 => Rate::per_second(rng.range(1, 100)),
        1 => Rate::new(rng.range(1, 30), 60 * SECOND).expect("a rate per minute"),
        _ => Rate::new(rng.range(1, 20), rng.range(1, 5_000) * MILLI).expect("a rate"),
    };
    let burst = rng.range(2, 60);
    let borrow_above = rng.range(0, burst - 1);
    let tenants = 3 + rng.below(2);
    let mut shares: Vec<u64> = (0..tenants)
        .map(|_| rng.range(SHARE_SCALE / 20, SHARE_SCALE / 2))
        .collect();
    if rng.chance(0.3) {
        shares[0] = SHARE_SCALE;
    }
    let table = Arc::new(Shares {
        by: Some("tier".into()),
        values: shares
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("t{i}"), *s))
            .collect(),
        default: SHARE_SCALE / 10,
    });
    shares
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let (child_rate, child_burst) = fair_share::child(rate, burst, s).expect("a share");
            let fs = FairShare {
                rate,
                burst,
                borrow_above,
                shares: table.clone(),
                share: s,
                child_rate,
                child_burst,
            };
            (format!("api|tenant=k{i}"), Params::FairShare(fs))
        })
        .collect()
}

fn sequence(conn: &mut redis::Connection, sha: &str, seed: u64, tally: &mut Tally) {
    let mut rng = Rng::stream(seed, 0);
    let tenants = rule(&mut rng);
    let memory = MemoryStore::new(10_000);
    let mut model: HashMap<String, State> = HashMap::new();
    let mut now = 1_800_000_000 * SECOND + rng.range(0, SECOND);
    let ctx = |i: usize| format!("seed {seed} step {i}");
    for i in 0..300 {
        now += match rng.below(10) {
            0..=3 => 0,
            4..=6 => rng.range(0, 200 * MILLI),
            7 | 8 => rng.range(0, 3 * SECOND),
            _ => rng.range(0, 60 * SECOND),
        };
        let t = rng.below(tenants.len());
        let (identity, params) = &tenants[t];
        let cost = rng.range(0, 4);
        let item = Item {
            // A rule of its own per sequence: keys of earlier sequences stay in Redis.
            key: fair_share_key(identity, &format!("pool-{seed}")),
            params: params.clone(),
            enforce: !rng.chance(0.1),
            charge_rejected: rng.chance(0.15),
            remote: Remote::default(),
        };
        let parent = fair_share_parent(&item.key).to_string();
        let st = State::FairShare {
            child: model.get(&item.key).cloned().map(Box::new),
            parent: model.get(&parent).cloned().map(Box::new),
        };
        let Params::FairShare(fs) = params else {
            unreachable!()
        };
        match fair_share::path(fs, Some(&st), now, cost) {
            Path::Borrowed => tally.borrowed += 1,
            Path::Guaranteed => tally.guaranteed += 1,
            Path::Refused => tally.refused += 1,
        }
        tally.busy += u64::from(fair_share::busy(fs, Some(&st), now));
        let call = Call {
            now,
            cost,
            request_id: format!("r{i}"),
            items: vec![item.clone()],
        };
        let (want, writes) = apply(&call, &[Some(st)]);
        let (got, pttls) = run_script(conn, sha, &call);
        assert_eq!(
            got,
            want,
            "script vs core, {}: {:?}",
            ctx(i),
            encode_check(&call)
        );
        let mem = memory.check_sync(&call).expect("the memory store answers");
        assert_eq!(mem, want, "memory store vs core, {}", ctx(i));
        if !want.allowed && item.charge_rejected && item.enforce && cost > 0 {
            tally.charged_refusals += 1;
        }
        if let [Write::Put(State::FairShare { child, parent: p }, _)] = &writes[..] {
            for (k, (key, half, is_parent)) in [(&item.key, child, false), (&parent, p, true)]
                .into_iter()
                .enumerate()
            {
                let half = half.as_deref().expect("a take writes both halves");
                let ttl = fair_share::half_ttl(fs, half, is_parent, now);
                assert!(
                    ttl_matches(pttls[k], ttl),
                    "TTL of {key}: {} ms, core says {ttl} µs, {}",
                    pttls[k],
                    ctx(i)
                );
                if ttl == 0 {
                    tally.deleted += 1;
                    model.remove(key.as_str());
                    assert_eq!(
                        stored(conn, key, Kind::TokenBucket),
                        None,
                        "{key} deleted, {}",
                        ctx(i)
                    );
                } else {
                    model.insert(key.clone(), half.clone());
                    assert_eq!(
                        stored(conn, key, Kind::TokenBucket).as_ref(),
                        Some(half),
                        "{key}, {}",
                        ctx(i)
                    );
                }
            }
        }
    }
}

#[test]
fn lua_and_memory_agree_with_the_core_on_fair_shares() {
    let server = redis();
    let (mut conn, sha) = script_loaded(&server);
    let mut tally = Tally::default();
    let seeds: Vec<u64> = match std::env::var("SLUICE_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("SLUICE_DIFF_SEED is a number")],
        Err(_) => (1..=40).collect(),
    };
    for seed in &seeds {
        sequence(&mut conn, &sha, *seed, &mut tally);
    }
    println!(
        "fair share differential: {} sequences, {tally:?}",
        seeds.len()
    );
    if seeds.len() > 1 {
        for (what, n) in [
            ("borrowed", tally.borrowed),
            ("guaranteed", tally.guaranteed),
            ("refused", tally.refused),
            ("busy", tally.busy),
            ("charged refusals", tally.charged_refusals),
            ("deleted halves", tally.deleted),
        ] {
            assert!(n > 20, "too few {what} cases: {tally:?}");
        }
    }
}
