//! A token bucket rule's `fair_share`: the bucket becomes the parent of one child bucket per
//! tenant (the rule's key), each weighted by a share picked by a descriptor's value, the same
//! `{by, values, default}` shape as a rule's cost ([`crate::algo::fair_share`] decides).

use super::{Fields, Scope};
use crate::algo::Params;
use crate::algo::fair_share::{FairShare, SHARE_SCALE, Shares, child};
use crate::hotkeys::{HotKeys, LeaseMode};
use serde_json::Value;
use std::sync::Arc;

/// One share as written: a fraction 0 < s ≤ 1, kept in parts per million.
fn share(f: &mut Fields<'_>, what: &str, v: &Value) -> Option<u64> {
    let ppm = v
        .as_f64()
        .filter(|s| *s > 0.0 && *s <= 1.0)
        .map(|s| (s * SHARE_SCALE as f64).round() as u64)
        .filter(|&p| p >= 1);
    if ppm.is_none() {
        f.bad(
            "fair_share",
            format!("{what} must be a fraction above 0 and at most 1, got {v}"),
        );
    }
    ppm
}

/// Reads `fair_share` (a share for every tenant, or `{by, values, default, borrow_above}`)
/// onto the token bucket `params`, refusing what it cannot be: another algorithm, global
/// scope, a hot-key mode that decides in the daemon, a share whose bucket cannot be counted
/// exactly.
pub(super) fn fair_share(
    f: &mut Fields<'_>,
    v: &Value,
    params: Option<Params>,
    scope: Scope,
    valid_name: impl Fn(&str) -> bool,
) -> Option<Params> {
    let mut shares = Shares {
        by: None,
        values: Vec::new(),
        default: 0,
    };
    let mut borrow_above = None;
    let mut ok = true;
    match v {
        Value::Number(_) => match share(f, "a share", v) {
            Some(s) => shares.default = s,
            None => ok = false,
        },
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("by", Value::String(s)) if valid_name(s) => shares.by = Some(s.clone()),
                    ("by", other) => {
                        f.bad(
                            "fair_share",
                            format!("by must be a descriptor name, got {other}"),
                        );
                        ok = false;
                    }
                    ("values", Value::Object(vals)) => {
                        for (name, s) in vals {
                            match share(f, &format!("the share of {name:?}"), s) {
                                Some(s) => shares.values.push((name.clone(), s)),
                                None => ok = false,
                            }
                        }
                    }
                    ("values", other) => {
                        f.bad(
                            "fair_share",
                            format!("values must be a mapping of value to share, got {other}"),
                        );
                        ok = false;
                    }
                    ("default", s) => match share(f, "default", s) {
                        Some(s) => shares.default = s,
                        None => ok = false,
                    },
                    ("borrow_above", n) => match n.as_u64() {
                        Some(n) => borrow_above = Some(n),
                        None => {
                            f.bad(
                                "fair_share",
                                format!("borrow_above must be a whole number of tokens, got {n}"),
                            );
                            ok = false;
                        }
                    },
                    (other, _) => {
                        f.bad(
                            "fair_share",
                            format!(
                                "unknown field {other:?} (expected by, values, default, borrow_above)"
                            ),
                        );
                        ok = false;
                    }
                }
            }
            if ok && shares.default == 0 {
                f.bad(
                    "fair_share",
                    "default is required: the share of a tenant whose value is not listed",
                );
                ok = false;
            }
            if ok && shares.by.is_none() && !shares.values.is_empty() {
                f.bad(
                    "fair_share",
                    "values need by: the descriptor that picks them",
                );
                ok = false;
            }
        }
        other => {
            f.bad(
                "fair_share",
                format!("expected a share (0.25) or {{by, values, default}}, got {other}"),
            );
            ok = false;
        }
    }
    if scope == Scope::Global {
        f.bad(
            "scope",
            "global is not possible with fair_share: the parent is one backend's capacity checked with a tenant in one atomic call on one store, and other regions' figures arrive late and per key (give each region's backend its own parent)",
        );
        ok = false;
    }
    let Some(Params::TokenBucket { rate, burst }) = params else {
        // Another algorithm was refused by the table (`does not apply to ...`).
        return None;
    };
    let borrow_above = borrow_above.unwrap_or(burst / 2);
    if borrow_above >= burst {
        f.bad(
            "fair_share",
            format!("borrow_above must be below the burst ({burst}), got {borrow_above}"),
        );
        ok = false;
    }
    let listed = std::iter::once(("default".to_string(), shares.default))
        .chain(shares.values.iter().cloned());
    for (name, s) in listed {
        if let Err(e) = child(rate, burst, s) {
            f.bad("fair_share", format!("the share of {name:?}: {e}"));
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    let (child_rate, child_burst) = child(rate, burst, shares.default).ok()?;
    Some(Params::FairShare(FairShare {
        rate,
        burst,
        borrow_above,
        share: shares.default,
        shares: Arc::new(shares),
        child_rate,
        child_burst,
    }))
}

/// The hot-key modes a fair share refuses, by field: each decides in the daemon from one
/// bucket, or splits the parent, where the promise needs the child and the parent checked
/// together by the store. The deny cache stays (a refusal's wait is never early), and so does
/// leasing: a lease call is the same atomic check of both buckets (cost = the batch), and
/// what a lease gives back goes to the parent ([`crate::hotkeys::lease`]).
pub(super) fn hot_keys_refusal(h: &HotKeys) -> Option<&'static str> {
    if h.split > 1 {
        Some("split")
    } else if h.sample > 1 {
        Some("sample")
    } else if h.sync_interval.is_some() {
        Some("sync_interval")
    } else if h.local_share {
        Some("local_share")
    } else {
        None
    }
}

