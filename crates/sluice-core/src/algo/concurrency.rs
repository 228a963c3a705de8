//! Concurrency: in-flight slots. A slot is held from check to release, or until its expiry so
//! a crashed caller cannot leak it.

use super::{Outcome, Request, State, probe_cost};
use crate::time::Micros;

/// Slots not yet expired at `now`.
fn live(state: Option<&State>, now: Micros) -> impl Iterator<Item = &(String, Micros, u64)> {
    let slots: &[(String, Micros, u64)] = match state {
        Some(State::Concurrency { slots }) => slots,
        _ => &[],
    };
    slots.iter().filter(move |(_, exp, _)| *exp > now)
}

pub(super) fn evaluate(
    limit: u64,
    timeout: Micros,
    state: Option<&State>,
    req: &Request<'_>,
) -> Outcome {
    let now = req.now;
    // A repeated id renews its own slot rather than taking another.
    let held: u64 = live(state, now)
        .filter(|(id, _, _)| id != req.request_id)
        .map(|(_, _, c)| c)
        .sum();
    let probe = probe_cost(req.cost);
    let allowed = held + probe <= limit;
    let after = if allowed { held + req.cost } else { held };
    let retry_after = if allowed {
        0
    } else if probe > limit {
        timeout
    } else {
        let mut expiries: Vec<(Micros, u64)> = live(state, now)
            .filter(|(id, _, _)| id != req.request_id)
            .map(|(_, e, c)| (*e, *c))
            .collect();
        expiries.sort_unstable();
        let mut need = held + probe - limit;
        let mut wait = timeout;
        for (e, c) in expiries {
            if c >= need {
                wait = e - now;
                break;
            }
            need -= c;
        }
        wait
    };
    Outcome {
        allowed,
        limit,
        remaining: limit.saturating_sub(after),
        reset: timeout,
        retry_after,
        window: timeout,
        usage: after,
        generation: 0,
    }
}

pub(super) fn take(timeout: Micros, state: Option<&State>, req: &Request<'_>) -> (State, Micros) {
    let now = req.now;
    let mut slots: Vec<(String, Micros, u64)> = live(state, now)
        .filter(|(id, _, _)| id != req.request_id)
        .cloned()
        .collect();
    if req.cost > 0 {
        slots.push((req.request_id.to_string(), now + timeout, req.cost));
    }
    let ttl = slots.iter().map(|(_, e, _)| e - now).max().unwrap_or(0);
    (State::Concurrency { slots }, ttl)
}

pub(super) fn release(
    state: Option<&State>,
    request_id: &str,
    now: Micros,
) -> (Option<State>, bool) {
    let before: Vec<&(String, Micros, u64)> = live(state, now).collect();
    let slots: Vec<(String, Micros, u64)> = before
        .iter()
        .filter(|(id, _, _)| id != request_id)
        .map(|s| (*s).clone())
        .collect();
    let released = slots.len() != before.len();
    let next = if slots.is_empty() {
        None
    } else {
        Some(State::Concurrency { slots })
    };
    (next, released)
}

#[cfg(test)]
mod tests {
    use super::super::{Params, Remote, evaluate, release, take};
    use super::*;

    #[test]
    fn slots_are_held_released_and_expire() {
        let p = Params::Concurrency {
            limit: 2,
            timeout: 1_000,
        };
        let r = |now, id| Request {
            now,
            cost: 1,
            request_id: id,
            remote: Remote::default(),
        };
        let (s, _) = take(&p, None, &r(0, "a"));
        let (s, _) = take(&p, Some(&s), &r(10, "b"));
        let o = evaluate(&p, Some(&s), &r(20, "c"));
        assert!(!o.allowed);
        assert_eq!(o.retry_after, 980);
        let (s, freed) = release(Some(&s), "a", 30);
        assert!(freed);
        assert!(evaluate(&p, s.as_ref(), &r(30, "c")).allowed);
        let (_, freed) = release(s.as_ref(), "zz", 30);
        assert!(!freed);
        assert!(evaluate(&p, s.as_ref(), &r(1_010, "c")).allowed);
    }
}
