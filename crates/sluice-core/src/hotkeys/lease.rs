//! Token leasing: a batch of units taken from the shared count in one store call and spent
//! by the daemon itself.
//!
//! A lease call is the ordinary atomic check with cost = the batch, so units leave the shared
//! count before they are spent and leasing never admits more than the limit in total. What it
//! costs is stranded units: leased and not yet spent, unavailable to other daemons. A lease
//! therefore lives at most [`MAX_AGE`] (and never past the window it was taken in), and what
//! is left goes back to the store ([`GiveBack`]) when the key has been quiet for [`QUIET`],
//! when the lease ends, on a rule change and at shutdown.
//!
//! A refused lease call blocks the key on this daemon until the batch's retry time (at most
//! [`MAX_AGE`], and never past the end of a window rule's window): a key over its limit then costs one call per batch time, not one per
//! request. That shifts admissions by up to one batch's time, it never adds any: the units
//! refused meanwhile are the ones the next batch takes. A bucket's grant also says what the
//! bucket still holds, so a daemon that has spent its batch waits until the next batch can
//! be there ([`Lease`]'s `refill_at`) instead of asking only to be refused: one call per
//! batch, not two. A window rule refused a batch while
//! it still holds enough for the request leases what it holds instead ([`Refill::Smaller`]),
//! so the end of a window strands nothing.

use super::deny::{Shape, aged, hash, refused_for, window_end};
use crate::Params;
use crate::algo::Kind;
use crate::batch::{Call, CallResult, GiveBack};
use crate::hash::{Keyed, KeyedMap};
use crate::time::{MILLI, Micros, SECOND};

/// The longest a lease's units are spent before what is left goes back.
pub const MAX_AGE: Micros = SECOND;
/// A lease unused this long goes back.
pub const QUIET: Micros = 250 * MILLI;
/// How often a shell should run [`super::Layer::sweep`].
pub const SWEEP: Micros = 100 * MILLI;
/// A lease call with no answer after this long (its task was cancelled) no longer holds the
/// key's other requests back.
pub const STALLED: Micros = SECOND;

/// The key a lease is filed under: the call's store keys.
pub fn fingerprint(call: &Call) -> u64 {
    hash(call)
}

#[derive(Debug)]
struct Lease {
    shape: Shape,
    units: u64,
    taken_at: Micros,
    expires: Micros,
    last_used: Micros,
    refill_since: Option<Micros>,
    blocked_until: Micros,
    last: Option<CallResult>,
    answered_at: Micros,
    /// A bucket's next batch cannot be there before this (what the last grant left, refilled
    /// at the rule's rate): asking sooner would only be refused.
    refill_at: Micros,
    /// Lease calls refused in a row.
    refusals: u32,
}

impl Lease {
    fn new(call: &Call) -> Lease {
        Lease {
            shape: Shape::of(call),
            units: 0,
            taken_at: call.now,
            expires: call.now,
            last_used: call.now,
            refill_since: None,
            blocked_until: 0,
            last: None,
            answered_at: call.now,
            refill_at: 0,
            refusals: 0,
        }
    }

    fn matches(&self, call: &Call) -> bool {
        self.shape.matches(call)
    }

    /// What is left, as give-backs (one per store key), and the units in them.
    fn give_backs(&mut self, now: Micros, out: &mut Vec<GiveBack>) -> (u64, u64) {
        let units = std::mem::take(&mut self.units);
        if units == 0 {
            return (0, 0);
        }
        // A window rule's units expire with the window they were taken in.
        if now >= self.expires && self.shape.0.iter().all(|(_, p, _)| windowed(p)) {
            return (0, units);
        }
        for (key, params, _) in &self.shape.0 {
            out.push(give_back(key, params, units, self.taken_at, now));
        }
        (units, 0)
    }
}

/// Where `units` taken from `key` under `params` go back. A fair share's go to the parent,
/// as a plain token bucket (its stored form): every lease took them from the parent, while
/// the tenant's bucket was charged only on the guaranteed path, and which path a grant took
/// is the store's to know. The tenant may lose up to the unspent units of its guarantee until
/// its bucket refills; it never gains any.
fn give_back(key: &str, params: &Params, units: u64, taken_at: Micros, now: Micros) -> GiveBack {
    let (key, params) = match params {
        Params::FairShare(fs) => (
            crate::keys::fair_share_parent(key),
            Params::TokenBucket {
                rate: fs.rate,
                burst: fs.burst,
            },
        ),
        p => (key, p.clone()),
    };
    GiveBack {
        key: key.to_string(),
        params,
        units,
        taken_at,
        now,
    }
}

fn windowed(p: &Params) -> bool {
    matches!(p.kind(), Kind::FixedWindow | Kind::SlidingWindow)
}

