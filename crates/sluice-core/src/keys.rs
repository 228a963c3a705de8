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
//!
//! Whoever needs a key's or an identity's parts calls this module: [`parse`] (identity,
//! algorithm, rule), [`split_identity`] (sub-count part), [`escaped_domain`] / [`domain`]
//! (the domain, e.g. to find a received figure's rules), [`unescape`] (the inverse of
//! [`push_escaped`]) and [`hash_tag`] (what Redis Cluster hashes, for the stores' shards).

use crate::algo::Kind;
use std::borrow::Cow;

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
        Kind::LeakyQueue => 'q',
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
        b'q' => Kind::LeakyQueue,
        _ => return None,
    })
}

/// The key a rule with id `rule_id` and algorithm `kind` counts `identity` under.
pub fn store_key(identity: &str, rule_id: &str, kind: Kind) -> String {
    let mut k = String::with_capacity(identity.len() + rule_id.len() + 8);
    store_key_into(&mut k, identity, rule_id, kind);
    k
}

/// [`store_key`] written into `out` (cleared first): a reused buffer makes the key without
/// allocating, as the decision path does on every request.
pub fn store_key_into(out: &mut String, identity: &str, rule_id: &str, kind: Kind) {
    out.clear();
    out.push_str("sl:{");
    out.push_str(identity);
    out.push_str("}:");
    out.push(code(kind));
    out.push(':');
    out.push_str(rule_id);
}

/// What a rule's store keys hold after the identity (`}:<code>:<rule id>`): the same for
/// every identity, so matching makes it once per rule set ([`store_key_with_tail`]).
pub fn key_tail(rule_id: &str, kind: Kind) -> String {
    let mut t = String::with_capacity(rule_id.len() + 4);
    t.push_str("}:");
    t.push(code(kind));
    t.push(':');
    t.push_str(rule_id);
    t
}

/// [`store_key_into`] with the rule's part made beforehand by [`key_tail`].
pub fn store_key_with_tail(out: &mut String, identity: &str, tail: &str) {
    out.clear();
    out.push_str("sl:{");
    out.push_str(identity);
    out.push_str(tail);
}

/// The key of tenant `identity`'s own bucket under a `fair_share` rule:
/// `sl:{<domain>}:t:<rule id>|<identity>`. Why the domain as hash tag: the parent
/// ([`fair_share_parent`]) is shared by every tenant of the rule and must be in the same
/// Redis Cluster slot (and memory-store shard) as each child, so one atomic call reads and
/// writes both. `|` cannot occur in a rule id, so [`parse`] still finds the rule.
pub fn fair_share_key_into(out: &mut String, identity: &str, rule_id: &str) {
    out.clear();
    out.push_str("sl:{");
    out.push_str(escaped_domain(identity));
    out.push_str("}:");
    out.push(code(Kind::TokenBucket));
    out.push(':');
    out.push_str(rule_id);
    out.push('|');
    out.push_str(identity);
}

/// [`fair_share_key_into`] into a new string.
pub fn fair_share_key(identity: &str, rule_id: &str) -> String {
    let mut k = String::with_capacity(identity.len() * 2 + rule_id.len() + 8);
    fair_share_key_into(&mut k, identity, rule_id);
    k
}

/// The parent bucket's key of a `fair_share` child key: the child's up to its `|`,
/// `sl:{<domain>}:t:<rule id>`, the rule's key with no identity fields (one per rule).
pub fn fair_share_parent(child_key: &str) -> &str {
    let tail_start = child_key.find("}:").map_or(0, |i| i + 2);
    match child_key[tail_start..].find('|') {
        Some(i) => &child_key[..tail_start + i],
        None => child_key,
    }
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

/// The bytes [`push_escaped`] escapes, by value.
const ESCAPED: [bool; 256] = {
    let mut t = [false; 256];
    t[b'%' as usize] = true;
    t[b'{' as usize] = true;
    t[b'}' as usize] = true;
    t[b'|' as usize] = true;
    t[b'=' as usize] = true;
    t
};

/// Escapes what would end a hash tag (`{ }`) or blur the identity's structure (`| =`, and
/// `%` itself) in a domain or a descriptor value, appending to `out`; [`unescape`] reverses it.
pub fn push_escaped(out: &mut String, s: &str) {
    // Most values need no escape: copy them whole (one table load a byte to find out).
    if !s.bytes().any(|b| ESCAPED[usize::from(b)]) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            '|' => out.push_str("%7C"),
            '=' => out.push_str("%3D"),
            c => out.push(c),
        }
    }
}

