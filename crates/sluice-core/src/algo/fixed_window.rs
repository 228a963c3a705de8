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

pub(super) fn evaluate(
    limit: u64,
    window: &Window,
    state: Option<&State>,
    req: &Request<'_>,
) -> Outcome {
    let (start, end) = window.bounds(req.now);
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
        reset: end - req.now,
        retry_after: if allowed { 0 } else { end - req.now },
        window: window.nominal(),
        usage: local_after,
    }
}

pub(super) fn take(window: &Window, state: Option<&State>, req: &Request<'_>) -> (State, Micros) {
    let (start, end) = window.bounds(req.now);
    let count = count(start, state) + req.cost;
    (State::FixedWindow { start, count }, end - req.now)
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
}
