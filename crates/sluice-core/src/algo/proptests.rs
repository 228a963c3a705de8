//! Properties every algorithm must keep, over random request sequences.

use super::*;
use crate::time::{MILLI, SECOND};
use proptest::prelude::*;

/// A bucket's rate: per second (micro-tokens), or a few per a period of seconds, minutes,
/// hours or any whole number of milliseconds (sub-token units of their own).
fn rate() -> impl Strategy<Value = Rate> {
    let period = prop_oneof![
        Just(60 * SECOND),
        Just(3_600 * SECOND),
        (1u64..=120_000).prop_map(|ms| ms * MILLI),
    ];
    // Mostly per second, so slow buckets (empty for minutes) leave the properties that
    // need a fitting request enough cases.
    prop_oneof![
        2 => (1u64..50).prop_map(Rate::per_second),
        1 => (1u64..30, period).prop_map(|(n, per)| Rate::new(n, per).expect("a valid rate")),
    ]
}

fn params() -> impl Strategy<Value = Params> {
    prop_oneof![
        (rate(), 1u64..30).prop_map(|(rate, burst)| Params::TokenBucket { rate, burst }),
        (rate(), 1u64..30).prop_map(|(rate, burst)| Params::Gcra { rate, burst }),
        (1u64..30, 1u64..5_000).prop_map(|(limit, ms)| Params::FixedWindow {
            limit,
            window: Window::Epoch(ms * MILLI)
        }),
        (1u64..30, 1u64..5_000).prop_map(|(limit, ms)| Params::SlidingWindow {
            limit,
            window: ms * MILLI,
            start: Default::default(),
        }),
        (1u64..30, 1u64..5_000).prop_map(|(limit, ms)| Params::SlidingLog {
            limit,
            window: ms * MILLI
        }),
        (1u64..10, 1u64..5_000).prop_map(|(limit, ms)| Params::Concurrency {
            limit,
            timeout: ms * MILLI
        }),
    ]
}

/// (gap before the request in µs, cost)
fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0u64), 0u64..2_000, 0u64..3 * SECOND],
            0u64..4,
        ),
        1..200,
    )
}

fn req(now: Micros, cost: u64, id: &str) -> Request<'_> {
    Request {
        now,
        cost,
        request_id: id,
        remote: Remote::default(),
    }
}

/// Runs the steps, returning (time, cost) of every admitted request with cost > 0.
fn run(p: &Params, steps: &[(u64, u64)]) -> Vec<(Micros, u64)> {
    let mut st: Option<State> = None;
    let mut now = 1_700_000_000 * SECOND;
    let mut admitted = Vec::new();
    for (i, (gap, cost)) in steps.iter().enumerate() {
        now += gap;
        let id = format!("r{i}");
        let o = evaluate(p, st.as_ref(), &req(now, *cost, &id));
        if o.allowed && *cost > 0 {
            st = Some(take(p, st.as_ref(), &req(now, *cost, &id)).0);
            admitted.push((now, *cost));
        }
    }
    admitted
}

