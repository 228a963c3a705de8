//! From a request's descriptors to the rules that apply, with their effective numbers and
//! the identity they count against. No I/O: this runs on every request from the in-memory
//! snapshot, so it is indexed rather than a scan over every rule.

use crate::algo::Params;
use crate::hash::rollout_bucket;
use crate::keys::push_escaped;
use crate::rules::{Domain, KeyField, Mode, Rule};
use std::borrow::Cow;

pub mod addr;
mod index;
use index::Seen;
pub(crate) use index::{Index, short_eq};

/// What matching one request needs besides its result, kept by a caller that matches often
/// (a [`crate::decision::Plan`]) so a request allocates and zeroes nothing: the descriptors
/// in the index's numbers, the candidate rules, each group's best so far, the overrides that
/// hold and the rules applied so far.
#[derive(Clone, Debug, Default)]
pub(crate) struct Scratch {
    seen: Seen,
    hits: Vec<u32>,
    /// `(group number, specificity, rule)` of each group's best rule.
    best: Vec<(u32, u32, u32)>,
    overrides: Vec<u32>,
    applied: Vec<usize>,
}

/// Most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 32;
/// Longest descriptor name.
pub const MAX_NAME_LEN: usize = 64;
/// Longest descriptor value.
pub const MAX_VALUE_LEN: usize = 256;

/// Why a request's descriptors were refused (HTTP 400 / `INVALID_ARGUMENT`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// Over [`MAX_DESCRIPTORS`].
    #[error("too many descriptors: {0} (at most {MAX_DESCRIPTORS})")]
    TooMany(usize),
    /// Empty or over [`MAX_NAME_LEN`].
    #[error("descriptor name {0:?} must be 1 to {MAX_NAME_LEN} bytes")]
    BadName(String),
    /// Over [`MAX_VALUE_LEN`].
    #[error("descriptor {0:?} has a value longer than {MAX_VALUE_LEN} bytes")]
    TooLong(String),
    /// The same name twice.
    #[error("descriptor {0:?} appears twice")]
    Duplicate(String),
    /// A descriptor a rule counts by network (`key: [ip/64]`) that is no IP address.
    #[error(
        "descriptor {name:?} must be an IP address (rule {rule:?} counts it by network), got {value:?}"
    )]
    NotAnAddress {
        /// The descriptor.
        name: String,
        /// Its value (at most 64 characters of it).
        value: String,
        /// A rule that keys on its network.
        rule: String,
    },
    /// The caller's cost times a rule's cost factor is past the largest limit.
    #[error("cost {cost} times {factor} (rule {rule:?}'s cost for this request) is above {max}", max = crate::algo::MAX_LIMIT)]
    CostTooLarge {
        /// The cost asked for.
        cost: u64,
        /// The rule's factor for the request.
        factor: u64,
        /// The rule.
        rule: String,
    },
}

/// A request's descriptors: bounded, unique names, looked up by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptors {
    entries: Vec<(String, String)>,
}

impl Descriptors {
    /// Validates and stores the pairs.
    pub fn new(pairs: Vec<(String, String)>) -> Result<Descriptors, InputError> {
        if pairs.len() > MAX_DESCRIPTORS {
            return Err(InputError::TooMany(pairs.len()));
        }
        for (i, (k, v)) in pairs.iter().enumerate() {
            if k.is_empty() || k.len() > MAX_NAME_LEN {
                return Err(InputError::BadName(k.chars().take(80).collect()));
            }
            if v.len() > MAX_VALUE_LEN {
                return Err(InputError::TooLong(k.clone()));
            }
            if pairs[..i].iter().any(|(k2, _)| k2 == k) {
                return Err(InputError::Duplicate(k.clone()));
            }
        }
        Ok(Descriptors { entries: pairs })
    }

