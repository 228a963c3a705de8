use super::*;
use crate::Remote;
use crate::algo::Rate;
use crate::batch::apply;
use crate::decision::{Code, Via, plan};
use crate::rules::parse_yaml;
use crate::time::MILLI;
use proptest::prelude::*;

/// Opens on more than half of at least 4 calls in 5 s failing, cools off 10 s, 2 probes.
fn cfg() -> BreakerConfig {
    BreakerConfig {
        failure_pct: 50,
        window: 5 * SECOND,
        min_calls: 4,
        cool_off: 10 * SECOND,
        probes: 2,
    }
}

fn send(g: &mut StoreGuard, now: Micros) -> Ticket {
    match g.admit(now) {
        Admit::Send(t) => t,
        Admit::Refused => panic!("refused at {now}"),
    }
}

/// Sends a call at `now` and ends it as `ended`; the transition it caused.
fn call(g: &mut StoreGuard, now: Micros, ended: Ended) -> Option<Transition> {
    let t = send(g, now);
    g.finish(now, t, ended)
}

const OUTAGE: Ended = Ended::Failed { outage: true };

/// A guard opened at `now` by four outages.
fn opened(now: Micros) -> StoreGuard {
    let mut g = StoreGuard::new(cfg());
    for _ in 0..3 {
        assert_eq!(call(&mut g, now, OUTAGE), None, "below min_calls");
    }
    assert_eq!(call(&mut g, now, OUTAGE), Some(Transition::Opened));
    g
}

#[test]
fn outages_open_the_breaker_and_it_refuses_until_the_cool_off() {
    let now = 1_000 * SECOND;
    let mut g = StoreGuard::new(cfg());
    assert_eq!(call(&mut g, now, Ended::Answered), None);
    assert_eq!(call(&mut g, now, OUTAGE), None);
    assert_eq!(call(&mut g, now, OUTAGE), None);
    // 3 of 4 failed: more than half.
    assert_eq!(call(&mut g, now, OUTAGE), Some(Transition::Opened));
    assert_eq!(
        g.breaker(),
        Some((
            BreakerState::Open {
                until: now + 10 * SECOND
            },
            1
        ))
    );
    assert_eq!(g.admit(now + 10 * SECOND - 1), Admit::Refused);
    assert!(matches!(g.admit(now + 10 * SECOND), Admit::Send(_)));
}

#[test]
fn a_missed_deadline_counts_as_an_outage_and_a_refused_argument_does_not() {
    assert!(!Ended::DeadlineMissed.healthy());
    assert!(!OUTAGE.healthy());
    assert!(Ended::Failed { outage: false }.healthy());
    assert!(Ended::Answered.healthy());
    let mut g = StoreGuard::new(cfg());
    for _ in 0..100 {
        assert_eq!(call(&mut g, 0, Ended::Failed { outage: false }), None);
    }
    assert_eq!(g.breaker(), Some((BreakerState::Closed, 0)));
    for _ in 0..3 {
        assert_eq!(call(&mut g, MILLI, Ended::DeadlineMissed), None);
    }
    // 3 misses of 103 calls: under half, closed.
    assert_eq!(g.breaker(), Some((BreakerState::Closed, 0)));
    let mut g = StoreGuard::new(cfg());
    for _ in 0..3 {
        assert_eq!(call(&mut g, 0, Ended::DeadlineMissed), None);
    }
    assert_eq!(
        call(&mut g, 0, Ended::DeadlineMissed),
        Some(Transition::Opened)
    );
}

#[test]
fn half_open_probes_then_closing_drops_the_local_buckets() {
    let mut now = 0;
    let mut g = opened(now);
    now += 10 * SECOND;
    let p1 = send(&mut g, now);
    let p2 = send(&mut g, now);
    assert!(p1.is_probe() && p2.is_probe());
    assert_eq!(g.admit(now), Admit::Refused, "both probes in flight");
    assert_eq!(
        g.finish(now, p1, Ended::Answered),
        None,
        "one success of two"
    );
    assert_eq!(
        g.finish(now, p2, Ended::Answered),
        Some(Transition::Closed),
        "closed: drop the shard's local buckets"
    );
    assert_eq!(g.breaker(), Some((BreakerState::Closed, 1)));
    let t = send(&mut g, now);
    assert!(!t.is_probe());
    assert_eq!(g.finish(now, t, Ended::Answered), None);
}

