//! The decision's tests: plans, answers, failure modes, and the headers rendered.

use super::*;
use crate::State;
use crate::algo::Rate;
use crate::batch::{Write, apply};
use crate::rules::parse_yaml;
use crate::time::SECOND;

const RULES: &str = r#"
domain: api
rules:
  - { id: burst, key: [api_key], algorithm: token_bucket, rate_per_s: 1, burst: 20, on_store_failure: local }
  - { id: daily, key: [api_key], algorithm: fixed_window, limit: 1000, window: 1d, on_store_failure: local }
  - { id: otp, key: [user], algorithm: sliding_log, limit: 1, window: 1m, headers: retry_only, on_store_failure: local, title: "One-time codes per user" }
  - { id: shadowed, key: [api_key], algorithm: fixed_window, limit: 2, window: 1m, mode: shadow, on_store_failure: local }
  - { id: strict, key: [tenant], algorithm: fixed_window, limit: 5, window: 1m, on_store_failure: closed }
"#;

use crate::matching::desc;

/// Runs a plan against in-process states, as a store would.
fn run(plan: &Plan<'_>, states: &mut std::collections::HashMap<String, State>) -> Vec<Answer> {
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

/// A policy quotes the numbers the request counted under: the rule's own (worked out
/// when the set was indexed), an override's (worked out per request), a reused plan's
/// entry never keeping the other's.
#[test]
fn a_policy_quotes_the_numbers_it_counted_under() {
    let set = parse_yaml(
        r#"
domain: api
rules:
  - { id: burst, key: [api_key], algorithm: token_bucket, rate_per_s: 20, burst: 40 }
  - { id: daily, key: [api_key], algorithm: fixed_window, limit: 1000, window: 1d }
overrides:
  - { identity: { api_key: big }, rule: burst, rate_per_s: 200, burst: 400 }
  - { identity: { api_key: big }, rule: daily, limit: 50000 }
"#,
    )
    .expect("valid");
    let dom = set.domain("api").expect("domain");
    let mut states = Default::default();
    let mut p = Plan::default();
    let mut figures = |key: &str| {
        plan_into(&mut p, dom, &desc(&[("api_key", key)]), 0, 1, "r", |_| {
            Remote::default()
        });
        let d = p.decide(1, &run(&p, &mut states));
        d.policies
            .iter()
            .map(|s| (s.limit, s.window_s, s.remaining))
            .collect::<Vec<_>>()
    };
    let plain = vec![(20, 1, 39), (1000, 86_400, 999)];
    let big = vec![(200, 1, 399), (50_000, 86_400, 49_999)];
    assert_eq!(figures("small"), plain);
    assert_eq!(figures("big"), big);
    assert_eq!(figures("other"), plain);
}

#[test]
fn twenty_of_twenty_five_then_retry_after_one() {
    let set = parse_yaml(RULES).expect("valid");
    let dom = set.domain("api").expect("domain");
    let mut states = Default::default();
    let d = desc(&[("api_key", "k1")]);
    let mut allowed = 0;
    let mut last = None;
    for _ in 0..25 {
        let p = plan(dom, &d, 1_000 * SECOND, 1, "r", |_| Remote::default());
        assert_eq!(p.calls.len(), 1, "one call per identity");
        let dec = p.decide(7, &run(&p, &mut states));
        if dec.allowed() {
            allowed += 1;
        }
        last = Some(dec);
    }
    assert_eq!(allowed, 20);
    let dec = last.expect("ran");
    assert_eq!(dec.code, Code::OverLimit);
    assert_eq!(dec.decided_by.as_deref(), Some("burst"));
    assert!(dec.retry_after_ms <= 1000 && dec.retry_after_ms > 0);
    assert_eq!(dec.shadow_denied.len(), 1);
    let h = headers(&dec);
    assert!(h.contains(&("Retry-After", "1".to_string())), "{h:?}");
    let policy = &h
        .iter()
        .find(|(k, _)| *k == "RateLimit-Policy")
        .expect("policy")
        .1;
    // The bucket's sustained rate (1/s), not its burst of 20.
    assert_eq!(policy, "\"burst\";q=1;w=1, \"daily\";q=1000;w=86400");
    assert!(h.contains(&("X-RateLimit-Remaining", "0".to_string())));
    // Each set alone: the same values, the other set's headers left out.
    let names = |set| -> Vec<&str> { headers_of(&dec, set).iter().map(|(k, _)| *k).collect() };
    assert_eq!(
        names(HeaderSet::XRatelimit),
        [
            "Retry-After",
            "X-RateLimit-Limit",
            "X-RateLimit-Remaining",
            "X-RateLimit-Reset"
        ]
    );
    assert_eq!(
        names(HeaderSet::Ratelimit),
        ["Retry-After", "RateLimit-Policy", "RateLimit"]
    );
    assert_eq!(headers_of(&dec, HeaderSet::All), h);
    assert!(
        headers_of(&dec, HeaderSet::XRatelimit)
            .contains(&("X-RateLimit-Remaining", "0".to_string()))
    );
    // The daily quota counted only the admitted 20.
    assert_eq!(dec.policies[1].remaining, 980);
    let body = problem_json(&dec);
    assert!(body.contains("\"violated-policies\":[\"burst\"]"), "{body}");
}

/// `RateLimit` of a decision, one `(r, t)` per visible policy.
fn state(d: &Decision) -> String {
    headers(d)
        .into_iter()
        .find(|(k, _)| *k == "RateLimit")
        .map(|(_, v)| v)
        .unwrap_or_default()
}

#[test]
fn a_bucket_advertises_its_rate_and_shows_its_tokens() {
    let set = parse_yaml(
        r#"
domain: b
rules:
  - { id: tb, key: [k], algorithm: token_bucket, rate_per_s: 1, burst: 5 }
  - { id: cell, key: [k], algorithm: gcra, rate_per_s: 1, burst: 5 }
"#,
    )
    .expect("valid");
    let dom = set.domain("b").expect("domain");
    let mut states = Default::default();
    let now = 1_000 * SECOND;
    let mut check = |key: &str, cost: u64| {
        let d = desc(&[("k", key)]);
        let p = plan(dom, &d, now, cost, "r", |_| Remote::default());
        p.decide(1, &run(&p, &mut states))
    };
    let first = check("a", 1);
    let policy = &headers(&first)
        .into_iter()
        .find(|(k, _)| *k == "RateLimit-Policy")
        .expect("policy")
        .1;
    assert_eq!(policy, "\"tb\";q=1;w=1, \"cell\";q=1;w=1");
    // Four tokens left, one second to full.
    assert_eq!(state(&first), "\"tb\";r=4;t=1, \"cell\";r=4;t=1");
    for _ in 0..3 {
        check("a", 1);
    }
    // The last token taken: t is the next token (1 s), not the time to full (5 s).
    let last = check("a", 1);
    assert!(last.allowed());
    assert_eq!(state(&last), "\"tb\";r=0;t=1, \"cell\";r=0;t=1");
    // Refused: t is the wait Retry-After gives.
    let refused = check("a", 1);
    assert!(!refused.allowed());
    assert!(headers(&refused).contains(&("Retry-After", "1".to_string())));
    assert_eq!(state(&refused), "\"tb\";r=0;t=1, \"cell\";r=0;t=1");
    // A fresh key asking for 7 of 5: never fits, the wait is the time to full (5 s).
    let big = check("b", 7);
    assert!(headers(&big).contains(&("Retry-After", "5".to_string())));
    assert_eq!(state(&big), "\"tb\";r=5;t=5, \"cell\";r=5;t=5");
}

#[test]
fn a_concurrency_rule_counts_concurrent_requests() {
    let set = parse_yaml(
        r#"
domain: c
rules:
  - { id: inflight, key: [k], algorithm: concurrency, limit: 2, timeout: 30s }
"#,
    )
    .expect("valid");
    let dom = set.domain("c").expect("domain");
    let mut states = Default::default();
    let d = desc(&[("k", "a")]);
    let mut check = |id: &str| {
        let p = plan(dom, &d, 1_000 * SECOND, 1, id, |_| Remote::default());
        p.decide(1, &run(&p, &mut states))
    };
    let first = check("r1");
    let h = headers(&first);
    let get =
        |h: &[(&str, String)], k: &str| h.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    assert_eq!(
        get(&h, "RateLimit-Policy").as_deref(),
        Some("\"inflight\";q=2;qu=\"concurrent-requests\"")
    );
    assert_eq!(get(&h, "RateLimit").as_deref(), Some("\"inflight\";r=1"));
    assert_eq!(first.policies[0].unit, QuotaUnit::ConcurrentRequests);
    check("r2");
    let refused = check("r3");
    assert!(!refused.allowed());
    let h = headers(&refused);
    // The slots were taken at the same instant: the wait is their timeout.
    assert_eq!(get(&h, "Retry-After").as_deref(), Some("30"));
    assert_eq!(
        get(&h, "RateLimit").as_deref(),
        Some("\"inflight\";r=0;t=30")
    );
}

#[test]
fn a_decision_holds_a_slot_only_when_a_concurrency_rule_took_one() {
    let set = parse_yaml(
        r#"
domain: c
rules:
  - { id: inflight, key: [k], algorithm: concurrency, limit: 1, timeout: 30s }
  - { id: quota, key: [k], algorithm: fixed_window, limit: 3, window: 1m }
---
domain: s
rules:
  - { id: watched, key: [k], algorithm: concurrency, limit: 1, timeout: 30s, mode: shadow }
---
domain: w
rules:
  - { id: quota, key: [k], algorithm: fixed_window, limit: 5, window: 1m }
"#,
    )
    .expect("valid");
    let mut states = Default::default();
    let mut check = |domain: &str, key: &str, cost: u64, id: &str| {
        let dom = set.domain(domain).expect("domain");
        let d = desc(&[("k", key)]);
        let p = plan(dom, &d, 1_000 * SECOND, cost, id, |_| Remote::default());
        p.decide(1, &run(&p, &mut states))
    };
    // No concurrency rule: nothing to release.
    assert!(!check("w", "a", 1, "r0").holds_slot);
    // An enforced rule's admitted request holds its slot; a refusal holds none.
    let first = check("c", "a", 1, "r1");
    assert!(first.allowed() && first.holds_slot);
    let refused = check("c", "a", 1, "r2");
    assert!(!refused.allowed() && !refused.holds_slot);
    // A peek takes nothing.
    assert!(!check("c", "b", 0, "r3").holds_slot);
    // A slot free but the identity's quota spent: the refusal takes no slot either.
    // (A repeated id renews its own slot, so only the quota fills.)
    for _ in 0..3 {
        let d = check("c", "b", 1, "r4");
        assert!(d.allowed() && d.holds_slot);
    }
    let over = check("c", "b", 1, "r4");
    assert_eq!(over.decided_by.as_deref(), Some("quota"));
    assert!(!over.holds_slot);
    // A shadow rule counts as if enforced: it takes a slot the answer's policies do not
    // name, and takes none once it would have refused.
    let shadow = check("s", "a", 1, "r8");
    assert!(shadow.policies.is_empty() && shadow.holds_slot);
    let shadow_full = check("s", "a", 1, "r9");
    assert!(shadow_full.allowed() && !shadow_full.holds_slot);
    assert_eq!(shadow_full.shadow_denied.len(), 1);
}

#[test]
fn a_bucket_quota_is_its_rate_per_window() {
    let tb = Params::TokenBucket {
        rate: Rate::per_second(10),
        burst: 40,
    };
    assert_eq!(advertised(&tb), (10, 1));
    let gcra = Params::Gcra {
        rate: Rate::per_second(3),
        burst: 1,
    };
    assert_eq!(advertised(&gcra), (3, 1));
}

#[test]
fn retry_only_rules_reveal_only_retry_after() {
    let set = parse_yaml(RULES).expect("valid");
    let dom = set.domain("api").expect("domain");
    let mut states = Default::default();
    let d = desc(&[("user", "u")]);
    let p = plan(dom, &d, 0, 1, "r", |_| Remote::default());
    assert!(p.decide(1, &run(&p, &mut states)).allowed());
    let p = plan(dom, &d, 0, 1, "r", |_| Remote::default());
    let dec = p.decide(1, &run(&p, &mut states));
    assert!(!dec.allowed());
    let h = headers(&dec);
    assert_eq!(h, vec![("Retry-After", "60".to_string())]);
    let body: serde_json::Value = serde_json::from_str(&problem_json(&dec)).expect("json");
    assert_eq!(body["violated-policies"], serde_json::json!([]));
    // The rule's title explains the refusal; the figures stay out.
    assert_eq!(body["detail"], "One-time codes per user: retry in 60 s");
    assert_eq!(body["title"], "Too Many Requests");
}

#[test]
fn failure_modes() {
    let set = parse_yaml(RULES).expect("valid");
    let dom = set.domain("api").expect("domain");
    let d = desc(&[("api_key", "k"), ("tenant", "t")]);
    let p = plan(dom, &d, 0, 1, "r", |_| Remote::default());
    assert_eq!(p.calls.len(), 2);
    // The api_key call: local rules answered by a fallback.
    let fb = p.fallback(0, 500).expect("local rules");
    assert_eq!(
        fb.items[0].params,
        Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 10
        }
    );
    let (local, _) = apply(&fb, &vec![None::<crate::State>; fb.items.len()]);
    let dec = p.decide(
        1,
        &[
            Answer::Failed { local: Some(local) },
            Answer::Failed { local: None },
        ],
    );
    assert_eq!(dec.code, Code::Unavailable);
    assert_eq!(dec.decided_by.as_deref(), Some("strict"));
    assert_eq!(headers(&dec)[0], ("Retry-After", "1".to_string()));
    assert!(dec.policies.iter().any(|p| p.via == Via::Local));
}
