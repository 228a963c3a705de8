//! Token bucket: `burst` tokens, refilled at a [`Rate`].
//!
//! Tokens are kept in the rate's units ([`Rate::scale`] a token; micro-tokens for rates per
//! second), so a refill is exactly [`Rate::units`] units per microsecond: no rounding, ever,
//! `10/1m` included. Absent state is a full bucket (a shared rule's: this region's share of it,
//! [`super::Remote::fresh_share`]), so a region-scope key expires as soon as
//! its bucket is full again; a shared one a refill period later ([`kept_past_full`]).
//!
//! A stored state is written in its shortest exact form ([`normalize`]): "`tokens` at `ts`"
//! equals "0 tokens at `ts - tokens / units`" whenever `units` divides `tokens`, which always
//! holds for rates dividing 10^6 a second (1, 2, 5, 10, 20, 100, 1000, ...) and for rates of
//! one unit a µs (`10/1m`, `1/1h`). The state is then one integer, and Redis keeps one
//! integer inside the key's object: 72 bytes a key instead of 104 (docs/redis.md).

use super::{MAX_USED, Outcome, Rate, Request, State, probe_cost};
use crate::time::{MILLI, Micros, div_ceil};

/// Time for an empty bucket to fill.
pub(super) fn full_period(rate: Rate, burst: u64) -> Micros {
    div_ceil(burst * rate.scale(), rate.units())
}

/// This generation's cumulative consumption after a take of `cost`: a charged refusal can
/// drain at most the whole bucket, so a take counts at most `burst` (which also keeps the
/// figure's growth bounded). Unshared rules never count it.
pub(super) fn used_after(used: u64, cost: u64, burst: u64, req: &Request<'_>) -> u64 {
    if req.remote.shares_bucket() {
        used.saturating_add(cost.min(burst)).min(MAX_USED)
    } else {
        used
    }
}

/// The birth stamp a key created at `now` gets (epoch milliseconds): its generation's label,
/// for a shared rule only (an unshared key keeps its small state and ships nothing), and
/// only with labels on ([`super::UNLABELLED`]).
pub(super) fn born_at(now: Micros, req: &Request<'_>) -> u64 {
    if req.remote.labels() { now / MILLI } else { 0 }
}

/// A stored birth stamp as the next write keeps it: dropped when the caller turned labels
/// off, so the key is written again in the form an older release reads
/// ([`super::UNLABELLED`]).
pub(super) fn kept_born(born: u64, req: &Request<'_>) -> u64 {
    if req.remote.unlabelled() { 0 } else { born }
}

/// `Outcome::generation`: the label the figure ships under (the birth stamp in epoch µs, a
/// whole millisecond) for a shared rule, 0 otherwise.
pub(super) fn generation(born: u64, req: &Request<'_>) -> Micros {
    if req.remote.shares_bucket() {
        born.saturating_mul(MILLI).min(MAX_USED)
    } else {
        0
    }
}

/// How long a bucket holding `tokens` units stays meaningful (its store TTL): until it is
/// full again, when absent state says the same; 0 for a full bucket (no key). A bucket that
/// carries a shared figure keeps its key one refill period longer ([`kept_past_full`]). The
/// one expiry rule of a bucket: `take` and `give_back` both use it.
pub(super) fn ttl(rate: Rate, burst: u64, tokens: u64, seen: u64, used: u64) -> Micros {
    let to_full = div_ceil(burst * rate.scale() - tokens, rate.units());
    to_full
        .saturating_add(kept_past_full(seen, used, full_period(rate, burst)))
        .min(MAX_USED)
}

/// How long a bucket's key outlives its refill: one refill `period` (an empty bucket's fill
/// time) when it carries a shared figure (`seen` or `used` nonzero, which only a shared rule
/// writes), else nothing.
///
/// Why: a region that takes under the refill rate finds its bucket full again before its
/// next request. Deleted at full, the key would take the region's cumulative `used` with it,
/// every figure would be the last take, and no busy rule would ever ship the key: R regions
/// each under the rate would admit up to R × rate. Kept a period longer, `used` rises across
/// such takes and ships once it passes the threshold; a new generation starts only after a
/// whole period without a take, so a region hides at most `θ × L / R` per refill period, and
/// the shared rate holds to `rate × (1 + θ × (R − 1) / R)` (docs/regions.md, "Bounds").
/// Region-scope buckets carry neither field and keep expiring at full (docs/redis.md's sizes
/// and key lifetimes unchanged). The sum is capped at 2^53 − 1 µs so Lua computes it exactly.
pub(super) fn kept_past_full(seen: u64, used: u64, period: Micros) -> Micros {
    if seen > 0 || used > 0 { period } else { 0 }
}

