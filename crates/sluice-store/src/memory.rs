//! The in-memory store: the embedded default, the per-daemon `local` buckets used when Redis
//! fails, and the simulator's store.
//!
//! Sharded by the key's hash tag, so all keys of one identity share a shard (one lock per
//! call) and distinct identities rarely contend. Entries expire when their state carries no
//! more information; expired entries are skipped on read and swept by [`MemoryStore::sweep`].
//! The number of keys is bounded: at the bound a new key evicts the soonest-expiring of a
//! sample of keys in its shard (the least informative state), counted in
//! [`MemoryStore::evictions`].

use crate::{BoxFuture, Store, StoreError};
use sluice_core::batch::{Call, CallResult, Write, apply_into};
use sluice_core::hash::{InlineKey, Keyed, KeyedMap, stable_hash};
use sluice_core::{Micros, State, algo};
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 64;
const EVICTION_SAMPLE: usize = 32;

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    expires: Micros,
}

/// One shard: its keys, and buffers a call reuses under the shard's lock (a call allocates
/// no scratch space of its own).
#[derive(Debug)]
struct Shard {
    /// Short keys sit inside the map's slots (no pointer to follow on a lookup).
    map: KeyedMap<InlineKey, Entry>,
    states: Vec<Option<State>>,
    writes: Vec<Write>,
}

/// Sharded map from key to state with expiry and a key bound.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Vec<Mutex<Shard>>,
    per_shard_cap: usize,
    evictions: AtomicU64,
}

/// The hash tag of a key (`sl:{tag}:rule` → `tag`), or the whole key.
fn tag(key: &str) -> &str {
    // Redis Cluster's rule: the first `{`, then the first `}` after it, non-empty between.
    // Byte scans: both are ASCII, so the slice bounds are char boundaries.
    let b = key.as_bytes();
    let Some(open) = b.iter().position(|&c| c == b'{') else {
        return key;
    };
    match b[open + 1..].iter().position(|&c| c == b'}') {
        Some(len) if len > 0 => &key[open + 1..open + 1 + len],
        _ => key,
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(1_000_000)
    }
}