/// Most units admitted in any interval of length `len` starting at an admission.
fn max_in(admitted: &[(Micros, u64)], len: Micros) -> u64 {
    let mut best = 0;
    for (i, (t0, _)) in admitted.iter().enumerate() {
        let sum: u64 = admitted[i..]
            .iter()
            .take_while(|(t, _)| *t < t0 + len)
            .map(|(_, c)| c)
            .sum();
        best = best.max(sum);
    }
    best
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn never_admits_more_than_the_definition(p in params(), s in steps()) {
        let admitted = run(&p, &s);
        match &p {
            // Not generated here: its properties are in `fair_share_proptests`.
            Params::FairShare(_) => {}
            // Not generated here: its properties are in `leaky_queue_proptests`.
            Params::LeakyQueue { .. } => {}
            Params::TokenBucket { rate: r, burst: b } | Params::Gcra { rate: r, burst: b } => {
                // In any interval of length L: burst + rate·L.
                for len in [1, 100 * MILLI, SECOND, 5 * SECOND, 60 * SECOND] {
                    let cap = b + (r.tokens() * len).div_ceil(r.per());
                    prop_assert!(max_in(&admitted, len) <= cap, "{} > {cap} in {len}us", max_in(&admitted, len));
                }
            }
            Params::FixedWindow { limit, window } => {
                let mut per: std::collections::HashMap<Micros, u64> = Default::default();
                for (t, c) in &admitted { *per.entry(window.bounds(*t).0).or_default() += c; }
                prop_assert!(per.values().all(|&n| n <= *limit));
            }
            Params::SlidingWindow { limit, window, .. } => {
                let mut per: std::collections::HashMap<Micros, u64> = Default::default();
                for (t, c) in &admitted { *per.entry(t - t % window).or_default() += c; }
                prop_assert!(per.values().all(|&n| n <= *limit));
                // The estimate never lets a sliding window see more than twice the limit.
                prop_assert!(max_in(&admitted, *window) <= 2 * limit);
            }
            Params::SlidingLog { limit, window } => {
                prop_assert!(max_in(&admitted, *window) <= *limit);
            }
            Params::Concurrency { limit, timeout } => {
                // Nothing is released here, so slots only expire.
                prop_assert!(max_in(&admitted, *timeout) <= *limit);
            }
        }
    }

    #[test]
    fn retry_after_is_never_early(p in params(), s in steps(), cost in 1u64..4) {
        let mut st: Option<State> = None;
        let mut now = 1_700_000_000 * SECOND;
        for (i, (gap, c)) in s.iter().enumerate() {
            now += gap;
            let id = format!("r{i}");
            if evaluate(&p, st.as_ref(), &req(now, *c, &id)).allowed && *c > 0 {
                st = Some(take(&p, st.as_ref(), &req(now, *c, &id)).0);
            }
        }
        let o = evaluate(&p, st.as_ref(), &req(now, cost, "probe"));
        if !o.allowed && cost <= p.limit() {
            let later = evaluate(&p, st.as_ref(), &req(now + o.retry_after, cost, "probe"));
            prop_assert!(later.allowed, "refused again at now + retry_after ({}us): {later:?}", o.retry_after);
            prop_assert!(o.retry_after > 0);
        }
    }

    #[test]
    fn state_survives_encode_decode(p in params(), s in steps()) {
        let mut st: Option<State> = None;
        let mut now = 1_700_000_000 * SECOND;
        for (i, (gap, c)) in s.iter().enumerate() {
            now += gap;
            let id = format!("r{i}");
            if evaluate(&p, st.as_ref(), &req(now, *c, &id)).allowed {
                st = Some(take(&p, st.as_ref(), &req(now, *c, &id)).0);
            }
            if let Some(state) = &st {
                let back = State::decode(p.kind(), &state.encode());
                prop_assert_eq!(back.as_ref(), Ok(state));
            }
        }
    }

    #[test]
    fn peeking_changes_nothing(p in params(), s in steps()) {
        let admitted = run(&p, &s);
        let with_peeks: Vec<(u64, u64)> = s.iter().flat_map(|&(g, c)| [(g, c), (0, 0)]).collect();
        prop_assert_eq!(admitted, run(&p, &with_peeks));
    }

    /// The token bucket is exact at every rate: it decides as a model counting tokens in
    /// 1/per units (`tokens` arrive each µs) with unbounded integers, the definition itself.
    #[test]
    fn a_token_bucket_is_the_exact_definition(
        rate in rate(),
        burst in 1u64..30,
        s in prop::collection::vec(
            (prop_oneof![Just(0u64), 0u64..2_000, 0u64..3 * SECOND, 0u64..200 * SECOND], 0u64..4),
            1..200,
        ),
    ) {
        let p = Params::TokenBucket { rate, burst };
        let (n, per) = (u128::from(rate.tokens()), u128::from(rate.per()));
        let cap = u128::from(burst) * per;
        let mut now = 1_700_000_000 * SECOND;
        let (mut st, mut model, mut last): (Option<State>, u128, Micros) = (None, cap, now);
        for (gap, cost) in s {
            now += gap;
            model = (model + u128::from(now - last) * n).min(cap);
            last = now;
            let o = evaluate(&p, st.as_ref(), &req(now, cost, ""));
            let need = u128::from(cost.max(1)) * per;
            prop_assert_eq!(o.allowed, need <= model, "cost {} at {}", cost, now);
            if o.allowed {
                model -= u128::from(cost) * per;
                prop_assert_eq!(u128::from(o.remaining), model / per);
                prop_assert_eq!(u128::from(o.reset), (cap - model).div_ceil(n));
                st = Some(take(&p, st.as_ref(), &req(now, cost, "")).0);
            } else {
                prop_assert_eq!(u128::from(o.remaining), model / per);
                // A cost above the burst never fits: it is told the time to fill.
                let wait = if need > cap { cap } else { need - model };
                prop_assert_eq!(u128::from(o.retry_after), wait.div_ceil(n));
            }
        }
    }

    /// A shared bucket's `used` is what it took in the key's generation: the sum of every
    /// take (a charged refusal counting at most the burst), monotone until the key expires
    /// (its TTL passes), then 0 again; the outcome reports it after the request. The key of a
    /// bucket carrying a shared figure outlives its refill by one refill period (the window),
    /// a region-scope one expires when full; with no remote figure, sharing changes no
    /// decision (a kept full bucket decides as an absent one).
    #[test]
    fn shared_buckets_count_their_generation(
        rate in rate(),
        burst in 1u64..30,
        gcra in any::<bool>(),
        quiet in any::<bool>(),
        s in prop::collection::vec(
            (prop_oneof![Just(0u64), 0u64..2_000, 0u64..3 * SECOND, 0u64..100 * SECOND], 0u64..40, 0u64..3, any::<bool>()),
            1..200,
        ),
    ) {
        let p = if gcra {
            Params::Gcra { rate, burst }
        } else {
            Params::TokenBucket { rate, burst }
        };
        let mut now = 1_700_000_000 * SECOND;
        type Held = Option<(State, Micros)>;
        let (mut shared, mut alone): (Held, Held) = (None, None);
        let mut remote = 0;
        let mut generation = 0u64;
        for (gap, cost, more_remote, charge) in s {
            now += gap;
            if !quiet {
                remote += more_remote;
            }
            // Redis's expiry: a state past its TTL is gone.
            if shared.as_ref().is_some_and(|(_, exp)| *exp <= now) {
                shared = None;
                generation = 0;
            }
            if alone.as_ref().is_some_and(|(_, exp)| *exp <= now) {
                alone = None;
            }
            let r = Request { now, cost, request_id: "", remote: Remote::shared_bucket(remote, 1) };
            let r0 = Request { remote: Remote::default(), ..r };
            let o = evaluate(&p, shared.as_ref().map(|x| &x.0), &r);
            let o0 = evaluate(&p, alone.as_ref().map(|x| &x.0), &r0);
            if quiet {
                prop_assert_eq!(o.allowed, o0.allowed);
                prop_assert_eq!(o.remaining, o0.remaining);
                prop_assert_eq!(o.retry_after, o0.retry_after);
            }
            prop_assert_eq!(o.usage, if o.allowed { generation + cost } else { generation });
            if o.allowed || charge {
                let (st, ttl) = take(&p, shared.as_ref().map(|x| &x.0), &r);
                let (st0, ttl0) = take(&p, alone.as_ref().map(|x| &x.0), &r0);
                generation += cost.min(burst);
                let (seen, used) = match &st {
                    State::TokenBucket { seen, used, .. } | State::Gcra { seen, used, .. } => (*seen, *used),
                    _ => unreachable!("a bucket's state"),
                };
                prop_assert_eq!(used, generation);
                prop_assert!(used <= MAX_USED);
                let back = State::decode(p.kind(), &st.encode());
                prop_assert_eq!(back.as_ref(), Ok(&st));
                if let State::TokenBucket { used, .. } | State::Gcra { used, .. } = &st0 {
                    prop_assert_eq!(*used, 0);
                }
                // The TTL: until full (a peek's `reset`), plus a refill period when shared.
                let peek = |st: &State, r: &Request<'_>| evaluate(&p, Some(st), &Request { cost: 0, ..*r }).reset;
                let kept = if seen > 0 || used > 0 { p.window() } else { 0 };
                prop_assert_eq!(ttl, peek(&st, &r) + kept);
                prop_assert_eq!(ttl0, peek(&st0, &r0));
                shared = (ttl > 0).then_some((st, now + ttl));
                alone = (ttl0 > 0).then_some((st0, now + ttl0));
            }
        }
    }
}

