//! `algorithm: leaky_queue` through the rule format, the plan and the decision: the answer's
//! delay is the longest of the shaping rules that admitted it, a refusal by any rule charges
//! no queue of its identity (one atomic call) and carries no delay, and the rule is refused where exact spacing cannot hold.

use sluice_core::algo::State;
use sluice_core::batch::{Write, apply};
use sluice_core::decision::{Answer, Decision, Plan, headers, plan};
use sluice_core::matching::Descriptors;
use sluice_core::rules::{RuleSet, parse_yaml};
use sluice_core::time::{MILLI, SECOND};
use std::collections::HashMap;

const RULES: &str = r#"
domain: sms
rules:
  - { id: aggregator, key: [], algorithm: leaky_queue, rate_per_s: 100, max_delay: 2s }
  - { id: per-user, key: [user], algorithm: leaky_queue, rate: 1/1s, max_delay: 3s }
  - { id: fast, key: [user], algorithm: leaky_queue, rate_per_s: 10, max_delay: 1s }
  - { id: daily, key: [user], algorithm: fixed_window, limit: 5, window: 1d }
"#;

/// Runs a plan's calls against `states`, as a store would.
fn run(plan: &Plan<'_>, states: &mut HashMap<String, State>) -> Vec<Answer> {
    plan.calls
        .iter()
        .map(|pc| {
            let cur: Vec<Option<State>> = pc
                .call
                .items
                .iter()
                .map(|i| states.get(&i.key).cloned())
                .collect();
            let (r, w) = apply(&pc.call, &cur);
            for (i, w) in pc.call.items.iter().zip(w) {
                if let Write::Put(s, _) = w {
                    states.insert(i.key.clone(), s);
                }
            }
            Answer::Done(r)
        })
        .collect()
}

fn check(set: &RuleSet, user: &str, now: u64, states: &mut HashMap<String, State>) -> Decision {
    let dom = set.domain("sms").expect("domain");
    let d = Descriptors::new(vec![("user".into(), user.into())]).expect("descriptors");
    let p = plan(dom, &d, now, 1, "r", |_| Default::default());
    let answers = run(&p, states);
    p.decide(1, &answers)
}

#[test]
fn the_delay_is_the_longest_of_the_admitting_queues() {
    let set = parse_yaml(RULES).expect("valid");
    let mut states = HashMap::new();
    let t0 = 1_800_000_000 * SECOND;
    // One user: the per-user queue spaces them 1 s apart, the shared one 10 ms.
    let delays: Vec<u64> = (0..4)
        .map(|_| {
            let d = check(&set, "u1", t0, &mut states);
            assert!(d.allowed(), "{d:?}");
            d.delay_ms
        })
        .collect();
    assert_eq!(delays, vec![0, 1000, 2000, 3000]);
    // A second user waits behind the shared queue only: four departures are held, 10 ms each.
    let d = check(&set, "u2", t0, &mut states);
    assert_eq!(d.delay_ms, 40);
    // The rate, the queue's room and the time until it is empty.
    let h = headers(&d);
    let policy = h
        .iter()
        .find(|(k, _)| *k == "RateLimit-Policy")
        .expect("policy");
    assert!(policy.1.contains("\"aggregator\";q=100;w=1"), "{h:?}");
}

