//! Hierarchical fair shares: a parent bucket sized to what a backend takes, with a child
//! bucket per tenant inside it.
//!
//! Why: one token bucket per tenant either wastes the backend (each capped at its share while
//! the others are idle) or overloads it (each allowed the whole backend). Here every admission
//! is charged to the parent, so the backend is never offered more than the parent's rate and
//! burst; a tenant *borrows* the parent's spare capacity while the parent holds more than
//! `borrow_above` tokens, and once it holds fewer (the parent is *busy*) each tenant gets only
//! what its own bucket (its share of the rate and burst) allows.
//!
//! A request of cost `c` is admitted when the parent holds `c` and either
//! - borrowing: the parent still holds `borrow_above` tokens after `c`; taken from the parent
//!   only (the tenant's guarantee is kept for when the parent is busy), or
//! - the guaranteed path: the child holds `c`; taken from both.
//!
//! Both buckets are plain region-scope token buckets ([`super::token_bucket`], the same units,
//! refill and stored form), read and written in one atomic store call: the child under
//! [`crate::keys::fair_share_key`], the parent under [`crate::keys::fair_share_parent`]. A
//! refusal's `retry_after` is the sooner of the two paths' waits; it is never early, since
//! other tenants only take from the parent (the deny cache relies on it).

use super::{Outcome, Rate, RateError, Remote, Request, State, probe_cost, token_bucket};
use crate::time::{Micros, div_ceil};
use std::sync::Arc;

/// Shares are whole parts per million of the parent: `0.25` is 250,000.
pub const SHARE_SCALE: u64 = 1_000_000;

/// A rule's share table: the tenant's share (parts per million) picked by a descriptor's
/// value (a plan, a tier), the same `{by, values, default}` shape as a rule's cost.
pub type Shares = crate::pick::ByValue;

/// A fair share's numbers: the parent's, the borrowing threshold, and the child bucket of
/// one tenant's share (resolved per request, [`FairShare::with_share`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FairShare {
    /// The parent's rate (the backend's).
    pub rate: Rate,
    /// The parent's burst.
    pub burst: u64,
    /// Borrowing leaves at least this many tokens in the parent: the reserve the guaranteed
    /// shares of busy tenants draw on. Below `burst`.
    pub borrow_above: u64,
    /// The rule's share table.
    pub shares: Arc<Shares>,
    /// This tenant's share, parts per million.
    pub share: u64,
    /// The child's rate: the parent's times the share, rounded down (at least one token per
    /// period): never more than its share.
    pub child_rate: Rate,
    /// The child's burst: the parent's times the share, rounded down, at least 1.
    pub child_burst: u64,
}

/// The child bucket of `share` (ppm) of a parent of `rate` and `burst`.
pub fn child(rate: Rate, burst: u64, share: u64) -> Result<(Rate, u64), RateError> {
    let part = |n: u64| {
        u64::try_from(u128::from(n) * u128::from(share) / u128::from(SHARE_SCALE))
            .unwrap_or(u64::MAX)
            .max(1)
    };
    let r = Rate::new(part(rate.tokens()), rate.per())?;
    let b = part(burst).min(burst);
    r.fits(b)?;
    Ok((r, b))
}

impl FairShare {
    /// The numbers for a tenant of `share` (ppm); the rule's validation checked every share
    /// it lists, so this fails only for a share it did not.
    pub fn with_share(&self, share: u64) -> Result<FairShare, RateError> {
        let (child_rate, child_burst) = child(self.rate, self.burst, share)?;
        Ok(FairShare {
            share,
            child_rate,
            child_burst,
            ..self.clone()
        })
    }
}

/// How a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// From the parent's spare capacity: the parent only.
    Borrowed,
    /// Within the tenant's share: the child and the parent.
    Guaranteed,
    /// Neither.
    Refused,
}

/// Both buckets' tokens at `req.now` (their own units), refilled.
fn levels(
    fs: &FairShare,
    child: Option<&State>,
    parent: Option<&State>,
    now: Micros,
) -> (u64, u64) {
    let r = local(now, 0);
    let (c, ..) = token_bucket::current(fs.child_rate, fs.child_burst, child, &r);
    let (p, ..) = token_bucket::current(fs.rate, fs.burst, parent, &r);
    (c, p)
}

/// A region-scope request: both buckets are unshared whatever the caller passed.
fn local(now: Micros, cost: u64) -> Request<'static> {
    Request {
        now,
        cost,
        request_id: "",
        remote: Remote::default(),
    }
}