#[test]
fn a_failed_probe_reopens_and_a_cancelled_one_frees_its_place() {
    let mut now = 0;
    let mut g = opened(now);
    now += 10 * SECOND;
    let p1 = send(&mut g, now);
    let p2 = send(&mut g, now);
    g.abandon(p1);
    let p3 = send(&mut g, now);
    assert_eq!(g.admit(now), Admit::Refused);
    assert_eq!(
        g.finish(now + MILLI, p2, Ended::DeadlineMissed),
        Some(Transition::Opened)
    );
    assert_eq!(
        g.breaker(),
        Some((
            BreakerState::Open {
                until: now + MILLI + 10 * SECOND
            },
            2
        ))
    );
    // The other probe of that episode, answering late, closes nothing.
    assert_eq!(g.finish(now + MILLI, p3, Ended::Answered), None);
    assert_eq!(g.admit(now + SECOND), Admit::Refused);
}

#[test]
fn a_store_without_outages_is_never_refused() {
    let mut g = StoreGuard::for_store(cfg(), false);
    assert_eq!(g.breaker(), None);
    for i in 0..1_000 {
        let t = send(&mut g, i);
        assert!(!t.is_probe());
        assert_eq!(g.finish(i, t, Ended::DeadlineMissed), None);
    }
    assert!(StoreGuard::for_store(cfg(), true).breaker().is_some());
}

const RULES: &str = r#"
domain: api
rules:
  - { id: burst, key: [api_key], algorithm: token_bucket, rate_per_s: 10, burst: 100, on_store_failure: local }
  - { id: minute, key: [api_key], algorithm: fixed_window, limit: 100, window: 1m, on_store_failure: open }
  - { id: hourly, key: [api_key], algorithm: fixed_window, limit: 1000, window: 1h, on_store_failure: open }
  - { id: daily, key: [api_key], algorithm: fixed_window, limit: 10000, window: 1d, on_store_failure: local }
  - { id: monthly, key: [tenant], algorithm: fixed_window, limit: 100000, window: 1mo, calendar_tz: UTC, on_store_failure: open }
  - { id: strict, key: [user], algorithm: fixed_window, limit: 5, window: 1d, on_store_failure: closed }
"#;

use crate::matching::desc;

/// Runs a call on fresh state, as a store (or a local bucket) would.
fn fresh(c: &Call) -> CallResult {
    apply(c, &vec![None::<crate::State>; c.items.len()]).0
}

#[test]
fn a_failed_call_is_answered_by_its_local_rules_at_the_local_share() {
    let set = parse_yaml(RULES).expect("valid");
    let dom = set.domain("api").expect("domain");
    let d = desc(&[("api_key", "k"), ("user", "u")]);
    let p = plan(dom, &d, 1_000 * SECOND, 1, "r", |_| Remote::default());
    assert_eq!(p.calls.len(), 2, "api_key and user");
    let done = fresh(&p.calls[0].call);
    assert_eq!(
        answer(&p, 0, Some(done.clone()), 100, |_| panic!("not failed")),
        Answer::Done(done)
    );
    let mut ran = None;
    let a = answer(&p, 0, None, 100, |c| {
        ran = Some(c.clone());
        Some(fresh(c))
    });
    let ran = ran.expect("the fallback ran");
    // burst and daily (local), a tenth of their numbers; minute and hourly fail open.
    assert_eq!(
        ran.items
            .iter()
            .map(|i| i.params.clone())
            .collect::<Vec<_>>(),
        [
            Params::TokenBucket {
                rate: Rate::per_second(1),
                burst: 10
            },
            match &p.calls[0].call.items[3].params {
                Params::FixedWindow { window, .. } => Params::FixedWindow {
                    limit: 1000,
                    window: window.clone()
                },
                other => panic!("{other:?}"),
            }
        ]
    );
    assert_eq!(
        a,
        Answer::Failed {
            local: Some(fresh(&ran))
        }
    );
    // The user's call has no local rule: nothing runs locally.
    assert_eq!(
        answer(&p, 1, None, 100, |_| panic!("no local rule")),
        Answer::Failed { local: None }
    );
}

