//! The in-memory store: the embedded default, the per-daemon `local` buckets used when Redis
//! fails, and the simulator's store.
//!
//! Sharded by the key's hash tag, so all keys of one identity share a shard (one lock per
//! call) and distinct identities rarely contend. The shard of a tag is a keyed hash (SipHash
//! under the store's seed): tags are client-chosen, and with a public hash a client could aim
//! every key at one shard, its lock and its share of the bound.
//!
//! Entries expire when their state carries no more information; expired entries are skipped
//! on read and swept by [`MemoryStore::sweep`]. The number of keys is bounded per shard, and a
//! new key at the bound costs a constant number of slots, whatever the bound: it sweeps the
//! next few slots of the shard's table for expired entries (a cursor that goes round the
//! table), and if the shard is still full, evicts the soonest-expiring (the least informative
//! state) of a few slots drawn at random, counted in [`MemoryStore::evictions`]. The draws come
//! from a small generator per shard seeded with the store, so a seeded store (the
//! simulator's) evicts the same keys on every run.

use crate::{BoxFuture, Store, StoreError};
use hashbrown::HashTable;
use hashbrown::hash_table::Entry as Slot;
use siphasher::sip::SipHasher13;
use sluice_core::batch::{Call, CallResult, GiveBack, Write, apply_into};
use sluice_core::hash::{InlineKey, Keyed};
use sluice_core::keys::hash_tag;
use sluice_core::{Micros, State, algo};
use sluice_rng::splitmix64;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 64;
/// Slots a new key at the bound draws to choose its victim from (Redis samples 5 by default).
const EVICTION_SAMPLE: usize = 8;
/// Slots a draw looks at, from the drawn one on, for a full one; a draw that finds none is
/// skipped. A full shard's table is at least a fifth full, so that is rare.
const MAX_PROBE: usize = 16;
/// Slots a new key at the bound sweeps for expired entries before it evicts.
const SWEEP_STEP: usize = 16;
/// Slots [`MemoryStore::sweep`] looks at per hold of a shard's lock.
const SWEEP_CHUNK: usize = 4_096;

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    expires: Micros,
}

/// One shard: its keys, and buffers a call reuses under the shard's lock (a call allocates
/// no scratch space of its own).
#[derive(Debug)]
struct Shard {
    map: Table,
    writes: Vec<Write>,
    /// Each item's key hash, taken when its state is read and used again to write it.
    hashes: Vec<u64>,
}

/// A shard's keys. hashbrown's table rather than std's map: the bound needs what std's map
/// hides, a slot by its index (random draws and a sweep cursor, each in constant time).
#[derive(Debug)]
struct Table {
    /// Short keys sit inside the slots (no pointer to follow on a lookup).
    slots: HashTable<(InlineKey, Entry)>,
    hasher: Keyed,
    /// The next slot the bound's sweep looks at.
    cursor: usize,
    /// The bound's generator (SplitMix64 state).
    rng: u64,
    /// Slots the bound looked at since the store last read it (tests assert its cost).
    #[cfg(test)]
    visited: u64,
}

impl Table {
    fn new(hasher: Keyed, rng: u64) -> Table {
        Table {
            slots: HashTable::new(),
            hasher,
            cursor: 0,
            rng,
            #[cfg(test)]
            visited: 0,
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    fn clear(&mut self) {
        self.slots.clear();
    }

    fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.get_hashed(self.hash(key), key)
    }

    /// [`Table::get`] with the key's hash already taken.
    fn get_hashed(&self, h: u64, key: &[u8]) -> Option<&Entry> {
        self.slots
            .find(h, |(k, _)| k.as_slice() == key)
            .map(|(_, e)| e)
    }

    fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let h = self.hash(key);
        let found = self.slots.find_entry(h, |(k, _)| k.as_slice() == key);
        found.ok().map(|o| o.remove().0.1)
    }