/// The two halves of a fair share's state (absent: fresh, full).
fn halves(state: Option<&State>) -> (Option<&State>, Option<&State>) {
    match state {
        Some(State::FairShare { child, parent }) => (child.as_deref(), parent.as_deref()),
        _ => (None, None),
    }
}

/// Which path a request of `cost` takes at `now` (a peek as for one unit). Borrowing is
/// preferred: it keeps the tenant's own bucket for when the parent is busy.
pub fn path(fs: &FairShare, state: Option<&State>, now: Micros, cost: u64) -> Path {
    let (child, parent) = halves(state);
    let (c, p) = levels(fs, child, parent, now);
    path_at(fs, c, p, probe_cost(cost))
}

fn path_at(fs: &FairShare, c: u64, p: u64, probe: u64) -> Path {
    let (ps, cs) = (fs.rate.scale(), fs.child_rate.scale());
    if probe.saturating_add(fs.borrow_above) <= fs.burst && p >= (probe + fs.borrow_above) * ps {
        Path::Borrowed
    } else if probe <= fs.child_burst && probe <= fs.burst && p >= probe * ps && c >= probe * cs {
        Path::Guaranteed
    } else {
        Path::Refused
    }
}

/// Whether the parent is busy at `now`: below `borrow_above` tokens plus one, where no
/// request borrows and every tenant is held to its own bucket.
pub fn busy(fs: &FairShare, state: Option<&State>, now: Micros) -> bool {
    let (child, parent) = halves(state);
    let (_, p) = levels(fs, child, parent, now);
    p < (fs.borrow_above + 1) * fs.rate.scale()
}

/// Units the tenant could take at once from levels `c` and `p`: by borrowing or within its
/// share, whichever gives more.
fn remaining(fs: &FairShare, c: u64, p: u64) -> u64 {
    let (ps, cs) = (fs.rate.scale(), fs.child_rate.scale());
    let borrow = (p / ps).saturating_sub(fs.borrow_above);
    let own = (c / cs).min(p / ps);
    borrow.max(own)
}

/// Wait until a bucket of `units` a µs holding `have` holds `need` (0 when it does).
fn wait(have: u64, need: u64, units: u64) -> Micros {
    div_ceil(need.saturating_sub(have), units)
}

pub(super) fn evaluate(fs: &FairShare, state: Option<&State>, req: &Request<'_>) -> Outcome {
    let (child, parent) = halves(state);
    let (c, p) = levels(fs, child, parent, req.now);
    let (ps, cs) = (fs.rate.scale(), fs.child_rate.scale());
    let (pu, cu) = (fs.rate.units(), fs.child_rate.units());
    let cap = fs.burst * ps;
    let window = token_bucket::full_period(fs.rate, fs.burst);
    let probe = probe_cost(req.cost);
    let (c2, p2) = match path_at(fs, c, p, probe) {
        Path::Refused => {
            let borrow = (probe.saturating_add(fs.borrow_above) <= fs.burst)
                .then(|| wait(p, (probe + fs.borrow_above) * ps, pu));
            let own = (probe <= fs.child_burst && probe <= fs.burst)
                .then(|| wait(c, probe * cs, cu).max(wait(p, probe * ps, pu)));
            let retry_after = match (borrow, own) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => window,
            };
            let remaining = remaining(fs, c, p);
            return Outcome {
                allowed: false,
                limit: fs.burst,
                remaining,
                reset: div_ceil(cap - p, pu),
                retry_after,
                window,
                usage: fs.burst - remaining.min(fs.burst),
                generation: 0,
            };
        }
        Path::Borrowed => (c, p - req.cost * ps),
        Path::Guaranteed => (c - req.cost * cs, p - req.cost * ps),
    };
    let remaining = remaining(fs, c2, p2);
    Outcome {
        allowed: true,
        limit: fs.burst,
        remaining,
        reset: div_ceil(cap - p2, pu),
        retry_after: 0,
        window,
        usage: fs.burst - remaining.min(fs.burst),
        generation: 0,
    }
}

