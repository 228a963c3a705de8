//! The 1,000-rule workload shared by the criterion bench (`benches/decide.rs`) and the
//! callgrind example (`examples/decide_loop.rs`), so both measure the same thing.

use hashbrown::HashTable;
use sluice_core::batch::{CallResult, Write, apply_reusing};
use sluice_core::decision::{Answer, Decision, Plan, plan_into};
use sluice_core::hash::Keyed;
use sluice_core::matching::Descriptors;
use sluice_core::rules::Domain;
use sluice_core::{Micros, Remote, State};
use smallvec::SmallVec;
use std::hash::BuildHasher;
use std::hint::black_box;

/// A rules file of `n` rules (routes × tiers, four algorithms) plus one grouped catch-all.
pub fn rules(n: usize) -> String {
    let mut y = String::from("domain: bench\nrules:\n");
    let algs = [
        "algorithm: token_bucket, rate_per_s: 100, burst: 200",
        "algorithm: fixed_window, limit: 10000, window: 1d",
        "algorithm: sliding_window, limit: 600, window: 1m",
        "algorithm: gcra, rate_per_s: 50, burst: 10",
    ];
    for i in 0..n {
        let tier = ["free", "growth", "enterprise"][i % 3];
        y.push_str(&format!(
            "  - {{ id: r{i}, match: {{ route: \"GET /v1/r{}\", tier: {tier} }}, key: [api_key], {} }}\n",
            i / 3,
            algs[i % algs.len()]
        ));
    }
    y.push_str("  - { id: per-key, group: g, match: { tier: \"*\" }, key: [api_key], algorithm: sliding_window, limit: 6000, window: 1m }\n");
    y
}

/// A typical request's descriptors.
pub fn descriptors() -> Descriptors {
    Descriptors::new(vec![
        ("route".into(), "GET /v1/r42".into()),
        ("tier".into(), "growth".into()),
        ("api_key".into(), "k_8f2a".into()),
        ("ip".into(), "49.36.1.7".into()),
    ])
    .expect("valid descriptors")
}

/// What one decision's caller keeps across decisions: the plan, the answers and the
/// decision are refilled in place, and the key states live in a table as the memory store's
/// (hashed with [`Keyed`], each key once per call, updated in place).
pub struct Scratch<'a> {
    plan: Plan<'a>,
    answers: Vec<Answer>,
    hashes: Vec<u64>,
    writes: Vec<Write>,
    decision: Decision,
    states: HashTable<(String, State)>,
    hasher: Keyed,
}

impl Scratch<'_> {
    /// Empty buffers and no key states.
    pub fn new() -> Self {
        Scratch {
            plan: Plan::default(),
            answers: Vec::new(),
            hashes: Vec::new(),
            writes: Vec::new(),
            decision: Decision::unlimited(0),
            states: HashTable::new(),
            hasher: Keyed::new(7),
        }
    }
}

/// One whole decision: plan, the batch arithmetic over the key states (as the memory store
/// does), decide.
pub fn decide_once<'s, 'a>(
    dom: &'a Domain,
    d: &Descriptors,
    now: Micros,
    s: &'s mut Scratch<'a>,
) -> &'s Decision {
    plan_into(&mut s.plan, dom, black_box(d), now, 1, "req", |_| {
        Remote::default()
    });
    let calls = &s.plan.calls;
    s.answers.truncate(calls.len());
    for (i, pc) in calls.iter().enumerate() {
        if i == s.answers.len() {
            s.answers.push(Answer::Done(CallResult {
                allowed: true,
                outcomes: Vec::new(),
            }));
        }
        let Answer::Done(r) = &mut s.answers[i] else {
            unreachable!("only Done answers are kept")
        };
        // The states are read in place, as the memory store lends them, and written after.
        s.hashes.clear();
        {
            let mut cur: SmallVec<[Option<&State>; 8]> = SmallVec::new();
            for it in &pc.call.items {
                let h = s.hasher.hash_one(it.key.as_str());
                s.hashes.push(h);
                cur.push(s.states.find(h, |(k, _)| *k == it.key).map(|(_, st)| st));
            }
            apply_reusing(&pc.call, &cur, r, &mut s.writes);
        }
        let puts = pc.call.items.iter().zip(&s.hashes).zip(s.writes.drain(..));
        for ((it, &h), w) in puts {
            if let Write::Put(st, _) = w {
                match s.states.find_mut(h, |(k, _)| *k == it.key) {
                    Some((_, slot)) => *slot = st,
                    None => {
                        let hasher = &s.hasher;
                        s.states.insert_unique(h, (it.key.clone(), st), |(k, _)| {
                            hasher.hash_one(k.as_str())
                        });
                    }
                }
            }
        }
    }
    s.plan.decide_into(1, &s.answers, &mut s.decision);
    &s.decision
}
