//! The store guard: what a daemon decides around each store call, with time as an argument.
//!
//! One [`StoreGuard`] per store shard holds that shard's [`Breaker`] and answers the questions
//! a shell would otherwise answer itself:
//!
//! - **send or not**: [`StoreGuard::admit`] hands out a [`Ticket`] (a breaker permit), or
//!   refuses while the breaker is open, and the call is answered as failed without touching
//!   the store;
//! - **what an ending counts as**: [`Ended`] says how a sent call ended; only outages count
//!   against the shard, and a call that missed its deadline is one;
//! - **when local buckets go**: [`StoreGuard::finish`] reports the breaker [`Transition`];
//!   [`Transition::Closed`] means the store is the truth again and the shard's local buckets
//!   are dropped (identities on shards still down keep theirs);
//! - **what a failed call is answered with**: [`answer`], the local fallback of the call's
//!   `on_store_failure: local` rules;
//! - **what goes to the quota journal**: [`journaled`], the admissions counted against a
//!   quota-sized fixed window while its store call failed.
//!
//! A store that cannot have outages (in memory) gets [`StoreGuard::unguarded`]: a breaker
//! shared by every rule would let one rule's bad key refuse every other rule's callers.
//!
//! The daemon (`sluiced`'s engine) drives it with its monotonic clock and only runs the I/O:
//! the store call under its deadline, the local bucket, the journal write. The simulator
//! drives one per simulated daemon on virtual time (a region's store is one shard), and
//! counts what [`journaled`] selects instead of journaling it.

use crate::algo::{Params, Window};
use crate::batch::{Call, CallResult};
use crate::breaker::{Breaker, BreakerConfig, BreakerState, Permit};
use crate::decision::{Answer, Decision, Plan};
use crate::rules::FailureMode;
use crate::time::{Micros, SECOND};

/// Fixed windows at least this long are quotas worth journaling: a daily or monthly total
/// decided on local buckets through an outage would otherwise forget the outage's admissions.
pub const QUOTA_WINDOW: Micros = 3_600 * SECOND;

/// How a store call that was sent ended, as the breaker counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The store answered.
    Answered,
    /// The store returned an error. `outage`: the shard is struggling or gone (refused or
    /// dropped connection, `BUSY`, `LOADING`, ...), as opposed to one key's or one request's
    /// problem (corrupt state, a refused argument), where the store did answer.
    Failed {
        /// Whether the error is an outage of the shard.
        outage: bool,
    },
    /// No answer within the call's deadline: an outage of the shard.
    DeadlineMissed,
}

impl Ended {
    /// Whether the shard answered, which is what the breaker records: everything but an outage.
    pub fn healthy(self) -> bool {
        match self {
            Ended::Answered => true,
            Ended::Failed { outage } => !outage,
            Ended::DeadlineMissed => false,
        }
    }
}

/// What [`StoreGuard::admit`] decides about a call.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an admitted call's ticket must be finished or abandoned"]
pub enum Admit {
    /// Send it; report how it ended with [`StoreGuard::finish`] (or give the ticket back
    /// with [`StoreGuard::abandon`] if it never ends).
    Send(Ticket),
    /// The breaker is open (or its half-open probes are all in flight): do not send; the call
    /// is answered as failed.
    Refused,
}

/// A call let through: the breaker permit it holds while in flight.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a ticket must be finished or abandoned"]
pub struct Ticket {
    permit: Option<Permit>,
}

impl Ticket {
    /// Whether the call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.permit.as_ref().is_some_and(Permit::is_probe)
    }
}

/// A change of the breaker that the shell acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Calls to the shard now fail fast until the cool-off ends.
    Opened,
    /// The shard answers again: drop its local buckets (the store is the truth again, and a
    /// bucket refills from its stored timestamp, so nothing needs replaying).
    Closed,
}

/// The guard of one store shard.
#[derive(Clone, Debug)]
pub struct StoreGuard {
    breaker: Option<Breaker>,
}

impl StoreGuard {
    /// A guard for a shard that can have outages: a closed breaker.
    pub fn new(cfg: BreakerConfig) -> StoreGuard {
        StoreGuard {
            breaker: Some(Breaker::new(cfg)),
        }
    }

    /// A guard for a store without outages: every call is sent and nothing is counted.
    pub fn unguarded() -> StoreGuard {
        StoreGuard { breaker: None }
    }

    /// The guard a store gets: a breaker only if it can have outages.
    pub fn for_store(cfg: BreakerConfig, outages: bool) -> StoreGuard {
        if outages {
            StoreGuard::new(cfg)
        } else {
            StoreGuard::unguarded()
        }
    }

