//! The sync gate and the tiered limiter: a key counted on the daemon and added to the shared
//! count once per interval, instead of one store call per request.
//!
//! Both start from a store answer (the key's first request is an ordinary call) and keep what
//! it said the shared count still holds, the *budget*. Units admitted here since are
//! *pending*; every `sync_interval` one call per key adds them to the shared count (the
//! ordinary check at cost = pending, every rule charged even when it refuses: those units
//! were admitted already) and its answer is the new budget. A failed sync keeps its units
//! pending for the next one.
//!
//! - **Sync gate** (`sync_interval` alone): every request is decided here, admitted while
//!   pending + cost fits the budget and refused otherwise until the next sync. Every daemon
//!   spends the same budget, so a key over its limit is over-admitted by up to one interval
//!   of traffic per daemon beyond the first; docs/hot-keys.md has the figure.
//! - **Tiered** (`local_share: true`): a request is admitted here only when it also fits this
//!   daemon's *share*, the rule's numbers ÷ the daemons in the region as the membership
//!   reports them now ([`super::Layer::set_daemons`]), counted by the rule's own algorithm.
//!   Past the share (or the budget) it goes to the store, which stays the authority: a daemon
//!   that gets more than its share of a key's traffic still gets the whole limit, only with a
//!   call per request beyond the share.
//!
//! A gate whose last answer is [`STALE_INTERVALS`] intervals old (the store has not answered a
//! sync since) stops deciding: requests go to the store, where the rule's `on_store_failure`
//! applies when it is down. Admitted answers report the pending units in `usage`, so global
//! rules' figures reach the delta shipper before the sync does.

use super::deny::{Shape, aged, window_end};
use crate::Params;
use crate::algo::{Kind, State};
use crate::batch::{self, Call, CallResult, Write};
use crate::hash::{Keyed, KeyedMap};
use crate::time::{MILLI, Micros, SECOND};

/// The shortest `sync_interval`: shells sync on their sweep timer ([`super::lease::SWEEP`]).
pub const MIN_INTERVAL: Micros = 100 * MILLI;
/// The longest `sync_interval`: past a minute the shared count is history, not a limit.
pub const MAX_INTERVAL: Micros = 60 * SECOND;
/// The interval of `local_share` without `sync_interval`.
pub const SHARE_INTERVAL: Micros = 100 * MILLI;
/// Intervals without a store answer after which a gate stops deciding.
pub const STALE_INTERVALS: Micros = 3;
/// A sync call unanswered this long (its task was cancelled) is taken as failed.
const STALLED: Micros = SECOND;

/// A call's gate settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallGate {
    /// How often pending units go to the store.
    pub interval: Micros,
    /// Tiered: admit here only within this daemon's share, ask the store past it.
    pub share: bool,
}

/// One sync call: pending units of one key, added to its shared count.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncCall {
    /// The call to send (cost = the pending units, every rule charged).
    pub call: Call,
    key: u64,
    /// The units of a retired gate (a rule change, shutdown), not its key's live sync.
    retired: bool,
}

#[derive(Debug)]
struct Gate {
    shape: Shape,
    /// The last request's call (its items carry the latest remote figures): what syncs send.
    template: Call,
    interval: Micros,
    last: CallResult,
    answered_at: Micros,
    /// The first end of a window its last answer counts in.
    window_end_at: Micros,
    budget: u64,
    pending: u64,
    in_flight: u64,
    sync_since: Option<Micros>,
    next_sync: Micros,
    last_used: Micros,
    /// Tiered: the share's call (numbers ÷ daemons) and its states, per item.
    share: Option<Share>,
}

#[derive(Debug)]
struct Share {
    daemons: u64,
    call: Call,
    states: Vec<Option<State>>,
}

/// What a request of a gated key does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gated {
    /// Admitted here (counted pending).
    Admitted(CallResult),
    /// Refused here: the budget is spent until the next sync.
    Refused(CallResult),
    /// Ask the store (no fresh answer yet, or past the share).
    Store,
}

/// The gated keys of one daemon (or one shard of it).
#[derive(Debug)]
pub struct Gates {
    map: KeyedMap<u64, Gate>,
    capacity: usize,
    retired: Vec<SyncCall>,
    writes: Vec<Write>,
    lost: u64,
}

/// What the shared count holds after `result`, for the enforced rules: a refused call's
/// `remaining` is before its charge (a refused sync charges anyway), so it holds nothing.
fn budget(call: &Call, result: &CallResult) -> u64 {
    if !result.allowed {
        return 0;
    }
    call.items
        .iter()
        .zip(&result.outcomes)
        .filter(|(i, _)| i.enforce)
        .map(|(_, o)| o.remaining)
        .min()
        .unwrap_or(u64::MAX)
}

