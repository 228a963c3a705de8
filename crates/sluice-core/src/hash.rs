//! A stable 64-bit hash (FNV-1a). Rollout buckets must be identical on every daemon, on every
//! release and across restarts, so the std hasher (randomly seeded, unspecified) won't do.

/// FNV-1a over the parts, with a separator byte so `("ab","c")` and `("a","bc")` differ.
pub fn stable_hash(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// A keyed fast hasher for the maps of the hot path whose keys clients choose (store keys).
///
/// The std default (SipHash, randomly keyed) is robust but slow on the hot path, and its key
/// comes from the OS, which the core may not read. This is foldhash keyed by a seed the
/// caller passes in: the daemon's shell draws it from OS randomness (keys are
/// attacker-chosen: a secret seed keeps them from being crafted to collide), the simulator
/// derives it from its seed (runs stay reproducible).
#[derive(Clone, Debug)]
pub struct Keyed(foldhash::fast::FixedState);

impl Keyed {
    /// A hasher keyed by `seed`.
    pub fn new(seed: u64) -> Keyed {
        Keyed(foldhash::fast::FixedState::with_seed(seed))
    }
}

impl std::hash::BuildHasher for Keyed {
    type Hasher = foldhash::fast::FoldHasher<'static>;

    #[inline]
    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}

/// A map keyed by client-chosen strings, hashed with [`Keyed`].
pub type KeyedMap<K, V> = std::collections::HashMap<K, V, Keyed>;

/// A store key kept inside the map's own slot when it is short (most are): a lookup then
/// compares bytes already in the cache line it probed, instead of following a pointer to a
/// separately allocated `String` (a cache miss per lookup on large tables). Maps keyed by it
/// are looked up with `key.as_bytes()`.
pub type InlineKey = smallvec::SmallVec<[u8; 48]>;

/// The rollout bucket (0..100) of an identity for a rule.
pub fn rollout_bucket(rule_id: &str, identity: &str) -> u8 {
    (stable_hash(&[rule_id, identity]) % 100) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_pinned() {
        // Pinned values: changing them would move identities between rollout buckets.
        assert_eq!(stable_hash(&[]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash(&["a"]), stable_hash(&["a"]));
        assert_ne!(stable_hash(&["ab", "c"]), stable_hash(&["a", "bc"]));
        assert_eq!(
            rollout_bucket("r", "public-api|api_key=k1"),
            rollout_bucket("r", "public-api|api_key=k1")
        );
    }

    #[test]
    fn buckets_spread_evenly() {
        let mut counts = [0u32; 100];
        for i in 0..100_000 {
            counts[rollout_bucket("rule", &format!("k{i}")) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