#[test]
fn journaled_are_the_admitted_quota_windows_whose_call_failed() {
    let set = parse_yaml(RULES).expect("valid");
    let dom = set.domain("api").expect("domain");
    let d = desc(&[("api_key", "k"), ("tenant", "t")]);
    let p = plan(dom, &d, 1_000 * SECOND, 2, "r", |_| Remote::default());
    assert_eq!(p.calls.len(), 2, "api_key and tenant");
    let keys = |answers: &[Answer], cost| -> Vec<(String, Micros)> {
        let dec = p.decide(1, answers);
        journaled(&p, answers, &dec, cost)
            .map(|(_, k, w, units)| {
                assert_eq!(units, cost, "no cost factors: the caller's cost");
                (k.to_string(), w.nominal())
            })
            .collect()
    };
    let key = |c: usize, i: usize| p.calls[c].call.items[i].key.clone();
    let failed = || Answer::Failed { local: None };
    let done = |c: usize| Answer::Done(fresh(&p.calls[c].call));
    // Both failed (burst and daily without a local answer fail open): the hour, the day and
    // the month, not the minute or the bucket.
    assert_eq!(
        keys(&[failed(), failed()], 2),
        [
            (key(0, 2), 3_600 * SECOND),
            (key(0, 3), 86_400 * SECOND),
            (key(1, 0), 30 * 86_400 * SECOND)
        ]
    );
    // Only the tenant's call failed: only its window.
    assert_eq!(
        keys(&[done(0), failed()], 2),
        [(key(1, 0), 30 * 86_400 * SECOND)]
    );
    assert_eq!(keys(&[done(0), done(1)], 2), []);
    assert_eq!(keys(&[failed(), failed()], 0), [], "a peek takes nothing");
    // A refusal takes nothing: the user's fail-closed rule refuses.
    let d = desc(&[("api_key", "k"), ("user", "u")]);
    let p = plan(dom, &d, 1_000 * SECOND, 1, "r", |_| Remote::default());
    let answers = [failed(), failed()];
    let dec = p.decide(1, &answers);
    assert_eq!(dec.code, Code::Unavailable);
    assert!(dec.policies.iter().any(|x| x.via == Via::FailedClosed));
    assert_eq!(journaled(&p, &answers, &dec, 1).count(), 0);
}

/// One step of a shard's life: a call admitted, or an outstanding one ended or cancelled.
#[derive(Clone, Debug)]
enum Op {
    Admit {
        dt: Micros,
    },
    Finish {
        pick: usize,
        ended: Ended,
        dt: Micros,
    },
    Abandon {
        pick: usize,
    },
}

