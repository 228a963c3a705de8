//! GCRA: a token bucket whose whole state is one timestamp (the theoretical arrival time).
//!
//! The emission interval ([`Rate::interval`]) is rounded up to whole microseconds, so GCRA
//! never admits more than its rate; it is exact when the period divides by the tokens
//! (`10/1m`: 6 s, `1/1h`, 1,000/s). Where that rounding matters (above ~10,000/s) use
//! `token_bucket`, which is exact at every rate.

use super::token_bucket::{born_at, generation, kept_born, kept_past_full, usage, used_after};
use super::{MAX_USED, Outcome, Rate, Request, State, probe_cost};
use crate::time::Micros;

/// How long a TAT stays meaningful at `now` (its store TTL): until it is `now` or earlier,
/// when absent state says the same; a GCRA that carries a shared figure (`seen` or `used`)
/// one tolerance (`burst` intervals, its refill period) longer, for the reason
/// [`kept_past_full`] gives. The one expiry rule of GCRA (`take`, `give_back`).
pub(super) fn ttl(
    rate: Rate,
    burst: u64,
    tat: Micros,
    now: Micros,
    seen: u64,
    used: u64,
) -> Micros {
    tat.saturating_sub(now)
        .saturating_add(kept_past_full(seen, used, rate.interval() * burst))
        .min(MAX_USED)
}

/// TAT at `now` (never in the past), with fresh remote consumption applied up to one burst
/// of debt; the remote figure seen (what was not applied is owed: `seen` lags the figure by
/// it, at most one burst, and it is applied as the TAT comes back); this region's cumulative
/// `used` (0 for a fresh key: a new generation, which leaves [`super::Remote::fresh_share`]
/// cells and the rest of the burst to the other regions, [`super::Remote::fresh_seen`]);
/// the generation's birth stamp.
fn current(
    rate: Rate,
    burst: u64,
    state: Option<&State>,
    req: &Request<'_>,
) -> (Micros, u64, u64, u64) {
    let t = rate.interval();
    let (tat, seen, used, born) = match state {
        Some(State::Gcra {
            tat,
            seen,
            used,
            born,
        }) => (*tat, *seen, *used, kept_born(*born, req)),
        // Fresh: every cell free, or this region's share of the burst for a shared rule (the
        // TAT as if the rest had just been taken).
        _ => (
            req.now + (burst - req.remote.fresh_share(burst)) * t,
            req.remote.fresh_seen(burst),
            0,
            born_at(req.now, req),
        ),
    };
    let fresh = req.remote.cur.saturating_sub(seen);
    let tat = tat.max(req.now);
    let room = (req.now + t * burst).saturating_sub(tat) / t;
    let applied = fresh.min(room);
    let seen = if fresh > 0 {
        req.remote.cur - (fresh - applied).min(burst)
    } else {
        seen
    };
    (tat + applied * t, seen, used, born)
}

pub(super) fn evaluate(
    rate: Rate,
    burst: u64,
    state: Option<&State>,
    req: &Request<'_>,
) -> Outcome {
    let t = rate.interval();
    let tolerance = t * burst;
    let (tat, _, used, born) = current(rate, burst, state, req);
    let generation = generation(born, req);
    let now = req.now;
    let probe = tat + probe_cost(req.cost) * t;
    if probe - now <= tolerance {
        let after = tat + req.cost * t;
        let remaining = (tolerance - (after - now)) / t;
        Outcome {
            allowed: true,
            limit: burst,
            remaining,
            reset: after - now,
            retry_after: 0,
            window: tolerance,
            usage: usage(
                used_after(used, req.cost, burst, req),
                burst,
                remaining,
                req,
            ),
            generation,
        }
    } else {
        let remaining = tolerance.saturating_sub(tat - now) / t;
        let retry_after = if probe_cost(req.cost) > burst {
            tolerance
        } else {
            probe - now - tolerance
        };
        Outcome {
            allowed: false,
            limit: burst,
            remaining,
            reset: tat - now,
            retry_after,
            window: tolerance,
            usage: usage(used, burst, remaining, req),
            generation,
        }
    }
}

pub(super) fn take(
    rate: Rate,
    burst: u64,
    state: Option<&State>,
    req: &Request<'_>,
) -> (State, Micros) {
    let t = rate.interval();
    let (tat, seen, used, born) = current(rate, burst, state, req);
    // A charged refusal may not push the TAT beyond one full burst of debt.
    let tat = (tat + req.cost * t).min(req.now + t * burst);
    let used = used_after(used, req.cost, burst, req);
    (
        State::Gcra {
            tat,
            seen,
            used,
            born,
        },
        ttl(rate, burst, tat, req.now, seen, used),
    )
}

#[cfg(test)]
mod tests {
    use super::super::{Params, Remote, evaluate, take};
    use super::*;

    #[test]
    fn burst_then_one_per_interval() {
        let p = Params::Gcra {
            rate: Rate::per_second(10),
            burst: 5,
        };
        let r = |now| Request {
            now,
            cost: 1,
            request_id: "",
            remote: Remote::default(),
        };
        let mut st = None;
        for _ in 0..5 {
            assert!(evaluate(&p, st.as_ref(), &r(0)).allowed);
            st = Some(take(&p, st.as_ref(), &r(0)).0);
        }
        let o = evaluate(&p, st.as_ref(), &r(0));
        assert!(!o.allowed);
        assert_eq!(o.retry_after, 100_000);
        assert!(evaluate(&p, st.as_ref(), &r(100_000)).allowed);
    }
}