/// Tokens at `now` (refilled, remote consumption drained), the remote figure seen, this
/// region's cumulative `used` (0 when the key is fresh: a new generation) and the
/// generation's birth stamp ([`born_at`] for a fresh key). A fresh key holds
/// [`super::Remote::fresh_share`] of the burst (all of it unless the rule is shared by several
/// regions) and leaves the rest to the other regions ([`super::Remote::fresh_seen`]).
pub(super) fn current(
    rate: Rate,
    burst: u64,
    state: Option<&State>,
    req: &Request<'_>,
) -> (u64, Micros, u64, u64, u64) {
    let (scale, units) = (rate.scale(), rate.units());
    let cap = burst * scale;
    let (mut tokens, ts, seen, used, born) = match state {
        Some(State::TokenBucket {
            tokens,
            ts,
            seen,
            used,
            born,
        }) => {
            let tokens = (*tokens).min(cap);
            let elapsed = req.now.saturating_sub(*ts);
            let missing = cap - tokens;
            let tokens = if elapsed >= div_ceil(missing, units) {
                cap
            } else {
                tokens + elapsed * units
            };
            (
                tokens,
                (*ts).max(req.now),
                *seen,
                *used,
                kept_born(*born, req),
            )
        }
        // Fresh: full, or this region's share of the burst for a shared rule, the rest left
        // to the other regions' shares.
        _ => (
            req.remote.fresh_share(burst) * scale,
            req.now,
            req.remote.fresh_seen(burst),
            0,
            born_at(req.now, req),
        ),
    };
    // Other regions' new consumption comes out of what the bucket holds. What it cannot hold
    // now is owed, `seen` lagging the figure, and comes out of the refill (at most one burst
    // is owed): forgiven, it let a bucket busy in every region refill from empty at the full
    // rate in each, 2.4x its limit over three regions.
    let fresh = req.remote.cur.saturating_sub(seen);
    let drained = fresh.min(tokens / scale);
    tokens -= drained * scale;
    let seen = if fresh > 0 {
        req.remote.cur - (fresh - drained).min(burst)
    } else {
        seen
    };
    (tokens, ts, seen, used, born)
}

/// `Outcome::usage`: the cumulative figure for a shared rule, how drained otherwise.
pub(super) fn usage(used: u64, burst: u64, remaining: u64, req: &Request<'_>) -> u64 {
    if req.remote.shares_bucket() {
        used
    } else {
        burst - remaining
    }
}

pub(super) fn evaluate(
    rate: Rate,
    burst: u64,
    state: Option<&State>,
    req: &Request<'_>,
) -> Outcome {
    let (scale, units) = (rate.scale(), rate.units());
    let cap = burst * scale;
    let (tokens, _, _, used, born) = current(rate, burst, state, req);
    let window = full_period(rate, burst);
    let generation = generation(born, req);
    // A cost above the burst never fits (and would pass 2^53 in units).
    let probe = probe_cost(req.cost);
    let need = if probe > burst {
        cap + 1
    } else {
        probe * scale
    };
    if need <= tokens {
        let after = tokens - req.cost * scale;
        let remaining = after / scale;
        Outcome {
            allowed: true,
            limit: burst,
            remaining,
            reset: div_ceil(cap - after, units),
            retry_after: 0,
            window,
            usage: usage(
                used_after(used, req.cost, burst, req),
                burst,
                remaining,
                req,
            ),
            generation,
        }
    } else {
        let remaining = tokens / scale;
        let retry_after = if need > cap {
            window
        } else {
            div_ceil(need - tokens, units)
        };
        Outcome {
            allowed: false,
            limit: burst,
            remaining,
            reset: div_ceil(cap - tokens, units),
            retry_after,
            window,
            usage: usage(used, burst, remaining, req),
            generation,
        }
    }
}

/// The shortest exact form of an unshared bucket: no tokens at the earlier instant the
/// bucket was empty, when that instant is a whole microsecond. Refill from it gives the same
/// tokens at every `now >= ts` (and fewer, never more, before it). Shared buckets keep
/// `seen`/`used`/`born`, so they keep their fields.
pub(super) fn normalize(
    tokens: u64,
    ts: Micros,
    (seen, used, born): (u64, u64, u64),
    units: u64,
) -> State {
    let back = tokens / units;
    if seen == 0 && used == 0 && born == 0 && tokens.is_multiple_of(units) && back <= ts {
        State::TokenBucket {
            tokens: 0,
            ts: ts - back,
            seen: 0,
            used: 0,
            born: 0,
        }
    } else {
        State::TokenBucket {
            tokens,
            ts,
            seen,
            used,
            born,
        }
    }
}

pub(super) fn take(
    rate: Rate,
    burst: u64,
    state: Option<&State>,
    req: &Request<'_>,
) -> (State, Micros) {
    let (tokens, ts, seen, used, born) = current(rate, burst, state, req);
    // A charge above the burst empties the bucket, no more.
    let tokens = tokens.saturating_sub(req.cost.min(burst) * rate.scale());
    let used = used_after(used, req.cost, burst, req);
    (
        normalize(tokens, ts, (seen, used, born), rate.units()),
        ttl(rate, burst, tokens, seen, used),
    )
}