/// Admits unit requests at `now` on `p` from `state` until one is refused: what a region
/// lets through at once.
fn admitted_at_once(p: &Params, state: Option<State>, now: Micros, remote: Remote) -> u64 {
    let mut st = state;
    let mut n = 0;
    loop {
        let r = Request {
            now,
            cost: 1,
            request_id: "",
            remote,
        };
        if !evaluate(p, st.as_ref(), &r).allowed || n > 100 {
            return n;
        }
        st = Some(take(p, st.as_ref(), &r).0);
        n += 1;
    }
}

proptest! {
    /// A global bucket new in R regions at once: each region starts with its share of the
    /// burst, ceil(burst / R) (at least 1, at most the burst), so together they admit at most
    /// the burst plus the rounding (R − 1), not R bursts. Hearing what the others took then
    /// costs a region at most that rounding (their shares are not drained twice), so a full
    /// refill period later each region holds the burst again, less the rounding. The prev
    /// field of a shared figure carries R; R = 1 (and 0 read as 1) is exactly the full fresh
    /// bucket of before: every outcome and every written state the same as from an explicit
    /// full state.
    #[test]
    fn a_fresh_shared_bucket_starts_with_a_regions_share(
        rate in rate(),
        burst in 1u64..30,
        regions in 1u64..=5,
        gcra in any::<bool>(),
        cur in 0u64..50,
        s in steps(),
    ) {
        let p = if gcra {
            Params::Gcra { rate, burst }
        } else {
            Params::TokenBucket { rate, burst }
        };
        let now = 1_700_000_000 * SECOND;
        let share = burst.div_ceil(regions).clamp(1, burst);
        let remote = Remote { cur, prev: regions };
        let mut total = 0;
        for _ in 0..regions {
            let n = admitted_at_once(&p, None, now, remote);
            prop_assert_eq!(n, share);
            total += n;
        }
        prop_assert!(total < burst + regions, "{total} > {burst} + {regions} - 1");
        // One region's state after its share, then the others' shares heard.
        let mut st = None;
        for _ in 0..share {
            let r = Request { now, cost: 1, request_id: "", remote };
            st = Some(take(&p, st.as_ref(), &r).0);
        }
        let heard = Remote { cur: cur + (regions - 1) * share, prev: regions };
        let rounding = total - total.min(burst);
        let later = now + p.window();
        let n = admitted_at_once(&p, st, later, heard);
        prop_assert!(n <= burst && n + rounding >= burst, "{n} of {burst} a refill later (rounding {rounding})");
        // R = 1: today's fresh bucket, full, having seen the figure it hears, born now when
        // shared (a region-scope key is never labelled).
        let full = |now: Micros, prev: u64| {
            let born = if prev > 0 { now / MILLI } else { 0 };
            if gcra {
                State::Gcra { tat: now, seen: cur, used: 0, born }
            } else {
                State::TokenBucket { tokens: burst * rate.scale(), ts: now, seen: cur, used: 0, born }
            }
        };
        for prev in [0, 1] {
            let r = Request { now, cost: 0, request_id: "", remote: Remote { cur, prev } };
            for (gap, cost) in &s {
                let r = Request { now: now + gap, cost: *cost, ..r };
                let st = full(r.now, prev);
                prop_assert_eq!(evaluate(&p, None, &r), evaluate(&p, Some(&st), &r));
                prop_assert_eq!(take(&p, None, &r), take(&p, Some(&st), &r));
            }
        }
    }
}

