//! The edge guard: what a gateway answers itself before it asks the daemon.
//!
//! Two filters, both local and both cheaper than a daemon call:
//!
//! - **Refusal memory.** A refusal the daemon gave a request identity (domain plus
//!   descriptors) is repeated until its own retry time, so a key being refused costs the
//!   daemon nothing. It only honours the daemon's retry time, which is never early (see
//!   [`crate::hotkeys`]' deny cache for why), so it is on by default. The caller decides which
//!   refusals may be remembered (not concurrency ones: a release frees a slot early).
//! - **Flood bucket.** A coarse token bucket per client (API key, else IP), set far above any
//!   real client's rate, so a flood stops at the gateway. Off unless configured. It is the
//!   core's token bucket ([`crate::algo`]), not a second implementation.
//!
//! Memory is bounded: each map is two generations of at most half its capacity; when the
//! current one is full the older is dropped whole, so an insert costs O(1) and the guard never
//! holds more than its capacity. Evicting a remembered refusal only costs a daemon call;
//! evicting a bucket only forgets a flood's debt (the key starts again with a full burst).
//! Sans-IO: `now` is an argument.

use std::collections::HashMap;
use std::hash::Hash;

use crate::algo::{self, Params, Remote, Request, State};
use crate::hotkeys::deny::hold_until;
use crate::time::Micros;

/// The coarse per-client rate: refused locally above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloodLimit {
    /// Tokens added per second (> 0).
    pub rate_per_s: u64,
    /// Capacity (> 0).
    pub burst: u64,
}

/// What the guard holds and how much of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeConfig {
    /// Whether daemon refusals are remembered until their retry time (default true).
    pub remember_refusals: bool,
    /// The longest a refusal is remembered, whatever its retry time: bounds how long a rule
    /// change (a raised limit) goes unseen by a refused key (default 60 s).
    pub max_hold: Micros,
    /// The flood bucket per client; `None` (default) turns it off.
    pub flood: Option<FloodLimit>,
    /// Entries each map may hold (default 65,536).
    pub capacity: usize,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        EdgeConfig {
            remember_refusals: true,
            max_hold: 60 * crate::time::SECOND,
            flood: None,
            capacity: 65_536,
        }
    }
}

/// What the guard says about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgeVerdict<T> {
    /// Ask the daemon.
    Pass,
    /// The daemon refused this identity until `until`; `answer` is its refusal.
    Refused {
        /// When the remembered refusal ends.
        until: Micros,
        /// What the caller stored with it.
        answer: T,
    },
    /// The client's flood bucket is empty; it holds a token again in `retry_after`.
    Flood {
        /// Until the bucket admits one request.
        retry_after: Micros,
    },
}

/// Two generations of a map, the older dropped whole when the newer is full.
#[derive(Debug)]
struct Generations<K, V> {
    cur: HashMap<K, V>,
    old: HashMap<K, V>,
    half: usize,
}

impl<K: Hash + Eq, V> Generations<K, V> {
    fn new(capacity: usize) -> Self {
        Generations {
            cur: HashMap::new(),
            old: HashMap::new(),
            half: (capacity / 2).max(1),
        }
    }

    fn get(&self, k: &K) -> Option<&V> {
        self.cur.get(k).or_else(|| self.old.get(k))
    }

    fn remove(&mut self, k: &K) {
        self.cur.remove(k);
        self.old.remove(k);
    }

    fn insert(&mut self, k: K, v: V) {
        self.old.remove(&k);
        if !self.cur.contains_key(&k) && self.cur.len() >= self.half {
            self.old = std::mem::take(&mut self.cur);
        }
        self.cur.insert(k, v);
    }

    fn len(&self) -> usize {
        self.cur.len() + self.old.len()
    }
}

/// Remembered refusals keyed by identity `I`, flood buckets keyed by client `C`, each
/// refusal carrying the caller's answer `T` (an `Arc` of the daemon's response, say).
#[derive(Debug)]
pub struct EdgeGuard<I, C, T> {
    config: EdgeConfig,
    refusals: Generations<I, (Micros, T)>,
    buckets: Generations<C, State>,
}