#[cfg(test)]
mod tests {
    use super::super::{Params, Remote, TOKEN_SCALE, evaluate, take};
    use super::*;
    use crate::time::SECOND;

    /// `10/1m` (6·10^6 units a token, one a µs): ten at once, then one every 6 s exactly.
    #[test]
    fn ten_per_minute_refills_one_every_6_s() {
        let p = Params::TokenBucket {
            rate: Rate::new(10, 60 * SECOND).expect("10/1m"),
            burst: 10,
        };
        let t0 = 1_800_000_000 * SECOND;
        let mut st = None;
        for _ in 0..10 {
            assert!(evaluate(&p, st.as_ref(), &req(t0, 1)).allowed);
            st = Some(take(&p, st.as_ref(), &req(t0, 1)).0);
        }
        let o = evaluate(&p, st.as_ref(), &req(t0, 1));
        assert_eq!(
            (o.allowed, o.retry_after, o.window),
            (false, 6 * SECOND, 60 * SECOND)
        );
        for k in 1..=20 {
            let due = t0 + k * 6 * SECOND;
            assert!(
                !evaluate(&p, st.as_ref(), &req(due - 1, 1)).allowed,
                "token {k}"
            );
            assert!(evaluate(&p, st.as_ref(), &req(due, 1)).allowed, "token {k}");
            let (s, _) = take(&p, st.as_ref(), &req(due, 1));
            // One unit a µs: every state is the one-integer form.
            assert_eq!(s.encode().split(' ').count(), 1, "{s:?}");
            st = Some(s);
        }
    }

