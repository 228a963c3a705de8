//! Giving back units that were taken and never spent: the store half of token leasing.
//!
//! A daemon that leases takes `units` by an ordinary check (cost = units) at `taken_at`, then
//! spends them locally. What it did not spend when the key goes quiet, at shutdown or on a
//! rule change it gives back, and [`give_back`] says what that does to the stored state: the
//! inverse of the take as far as the algorithm can still undo it, and never more. Pure integer
//! arithmetic below 2^53 like `evaluate` / `take`, so `lua/give_back.lua` transcribes it bit
//! for bit (the differential test holds it to it).
//!
//! - Token bucket: refilled to `now` exactly as `evaluate` refills it, then `units` tokens
//!   added, capped at the burst. `seen` and `used` stay: a shared bucket's cumulative `used`
//!   has been shipped to other regions, which merge it by max, so it never goes down (the
//!   given-back units stay counted there: an overcount, the safe side).
//! - GCRA: the TAT moves back by `units` emission intervals, never before `now`.
//! - Fixed window (epoch or calendar): the count goes down by `units` only while the state is
//!   the window holding both `taken_at` and `now`; once that window ended, the units expired
//!   with it and there is nothing to give back.
//! - Sliding window: likewise, only within the sub-window holding both `taken_at` and `now`
//!   (a count that became the previous window's is weighted, not given back).
//! - Sliding log and concurrency are not leasable ([`Kind::leasable`]): nothing.
//!
//! Absent state (a full bucket, an empty window) has nothing to give back to. A written state
//! gets the TTL `take` would give it, from the algorithm's own expiry rule; a TTL of 0 (a
//! region-scope bucket full again) means delete, as for `take`. A shared bucket filled by a
//! give-back keeps its key a refill period, as a full one does after a take.

use super::{Kind, Params, Remote, Request, State};
use super::{fixed_window, gcra, sliding_window, token_bucket};
use crate::time::Micros;

/// The inputs of one give-back besides state and params.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GiveBackReq {
    /// Units taken at `taken_at` and not spent. Stores refuse more than
    /// [`super::MAX_LIMIT`], as they refuse such a cost, which keeps `units` × the emission
    /// interval exact in Lua.
    pub units: u64,
    /// When the units were taken (the lease's check's `now`): which window they count in.
    pub taken_at: Micros,
    /// Now, in epoch microseconds.
    pub now: Micros,
}

impl Kind {
    /// Whether units taken by a check of this algorithm can be given back (see the module
    /// docs of `give_back`). A sliding log keeps one entry per unit and a concurrency slot is
    /// freed by `release`, so neither can be leased; a shaping queue's departures are each
    /// one request's, so neither can it.
    pub fn leasable(self) -> bool {
        !matches!(
            self,
            Kind::SlidingLog | Kind::Concurrency | Kind::LeakyQueue
        )
    }
}

