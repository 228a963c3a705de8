//! `window_start: first_request` held to its definition over random request sequences, for
//! fixed and sliding windows: each key's windows are `[origin, origin + len)` from its own
//! first request, a window that ended gives way to the one after it (a sliding window's
//! next, while its count still weighs) or to one starting at the key's next request, and
//! epoch windows decide as their definition says, as before.

use super::*;
use crate::time::{MILLI, SECOND};
use proptest::prelude::*;

const T0: Micros = 1_800_000_000 * SECOND;

fn req(now: Micros, cost: u64) -> Request<'static> {
    Request {
        now,
        cost,
        request_id: "",
        remote: Remote::default(),
    }
}

/// (gap before the request in µs, cost): bursts, and gaps past a window now and then.
fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![
                3 => Just(0u64),
                3 => 0u64..2_000,
                2 => 0u64..3 * SECOND,
                1 => 0u64..12 * SECOND,
            ],
            prop_oneof![4 => 1u64..2, 1 => Just(0u64), 2 => 2u64..6],
        ),
        1..150,
    )
}

/// One key driven as a store drives it: a state read only while its TTL lasts (or, with
/// `linger`, kept on past it, as Redis keeps keys a little longer for late calls), and the
/// take of an admitted (or, `charged`, refused) request written back.
struct Key {
    params: Params,
    state: Option<State>,
    expires: Micros,
    linger: bool,
    charged: bool,
}

impl Key {
    fn new(params: Params) -> Key {
        Key {
            params,
            state: None,
            expires: 0,
            linger: false,
            charged: false,
        }
    }

    fn visible(&self, now: Micros) -> Option<&State> {
        self.state
            .as_ref()
            .filter(|_| self.linger || now < self.expires)
    }

    fn call(&mut self, now: Micros, cost: u64) -> Outcome {
        let r = req(now, cost);
        let o = evaluate(&self.params, self.visible(now), &r);
        if cost > 0 && (o.allowed || self.charged) {
            let (st, ttl) = take(&self.params, self.visible(now), &r);
            self.state = Some(st);
            self.expires = now + ttl;
        }
        o
    }

    /// The start of the window the key's live state counts, at `now`.
    fn start(&self, now: Micros) -> Option<Micros> {
        match self.visible(now) {
            Some(State::FixedWindow { start, .. } | State::SlidingWindow { start, .. }) => {
                Some(*start)
            }
            _ => None,
        }
    }
}

fn first_request(limit: u64, len: Micros) -> Params {
    Params::FixedWindow {
        limit,
        window: Window::FirstRequest(len),
    }
}

/// A first-request window of either kind: fixed, or sliding (whole milliseconds).
fn own_window(sliding: bool, limit: u64, len: Micros) -> Params {
    if sliding {
        Params::SlidingWindow {
            limit,
            window: len,
            start: WindowStart::FirstRequest,
        }
    } else {
        first_request(limit, len)
    }
}