/// Charges `req.cost` by the request's path: the parent only when borrowing, both on the
/// guaranteed path and on a charged refusal (each drained to empty at most). The returned
/// state holds both halves, each in a token bucket's stored form; the TTL is the longer of
/// the two ([`half_ttl`] gives each its own).
pub(super) fn take(fs: &FairShare, state: Option<&State>, req: &Request<'_>) -> (State, Micros) {
    let (child, parent) = halves(state);
    let (c, p) = levels(fs, child, parent, req.now);
    let child_cost = match path_at(fs, c, p, probe_cost(req.cost)) {
        Path::Borrowed => 0,
        Path::Guaranteed | Path::Refused => req.cost,
    };
    let (cs, cttl) = token_bucket::take(
        fs.child_rate,
        fs.child_burst,
        child,
        &local(req.now, child_cost),
    );
    let (ps, pttl) = token_bucket::take(fs.rate, fs.burst, parent, &local(req.now, req.cost));
    (
        State::FairShare {
            child: Some(Box::new(cs)),
            parent: Some(Box::new(ps)),
        },
        cttl.max(pttl),
    )
}

/// How long one half just written at `now` stays meaningful (its key's TTL): until its bucket
/// is full again; 0 (delete) when it is full. `parent` picks the parent's numbers.
pub fn half_ttl(fs: &FairShare, half: &State, parent: bool, now: Micros) -> Micros {
    let (rate, burst) = if parent {
        (fs.rate, fs.burst)
    } else {
        (fs.child_rate, fs.child_burst)
    };
    let (tokens, ..) = token_bucket::current(rate, burst, Some(half), &local(now, 0));
    token_bucket::ttl(rate, burst, tokens, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::SECOND;

    pub(crate) fn fs(rate: u64, burst: u64, borrow_above: u64, share: u64) -> FairShare {
        let shares = Arc::new(Shares {
            by: None,
            values: Vec::new(),
            default: share,
        });
        let (child_rate, child_burst) = child(Rate::per_second(rate), burst, share).expect("share");
        FairShare {
            rate: Rate::per_second(rate),
            burst,
            borrow_above,
            shares,
            share,
            child_rate,
            child_burst,
        }
    }

    fn step(f: &FairShare, st: &mut Option<State>, now: Micros, cost: u64) -> Outcome {
        let o = evaluate(f, st.as_ref(), &local(now, cost));
        if o.allowed {
            *st = Some(take(f, st.as_ref(), &local(now, cost)).0);
        }
        o
    }

    #[test]
    fn shares_round_down_and_never_exceed_the_parent() {
        for (rate, burst, share, want) in [
            (10, 20, 250_000, (2, 5)),
            (60, 3, 100_000, (6, 1)),
            (7, 9, SHARE_SCALE, (7, 9)),
            (60, 60, 333_333, (19, 19)),
        ] {
            let (r, b) = child(Rate::per_second(rate), burst, share).expect("share");
            assert_eq!((r.tokens(), r.per(), b), (want.0, SECOND, want.1));
        }
    }

    /// A lone tenant borrows down to the reserve, then spends its own burst, then is refused
    /// with the sooner path's wait.
    #[test]
    fn borrow_then_share_then_refuse() {
        let f = fs(10, 20, 10, 250_000);
        let mut st = None;
        let t0 = 1_800_000_000 * SECOND;
        for i in 0..10 {
            assert_eq!(path(&f, st.as_ref(), t0, 1), Path::Borrowed, "{i}");
            assert!(step(&f, &mut st, t0, 1).allowed);
        }
        assert!(busy(&f, st.as_ref(), t0));
        for i in 0..5 {
            assert_eq!(path(&f, st.as_ref(), t0, 1), Path::Guaranteed, "{i}");
            assert!(step(&f, &mut st, t0, 1).allowed);
        }
        let o = step(&f, &mut st, t0, 1);
        // The child (2/s) has its next token in 0.5 s; borrowing needs 6 more parent tokens.
        assert_eq!((o.allowed, o.retry_after), (false, SECOND / 2));
        assert!(!step(&f, &mut st, t0 + SECOND / 2 - 1, 1).allowed);
        assert!(step(&f, &mut st, t0 + SECOND / 2, 1).allowed);
    }

    #[test]
    fn a_cost_above_every_path_never_fits() {
        let f = fs(10, 20, 10, 250_000);
        let o = evaluate(&f, None, &local(0, 21));
        assert_eq!((o.allowed, o.retry_after), (false, 2 * SECOND));
        // 11 cannot borrow (11 + 10 > 20) nor fit the child (5): never.
        assert!(!evaluate(&f, None, &local(0, 11)).allowed);
        assert!(evaluate(&f, None, &local(0, 10)).allowed);
    }
}

#[cfg(test)]
#[path = "fair_share_proptests.rs"]
mod proptests;