/// The algorithms a lease can be given back to (`Kind::leasable`), small numbers.
fn leasable_params() -> impl Strategy<Value = Params> {
    params().prop_filter("leasable", |p| p.kind().leasable())
}

/// Leasable params up to the validated bounds, and a state of their algorithm with any
/// fields up to `field` (a window's counts up to `count`): what a store can hold, whether a
/// check could have written it or not.
fn any_leasable_state(field: u64, count: u64) -> impl Strategy<Value = (Params, State)> {
    let n = move || 0..=field;
    let c = move || 0..=count;
    let big = || 1u64..=MAX_LIMIT;
    // Any rate up to the bounds: per second, or over any period that keeps the bucket exact.
    let any_rate = || {
        prop_oneof![
            big().prop_map(Rate::per_second),
            (big(), 1u64..=MAX_PERIOD / MILLI)
                .prop_filter_map("a rate the rules take", |(n, ms)| Rate::new(n, ms * MILLI)
                    .ok()),
        ]
    };
    prop_oneof![
        (any_rate(), big(), n(), n(), n(), n(), n())
            .prop_filter("a burst the rate takes", |(r, b, ..)| r.fits(*b).is_ok())
            .prop_map(|(rate, burst, tokens, ts, seen, used, born)| {
                (
                    Params::TokenBucket { rate, burst },
                    State::TokenBucket {
                        tokens,
                        ts,
                        seen,
                        used,
                        born,
                    },
                )
            }),
        (big(), any_rate(), n(), n(), n(), n())
            .prop_filter("a burst the rate takes", |(b, r, ..)| r.fits(*b).is_ok())
            .prop_map(|(burst, rate, tat, seen, used, born)| {
                (
                    Params::Gcra { rate, burst },
                    State::Gcra {
                        tat,
                        seen,
                        used,
                        born,
                    },
                )
            }),
        (big(), 1u64..=86_400_000, n(), c()).prop_map(|(limit, ms, start, count)| {
            let window = ms * MILLI;
            // A start on the window's grid, as every written state has.
            let start = start - start % window;
            (
                Params::FixedWindow {
                    limit,
                    window: Window::Epoch(window),
                },
                State::FixedWindow { start, count },
            )
        }),
        (big(), 1u64..=86_400_000, n(), c(), c()).prop_map(|(limit, ms, start, cur, prev)| {
            let window = ms * MILLI;
            let start = start - start % window;
            (
                Params::SlidingWindow {
                    limit,
                    window,
                    start: Default::default(),
                },
                State::SlidingWindow { start, cur, prev },
            )
        }),
    ]
}