impl MemoryStore {
    /// A store holding at most about `max_keys` keys, its maps keyed by a seed drawn from OS
    /// randomness (keys are client-chosen: see [`Keyed`]).
    pub fn new(max_keys: usize) -> MemoryStore {
        let seed = std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64);
        MemoryStore::with_seed(max_keys, seed)
    }

    /// A store whose maps are keyed by `seed`: which keys the bound evicts depends on the map
    /// order, so a reproducible run (the simulator) passes a seed of its own.
    pub fn with_seed(max_keys: usize, seed: u64) -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|i| {
                    Mutex::new(Shard {
                        map: KeyedMap::with_hasher(Keyed::new(seed ^ i as u64)),
                        states: Vec::new(),
                        writes: Vec::new(),
                    })
                })
                .collect(),
            per_shard_cap: max_keys.div_ceil(SHARDS).max(1),
            evictions: AtomicU64::new(0),
        }
    }

    /// The shard of a hash tag (stable: the key bound is per shard).
    fn shard_of_tag(tag: &str) -> usize {
        (stable_hash(&[tag]) % SHARDS as u64) as usize
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[Self::shard_of_tag(tag(key))]
    }

    fn lock<'a>(m: &'a Mutex<Shard>) -> std::sync::MutexGuard<'a, Shard> {
        // A panic while holding the lock leaves whole entries only (we never write partially),
        // so the map stays usable.
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The synchronous call: the daemon's local buckets and the simulator use it directly.
    ///
    /// Every key of a call must share one hash tag (one identity): the call runs under that
    /// shard's lock, which is what makes it atomic.
    pub fn check_sync(&self, call: &Call) -> Result<CallResult, StoreError> {
        let Some(first) = call.items.first() else {
            return Ok(CallResult {
                allowed: true,
                outcomes: Vec::new(),
            });
        };
        // The tag is hashed once: keys with the same tag share its shard.
        let first_tag = tag(&first.key);
        let si = Self::shard_of_tag(first_tag);
        if call.items[1..].iter().any(|i| {
            let t = tag(&i.key);
            t != first_tag && Self::shard_of_tag(t) != si
        }) {
            return Err(StoreError::Server(
                "keys of one call must share a hash tag".into(),
            ));
        }
        let mut guard = Self::lock(&self.shards[si]);
        let Shard {
            map,
            states,
            writes,
        } = &mut *guard;
        let now = call.now;
        states.clear();
        for item in &call.items {
            let st = match map.get(item.key.as_bytes()) {
                Some(e) if e.expires > now => {
                    if e.state.kind() != item.params.kind() {
                        return Err(StoreError::Corrupt {
                            key: item.key.clone(),
                            detail: format!(
                                "holds {} state, rule is {}",
                                e.state.kind().name(),
                                item.params.kind().name()
                            ),
                        });
                    }
                    Some(e.state.clone())
                }
                _ => None,
            };
            states.push(st);
        }
        let result = apply_into(call, states, writes);
        for (item, w) in call.items.iter().zip(writes.drain(..)) {
            if let Write::Put(state, ttl) = w {
                if ttl == 0 {
                    map.remove(item.key.as_bytes());
                } else {
                    self.insert(
                        map,
                        &item.key,
                        Entry {
                            state,
                            expires: now + ttl,
                        },
                        now,
                    );
                }
            }
        }
        Ok(result)
    }

    fn insert(&self, map: &mut KeyedMap<InlineKey, Entry>, key: &str, e: Entry, now: Micros) {
        if let Some(slot) = map.get_mut(key.as_bytes()) {
            *slot = e;
            return;
        }
        if map.len() >= self.per_shard_cap {
            map.retain(|_, v| v.expires > now);
        }
        if map.len() >= self.per_shard_cap {
            let victim = map
                .iter()
                .take(EVICTION_SAMPLE)
                .min_by_key(|(_, v)| v.expires)
                .map(|(k, _)| k.clone());
            if let Some(v) = victim {
                map.remove(&v);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        map.insert(InlineKey::from_slice(key.as_bytes()), e);
    }

    /// Frees a concurrency slot.
    pub fn release_sync(&self, key: &str, request_id: &str, now: Micros) -> bool {
        let mut shard = Self::lock(self.shard(key));
        let map = &mut shard.map;
        let Some(e) = map.get(key.as_bytes()).filter(|e| e.expires > now) else {
            return false;
        };
        let (next, freed) = algo::release(Some(&e.state), request_id, now);
        match next {
            Some(state) => {
                let expires = e.expires;
                map.insert(
                    InlineKey::from_slice(key.as_bytes()),
                    Entry { state, expires },
                );
            }
            None => {
                map.remove(key.as_bytes());
            }
        }
        freed
    }

    /// Drops expired entries; returns how many. The daemon calls it on a timer.
    pub fn sweep(&self, now: Micros) -> usize {
        let mut n = 0;
        for s in &self.shards {
            let m = &mut Self::lock(s).map;
            let before = m.len();
            m.retain(|_, v| v.expires > now);
            n += before - m.len();
        }
        n
    }

    /// Drops everything (local buckets after Redis recovers).
    pub fn clear(&self) {
        for s in &self.shards {
            Self::lock(s).map.clear();
        }
    }

    /// Keys held, expired ones included until swept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| Self::lock(s).map.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys evicted at the bound so far.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// The live state of a key (tests, snapshots).
    pub fn get(&self, key: &str, now: Micros) -> Option<State> {
        Self::lock(self.shard(key))
            .map
            .get(key.as_bytes())
            .filter(|e| e.expires > now)
            .map(|e| e.state.clone())
    }
}

impl Store for MemoryStore {
    fn check<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<CallResult, StoreError>> {
        Box::pin(std::future::ready(self.check_sync(call)))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        request_id: &'a str,
        now: Micros,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(
            self.release_sync(key, request_id, now)
        )))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::algo::Window;
    use sluice_core::batch::Item;
    use sluice_core::{Params, Remote};

    #[test]
    fn tag_follows_redis_cluster() {
        assert_eq!(tag("sl:{d|k=v}:rule"), "d|k=v");
        assert_eq!(tag("plain"), "plain");
        assert_eq!(tag("a{}b"), "a{}b");
        assert_eq!(tag("a}b{c}d"), "c");
        assert_eq!(tag("{a}{b}"), "a");
        assert_eq!(tag("x{open"), "x{open");
        assert_eq!(tag("é{ü}"), "ü");
    }

    fn call(key: &str, now: Micros, params: Params) -> Call {
        Call {
            now,
            cost: 1,
            request_id: "r".into(),
            items: vec![Item {
                key: key.into(),
                params,
                enforce: true,
                charge_rejected: false,
                remote: Remote::default(),
            }],
        }
    }

    #[test]
    fn entries_expire_and_the_bound_evicts() {
        let s = MemoryStore::new(SHARDS); // one key per shard
        let p = Params::FixedWindow {
            limit: 1,
            window: Window::Epoch(1_000),
        };
        assert!(
            s.check_sync(&call("sl:{a}:r", 0, p.clone()))
                .expect("ok")
                .allowed
        );
        assert!(
            !s.check_sync(&call("sl:{a}:r", 10, p.clone()))
                .expect("ok")
                .allowed
        );
        assert!(
            s.check_sync(&call("sl:{a}:r", 1_000, p.clone()))
                .expect("ok")
                .allowed
        );
        assert_eq!(s.sweep(5_000), 1);
        for i in 0..500 {
            s.check_sync(&call(&format!("sl:{{k{i}}}:r"), 0, p.clone()))
                .expect("ok");
        }
        assert!(s.len() <= SHARDS);
        assert!(s.evictions() > 0);
    }

    #[test]
    fn a_key_of_another_algorithm_is_corrupt_not_a_panic() {
        let s = MemoryStore::default();
        s.check_sync(&call(
            "sl:{a}:r",
            0,
            Params::Gcra {
                rate_per_s: 1,
                burst: 1,
            },
        ))
        .expect("ok");
        let err = s
            .check_sync(&call(
                "sl:{a}:r",
                0,
                Params::SlidingLog {
                    limit: 1,
                    window: 1_000,
                },
            ))
            .expect_err("corrupt");
        assert!(!err.retryable());
    }

    #[test]
    fn concurrent_checks_admit_exactly_the_limit() {
        let s = std::sync::Arc::new(MemoryStore::default());
        let p = Params::FixedWindow {
            limit: 1000,
            window: Window::Epoch(3_600_000_000),
        };
        let admitted = std::sync::Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (s, p, a) = (s.clone(), p.clone(), admitted.clone());
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        if s.check_sync(&call("sl:{hot}:r", 1, p.clone()))
                            .expect("ok")
                            .allowed
                        {
                            a.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 1000);
    }
}
