//! The store contract: one identity's rules checked together and taken together.
//!
//! A request refused by the daily quota must not burn a burst token, so every rule of an
//! identity is evaluated first, and only then are the admitted costs taken from all of them.
//! [`apply`] is that step as a pure function over the states; the memory store runs it under a
//! shard lock, the simulator runs it directly, and `lua/check.lua` is its transcription for
//! Redis, held to it by the differential test.

use crate::algo::{self, GiveBackReq, Outcome, Params, Remote, Request, State};
use crate::time::Micros;
use std::borrow::Cow;

/// One rule's part of an identity's check.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Store key (see [`crate::matching::store_key`]).
    pub key: String,
    /// Effective numbers (after overrides).
    pub params: Params,
    /// `false` for shadow rules: counted as if enforced, never refusing.
    pub enforce: bool,
    /// Refused requests still cost quota.
    pub charge_rejected: bool,
    /// Other regions' counts, for global rules.
    pub remote: Remote,
}

/// One atomic store call: every rule of one identity.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// Now, epoch microseconds.
    pub now: Micros,
    /// Units asked for (0 = peek).
    pub cost: u64,
    /// Id for concurrency slots.
    pub request_id: String,
    /// The rules, in decision order.
    pub items: Vec<Item>,
}

/// What the store answers for a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallResult {
    /// Every enforced item allowed.
    pub allowed: bool,
    /// One outcome per item, in order.
    pub outcomes: Vec<Outcome>,
}

/// Units a lease took and did not spend, handed back to the store (token leasing,
/// [`crate::hotkeys::lease`]): a lease's units left the shared count before they were spent,
/// so what is left must return or it is stranded.
#[derive(Clone, Debug, PartialEq)]
pub struct GiveBack {
    /// Store key the units were taken from.
    pub key: String,
    /// The rule's numbers when they were taken.
    pub params: Params,
    /// Units to give back.
    pub units: u64,
    /// When they were taken: a window's units return only to the window they came from.
    pub taken_at: Micros,
    /// Now, epoch microseconds.
    pub now: Micros,
}

/// What to do with one key after a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Leave it as it is.
    Keep,
    /// Store this state, expiring after the TTL (0 = it carries nothing: delete).
    Put(State, Micros),
}

/// A give-back is applied per key, not per identity like a [`Call`]: each rule keeps or loses
/// what it was given on its own terms (a window that ended has nothing to give back to). The
/// store applies [`algo::give_back`] atomically on the key's state, under the shard lock in
/// memory and inside `lua/give_back.lua` on Redis.
impl GiveBack {
    /// The algorithm's inputs besides state and params.
    pub fn request(&self) -> GiveBackReq {
        GiveBackReq {
            units: self.units,
            taken_at: self.taken_at,
            now: self.now,
        }
    }

    /// What giving back does to `state`: [`Write::Keep`] when there is nothing to write.
    pub fn write(&self, state: Option<&State>) -> Write {
        match algo::give_back(&self.params, state, &self.request()) {
            Some((st, ttl)) => Write::Put(st, ttl),
            None => Write::Keep,
        }
    }
}

impl Call {
    fn request(&self, item: &Item) -> Request<'_> {
        Request {
            now: self.now,
            cost: self.cost,
            request_id: &self.request_id,
            remote: item.remote,
        }
    }
}

/// A key's current state as [`apply`] and [`answer`] read it: owned (a test's table, the
/// hot-key gate's), borrowed from the store's own table (no copy of each state per call), or
/// either ([`Cow`], a store that builds some states and lends the others).
pub trait StateRef {
    /// The state, `None` when the key is absent.
    fn state(&self) -> Option<&State>;
}

impl StateRef for Option<State> {
    fn state(&self) -> Option<&State> {
        self.as_ref()
    }
}

impl StateRef for Option<&State> {
    fn state(&self) -> Option<&State> {
        *self
    }
}

impl StateRef for Option<Cow<'_, State>> {
    fn state(&self) -> Option<&State> {
        self.as_deref()
    }
}

