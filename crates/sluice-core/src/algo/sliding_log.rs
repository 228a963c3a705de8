//! Sliding log: exact, one timestamp per admitted unit; for small limits (login, OTP).

use super::{Outcome, Request, State, probe_cost};
use crate::time::Micros;

/// Entries still inside the window ending at `now` (an entry at t counts while now < t + w).
fn live(window: Micros, state: Option<&State>, now: Micros) -> &[Micros] {
    match state {
        Some(State::SlidingLog { entries }) => {
            let cut = entries.partition_point(|&t| t + window <= now);
            &entries[cut..]
        }
        _ => &[],
    }
}

pub(super) fn evaluate(
    limit: u64,
    window: Micros,
    state: Option<&State>,
    req: &Request<'_>,
) -> Outcome {
    let now = req.now;
    let entries = live(window, state, now);
    let n = entries.len() as u64;
    let probe = probe_cost(req.cost);
    let allowed = n + probe <= limit;
    let after = if allowed { n + req.cost } else { n };
    let retry_after = if allowed {
        0
    } else if probe > limit {
        window
    } else {
        // The oldest (n + probe - limit) entries must age out.
        let k = (n + probe - limit) as usize;
        entries[k - 1] + window - now
    };
    let reset = match (allowed && req.cost > 0, entries.last()) {
        (true, _) => window,
        (false, Some(&last)) => last + window - now,
        (false, None) => 0,
    };
    Outcome {
        allowed,
        limit,
        remaining: limit.saturating_sub(after),
        reset,
        retry_after,
        window,
        usage: after,
    }
}

pub(super) fn take(window: Micros, state: Option<&State>, req: &Request<'_>) -> (State, Micros) {
    let now = req.now;
    let mut entries = live(window, state, now).to_vec();
    // Timestamps stay ascending even if a daemon's clock is behind another's.
    let at = entries.last().map_or(now, |&last| last.max(now));
    entries.extend(std::iter::repeat_n(at, req.cost as usize));
    let ttl = entries.last().map_or(0, |&last| last + window - now);
    (State::SlidingLog { entries }, ttl)
}

#[cfg(test)]
mod tests {
    use super::super::{Params, Remote, evaluate, take};
    use super::*;

    #[test]
    fn exact_at_the_edge() {
        let p = Params::SlidingLog {
            limit: 2,
            window: 1_000,
        };
        let r = |now| Request {
            now,
            cost: 1,
            request_id: "",
            remote: Remote::default(),
        };
        let (s, _) = take(&p, None, &r(0));
        let (s, _) = take(&p, Some(&s), &r(500));
        let o = evaluate(&p, Some(&s), &r(999));
        assert!(!o.allowed);
        assert_eq!(o.retry_after, 1);
        assert!(evaluate(&p, Some(&s), &r(1_000)).allowed);
    }
}
