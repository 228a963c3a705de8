//! The `hot_keys` block of a rule: parsed and checked against the rule's algorithm and
//! numbers, every problem reported under the rule with its field.

use super::HotKeys;
use crate::Params;
use crate::algo::MAX_LIMIT;
use serde_json::Value;

/// The largest `sample`: past one in a thousand the daemon is guessing, not limiting.
pub const MAX_SAMPLE: u32 = 1_000;

/// The `hot_keys` block: `deny_cache: bool`, `lease: off | auto | N`, `split: N`,
/// `sample: N`, `sample_block: bool`, `sync_interval: off | duration`, `local_share: bool`;
/// every problem recorded in `f`. `charge_rejected`: the rule's own (a gate cannot charge
/// refusals it makes itself).
pub(crate) fn block(
    f: &mut crate::rules::Fields<'_>,
    v: Option<&Value>,
    params: Option<&Params>,
    charge_rejected: bool,
) -> Option<crate::hotkeys::HotKeys> {
    use crate::hotkeys::gate::{MAX_INTERVAL, MIN_INTERVAL, gate_refusal};
    use crate::hotkeys::split::{self, MAX_SPLIT, split_refusal};
    use crate::hotkeys::{LeaseMode, lease_refusal};
    let mut hk = HotKeys::default();
    let Some(v) = v else { return Some(hk) };
    let Some(obj) = v.as_object() else {
        f.bad("hot_keys", format!("expected a mapping, got {v}"));
        return None;
    };
    let mut ok = true;
    for (k, val) in obj {
        match (k.as_str(), val) {
            ("deny_cache", Value::Bool(b)) => hk.deny_cache = *b,
            ("deny_cache", other) => {
                f.bad(
                    "hot_keys.deny_cache",
                    format!("expected true or false, got {other}"),
                );
                ok = false;
            }
            ("lease", Value::String(s)) if s == "off" => hk.lease = LeaseMode::Off,
            ("lease", Value::Bool(false)) => hk.lease = LeaseMode::Off,
            ("lease", Value::String(s)) if s == "auto" => hk.lease = LeaseMode::Auto,
            ("lease", Value::Number(n))
                if n.as_u64().is_some_and(|n| (1..=MAX_LIMIT).contains(&n)) =>
            {
                hk.lease = LeaseMode::Batch(n.as_u64().unwrap_or(1));
            }
            ("lease", other) => {
                f.bad(
                    "hot_keys.lease",
                    format!("expected off, auto or a batch of 1 to {MAX_LIMIT} units, got {other}"),
                );
                ok = false;
            }
            ("split", Value::Number(n))
                if n.as_u64()
                    .is_some_and(|n| (1..=u64::from(MAX_SPLIT)).contains(&n)) =>
            {
                hk.split = n.as_u64().map_or(1, |n| n as u32);
            }
            ("split", other) => {
                f.bad(
                    "hot_keys.split",
                    format!("expected a number of sub-counts from 1 to {MAX_SPLIT}, got {other}"),
                );
                ok = false;
            }
            ("sample", Value::Number(n))
                if n.as_u64()
                    .is_some_and(|n| (1..=u64::from(MAX_SAMPLE)).contains(&n)) =>
            {
                hk.sample = n.as_u64().map_or(1, |n| n as u32);
            }
            ("sample", other) => {
                f.bad(
                    "hot_keys.sample",
                    format!(
                        "expected 1 to {MAX_SAMPLE} (ask the store for 1 request in N), got {other}"
                    ),
                );
                ok = false;
            }
            ("sample_block", Value::Bool(b)) => hk.sample_block = *b,
            ("sample_block", other) => {
                f.bad(
                    "hot_keys.sample_block",
                    format!("expected true or false, got {other}"),
                );
                ok = false;
            }
            ("sync_interval", Value::Bool(false)) => hk.sync_interval = None,
            ("sync_interval", Value::String(s)) if s == "off" => hk.sync_interval = None,
            ("sync_interval", Value::String(s)) => {
                match crate::time::parse_span(s).ok().and_then(|sp| sp.fixed()) {
                    Some(us) if (MIN_INTERVAL..=MAX_INTERVAL).contains(&us) => {
                        hk.sync_interval = Some(us);
                    }
                    _ => {
                        f.bad(
                            "hot_keys.sync_interval",
                            format!(
                                "expected off or a duration from {} to {}, got {s:?}",
                                crate::time::Span::Fixed(MIN_INTERVAL),
                                crate::time::Span::Fixed(MAX_INTERVAL)
                            ),
                        );
                        ok = false;
                    }
                }
            }
            ("sync_interval", other) => {
                f.bad(
                    "hot_keys.sync_interval",
                    format!("expected off or a duration such as 1s, got {other}"),
                );
                ok = false;
            }
            ("local_share", Value::Bool(b)) => hk.local_share = *b,
            ("local_share", other) => {
                f.bad(
                    "hot_keys.local_share",
                    format!("expected true or false, got {other}"),
                );
                ok = false;
            }
            (other, _) => {
                f.bad(
                    &format!("hot_keys.{other}"),
                    "unknown field (deny_cache | lease | split | sample | sample_block | \
                     sync_interval | local_share)",
                );
                ok = false;
            }
        }
    }
    if hk.lease != LeaseMode::Off
        && let Some(p) = params
    {
        if let Some(why) = lease_refusal(p.kind()) {
            f.bad(
                "hot_keys.lease",
                format!("not defined for {}: {why}", p.kind().name()),
            );
            ok = false;
        } else if let LeaseMode::Batch(n) = hk.lease
            && n > split::smallest_capacity(p, hk.split)
        {
            let what = if hk.split > 1 {
                format!(
                    "the smallest sub-count's capacity of {} split {} ways",
                    p.limit(),
                    hk.split
                )
            } else {
                "the rule's capacity".to_string()
            };
            f.bad(
                "hot_keys.lease",
                format!(
                    "a batch of {n} is more than {what} ({}): it could never be granted",
                    split::smallest_capacity(p, hk.split)
                ),
            );
            ok = false;
        }
    }
    if hk.split > 1
        && let Some(p) = params
    {
        if let Some(why) = split_refusal(p.kind()) {
            f.bad(
                "hot_keys.split",
                format!("not defined for {}: {why}", p.kind().name()),
            );
            ok = false;
        } else if let Some(problem) = split_leaves_zero(p, hk.split) {
            f.bad("hot_keys.split", problem);
            ok = false;
        }
    }
    if hk.sample > 1
        && let Some(p) = params
    {
        if p.kind() == crate::algo::Kind::Concurrency {
            f.bad(
                "hot_keys.sample",
                "not defined for concurrency: a slot is held by the one request that took it",
            );
            ok = false;
        } else if p.kind() == crate::algo::Kind::LeakyQueue {
            f.bad(
                "hot_keys.sample",
                "not defined for leaky_queue: a sample at N times its cost would hold N \
                 departures for one request and let the others out unspaced",
            );
            ok = false;
        } else if hk.lease != LeaseMode::Off {
            f.bad(
                "hot_keys.sample",
                "choose lease or sample: a lease already saves the calls sampling would",
            );
            ok = false;
        } else if u64::from(hk.sample) > split::smallest_capacity(p, hk.split) {
            f.bad(
                "hot_keys.sample",
                format!(
                    "a sample costs {} units, more than the rule's capacity ({}): it could never pass",
                    hk.sample,
                    split::smallest_capacity(p, hk.split)
                ),
            );
            ok = false;
        }
    }
    if hk.sync_interval.is_some() || hk.local_share {
        let field = if hk.sync_interval.is_some() {
            "hot_keys.sync_interval"
        } else {
            "hot_keys.local_share"
        };
        if let Some((p, why)) = params.and_then(|p| Some((p, gate_refusal(p.kind())?))) {
            f.bad(field, format!("not defined for {}: {why}", p.kind().name()));
            ok = false;
        } else if hk.lease != LeaseMode::Off || hk.sample > 1 {
            f.bad(
                field,
                "choose one of lease, sample and sync: each already saves the store calls \
                 the others would",
            );
            ok = false;
        } else if charge_rejected {
            f.bad(
                field,
                "a rule that charges refusals needs the store to see every request; a gate \
                 refuses without it",
            );
            ok = false;
        } else if let (Some(iv), Some(longest)) = (
            hk.sync_interval,
            params.and_then(crate::hotkeys::gate::longest_interval),
        ) && iv > longest
        {
            let why = "admissions are charged when their sync goes out, and a bucket left \
                       uncharged longer sits full and loses its refill";
            let msg = if longest < MIN_INTERVAL {
                format!(
                    "this bucket fills in {}: a sync interval must be at most half that \
                     ({why}), and {} is the shortest; lease its units instead",
                    crate::time::Span::Fixed(2 * longest),
                    crate::time::Span::Fixed(MIN_INTERVAL)
                )
            } else {
                format!(
                    "at most {} for this bucket, half the time it takes to fill ({why})",
                    crate::time::Span::Fixed(longest)
                )
            };
            f.bad("hot_keys.sync_interval", msg);
            ok = false;
        }
    }
    ok.then_some(hk)
}

/// Why splitting `params` `of` ways leaves a sub-count with 0 of a number, or a bucket rate
/// it cannot count exactly (a share of `7/1m` has units of its own: its burst must still fit
/// 2^53 of them), or `None`.
pub(crate) fn split_leaves_zero(params: &Params, of: u32) -> Option<String> {
    if let Some((name, v)) = crate::hotkeys::split::numbers(params)
        .into_iter()
        .find(|&(_, v)| v < u64::from(of))
    {
        return Some(format!(
            "{of} sub-counts need {name} of at least {of}, got {v}: a sub-count would have 0"
        ));
    }
    let (Params::TokenBucket { rate, burst } | Params::Gcra { rate, burst }) = params else {
        return None;
    };
    (0..of)
        .find_map(|part| {
            let share = |v| crate::hotkeys::split::share(v, part, of);
            match rate.with_tokens(share) {
                Some(sub) => sub.fits(share(*burst)).err().map(|e| e.to_string()),
                None => Some(format!(
                    "{}/{} cannot be counted exactly",
                    share(rate.tokens()),
                    crate::time::Span::Fixed(rate.per())
                )),
            }
        })
        .map(|e| format!("a sub-count of {rate}: {e}"))
}
