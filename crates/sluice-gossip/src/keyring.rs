//! The shared keys of a cluster, changed without a restart.
//!
//! Rotating the gossip key must not split the cluster: daemons pick up a new key file one by
//! one, so for a while some seal with the old key and some with the new. A ring holds up to
//! [`MAX_KEYS`] keys: the first seals, every one opens. A rotation is three rollouts of the
//! key file, each safe while half done: `old` → `old, new` (everyone still seals with old,
//! and now accepts new) → `new, old` (seals with new, still accepts old) → `new`. The ring
//! counts frames opened with a key other than the first, so an operator knows when the old
//! key is no longer in use anywhere before dropping it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::wire::{CodecError, MIN_KEY_LEN, TAG_LEN};

/// Keys a ring holds at once: the current one and the one being rotated in or out.
pub const MAX_KEYS: usize = 2;

type Key = Hmac<Sha256>;

/// The keys of a cluster (see the module docs).
pub(crate) struct KeyRing {
    keys: RwLock<Arc<[Key]>>,
    older: AtomicU64,
}

fn build(keys: &[&[u8]]) -> Result<Arc<[Key]>, CodecError> {
    if keys.is_empty() || keys.len() > MAX_KEYS {
        return Err(CodecError::KeyCount(keys.len()));
    }
    keys.iter()
        .map(|k| {
            if k.len() < MIN_KEY_LEN {
                return Err(CodecError::KeyTooShort(k.len()));
            }
            // HMAC takes keys of any length: this cannot fail, but is not unwrapped.
            Key::new_from_slice(k).map_err(|_| CodecError::KeyTooShort(k.len()))
        })
        .collect()
}

impl KeyRing {
    /// A ring of `keys`, the first sealing.
    pub(crate) fn new(keys: &[&[u8]]) -> Result<KeyRing, CodecError> {
        Ok(KeyRing {
            keys: RwLock::new(build(keys)?),
            older: AtomicU64::new(0),
        })
    }

    /// Replaces the keys; frames in flight are checked against the new ones.
    pub(crate) fn replace(&self, keys: &[&[u8]]) -> Result<(), CodecError> {
        let next = build(keys)?;
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }

    fn current(&self) -> Arc<[Key]> {
        self.keys.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The tag of `bytes` under the sealing key.
    pub(crate) fn tag(&self, bytes: &[u8]) -> [u8; TAG_LEN] {
        let keys = self.current();
        let mut mac = keys[0].clone();
        mac.update(bytes);
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the tag of `bytes` under any key (compared in constant time).
    pub(crate) fn verify(&self, bytes: &[u8], tag: &[u8]) -> bool {
        let keys = self.current();
        for (i, key) in keys.iter().enumerate() {
            let mut mac = key.clone();
            mac.update(bytes);
            if mac.verify_slice(tag).is_ok() {
                if i > 0 {
                    self.older.fetch_add(1, Ordering::Relaxed);
                }
                return true;
            }
        }
        false
    }

    /// Frames opened with a key other than the sealing one, so far.
    pub(crate) fn older_key_opens(&self) -> u64 {
        self.older.load(Ordering::Relaxed)
    }

    /// Keys held now.
    pub(crate) fn len(&self) -> usize {
        self.current().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &[u8] = b"the old cluster key, 32 bytes...";
    const NEW: &[u8] = b"the new cluster key, 32 bytes...";

    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let ring = KeyRing::new(&[NEW, OLD]).expect("ring");
        let old = KeyRing::new(&[OLD]).expect("ring");
        let new = KeyRing::new(&[NEW]).expect("ring");
        let msg = b"frame bytes";
        assert!(new.verify(msg, &ring.tag(msg)), "sealed with the first key");
        assert!(!old.verify(msg, &ring.tag(msg)));
        assert!(ring.verify(msg, &old.tag(msg)));
        assert!(ring.verify(msg, &new.tag(msg)));
        assert_eq!(ring.older_key_opens(), 1, "only the old key's frame counts");
        assert!(!ring.verify(msg, &[0u8; TAG_LEN]));
        assert!(!ring.verify(b"other bytes", &new.tag(msg)));
    }

    #[test]
    fn every_half_done_step_of_a_rotation_interoperates() {
        // Each step's rollout leaves daemons on the step before and the step after.
        let steps: [&[&[u8]]; 4] = [&[OLD], &[OLD, NEW], &[NEW, OLD], &[NEW]];
        for pair in steps.windows(2) {
            let a = KeyRing::new(pair[0]).expect("ring");
            let b = KeyRing::new(pair[1]).expect("ring");
            let msg = b"membership";
            assert!(
                b.verify(msg, &a.tag(msg)),
                "{} keys -> next step",
                pair[0].len()
            );
            assert!(
                a.verify(msg, &b.tag(msg)),
                "next step -> {} keys",
                pair[0].len()
            );
        }
        // Skipping a step splits the cluster: the reason for three rollouts.
        let a = KeyRing::new(&[OLD]).expect("ring");
        let c = KeyRing::new(&[NEW, OLD]).expect("ring");
        assert!(!a.verify(b"m", &c.tag(b"m")));
    }

    #[test]
    fn replace_takes_effect_at_once_and_refuses_bad_keys_whole() {
        let ring = KeyRing::new(&[OLD]).expect("ring");
        let new = KeyRing::new(&[NEW]).expect("ring");
        assert!(!ring.verify(b"m", &new.tag(b"m")));
        ring.replace(&[OLD, NEW]).expect("replace");
        assert!(ring.verify(b"m", &new.tag(b"m")));
        assert_eq!(ring.len(), 2);
        assert_eq!(
            ring.replace(&[NEW, b"short"]),
            Err(CodecError::KeyTooShort(5))
        );
        assert_eq!(ring.replace(&[]), Err(CodecError::KeyCount(0)));
        assert_eq!(ring.replace(&[OLD, NEW, OLD]), Err(CodecError::KeyCount(3)));
        assert_eq!(ring.len(), 2, "a refused replacement changes nothing");
        assert!(ring.verify(b"m", &new.tag(b"m")));
    }
}
