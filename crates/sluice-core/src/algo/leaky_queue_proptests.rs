//! The shaping queue held to its definition over random request sequences: admitted
//! departures (decision time + delay) never come faster than the rate, no admitted delay
//! exceeds `max_delay`, a refusal moves nothing, and its retry time is exact.

use super::super::{Params, Rate, Remote, Request, State, evaluate, take};
use crate::batch::{Call, Item, Write, apply};
use crate::time::{MILLI, Micros, SECOND};
use proptest::prelude::*;

fn rate() -> impl Strategy<Value = Rate> {
    let period = prop_oneof![
        Just(SECOND),
        Just(60 * SECOND),
        (1u64..=10_000).prop_map(|ms| ms * MILLI),
    ];
    prop_oneof![
        2 => (1u64..1_000).prop_map(Rate::per_second),
        1 => (1u64..100, period).prop_map(|(n, per)| Rate::new(n, per).expect("a valid rate")),
    ]
}

fn queue() -> impl Strategy<Value = (Rate, Micros)> {
    (rate(), 1u64..5_000).prop_map(|(rate, ms)| (rate, ms * MILLI))
}

/// (gap before the request in µs, negative now and then: a clock behind; cost 0 to 3)
fn steps() -> impl Strategy<Value = Vec<(i64, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![
                4 => Just(0i64),
                4 => 0i64..20_000,
                2 => 0i64..5_000_000,
                1 => -20_000i64..0,
            ],
            0u64..4,
        ),
        1..300,
    )
}

fn req(now: Micros, cost: u64) -> Request<'static> {
    Request {
        now,
        cost,
        request_id: "",
        remote: Remote::default(),
    }
}

proptest! {
    #[test]
    fn departures_keep_the_rate_and_delays_stay_bounded(
        (rate, max_delay) in queue(),
        steps in steps(),
    ) {
        let p = Params::LeakyQueue { rate, max_delay };
        let t = rate.interval();
        let mut st: Option<State> = None;
        let mut now: Micros = 1_700_000_000 * SECOND;
        // (departure, cost) of every admitted request that takes something.
        let mut departures: Vec<(Micros, u64)> = Vec::new();
        for (gap, cost) in steps {
            now = now.saturating_add_signed(gap);
            let o = evaluate(&p, st.as_ref(), &req(now, cost));
            if !o.allowed {
                prop_assert!(o.retry_after > 0);
                prop_assert_eq!(o.delay(), 0);
                // Exact retry: one µs sooner still waits too long, then it fits.
                let soon = evaluate(&p, st.as_ref(), &req(now + o.retry_after - 1, cost));
                prop_assert!(!soon.allowed);
                let then = evaluate(&p, st.as_ref(), &req(now + o.retry_after, cost));
                prop_assert!(then.allowed);
                prop_assert_eq!(then.delay(), max_delay);
                // The store contract writes nothing for it: the state stays as it is.
                let call = Call {
                    now,
                    cost,
                    request_id: String::new(),
                    items: vec![Item {
                        key: "k".into(),
                        params: p.clone(),
                        enforce: true,
                        charge_rejected: false,
                        remote: Remote::default(),
                    }],
                };
                let (r, writes) = apply(&call, std::slice::from_ref(&st));
                prop_assert!(!r.allowed);
                prop_assert_eq!(writes, vec![Write::Keep]);
                continue;
            }
            prop_assert!(o.delay() <= max_delay, "delay {} > {}", o.delay(), max_delay);
            prop_assert!(o.remaining <= o.limit);
            if cost == 0 {
                let (peeked, _) = take(&p, st.as_ref(), &req(now, 0));
                let before = st.clone().map_or(now, |s| match s {
                    State::LeakyQueue { tat } => tat.max(now),
                    _ => now,
                });
                prop_assert_eq!(peeked, State::LeakyQueue { tat: before });
                continue;
            }
            let (next, ttl) = take(&p, st.as_ref(), &req(now, cost));
            let State::LeakyQueue { tat } = next else {
                return Err(TestCaseError::fail("not a queue state"));
            };
            prop_assert_eq!(tat, now + o.delay() + cost * t);
            prop_assert_eq!(ttl, tat - now);
            departures.push((now + o.delay(), cost));
            st = Some(next);
        }
        departures.sort_unstable();
        for w in departures.windows(2) {
            let ((a, c), (b, _)) = (w[0], w[1]);
            prop_assert!(b - a >= c * t, "{a} then {b}: less than {c} × {t} µs apart");
        }
        // In any span of one period, the units before the span's last departure took less
        // than the period: at most the rate's count of units leave in it.
        for (i, &(start, _)) in departures.iter().enumerate() {
            let within: Vec<u64> = departures[i..]
                .iter()
                .take_while(|(d, _)| *d < start + rate.per())
                .map(|&(_, c)| c)
                .collect();
            let before_last: u64 = within[..within.len() - 1].iter().sum();
            prop_assert!(before_last * t < rate.per(), "{within:?} from {start}");
            prop_assert!(before_last < rate.tokens());
        }
    }

    #[test]
    fn an_evaluation_never_changes_what_a_later_one_sees(
        (rate, max_delay) in queue(),
        tat_ahead in 0u64..10 * SECOND,
        cost in 0u64..4,
    ) {
        let p = Params::LeakyQueue { rate, max_delay };
        let now = 1_700_000_000 * SECOND;
        let st = Some(State::LeakyQueue { tat: now + tat_ahead });
        let o = evaluate(&p, st.as_ref(), &req(now, cost));
        prop_assert_eq!(o.allowed, tat_ahead <= max_delay);
        prop_assert_eq!(evaluate(&p, st.as_ref(), &req(now, cost)), o);
    }
}