/// When units leased at `now` must be spent by: [`MAX_AGE`] on, and never past the end of
/// the window they count in (spent in the next one, they would count nowhere).
fn expiry(call: &Call) -> Micros {
    let now = call.now;
    call.items
        .iter()
        .map(|i| match &i.params {
            Params::FixedWindow { window, .. } => window.bounds(now).1,
            Params::SlidingWindow { window, .. } => now - now % window + window,
            _ => now + MAX_AGE,
        })
        .fold(now + MAX_AGE, Micros::min)
}

/// What a request finds in its key's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spend {
    /// Served from leased units.
    Served(CallResult),
    /// Refused: the last lease call was refused and its retry time has not come.
    Blocked(CallResult),
    /// Another request's lease call is in flight.
    InFlight,
    /// No units: send a lease call.
    Refill,
}

/// What a lease call's answer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refill {
    /// Units leased; the answer to the request that asked.
    Granted(CallResult),
    /// Refused; the key is blocked until the retry time.
    Refused(CallResult),
    /// Refused, but every refusing rule is a window that still holds this many units, at
    /// least the request's cost: lease those instead.
    Smaller(u64),
}

/// The leases of one daemon (or one shard of it).
#[derive(Debug)]
pub struct Leases {
    map: KeyedMap<u64, Lease>,
    capacity: usize,
    retired: Vec<GiveBack>,
    retired_units: u64,
}

impl Leases {
    /// Room for `capacity` leases, the map keyed by `seed`.
    pub fn new(capacity: usize, seed: u64) -> Leases {
        Leases {
            map: KeyedMap::with_hasher(Keyed::new(seed)),
            capacity: capacity.max(1),
            retired: Vec::new(),
            retired_units: 0,
        }
    }

    /// Leases held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Spends `call.cost` from the key's lease, if it can; `waited`: the request waited
    /// behind the key's lease call (see [`super::Layer::route_after_wait`]).
    pub fn spend(&mut self, h: u64, call: &Call, waited: bool) -> Spend {
        let now = call.now;
        let Some(l) = self.map.get_mut(&h).filter(|l| l.matches(call)) else {
            return Spend::Refill;
        };
        if l.units >= call.cost
            && now < l.expires
            && let Some(last) = &l.last
        {
            l.units -= call.cost;
            l.last_used = now;
            return Spend::Served(served(last, l.units));
        }
        if now < l.blocked_until
            && let Some(last) = &l.last
        {
            l.last_used = now;
            return Spend::Blocked(aged(last, now.saturating_sub(l.answered_at)));
        }
        if !waited
            && now < l.refill_at
            && let Some(last) = &l.last
        {
            // Spent, and the bucket cannot hold a batch yet: refused until it can.
            l.last_used = now;
            return Spend::Blocked(not_yet(call, last, l.refill_at - now));
        }
        match l.refill_since {
            Some(t) if now < t + STALLED => Spend::InFlight,
            _ => Spend::Refill,
        }
    }

    /// Marks the key's lease call in flight (making the lease if needed); `false` when there
    /// is no room for another lease.
    pub fn start_refill(&mut self, h: u64, call: &Call) -> bool {
        let now = call.now;
        let full = self.map.len() >= self.capacity;
        match self.map.get_mut(&h) {
            Some(l) if l.matches(call) => {
                l.refill_since = Some(now);
                true
            }
            Some(l) => {
                // Same hash, other keys or numbers (an override changed): the old lease goes
                // back and this call's takes its place.
                let (u, _) = l.give_backs(now, &mut self.retired);
                self.retired_units += u;
                let mut fresh = Lease::new(call);
                fresh.refill_since = Some(now);
                *l = fresh;
                true
            }
            None if full => false,
            None => {
                let mut l = Lease::new(call);
                l.refill_since = Some(now);
                self.map.insert(h, l);
                true
            }
        }
    }