    /// The value of a descriptor.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// All pairs, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// A rule that applies to a request, with what it counts against.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// Its numbers after overrides.
    pub params: Cow<'a, Params>,
    /// Domain and key values: the Redis Cluster hash tag, so one script sees every key.
    pub identity: String,
    /// The store key.
    pub key: String,
    /// The rule's cost factor for this request ([`Rule::cost_factor`]): its store call asks
    /// for the caller's cost times this.
    pub factor: u64,
    /// The sub-count of a split rule ([`crate::hotkeys::split`]): then `identity`, `key` and
    /// `params` are the sub-count's. Set by [`crate::decision::plan`], never by
    /// [`applicable`].
    pub split: Option<crate::hotkeys::split::Split>,
    /// The named store it counts in ([`crate::stores::chosen`]; `None`: the main one).
    pub store: Option<&'a str>,
    /// What its numbers tell the client (of the whole rule, for a split one), so a decision
    /// reads them rather than works them out per policy.
    pub advertised: crate::decision::Advertised,
}

/// The identity string of a rule's key fields (`None` when a key field is missing, or is
/// counted by network and is no address): the domain and the values escaped
/// ([`crate::keys::push_escaped`]; [`crate::keys::unescape`] reverses it), a masked field's
/// value its network ([`addr::push_network`]).
pub fn identity(domain: &str, key: &[KeyField], d: &Descriptors) -> Option<String> {
    let mut out = String::with_capacity(domain.len() + 32);
    identity_into(&mut out, domain, key, d).then_some(out)
}

fn identity_into(out: &mut String, domain: &str, key: &[KeyField], d: &Descriptors) -> bool {
    push_escaped(out, domain);
    for field in key {
        let Some(v) = d.get(&field.name) else {
            return false;
        };
        out.push('|');
        out.push_str(&field.name);
        out.push('=');
        match field.mask {
            None => push_escaped(out, v),
            Some(m) => {
                if !addr::push_network(out, v, m) {
                    return false;
                }
            }
        }
    }
    true
}

/// What a front end checks before deciding, to answer bad input with a 400 /
/// `INVALID_ARGUMENT` rather than a different key: every descriptor some rule of the domain
/// counts by network is an IP address, and the caller's `cost` times each rule's cost factor
/// for the request stays within [`crate::algo::MAX_LIMIT`] ([`crate::rules::scaled`]).
/// Without this check, [`applicable`] leaves out a rule whose address is no address (never
/// a key made of something else) and [`crate::decision::plan`] caps a cost at the largest
/// limit.
pub fn check(domain: &Domain, d: &Descriptors, cost: u64) -> Result<(), InputError> {
    let idx = &domain.index;
    for (name, rule) in &idx.masked {
        if let Some(v) = d.get(name)
            && addr::parse(v).is_none()
        {
            return Err(InputError::NotAnAddress {
                name: name.clone(),
                value: v.chars().take(64).collect(),
                rule: domain.rules[*rule].id.to_string(),
            });
        }
    }
    for &i in &idx.costed {
        let r = &domain.rules[i as usize];
        let factor = r.cost_factor(d);
        if crate::rules::scaled(cost, factor).is_none() {
            return Err(InputError::CostTooLarge {
                cost,
                factor,
                rule: r.id.to_string(),
            });
        }
    }
    Ok(())
}

pub use crate::keys::store_key;

/// Every rule that applies to `d`, in file order.
///
/// A rule applies when all its matchers hold, its mode is not `off`, every key field is
/// present, the identity falls inside its rollout, and no override exempts it. Within a
/// group only the most specific matching rule is kept (ties go to the rule listed first),
/// before rollout and exemptions are considered.
pub fn applicable<'a>(domain: &'a Domain, d: &Descriptors) -> Vec<Applied<'a>> {
    let mut out = Vec::new();
    applicable_into(domain, d, &mut out);
    out
}

/// [`applicable`] into `out`, reusing its entries: their identity and key strings keep their
/// buffers, so a request shaped like an earlier one allocates nothing. Entries past the
/// rules that apply are dropped.
pub fn applicable_into<'a>(domain: &'a Domain, d: &Descriptors, out: &mut Vec<Applied<'a>>) {
    applicable_reusing(domain, d, out, &mut Vec::new(), &mut Scratch::default());
}