/// Why a fixed `lease` batch cannot serve this fair share: a batch above the smallest
/// tenant's burst could never be granted on the guaranteed path, so that tenant would get
/// nothing while the parent is busy. `auto` batches are capped per tenant instead.
pub(super) fn lease_problem(h: &HotKeys, fs: &FairShare) -> Option<String> {
    let LeaseMode::Batch(n) = h.lease else {
        return None;
    };
    let (name, smallest) = smallest_child_burst(fs);
    (n > smallest).then(|| {
        format!(
            "a batch of {n} is more than the burst of the smallest share ({name:?}: {smallest}): that tenant's batch could never be granted within its share while the parent is busy"
        )
    })
}

/// The smallest child burst over the shares a rule lists (default included), and which.
fn smallest_child_burst(fs: &FairShare) -> (String, u64) {
    std::iter::once(("default", fs.shares.default))
        .chain(fs.shares.values.iter().map(|(n, s)| (n.as_str(), *s)))
        .filter_map(|(n, s)| child(fs.rate, fs.burst, s).ok().map(|(_, b)| (n, b)))
        .min_by_key(|&(_, b)| b)
        .map_or(("default".to_string(), fs.child_burst), |(n, b)| {
            (n.to_string(), b)
        })
}

#[cfg(test)]
mod tests {
    use crate::algo::{Params, SHARE_SCALE};
    use crate::decision::plan;
    use crate::keys::{fair_share_key, fair_share_parent};
    use crate::matching::desc;
    use crate::rules::{RulesError, parse_rule, parse_yaml};
    use serde_json::{Value, json};

    fn rule(extra: Value) -> Value {
        let mut r = json!({
            "id": "backend", "key": ["tenant"], "algorithm": "token_bucket",
            "rate_per_s": 60, "burst": 60,
            "fair_share": {"by": "tier", "values": {"gold": 0.5, "silver": 0.25}, "default": 0.1},
        });
        for (k, v) in extra.as_object().expect("a mapping") {
            r[k] = v.clone();
        }
        r
    }

    fn problems(v: &Value) -> Vec<(String, String)> {
        match parse_rule(v) {
            Ok(_) => Vec::new(),
            Err(RulesError { problems, .. }) => problems
                .into_iter()
                .map(|p| {
                    assert_eq!(p.at, "backend", "{p:?}");
                    (p.field, p.message)
                })
                .collect(),
        }
    }