/// The inverse of [`push_escaped`], so a received identity's domain can be looked up by
/// name. A `%` that starts none of the five escapes is kept as it is (only a forged identity
/// holds one); nothing is decoded twice (`%257C` is `%7C`).
pub fn unescape(s: &str) -> Cow<'_, str> {
    if !s.contains('%') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let c = match rest.as_bytes().get(i + 1..i + 3) {
            Some(b"25") => Some('%'),
            Some(b"7B") => Some('{'),
            Some(b"7D") => Some('}'),
            Some(b"7C") => Some('|'),
            Some(b"3D") => Some('='),
            _ => None,
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[i + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The domain of `identity` as it stands there (escaped): everything before the first `|`.
/// Escaping is one-to-one, so this tells domains apart as well as [`domain`] does, without
/// an allocation.
pub fn escaped_domain(identity: &str) -> &str {
    identity.split_once('|').map_or(identity, |(d, _)| d)
}

/// The domain of `identity`, unescaped: the name its rule set goes by.
pub fn domain(identity: &str) -> Cow<'_, str> {
    unescape(escaped_domain(identity))
}

/// The part of `key` Redis Cluster hashes to choose its slot: the bytes between the first
/// `{` and the first `}` after it when there are any, else the whole key. A store key's is
/// its identity, so every key of one identity shares a slot (and a memory store's shard).
pub fn hash_tag(key: &str) -> &str {
    // Byte scans: both braces are ASCII, so the slice bounds are char boundaries.
    let b = key.as_bytes();
    let Some(open) = b.iter().position(|&c| c == b'{') else {
        return key;
    };
    match b[open + 1..].iter().position(|&c| c == b'}') {
        Some(len) if len > 0 => &key[open + 1..open + 1 + len],
        _ => key,
    }
}

/// The inverse of [`store_key`]; `None` for anything it does not make. Neither identities
/// (escaped) nor rule ids (validated) hold a `}`, so the first `}:` ends the tag.
pub fn parse(key: &str) -> Option<KeyParts<'_>> {
    let rest = key.strip_prefix("sl:{")?;
    // The first `}` followed by `:`, found by a byte search for `}`: `split_once("}:")` set
    // up a two-way string searcher on every call (every gossiped figure is parsed).
    let mut from = 0;
    let at = loop {
        let i = from + rest[from..].find('}')?;
        if rest.as_bytes().get(i + 1) == Some(&b':') {
            break i;
        }
        from = i + 1;
    };
    parts(&rest[..at], &rest[at + 2..])
}