    /// Sets a key's entry, past the bound if it is new: new keys go through
    /// [`MemoryStore::insert`].
    fn insert(&mut self, key: InlineKey, e: Entry) {
        let Table { slots, hasher, .. } = self;
        let h = hasher.hash_one(key.as_slice());
        let rehash = |(k, _): &(InlineKey, Entry)| hasher.hash_one(k.as_slice());
        match slots.entry(h, |(k, _)| *k == key, rehash) {
            Slot::Occupied(mut o) => o.get_mut().1 = e,
            Slot::Vacant(v) => {
                v.insert((key, e));
            }
        }
    }

    /// Drops the expired entries of `n` slots from slot `from` on (wrapping round); returns
    /// how many.
    fn sweep_slots(&mut self, from: usize, n: usize, now: Micros) -> usize {
        let mask = self.slots.num_buckets() - 1;
        let mut dropped = 0;
        for j in 0..n {
            #[cfg(test)]
            {
                self.visited += 1;
            }
            if let Ok(o) = self.slots.get_bucket_entry((from + j) & mask)
                && o.get().1.expires <= now
            {
                o.remove();
                dropped += 1;
            }
        }
        dropped
    }

    /// The bound's sweep: the next [`SWEEP_STEP`] slots from the cursor.
    fn sweep_step(&mut self, now: Micros) {
        let buckets = self.slots.num_buckets();
        let n = SWEEP_STEP.min(buckets);
        self.sweep_slots(self.cursor, n, now);
        self.cursor = (self.cursor + n) & (buckets - 1);
    }

    /// Removes the soonest-expiring entry among [`EVICTION_SAMPLE`] slots drawn at random
    /// (each the first full slot from a drawn index on), and returns it.
    fn evict_sampled(&mut self) -> Option<Entry> {
        let mask = self.slots.num_buckets() - 1;
        let probe = MAX_PROBE.min(mask + 1);
        let mut best: Option<(usize, Micros)> = None;
        for _ in 0..EVICTION_SAMPLE {
            // The table's size is a power of two: the mask keeps the draw uniform.
            let start = splitmix64(&mut self.rng) as usize;
            for j in 0..probe {
                let i = start.wrapping_add(j) & mask;
                #[cfg(test)]
                {
                    self.visited += 1;
                }
                if let Some((_, e)) = self.slots.get_bucket(i) {
                    if best.is_none_or(|(_, soonest)| e.expires < soonest) {
                        best = Some((i, e.expires));
                    }
                    break;
                }
            }
        }
        let (i, _) = best?;
        self.slots.get_bucket_entry(i).ok().map(|o| o.remove().0.1)
    }
}

/// A fair share item's state: its tenant's bucket under `key` and the parent under
/// [`sluice_core::keys::fair_share_parent`], both token buckets, read in the one shard their
/// hash tag (the domain) picks, so one lock covers both.
fn fair_share_state(map: &Table, key: &str, now: Micros) -> Result<State, StoreError> {
    let half = |k: &str| match map.get(k.as_bytes()) {
        Some(e) if e.expires > now => match &e.state {
            st @ State::TokenBucket { .. } => Ok(Some(Box::new(st.clone()))),
            other => Err(StoreError::Corrupt {
                key: k.to_string(),
                detail: format!("holds {} state, rule is a fair share", other.kind().name()),
            }),
        },
        _ => Ok(None),
    };
    Ok(State::FairShare {
        child: half(key)?,
        parent: half(sluice_core::keys::fair_share_parent(key))?,
    })
}

/// Sharded map from key to state with expiry and a key bound.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Vec<Mutex<Shard>>,
    per_shard_cap: usize,
    /// SipHash keys of the shard choice.
    shard_keys: (u64, u64),
    evictions: AtomicU64,
    /// Entries the bound looked at (tests assert the cost of an insert at the bound).
    #[cfg(test)]
    visited: AtomicU64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(1_000_000)
    }
}

