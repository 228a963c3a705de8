//! Key splitting through validation, planning, a store run with the core's own
//! `batch::apply`, and the decision: the sub-counts never admit more than the rule, each has
//! its own hash tag and call, and what splitting costs near the limit (false rejections).

use super::split::{MAX_SPLIT, pick};
use super::tests::{Mem, desc};
use crate::algo::Params;
use crate::batch::Call;
use crate::decision::{Answer, Plan, headers, plan};
use crate::keys::{parse, split_identity};
use crate::rules::{RuleSet, parse_yaml};
use crate::time::{Micros, SECOND};
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};

impl Mem {
    fn run(&mut self, p: &Plan<'_>) -> Vec<Answer> {
        p.calls
            .iter()
            .map(|pc| Answer::Done(self.check(&pc.call)))
            .collect()
    }
}

fn rules(body: &str) -> RuleSet {
    parse_yaml(&format!("domain: api\nrules:\n{body}")).expect("valid")
}

fn refused(body: &str) -> String {
    match parse_yaml(&format!("domain: api\nrules:\n{body}")) {
        Ok(_) => panic!("accepted: {body}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn validation_refuses_what_cannot_be_split() {
    for (rule, want) in [
        (
            "{ id: a, key: [k], algorithm: fixed_window, limit: 10, window: 1s, hot_keys: { split: 0 } }",
            "from 1 to 64",
        ),
        (
            "{ id: a, key: [k], algorithm: fixed_window, limit: 100, window: 1s, hot_keys: { split: 65 } }",
            "from 1 to 64",
        ),
        (
            "{ id: a, key: [k], algorithm: fixed_window, limit: 10, window: 1s, hot_keys: { split: two } }",
            "from 1 to 64",
        ),
        (
            "{ id: a, key: [k], algorithm: fixed_window, limit: 3, window: 1s, hot_keys: { split: 4 } }",
            "limit of at least 4, got 3",
        ),
        (
            "{ id: a, key: [k], algorithm: token_bucket, rate_per_s: 2, burst: 100, hot_keys: { split: 3 } }",
            "rate of at least 3, got 2",
        ),
        (
            "{ id: a, key: [k], algorithm: gcra, rate_per_s: 100, burst: 1, hot_keys: { split: 2 } }",
            "burst of at least 2, got 1",
        ),
        (
            // 3/1m counts 2·10^7 units a token, fine for a burst of 4·10^8; its second half,
            // 1/1m, counts 6·10^7, past 2^53 for half the burst.
            "{ id: a, key: [k], algorithm: token_bucket, rate: 3/1m, burst: 400000000, hot_keys: { split: 2 } }",
            "a sub-count of 3/1m: burst 200000000 at 1/1m",
        ),
        (
            "{ id: a, key: [k], algorithm: sliding_log, limit: 100, window: 1m, hot_keys: { split: 2 } }",
            "not defined for sliding_log: a sliding log is the exact algorithm",
        ),
        (
            "{ id: a, key: [k], algorithm: concurrency, limit: 100, hot_keys: { split: 2 } }",
            "not defined for concurrency: a slot is released by request id",
        ),
        (
            "{ id: a, key: [k], algorithm: fixed_window, limit: 100, window: 1m, hot_keys: { split: 8, lease: 13 } }",
            "smallest sub-count's capacity of 100 split 8 ways (12)",
        ),
    ] {
        let err = refused(&format!("  - {rule}\n"));
        assert!(err.contains("hot_keys."), "{err}");
        assert!(err.contains(want), "{rule}: {err}");
    }
    // An override may not leave a sub-count with nothing either.
    let err = refused(
        "  - { id: a, key: [k], algorithm: fixed_window, limit: 100, window: 1m, hot_keys: { split: 4 } }\noverrides:\n  - { identity: { k: small }, rule: a, limit: 3 }\n",
    );
    assert!(
        err.contains("rule a is split (hot_keys.split): 4 sub-counts need limit of at least 4"),
        "{err}"
    );
    // At the bounds: 1 is no split, 64 of a limit of 64 is one each.
    let set = rules(
        "  - { id: a, key: [k], algorithm: fixed_window, limit: 64, window: 1s, hot_keys: { split: 64, lease: 1 } }\n  - { id: b, key: [k], algorithm: sliding_log, limit: 5, window: 1s, hot_keys: { split: 1 } }\n",
    );
    let dom = set.domain("api").expect("domain");
    assert_eq!(dom.rules[0].hot_keys.split, MAX_SPLIT);
    assert_eq!(dom.rules[1].hot_keys.split, 1);
}

const SPLIT: &str = "  - { id: hot, key: [k], algorithm: fixed_window, limit: 100, window: 1m, hot_keys: { split: 4 } }
  - { id: hot2, key: [k], algorithm: token_bucket, rate_per_s: 40, burst: 40, hot_keys: { split: 4 } }
  - { id: other, key: [k], algorithm: fixed_window, limit: 1000, window: 1m }
  - { id: three, key: [k], algorithm: sliding_window, limit: 30, window: 1m, hot_keys: { split: 3 } }
";

#[test]
fn a_split_rule_is_a_call_of_its_own_on_a_hash_tag_of_its_own() {
    let set = rules(SPLIT);
    let dom = set.domain("api").expect("domain");
    let d = desc(&[("k", "v")]);
    let mut tags = BTreeSet::new();
    for i in 0..200 {
        let rid = format!("d-{i}");
        let p = plan(dom, &d, 60 * SECOND, 1, &rid, |_| Default::default());
        // The unsplit rule, the two 4-way rules (same part: one call), the 3-way rule (in
        // the 4-way rules' call when it picked the same part: the same hash tag).
        let same = pick(&rid, 4) == pick(&rid, 3);
        assert_eq!(p.calls.len(), if same { 2 } else { 3 }, "{rid}");
        let by_rule = |id: &str| {
            p.calls
                .iter()
                .position(|c| c.rules.iter().any(|&r| &*p.applied[r].rule.id == id))
                .expect("planned")
        };
        assert_eq!(by_rule("hot"), by_rule("hot2"));
        assert_ne!(by_rule("hot"), by_rule("other"));
        assert_eq!(by_rule("three") == by_rule("hot"), same);
        for a in &p.applied {
            let parts = parse(&a.key).expect("a store key");
            let (base, part) = split_identity(parts.identity);
            assert_eq!(base, "api|k=v");
            match &*a.rule.id {
                "other" => assert_eq!((part, a.split.clone()), (None, None)),
                id => {
                    let of = a.rule.hot_keys.split;
                    assert_eq!(part, Some(pick(&rid, of)), "{id}");
                    assert_eq!(
                        a.split.as_ref().map(|s| (s.part, s.of)),
                        Some((pick(&rid, of), of))
                    );
                    tags.insert(parts.identity.to_string());
                }
            }
        }
    }
    // Every sub-count was picked: 4 tags, the 3-way rule's parts among them.
    assert_eq!(tags.len(), 4, "{tags:?}");
}

#[test]
fn the_sub_counts_admit_the_rule_and_headers_quote_the_whole_rule() {
    let set = rules(SPLIT);
    let dom = set.domain("api").expect("domain");
    let d = desc(&[("k", "v")]);
    let mut store = Mem::default();
    let t = 60 * SECOND;
    let (mut admitted, mut first) = (0, None);
    for i in 0..400 {
        let p = plan(dom, &d, t, 1, &format!("d-{i}"), |_| Default::default());
        let dec = p.decide(1, &store.run(&p));
        if dec.allowed() {
            admitted += 1;
        }
        first.get_or_insert(dec);
    }
    // The 3-way sliding window of 30 caps it: 10 per sub-count, 30 in all. (Fewer, if a
    // sub-count of `hot` filled first: its call takes even when `three`'s call refuses.)
    assert!((1..=30).contains(&admitted), "{admitted}");
    let dec = first.expect("ran");
    let hot = dec.policies.iter().find(|p| &*p.id == "hot").expect("hot");
    assert_eq!((hot.limit, hot.window_s), (100, 60));
    // One taken from a sub-count of 25: 24 of 25 left there, quoted as 96 of 100.
    assert_eq!(hot.remaining, 96);
    let policy = headers(&dec)
        .into_iter()
        .find(|(k, _)| *k == "RateLimit-Policy")
        .expect("policy")
        .1;
    assert!(policy.contains("\"hot\";q=100;w=60"), "{policy}");
    assert!(policy.contains("\"hot2\";q=40;w=1"), "{policy}");
    assert!(policy.contains("\"three\";q=30;w=60"), "{policy}");
}

/// What a split rule admits of `offered` requests of cost 1 in one instant (one window, no
/// refill), with request ids `r-0..`: (admitted, false rejections: refused while the
/// sub-counts together still had room, so the rule unsplit would have admitted).
fn one_window(limit: u64, of: u32, offered: u64) -> (u64, u64) {
    let set = rules(&format!(
        "  - {{ id: s, key: [k], algorithm: fixed_window, limit: {limit}, window: 1h, hot_keys: {{ split: {of} }} }}\n"
    ));
    let dom = set.domain("api").expect("domain");
    let d = desc(&[("k", "v")]);
    let mut store = Mem::default();
    let (mut admitted, mut false_rej) = (0, 0);
    for i in 0..offered {
        let p = plan(dom, &d, 3_600 * SECOND, 1, &format!("r-{i}"), |_| {
            Default::default()
        });
        if p.decide(1, &store.run(&p)).allowed() {
            admitted += 1;
        } else if admitted < limit {
            false_rej += 1;
        }
    }
    assert!(admitted <= limit, "{limit}/{of}: admitted {admitted}");
    (admitted, false_rej)
}

/// A token bucket of `rate` a second and a burst of one second's worth, split `of` ways,
/// offered `pct` percent of its rate in evenly spaced requests for 60 s after its burst was
/// spent: (admitted, false rejections, what the rule unsplit admitted of the same requests).
/// A refusal is false when the sub-buckets together held a token.
fn steady_bucket(rate: u64, of: u32, pct: u64) -> (u64, u64, u64) {
    let yaml = |split: u32| {
        rules(&format!(
            "  - {{ id: s, key: [k], algorithm: token_bucket, rate_per_s: {rate}, burst: {rate}, hot_keys: {{ split: {split} }} }}\n"
        ))
    };
    let (split_set, whole_set) = (yaml(of), yaml(1));
    let (sd, wd) = (
        split_set.domain("api").expect("domain"),
        whole_set.domain("api").expect("domain"),
    );
    let d = desc(&[("k", "v")]);
    let (mut ss, mut ws) = (Mem::default(), Mem::default());
    let t0: Micros = 1_000 * SECOND;
    // Spend the bursts first: the run measures the steady state at the rate.
    for i in 0..rate * 3 {
        let id = format!("w-{i}");
        let p = plan(sd, &d, t0, 1, &id, |_| Default::default());
        ss.run(&p);
        let p = plan(wd, &d, t0, 1, &id, |_| Default::default());
        ws.run(&p);
    }
    let n = rate * pct * 60 / 100;
    let gap = 60 * SECOND / n;
    let (mut admitted, mut false_rej, mut whole) = (0, 0, 0);
    for i in 0..n {
        let now = t0 + (i + 1) * gap;
        let id = format!("r-{i}");
        let p = plan(sd, &d, now, 1, &id, |_| Default::default());
        if p.decide(1, &ss.run(&p)).allowed() {
            admitted += 1;
        } else {
            // Peek every sub-count: tokens left anywhere make this refusal a false one.
            let room: u64 = (0..of)
                .map(|part| {
                    let key = crate::keys::store_key(
                        &crate::keys::sub_identity("api|k=v", part),
                        "s",
                        crate::algo::Kind::TokenBucket,
                    );
                    let params = super::split::sub_params(&sd.rules[0].params, part, of);
                    let peek = Call {
                        now,
                        cost: 0,
                        request_id: String::new(),
                        items: vec![crate::batch::Item {
                            key,
                            params,
                            enforce: true,
                            charge_rejected: false,
                            remote: Default::default(),
                        }],
                    };
                    ss.check(&peek).outcomes[0].remaining
                })
                .sum();
            if room >= 1 {
                false_rej += 1;
            }
        }
        let p = plan(wd, &d, now, 1, &id, |_| Default::default());
        if p.decide(1, &ws.run(&p)).allowed() {
            whole += 1;
        }
    }
    (admitted, false_rej, whole)
}

/// The figures docs/hot-keys.md quotes ("Key splitting"); run with `--nocapture` to print
/// them. Deterministic: the request ids, hence the picks, are fixed.
#[test]
fn split_false_rejections() {
    eprintln!("one window, cost 1, offered at once: admitted / false rejections (% of limit)");
    for limit in [100u64, 1_000, 10_000] {
        for of in [2u32, 4, 8, 16] {
            let mut row = format!("limit {limit:>6} split {of:>2}:");
            for pct in [90u64, 100, 110, 150, 200] {
                let (a, f) = one_window(limit, of, limit * pct / 100);
                let pc = |x: u64| 100.0 * x as f64 / limit as f64;
                row += &format!("  {pct}%: {:.1}/{:.1}", pc(a), pc(f));
                // Twice the limit fills every sub-count: the whole limit is admitted (the
                // cluster test's 95% holds with room).
                if pct == 200 && limit >= 1_000 {
                    assert_eq!(a, limit, "{limit}/{of}");
                }
                if pct == 200 {
                    assert!(pc(a) >= 95.0, "{limit}/{of}: {a}");
                }
            }
            eprintln!("{row}");
        }
    }
    eprintln!(
        "token bucket, burst = 1 s of rate, 60 s steady: admitted vs unsplit / false rejections (% of requests)"
    );
    for rate in [100u64, 1_000] {
        for of in [4u32, 16] {
            let mut row = format!("rate {rate:>5} split {of:>2}:");
            for pct in [90u64, 100, 120] {
                let (a, f, w) = steady_bucket(rate, of, pct);
                let n = (rate * pct * 60 / 100) as f64;
                row += &format!("  {pct}%: {a} vs {w} / {:.2}%", 100.0 * f as f64 / n);
                assert!(a <= w + u64::from(of), "{rate}/{of}/{pct}: {a} > {w}");
            }
            eprintln!("{row}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the request ids, costs and times, a split rule admits no more in a window
    /// than the rule's limit, and no sub-count more than its share.
    #[test]
    fn a_split_never_admits_more_than_the_rule(
        of in 2u32..=16,
        limit in 16u64..200,
        steps in prop::collection::vec((0u64..200_000, 1u64..5, any::<u32>()), 1..400),
    ) {
        let set = rules(&format!(
            "  - {{ id: s, key: [k], algorithm: fixed_window, limit: {limit}, window: 1s, hot_keys: {{ split: {of} }} }}\n"
        ));
        let dom = set.domain("api").expect("domain");
        let d = desc(&[("k", "v")]);
        let mut store = Mem::default();
        let mut now: Micros = 10 * SECOND;
        let mut per_window: HashMap<(Micros, u32), u64> = HashMap::new();
        for (dt, cost, id) in steps {
            now += dt;
            let rid = format!("{id}");
            let p = plan(dom, &d, now, cost, &rid, |_| Default::default());
            if p.decide(1, &store.run(&p)).allowed() {
                *per_window.entry((now / SECOND, pick(&rid, of))).or_default() += cost;
            }
        }
        let mut totals: HashMap<Micros, u64> = HashMap::new();
        for ((w, part), n) in &per_window {
            prop_assert!(*n <= super::split::share(limit, *part, of));
            *totals.entry(*w).or_default() += n;
        }
        prop_assert!(totals.values().all(|&n| n <= limit));
        if let Params::FixedWindow { limit: l, .. } = &dom.rules[0].params {
            prop_assert_eq!(*l, limit);
        }
    }
}
