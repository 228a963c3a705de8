//! A domain's rules and overrides indexed for matching, so a request costs a few probes and
//! integer comparisons rather than a scan over every rule and its strings.
//!
//! Field names and exact `(field, value)` pairs are numbered when the rule set is built. A
//! request's descriptors are turned into those numbers once ([`Seen`]): a name compared
//! against the few fields, a pair found by its hash and then compared as a string, once per
//! descriptor. Each rule's matchers are numbers too, so checking a candidate compares
//! integers only. Each rule sits in exactly one candidate list, its rarest exact pair's (or
//! the unanchored one). Rules with a prefix or an absence among their matchers are kept in
//! lists of their own (by the same anchors), checked in a second pass that a rule set
//! without such rules skips whole, so the first pass stays integer comparisons only; a
//! prefix is compared as bytes against the one descriptor it names.

use super::{Descriptors, MAX_DESCRIPTORS};
use crate::rules::{IpMask, Match, Override, Rule};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::hash::BuildHasher;

/// The hash of a pair: its field's number and its value. Only this process's index and
/// lookups use it (built together from the same rule set), so it need not be stable across
/// releases: foldhash with its fixed seed. A collision only puts two pairs under one hash;
/// the value is compared before a pair counts as seen, so correctness never rests on it.
fn pair_hash(field: u32, value: &str) -> u64 {
    foldhash::fast::FixedState::default().hash_one((field, value))
}

/// `a == b` for the short strings matching compares (names, values, identities): two
/// overlapping loads a side for up to 32 bytes instead of a call to `memcmp`, which costs
/// more than the comparison itself at these lengths.
#[inline]
pub(crate) fn short_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => {
            a.first_chunk::<4>() == b.first_chunk::<4>()
                && a.last_chunk::<4>() == b.last_chunk::<4>()
        }
        8..=16 => {
            a.first_chunk::<8>() == b.first_chunk::<8>()
                && a.last_chunk::<8>() == b.last_chunk::<8>()
        }
        17..=32 => {
            a.first_chunk::<16>() == b.first_chunk::<16>()
                && a.last_chunk::<16>() == b.last_chunk::<16>()
        }
        _ => a == b,
    }
}

/// Past this many fields of one length a name is looked up in a map instead of compared with
/// each.
const SCAN_FIELDS: usize = 8;

/// One matcher of a rule, by number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Matcher {
    /// The pair must be among the descriptors.
    Exact(u32),
    /// The field must be among the descriptors, with any value (`"*"`).
    Present(u32),
}

/// A matcher that needs more than a number compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Narrow {
    /// The field must be among the descriptors, its value starting with prefix number `.1`.
    Prefix(u32, u32),
    /// The field must not be among the descriptors.
    Absent(u32),
}

/// One key field of a rule, by number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct KeyRef {
    field: u32,
    /// Counted by its network ([`super::addr`]).
    mask: Option<IpMask>,
}

/// An exact `(field, value)` some rule or override asks for, and who is indexed under it.
#[derive(Debug)]
struct Pair {
    field: u32,
    value: String,
    /// Rules whose rarest exact pair this is, in file order.
    rules: Vec<u32>,
    /// The same for rules with a prefix or absence matcher.
    narrow_rules: Vec<u32>,
    /// Overrides whose first identity entry this is, in file order.
    overrides: Vec<u32>,
}

impl Pair {
    /// Whether this is the pair `(field, value)`: what a hash match must still show.
    fn is(&self, field: u32, value: &str) -> bool {
        self.field == field && short_eq(self.value.as_bytes(), value.as_bytes())
    }
}

