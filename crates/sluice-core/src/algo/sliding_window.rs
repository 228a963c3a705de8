//! Sliding window counter (Cloudflare's estimate): the current window's count plus the
//! previous window's, weighted by how much of it the sliding window still covers.
//!
//! The weight is taken in whole milliseconds so the products stay below 2^53: the estimate is
//! `prev·rem_ms + cur·w_ms ≤ limit·w_ms`, all integers, identical in Lua.

use super::{Outcome, Request, State, WindowStart, probe_cost};
use crate::time::{MILLI, Micros};

/// Local (cur, prev) counts for the window starting at `start`.
fn counts(start: Micros, window: Micros, state: Option<&State>) -> (u64, u64) {
    match state {
        Some(State::SlidingWindow {
            start: s,
            cur,
            prev,
        }) if *s == start => (*cur, *prev),
        Some(State::SlidingWindow { start: s, cur, .. }) if *s + window == start => (0, *cur),
        _ => (0, 0),
    }
}

/// The start of the window `now` counts in, and its local (cur, prev) counts. Epoch windows
/// are `now`'s epoch-aligned one. A `first_request` window starts at the stored start while
/// it lasts and at the window after it (the stored count then weighs as the previous one);
/// once both have ended, or on a fresh key, at `now`: a state past its TTL decides as an
/// absent one (see `fixed_window::key_bounds`).
fn window_of(
    window: Micros,
    mode: WindowStart,
    state: Option<&State>,
    now: Micros,
) -> (Micros, u64, u64) {
    if mode == WindowStart::Epoch {
        let start = now - now % window;
        let (cur, prev) = counts(start, window, state);
        return (start, cur, prev);
    }
    match state {
        Some(State::SlidingWindow { start, cur, prev }) if now < start.saturating_add(window) => {
            (*start, *cur, *prev)
        }
        Some(State::SlidingWindow { start, cur, .. }) if now < start.saturating_add(2 * window) => {
            (start + window, 0, *cur)
        }
        _ => (now, 0, 0),
    }
}

/// Smallest wait after which `floor((w_us - elapsed - wait)/1000) <= r_ms`.
fn wait_until_rem(window: Micros, elapsed: Micros, r_ms: u64) -> Micros {
    (window - elapsed).saturating_sub((r_ms + 1) * MILLI - 1)
}

/// How long the counts of the window starting at `start` stay meaningful at `now` (their
/// store TTL): until the window after it ends, the last one they weigh in. The one expiry
/// rule of a sliding window (`take`, `give_back`).
pub(super) fn ttl(window: Micros, start: Micros, now: Micros) -> Micros {
    2 * window - (now - start)
}

/// `now`, or the start of the newer window the state already belongs to (see
/// `fixed_window::effective_now`: a late request never resets a newer window).
fn effective_now(state: Option<&State>, now: Micros) -> Micros {
    match state {
        Some(State::SlidingWindow { start, .. }) => now.max(*start),
        _ => now,
    }
}

pub(super) fn evaluate(
    limit: u64,
    window: Micros,
    mode: WindowStart,
    state: Option<&State>,
    req: &Request<'_>,
) -> Outcome {
    let now = effective_now(state, req.now);
    let (start, lcur, lprev) = window_of(window, mode, state, now);
    let elapsed = now - start;
    let w_ms = window / MILLI;
    let rem_ms = (window - elapsed) / MILLI;
    let cur = lcur + req.remote.cur;
    let prev = lprev + req.remote.prev;
    let probe = probe_cost(req.cost);
    let budget = limit * w_ms;
    let allowed = prev * rem_ms + (cur + probe) * w_ms <= budget;
    let cur_after = if allowed { cur + req.cost } else { cur };
    let remaining = (budget.saturating_sub(prev * rem_ms) / w_ms).saturating_sub(cur_after);
    let retry_after = if allowed {
        0
    } else if probe > limit {
        2 * window - elapsed
    } else if cur + probe <= limit {
        // Within this window, once the previous window's weight has shrunk enough.
        let r = (limit - cur - probe) * w_ms / prev;
        wait_until_rem(window, elapsed, r)
    } else {
        // Next window: the current count becomes the weighted one.
        let to_next = window - elapsed;
        let r = (limit - probe) * w_ms / cur;
        if r >= w_ms {
            to_next
        } else {
            to_next + wait_until_rem(window, 0, r)
        }
    };
    Outcome {
        allowed,
        limit,
        remaining,
        reset: window - elapsed,
        retry_after,
        window,
        usage: if allowed { lcur + req.cost } else { lcur },
        generation: 0,
    }
}

pub(super) fn take(
    window: Micros,
    mode: WindowStart,
    state: Option<&State>,
    req: &Request<'_>,
) -> (State, Micros) {
    let now = effective_now(state, req.now);
    let (start, cur, prev) = window_of(window, mode, state, now);
    (
        State::SlidingWindow {
            start,
            cur: cur + req.cost,
            prev,
        },
        ttl(window, start, now),
    )
}

#[cfg(test)]
mod tests {
    use super::super::{Params, Remote, evaluate, take};
    use super::*;
    use crate::time::SECOND;

    #[test]
    fn previous_window_weighs_in() {
        let p = Params::SlidingWindow {
            limit: 10,
            window: 10 * SECOND,
            start: WindowStart::Epoch,
        };
        let r = |now| Request {
            now,
            cost: 1,
            request_id: "",
            remote: Remote::default(),
        };
        let mut st = None;
        for _ in 0..10 {
            st = Some(take(&p, st.as_ref(), &r(5 * SECOND)).0);
        }
        // Halfway through the next window, half of the previous 10 still count.
        let o = evaluate(&p, st.as_ref(), &r(15 * SECOND));
        assert!(o.allowed);
        assert_eq!(o.remaining, 4);
        let o = evaluate(&p, st.as_ref(), &r(10 * SECOND));
        assert!(!o.allowed);
        assert!(evaluate(&p, st.as_ref(), &r(10 * SECOND + o.retry_after)).allowed);
        assert!(!evaluate(&p, st.as_ref(), &r(10 * SECOND + o.retry_after - 1)).allowed);
    }

    #[test]
    fn a_late_request_does_not_reset_the_newer_window() {
        let p = Params::SlidingWindow {
            limit: 2,
            window: SECOND,
            start: WindowStart::Epoch,
        };
        let r = |now| Request {
            now,
            cost: 1,
            request_id: "",
            remote: Remote::default(),
        };
        let (s, _) = take(&p, None, &r(SECOND + 10));
        let (s, _) = take(&p, Some(&s), &r(SECOND - 300));
        assert!(matches!(
            s,
            State::SlidingWindow {
                start: SECOND,
                cur: 2,
                ..
            }
        ));
        assert!(!evaluate(&p, Some(&s), &r(SECOND + 20)).allowed);
    }
}
