//! Leaky queue: shaping instead of refusing. A request is admitted with a delay, the time it
//! must wait so that the key's requests leave exactly at the rate, unless that wait would be
//! longer than `max_delay`.
//!
//! Why one timestamp: like GCRA's theoretical arrival time, the state is `tat`, the next free
//! departure (epoch µs). A request of cost `c` at `now` departs at `max(now, tat)` and holds
//! the queue for `c` intervals after it; a refusal moves nothing. The interval is
//! [`Rate::interval`], rounded up to a whole µs, so departures never come faster than the rate.

use super::{MAX_USED, Outcome, Rate, Request, State, probe_cost};
use crate::time::Micros;

/// The next free departure at `now`: the stored one, or `now` when the queue is empty.
fn departure(state: Option<&State>, now: Micros) -> Micros {
    match state {
        Some(State::LeakyQueue { tat }) => (*tat).max(now),
        _ => now,
    }
}

/// When `cost` units leaving at `depart` free the queue, saturating at 2^53 − 1 (Lua's exact
/// range; only a cost far beyond any real rule reaches it).
fn held_until(depart: Micros, cost: u64, t: Micros) -> Micros {
    depart.saturating_add(cost.saturating_mul(t)).min(MAX_USED)
}

/// Unit requests that may still queue behind a departure `ahead` µs away: every one whose own
/// wait stays within `max_delay`. 0 when even the next one would wait too long.
fn room(t: Micros, max_delay: Micros, ahead: Micros) -> u64 {
    if ahead > max_delay {
        0
    } else {
        (max_delay - ahead) / t + 1
    }
}

/// Unit requests an empty queue admits at once (its `q`): the one leaving now and every one
/// that waits at most `max_delay`.
pub(crate) fn capacity(rate: Rate, max_delay: Micros) -> u64 {
    room(rate.interval(), max_delay, 0)
}

pub(super) fn evaluate(
    rate: Rate,
    max_delay: Micros,
    state: Option<&State>,
    req: &Request<'_>,
) -> Outcome {
    let t = rate.interval();
    let now = req.now;
    let depart = departure(state, now);
    let delay = depart - now;
    let limit = capacity(rate, max_delay);
    let window = rate.per();
    if delay <= max_delay {
        let after = held_until(depart, probe_cost(req.cost), t);
        // A peek reports as if for one unit and takes nothing.
        let held = if req.cost == 0 { depart } else { after };
        let remaining = room(t, max_delay, held - now);
        Outcome {
            allowed: true,
            limit,
            remaining,
            reset: held - now,
            // Allowed: the wait before the request may leave (see `Outcome::delay`).
            retry_after: delay,
            window,
            usage: limit - remaining.min(limit),
            generation: 0,
        }
    } else {
        Outcome {
            allowed: false,
            limit,
            remaining: 0,
            reset: delay,
            retry_after: delay - max_delay,
            window,
            usage: limit,
            generation: 0,
        }
    }
}

pub(super) fn take(
    rate: Rate,
    _max_delay: Micros,
    state: Option<&State>,
    req: &Request<'_>,
) -> (State, Micros) {
    let tat = held_until(departure(state, req.now), req.cost, rate.interval());
    // Meaningful until the queue is empty again: past `tat` absent state says the same.
    (State::LeakyQueue { tat }, tat - req.now)
}

/// Makes every shaping queue of `call` refuse a request that would have to wait (its
/// `max_delay` 0): for a caller that cannot wait (Envoy's rate limit service has no delay in
/// its answer). Such a refusal moves nothing, like any other, and its retry time is the wait.
pub fn without_waiting(call: &mut crate::batch::Call) {
    for item in &mut call.items {
        if let super::Params::LeakyQueue { max_delay, .. } = &mut item.params {
            *max_delay = 0;
        }
    }
}

#[cfg(test)]
#[path = "leaky_queue_proptests.rs"]
mod proptests;

#[cfg(test)]
mod tests {
    use super::super::{Params, Remote, evaluate, take};
    use super::*;
    use crate::time::{MILLI, SECOND};

    fn req(now: Micros, cost: u64) -> Request<'static> {
        Request {
            now,
            cost,
            request_id: "",
            remote: Remote::default(),
        }
    }

    #[test]
    fn waits_grow_by_one_interval_until_max_delay() {
        let p = Params::LeakyQueue {
            rate: Rate::per_second(100),
            max_delay: 20 * MILLI,
        };
        let mut st = None;
        let mut delays = Vec::new();
        for _ in 0..3 {
            let o = evaluate(&p, st.as_ref(), &req(0, 1));
            assert!(o.allowed);
            delays.push(o.delay());
            st = Some(take(&p, st.as_ref(), &req(0, 1)).0);
        }
        assert_eq!(delays, vec![0, 10 * MILLI, 20 * MILLI]);
        let o = evaluate(&p, st.as_ref(), &req(0, 1));
        assert!(!o.allowed);
        assert_eq!(o.retry_after, 10 * MILLI);
        assert_eq!(o.delay(), 0);
        // An idle second empties the queue; its key's TTL said so.
        assert_eq!(take(&p, None, &req(0, 1)).1, 10 * MILLI);
        assert_eq!(evaluate(&p, st.as_ref(), &req(SECOND, 2)).delay(), 0);
    }

    #[test]
    fn without_waiting_only_an_empty_queue_admits() {
        let p = Params::LeakyQueue {
            rate: Rate::per_second(100),
            max_delay: 0,
        };
        let o = evaluate(&p, None, &req(0, 1));
        assert!(o.allowed && o.delay() == 0);
        let st = take(&p, None, &req(0, 1)).0;
        let o = evaluate(&p, Some(&st), &req(4 * MILLI, 1));
        assert!(!o.allowed);
        assert_eq!(o.retry_after, 6 * MILLI);
        assert!(evaluate(&p, Some(&st), &req(10 * MILLI, 1)).allowed);
    }

    /// A caller that cannot wait gets no delay from a daemon's local queue either: when the
    /// store fails, the local fallback runs the call `without_waiting` already changed.
    #[test]
    fn the_local_fallback_of_a_call_without_waiting_does_not_wait() {
        let set = crate::rules::parse_yaml(
            "domain: sms\nrules:\n  - { id: q, key: [user], algorithm: leaky_queue, rate_per_s: 50, max_delay: 2s, on_store_failure: local }\n",
        )
        .expect("valid rules");
        let dom = set.domain("sms").expect("domain");
        let d = crate::matching::desc(&[("user", "u")]);
        let mut p = crate::decision::plan(dom, &d, SECOND, 1, "r", |_| Remote::default());
        let max_delay = |c: &crate::batch::Call| match c.items[0].params {
            Params::LeakyQueue { max_delay, .. } => max_delay,
            ref other => panic!("{other:?}"),
        };
        let local = p.fallback(0, 500).expect("a local rule");
        assert_eq!(max_delay(&local), 2 * SECOND, "one that can wait, waits");
        without_waiting(&mut p.calls[0].call);
        let local = p.fallback(0, 500).expect("a local rule");
        assert_eq!(max_delay(&local), 0);
        // Its queue at half the rate: a second request at once is refused, not delayed.
        let st = take(&local.items[0].params, None, &req(SECOND, 1)).0;
        let o = evaluate(&local.items[0].params, Some(&st), &req(SECOND, 1));
        assert!(!o.allowed && o.delay() == 0, "{o:?}");
    }
}
