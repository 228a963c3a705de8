//! The deny cache: a store refusal repeated until its retry time, without asking the store.
//!
//! It is exact: it never refuses a request the store would have admitted. That holds because
//! a refused rule's `retry_after` is never late (the algorithms' property tests check it: on
//! an unchanged state the rule refuses at every instant before it), because other requests
//! only ever take from a count (they make a refusal truer, never false), and because an entry
//! answers only a request the store would treat the same:
//!
//! - the same store keys with the same numbers and the same enforce flags (an override with
//!   bigger numbers, or a rule switched to shadow, is another request: envoyproxy/ratelimit
//!   answers such requests from a cache keyed by the key alone, its issue #1077);
//! - a cost at least the refused one (a smaller cost may fit sooner);
//! - the same rule version (the layer drops the cache on a new one);
//! - the same window: an answer's counts are its window's, so a window rule's refusal is
//!   held at most to the end of that window, even when its retry time lies beyond.
//!
//! What can free units before a retry time: a lease given back by another daemon, and
//! concurrency releases (concurrency rules are never cached, see
//! [`CallPolicy`](super::CallPolicy)). A give-back's units then wait at most until the
//! cached retry time, capped at [`MAX_HOLD`].
//!
//! Memory is bounded by two generations of at most half the capacity each, swapped every
//! [`MAX_HOLD`]: an entry lives at most that long, so one that survives two swaps is stale by
//! construction, and dropping a whole generation costs nothing per entry.

use crate::Params;
use crate::batch::{Call, CallResult};
use crate::hash::{Keyed, KeyedMap};
use crate::time::{Micros, SECOND};

/// The longest a refusal is repeated without asking the store again.
pub const MAX_HOLD: Micros = SECOND;

/// Until when a refusal given at `now`, retryable at `retry_at`, may be repeated without
/// asking again: its retry time (never early, see above), held at most `max_hold`; `None`
/// when that is not in the future. The deny cache and the edge guard
/// ([`crate::edge`]) both hold refusals by this rule.
pub fn hold_until(now: Micros, retry_at: Micros, max_hold: Micros) -> Option<Micros> {
    let until = retry_at.min(now.saturating_add(max_hold));
    (until > now).then_some(until)
}

#[derive(Debug, Clone)]
struct Entry {
    shape: Shape,
    cost: u64,
    at: Micros,
    until: Micros,
    result: CallResult,
}

/// What makes a later call the same call to the store: its keys, their numbers and enforce
/// flags, in order. Kept by every remembered answer (refusals, leases) and compared in full,
/// since the hash it is filed under is the keys' alone.
#[derive(Debug, Clone)]
pub(super) struct Shape(pub(super) Vec<(String, Params, bool)>);

impl Shape {
    pub(super) fn of(call: &Call) -> Shape {
        Shape(
            call.items
                .iter()
                .map(|i| (i.key.clone(), i.params.clone(), i.enforce))
                .collect(),
        )
    }

    /// Whether `call` has the same store keys, whatever its numbers and enforce flags.
    pub(super) fn same_keys(&self, call: &Call) -> bool {
        self.0.len() == call.items.len()
            && self
                .0
                .iter()
                .zip(&call.items)
                .all(|((k, _, _), it)| *k == it.key)
    }

    pub(super) fn matches(&self, call: &Call) -> bool {
        self.0.len() == call.items.len()
            && self
                .0
                .iter()
                .zip(&call.items)
                .all(|((k, p, e), it)| *k == it.key && *p == it.params && *e == it.enforce)
    }
}

/// How long a refused call stays refused: the longest wait of its refusing enforced rules
/// (0 when none refuses).
pub(super) fn refused_for(call: &Call, result: &CallResult) -> Micros {
    call.items
        .iter()
        .zip(&result.outcomes)
        .filter(|(i, o)| i.enforce && !o.allowed)
        .map(|(_, o)| o.retry_after)
        .max()
        .unwrap_or(0)
}

/// A remembered answer as it stands `elapsed` later: waits and resets shortened by it.
pub(super) fn aged(result: &CallResult, elapsed: Micros) -> CallResult {
    let mut r = result.clone();
    for o in &mut r.outcomes {
        if !o.allowed {
            // Never 0: an answer is repeated only while every refusing rule still refuses.
            o.retry_after = o.retry_after.saturating_sub(elapsed).max(1);
        }
        o.reset = o.reset.saturating_sub(elapsed);
    }
    r
}

