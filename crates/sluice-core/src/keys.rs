//! Store keys: `sl:{identity}:<algorithm code>:<rule id>`, made and parsed here only.
//!
//! The identity in braces is the Redis Cluster hash tag, so every key of one identity lands
//! on one slot and one script call sees them all. The algorithm's one-letter code sits in the
//! key because an operator may change a rule's algorithm and keep its id: the old
//! algorithm's state then lies under another key, never read as the new one's (a token
//! bucket's one integer and a GCRA's look alike) and never an error; it expires on its own.
//! The same holds across regions: a figure shipped for one algorithm is never merged into
//! another's.
//!
//! A rule with `hot_keys.split: N` counts one identity under N sub-counts, each with a hash
//! tag of its own so they land on different slots: the identity followed by `|#<part>`
//! ([`sub_identity`]), e.g. `sl:{api|api_key=k1|#3}:f:per-min`. Nothing else can end that
//! way: an identity is `domain|name=value|...` with `% { } | =` escaped in the domain and the
//! values, and descriptor names are `[A-Za-z0-9_.-]`, so a `|` is always followed by a name
//! and never by `#`.

use crate::algo::Kind;

/// A store key's parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyParts<'a> {
    /// The identity (domain and key values, escaped: no `{` or `}` inside).
    pub identity: &'a str,
    /// The rule's algorithm when the key was made.
    pub kind: Kind,
    /// The rule id.
    pub rule: &'a str,
}

/// The one-letter code of an algorithm in store keys.
pub fn code(kind: Kind) -> char {
    match kind {
        Kind::TokenBucket => 't',
        Kind::Gcra => 'g',
        Kind::FixedWindow => 'f',
        Kind::SlidingWindow => 'w',
        Kind::SlidingLog => 'l',
        Kind::Concurrency => 'c',
    }
}

/// The algorithm of a one-letter code.
pub fn kind_of_code(c: u8) -> Option<Kind> {
    Some(match c {
        b't' => Kind::TokenBucket,
        b'g' => Kind::Gcra,
        b'f' => Kind::FixedWindow,
        b'w' => Kind::SlidingWindow,
        b'l' => Kind::SlidingLog,
        b'c' => Kind::Concurrency,
        _ => return None,
    })
}

/// The key a rule with id `rule_id` and algorithm `kind` counts `identity` under.
pub fn store_key(identity: &str, rule_id: &str, kind: Kind) -> String {
    let mut k = String::with_capacity(identity.len() + rule_id.len() + 8);
    k.push_str("sl:{");
    k.push_str(identity);
    k.push_str("}:");
    k.push(code(kind));
    k.push(':');
    k.push_str(rule_id);
    k
}

/// Marks a sub-count's part in its identity (`|#<part>`).
const PART: &str = "|#";

/// The identity (and hash tag) of sub-count `part` of a split rule's `identity`.
pub fn sub_identity(identity: &str, part: u32) -> String {
    let mut s = String::with_capacity(identity.len() + 4);
    s.push_str(identity);
    s.push_str(PART);
    s.push_str(itoa::Buffer::new().format(part));
    s
}

/// The inverse of [`sub_identity`]: the identity and the part, or the identity whole and
/// `None` when it is no sub-count's.
pub fn split_identity(identity: &str) -> (&str, Option<u32>) {
    if let Some((base, part)) = identity.rsplit_once(PART)
        && !part.is_empty()
        && part.bytes().all(|b| b.is_ascii_digit())
        && (part == "0" || !part.starts_with('0'))
        && let Ok(n) = part.parse()
    {
        return (base, Some(n));
    }
    (identity, None)
}

/// The inverse of [`store_key`]; `None` for anything it does not make. Neither identities
/// (escaped) nor rule ids (validated) hold a `}`, so the first `}:` ends the tag.
pub fn parse(key: &str) -> Option<KeyParts<'_>> {
    let rest = key.strip_prefix("sl:{")?;
    let (identity, tail) = rest.split_once("}:")?;
    let b = tail.as_bytes();
    if b.len() < 3 || b[1] != b':' {
        return None;
    }
    let kind = kind_of_code(b[0])?;
    let rule = &tail[2..];
    Some(KeyParts {
        identity,
        kind,
        rule,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [Kind; 6] = [
        Kind::TokenBucket,
        Kind::Gcra,
        Kind::FixedWindow,
        Kind::SlidingWindow,
        Kind::SlidingLog,
        Kind::Concurrency,
    ];

    #[test]
    fn keys_round_trip_and_differ_by_algorithm() {
        for k in KINDS {
            let key = store_key("api|api_key=k:1", "per-min:x", k);
            assert_eq!(
                parse(&key),
                Some(KeyParts {
                    identity: "api|api_key=k:1",
                    kind: k,
                    rule: "per-min:x"
                })
            );
            assert_eq!(kind_of_code(code(k) as u8), Some(k));
        }
        let all: std::collections::BTreeSet<String> =
            KINDS.iter().map(|&k| store_key("a", "r", k)).collect();
        assert_eq!(all.len(), KINDS.len());
        assert_eq!(store_key("a", "r", Kind::Gcra), "sl:{a}:g:r");
    }

    #[test]
    fn sub_counts_have_their_own_hash_tags_and_parse_back() {
        let base = "api|api_key=k%7C#1";
        let subs: std::collections::BTreeSet<String> = (0..64)
            .map(|p| store_key(&sub_identity(base, p), "r", Kind::FixedWindow))
            .collect();
        assert_eq!(subs.len(), 64);
        assert_eq!(
            store_key(&sub_identity(base, 3), "r", Kind::FixedWindow),
            "sl:{api|api_key=k%7C#1|#3}:f:r"
        );
        for p in [0, 7, 63, u32::MAX] {
            let key = store_key(&sub_identity(base, p), "r", Kind::Gcra);
            let parts = parse(&key).expect("parses");
            assert_eq!(split_identity(parts.identity), (base, Some(p)));
        }
        // Identities of unsplit rules are whole, whatever their values hold (escaped).
        for id in ["api", "api|k=v", "api|k=#3", "api|k=v%7C#3", "api|k=v|x=#1"] {
            assert_eq!(split_identity(id), (id, None), "{id}");
        }
        // Only what sub_identity makes reads as a part.
        for id in ["api|#", "api|#x", "api|#01", "api|#-1", "api|#99999999999"] {
            assert_eq!(split_identity(id).1, None, "{id}");
        }
    }

    #[test]
    fn foreign_keys_do_not_parse() {
        for k in [
            "nope",
            "sl:{a}:",
            "sl:{a}:t:",
            "sl:{a}:x:r",
            "sl:{a}:tr",
            "sl:{a}r",
        ] {
            assert_eq!(parse(k), None, "{k}");
        }
    }
}
