//! Key splitting (`hot_keys.split: N`): one identity counted under N sub-counts, each with a
//! share of the rule's numbers and a hash tag of its own ([`crate::keys::sub_identity`]), so
//! one hot identity's store calls spread over N Redis Cluster slots instead of one.
//!
//! Each request takes from one sub-count, picked from its request id ([`pick`]): the core
//! draws no random number, and the request id is unique per check on a daemon. The shares add
//! up to the rule's numbers exactly ([`share`]), so a split rule never admits more than the
//! rule in total; what it costs is refusals while another sub-count still has room (near the
//! limit; docs/hot-keys.md has the figures), and a store call of its own per request.

use crate::algo::{Kind, Params};
use crate::hash::stable_hash;
use crate::matching::Applied;
use crate::time::Micros;

/// The most sub-counts a rule may split into.
pub const MAX_SPLIT: u32 = 64;

/// Why a rule's algorithm cannot be split, or `None` when it can.
pub fn split_refusal(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::TokenBucket | Kind::Gcra | Kind::FixedWindow | Kind::SlidingWindow => None,
        Kind::SlidingLog => Some(
            "a sliding log is the exact algorithm, for small limits; split, each sub-count \
             holds a fraction of an already small limit and refuses while the others have room",
        ),
        Kind::Concurrency => Some(
            "a slot is released by request id under the rule's key; a split slot would sit in \
             one of N sub-counts the release cannot name",
        ),
        Kind::LeakyQueue => Some(
            "a shaping queue spaces every departure of the key one interval apart; N sub-counts \
             would each let requests out at that spacing, N times the rate",
        ),
    }
}

/// Sub-count `part`'s share of `x` units split `of` ways: `x / of`, plus one of the
/// remainder for the first `x % of` parts, so the shares add up to `x` exactly.
pub fn share(x: u64, part: u32, of: u32) -> u64 {
    let of = u64::from(of.max(1));
    x / of + u64::from(u64::from(part) < x % of)
}

/// The numbers of sub-count `part` of `of`: every number of `params` (limit; rate and
/// burst) shared by [`share`]. Windows and timeouts stay as they are.
pub fn sub_params(params: &Params, part: u32, of: u32) -> Params {
    let s = |v: u64| share(v, part, of);
    let mut p = params.clone();
    match &mut p {
        Params::TokenBucket { rate, burst } | Params::Gcra { rate, burst } => {
            // A share of no token keeps the whole rate's period with none: validation refuses
            // splits that leave one (`numbers`), so this only guards arithmetic.
            *rate = rate.with_tokens(s).unwrap_or(*rate);
            *burst = s(*burst);
        }
        Params::FixedWindow { limit, .. }
        | Params::SlidingWindow { limit, .. }
        | Params::SlidingLog { limit, .. }
        | Params::Concurrency { limit, .. } => *limit = s(*limit),
        // Never split: validation refuses it (`split_refusal`).
        Params::LeakyQueue { .. } => {}
        // Never split (validation refuses it): the parent is one count by definition.
        Params::FairShare(_) => {}
    }
    p
}

/// The numbers of `params` a split must share out (limit, or rate and burst), named as in
/// the rule format, for validation: a split leaving a sub-count with 0 of any is refused.
pub fn numbers(params: &Params) -> Vec<(&'static str, u64)> {
    match params {
        Params::TokenBucket { rate, burst } | Params::Gcra { rate, burst } => {
            vec![("rate", rate.tokens()), ("burst", *burst)]
        }
        p => vec![("limit", p.limit())],
    }
}

/// The smallest sub-count's capacity (`limit / of`, rounded down): what a lease batch may
/// not exceed.
pub fn smallest_capacity(params: &Params, of: u32) -> u64 {
    params.limit() / u64::from(of.max(1))
}

/// The sub-count a request takes from: its request id's stable hash, mixed (FNV's low bits
/// depend on the low bits of each byte only) and reduced to `0..of`.
pub fn pick(request_id: &str, of: u32) -> u32 {
    let mut z = stable_hash(&[request_id]);
    // splitmix64's finalizer.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % u64::from(of.max(1))) as u32
}