    fn req(now: Micros, cost: u64) -> Request<'static> {
        Request {
            now,
            cost,
            request_id: "",
            remote: Remote::default(),
        }
    }

    #[test]
    fn burst_then_refill() {
        let p = Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 20,
        };
        let mut st: Option<State> = None;
        let mut allowed = 0;
        for _ in 0..25 {
            let o = evaluate(&p, st.as_ref(), &req(0, 1));
            if o.allowed {
                allowed += 1;
                st = Some(take(&p, st.as_ref(), &req(0, 1)).0);
            } else {
                assert_eq!(o.retry_after, SECOND);
                assert_eq!(o.remaining, 0);
            }
        }
        assert_eq!(allowed, 20);
        assert!(evaluate(&p, st.as_ref(), &req(SECOND, 1)).allowed);
        assert!(!evaluate(&p, st.as_ref(), &req(SECOND - 1, 1)).allowed);
    }

    #[test]
    fn remote_consumption_is_drained_once() {
        let p = Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 10,
        };
        let r = |cur| Request {
            now: 0,
            cost: 1,
            request_id: "",
            remote: Remote { cur, prev: 0 },
        };
        let (s, _) = take(&p, None, &r(0));
        let (s, _) = take(&p, Some(&s), &r(5));
        assert_eq!(evaluate(&p, Some(&s), &r(5)).remaining, 2);
        // The same remote figure again drains nothing more.
        let (s, _) = take(&p, Some(&s), &r(5));
        assert_eq!(evaluate(&p, Some(&s), &r(5)).remaining, 1);
    }

    #[test]
    fn a_shared_bucket_counts_what_it_took() {
        let p = Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 10,
        };
        let r = |cost, shared| Request {
            now: 0,
            cost,
            request_id: "",
            remote: if shared {
                Remote::shared_bucket(0, 1)
            } else {
                Remote::default()
            },
        };
        // Unshared: usage is how drained, nothing counted in the state.
        let (s, _) = take(&p, None, &r(3, false));
        assert_eq!(evaluate(&p, Some(&s), &r(1, false)).usage, 4);
        assert!(matches!(s, State::TokenBucket { used: 0, .. }));
        // Shared: the cumulative figure, after the request.
        let (s, _) = take(&p, None, &r(3, true));
        assert_eq!(evaluate(&p, Some(&s), &r(2, true)).usage, 5);
        // A charged refusal counts at most the burst.
        let (s, _) = take(&p, Some(&s), &r(1_000, true));
        assert!(matches!(s, State::TokenBucket { used: 13, .. }));
        assert_eq!(evaluate(&p, Some(&s), &r(1, true)).usage, 13);
    }

    /// Labels off: a shared bucket and a shared GCRA are written in the form a release
    /// before labels reads (four and three fields), a stored stamp is dropped, the outcome
    /// ships under 0, and everything else (the share of the burst, `used`) is as with labels.
    #[test]
    fn labels_off_write_the_older_form() {
        let t0 = 1_800_000_000 * SECOND;
        let on = Remote::shared_bucket(0, 3);
        let off = on.without_labels();
        assert!(on.labels() && !off.labels() && off.unlabelled() && off.shares_bucket());
        assert_eq!(off.without_labels(), off);
        assert_eq!(off.fresh_share(100), on.fresh_share(100));
        assert_eq!(Remote::default().without_labels(), Remote::default());
        let at = |remote| Request {
            now: t0,
            cost: 1,
            request_id: "",
            remote,
        };
        for p in [
            Params::TokenBucket {
                rate: Rate::per_second(10),
                burst: 100,
            },
            Params::Gcra {
                rate: Rate::per_second(10),
                burst: 100,
            },
        ] {
            let fields = if matches!(p, Params::Gcra { .. }) {
                3
            } else {
                4
            };
            let (labelled, _) = super::super::take(&p, None, &at(on));
            let (plain, _) = super::super::take(&p, None, &at(off));
            assert_eq!(
                labelled.encode().split(' ').count(),
                fields + 1,
                "{labelled:?}"
            );
            assert_eq!(plain.encode().split(' ').count(), fields, "{plain:?}");
            // A labelled key met with labels off loses its stamp and keeps its count.
            let (again, _) = super::super::take(&p, Some(&labelled), &at(off));
            assert_eq!(again.encode().split(' ').count(), fields, "{again:?}");
            let o = super::super::evaluate(&p, Some(&again), &at(off));
            assert_eq!((o.usage, o.generation), (3, 0));
            let o = super::super::evaluate(&p, Some(&labelled), &at(on));
            assert_eq!((o.usage, o.generation), (2, t0));
        }
    }

    #[test]
    fn normalized_state_refills_exactly_like_the_original() {
        let t0 = 1_800_000_000 * SECOND;
        for (rate, burst) in [(20, 40), (7, 10), (1000, 1), (3, 300)] {
            let rate = Rate::per_second(rate);
            let p = Params::TokenBucket { rate, burst };
            let (s, _) = take(&p, None, &req(t0, 1));
            let raw = State::TokenBucket {
                tokens: (burst - 1) * TOKEN_SCALE,
                ts: t0,
                seen: 0,
                used: 0,
                born: 0,
            };
            if ((burst - 1) * TOKEN_SCALE).is_multiple_of(rate.units()) {
                assert!(matches!(s, State::TokenBucket { tokens: 0, .. }), "{s:?}");
                assert_eq!(s.encode().split(' ').count(), 1, "one integer");
            } else {
                assert_eq!(s, raw);
            }
            for dt in [0, 1, 999, SECOND / 3, SECOND, 10 * SECOND, 1_000 * SECOND] {
                for cost in [0, 1, 2, burst] {
                    assert_eq!(
                        evaluate(&p, Some(&s), &req(t0 + dt, cost)),
                        evaluate(&p, Some(&raw), &req(t0 + dt, cost)),
                        "rate {rate} burst {burst} dt {dt} cost {cost}"
                    );
                }
            }
        }
        // A bucket at time 0 cannot move its instant before the epoch: it keeps its fields.
        let p = Params::TokenBucket {
            rate: Rate::per_second(20),
            burst: 40,
        };
        let (s, _) = take(&p, None, &req(0, 1));
        assert!(matches!(
            s,
            State::TokenBucket {
                tokens: 39_000_000,
                ts: 0,
                ..
            }
        ));
    }

    #[test]
    fn cost_above_burst_never_fits() {
        let p = Params::TokenBucket {
            rate: Rate::per_second(10),
            burst: 5,
        };
        let o = evaluate(&p, None, &req(0, 6));
        assert!(!o.allowed);
        assert_eq!(o.retry_after, full_period(Rate::per_second(10), 5));
    }

    /// Other regions' consumption beyond what the bucket holds is owed, not forgiven: it
    /// comes out of the refill before this region gets any.
    #[test]
    fn remote_consumption_past_empty_is_owed() {
        let p = Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 10,
        };
        let at = |now: Micros, cur: u64| Request {
            now,
            cost: 1,
            request_id: "",
            remote: Remote::shared_bucket(cur, 1),
        };
        // Full (10), then the others take 14: empty, 4 owed.
        let (st, _) = take(
            &p,
            None,
            &Request {
                cost: 0,
                ..at(0, 0)
            },
        );
        let (st, _) = take(
            &p,
            Some(&st),
            &Request {
                cost: 0,
                ..at(0, 14)
            },
        );
        assert!(!evaluate(&p, Some(&st), &at(0, 14)).allowed);
        // Four seconds of refill pay the debt; the fifth second's token is this region's.
        assert!(!evaluate(&p, Some(&st), &at(4 * SECOND, 14)).allowed);
        assert!(evaluate(&p, Some(&st), &at(5 * SECOND, 14)).allowed);
    }
}