fn ended() -> impl Strategy<Value = Ended> {
    prop_oneof![
        Just(Ended::Answered),
        Just(Ended::DeadlineMissed),
        any::<bool>().prop_map(|outage| Ended::Failed { outage }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3_000u64).prop_map(|dt| Op::Admit { dt }),
        3 => (any::<usize>(), ended(), 0..3_000u64)
            .prop_map(|(pick, ended, dt)| Op::Finish { pick, ended, dt }),
        1 => any::<usize>().prop_map(|pick| Op::Abandon { pick }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Against the breaker's definition, on a monotonic clock: a closed guard opens exactly
    /// when more than `failure_pct` of at least `min_calls` calls in the last window were
    /// outages; it refuses only while open or with every probe in flight; never more than
    /// `probes` probes of one episode are in flight; it closes (drop the local buckets) only
    /// from half-open, after `probes` successes of that episode's probes.
    #[test]
    fn the_guard_follows_the_breaker_definition(
        failure_pct in 0..100u64,
        window in 10..20_000u64,
        min_calls in 1..8u64,
        cool_off in 1..10_000u64,
        probes in 1..4u64,
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let cfg = BreakerConfig { failure_pct, window, min_calls, cool_off, probes };
        let slot = (window / 10).max(1);
        let mut g = StoreGuard::new(cfg);
        let mut now: Micros = 1;
        // Tickets in flight, each with the half-open episode it probes (0: not a probe).
        let mut flying: Vec<(Ticket, u64)> = Vec::new();
        let mut episode = 0;
        let mut successes = 0;
        // Calls recorded while closed since the breaker last opened: (time, healthy).
        let mut closed_calls: Vec<(Micros, bool)> = Vec::new();
        let mut opened = 0;
        for op in ops {
            let (before, _) = g.breaker().expect("guarded");
            match op {
                Op::Admit { dt } => {
                    now += dt;
                    let probes_out = flying.iter().filter(|(_, e)| *e == episode && *e > 0).count() as u64;
                    match g.admit(now) {
                        Admit::Refused => prop_assert!(
                            matches!(before, BreakerState::Open { until } if now < until)
                                || matches!(before, BreakerState::HalfOpen { .. }) && probes_out == probes,
                            "refused in {before:?} with {probes_out} probes out"
                        ),
                        Admit::Send(t) => {
                            if matches!(before, BreakerState::Open { .. }) {
                                episode += 1;
                                successes = 0;
                            }
                            let e = if t.is_probe() { episode } else { 0 };
                            prop_assert_eq!(t.is_probe(), !matches!(before, BreakerState::Closed));
                            flying.push((t, e));
                            let out = flying.iter().filter(|(_, x)| *x == episode && *x > 0).count() as u64;
                            prop_assert!(out <= probes, "{out} probes in flight");
                        }
                    }
                }
                Op::Finish { pick, ended, dt } => {
                    if flying.is_empty() {
                        continue;
                    }
                    now += dt;
                    let (t, e) = flying.swap_remove(pick % flying.len());
                    let tr = g.finish(now, t, ended);
                    let (after, times) = g.breaker().expect("guarded");
                    match before {
                        BreakerState::Closed => {
                            closed_calls.push((now, ended.healthy()));
                            let idx = now / slot;
                            let oldest = idx.saturating_sub(9);
                            let (calls, failures) = closed_calls
                                .iter()
                                .filter(|(at, _)| at / slot >= oldest)
                                .fold((0u64, 0u64), |(c, f), (_, ok)| (c + 1, f + u64::from(!ok)));
                            let trips = calls >= min_calls && failures * 100 > failure_pct * calls;
                            prop_assert_eq!(tr, trips.then_some(Transition::Opened));
                            if trips {
                                closed_calls.clear();
                            }
                        }
                        BreakerState::Open { .. } => prop_assert_eq!(tr, None),
                        BreakerState::HalfOpen { .. } => {
                            let expect = if !ended.healthy() {
                                Some(Transition::Opened)
                            } else if e == episode && e > 0 {
                                successes += 1;
                                (successes == probes).then_some(Transition::Closed)
                            } else {
                                None
                            };
                            prop_assert_eq!(tr, expect);
                        }
                    }
                    match tr {
                        Some(Transition::Opened) => {
                            opened += 1;
                            prop_assert_eq!(after, BreakerState::Open { until: now + cool_off });
                        }
                        Some(Transition::Closed) => prop_assert_eq!(after, BreakerState::Closed),
                        None => {}
                    }
                    prop_assert_eq!(times, opened);
                }
                Op::Abandon { pick } => {
                    if flying.is_empty() {
                        continue;
                    }
                    let (t, _) = flying.swap_remove(pick % flying.len());
                    g.abandon(t);
                    let (after, _) = g.breaker().expect("guarded");
                    prop_assert!(
                        before == after || matches!((before, after), (BreakerState::HalfOpen { .. }, BreakerState::HalfOpen { .. })),
                        "{before:?} -> {after:?}"
                    );
                }
            }
        }
    }
}