#[test]
fn a_refusal_charges_no_queue_and_has_no_delay() {
    let set = parse_yaml(RULES).expect("valid");
    let mut states = HashMap::new();
    let t0 = 1_800_000_000 * SECOND;
    for _ in 0..4 {
        assert!(check(&set, "u1", t0, &mut states).allowed());
    }
    // The same identity's other queue and its window, checked in the same call.
    let same_call = |states: &HashMap<String, State>| {
        let mut v: Vec<(String, State)> = states
            .iter()
            .filter(|(k, _)| k.ends_with(":fast") || k.ends_with(":daily"))
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let before = same_call(&states);
    assert_eq!(before.len(), 2);
    // The fifth would wait 4 s > 3 s on the per-user queue: refused, after 1 s.
    let d = check(&set, "u1", t0, &mut states);
    assert!(!d.allowed());
    assert_eq!(d.delay_ms, 0);
    assert_eq!(d.retry_after_ms, 1000);
    assert_eq!(d.decided_by.as_deref(), Some("per-user"));
    assert_eq!(
        same_call(&states),
        before,
        "a queue of the refused call was charged"
    );
    // Once the per-user queue has drained to within its max_delay, it is admitted again.
    let d = check(&set, "u1", t0 + SECOND, &mut states);
    assert!(d.allowed());
    assert_eq!(d.delay_ms, 3000);
}

#[test]
fn a_queue_rounds_its_delay_up_to_a_millisecond() {
    // 3 a second: 333,334 µs apart; a caller must never leave early.
    let rules = "domain: sms\nrules:\n  - { id: q, key: [], algorithm: leaky_queue, rate_per_s: 3, max_delay: 1s }\n";
    let set = parse_yaml(rules).expect("valid");
    let mut states = HashMap::new();
    let t0 = 1_800_000_000 * SECOND;
    let delays: Vec<u64> = (0..3)
        .map(|_| check(&set, "u", t0, &mut states).delay_ms)
        .collect();
    assert_eq!(delays, vec![0, 334, 667]);
    assert!(!check(&set, "u", t0, &mut states).allowed());
    assert!(check(&set, "u", t0 + 2 * MILLI, &mut states).allowed());
}

fn problem(rule: &str) -> (String, String) {
    let text = format!(
        "domain: d\nrules:\n  - {{ id: shaped, key: [k], algorithm: leaky_queue, {rule} }}\n"
    );
    let err = parse_yaml(&text).expect_err(rule);
    assert_eq!(err.problems.len(), 1, "{rule}: {err}");
    let p = &err.problems[0];
    assert_eq!(p.at, "shaped", "{err}");
    (p.field.clone(), p.message.clone())
}

#[test]
fn exact_spacing_is_refused_where_it_cannot_hold() {
    let ok = "rate_per_s: 50, max_delay: 2s";
    assert!(parse_yaml(&format!(
        "domain: d\nrules:\n  - {{ id: shaped, key: [k], algorithm: leaky_queue, {ok}, hot_keys: {{ deny_cache: true }} }}\n"
    ))
    .is_ok());
    for (extra, field, says) in [
        (
            "scope: global",
            "scope",
            "global is not possible for leaky_queue",
        ),
        (
            "charge_rejected: true",
            "charge_rejected",
            "not defined for leaky_queue",
        ),
        (
            "hot_keys: { lease: 5 }",
            "hot_keys.lease",
            "not defined for leaky_queue",
        ),
        (
            "hot_keys: { lease: auto }",
            "hot_keys.lease",
            "not defined for leaky_queue",
        ),
        (
            "hot_keys: { split: 2 }",
            "hot_keys.split",
            "not defined for leaky_queue",
        ),
        (
            "hot_keys: { sample: 2 }",
            "hot_keys.sample",
            "not defined for leaky_queue",
        ),
        (
            "hot_keys: { sync_interval: 1s }",
            "hot_keys.sync_interval",
            "not defined for leaky_queue",
        ),
        (
            "hot_keys: { local_share: true }",
            "hot_keys.local_share",
            "not defined for leaky_queue",
        ),
        ("burst: 5", "burst", "does not apply to leaky_queue"),
    ] {
        let (f, m) = problem(&format!("{ok}, {extra}"));
        assert_eq!(f, field, "{extra}: {m}");
        assert!(m.starts_with(says), "{extra}: {m}");
    }
    let (f, m) = problem("rate_per_s: 50");
    assert_eq!(
        (f.as_str(), m.as_str()),
        ("max_delay", "is required for leaky_queue")
    );
    let (f, m) = problem("rate_per_s: 50, max_delay: 2h");
    assert_eq!(f, "max_delay");
    assert!(m.starts_with("must be at most 1h"), "{m}");
    let (f, m) = problem("rate_per_s: 50, max_delay: 0ms");
    assert_eq!(f, "max_delay");
    assert!(m.contains("greater than zero"), "{m}");
    let (f, _) = problem("max_delay: 2s");
    assert_eq!(f, "rate");
}
