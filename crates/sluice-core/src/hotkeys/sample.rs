//! Sampling with the local block, the last resort for a key too hot for anything else: one
//! request in N asks the store, at N times its cost, and the N − 1 others are answered like
//! the last sampled one. When a sampled check is refused, the key is blocked on this daemon
//! until its retry time (at most [`MAX_HOLD`]), so a flood is refused whole, not N − 1 in N.
//!
//! It is approximate on purpose: between samples the daemon admits without counting, so a key
//! can pass its limit by up to N − 1 requests per daemon before a sample sees it, and a
//! sampled check of N × cost can be refused while the count still holds a few units. Without
//! the block (`sample_block: false`) a key over its limit still gets N − 1 in N admitted;
//! docs/hot-keys.md has both figures.

use super::deny::{MAX_HOLD, aged, refused_for, window_end};
use super::lease::served;
use crate::batch::{Call, CallResult};
use crate::hash::{Keyed, KeyedMap};
use crate::time::Micros;

#[derive(Debug)]
struct Sampled {
    seen: u64,
    last: Option<CallResult>,
    answered_at: Micros,
    /// The last sample speaks for its window's counts until then (a window rule's end).
    valid_until: Micros,
    blocked_until: Micros,
    last_used: Micros,
}

/// What a request of a sampled key does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// Answered like the last sample (admitted) or refused by the block.
    Local(CallResult),
    /// This request is the sample: send it at this cost.
    Sample(u64),
}

/// The sampled keys of one daemon (or one shard of it).
#[derive(Debug)]
pub struct Samples {
    map: KeyedMap<u64, Sampled>,
    capacity: usize,
}

/// An idle sampled key is forgotten after this long (its next request is sampled).
const IDLE: Micros = 10 * MAX_HOLD;

impl Samples {
    /// Room for `capacity` keys, the map keyed by `seed`.
    pub fn new(capacity: usize, seed: u64) -> Samples {
        Samples {
            map: KeyedMap::with_hasher(Keyed::new(seed)),
            capacity: capacity.max(1),
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Forgets every key (a rule change).
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Sample or answer request `call` of the key hashed to `h`, sampling 1 in `every`.
    pub fn pick(&mut self, h: u64, call: &Call, every: u64, block: bool) -> Pick {
        let now = call.now;
        let sample = Pick::Sample(call.cost.saturating_mul(every));
        if !self.map.contains_key(&h) && self.map.len() >= self.capacity {
            // No room: every request of a new key is its own sample, at its own cost.
            return Pick::Sample(call.cost);
        }
        let s = self.map.entry(h).or_insert(Sampled {
            seen: 0,
            last: None,
            answered_at: now,
            valid_until: 0,
            blocked_until: 0,
            last_used: now,
        });
        s.last_used = now;
        if block
            && now < s.blocked_until
            && let Some(last) = &s.last
        {
            return Pick::Local(aged(last, now.saturating_sub(s.answered_at)));
        }
        s.seen += 1;
        let fresh = now < s.valid_until;
        match &s.last {
            Some(last) if fresh && s.seen % every != 1 && every > 1 && last.allowed => {
                Pick::Local(served(last, 0))
            }
            Some(last) if fresh && s.seen % every != 1 && every > 1 && !block => {
                // Without the block an unsampled request passes even after a refusal.
                Pick::Local(served(last, 0))
            }
            _ => {
                s.seen = 1;
                sample
            }
        }
    }

    /// The store's answer to a sample.
    pub fn sampled(&mut self, h: u64, call: &Call, result: &CallResult, block: bool) {
        let now = call.now;
        if let Some(s) = self.map.get_mut(&h) {
            // A window rule's answer is its window's: never repeated past the window's end.
            let window = window_end(call, result);
            s.valid_until = now.saturating_add(window);
            if !result.allowed && block {
                let wait = refused_for(call, result).min(MAX_HOLD).min(window);
                s.blocked_until = now + wait;
            }
            s.last = Some(result.clone());
            s.answered_at = now;
        }
    }

    /// Forgets keys idle for a while.
    pub fn expire(&mut self, now: Micros) {
        self.map.retain(|_, s| now < s.last_used + IDLE);
    }
}