/// The state after giving back `g.units` and its TTL (0 = delete), or `None` when there is
/// nothing to write: no units, absent state, a state of another algorithm, a window that
/// ended, or an algorithm that cannot be leased.
pub fn give_back(
    params: &Params,
    state: Option<&State>,
    g: &GiveBackReq,
) -> Option<(State, Micros)> {
    if g.units == 0 {
        return None;
    }
    match (params, state?) {
        (Params::TokenBucket { rate, burst }, st @ State::TokenBucket { .. }) => {
            let (rate, burst) = (*rate, *burst);
            // Refilled as `evaluate` refills; no remote figure (it is only drained by checks).
            let req = Request {
                now: g.now,
                cost: 0,
                request_id: "",
                remote: Remote::default(),
            };
            let (tokens, ts, seen, used, born) = token_bucket::current(rate, burst, Some(st), &req);
            // `units` past the burst fill it all the same: bounding it keeps the sum exact.
            let scale = rate.scale();
            let tokens = (tokens + g.units.min(burst) * scale).min(burst * scale);
            Some((
                token_bucket::normalize(tokens, ts, (seen, used, born), rate.units()),
                token_bucket::ttl(rate, burst, tokens, seen, used),
            ))
        }
        (
            Params::Gcra { rate, burst },
            State::Gcra {
                tat,
                seen,
                used,
                born,
            },
        ) => {
            let back = g.units.saturating_mul(rate.interval());
            let tat = tat.saturating_sub(back).max(g.now);
            Some((
                State::Gcra {
                    tat,
                    seen: *seen,
                    used: *used,
                    born: *born,
                },
                gcra::ttl(*rate, *burst, tat, g.now, *seen, *used),
            ))
        }
        (Params::FixedWindow { window, .. }, State::FixedWindow { start, count }) => {
            let (taken_in, _) = window.bounds(g.taken_at);
            let (now_in, end) = window.bounds(g.now);
            if *start != taken_in || *start != now_in {
                return None;
            }
            Some((
                State::FixedWindow {
                    start: *start,
                    count: count.saturating_sub(g.units),
                },
                fixed_window::ttl(end, g.now),
            ))
        }
        (Params::SlidingWindow { window, .. }, State::SlidingWindow { start, cur, prev }) => {
            let taken_in = g.taken_at - g.taken_at % window;
            let now_in = g.now - g.now % window;
            if *start != taken_in || *start != now_in {
                return None;
            }
            Some((
                State::SlidingWindow {
                    start: *start,
                    cur: cur.saturating_sub(g.units),
                    prev: *prev,
                },
                sliding_window::ttl(*window, *start, g.now),
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Rate, Window, evaluate, take};
    use super::*;
    use crate::time::SECOND;

    const T0: Micros = 1_800_000_000 * SECOND;

    fn req(now: Micros, cost: u64) -> Request<'static> {
        Request {
            now,
            cost,
            request_id: "",
            remote: Remote::default(),
        }
    }

    fn g(units: u64, taken_at: Micros, now: Micros) -> GiveBackReq {
        GiveBackReq {
            units,
            taken_at,
            now,
        }
    }

    /// Takes `cost` at `t0`, then gives back `units` at `now`; the state after both.
    fn lease(
        p: &Params,
        before: Option<&State>,
        cost: u64,
        units: u64,
        t0: Micros,
        now: Micros,
    ) -> (State, Option<(State, Micros)>) {
        let (taken, _) = take(p, before, &req(t0, cost));
        let back = give_back(p, Some(&taken), &g(units, t0, now));
        (taken, back)
    }

    #[test]
    fn a_fixed_window_gets_its_units_back_within_the_window() {
        let p = Params::FixedWindow {
            limit: 100,
            window: Window::Epoch(60 * SECOND),
        };
        let start = T0 - T0 % (60 * SECOND);
        let (_, back) = lease(&p, None, 10, 7, start + SECOND, start + 2 * SECOND);
        let (st, ttl) = back.expect("the window still holds the units");
        assert_eq!(st, State::FixedWindow { start, count: 3 });
        assert_eq!(ttl, 58 * SECOND, "take's TTL: the window's end");
        assert_eq!(
            evaluate(&p, Some(&st), &req(start + 2 * SECOND, 0)).remaining,
            97
        );
        // More than was counted: down to 0, never below.
        let (_, back) = lease(&p, None, 10, 50, start, start + 1);
        assert_eq!(
            back.expect("written").0,
            State::FixedWindow { start, count: 0 }
        );
        // The window ended: the units expired with it.
        let (_, back) = lease(&p, None, 10, 7, start, start + 60 * SECOND);
        assert_eq!(back, None);
        // A state of a newer window (a lagging clock counted the take there) is not touched.
        let newer = State::FixedWindow {
            start: start + 60 * SECOND,
            count: 10,
        };
        assert_eq!(give_back(&p, Some(&newer), &g(5, start, start + 1)), None);
    }

    #[test]
    fn a_calendar_window_gets_its_units_back_until_local_midnight() {
        let c = super::super::Calendar::new(super::super::CalendarUnit::Day, "Asia/Kolkata")
            .expect("zone exists");
        let p = Params::FixedWindow {
            limit: 10,
            window: Window::Calendar(c.clone()),
        };
        let (start, end) = c.bounds(T0);
        let (_, back) = lease(&p, None, 4, 3, start, end - 1);
        assert_eq!(
            back,
            Some((State::FixedWindow { start, count: 1 }, 1)),
            "a microsecond before the end"
        );
        assert_eq!(lease(&p, None, 4, 3, start, end).1, None);
    }

    #[test]
    fn a_sliding_window_gets_units_back_only_in_the_same_sub_window() {
        let w = 10 * SECOND;
        let p = Params::SlidingWindow {
            limit: 10,
            window: w,
            start: Default::default(),
        };
        let start = T0 - T0 % w;
        let (_, back) = lease(&p, None, 6, 4, start + SECOND, start + 3 * SECOND);
        let (st, ttl) = back.expect("same sub-window");
        assert_eq!(
            st,
            State::SlidingWindow {
                start,
                cur: 2,
                prev: 0
            }
        );
        assert_eq!(ttl, 2 * w - 3 * SECOND);
        // Once the count is the previous window's, it only weighs in: nothing to undo.
        assert_eq!(lease(&p, None, 6, 4, start + SECOND, start + w).1, None);
    }

    #[test]
    fn a_token_bucket_refills_then_takes_the_units_back_capped_at_the_burst() {
        let p = Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 20,
        };
        let (_, back) = lease(&p, None, 10, 4, T0, T0 + 2 * SECOND);
        let (st, ttl) = back.expect("a bucket not full");
        // 10 left, 2 refilled, 4 back.
        assert_eq!(
            evaluate(&p, Some(&st), &req(T0 + 2 * SECOND, 0)).remaining,
            16
        );
        assert_eq!(ttl, 4 * SECOND);
        // Giving back more than fits fills it: full is no key (TTL 0), as `take` says.
        let (_, back) = lease(&p, None, 10, 40, T0, T0 + SECOND);
        let (st, ttl) = back.expect("written");
        assert_eq!(ttl, 0);
        assert_eq!(evaluate(&p, Some(&st), &req(T0 + SECOND, 0)).remaining, 20);
        // Absent state is a full bucket: nothing to give back to.
        assert_eq!(give_back(&p, None, &g(3, T0, T0)), None);
    }

    #[test]
    fn a_shared_bucket_keeps_its_used_and_seen() {
        let p = Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 20,
        };
        let shared = Request {
            remote: Remote::shared_bucket(5, 1),
            ..req(T0, 10)
        };
        let (st, _) = take(&p, None, &shared);
        let (back, ttl) = give_back(&p, Some(&st), &g(10, T0, T0)).expect("written");
        // Full again, but shared: kept one refill period (20 s), not deleted.
        assert_eq!(ttl, 20 * SECOND);
        assert!(
            matches!(
                back,
                State::TokenBucket {
                    seen: 5,
                    used: 10,
                    born,
                    ..
                } if born == T0 / 1000
            ),
            "{back:?}"
        );
        let gp = Params::Gcra {
            rate: Rate::per_second(10),
            burst: 20,
        };
        let (st, _) = take(&gp, None, &shared);
        let (back, ttl) = give_back(&gp, Some(&st), &g(4, T0, T0)).expect("written");
        // The TAT's 0.6 s, then one tolerance (20 intervals of 0.1 s).
        assert_eq!(ttl, 600_000 + 2 * SECOND);
        assert_eq!(
            back,
            State::Gcra {
                tat: T0 + 600_000,
                seen: 5,
                used: 10,
                born: T0 / 1000
            }
        );
    }

    #[test]
    fn gcra_moves_its_tat_back_never_before_now() {
        let p = Params::Gcra {
            rate: Rate::per_second(10),
            burst: 20,
        };
        let (_, back) = lease(&p, None, 10, 3, T0, T0);
        assert_eq!(
            back,
            Some((
                State::Gcra {
                    tat: T0 + 700_000,
                    seen: 0,
                    used: 0,
                    born: 0
                },
                700_000
            ))
        );
        let (_, back) = lease(&p, None, 10, 30, T0, T0 + 1);
        assert_eq!(
            back,
            Some((
                State::Gcra {
                    tat: T0 + 1,
                    seen: 0,
                    used: 0,
                    born: 0
                },
                0
            ))
        );
    }

    #[test]
    fn logs_slots_zero_units_and_foreign_state_write_nothing() {
        let log = Params::SlidingLog {
            limit: 5,
            window: SECOND,
        };
        let (st, _) = take(&log, None, &req(T0, 2));
        assert_eq!(give_back(&log, Some(&st), &g(2, T0, T0)), None);
        let cc = Params::Concurrency {
            limit: 5,
            timeout: SECOND,
        };
        let (st, _) = take(
            &cc,
            None,
            &Request {
                request_id: "a",
                ..req(T0, 2)
            },
        );
        assert_eq!(give_back(&cc, Some(&st), &g(2, T0, T0)), None);
        // The same algorithms as rule validation lets lease.
        for k in [
            Kind::TokenBucket,
            Kind::Gcra,
            Kind::FixedWindow,
            Kind::SlidingWindow,
            Kind::SlidingLog,
            Kind::Concurrency,
        ] {
            assert_eq!(
                k.leasable(),
                crate::hotkeys::lease_refusal(k).is_none(),
                "{k:?}"
            );
        }
        let fw = Params::FixedWindow {
            limit: 5,
            window: Window::Epoch(SECOND),
        };
        let (st, _) = take(&fw, None, &req(T0, 2));
        assert_eq!(give_back(&fw, Some(&st), &g(0, T0, T0)), None);
        let tb = Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 5,
        };
        assert_eq!(give_back(&tb, Some(&st), &g(2, T0, T0)), None);
    }
}