/// Rules and overrides indexed by their rarest exact `(field, value)`.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// Every field a matcher or an override names, by number.
    fields: Vec<String>,
    /// Per name length: the fields of that length (a name is compared only with those).
    by_len: Vec<SmallVec<[u32; 2]>>,
    /// `fields` by name, when more than [`SCAN_FIELDS`] share a length.
    field_map: Option<HashMap<String, u32, foldhash::fast::FixedState>>,
    /// Per field: whether some pair has it (else its descriptors are not hashed).
    paired: Vec<bool>,
    pairs: Vec<Pair>,
    /// Pair numbers by [`pair_hash`], each compared as a pair before it counts.
    by_hash: hashbrown::HashTable<u32>,
    /// Rules without an exact matcher, in file order.
    unanchored: Vec<u32>,
    /// Per rule, its matchers but its anchor: a rule is a candidate only when its anchor pair
    /// was seen, so that one needs no second look.
    matchers: Vec<Box<[Matcher]>>,
    /// Per rule, its group's number (`u32::MAX`: none), so groups compare as integers.
    group: Vec<u32>,
    /// Per rule, [`Rule::specificity`].
    specificity: Vec<u32>,
    /// Per rule, its prefix and absence matchers (mostly none).
    narrow: Vec<Box<[Narrow]>>,
    /// Rules with a prefix or absence matcher and no exact one, in file order.
    narrow_unanchored: Vec<u32>,
    /// Whether any rule has a prefix or absence matcher (else the second pass is skipped).
    has_narrow: bool,
    /// The prefixes of [`Narrow::Prefix`], by number.
    prefixes: Vec<Box<str>>,
    /// Per rule: what its store keys hold after the identity ([`crate::keys::key_tail`]).
    key_tails: Vec<Box<str>>,
    /// Per rule: its key fields, in order.
    key_fields: Vec<Box<[KeyRef]>>,
    /// Per rule: what its own numbers tell a client.
    advertised: Vec<crate::decision::Advertised>,
    /// Per rule: the first rule with the same key fields and masks (so the same identity).
    key_class: Vec<u32>,
    /// Each descriptor some rule counts by network, with the first such rule: a request's
    /// value must be an address ([`super::check`]).
    pub(super) masked: Vec<(String, usize)>,
    /// Rules with a `cost`, in file order.
    pub(super) costed: Vec<u32>,
    /// The domain name escaped: how every identity begins.
    domain: String,
    has_overrides: bool,
}

/// What one request's descriptors are in the index's numbers.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    /// Field numbers of the descriptors whose name the index knows.
    fields: [u32; MAX_DESCRIPTORS],
    /// Which descriptor each of `fields` is.
    at: [u8; MAX_DESCRIPTORS],
    n_fields: usize,
    /// Pair numbers of the descriptors that are a pair of the index (one pair each at most).
    pairs: [u32; MAX_DESCRIPTORS],
    n_pairs: usize,
}

impl Default for Seen {
    fn default() -> Seen {
        Seen {
            fields: [0; MAX_DESCRIPTORS],
            at: [0; MAX_DESCRIPTORS],
            n_fields: 0,
            pairs: [0; MAX_DESCRIPTORS],
            n_pairs: 0,
        }
    }
}

impl Seen {
    fn fields(&self) -> &[u32] {
        &self.fields[..self.n_fields]
    }

    fn pairs(&self) -> &[u32] {
        &self.pairs[..self.n_pairs]
    }

    /// Which descriptor field `f` is, if the request has it.
    fn position(&self, f: u32) -> Option<usize> {
        self.fields()
            .iter()
            .position(|&x| x == f)
            .map(|k| usize::from(self.at[k]))
    }
}