impl MemoryStore {
    /// A store holding at most about `max_keys` keys, its shard choice, maps and eviction
    /// draws keyed by a seed drawn from OS randomness (keys are client-chosen: see [`Keyed`]).
    pub fn new(max_keys: usize) -> MemoryStore {
        let seed = std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64);
        MemoryStore::with_seed(max_keys, seed)
    }

    /// A store whose shard choice, maps and eviction draws all derive from `seed`: which keys
    /// share a shard and which the bound evicts follow from it, so a reproducible run (the
    /// simulator) passes a seed of its own.
    pub fn with_seed(max_keys: usize, seed: u64) -> MemoryStore {
        let mut mix = seed;
        let shard_keys = (splitmix64(&mut mix), splitmix64(&mut mix));
        MemoryStore {
            shards: (0..SHARDS)
                .map(|i| {
                    Mutex::new(Shard {
                        map: Table::new(Keyed::new(seed ^ i as u64), splitmix64(&mut mix)),
                        writes: Vec::new(),
                        hashes: Vec::new(),
                    })
                })
                .collect(),
            per_shard_cap: max_keys.div_ceil(SHARDS).max(1),
            shard_keys,
            evictions: AtomicU64::new(0),
            #[cfg(test)]
            visited: AtomicU64::new(0),
        }
    }

    /// The shard of a hash tag, by a keyed hash: a client cannot aim its tags at one shard.
    fn shard_of_tag(&self, tag: &str) -> usize {
        let mut h = SipHasher13::new_with_keys(self.shard_keys.0, self.shard_keys.1);
        h.write(tag.as_bytes());
        ((u128::from(h.finish()) * SHARDS as u128) >> 64) as usize
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[self.shard_of_tag(hash_tag(key))]
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
        let first_tag = hash_tag(&first.key);
        let si = self.shard_of_tag(first_tag);
        if call.items[1..].iter().any(|i| {
            let t = hash_tag(&i.key);
            t != first_tag && self.shard_of_tag(t) != si
        }) {
            return Err(StoreError::Server(
                "keys of one call must share a hash tag".into(),
            ));
        }
        let mut guard = Self::lock(&self.shards[si]);
        let Shard {
            map,
            writes,
            hashes,
        } = &mut *guard;
        let now = call.now;
        // Read in place: a state is lent to the arithmetic, not copied (a fair share's two
        // halves are put together, so owned). On the stack up to 8 items, an identity's rules
        // in one call; a larger call allocates.
        let mut states: SmallVec<[Option<Cow<'_, State>>; 8]> = SmallVec::new();
        hashes.clear();
        for item in &call.items {
            if let algo::Params::FairShare(_) = item.params {
                states.push(Some(Cow::Owned(fair_share_state(map, &item.key, now)?)));
                hashes.push(0);
                continue;
            }
            // Hashed once: the write below finds the key by the same hash.
            let h = map.hash(item.key.as_bytes());
            hashes.push(h);
            let st = match map.get_hashed(h, item.key.as_bytes()) {
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
                    Some(Cow::Borrowed(&e.state))
                }
                _ => None,
            };
            states.push(st);
        }
        let result = apply_into(call, &states, writes);
        drop(states);
        for ((item, w), &h) in call.items.iter().zip(writes.drain(..)).zip(hashes.iter()) {
            if let (
                algo::Params::FairShare(fs),
                Write::Put(State::FairShare { child, parent }, _),
            ) = (&item.params, &w)
            {
                // Each half under its own key, with its own TTL (the parent is every tenant's).
                let parent_key = sluice_core::keys::fair_share_parent(&item.key);
                for (key, half, is_parent) in
                    [(&item.key[..], child, false), (parent_key, parent, true)]
                {
                    let Some(half) = half else { continue };
                    let ttl = algo::fair_share::half_ttl(fs, half, is_parent, now);
                    if ttl == 0 {
                        map.remove(key.as_bytes());
                    } else {
                        let e = Entry {
                            state: (**half).clone(),
                            expires: now + ttl,
                        };
                        self.insert(map, key, e, now);
                    }
                }
                continue;
            }
            if let Write::Put(state, ttl) = w {
                if ttl == 0 {
                    map.remove(item.key.as_bytes());
                } else {
                    let e = Entry {
                        state,
                        expires: now + ttl,
                    };
                    self.insert_hashed(map, h, &item.key, e, now);
                }
            }
        }
        Ok(result)
    }

    /// Sets a key's entry; a new key at its shard's bound first makes room (see the module
    /// doc): a constant number of slots, however large the shard.
    fn insert(&self, map: &mut Table, key: &str, e: Entry, now: Micros) {
        let h = map.hash(key.as_bytes());
        self.insert_hashed(map, h, key, e, now);
    }

    /// [`MemoryStore::insert`] with the key's hash `h` already taken.
    fn insert_hashed(&self, map: &mut Table, h: u64, key: &str, e: Entry, now: Micros) {
        let key = key.as_bytes();
        if let Some((_, slot)) = map.slots.find_mut(h, |(k, _)| k.as_slice() == key) {
            *slot = e;
            return;
        }
        if map.len() >= self.per_shard_cap {
            map.sweep_step(now);
        }
        if map.len() >= self.per_shard_cap
            && let Some(victim) = map.evict_sampled()
            && victim.expires > now
        {
            // An expired victim is a sweep, not an eviction: it held nothing.
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(test)]
        self.visited
            .fetch_add(std::mem::take(&mut map.visited), Ordering::Relaxed);
        let Table { slots, hasher, .. } = map;
        slots.insert_unique(h, (InlineKey::from_slice(key), e), |(k, _)| {
            hasher.hash_one(k.as_slice())
        });
    }

    /// Gives back units a lease did not spend (see [`Store::give_back`]): the synchronous
    /// call, for the daemon's local buckets and the simulator. `Ok(true)` when the key's state
    /// was written (or deleted: a bucket full again), `Ok(false)` when there was nothing to
    /// give back to.
    pub fn give_back_sync(&self, g: &GiveBack) -> Result<bool, StoreError> {
        let kind = g.params.kind();
        if !kind.leasable() {
            return Err(crate::not_leasable(g));
        }
        // As Redis refuses it (a cost above any limit is refused alike): same answer anywhere.
        if g.units > sluice_core::algo::MAX_LIMIT {
            return Err(StoreError::Server(format!(
                "give-back of {} units is above the largest limit {}",
                g.units,
                sluice_core::algo::MAX_LIMIT
            )));
        }
        let mut shard = Self::lock(self.shard(&g.key));
        let map = &mut shard.map;
        let state = match map.get(g.key.as_bytes()) {
            Some(e) if e.expires > g.now => {
                if e.state.kind() != kind {
                    return Err(StoreError::Corrupt {
                        key: g.key.clone(),
                        detail: format!(
                            "holds {} state, rule is {}",
                            e.state.kind().name(),
                            kind.name()
                        ),
                    });
                }
                e.state.clone()
            }
            _ => return Ok(false),
        };
        match g.write(Some(&state)) {
            Write::Keep => Ok(false),
            Write::Put(_, 0) => {
                map.remove(g.key.as_bytes());
                Ok(true)
            }
            Write::Put(state, ttl) => {
                // The key exists: an update, never a new key at the bound.
                map.insert(
                    InlineKey::from_slice(g.key.as_bytes()),
                    Entry {
                        state,
                        expires: g.now + ttl,
                    },
                );
                Ok(true)
            }
        }
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
    ///
    /// A shard's lock is held for 4,096 slots at a time, so a call on the shard
    /// waits for one chunk at most, not for the whole shard. Entries that a table growing
    /// between two chunks moves behind the sweep wait for the next sweep.
    pub fn sweep(&self, now: Micros) -> usize {
        let mut n = 0;
        for s in &self.shards {
            let mut at = 0;
            loop {
                let map = &mut Self::lock(s).map;
                let buckets = map.slots.num_buckets();
                if at >= buckets {
                    break;
                }
                let len = SWEEP_CHUNK.min(buckets - at);
                n += map.sweep_slots(at, len, now);
                at += len;
            }
        }
        n
    }

    /// Drops everything (local buckets after Redis recovers).
    pub fn clear(&self) {
        for s in &self.shards {
            Self::lock(s).map.clear();
        }
    }

    /// Keeps only the keys `keep` accepts (the daemon drops the local buckets of one store
    /// shard when that shard recovers, and keeps the others'). A whole scan under each shard's
    /// lock in turn: for rare events, not the hot path.
    pub fn retain_keys(&self, keep: impl Fn(&str) -> bool) {
        for s in &self.shards {
            Self::lock(s)
                .map
                .slots
                .retain(|(k, _)| std::str::from_utf8(k.as_slice()).map_or(true, &keep));
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

    fn give_back<'a>(&'a self, g: &'a GiveBack) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(self.give_back_sync(g)))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn outages(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::algo::Window;
    use sluice_core::batch::Item;
    use sluice_core::hash::stable_hash;
    use sluice_core::{Params, Rate, Remote};

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

    /// A fixed window of `window` µs: a key written at `now` expires at the window's end.
    fn window(window: Micros) -> Params {
        Params::FixedWindow {
            limit: 1_000,
            window: Window::Epoch(window),
        }
    }

    fn shard_lens(s: &MemoryStore) -> Vec<usize> {
        s.shards
            .iter()
            .map(|m| MemoryStore::lock(m).map.len())
            .collect()
    }

    #[test]
    fn keys_aimed_at_one_shard_by_the_public_hash_spread_over_all() {
        // Tags the public hash (FNV-1a, in the source) sends to shard 0: what a client who
        // read the code would send to load one shard's lock and fill its bound.
        let aimed: Vec<String> = (0..)
            .map(|i| format!("t{i}"))
            .filter(|t| stable_hash(&[t]).is_multiple_of(SHARDS as u64))
            .take(640)
            .collect();
        let s = MemoryStore::new(1 << 20);
        for t in &aimed {
            s.check_sync(&call(&format!("sl:{{{t}}}:r"), 0, window(1_000)))
                .expect("ok");
        }
        let lens = shard_lens(&s);
        // About 10 per shard under a secret seed; one shard with a fifth is already aimed.
        assert!(
            lens.iter().all(|&n| n < aimed.len() / 5),
            "keys per shard: {lens:?}"
        );
        assert!(
            lens.iter().filter(|&&n| n > 0).count() > SHARDS / 2,
            "{lens:?}"
        );
    }

    #[test]
    fn a_seeded_store_is_reproducible() {
        let run = |seed| {
            let s = MemoryStore::with_seed(SHARDS * 8, seed);
            for i in 0..2_000u64 {
                s.check_sync(&call(
                    &format!("sl:{{k{}}}:r", i % 700),
                    i,
                    window(i % 5 * 100 + 50),
                ))
                .expect("ok");
            }
            let live: Vec<bool> = (0..700)
                .map(|i| s.get(&format!("sl:{{k{i}}}:r"), 2_000).is_some())
                .collect();
            (shard_lens(&s), live, s.evictions())
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7).0, run(8).0);
    }

    #[test]
    fn the_bound_evicts_the_soonest_expiring_wherever_they_sit() {
        // One identity (one hash tag, so one shard) at a bound of `cap` keys.
        let cap = 256;
        let s = MemoryStore::with_seed(cap * SHARDS, 1);
        let old = |i| format!("sl:{{one}}:old{i}");
        // `cap` keys expiring at 1 s fill the shard...
        for i in 0..cap {
            s.check_sync(&call(&old(i), 0, window(1_000_000)))
                .expect("ok");
        }
        // ...then twice as many keys expiring at 2 s arrive, each evicting one key.
        for i in 0..2 * cap {
            s.check_sync(&call(&format!("sl:{{one}}:new{i}"), 1, window(2_000_000)))
                .expect("ok");
        }
        assert_eq!(s.evictions(), 2 * cap as u64);
        // The old keys expire first, so they are the ones to go, wherever their slots are.
        let left = (0..cap).filter(|&i| s.get(&old(i), 1).is_some()).count();
        assert!(left <= cap / 20, "{left} of {cap} old keys left");
    }

    #[test]
    fn an_insert_at_the_bound_visits_a_bounded_number_of_entries() {
        let cap = 4_096;
        let s = MemoryStore::with_seed(cap * SHARDS, 2);
        for i in 0..cap {
            s.check_sync(&call(&format!("sl:{{one}}:a{i}"), 0, window(1_000_000)))
                .expect("ok");
        }
        let before = s.visited.load(Ordering::Relaxed);
        let inserts = 4 * cap;
        let mut most = 0;
        for i in 0..inserts {
            let at = s.visited.load(Ordering::Relaxed);
            s.check_sync(&call(&format!("sl:{{one}}:b{i}"), 1, window(2_000_000)))
                .expect("ok");
            most = most.max(s.visited.load(Ordering::Relaxed) - at);
        }
        assert_eq!(s.evictions(), inserts as u64);
        // Independent of the shard's size: a few sampled entries and a few swept slots.
        let per_insert = (s.visited.load(Ordering::Relaxed) - before) / inserts as u64;
        assert!(per_insert <= 64, "{per_insert} entries visited per insert");
        assert!(
            most <= (SWEEP_STEP + EVICTION_SAMPLE * MAX_PROBE) as u64,
            "{most} entries visited by one insert"
        );
    }

    #[test]
    fn at_the_bound_expired_keys_make_room_before_live_ones_go() {
        let cap = 256;
        let s = MemoryStore::with_seed(cap * SHARDS, 3);
        for i in 0..cap {
            s.check_sync(&call(&format!("sl:{{one}}:old{i}"), 0, window(1_000)))
                .expect("ok");
        }
        // Every old key has expired: the new ones replace them without an eviction.
        for i in 0..cap {
            s.check_sync(&call(
                &format!("sl:{{one}}:new{i}"),
                1_000,
                window(1_000_000),
            ))
            .expect("ok");
        }
        assert_eq!(s.evictions(), 0);
        assert!((0..cap).all(|i| s.get(&format!("sl:{{one}}:new{i}"), 1_000).is_some()));
        assert_eq!(s.len(), cap);
    }

    #[test]
    fn sweep_drops_every_expired_key_of_a_shard_larger_than_a_chunk() {
        let s = MemoryStore::with_seed(1 << 20, 4);
        let n = 3 * SWEEP_CHUNK;
        for i in 0..n {
            let ends = if i % 2 == 0 { 1_000 } else { 1_000_000 };
            s.check_sync(&call(&format!("sl:{{one}}:k{i}"), 0, window(ends)))
                .expect("ok");
        }
        assert_eq!(s.sweep(1_000), n / 2);
        assert_eq!(s.len(), n / 2);
        assert_eq!(s.sweep(1_000), 0);
    }

    #[test]
    fn a_key_of_another_algorithm_is_corrupt_not_a_panic() {
        let s = MemoryStore::default();
        s.check_sync(&call(
            "sl:{a}:r",
            0,
            Params::Gcra {
                rate: Rate::per_second(1),
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
    fn a_give_back_meets_the_state_it_finds() {
        let s = MemoryStore::default();
        let gcra = Params::Gcra {
            rate: Rate::per_second(10),
            burst: 5,
        };
        let mut c = call("sl:{a}:r", 0, gcra.clone());
        c.cost = 3;
        assert!(s.check_sync(&c).expect("ok").allowed);
        let g = GiveBack {
            key: "sl:{a}:r".into(),
            params: gcra.clone(),
            units: 1,
            taken_at: 0,
            now: 0,
        };
        assert_eq!(s.give_back_sync(&g), Ok(true));
        let tat = |s: &MemoryStore| match s.get("sl:{a}:r", 0) {
            Some(State::Gcra { tat, .. }) => tat,
            other => panic!("{other:?}"),
        };
        assert_eq!(tat(&s), 200_000);
        // Everything back: the TAT is now, the key carries nothing and goes.
        assert_eq!(
            s.give_back_sync(&GiveBack {
                units: 5,
                ..g.clone()
            }),
            Ok(true)
        );
        assert_eq!(s.get("sl:{a}:r", 0), None);
        assert_eq!(
            s.give_back_sync(&g),
            Ok(false),
            "no state: nothing to give back to"
        );
        let many = GiveBack {
            units: sluice_core::algo::MAX_LIMIT + 1,
            ..g.clone()
        };
        assert!(matches!(
            s.give_back_sync(&many),
            Err(StoreError::Server(_))
        ));
        // Another algorithm's state is corrupt, as for a check.
        s.check_sync(&c).expect("ok");
        let wrong = GiveBack {
            params: Params::TokenBucket {
                rate: Rate::per_second(1),
                burst: 5,
            },
            ..g
        };
        assert!(matches!(
            s.give_back_sync(&wrong),
            Err(StoreError::Corrupt { .. })
        ));
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