/// The state a store holds after writing `w`: a TTL of 0 deletes.
fn written(w: Option<(State, Micros)>, before: Option<State>) -> Option<State> {
    match w {
        Some((s, ttl)) => (ttl > 0).then_some(s),
        None => before,
    }
}

proptest! {
    // A lease must fit first: a slow bucket (a few a minute) the steps drained refuses it,
    // so more draws are rejected than at rates per second alone.
    #![proptest_config(ProptestConfig {
        max_global_rejects: 8_192,
        ..ProptestConfig::with_cases(400)
    })]

    /// A lease given back unspent undoes its take: at the same instant every probe answers
    /// exactly as before the take; later, a bucket and a fixed window answer exactly as if
    /// nothing had been leased, and a sliding window (whose count may have become the
    /// previous window's weight) never admits more than without the lease.
    #[test]
    fn a_lease_given_back_unspent_undoes_its_take(
        p in leasable_params(),
        s in steps(),
        lease in 1u64..30,
        later in prop_oneof![Just(0u64), 0u64..2_000, 0u64..3 * SECOND, 0u64..20 * SECOND],
    ) {
        let mut st: Option<State> = None;
        let mut now = 1_700_000_000 * SECOND;
        for (i, (gap, cost)) in s.iter().enumerate() {
            now += gap;
            let id = format!("r{i}");
            if evaluate(&p, st.as_ref(), &req(now, *cost, &id)).allowed && *cost > 0 {
                st = Some(take(&p, st.as_ref(), &req(now, *cost, &id)).0);
            }
        }
        prop_assume!(evaluate(&p, st.as_ref(), &req(now, lease, "lease")).allowed);
        let (leased, _) = take(&p, st.as_ref(), &req(now, lease, "lease"));
        let at = now + later;
        let g = GiveBackReq { units: lease, taken_at: now, now: at };
        let back = written(give_back(&p, Some(&leased), &g), Some(leased.clone()));
        for probe in 0..=p.limit() + 1 {
            let want = evaluate(&p, st.as_ref(), &req(at, probe, "probe"));
            let got = evaluate(&p, back.as_ref(), &req(at, probe, "probe"));
            if later == 0 || !matches!(p, Params::SlidingWindow { .. }) {
                prop_assert_eq!(
                    (got.allowed, got.remaining), (want.allowed, want.remaining),
                    "probe {} after {:?} -> {:?} -> {:?}", probe, st, leased, back
                );
            } else {
                prop_assert!(!got.allowed || want.allowed, "probe {probe}: {got:?} vs {want:?}");
            }
        }
        // What is left, by a peek (a refused probe's `remaining` is "now", an admitted one's
        // "after": only peeks compare across the two).
        let want = evaluate(&p, st.as_ref(), &req(at, 0, "peek"));
        let got = evaluate(&p, back.as_ref(), &req(at, 0, "peek"));
        prop_assert!(got.remaining <= want.remaining, "{got:?} vs {want:?}");
    }

    /// Whatever a store holds (window counts within what charged refusals can reach, where
    /// `evaluate` itself is defined) and whatever is given back, the result never admits more
    /// than a fresh key would, writes only a state of the rule's algorithm that round-trips
    /// its encoding, and keeps a bucket's `seen` and `used`.
    #[test]
    fn giving_back_never_beats_a_fresh_key(
        (p, st) in any_leasable_state((1 << 53) - 1, 4 * MAX_LIMIT),
        units in 0u64..=MAX_LIMIT,
        taken_at in 0u64..(1 << 53),
        now in 0u64..(1 << 53),
        probe in 0u64..=MAX_LIMIT,
    ) {
        let g = GiveBackReq { units, taken_at, now };
        let w = give_back(&p, Some(&st), &g);
        if let Some((s, ttl)) = &w {
            prop_assert_eq!(s.kind(), p.kind());
            prop_assert!(*ttl < 1 << 53);
            let decoded = State::decode(s.kind(), &s.encode());
            prop_assert_eq!(decoded.as_ref(), Ok(s));
            if let (
                State::TokenBucket { seen, used, born, .. } | State::Gcra { seen, used, born, .. },
                State::TokenBucket { seen: s2, used: u2, born: b2, .. }
                | State::Gcra { seen: s2, used: u2, born: b2, .. },
            ) = (&st, s)
            {
                prop_assert_eq!((seen, used, born), (s2, u2, b2));
            }
        }
        let after = written(w, Some(st));
        let fresh = evaluate(&p, None, &req(now, probe, "probe"));
        let got = evaluate(&p, after.as_ref(), &req(now, probe, "probe"));
        prop_assert!(!got.allowed || fresh.allowed, "{got:?} vs fresh {fresh:?}");
        let fresh = evaluate(&p, None, &req(now, 0, "peek"));
        let got = evaluate(&p, after.as_ref(), &req(now, 0, "peek"));
        prop_assert!(got.remaining <= fresh.remaining, "{got:?} vs fresh {fresh:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// No state, however odd its fields, makes a give-back panic.
    #[test]
    fn giving_back_never_panics(
        (p, st) in any_leasable_state(u64::MAX, u64::MAX),
        units in any::<u64>(),
        taken_at in 0u64..(1 << 53),
        now in 0u64..(1 << 53),
    ) {
        let g = GiveBackReq { units, taken_at, now };
        if let Some((s, _)) = give_back(&p, Some(&st), &g) {
            prop_assert_eq!(s.kind(), p.kind());
        }
    }
}