/// How long the counts of an answer stay its window rules' counts: until the first of their
/// windows ends. A sliding window's retry time can lie in the next window, but the answer's
/// `usage` and `remaining` are the old window's; repeated past its end, the daemon's shipper
/// would send the old window's count to other regions as the new one's, and they would
/// refuse on it (sluice-sim's ship-interval.toml: 1,412 false rejections in 30,451 requests,
/// none without the cache). Asking the store again costs one call per key per window.
pub(super) fn window_end(call: &Call, result: &CallResult) -> Micros {
    call.items
        .iter()
        .zip(&result.outcomes)
        .filter(|(i, _)| {
            matches!(
                i.params,
                Params::FixedWindow { .. } | Params::SlidingWindow { .. }
            )
        })
        .map(|(_, o)| o.reset)
        .min()
        .unwrap_or(Micros::MAX)
}

/// Cached refusals, keyed by the call's store keys.
#[derive(Debug)]
pub struct DenyCache {
    cur: KeyedMap<u64, Entry>,
    prev: KeyedMap<u64, Entry>,
    half: usize,
    swapped_at: Micros,
}

/// The hash an entry is filed under: its store keys, in order. foldhash reads a key 16 bytes
/// at a time (FNV's byte-at-a-time multiply chain cost ~100 ns on a two-key call, on every
/// call through the layer). A fixed seed: shells shard the layer by it, and a collision only
/// costs a miss (an entry is confirmed by its [`Shape`]).
pub(super) fn hash(call: &Call) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = foldhash::fast::FixedState::with_seed(0x736c_7569_6365).build_hasher();
    for it in &call.items {
        h.write(it.key.as_bytes());
        h.write_u8(0xff);
    }
    h.finish()
}

impl DenyCache {
    /// A cache of at most `capacity` entries, its maps keyed by `seed`.
    pub fn new(capacity: usize, seed: u64) -> DenyCache {
        DenyCache {
            cur: KeyedMap::with_hasher(Keyed::new(seed)),
            prev: KeyedMap::with_hasher(Keyed::new(seed)),
            half: (capacity / 2).max(1),
            swapped_at: 0,
        }
    }

    /// Entries held (some may have expired since the last [`DenyCache::expire`]).
    pub fn len(&self) -> usize {
        self.cur.len() + self.prev.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets everything (a rule change).
    pub fn clear(&mut self) {
        self.cur.clear();
        self.prev.clear();
    }

    /// Swaps generations when one has lived [`MAX_HOLD`].
    pub fn expire(&mut self, now: Micros) {
        if now >= self.swapped_at.saturating_add(MAX_HOLD) {
            // Entries of `cur` were made after the last swap, so they expire at most
            // MAX_HOLD after it; two holds on, they are all stale too.
            let both = now >= self.swapped_at.saturating_add(2 * MAX_HOLD);
            // The old `prev` is emptied and becomes `cur`, keeping its table: a fresh map
            // would regrow (and rehash) its way back to its size every hold.
            std::mem::swap(&mut self.prev, &mut self.cur);
            self.cur.clear();
            if both {
                self.prev.clear();
            }
            self.swapped_at = now;
        }
    }

    /// The store's refusal, as it stands at `call.now`, when a cached one answers `call`.
    pub fn lookup(&mut self, call: &Call) -> Option<CallResult> {
        let now = call.now;
        self.expire(now);
        let h = hash(call);
        let e = self.cur.get(&h).or_else(|| self.prev.get(&h))?;
        if now >= e.until || now < e.at || call.cost < e.cost || !e.shape.matches(call) {
            return None;
        }
        Some(aged(&e.result, now - e.at))
    }

    /// Remembers a refusal of `call`; `false` when the cache is full.
    pub fn remember(&mut self, call: &Call, result: &CallResult) -> bool {
        let now = call.now;
        self.expire(now);
        if result.allowed || call.cost == 0 {
            return true;
        }
        // The call is refused while any refusing enforced rule refuses.
        let wait = refused_for(call, result).min(window_end(call, result));
        let Some(until) = hold_until(now, now.saturating_add(wait), MAX_HOLD) else {
            return true;
        };
        let h = hash(call);
        if self.cur.len() >= self.half && !self.cur.contains_key(&h) {
            return false;
        }
        self.prev.remove(&h);
        self.cur.insert(
            h,
            Entry {
                shape: Shape::of(call),
                cost: call.cost,
                at: now,
                until,
                result: result.clone(),
            },
        );
        true
    }
}

#[cfg(test)]
mod hold_tests {
    use super::*;

    #[test]
    fn a_hold_ends_at_the_retry_time_or_the_cap_and_never_starts_in_the_past() {
        assert_eq!(hold_until(10, 500, SECOND), Some(500));
        assert_eq!(hold_until(10, 10 + 2 * SECOND, SECOND), Some(10 + SECOND));
        assert_eq!(hold_until(10, 10, SECOND), None, "retryable now");
        assert_eq!(hold_until(10, 5, SECOND), None, "retryable already");
        assert_eq!(hold_until(10, 500, 0), None, "no hold allowed");
        assert_eq!(
            hold_until(Micros::MAX - 1, Micros::MAX, SECOND),
            Some(Micros::MAX)
        );
    }
}
