//! Redis Cluster's key → slot function, for [`crate::Store::shard_of`].
//!
//! The store needs to know which node a key lives on (a circuit breaker per shard) without
//! asking the server, so it hashes keys itself, exactly as Redis Cluster does: the `crc16`
//! crate's XMODEM (the one the redis crate's cluster client hashes with), over the hash tag.
//! This is the workspace's one copy; `tests/slot.rs` holds it to a real server's
//! `CLUSTER KEYSLOT`, and the test kit asks its servers instead of hashing.

/// Number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial 0): Redis Cluster's key hash.
fn crc16(data: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(data)
}

/// The Cluster slot of `key`: CRC16 of its hash tag ([`sluice_core::keys::hash_tag`]: the
/// bytes between the first `{` and the next `}`, when not empty) or of the whole key, mod 16384.
pub fn key_slot(key: &str) -> u16 {
    crc16(sluice_core::keys::hash_tag(key).as_bytes()) % SLOTS as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_redis_reference_values() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("bar"), 5061);
        assert_eq!(key_slot(""), 0);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        // Only the first `{...}` counts.
        assert_eq!(key_slot("foo{bar}{zap}"), key_slot("bar"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        // No closing brace: the whole key.
        assert_eq!(key_slot("foo{bar"), crc16(b"foo{bar") % 16384);
        // The tag ends at the first `}` after the first `{`.
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
        assert_eq!(key_slot("sl:{d|k=v}:a"), key_slot("sl:{d|k=v}:b:123"));
    }
}
