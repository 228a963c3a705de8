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