/// [`applicable_into`], an entry added past `out`'s taking its identity and key buffers from
/// `spare` (a recycled plan's, [`crate::decision::Spare`]), so a plan that outlived its rule
/// set's borrows still allocates nothing for a request shaped like an earlier one; `scratch`
/// holds the working buffers.
pub(crate) fn applicable_reusing<'a>(
    domain: &'a Domain,
    d: &Descriptors,
    out: &mut Vec<Applied<'a>>,
    spare: &mut Vec<(String, String)>,
    scratch: &mut Scratch,
) {
    let idx = &domain.index;
    let Scratch {
        seen,
        hits,
        best,
        overrides,
        applied,
    } = scratch;
    idx.seen_into(d, seen);
    idx.hits_into(d, seen, hits);
    // Groups: keep the most specific; `hits` is in file order so the first wins ties.
    best.clear();
    for &i in hits.iter() {
        let (g, spec) = idx.group_of(i as usize);
        if g == u32::MAX {
            continue;
        }
        match best.iter_mut().find(|b| b.0 == g) {
            Some(slot) if spec > slot.1 => *slot = (g, spec, i),
            Some(_) => {}
            None => best.push((g, spec, i)),
        }
    }

    idx.override_candidates_into(seen, overrides);
    overrides.retain(|&i| {
        let o = &domain.overrides[i as usize];
        o.identity.iter().all(|(k, v)| d.get(k) == Some(v.as_str()))
    });
    let ovs = &overrides[..];
    let ov_of = |i: u32| &domain.overrides[i as usize];
    if ovs
        .iter()
        .any(|&o| ov_of(o).exempt && ov_of(o).rule.is_none())
    {
        out.clear();
        return;
    }

    // `out[..n]` holds the rules applied so far (rule `applied[k]` in `out[k]`); `out[n]`,
    // when there, is a spare entry whose strings are overwritten.
    let mut n = 0;
    applied.clear();
    for &h in hits.iter() {
        let i = h as usize;
        let (g, _) = idx.group_of(i);
        if g != u32::MAX && !best.iter().any(|b| b.0 == g && b.2 == h) {
            continue;
        }
        let r = &domain.rules[i];
        if r.mode == Mode::Off {
            continue;
        }
        if n == out.len() {
            let (identity, key) = spare.pop().unwrap_or_default();
            out.push(Applied {
                rule: r,
                params: Cow::Borrowed(&r.params),
                identity,
                key,
                factor: 1,
                split: None,
                store: None,
                advertised: idx.advertised(i),
            });
        }
        let (done, rest) = out.split_at_mut(n);
        let a = &mut rest[0];
        // Rules usually share their key fields: an identity already applied is copied rather
        // than built again (one that was not applied, or is missing a field, is built again).
        match applied.iter().position(|&j| idx.same_key(i, j)) {
            Some(k) => {
                a.identity.clear();
                a.identity.push_str(&done[k].identity);
            }
            None => {
                if !idx.identity_into(&mut a.identity, i, d, seen) {
                    continue;
                }
            }
        }
        if r.rollout_pct < 100 && rollout_bucket(&r.id, &a.identity) >= r.rollout_pct {
            continue;
        }
        let ov = ovs
            .iter()
            .map(|&o| ov_of(o))
            .find(|o| o.rule.as_deref() == Some(&*r.id));
        // The numbers and what they tell a client are set together: the index's figures for
        // the rule's own, worked out here for an override's (and below for a share's). Set
        // here, while the rule's index is at hand, rather than once at the end: 15
        // instructions a decision fewer on the bench.
        match ov {
            Some(o) if o.exempt => continue,
            Some(o) => {
                a.params = Cow::Owned(o.apply(&r.params));
                a.advertised = crate::decision::Advertised::of(&a.params);
            }
            // A reused entry usually holds this rule's numbers already: nothing to drop.
            None if matches!(a.params, Cow::Borrowed(p) if std::ptr::eq(p, &r.params)) => {
                a.advertised = idx.advertised(i);
            }
            None => {
                a.params = Cow::Borrowed(&r.params);
                a.advertised = idx.advertised(i);
            }
        }
        a.store = crate::stores::chosen(r, ov);
        a.rule = r;
        a.split = None;
        a.factor = r.cost_factor(d);
        if a.params.kind() == r.params.kind() {
            crate::keys::store_key_with_tail(&mut a.key, &a.identity, idx.key_tail(i));
        } else {
            crate::keys::store_key_into(&mut a.key, &a.identity, &r.id, a.params.kind());
        }
        if let Params::FairShare(fs) = &r.params {
            // This tenant's share of the parent, and its key beside the parent's.
            let share = fs
                .shares
                .pick(fs.shares.by.as_deref().and_then(|b| d.get(b)));
            if share != fs.share
                && let Ok(f) = fs.with_share(share)
            {
                a.params = Cow::Owned(Params::FairShare(f));
                a.advertised = crate::decision::Advertised::of(&a.params);
            }
            crate::keys::fair_share_key_into(&mut a.key, &a.identity, &r.id);
        }
        applied.push(i);
        n += 1;
    }
    out.truncate(n);
}