    #[test]
    fn a_fair_share_rule_reads_its_shares_and_reserve() {
        let r = parse_rule(&rule(json!({}))).expect("valid");
        let Params::FairShare(fs) = &r.params else {
            panic!("{:?}", r.params)
        };
        assert_eq!((fs.burst, fs.borrow_above), (60, 30));
        assert_eq!(fs.shares.pick(Some("gold")), SHARE_SCALE / 2);
        assert_eq!(fs.shares.pick(Some("iron")), SHARE_SCALE / 10);
        assert_eq!(
            (fs.share, fs.child_burst, fs.child_rate.tokens()),
            (100_000, 6, 6)
        );
        let r = parse_rule(&rule(json!({"fair_share": 0.25}))).expect("valid");
        assert!(matches!(&r.params, Params::FairShare(fs) if fs.share == SHARE_SCALE / 4));
        let r = parse_rule(&rule(
            json!({"fair_share": {"default": 0.5, "borrow_above": 59}}),
        ))
        .expect("valid");
        assert!(matches!(&r.params, Params::FairShare(fs) if fs.borrow_above == 59));
    }

    #[test]
    fn what_a_fair_share_cannot_be_is_refused_with_its_reason() {
        let cases = [
            (
                json!({"algorithm": "gcra"}),
                "fair_share",
                "does not apply to gcra",
            ),
            (
                json!({"scope": "global"}),
                "scope",
                "global is not possible with fair_share",
            ),
            (
                json!({"hot_keys": {"sync_interval": "200ms"}}),
                "hot_keys",
                "sync_interval is not possible",
            ),
            (
                json!({"hot_keys": {"lease": 7}}),
                "hot_keys.lease",
                "a batch of 7 is more than the burst of the smallest share (\"default\": 6)",
            ),
            (
                json!({"hot_keys": {"split": 2}}),
                "hot_keys",
                "split is not possible",
            ),
            (
                json!({"fair_share": 1.5}),
                "fair_share",
                "a share must be a fraction",
            ),
            (
                json!({"fair_share": {"by": "tier"}}),
                "fair_share",
                "default is required",
            ),
            (
                json!({"fair_share": {"values": {"a": 0.5}, "default": 0.1}}),
                "fair_share",
                "values need by",
            ),
            (
                json!({"fair_share": {"default": 0.5, "borrow_above": 60}}),
                "fair_share",
                "borrow_above must be below the burst (60)",
            ),
            (
                json!({"fair_share": {"default": 0.5, "spare": 1}}),
                "fair_share",
                "unknown field \"spare\"",
            ),
        ];
        for (extra, field, message) in cases {
            let got = problems(&rule(extra.clone()));
            assert!(
                got.iter().any(|(f, m)| f == field && m.contains(message)),
                "{extra}: {got:?}"
            );
        }
        assert_eq!(problems(&rule(json!({}))), vec![]);
    }

    /// A tenant's key sits beside the parent's on the domain's hash tag, its numbers are its
    /// tier's share, and it is a call of its own, apart from the identity's other rules.
    #[test]
    fn a_tenant_counts_beside_the_parent_in_a_call_of_its_own() {
        let set = parse_yaml(
            "domain: api
rules:
  - id: backend
    key: [tenant]
    algorithm: token_bucket
    rate_per_s: 60
    burst: 60
    fair_share: { by: tier, values: { gold: 0.5 }, default: 0.25 }
  - id: per-tenant
    key: [tenant]
    algorithm: fixed_window
    limit: 100
    window: 1m
",
        )
        .expect("valid rules");
        let domain = set.domain("api").expect("the domain");
        let p = plan(
            domain,
            &desc(&[("tenant", "k1"), ("tier", "gold")]),
            0,
            1,
            "r",
            |_| crate::algo::Remote::default(),
        );
        assert_eq!(p.calls.len(), 2, "{:?}", p.calls);
        let fair = p
            .calls
            .iter()
            .flat_map(|c| &c.call.items)
            .find(|i| matches!(i.params, Params::FairShare(_)))
            .expect("the fair share's item");
        assert_eq!(fair.key, fair_share_key("api|tenant=k1", "backend"));
        assert_eq!(fair.key, "sl:{api}:t:backend|api|tenant=k1");
        assert_eq!(fair_share_parent(&fair.key), "sl:{api}:t:backend");
        let parts = crate::keys::parse(&fair.key).expect("parses");
        assert_eq!((parts.identity, parts.rule), ("api", "backend"));
        let Params::FairShare(fs) = &fair.params else {
            unreachable!()
        };
        assert_eq!(
            (fs.share, fs.child_rate.tokens(), fs.child_burst),
            (500_000, 30, 30)
        );
    }
}