/// Checks every item, then takes from all when every enforced item allows.
///
/// `states[i]` is the current state of `items[i].key` (None = absent). Shadow items take only
/// when they would have allowed, so their counts track what enforcing them would do.
/// Refused requests charge only `charge_rejected` items. A shared bucket that takes nothing
/// but drained new remote consumption is written too (a take of 0: [`algo::remote_news`]).
pub fn apply(call: &Call, states: &[impl StateRef]) -> (CallResult, Vec<Write>) {
    let mut writes = Vec::with_capacity(call.items.len());
    let result = apply_into(call, states, &mut writes);
    (result, writes)
}

/// [`apply`] writing the writes into `writes` (cleared first), so a store can reuse one
/// buffer across calls instead of allocating a vector per call.
pub fn apply_into(call: &Call, states: &[impl StateRef], writes: &mut Vec<Write>) -> CallResult {
    let mut result = CallResult {
        allowed: true,
        outcomes: Vec::with_capacity(call.items.len()),
    };
    apply_reusing(call, states, &mut result, writes);
    result
}

/// [`apply_into`] that reuses `result`'s outcomes too (overwritten): with both buffers kept
/// across calls, a call allocates nothing.
pub fn apply_reusing(
    call: &Call,
    states: &[impl StateRef],
    result: &mut CallResult,
    writes: &mut Vec<Write>,
) {
    answer_into(call, states, result);
    let allowed = result.allowed;
    writes.clear();
    writes.extend(
        call.items
            .iter()
            .zip(states)
            .zip(&result.outcomes)
            .map(|((item, st), o)| {
                let req = call.request(item);
                if !takes(
                    call.cost,
                    allowed,
                    o.allowed,
                    item.enforce,
                    item.charge_rejected,
                ) {
                    // A shared bucket that drained news from other regions keeps it even when it
                    // takes nothing: otherwise its key would expire on its own refill schedule
                    // and a fresh key would forget what the other regions took.
                    if algo::remote_news(st.state(), &req) {
                        let (state, ttl) =
                            algo::take(&item.params, st.state(), &Request { cost: 0, ..req });
                        return Write::Put(state, ttl);
                    }
                    return Write::Keep;
                }
                let (state, ttl) = algo::take(&item.params, st.state(), &req);
                Write::Put(state, ttl)
            }),
    );
}

/// Whether an item takes the call's cost from its state: an allowed call charges the items
/// that allowed it, a refused one only enforced `charge_rejected` items, and a peek (cost 0)
/// nothing. The one rule [`apply`] writes by, its answer reports by, and a decision reads
/// taken concurrency slots by.
pub fn takes(
    cost: u64,
    call_allowed: bool,
    item_allowed: bool,
    enforce: bool,
    charge_rejected: bool,
) -> bool {
    cost > 0
        && if call_allowed {
            item_allowed
        } else {
            enforce && charge_rejected
        }
}

/// What [`apply`] answers for `call` over `states`, without the writes: a store whose atomic
/// step already wrote (Redis's script) answers from the states it read, with this same code.
pub fn answer(call: &Call, states: &[impl StateRef]) -> CallResult {
    let mut result = CallResult {
        allowed: true,
        outcomes: Vec::with_capacity(call.items.len()),
    };
    answer_into(call, states, &mut result);
    result
}