/// Descriptors from `(key, value)` pairs that must be valid: how the crate's tests build a
/// request.
#[cfg(test)]
pub(crate) fn desc(pairs: &[(&str, &str)]) -> Descriptors {
    Descriptors::new(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
    .expect("valid descriptors")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Rate;
    use crate::rules::parse_yaml;

    fn ids(a: &[Applied<'_>]) -> Vec<String> {
        a.iter().map(|x| x.rule.id.to_string()).collect()
    }

    const RULES: &str = r#"
domain: public-api
rules:
  - { id: pay-burst, match: { route: "POST /v1/payments", tier: growth }, key: [api_key], algorithm: token_bucket, rate_per_s: 20, burst: 40 }
  - { id: default-per-minute, group: per-minute, match: { tier: "*", route: "*" }, key: [api_key], algorithm: sliding_window, limit: 600, window: 1m }
  - { id: growth-per-minute, group: per-minute, match: { tier: growth, route: "*" }, key: [api_key], algorithm: sliding_window, limit: 6000, window: 1m }
  - { id: growth-per-minute-2, group: per-minute, match: { tier: growth, route: "*" }, key: [api_key], algorithm: sliding_window, limit: 1, window: 1m }
  - { id: per-ip, key: [ip], algorithm: fixed_window, limit: 100, window: 1s }
  - { id: dark, key: [api_key], algorithm: fixed_window, limit: 1, window: 1s, rollout_pct: 50 }
  - { id: off, key: [api_key], algorithm: fixed_window, limit: 1, window: 1s, mode: off }
overrides:
  - { identity: { api_key: k_bigcorp }, rule: pay-burst, rate_per_s: 200, burst: 400 }
  - { identity: { api_key: k_monitor }, exempt: true }
  - { identity: { api_key: k_noip }, rule: per-ip, exempt: true }
"#;

    #[test]
    fn groups_overrides_and_missing_keys() {
        let set = parse_yaml(RULES).expect("valid");
        let d = set.domain("public-api").expect("domain");
        let base = [
            ("route", "POST /v1/payments"),
            ("tier", "growth"),
            ("api_key", "k_1"),
            ("ip", "1.2.3.4"),
        ];
        let got = ids(&applicable(d, &desc(&base)));
        assert!(
            got.starts_with(&[
                "pay-burst".into(),
                "growth-per-minute".into(),
                "per-ip".into()
            ]),
            "{got:?}"
        );
        assert!(!got.contains(&"off".to_string()));
        // Free tier: the default of the group, not pay-burst.
        let free = ids(&applicable(
            d,
            &desc(&[("route", "GET /x"), ("tier", "free"), ("api_key", "k_1")]),
        ));
        assert_eq!(free[0], "default-per-minute");
        assert!(
            !free.contains(&"per-ip".to_string()),
            "no ip descriptor, no per-ip rule"
        );
        // Overrides.
        let big = applicable(
            d,
            &desc(&[
                ("route", "POST /v1/payments"),
                ("tier", "growth"),
                ("api_key", "k_bigcorp"),
            ]),
        );
        assert_eq!(
            *big[0].params,
            Params::TokenBucket {
                rate: Rate::per_second(200),
                burst: 400
            }
        );
        assert!(
            applicable(
                d,
                &desc(&[("tier", "growth"), ("route", "x"), ("api_key", "k_monitor")])
            )
            .is_empty()
        );
        let noip = ids(&applicable(
            d,
            &desc(&[("api_key", "k_noip"), ("ip", "1.1.1.1")]),
        ));
        assert!(!noip.contains(&"per-ip".to_string()));
        // Keys share the identity as hash tag.
        let a = applicable(d, &desc(&base));
        assert_eq!(a[0].key, "sl:{public-api|api_key=k_1}:t:pay-burst");
    }

    #[test]
    fn rollout_is_stable_and_about_half() {
        let set = parse_yaml(RULES).expect("valid");
        let d = set.domain("public-api").expect("domain");
        let n = (0..1000)
            .filter(|i| {
                let k = format!("k{i}");
                ids(&applicable(d, &desc(&[("api_key", &k)]))).contains(&"dark".to_string())
            })
            .count();
        assert!((400..600).contains(&n), "{n}");
    }

    #[test]
    fn bad_descriptors_are_refused() {
        let many: Vec<(String, String)> = (0..40).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(Descriptors::new(many), Err(InputError::TooMany(40)));
        assert!(Descriptors::new(vec![("".into(), "v".into())]).is_err());
        assert!(Descriptors::new(vec![("a".into(), "x".repeat(300))]).is_err());
        assert!(
            Descriptors::new(vec![("a".into(), "1".into()), ("a".into(), "2".into())]).is_err()
        );
    }

    #[test]
    fn identity_escapes_hash_tag_characters() {
        let d = desc(&[("u", "a}b|c=d%")]);
        assert_eq!(
            identity("x", &[KeyField::whole("u")], &d).as_deref(),
            Some("x|u=a%7Db%7Cc%3Dd%25")
        );
    }

    #[test]
    fn applied_identities_and_keys_are_made_as_identity_and_store_key_make_them() {
        let set = parse_yaml(
            r#"
domain: "a|b{c}"
rules:
  - { id: two, match: { tier: "*" }, key: [u, tier], algorithm: gcra, rate_per_s: 1, burst: 1 }
  - { id: one, key: [u], algorithm: fixed_window, limit: 1, window: 1s }
  - { id: one-again, key: [u], algorithm: token_bucket, rate_per_s: 1, burst: 1 }
  - { id: missing, key: [absent], algorithm: fixed_window, limit: 1, window: 1s }
"#,
        )
        .expect("valid");
        let dom = set.domain("a|b{c}").expect("domain");
        let d = desc(&[("tier", "=%"), ("u", "a}b|c")]);
        // Into a reused vector that held more entries (longer strings) than this request needs.
        let mut out = applicable(dom, &desc(&[("tier", "x".repeat(40).as_str()), ("u", "y")]));
        out.push(out[0].clone());
        applicable_into(dom, &d, &mut out);
        assert_eq!(ids(&out), ["two", "one", "one-again"]);
        for a in &out {
            let want = identity(&dom.name, &a.rule.key, &d).expect("key fields present");
            assert_eq!(a.factor, 1);
            assert_eq!(a.identity, want);
            assert_eq!(a.key, store_key(&want, &a.rule.id, a.params.kind()));
        }
        assert_eq!(out[1].identity, "a%7Cb%7Bc%7D|u=a%7Db%7Cc");
    }

    const SHAPES: &str = r#"
domain: api
rules:
  - { id: anon, match: { api_key: { absent: true } }, key: [ip/64], algorithm: fixed_window, limit: 10, window: 1m }
  - { id: anon-v4, match: { api_key: { absent: true } }, key: ["ip/24,56"], algorithm: fixed_window, limit: 10, window: 1m }
  - { id: per-ip, key: [ip], algorithm: fixed_window, limit: 10, window: 1m }
  - { id: admin, match: { route: { prefix: "GET /v1/admin/" } }, key: [api_key], algorithm: fixed_window, limit: 10, window: 1m }
  - { id: export, key: [api_key], algorithm: fixed_window, limit: 100, window: 1m, cost: { by: route, values: { "GET /v1/export": 25 } } }
"#;

    #[test]
    fn an_address_is_counted_by_its_network() {
        let set = parse_yaml(SHAPES).expect("valid");
        let d = set.domain("api").expect("domain");
        let of = |ip: &str| -> Vec<(String, String)> {
            applicable(d, &desc(&[("ip", ip)]))
                .iter()
                .map(|a| (a.rule.id.to_string(), a.identity.clone()))
                .collect()
        };
        assert_eq!(
            of("2001:db8::1"),
            [
                ("anon".into(), "api|ip=2001:db8::/64".into()),
                ("anon-v4".into(), "api|ip=2001:db8::/56".into()),
                ("per-ip".into(), "api|ip=2001:db8::1".into()),
            ]
        );
        // One host rotating through its /64 is one identity; per-ip sees each address.
        let other = of("2001:db8:0:0:ffff:ffff:ffff:ffff");
        assert_eq!(other[0].1, "api|ip=2001:db8::/64");
        assert_eq!(
            other[2].1, "api|ip=2001:db8:0:0:ffff:ffff:ffff:ffff",
            "as given"
        );
        assert_eq!(of("2001:db8:0:1::1")[0].1, "api|ip=2001:db8:0:1::/64");
        assert_eq!(
            of("203.0.113.9"),
            [
                ("anon".into(), "api|ip=203.0.113.9/32".into()),
                ("anon-v4".into(), "api|ip=203.0.113.0/24".into()),
                ("per-ip".into(), "api|ip=203.0.113.9".into()),
            ]
        );
        let a = applicable(d, &desc(&[("ip", "203.0.113.9")]));
        assert_eq!(a[1].key, "sl:{api|ip=203.0.113.0/24}:f:anon-v4");
        // No address: the masked rules do not apply (never a key made of the text), and
        // `check` is the 400 a front end answers first.
        assert_eq!(of("nope"), [("per-ip".into(), "api|ip=nope".into())]);
        let err = check(d, &desc(&[("ip", "nope")]), 1).expect_err("no address");
        assert_eq!(
            err.to_string(),
            "descriptor \"ip\" must be an IP address (rule \"anon\" counts it by network), got \"nope\""
        );
        assert_eq!(check(d, &desc(&[("ip", "::ffff:1.2.3.4")]), 1), Ok(()));
        assert_eq!(
            check(d, &desc(&[("route", "x")]), 1),
            Ok(()),
            "no ip, no problem"
        );
    }

    #[test]
    fn absent_and_prefix_matchers_select_requests() {
        let set = parse_yaml(SHAPES).expect("valid");
        let d = set.domain("api").expect("domain");
        let of = |pairs: &[(&str, &str)]| ids(&applicable(d, &desc(pairs)));
        assert_eq!(of(&[("ip", "10.0.0.1")]), ["anon", "anon-v4", "per-ip"]);
        assert_eq!(
            of(&[("ip", "10.0.0.1"), ("api_key", "k")]),
            ["per-ip", "export"],
            "a key: no anonymous rule"
        );
        assert_eq!(
            of(&[("api_key", "k"), ("route", "GET /v1/admin/users")]),
            ["admin", "export"]
        );
        assert_eq!(
            of(&[("api_key", "k"), ("route", "GET /v1/admin")]),
            ["export"]
        );
        assert_eq!(
            of(&[("api_key", "k"), ("route", "POST /v1/admin/x")]),
            ["export"]
        );
    }

    #[test]
    fn a_cost_factor_is_the_rules_for_the_request() {
        let set = parse_yaml(SHAPES).expect("valid");
        let d = set.domain("api").expect("domain");
        let factor = |route: &str| {
            let a = applicable(d, &desc(&[("api_key", "k"), ("route", route)]));
            a.iter()
                .map(|a| (a.rule.id.to_string(), a.factor))
                .collect::<Vec<_>>()
        };
        assert_eq!(factor("GET /v1/export"), [("export".to_string(), 25)]);
        assert_eq!(factor("GET /v1/users"), [("export".to_string(), 1)]);
        let export = desc(&[("api_key", "k"), ("route", "GET /v1/export")]);
        assert_eq!(check(d, &export, 40_000_000), Ok(()));
        assert_eq!(
            check(d, &export, 40_000_001).map_err(|e| e.to_string()),
            Err("cost 40000001 times 25 (rule \"export\"'s cost for this request) is above 1000000000".into())
        );
        assert!(check(d, &export, u64::MAX).is_err(), "never wraps");
    }
}