    /// The breaker's state and how many times it opened; `None` without a breaker.
    pub fn breaker(&self) -> Option<(BreakerState, u64)> {
        self.breaker.as_ref().map(|b| (b.state(), b.times_opened()))
    }

    /// Whether a call may be sent at `now` (monotonic µs: a wall clock stepped back would
    /// stretch the cool-off).
    pub fn admit(&mut self, now: Micros) -> Admit {
        match &mut self.breaker {
            None => Admit::Send(Ticket { permit: None }),
            Some(b) => match b.permit(now) {
                Some(p) => Admit::Send(Ticket { permit: Some(p) }),
                None => Admit::Refused,
            },
        }
    }

    /// Records how an admitted call ended at `now`; the breaker's transition, if it opened or
    /// closed.
    pub fn finish(&mut self, now: Micros, ticket: Ticket, ended: Ended) -> Option<Transition> {
        let (Some(b), Some(permit)) = (&mut self.breaker, ticket.permit) else {
            return None;
        };
        let before = b.state();
        b.finish(now, permit, ended.healthy());
        let after = b.state();
        if before == after {
            return None;
        }
        match after {
            BreakerState::Open { .. } => Some(Transition::Opened),
            BreakerState::Closed => Some(Transition::Closed),
            BreakerState::HalfOpen { .. } => None,
        }
    }

    /// Gives back the ticket of a call that will never end (cancelled in flight), so a
    /// half-open breaker does not run out of probes.
    pub fn abandon(&mut self, ticket: Ticket) {
        if let (Some(b), Some(p)) = (&mut self.breaker, ticket.permit) {
            b.abandon(p);
        }
    }
}

/// The answer to call `i` of `p`: the store's `result`, or, when the call failed however it
/// failed (refused by the breaker, an error, the deadline), the result of its local fallback
/// ([`Plan::fallback`] at `local_permille`) run by `local` on the daemon's own buckets.
pub fn answer(
    p: &Plan<'_>,
    i: usize,
    result: Option<CallResult>,
    local_permille: u64,
    local: impl FnOnce(&Call) -> Option<CallResult>,
) -> Answer {
    match result {
        Some(r) => Answer::Done(r),
        None => Answer::Failed {
            local: p.fallback(i, local_permille).and_then(|c| local(&c)),
        },
    }
}

/// How the rules of a call the store failed were answered, by their failure mode: what the
/// daemon's per-store failure counters and the simulator's report add up, from one count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureTally {
    /// Rules answered as if admitted (`on_store_failure: open`).
    pub open: u64,
    /// Rules answered with a refusal (`closed`).
    pub closed: u64,
    /// Rules answered by the daemon's local buckets (`local`).
    pub local: u64,
}

/// [`FailureTally`] of call `i` of `p`, to count when that call failed.
pub fn failure_tally(p: &Plan<'_>, i: usize) -> FailureTally {
    let mut t = FailureTally::default();
    for &ri in p.calls.get(i).map_or(&[][..], |pc| &pc.rules[..]) {
        match p.applied[ri].rule.on_store_failure {
            FailureMode::Open => t.open += 1,
            FailureMode::Closed => t.closed += 1,
            FailureMode::Local => t.local += 1,
        }
    }
    t
}

/// What an admitted request journals: `(store, key, window, units)` of each quota-sized
/// fixed window ([`QUOTA_WINDOW`] or longer) whose store call failed, so the total survives
/// the outage; `store` is the named store the call went to (`None`: the main one,
/// [`Plan::store_of`]) and `units` its cost (the caller's `cost` times the rule's cost
/// factor). Nothing for a refusal or a zero-cost check: neither took anything.
pub fn journaled<'p>(
    p: &'p Plan<'_>,
    answers: &'p [Answer],
    decision: &Decision,
    cost: u64,
) -> impl Iterator<Item = (Option<&'p str>, &'p str, &'p Window, u64)> {
    let admitted = decision.allowed() && cost > 0;
    p.calls
        .iter()
        .zip(answers)
        .enumerate()
        .filter(move |(_, (_, ans))| admitted && matches!(ans, Answer::Failed { .. }))
        .flat_map(move |(i, (pc, _))| {
            let store = p.store_of(i);
            pc.call
                .items
                .iter()
                .map(move |item| (store, item, pc.call.cost))
        })
        .filter_map(|(store, item, units)| match &item.params {
            Params::FixedWindow { window, .. } if window.nominal() >= QUOTA_WINDOW => {
                Some((store, item.key.as_str(), window, units))
            }
            _ => None,
        })
}

#[cfg(test)]
mod tests;