/// The units of a refused sync that its buckets could not take: a charged refusal drains a
/// bucket to empty at most, so past what it held the units are not counted. 0 when any rule
/// is a window (it counts past its limit; charging it again would count them twice).
fn unpaid(call: &Call, result: &CallResult) -> u64 {
    if result.allowed
        || call
            .items
            .iter()
            .any(|i| !matches!(i.params.kind(), Kind::TokenBucket | Kind::Gcra))
    {
        return 0;
    }
    call.items
        .iter()
        .zip(&result.outcomes)
        .filter(|(i, o)| i.enforce && !o.allowed)
        .map(|(_, o)| call.cost.saturating_sub(o.remaining))
        .max()
        .unwrap_or(0)
}

/// A rule's numbers ÷ `daemons` (rounded down, so the shares add up to at most the rule), or
/// `None` when a share would hold nothing.
pub fn share_of(params: &Params, daemons: u64) -> Option<Params> {
    let n = daemons.max(1);
    let part = |v: u64| Some(v / n).filter(|&v| v > 0);
    Some(match *params {
        Params::TokenBucket { rate, burst } => Params::TokenBucket {
            rate: rate.with_tokens(|t| t / n)?,
            burst: part(burst)?,
        },
        Params::Gcra { rate, burst } => Params::Gcra {
            rate: rate.with_tokens(|t| t / n)?,
            burst: part(burst)?,
        },
        Params::FixedWindow { limit, ref window } => Params::FixedWindow {
            limit: part(limit)?,
            window: window.clone(),
        },
        Params::SlidingWindow {
            limit,
            window,
            start,
        } => Params::SlidingWindow {
            limit: part(limit)?,
            window,
            start,
        },
        Params::SlidingLog { limit, window } => Params::SlidingLog {
            limit: part(limit)?,
            window,
        },
        // A share of a shaping queue would let each daemon's share out at its own spacing.
        Params::Concurrency { .. } | Params::LeakyQueue { .. } => return None,
        // Never gated (validation refuses it): a daemon's share of a parent would not know
        // the other daemons' tenants.
        Params::FairShare(_) => return None,
    })
}

/// The longest interval a bucket syncs at: half the time it takes to fill. Admissions are
/// charged when their sync goes out; a bucket left uncharged for longer sits full and loses
/// its refill, and the key falls short of its rate (one daemon at 1 s on a 500/s bucket of
/// 500: half the rate). `None` for windows, which count whatever the delay.
pub fn longest_interval(params: &Params) -> Option<Micros> {
    matches!(params.kind(), Kind::TokenBucket | Kind::Gcra).then(|| params.window() / 2)
}

/// The interval a call of `params` syncs at when its rule asks for `interval`: at most
/// [`longest_interval`] (an override's bigger rate shortens it), at least [`MIN_INTERVAL`].
pub fn effective_interval(params: &Params, interval: Micros) -> Micros {
    longest_interval(params).map_or(interval, |l| interval.min(l).max(MIN_INTERVAL))
}

/// Why a rule's algorithm cannot be gated, or `None` when it can.
pub fn gate_refusal(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Concurrency => Some(
            "a concurrency slot is held by one request until it is released; a count added \
             later holds no slot",
        ),
        Kind::LeakyQueue => Some(
            "a shaping queue gives each request its departure when it is decided; a count \
             added later would let the daemon's requests out together",
        ),
        _ => None,
    }
}

impl Share {
    /// Takes `cost` from the share at `now` if it fits (`force`: whether or not), saying
    /// whether it fitted.
    fn take(&mut self, now: Micros, cost: u64, force: bool, writes: &mut Vec<Write>) -> bool {
        self.call.now = now;
        self.call.cost = cost;
        for it in &mut self.call.items {
            it.charge_rejected = force;
        }
        let r = batch::apply_into(&self.call, &self.states, writes);
        if r.allowed || force {
            for (st, w) in self.states.iter_mut().zip(writes.drain(..)) {
                if let Write::Put(v, _) = w {
                    *st = Some(v);
                }
            }
        }
        r.allowed
    }

    fn new(call: &Call, daemons: u64) -> Option<Share> {
        let mut c = call.clone();
        for it in &mut c.items {
            it.params = share_of(&it.params, daemons)?;
            // The share is this daemon's alone: no other region's figure is in it.
            it.remote = Default::default();
            it.charge_rejected = false;
        }
        Some(Share {
            daemons,
            states: vec![None; c.items.len()],
            call: c,
        })
    }
}