/// Which sub-count an applied rule counts under, and the whole rule's figures for headers.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// The sub-count, `0..of`.
    pub part: u32,
    /// How many sub-counts the rule has.
    pub of: u32,
    /// The whole rule's limit (the sum of the sub-counts'), quoted in headers.
    pub limit: u64,
    /// The whole rule's window, quoted in headers.
    pub window: Micros,
    /// The whole rule's numbers (overrides applied): what the sub-counts add up to, for a
    /// model that keeps the ground truth of the whole key (the simulator).
    pub whole: Params,
}

impl Split {
    /// What the client is told is left of the whole rule: the sub-count's remaining scaled by
    /// the whole limit over the sub-count's (`sub_limit`), at most the whole limit. An
    /// estimate: the other sub-counts hold about as much when requests spread evenly.
    pub fn remaining(&self, remaining: u64, sub_limit: u64) -> u64 {
        let scaled = u128::from(remaining) * u128::from(self.limit) / u128::from(sub_limit.max(1));
        scaled.min(u128::from(self.limit)) as u64
    }
}

/// Puts an applied rule with `split: N > 1` on the sub-count `request_id` picks: its identity
/// (so it gets a store call of its own, on its own slot), key and numbers become the
/// sub-count's. Rules that are not split are left as they are.
pub fn apply(a: &mut Applied<'_>, request_id: &str) {
    let of = a.rule.hot_keys.split;
    if of <= 1 {
        return;
    }
    let part = pick(request_id, of);
    a.split = Some(Split {
        part,
        of,
        limit: a.params.limit(),
        window: a.params.window(),
        whole: a.params.as_ref().clone(),
    });
    let sub = sub_params(&a.params, part, of);
    a.identity = crate::keys::sub_identity(&a.identity, part);
    a.key = crate::keys::store_key(&a.identity, &a.rule.id, sub.kind());
    a.params = std::borrow::Cow::Owned(sub);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{Rate, Window};
    use crate::time::SECOND;

    #[test]
    fn shares_add_up_exactly_and_differ_by_at_most_one() {
        for x in [1u64, 2, 3, 7, 10, 99, 100, 1_000, 1_000_000_007] {
            for of in 1..=MAX_SPLIT {
                if x < u64::from(of) {
                    continue;
                }
                let shares: Vec<u64> = (0..of).map(|p| share(x, p, of)).collect();
                assert_eq!(shares.iter().sum::<u64>(), x, "{x} / {of}");
                let (lo, hi) = (shares.iter().min(), shares.iter().max());
                assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1 && *l >= 1));
            }
        }
        let tb = Params::TokenBucket {
            rate: Rate::per_second(10),
            burst: 40,
        };
        assert_eq!(
            (0..3).map(|p| sub_params(&tb, p, 3)).collect::<Vec<_>>(),
            [
                Params::TokenBucket {
                    rate: Rate::per_second(4),
                    burst: 14
                },
                Params::TokenBucket {
                    rate: Rate::per_second(3),
                    burst: 13
                },
                Params::TokenBucket {
                    rate: Rate::per_second(3),
                    burst: 13
                },
            ]
        );
        let fw = Params::FixedWindow {
            limit: 100,
            window: Window::Epoch(SECOND),
        };
        assert_eq!(
            sub_params(&fw, 0, 8),
            Params::FixedWindow {
                limit: 13,
                window: Window::Epoch(SECOND)
            }
        );
        assert_eq!(smallest_capacity(&fw, 8), 12);
    }

    #[test]
    fn picks_spread_evenly_over_sequential_request_ids() {
        // The daemon's ids are `<tag>-<sequence>`.
        for of in [2u32, 3, 4, 8, 64] {
            let mut counts = vec![0u32; of as usize];
            let n = 64_000u32;
            for i in 0..n {
                counts[pick(&format!("d1a2-{i}"), of) as usize] += 1;
            }
            let even = n / of;
            assert!(
                counts.iter().all(|&c| c.abs_diff(even) < even / 10),
                "{of}: {counts:?}"
            );
        }
        assert_eq!(pick("same", 7), pick("same", 7));
        assert_eq!(pick("anything", 1), 0);
    }

    #[test]
    fn the_whole_rule_is_quoted_to_clients() {
        let s = Split {
            part: 0,
            of: 3,
            limit: 100,
            window: SECOND,
            whole: Params::FixedWindow {
                limit: 100,
                window: Window::Epoch(SECOND),
            },
        };
        assert_eq!(s.remaining(34, 34), 100);
        assert_eq!(s.remaining(17, 34), 50);
        assert_eq!(s.remaining(0, 33), 0);
    }
}