/// A key's parts from its identity and what follows the tag (`<kind>:<rule>[|…]`).
fn parts<'k>(identity: &'k str, tail: &'k str) -> Option<KeyParts<'k>> {
    let b = tail.as_bytes();
    if b.len() < 3 || b[1] != b':' {
        return None;
    }
    let kind = kind_of_code(b[0])?;
    // A fair share's child key carries the tenant after the rule id (`fair_share_key`).
    let rule = tail[2..].split_once('|').map_or(&tail[2..], |(r, _)| r);
    if rule.is_empty() {
        return None;
    }

    Some(KeyParts {
        identity,
        kind,
        rule,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matching::{Descriptors, identity};
    use proptest::prelude::*;

    const KINDS: [Kind; 7] = [
        Kind::TokenBucket,
        Kind::Gcra,
        Kind::FixedWindow,
        Kind::SlidingWindow,
        Kind::SlidingLog,
        Kind::Concurrency,
        Kind::LeakyQueue,
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
            // The buffer-reusing forms make the same key, whatever the buffer held.
            let mut out = String::from("stale");
            store_key_with_tail(&mut out, "api|api_key=k:1", &key_tail("per-min:x", k));
            assert_eq!(out, store_key("api|api_key=k:1", "per-min:x", k));
            store_key_into(&mut out, "b", "r", k);
            assert_eq!(out, store_key("b", "r", k));
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
            "sl:{a}",
            "sl:{a}}",
        ] {
            assert_eq!(parse(k), None, "{k}");
        }
    }

    #[test]
    fn unescape_reverses_the_identity_escapes_only() {
        assert_eq!(unescape("public-api"), "public-api");
        assert!(matches!(unescape("public-api"), Cow::Borrowed(_)));
        assert_eq!(unescape("a%7Cb%25c%3D"), "a|b%c=");
        assert_eq!(unescape("%7B%7D"), "{}");
        // Decoded once: an escaped `%` followed by `7C` is the text `%7C`.
        assert_eq!(unescape("%257C"), "%7C");
        // What no escape makes stays as it is.
        for s in ["%", "%7", "%7c", "%41", "a%", "%%7C", "%é", "100%"] {
            let want = if s == "%%7C" { "%|" } else { s };
            assert_eq!(unescape(s), want, "{s}");
        }
    }

    #[test]
    fn the_domain_is_before_the_first_bar_and_unescaped() {
        for (id, esc, dom) in [
            ("api", "api", "api"),
            ("api|k=v", "api", "api"),
            ("api|k=v%7Cw|x=y", "api", "api"),
            ("a%7Cb|k=v", "a%7Cb", "a|b"),
            ("a%7Cb|#3", "a%7Cb", "a|b"),
            ("|k=v", "", ""),
        ] {
            assert_eq!(escaped_domain(id), esc, "{id}");
            assert_eq!(domain(id), dom, "{id}");
        }
    }

    #[test]
    fn hash_tag_follows_redis_cluster() {
        assert_eq!(hash_tag("sl:{d|k=v}:rule"), "d|k=v");
        assert_eq!(hash_tag("plain"), "plain");
        assert_eq!(hash_tag(""), "");
        // Only the first `{...}` counts; an empty one does not, nor an unclosed one.
        assert_eq!(hash_tag("foo{bar}{zap}"), "bar");
        assert_eq!(hash_tag("{a}{b}"), "a");
        assert_eq!(hash_tag("a{}b"), "a{}b");
        assert_eq!(hash_tag("foo{}{bar}"), "foo{}{bar}");
        assert_eq!(hash_tag("x{open"), "x{open");
        // The tag ends at the first `}` after the first `{`.
        assert_eq!(hash_tag("foo{{bar}}zap"), "{bar");
        assert_eq!(hash_tag("a}b{c}d"), "c");
        assert_eq!(hash_tag("é{ü}"), "ü");
    }

    /// The daemon's former decoder (five replaces in turn), which [`unescape`] replaced.
    fn replaces(s: &str) -> String {
        s.replace("%7C", "|")
            .replace("%7B", "{")
            .replace("%7D", "}")
            .replace("%3D", "=")
            .replace("%25", "%")
    }

    fn kind() -> impl Strategy<Value = Kind> {
        prop::sample::select(KINDS.to_vec())
    }

    /// [`parse`] as it was, with `split_once("}:")`: the oracle for its byte search.
    fn parse_by_split_once(key: &str) -> Option<KeyParts<'_>> {
        let (identity, tail) = key.strip_prefix("sl:{")?.split_once("}:")?;
        parts(identity, tail)
    }

    /// Domains and values full of what gets escaped, or anything at all.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z%{}|=:#7CBD25é ]{0,12}", any::<String>()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn parse_inverts_store_key(
            dom in text().prop_filter("a domain has a name", |d| !d.is_empty()),
            fields in prop::collection::btree_map("[A-Za-z0-9_.-]{1,8}", text(), 0..4),
            part in prop::option::of(any::<u32>()),
            rule in "[A-Za-z0-9_.:-]{1,64}",
            kind in kind(),
        ) {
            let names: Vec<crate::rules::KeyField> =
                fields.keys().map(crate::rules::KeyField::whole).collect();
            let d = Descriptors::new(fields.into_iter().collect()).expect("valid descriptors");
            let base = identity(&dom, &names, &d).expect("every key field given");
            let id = match part {
                Some(p) => sub_identity(&base, p),
                None => base.clone(),
            };
            let key = store_key(&id, &rule, kind);
            prop_assert_eq!(parse(&key), Some(KeyParts { identity: &id, kind, rule: &rule }));
            prop_assert_eq!(split_identity(&id), (base.as_str(), part));
            prop_assert_eq!(domain(&id), dom.as_str());
            prop_assert_eq!(hash_tag(&key), id.as_str());
        }

        #[test]
        fn parse_answers_as_split_once_did(
            tail in prop_oneof!["[a-z{}:|t]{0,16}", any::<String>()],
        ) {
            // The byte search for the tag's end against the definition it replaced.
            let key = format!("sl:{{{tail}");
            prop_assert_eq!(parse(&key), parse_by_split_once(&key));
        }

        #[test]
        fn unescape_inverts_escaping(s in text()) {
            let mut e = String::new();
            push_escaped(&mut e, &s);
            prop_assert!(!e.contains(['{', '}', '|', '=']), "{}", e);
            prop_assert_eq!(unescape(&e), s.as_str());
        }

        #[test]
        fn unescape_answers_as_the_replaces_did(s in prop_oneof!["[%257BCDc3=|a]{0,16}", any::<String>()]) {
            prop_assert_eq!(unescape(&s), replaces(&s));
        }
    }
}