/// [`answer`] into `out`, overwriting it and reusing its outcomes' buffer.
pub fn answer_into(call: &Call, states: &[impl StateRef], out: &mut CallResult) {
    let outcomes = &mut out.outcomes;
    outcomes.clear();
    outcomes.extend(
        call.items
            .iter()
            .zip(states)
            .map(|(item, st)| algo::evaluate(&item.params, st.state(), &call.request(item))),
    );
    let allowed = call
        .items
        .iter()
        .zip(outcomes.iter())
        .all(|(i, o)| o.allowed || !i.enforce);
    if !allowed && call.cost > 0 {
        // Outcomes say "after this request"; a refused request takes nothing from the rules
        // that would have allowed it, so give the cost back in what they report.
        for (item, o) in call.items.iter().zip(outcomes.iter_mut()) {
            if o.allowed
                && !takes(
                    call.cost,
                    allowed,
                    o.allowed,
                    item.enforce,
                    item.charge_rejected,
                )
            {
                o.remaining = (o.remaining + call.cost).min(o.limit);
                o.usage = o.usage.saturating_sub(call.cost);
            }
        }
    }
    out.allowed = allowed;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{Rate, Window};
    use crate::time::SECOND;

    fn call(items: Vec<Item>) -> Call {
        Call {
            now: 0,
            cost: 1,
            request_id: "r".into(),
            items,
        }
    }

    fn item(key: &str, params: Params) -> Item {
        Item {
            key: key.into(),
            params,
            enforce: true,
            charge_rejected: false,
            remote: Remote::default(),
        }
    }

    fn commit(states: &mut [Option<State>], writes: Vec<Write>) {
        for (s, w) in states.iter_mut().zip(writes) {
            if let Write::Put(st, _) = w {
                *s = Some(st);
            }
        }
    }

    #[test]
    fn a_refusal_by_one_rule_takes_from_none() {
        let c = call(vec![
            item(
                "burst",
                Params::TokenBucket {
                    rate: Rate::per_second(1),
                    burst: 10,
                },
            ),
            item(
                "daily",
                Params::FixedWindow {
                    limit: 2,
                    window: Window::Epoch(86_400 * SECOND),
                },
            ),
        ]);
        let mut states = vec![None, None];
        for _ in 0..2 {
            let (r, w) = apply(&c, &states);
            assert!(r.allowed);
            commit(&mut states, w);
        }
        let (r, w) = apply(&c, &states);
        assert!(!r.allowed);
        assert!(w.iter().all(|w| *w == Write::Keep));
        assert_eq!(r.outcomes[0].remaining, 8);
    }

    #[test]
    fn shadow_never_refuses_but_counts() {
        let mut shadow = item(
            "s",
            Params::FixedWindow {
                limit: 1,
                window: Window::Epoch(SECOND),
            },
        );
        shadow.enforce = false;
        let c = call(vec![shadow]);
        let mut states = vec![None];
        let (r, w) = apply(&c, &states);
        assert!(r.allowed && r.outcomes[0].allowed);
        commit(&mut states, w);
        let (r, w) = apply(&c, &states);
        assert!(r.allowed && !r.outcomes[0].allowed);
        assert_eq!(w, vec![Write::Keep]);
    }

    #[test]
    fn charge_rejected_counts_refusals() {
        let mut i = item(
            "w",
            Params::FixedWindow {
                limit: 1,
                window: Window::Epoch(SECOND),
            },
        );
        i.charge_rejected = true;
        let c = call(vec![i]);
        let mut states = vec![None];
        for _ in 0..3 {
            let (_, w) = apply(&c, &states);
            commit(&mut states, w);
        }
        assert_eq!(states[0], Some(State::FixedWindow { start: 0, count: 3 }));
    }

    #[test]
    fn a_lease_check_is_undone_key_by_key_by_its_give_backs() {
        let fw = || Params::FixedWindow {
            limit: 100,
            window: Window::Epoch(60 * SECOND),
        };
        let mut c = call(vec![item("w", fw())]);
        c.cost = 10;
        let mut states = vec![None];
        let (r, w) = apply(&c, &states);
        assert!(r.allowed);
        commit(&mut states, w);
        let g = GiveBack {
            key: "w".into(),
            params: fw(),
            units: 7,
            taken_at: 0,
            now: SECOND,
        };
        let w = g.write(states[0].as_ref());
        assert_eq!(
            w,
            Write::Put(State::FixedWindow { start: 0, count: 3 }, 59 * SECOND)
        );
        // The next window: nothing to give back to.
        let late = GiveBack {
            now: 60 * SECOND,
            ..g
        };
        assert_eq!(late.write(states[0].as_ref()), Write::Keep);
    }

    #[test]
    fn peek_takes_nothing() {
        let mut c = call(vec![item(
            "b",
            Params::TokenBucket {
                rate: Rate::per_second(1),
                burst: 1,
            },
        )]);
        c.cost = 0;
        let (r, w) = apply(&c, &[None::<crate::State>]);
        assert!(r.allowed);
        assert_eq!(r.outcomes[0].remaining, 1);
        assert_eq!(w, vec![Write::Keep]);
    }
}