    /// The answer to a lease call of `batch` units for `call`.
    pub fn refilled(&mut self, h: u64, call: &Call, batch: u64, result: CallResult) -> Refill {
        let now = call.now;
        let Some(l) = self.map.get_mut(&h).filter(|l| l.matches(call)) else {
            // The lease was retired while its call ran (a rule change): the request keeps its
            // answer, and the units beyond its cost go straight back.
            if result.allowed && batch > call.cost {
                for it in &call.items {
                    let units = batch - call.cost;
                    self.retired
                        .push(give_back(&it.key, &it.params, units, now, now));
                }
                self.retired_units += batch - call.cost;
            }
            return if result.allowed {
                Refill::Granted(result)
            } else {
                Refill::Refused(result)
            };
        };
        l.refill_since = None;
        l.last_used = now;
        if result.allowed {
            if now >= l.expires {
                // Leftovers of a lease past its end go back; the new batch starts afresh.
                let (u, _) = l.give_backs(now, &mut self.retired);
                self.retired_units += u;
            }
            l.units += batch - call.cost;
            l.taken_at = now;
            l.expires = expiry(call);
            l.blocked_until = 0;
            l.refill_at = now + refill_wait(call, &result, batch);
            l.refusals = 0;
            let answer = served(&result, l.units);
            l.last = Some(result);
            l.answered_at = now;
            return Refill::Granted(answer);
        }
        let refusing = || {
            call.items
                .iter()
                .zip(&result.outcomes)
                .filter(|(i, o)| i.enforce && !o.allowed)
        };
        if refusing().all(|(i, _)| windowed(&i.params)) {
            let held = call
                .items
                .iter()
                .zip(&result.outcomes)
                .filter(|(i, _)| i.enforce)
                .map(|(_, o)| o.remaining)
                .min()
                .unwrap_or(0);
            if held >= call.cost && held < batch {
                l.refill_since = Some(now);
                return Refill::Smaller(held);
            }
        }
        // Daemons competing for one bucket are refused in turn: each refusal in a row doubles
        // the wait (up to 64×), never past the time the bucket takes to fill, so the units
        // still find a taker before the bucket overflows.
        l.refusals = l.refusals.saturating_add(1);
        let backoff = 1u64 << (l.refusals - 1).min(6);
        let fill = call
            .items
            .iter()
            .filter(|i| i.enforce && !windowed(&i.params))
            .map(|i| i.params.window())
            .min()
            .unwrap_or(MAX_AGE);
        let wait = refused_for(call, &result)
            .saturating_mul(backoff)
            .min(fill.max(1))
            .min(MAX_AGE)
            // The refusal repeated meanwhile carries this window's counts (see the deny
            // cache): a block never outlives the window.
            .min(window_end(call, &result));
        l.blocked_until = now + wait;
        // Units left (fewer than this request needs) stay for smaller ones.
        l.last = Some(result.clone());
        l.answered_at = now;
        Refill::Refused(result)
    }

    /// A lease call failed: other requests may send theirs.
    pub fn refill_failed(&mut self, h: u64, call: &Call) {
        if let Some(l) = self.map.get_mut(&h).filter(|l| l.matches(call)) {
            l.refill_since = None;
        }
    }

    /// Retires every lease (a rule change): what is left goes back with the next sweep.
    pub fn retire_all(&mut self, now: Micros) {
        for (_, mut l) in self.map.drain() {
            let (u, _) = l.give_backs(now, &mut self.retired);
            self.retired_units += u;
        }
    }

    /// The give-backs due at `now`, the units in them and the units that expired unspent.
    pub fn sweep(&mut self, now: Micros) -> (Vec<GiveBack>, u64, u64) {
        let mut out = std::mem::take(&mut self.retired);
        let mut returned = std::mem::take(&mut self.retired_units);
        let mut expired = 0;
        self.map.retain(|_, l| {
            if l.refill_since.is_some_and(|t| now >= t + STALLED) {
                l.refill_since = None;
            }
            if l.units > 0 && (now >= l.expires || now >= l.last_used + QUIET) {
                let (u, e) = l.give_backs(now, &mut out);
                returned += u;
                expired += e;
            }
            l.units > 0
                || l.refill_since.is_some()
                || now < l.blocked_until
                || now < l.last_used + QUIET
        });
        (out, returned, expired)
    }

    /// Every lease's give-back (shutdown).
    pub fn drain(&mut self, now: Micros) -> (Vec<GiveBack>, u64, u64) {
        self.retire_all(now);
        let out = std::mem::take(&mut self.retired);
        (out, std::mem::take(&mut self.retired_units), 0)
    }
}

/// How long after a grant a bucket can hold another batch: the longest, over the call's
/// buckets, of the time its rate takes to refill what the grant left short of a batch. 0 for
/// windows (a window that holds less than a batch leases what it holds).
fn refill_wait(call: &Call, result: &CallResult, batch: u64) -> Micros {
    call.items
        .iter()
        .zip(&result.outcomes)
        .filter(|(i, _)| i.enforce)
        .map(|(i, o)| match i.params {
            Params::TokenBucket { rate, .. } | Params::Gcra { rate, .. } => {
                rate.time_for(batch.saturating_sub(o.remaining))
            }
            // What a tenant can take grows no faster than the parent refills.
            Params::FairShare(ref fs) => fs.rate.time_for(batch.saturating_sub(o.remaining)),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
        .min(MAX_AGE)
}

/// A refusal made from the last grant: nothing left here for the enforced rules, retry in
/// `wait` (shadow rules keep what the grant said: they never refuse).
fn not_yet(call: &Call, last: &CallResult, wait: Micros) -> CallResult {
    let mut r = last.clone();
    r.allowed = false;
    for (i, o) in call.items.iter().zip(&mut r.outcomes) {
        if i.enforce {
            o.allowed = false;
            o.remaining = 0;
            o.retry_after = wait.max(1);
        }
    }
    r
}

/// The answer to a request served from a lease: the last store answer, allowed, with the
/// units this daemon still holds added to what it reports left.
pub(super) fn served(last: &CallResult, units: u64) -> CallResult {
    let mut r = last.clone();
    r.allowed = true;
    for o in &mut r.outcomes {
        o.allowed = true;
        o.retry_after = 0;
        o.remaining = o.remaining.saturating_add(units).min(o.limit);
    }
    r
}