impl Index {
    pub(crate) fn build(domain: &str, rules: &[Rule], overrides: &[Override]) -> Index {
        let mut domain_escaped = String::new();
        crate::keys::push_escaped(&mut domain_escaped, domain);
        let mut idx = Index {
            has_overrides: !overrides.is_empty(),
            domain: domain_escaped,
            ..Index::default()
        };
        let mut freq: HashMap<(&str, &str), usize> = HashMap::new();
        for r in rules {
            for (k, m) in &r.matchers {
                if let Match::Equals(v) = m {
                    *freq.entry((k, v)).or_default() += 1;
                }
            }
        }
        let mut classes: HashMap<Box<[KeyRef]>, u32> = HashMap::new();
        let mut groups: Vec<&str> = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            idx.group.push(r.group.as_deref().map_or(u32::MAX, |g| {
                match groups.iter().position(|x| *x == g) {
                    Some(n) => n as u32,
                    None => {
                        groups.push(g);
                        (groups.len() - 1) as u32
                    }
                }
            }));
            idx.specificity.push(r.specificity() as u32);
            let anchor = r
                .matchers
                .iter()
                .filter_map(|(k, m)| match m {
                    Match::Equals(v) => Some((k.as_str(), v.as_str())),
                    _ => None,
                })
                .min_by_key(|kv| freq.get(kv).copied().unwrap_or(0));
            let is_narrow = r
                .matchers
                .iter()
                .any(|(_, m)| matches!(m, Match::Prefix(_) | Match::Absent));
            idx.has_narrow |= is_narrow;
            let anchor = anchor.map(|(k, v)| idx.pair(k, v));
            match (anchor, is_narrow) {
                (Some(p), false) => idx.pairs[p as usize].rules.push(i as u32),
                (Some(p), true) => idx.pairs[p as usize].narrow_rules.push(i as u32),
                (None, false) => idx.unanchored.push(i as u32),
                (None, true) => idx.narrow_unanchored.push(i as u32),
            }
            let mut ms = Vec::new();
            let mut narrow = Vec::new();
            for (k, m) in &r.matchers {
                match m {
                    Match::Equals(v) => {
                        let p = idx.pair(k, v);
                        if Some(p) != anchor {
                            ms.push(Matcher::Exact(p));
                        }
                    }
                    Match::Any => ms.push(Matcher::Present(idx.field(k))),
                    Match::Prefix(p) => {
                        idx.prefixes.push(p.as_str().into());
                        let n = (idx.prefixes.len() - 1) as u32;
                        narrow.push(Narrow::Prefix(idx.field(k), n));
                    }
                    Match::Absent => narrow.push(Narrow::Absent(idx.field(k))),
                }
            }
            idx.narrow.push(narrow.into());
            idx.matchers.push(ms.into());
            idx.key_tails
                .push(crate::keys::key_tail(&r.id, r.params.kind()).into());
            idx.advertised
                .push(crate::decision::Advertised::of(&r.params));
            let kf: Box<[KeyRef]> = r
                .key
                .iter()
                .map(|k| KeyRef {
                    field: idx.field(&k.name),
                    mask: k.mask,
                })
                .collect();
            let class = *classes.entry(kf.clone()).or_insert(i as u32);
            idx.key_class.push(class);
            idx.key_fields.push(kf);
            for k in r.key.iter().filter(|k| k.mask.is_some()) {
                if !idx.masked.iter().any(|(n, _)| *n == k.name) {
                    idx.masked.push((k.name.clone(), i));
                }
            }
            if r.cost.is_some() {
                idx.costed.push(i as u32);
            }
        }
        for (i, o) in overrides.iter().enumerate() {
            if let Some((k, v)) = o.identity.iter().next() {
                let p = idx.pair(k, v);
                idx.pairs[p as usize].overrides.push(i as u32);
            }
        }
        for (i, f) in idx.fields.iter().enumerate() {
            if idx.by_len.len() <= f.len() {
                idx.by_len.resize_with(f.len() + 1, SmallVec::new);
            }
            idx.by_len[f.len()].push(i as u32);
        }
        if idx.by_len.iter().any(|b| b.len() > SCAN_FIELDS) {
            let map = idx
                .fields
                .iter()
                .enumerate()
                .map(|(i, f)| (f.clone(), i as u32))
                .collect();
            idx.field_map = Some(map);
        }
        idx
    }

    /// The number of field `k`, numbering it if new.
    fn field(&mut self, k: &str) -> u32 {
        match self.fields.iter().position(|f| f == k) {
            Some(i) => i as u32,
            None => {
                self.fields.push(k.to_string());
                self.paired.push(false);
                (self.fields.len() - 1) as u32
            }
        }
    }

    /// The number of pair `(k, v)`, numbering it if new.
    fn pair(&mut self, k: &str, v: &str) -> u32 {
        let field = self.field(k);
        self.paired[field as usize] = true;
        let h = pair_hash(field, v);
        let pairs = &self.pairs;
        if let Some(&p) = self.by_hash.find(h, |&p| pairs[p as usize].is(field, v)) {
            return p;
        }
        let p = self.pairs.len() as u32;
        let pairs = &self.pairs;
        self.by_hash.insert_unique(h, p, |&q| {
            let pair = &pairs[q as usize];
            pair_hash(pair.field, &pair.value)
        });
        self.pairs.push(Pair {
            field,
            value: v.to_string(),
            rules: Vec::new(),
            narrow_rules: Vec::new(),
            overrides: Vec::new(),
        });
        p
    }

    /// The number of a descriptor name, if a matcher or override names it.
    fn field_of(&self, name: &str) -> Option<u32> {
        match &self.field_map {
            Some(m) => m.get(name).copied(),
            None => self
                .by_len
                .get(name.len())?
                .iter()
                .copied()
                .find(|&f| short_eq(self.fields[f as usize].as_bytes(), name.as_bytes())),
        }
    }

    /// `d` in the index's numbers.
    #[cfg(test)]
    pub(crate) fn seen(&self, d: &Descriptors) -> Seen {
        let mut s = Seen::default();
        self.seen_into(d, &mut s);
        s
    }

    /// [`Index::seen`] into `s`, overwriting it (a kept one: nothing to zero).
    pub(crate) fn seen_into(&self, d: &Descriptors, s: &mut Seen) {
        s.n_fields = 0;
        s.n_pairs = 0;
        for (j, (k, v)) in d.entries.iter().enumerate() {
            let Some(f) = self.field_of(k) else {
                continue;
            };
            s.fields[s.n_fields] = f;
            // MAX_DESCRIPTORS fits a byte.
            s.at[s.n_fields] = j as u8;
            s.n_fields += 1;
            if !self.paired[f as usize] {
                continue;
            }
            // Distinct names: at most one pair per descriptor, none seen twice.
            let found = self
                .by_hash
                .find(pair_hash(f, v), |&p| self.pairs[p as usize].is(f, v));
            if let Some(&p) = found {
                s.pairs[s.n_pairs] = p;
                s.n_pairs += 1;
            }
        }
    }

    /// The rules whose matchers all hold, in file order (as indices into the rules).
    #[cfg(test)]
    pub(crate) fn hits(&self, d: &Descriptors, s: &Seen) -> Vec<u32> {
        let mut hits = Vec::new();
        self.hits_into(d, s, &mut hits);
        hits
    }

    /// [`Index::hits`] into `hits` (cleared first).
    // `contains`' chunked search costs more than a plain loop on a few elements: 100
    // instructions a decision on the bench workload.
    #[allow(clippy::manual_contains)]
    pub(crate) fn hits_into(&self, d: &Descriptors, s: &Seen, hits: &mut Vec<u32>) {
        hits.clear();
        // Each rule is in one list and the seen pairs are distinct: no rule comes twice.
        for &i in &self.unanchored {
            if self.plain_hold(i, s) {
                hits.push(i);
            }
        }
        for &p in s.pairs() {
            for &i in &self.pairs[p as usize].rules {
                if self.plain_hold(i, s) {
                    hits.push(i);
                }
            }
        }
        if self.has_narrow {
            let lists = s
                .pairs()
                .iter()
                .map(|&p| &self.pairs[p as usize].narrow_rules);
            for ids in std::iter::once(&self.narrow_unanchored).chain(lists) {
                for &i in ids {
                    let holds = self.plain_hold(i, s)
                        && self.narrow[i as usize].iter().all(|m| match *m {
                            Narrow::Absent(f) => !s.fields().iter().any(|&x| x == f),
                            Narrow::Prefix(f, p) => s.position(f).is_some_and(|j| {
                                d.entries[j].1.starts_with(&*self.prefixes[p as usize])
                            }),
                        });
                    if holds {
                        hits.push(i);
                    }
                }
            }
        }
        hits.sort_unstable();
    }

    /// Whether rule `i`'s value and `"*"` matchers other than its anchor hold.
    #[allow(clippy::manual_contains)]
    #[inline]
    fn plain_hold(&self, i: u32, s: &Seen) -> bool {
        self.matchers[i as usize].iter().all(|m| match *m {
            Matcher::Exact(p) => s.pairs().iter().any(|&x| x == p),
            Matcher::Present(f) => s.fields().iter().any(|&x| x == f),
        })
    }

    /// Rule `i`'s identity for `d` into `out` (cleared first): the escaped domain, then
    /// `|field=value` per key field ([`super::identity`]); `false` when a key field is
    /// missing, or is counted by network and is no address.
    pub(crate) fn identity_into(
        &self,
        out: &mut String,
        i: usize,
        d: &Descriptors,
        s: &Seen,
    ) -> bool {
        out.clear();
        out.push_str(&self.domain);
        for kf in self.key_fields[i].iter() {
            let Some(j) = s.position(kf.field) else {
                return false;
            };
            let (k, v) = &d.entries[j];
            out.push('|');
            out.push_str(k);
            out.push('=');
            match kf.mask {
                None => crate::keys::push_escaped(out, v),
                // A network holds no character that needs escaping.
                Some(m) => {
                    if !super::addr::push_network(out, v, m) {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Whether rules `i` and `j` have the same key fields and masks (so the same identity).
    pub(crate) fn same_key(&self, i: usize, j: usize) -> bool {
        self.key_class[i] == self.key_class[j]
    }

    /// The overrides that may hold (their first identity entry is among the descriptors), in
    /// file order; the caller checks the rest of each identity.
    pub(crate) fn override_candidates_into(&self, s: &Seen, ids: &mut Vec<u32>) {
        ids.clear();
        if self.has_overrides {
            for &p in s.pairs() {
                ids.extend_from_slice(&self.pairs[p as usize].overrides);
            }
            ids.sort_unstable();
        }
    }

    /// Rule `i`'s group number (`u32::MAX`: none) and specificity.
    pub(crate) fn group_of(&self, i: usize) -> (u32, u32) {
        (self.group[i], self.specificity[i])
    }

    /// What rule `i`'s own numbers tell a client.
    pub(crate) fn advertised(&self, i: usize) -> crate::decision::Advertised {
        self.advertised[i]
    }

    /// What rule `i`'s store keys hold after the identity.
    pub(crate) fn key_tail(&self, i: usize) -> &str {
        &self.key_tails[i]
    }
}

#[cfg(test)]
mod tests {
    use crate::matching::desc;
    use crate::rules::{Rule, parse_yaml};
    use proptest::prelude::*;

    /// The definition the index must agree with: every matcher compared as strings, one
    /// rule after another.
    fn matches(rule: &Rule, d: &crate::matching::Descriptors) -> bool {
        rule.matchers.iter().all(|(k, m)| m.holds(d.get(k)))
    }

    /// A matcher per field as written: none, `"*"`, one of two values, a prefix (of
    /// values too: `x` starts `x` and `xy`, the empty value none), or absent.
    fn matcher() -> impl Strategy<Value = Option<&'static str>> {
        prop_oneof![
            Just(None),
            Just(Some("\"*\"")),
            Just(Some("x")),
            Just(Some("y")),
            Just(Some("{ prefix: x }")),
            Just(Some("{ prefix: xy }")),
            Just(Some("{ absent: true }")),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn short_eq_is_eq(
            a in prop::collection::vec(0u8..4, 0..40),
            b in prop::collection::vec(0u8..4, 0..40),
            same in any::<bool>(),
        ) {
            // Half the cases compare a string with itself or a one-byte change of it.
            let b = if same {
                let mut c = a.clone();
                if let Some(x) = c.get_mut(b.len() % a.len().max(1)) {
                    *x ^= u8::from(b.len() % 2 == 1);
                }
                c
            } else {
                b
            };
            prop_assert_eq!(super::short_eq(&a, &b), a == b);
        }

        #[test]
        fn hits_are_the_rules_whose_matchers_hold(
            rules in prop::collection::vec(prop::collection::vec(matcher(), 3), 1..12),
            values in prop::collection::vec(
                prop_oneof![Just(None), Just(Some("x")), Just(Some("y")), Just(Some("xy")), Just(Some("z")), Just(Some(""))],
                4,
            ),
        ) {
            let fields = ["a", "b", "c"];
            let mut y = String::from("domain: t\nrules:\n");
            for (i, ms) in rules.iter().enumerate() {
                let m: Vec<String> = fields
                    .iter()
                    .zip(ms)
                    .filter_map(|(f, m)| m.map(|v| format!("{f}: {v}")))
                    .collect();
                let m = if m.is_empty() { String::new() } else { format!("match: {{ {} }}, ", m.join(", ")) };
                y.push_str(&format!(
                    "  - {{ id: r{i}, {m}key: [k], algorithm: fixed_window, limit: 1, window: 1s }}\n"
                ));
            }
            let set = parse_yaml(&y).expect("valid rules");
            let dom = set.domain("t").expect("domain");
            // A fourth name no rule mentions.
            let pairs: Vec<(&str, &str)> = ["a", "b", "c", "d"]
                .iter()
                .zip(&values)
                .filter_map(|(f, v)| v.map(|v| (*f, v)))
                .collect();
            let d = desc(&pairs);
            let want: Vec<u32> = (0..dom.rules.len() as u32)
                .filter(|&i| matches(&dom.rules[i as usize], &d))
                .collect();
            let got = dom.index.hits(&d, &dom.index.seen(&d));
            prop_assert_eq!(got.as_slice(), want.as_slice(), "{}", y);
        }
    }
}