impl<I: Hash + Eq, C: Hash + Eq + Clone, T: Clone> EdgeGuard<I, C, T> {
    /// A guard under `config`.
    pub fn new(config: EdgeConfig) -> Self {
        EdgeGuard {
            refusals: Generations::new(config.capacity),
            buckets: Generations::new(config.capacity),
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EdgeConfig {
        &self.config
    }

    /// Whether `identity` (from `client`, when known) may go on to the daemon at `now`. A
    /// remembered refusal answers first and takes no flood token; a pass takes one.
    pub fn check(&mut self, identity: &I, client: Option<&C>, now: Micros) -> EdgeVerdict<T> {
        if let Some((until, answer)) = self.refusals.get(identity) {
            if now < *until {
                return EdgeVerdict::Refused {
                    until: *until,
                    answer: answer.clone(),
                };
            }
            self.refusals.remove(identity);
        }
        if let (Some(limit), Some(client)) = (self.config.flood, client) {
            let params = Params::TokenBucket {
                rate: crate::algo::Rate::per_second(limit.rate_per_s),
                burst: limit.burst,
            };
            let req = Request {
                now,
                cost: 1,
                request_id: "",
                remote: Remote::default(),
            };
            let state = self.buckets.get(client);
            let outcome = algo::evaluate(&params, state, &req);
            if !outcome.allowed {
                return EdgeVerdict::Flood {
                    retry_after: outcome.retry_after.max(1),
                };
            }
            let (state, ttl) = algo::take(&params, state, &req);
            if ttl == 0 {
                // A full bucket is the same as none.
                self.buckets.remove(client);
            } else {
                self.buckets.insert(client.clone(), state);
            }
        }
        EdgeVerdict::Pass
    }

    /// Remembers the daemon's refusal of `identity` until `until` (capped at
    /// [`EdgeConfig::max_hold`] from `now`). Ignored when refusal memory is off or `until` is
    /// not in the future.
    pub fn remember_refusal(&mut self, identity: I, until: Micros, now: Micros, answer: T) {
        if !self.config.remember_refusals {
            return;
        }
        if let Some(until) = hold_until(now, until, self.config.max_hold) {
            self.refusals.insert(identity, (until, answer));
        }
    }

    /// Entries held (refusals, buckets), for metrics and tests.
    pub fn len(&self) -> (usize, usize) {
        (self.refusals.len(), self.buckets.len())
    }

    /// Whether the guard holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::SECOND;
    use proptest::prelude::*;

    type Guard = EdgeGuard<u64, u64, u32>;

    fn flood(rate_per_s: u64, burst: u64) -> EdgeConfig {
        EdgeConfig {
            flood: Some(FloodLimit { rate_per_s, burst }),
            ..EdgeConfig::default()
        }
    }

    #[test]
    fn a_refusal_answers_until_its_time_then_passes() {
        let mut g = Guard::new(EdgeConfig::default());
        assert_eq!(g.check(&1, None, 0), EdgeVerdict::Pass);
        g.remember_refusal(1, 2 * SECOND, 0, 7);
        let refused = EdgeVerdict::Refused {
            until: 2 * SECOND,
            answer: 7,
        };
        assert_eq!(g.check(&1, None, 1), refused);
        assert_eq!(g.check(&1, None, 2 * SECOND - 1), refused);
        assert_eq!(g.check(&2, None, 1), EdgeVerdict::Pass, "another identity");
        assert_eq!(g.check(&1, None, 2 * SECOND), EdgeVerdict::Pass);
        assert_eq!(g.len(), (0, 0), "the expired entry is dropped");
    }

    #[test]
    fn memory_off_or_past_refusals_are_not_remembered() {
        let mut g = Guard::new(EdgeConfig {
            remember_refusals: false,
            ..EdgeConfig::default()
        });
        g.remember_refusal(1, SECOND, 0, 7);
        assert_eq!(g.check(&1, None, 1), EdgeVerdict::Pass);
        let mut g = Guard::new(EdgeConfig::default());
        g.remember_refusal(1, 5, 5, 7);
        assert!(g.is_empty());
    }

    #[test]
    fn a_hold_is_capped_at_max_hold() {
        let mut g = Guard::new(EdgeConfig {
            max_hold: SECOND,
            ..EdgeConfig::default()
        });
        g.remember_refusal(1, 3600 * SECOND, 10, 7);
        assert!(
            matches!(g.check(&1, None, SECOND + 9), EdgeVerdict::Refused { until, .. } if until == SECOND + 10)
        );
        assert_eq!(g.check(&1, None, SECOND + 10), EdgeVerdict::Pass);
    }

    #[test]
    fn the_flood_bucket_admits_its_burst_then_its_rate() {
        let mut g = Guard::new(flood(10, 5));
        for _ in 0..5 {
            assert_eq!(g.check(&0, Some(&9), 0), EdgeVerdict::Pass);
        }
        assert_eq!(
            g.check(&0, Some(&9), 0),
            EdgeVerdict::Flood {
                retry_after: SECOND / 10
            }
        );
        assert_eq!(
            g.check(&0, Some(&8), 0),
            EdgeVerdict::Pass,
            "another client"
        );
        assert_eq!(g.check(&0, Some(&9), SECOND / 10), EdgeVerdict::Pass);
        assert!(matches!(
            g.check(&0, Some(&9), SECOND / 10),
            EdgeVerdict::Flood { .. }
        ));
    }

    #[test]
    fn no_flood_limit_or_no_client_is_never_flooded() {
        let mut g = Guard::new(EdgeConfig::default());
        let mut f = Guard::new(flood(1, 1));
        for _ in 0..100 {
            assert_eq!(g.check(&0, Some(&1), 0), EdgeVerdict::Pass);
            assert_eq!(f.check(&0, None, 0), EdgeVerdict::Pass);
        }
        assert!(g.is_empty());
    }

    #[test]
    fn memory_never_exceeds_the_capacity() {
        let mut g = Guard::new(EdgeConfig {
            capacity: 100,
            ..flood(1, 10)
        });
        for k in 0..10_000u64 {
            g.remember_refusal(k, SECOND, 0, 0);
            g.check(&u64::MAX, Some(&k), 0);
            let (r, b) = g.len();
            assert!(r <= 100 && b <= 100, "{r} {b}");
        }
        // The newest survive eviction.
        assert!(matches!(
            g.check(&9_999, None, 1),
            EdgeVerdict::Refused { .. }
        ));
    }

    proptest! {
        /// A remembered refusal is never served at or past its time, and always before it.
        #[test]
        fn a_refusal_is_never_served_past_its_time(
            events in prop::collection::vec((0u64..4, 0u64..3 * SECOND, 0u64..2 * SECOND), 1..60),
        ) {
            let mut g = Guard::new(EdgeConfig { capacity: 1_000, ..EdgeConfig::default() });
            let mut now = 0;
            let mut truth: HashMap<u64, Micros> = HashMap::new();
            for (key, hold, step) in events {
                now += step;
                match g.check(&key, None, now) {
                    EdgeVerdict::Refused { until, .. } => {
                        prop_assert!(now < until);
                        prop_assert_eq!(truth.get(&key).copied(), Some(until));
                    }
                    EdgeVerdict::Pass => {
                        prop_assert!(truth.get(&key).is_none_or(|u| *u <= now));
                        if hold > 0 {
                            g.remember_refusal(key, now + hold, now, 0);
                            truth.insert(key, now + hold);
                        }
                    }
                    EdgeVerdict::Flood { .. } => prop_assert!(false, "no flood limit"),
                }
            }
        }

        /// Over any span t from the first request, the flood bucket admits at most
        /// rate * t + burst requests.
        #[test]
        fn the_flood_bucket_admits_at_most_rate_t_plus_burst(
            rate in 1u64..1_000,
            burst in 1u64..50,
            steps in prop::collection::vec(0u64..20_000, 1..400),
        ) {
            let mut g = Guard::new(flood(rate, burst));
            let mut now = 0;
            let mut admitted = 0u64;
            for step in steps {
                now += step;
                if g.check(&0, Some(&1), now) == EdgeVerdict::Pass {
                    admitted += 1;
                }
                // rate * t in whole tokens, t in microseconds.
                prop_assert!(admitted <= rate * now / SECOND + burst, "{admitted} at {now}");
            }
        }
    }
}
