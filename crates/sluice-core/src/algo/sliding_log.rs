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
        generation: 0,
    }
}

pub(super) fn take(
    limit: u64,
    window: Micros,
    state: Option<&State>,
    req: &Request<'_>,
) -> (State, Micros) {
    let now = req.now;
    let mut entries = live(window, state, now).to_vec();
    // Timestamps stay ascending even if a daemon's clock is behind another's.
    let at = entries.last().map_or(now, |&last| last.max(now));
    // Only the newest `limit` entries can ever decide: a request fits once the oldest
    // (n + cost - limit) live entries age out, which is the (cost)-th oldest of the newest
    // `limit`. Keeping no more bounds the log (a charged refusal of cost 10^9 would otherwise
    // append 10^9 entries) and changes no decision; only `usage` then reads `limit` at most.
    let keep = usize::try_from(limit).unwrap_or(usize::MAX);
    let added = usize::try_from(req.cost).unwrap_or(usize::MAX).min(keep);
    entries.extend(std::iter::repeat_n(at, added));
    if entries.len() > keep {
        entries.drain(..entries.len() - keep);
    }
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

    #[test]
    fn a_charged_refusal_keeps_the_log_bounded_and_decides_the_same() {
        let p = Params::SlidingLog {
            limit: 3,
            window: 1_000,
        };
        let r = |now, cost| Request {
            now,
            cost,
            request_id: "",
            remote: Remote::default(),
        };
        let (s, _) = take(&p, None, &r(0, 2));
        // A refused request of cost 10^9 that is charged anyway.
        let (s, ttl) = take(&p, Some(&s), &r(10, 1_000_000_000));
        assert_eq!(
            s,
            State::SlidingLog {
                entries: vec![10, 10, 10]
            }
        );
        assert_eq!(ttl, 1_000);
        let o = evaluate(&p, Some(&s), &r(20, 1));
        assert!(!o.allowed);
        assert_eq!((o.remaining, o.retry_after, o.reset), (0, 990, 990));
        assert!(evaluate(&p, Some(&s), &r(1_010, 3)).allowed);
    }
}