/// The epoch fixed window by its definition: `limit` units per `[k·len, (k + 1)·len)`,
/// the window's end as reset and refusal's wait.
fn epoch_reference(limit: u64, len: Micros, times: &[(Micros, u64)]) -> Vec<(bool, u64, u64)> {
    let mut held: Option<(Micros, u64)> = None;
    let mut out = Vec::new();
    for &(now, cost) in times {
        let start = now - now % len;
        let count = match held {
            Some((s, c)) if s == start => c,
            _ => 0,
        };
        let allowed = count + cost.max(1) <= limit;
        if allowed && cost > 0 {
            held = Some((start, count + cost));
        }
        let after = if allowed { count + cost } else { count };
        out.push((allowed, limit.saturating_sub(after), start + len - now));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// In every window of the key's own alignment the admitted units never exceed the limit;
    /// each admission lies inside the window it was counted in; a key's windows never
    /// overlap; and a refusal's wait is exact: the same request fits at `now + retry_after`
    /// (nothing else happening) and not a microsecond before.
    #[test]
    fn a_keys_own_windows_hold_the_limit(
        sliding in any::<bool>(),
        limit in 1u64..20,
        len_ms in 1u64..5_000,
        charged in any::<bool>(),
        first in 0u64..10 * SECOND,
        steps in steps(),
    ) {
        let len = len_ms * MILLI;
        let mut key = Key::new(own_window(sliding, limit, len));
        key.charged = charged;
        let mut now = T0 + first;
        let mut per_window: std::collections::BTreeMap<Micros, u64> = Default::default();
        let mut last_start: Option<Micros> = None;
        for (gap, cost) in steps {
            now += gap;
            let before = key.clone_state();
            let o = key.call(now, cost);
            // The window this request counted in, from its reset: [s, s + len) holds now.
            prop_assert!(o.reset > 0 && o.reset <= len, "reset {}", o.reset);
            let s = now + o.reset - len;
            // A window is the key's once a request is counted in it (a peek or a refusal
            // on a fresh key writes nothing: the next request starts its own).
            if cost > 0 && (o.allowed || charged) {
                prop_assert_eq!(key.start(now), Some(s), "the state holds the window's start");
                if let Some(p) = last_start
                    && p != s
                {
                    prop_assert!(s >= p + len, "windows overlap: {p} then {s}");
                }
                last_start = Some(s);
                if o.allowed {
                    *per_window.entry(s).or_default() += cost;
                }
            }
            if !o.allowed && cost.max(1) <= limit {
                let mut probe = Key::new(key.params.clone());
                (probe.state, probe.expires) = before;
                let at = now + o.retry_after;
                prop_assert!(evaluate(&probe.params, probe.visible(at), &req(at, cost)).allowed);
                let early = at - 1;
                if !sliding {
                    prop_assert!(!evaluate(&probe.params, probe.visible(early), &req(early, cost)).allowed);
                }
            }
        }
        for (s, n) in per_window {
            prop_assert!(n <= limit, "{n} admitted in the window from {s}");
        }
    }

    /// Two keys whose first requests are `offset` apart, each then seeing the same gaps and
    /// costs, decide alike, and their windows differ by exactly that offset.
    #[test]
    fn windows_move_with_the_first_request(
        sliding in any::<bool>(),
        limit in 1u64..20,
        len_ms in 1u64..5_000,
        offset in 0u64..100 * SECOND,
        steps in steps(),
    ) {
        let len = len_ms * MILLI;
        let p = own_window(sliding, limit, len);
        let (mut a, mut b) = (Key::new(p.clone()), Key::new(p));
        let (mut ta, mut tb) = (T0, T0 + offset);
        for (gap, cost) in steps {
            ta += gap;
            tb += gap;
            prop_assert_eq!(a.call(ta, cost), b.call(tb, cost));
            match (a.start(ta), b.start(tb)) {
                (Some(sa), Some(sb)) => prop_assert_eq!(sb - sa, offset),
                (sa, sb) => prop_assert_eq!(sa, sb),
            }
        }
    }

    /// A state kept on past its TTL (Redis keeps keys a little longer, for late calls)
    /// decides as an absent one: every outcome and every window alike.
    #[test]
    fn a_state_past_its_ttl_decides_as_none(
        sliding in any::<bool>(),
        limit in 1u64..20,
        len_ms in 1u64..5_000,
        steps in steps(),
    ) {
        let len = len_ms * MILLI;
        let p = own_window(sliding, limit, len);
        let (mut gone, mut kept) = (Key::new(p.clone()), Key::new(p));
        kept.linger = true;
        let mut now = T0;
        for (gap, cost) in steps {
            now += gap;
            prop_assert_eq!(gone.call(now, cost), kept.call(now, cost));
            prop_assert_eq!(&gone.state, &kept.state);
        }
    }

    /// Epoch windows are unchanged: the same decisions, remaining units and resets as their
    /// definition gives, for the same inputs.
    #[test]
    fn epoch_windows_decide_by_their_definition(
        limit in 1u64..20,
        len_ms in 1u64..5_000,
        steps in steps(),
    ) {
        let len = len_ms * MILLI;
        let mut key = Key::new(Params::FixedWindow { limit, window: Window::Epoch(len) });
        let mut now = T0;
        let mut times = Vec::new();
        let mut got = Vec::new();
        for (gap, cost) in steps {
            now += gap;
            times.push((now, cost));
            let o = key.call(now, cost);
            got.push((o.allowed, o.remaining, o.reset));
        }
        prop_assert_eq!(got, epoch_reference(limit, len, &times));
    }
}

impl Key {
    /// The state and its expiry as they stand, to try a request against them later.
    fn clone_state(&self) -> (Option<State>, Micros) {
        (self.state.clone(), self.expires)
    }
}

#[test]
fn a_refused_key_comes_back_at_its_own_window_end() {
    let len = 60 * SECOND;
    let mut key = Key::new(first_request(2, len));
    let first = T0 + 17 * SECOND + 3;
    assert!(key.call(first, 1).allowed);
    assert!(key.call(first + SECOND, 1).allowed);
    let refused = key.call(first + 2 * SECOND, 1);
    assert!(!refused.allowed);
    // The key's own window ends 60 s after its first request, not at the minute.
    assert_eq!(refused.retry_after, len - 2 * SECOND);
    assert_eq!(refused.reset, refused.retry_after);
    assert!(!key.call(first + len - 1, 1).allowed);
    let back = key.call(first + len, 1);
    assert!(back.allowed);
    assert_eq!(key.start(first + len), Some(first + len));
    // A request after a quiet spell starts its window at its own time.
    let late = first + 5 * len + 123;
    assert!(key.call(late, 2).allowed);
    assert_eq!(key.start(late), Some(late));
    assert!(!key.call(late + len - 1, 1).allowed);
}

#[test]
fn a_request_behind_the_stored_start_counts_in_that_window() {
    let len = SECOND;
    let p = first_request(2, len);
    let (s, _) = take(&p, None, &req(T0 + 10, 1));
    let (s, ttl) = take(&p, Some(&s), &req(T0 - 300, 1));
    assert_eq!(
        s,
        State::FixedWindow {
            start: T0 + 10,
            count: 2
        }
    );
    assert_eq!(ttl, len);
    assert!(!evaluate(&p, Some(&s), &req(T0 + 20, 1)).allowed);
}