impl Gates {
    /// Room for `capacity` gated keys, the map keyed by `seed`.
    pub fn new(capacity: usize, seed: u64) -> Gates {
        Gates {
            map: KeyedMap::with_hasher(Keyed::new(seed)),
            capacity: capacity.max(1),
            retired: Vec::new(),
            writes: Vec::new(),
            lost: 0,
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Units admitted here that never reached the shared count: their sync failed while
    /// [`Gates::new`]'s capacity of retired calls was already waiting to be sent again.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Decides `call` (key hash `h`) here if its gate can, `daemons` the region's now.
    pub fn route(&mut self, h: u64, call: &Call, g: CallGate, daemons: u64) -> Gated {
        let now = call.now;
        let Some(e) = self.map.get_mut(&h).filter(|e| e.shape.matches(call)) else {
            return Gated::Store;
        };
        e.last_used = now;
        for (t, i) in e.template.items.iter_mut().zip(&call.items) {
            t.remote = i.remote;
        }
        e.interval = g.interval;
        // Stale, or the window its counts are from has ended (shipped on, they would pass
        // for the new window's). A request stamped before the last answer arrived (it
        // waited for the lock) is decided on it: the answer is the newer news.
        if now >= e.answered_at + STALE_INTERVALS * g.interval || now >= e.window_end_at {
            return Gated::Store;
        }
        let local = e.pending + e.in_flight;
        let fits = local.saturating_add(call.cost) <= e.budget;
        if g.share {
            if !fits {
                return Gated::Store;
            }
            e.follow(call, daemons);
            let Some(s) = &mut e.share else {
                return Gated::Store;
            };
            if !s.take(now, call.cost, false, &mut self.writes) {
                return Gated::Store;
            }
        } else if !fits {
            let wait = (e.answered_at + e.interval).saturating_sub(now).max(1);
            let last = aged(&e.last, now.saturating_sub(e.answered_at));
            return Gated::Refused(refused(call, &last, wait, local));
        }
        e.pending += call.cost;
        Gated::Admitted(admitted(&e.last, local + call.cost))
    }

    /// Takes a store answer to an ordinary call of a gated key: the new budget (and the gate
    /// itself, for a key's first answer). An admission the store made counts in the local
    /// share too: the share is this daemon's part of the key's admissions, however made.
    /// `false`: no room for another gate.
    pub fn answered(
        &mut self,
        h: u64,
        call: &Call,
        g: CallGate,
        daemons: u64,
        result: &CallResult,
    ) -> bool {
        let now = call.now;
        let full = self.map.len() >= self.capacity;
        let e = match self.map.get_mut(&h) {
            Some(e) if e.shape.matches(call) => {
                // Not answered by a sync: pending and in-flight units are not in it.
                e.refresh(call, result, now);
                e
            }
            Some(e) => {
                // Same hash, other numbers (a rule change, an override) or other keys. On the
                // same keys the new gate takes the pending units: they count against the
                // key's new budget at once and go with its syncs. Other keys' go to them.
                let carried = if e.shape.same_keys(call) {
                    std::mem::take(&mut e.pending)
                } else {
                    if let Some(s) = e.take_sync(now) {
                        self.retired.push(SyncCall {
                            call: s,
                            key: h,
                            retired: true,
                        });
                    }
                    0
                };
                *e = Gate::new(call, g, result);
                e.pending = carried;
                e
            }
            None if full => return false,
            None => self.map.entry(h).or_insert(Gate::new(call, g, result)),
        };
        if g.share && result.allowed {
            e.follow(call, daemons);
            if let Some(s) = &mut e.share {
                s.take(now, call.cost, true, &mut self.writes);
            }
        }
        true
    }

    /// The sync calls due at `now`, with those of retired gates; quiet gates are dropped.
    pub fn syncs(&mut self, now: Micros) -> Vec<SyncCall> {
        let mut out = std::mem::take(&mut self.retired);
        self.map.retain(|&key, e| {
            if e.sync_since.is_some_and(|t| now >= t + STALLED) {
                e.pending += std::mem::take(&mut e.in_flight);
                e.sync_since = None;
            }
            // Units of a window that is about to end go now, so they count in it.
            let ending = e.pending > 0 && now + super::lease::SWEEP >= e.window_end_at;
            if e.sync_since.is_none()
                && (now >= e.next_sync || ending)
                && (e.pending > 0 || e.last_used > e.answered_at)
            {
                let cost = e.pending;
                e.in_flight = std::mem::take(&mut e.pending);
                e.sync_since = Some(now);
                e.next_sync = now + e.interval;
                out.push(SyncCall {
                    call: sync_call(&e.template, now, cost),
                    key,
                    retired: false,
                });
            }
            e.pending > 0
                || e.sync_since.is_some()
                || now < e.last_used + (2 * e.interval).max(super::lease::QUIET)
        });
        out
    }

    /// The store's answer to a sync call (`None`: it failed, its units stay pending). Returns
    /// the units its buckets could not take, sent again with the next sync.
    pub fn synced(&mut self, s: &SyncCall, result: Option<CallResult>, now: Micros) -> u64 {
        let live = self
            .map
            .get_mut(&s.key)
            .filter(|e| !s.retired && e.shape.matches(&s.call) && e.sync_since.is_some());
        match (live, result) {
            (Some(e), Some(r)) => {
                e.in_flight = 0;
                e.sync_since = None;
                // What a bucket could not take goes with the next sync: the units were
                // admitted, and a bucket that only drains to empty would forget them.
                let carried = unpaid(&s.call, &r);
                e.pending += carried;
                e.refresh(&s.call, &r, now);
                return carried;
            }
            (Some(e), None) => {
                e.pending += std::mem::take(&mut e.in_flight);
                e.sync_since = None;
            }
            (None, Some(_)) => {}
            (None, None) => {
                // A retired gate's units (or a gate retired while its sync ran): to the key's
                // gate now if it has the same numbers, else sent again with the next sweep.
                let units = s.call.cost;
                if let Some(e) = self
                    .map
                    .get_mut(&s.key)
                    .filter(|e| e.shape.matches(&s.call))
                {
                    e.pending += units;
                } else if self.retired.len() < self.capacity {
                    self.retired.push(SyncCall {
                        retired: true,
                        ..s.clone()
                    });
                } else {
                    self.lost += units;
                }
            }
        }
        0
    }

    /// Retires every gate (shutdown): pending units go out with the next [`Gates::syncs`].
    pub fn retire_all(&mut self, now: Micros) {
        for (key, mut e) in self.map.drain() {
            if let Some(c) = e.take_sync(now) {
                self.retired.push(SyncCall {
                    call: c,
                    key,
                    retired: true,
                });
            }
        }
    }
}

impl Gate {
    fn new(call: &Call, g: CallGate, result: &CallResult) -> Gate {
        let now = call.now;
        Gate {
            shape: Shape::of(call),
            template: call.clone(),
            interval: g.interval,
            last: result.clone(),
            answered_at: now,
            window_end_at: now.saturating_add(window_end(call, result)),
            budget: budget(call, result),
            pending: 0,
            in_flight: 0,
            sync_since: None,
            next_sync: now + g.interval,
            last_used: now,
            share: None,
        }
    }

    /// Keeps the share at the rule's numbers ÷ `daemons`: a new membership changes its
    /// numbers, what it counted stays.
    fn follow(&mut self, call: &Call, daemons: u64) {
        if self.share.as_ref().is_some_and(|s| s.daemons == daemons) {
            return;
        }
        let old = self.share.take().map(|s| s.states);
        self.share = Share::new(call, daemons);
        if let (Some(s), Some(old)) = (&mut self.share, old) {
            s.states = old;
        }
    }

    /// A store answer at `now` to `call` (ordinary or sync): the new budget.
    fn refresh(&mut self, call: &Call, result: &CallResult, now: Micros) {
        self.budget = budget(call, result);
        self.window_end_at = now.saturating_add(window_end(call, result));
        self.last = result.clone();
        self.answered_at = now;
    }

    /// The pending units as one last sync call (`None` when there are none).
    fn take_sync(&mut self, now: Micros) -> Option<Call> {
        let units = std::mem::take(&mut self.pending);
        (units > 0).then(|| sync_call(&self.template, now, units))
    }
}

/// The sync call of `units` pending units: the key's ordinary call at that cost, every rule
/// charged (the units were admitted; a refusal must not drop them), a peek when 0.
fn sync_call(template: &Call, now: Micros, units: u64) -> Call {
    let mut c = template.clone();
    c.now = now;
    c.cost = units;
    c.request_id = String::new();
    for it in &mut c.items {
        it.charge_rejected = true;
    }
    c
}

/// An answer admitted here: the last store answer with `local` more units spent from it.
fn admitted(last: &CallResult, local: u64) -> CallResult {
    let mut r = last.clone();
    r.allowed = true;
    for o in &mut r.outcomes {
        o.allowed = true;
        o.retry_after = 0;
        o.remaining = o.remaining.saturating_sub(local);
        o.usage = o.usage.saturating_add(local);
    }
    r
}

/// A refusal here: nothing left of the budget for the enforced rules until the next sync in
/// `wait` (shadow rules keep what the store said: they never refuse); `usage` still counts
/// the `local` units admitted here, as admitted answers do.
fn refused(call: &Call, last: &CallResult, wait: Micros, local: u64) -> CallResult {
    let mut r = last.clone();
    r.allowed = false;
    for (i, o) in call.items.iter().zip(&mut r.outcomes) {
        o.usage = o.usage.saturating_add(local);
        if i.enforce {
            o.allowed = false;
            o.remaining = 0;
            o.retry_after = o.retry_after.max(wait);
        }
    }
    r
}
