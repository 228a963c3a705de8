//! Fixed window: a count per window, aligned on the epoch (or a calendar), so every region
//! and every daemon agrees on which window a request falls in.

use super::{Outcome, Request, State, Window, probe_cost};
use crate::time::Micros;

/// This window's local count (zero if the state is from an older window).
fn count(start: Micros, state: Option<&State>) -> u64 {
    match state {
        Some(State::FixedWindow { start: s, count }) if *s == start => *count,
        _ => 0,
    }
}

/// How long a window's count stays meaningful at `now` (its store TTL): until the window
/// ending at `end` ends. The one expiry rule of a fixed window (`take`, `give_back`).
pub(super) fn ttl(end: Micros, now: Micros) -> Micros {
    end - now
}

/// `now`, or the start of the newer window the state already belongs to. Two threads of one
/// daemon can cross a window boundary in either order; a late request must not reset the
/// newer window's count, so it is counted in that window (conservative: never over-admits).
/// Redis keeps one key per window start, where a late request counts in its own window.
fn effective_now(state: Option<&State>, now: Micros) -> Micros {
    match state {
        Some(State::FixedWindow { start, .. }) => now.max(*start),
        _ => now,
    }
}

/// `[start, end)` of the window `now` counts in for this key. Epoch and calendar windows
/// are a function of `now`; a `first_request` window (`Window::FirstRequest`) starts at the
/// stored window's start while that window lasts, and at `now` once it has ended or when the
/// key is fresh: the key's next request after a window starts the next one. Why not carry
/// the origin on past an ended window: its count is gone, and a state kept beyond its TTL
/// (Redis keeps keys a little longer for late calls) must decide as an absent one does.
pub fn key_bounds(window: &Window, state: Option<&State>, now: Micros) -> (Micros, Micros) {
    match (window, state) {
        (Window::FirstRequest(len), Some(State::FixedWindow { start, .. }))
            if now < start.saturating_add(*len) =>
        {
            (*start, start + len)
        }
        (Window::FirstRequest(len), _) => (now, now + len),
        _ => window.bounds(now),
    }
}

pub(super) fn evaluate(
    limit: u64,
    window: &Window,
    state: Option<&State>,
    req: &Request<'_>,
) -> Outcome {
    let now = effective_now(state, req.now);
    let (start, end) = key_bounds(window, state, now);
    let local = count(start, state);
    let used = local + req.remote.cur;
    let allowed = used + probe_cost(req.cost) <= limit;
    let (used_after, local_after) = if allowed {
        (used + req.cost, local + req.cost)
    } else {
        (used, local)
    };
    Outcome {
        allowed,
        limit,
        remaining: limit.saturating_sub(used_after),
        reset: end - now,
        retry_after: if allowed { 0 } else { end - now },
        window: window.nominal(),
        usage: local_after,
        generation: 0,
    }
}

pub(super) fn take(window: &Window, state: Option<&State>, req: &Request<'_>) -> (State, Micros) {
    let now = effective_now(state, req.now);
    let (start, end) = key_bounds(window, state, now);
    let count = count(start, state) + req.cost;
    (State::FixedWindow { start, count }, ttl(end, now))
}

#[cfg(test)]
mod tests {
    use super::super::{Params, Remote, evaluate, take};
    use super::*;
    use crate::time::SECOND;

    #[test]
    fn counts_reset_on_the_boundary_and_remote_counts_add() {
        let p = Params::FixedWindow {
            limit: 3,
            window: Window::Epoch(60 * SECOND),
        };
        let r = |now, remote| Request {
            now,
            cost: 1,
            request_id: "",
            remote: Remote {
                cur: remote,
                prev: 0,
            },
        };
        let mut st = None;
        for _ in 0..3 {
            assert!(evaluate(&p, st.as_ref(), &r(61 * SECOND, 0)).allowed);
            st = Some(take(&p, st.as_ref(), &r(61 * SECOND, 0)).0);
        }
        let o = evaluate(&p, st.as_ref(), &r(61 * SECOND, 0));
        assert!(!o.allowed);
        assert_eq!(o.retry_after, 59 * SECOND);
        assert!(evaluate(&p, st.as_ref(), &r(120 * SECOND, 0)).allowed);
        assert!(!evaluate(&p, None, &r(0, 3)).allowed);
        assert!(evaluate(&p, None, &r(0, 2)).allowed);
    }

    #[test]
    fn a_late_request_does_not_reset_the_newer_window() {
        // Found by the simulator: a call 300 µs behind, after the boundary, re-granted the limit.
        let p = Params::FixedWindow {
            limit: 2,
            window: Window::Epoch(SECOND),
        };
        let r = |now| Request {
            now,
            cost: 1,
            request_id: "",
            remote: Remote::default(),
        };
        let (s, _) = take(&p, None, &r(SECOND + 10));
        let (s, _) = take(&p, Some(&s), &r(SECOND - 300));
        assert_eq!(
            s,
            State::FixedWindow {
                start: SECOND,
                count: 2
            }
        );
        assert!(!evaluate(&p, Some(&s), &r(SECOND + 20)).allowed);
    }
}
