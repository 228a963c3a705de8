//! Redis Cluster's key → slot function, for [`crate::Store::shard_of`].
//!
//! The store needs to know which node a key lives on (a circuit breaker per shard) without
//! asking the server, so it hashes keys itself, exactly as Redis Cluster does.
//!
//! `sluice_testkit::key_slot` is a second, separately written copy, kept on purpose: the test
//! kit stays free of the store's dependencies, and its copy is checked against a real
//! server's `CLUSTER KEYSLOT`. The tests below hold this one to it.

/// Number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial 0): Redis Cluster's key hash.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The Cluster slot of `key`: CRC16 of its hash tag (the bytes between the first `{` and the
/// next `}`, when not empty) or of the whole key, mod 16384.
pub fn key_slot(key: &str) -> u16 {
    let k = key.as_bytes();
    let hashed = k
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &k[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(k);
    crc16(hashed) % SLOTS as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_redis_reference_values() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot("sl:{d|k=v}:a"), key_slot("sl:{d|k=v}:b:123"));
    }

    #[test]
    fn agrees_with_the_testkit_copy_on_hash_tag_edge_cases() {
        for key in [
            "",
            "foo",
            "bar",
            "123456789",
            "{user1000}.following",
            "foo{bar}{zap}",
            "foo{}{bar}",
            "foo{bar",
            "foo}bar{",
            "foo{{bar}}zap",
            "{}",
            "{",
            "}",
            "sl:{edge|user=u}:f:per-user",
            "ключ{é}",
        ] {
            assert_eq!(key_slot(key), sluice_testkit::key_slot(key), "{key:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_the_testkit_copy_on_brace_heavy_keys(key in "[a-z{}:|=]{0,24}") {
            proptest::prop_assert_eq!(key_slot(&key), sluice_testkit::key_slot(&key));
        }

        #[test]
        fn agrees_with_the_testkit_copy_on_store_keys(
            identity in "[a-z0-9|=._-]{0,16}",
            rule in "[a-z0-9-]{1,12}",
        ) {
            let key = sluice_core::matching::store_key(
                &identity,
                &rule,
                sluice_core::algo::Kind::FixedWindow,
            );
            proptest::prop_assert_eq!(key_slot(&key), sluice_testkit::key_slot(&key));
        }

        #[test]
        fn agrees_with_the_testkit_copy_on_any_string(key in proptest::prelude::any::<String>()) {
            proptest::prop_assert_eq!(key_slot(&key), sluice_testkit::key_slot(&key));
        }
    }
}
