//! The hot-key layer: what a daemon answers itself, so a key far over its limit, or
//! legitimately huge, does not cost one store call per request.
//!
//! Redis CPU per check is what bounds a daemon (docs/benchmark.md), and one key can put all
//! of its traffic on one shard. Two tools live here, both sans-IO (time is an argument), one
//! [`Layer`] per daemon (the daemon shards it behind locks; the simulator keeps one per
//! simulated daemon):
//!
//! - the **deny cache** ([`deny`]): a refusal the store gave is repeated until its retry
//!   time, exactly: it never refuses what the store would have admitted;
//! - **token leasing** ([`lease`]): one store call takes a batch of units (the same atomic
//!   check, cost = batch) and the daemon spends them itself; what is left goes back to the
//!   store when the key goes quiet, on a rule change or at shutdown. With `lease: auto` a
//!   count-min sketch ([`detect`]) puts only keys above a rate on that path;
//! - the **sync gate** and the **tiered limiter** ([`gate`]): a key counted here and added to
//!   the shared count once per interval; tiered, only within this daemon's share of the
//!   numbers, the store deciding past it;
//! - **key splitting** ([`split`]): one identity counted under N sub-counts on N hash tags,
//!   one picked per request, so a key's store calls spread over the cluster's shards. It
//!   acts at planning ([`crate::decision::plan`]): a split rule's sub-count is a store call
//!   of its own, which the two tools above then treat like any other.
//!
//! [`route`](Layer::route) says, per planned store call, whether the daemon answers it
//! itself, sends it as planned, or sends a lease call; [`answered`](Layer::answered) takes
//! the store's answer back.
//!
//! # Layout
//!
//! - this file: the rule block ([`HotKeys`]), the per-call policy and [`Layer`];
//! - [`deny`]: the deny cache; [`lease`]: leases and give-backs; [`detect`]: the sketch;
//!   [`sample`]: sampling; [`gate`]: the sync gate and the local share; [`split`]:
//!   sub-counts, their shares and the pick; [`config`]: the block's parsing.

pub mod config;
pub mod deny;
pub mod detect;
#[cfg(test)]
mod fair_share_tests;
pub mod gate;
#[cfg(test)]
mod gate_tests;
pub mod lease;
pub mod sample;
pub mod split;
#[cfg(test)]
mod split_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod window_start_tests;

use crate::Params;
use crate::algo::Kind;
use crate::batch::{Call, CallResult, GiveBack};
use crate::decision::{Plan, PlannedCall};
use crate::time::{Micros, SECOND};
use deny::DenyCache;
use detect::Detector;
use gate::{CallGate, Gated, Gates, SyncCall};
use lease::{Leases, Refill};
use sample::{Pick, Samples};

/// How a rule leases units (`hot_keys.lease`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseMode {
    /// Every request asks the store (the default).
    #[default]
    Off,
    /// Only keys the detector finds hot lease, a batch of about 1% of the rule's rate.
    Auto,
    /// Every key leases batches of this many units.
    Batch(u64),
}

/// A rule's `hot_keys` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotKeys {
    /// Repeat a store refusal until its retry time (capped at [`deny::MAX_HOLD`]).
    pub deny_cache: bool,
    /// Token leasing.
    pub lease: LeaseMode,
    /// Sub-counts per identity (1: not split), at most [`split::MAX_SPLIT`].
    pub split: u32,
    /// Ask the store for 1 request in this many, at as many times its cost (1: every one).
    pub sample: u32,
    /// A refused sample blocks the key until its retry time.
    pub sample_block: bool,
    /// Count here and add to the shared count every this often ([`gate`]).
    pub sync_interval: Option<Micros>,
    /// Tiered: admit here only within this daemon's share of the numbers ([`gate`]).
    pub local_share: bool,
}

impl Default for HotKeys {
    fn default() -> HotKeys {
        HotKeys {
            deny_cache: true,
            lease: LeaseMode::Off,
            split: 1,
            sample: 1,
            sample_block: true,
            sync_interval: None,
            local_share: false,
        }
    }
}

/// Requests per second through one daemon above which `lease: auto` leases a key. Below it a
/// store call per request costs little, and every key stays exact.
pub const AUTO_HOT_RATE: u64 = 100;

/// Why a rule's algorithm cannot lease, or `None` when it can.
pub fn lease_refusal(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::TokenBucket | Kind::Gcra | Kind::FixedWindow | Kind::SlidingWindow => None,
        Kind::SlidingLog => Some(
            "a sliding log stamps each admitted unit with the time it was admitted; a leased \
             batch would stamp every unit at the time of the lease",
        ),
        Kind::Concurrency => Some(
            "a concurrency slot is held by one request until it is released; a batch of slots \
             cannot be spent by other requests",
        ),
        Kind::LeakyQueue => Some(
            "a shaping queue gives each request its own departure time; a leased batch would \
             let its units out at once, not one interval apart",
        ),
    }
}

/// The rule's rate in whole units per second (rounded down: 0 below one a second), for the
/// `auto` batch.
pub fn per_second(params: &Params) -> u64 {
    match params {
        Params::TokenBucket { rate, .. } | Params::Gcra { rate, .. } => rate.tokens_in(SECOND),
        Params::FairShare(fs) => fs.rate.tokens_in(SECOND),
        p => {
            let w = p.window().max(1);
            p.limit().saturating_mul(SECOND) / w
        }
    }
}

/// The batch `auto` leases for a rule: about 1% of its per-second rate, at least 1.
pub fn auto_batch(params: &Params) -> u64 {
    (per_second(params) / 100).max(1)
}

/// The largest batch a lease call for `params` could be granted: the rule's capacity, and for
/// a fair share the tenant's own burst, so a batch still fits its share while the parent is
/// busy (past it the tenant would get nothing until the parent had room to lend).
pub fn lease_capacity(params: &Params) -> u64 {
    match params {
        Params::FairShare(fs) => fs.child_burst.min(fs.burst),
        p => p.limit(),
    }
}

/// What the hot-key layer may do with one planned call, from its rules' blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallPolicy {
    /// The call's refusals may be cached: every enforced rule of it allows it, none charges
    /// refusals (a cached refusal would skip the charge) and none is a concurrency rule
    /// (a release frees slots before any retry time).
    pub deny_cache: bool,
    /// The call leases: every rule of it leases; the batch is the smallest of theirs.
    pub lease: Option<CallLease>,
    /// The call is sampled: every rule of it samples; 1 in the smallest of their N.
    pub sample: Option<CallSample>,
    /// The call is gated: every rule of it syncs (the shortest interval), none charges
    /// refusals; tiered when any asks for a local share.
    pub gate: Option<CallGate>,
}

/// A call's sampling settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSample {
    /// One request in this many asks the store.
    pub every: u64,
    /// A refused sample blocks the key until its retry time.
    pub block: bool,
}

/// A call's lease settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLease {
    /// Units per lease call.
    pub batch: u64,
    /// Only keys above [`AUTO_HOT_RATE`] lease.
    pub auto: bool,
}

impl CallPolicy {
    /// The policy of call `i` of a plan.
    pub fn of(plan: &Plan<'_>, i: usize) -> CallPolicy {
        let pc = &plan.calls[i];
        let mut deny = true;
        let mut lease: Option<CallLease> = None;
        let mut leases = true;
        let mut sample: Option<CallSample> = None;
        let mut samples = true;
        let mut gate: Option<CallGate> = None;
        let mut gates = true;
        for (item, &ri) in pc.call.items.iter().zip(&pc.rules) {
            let rule = plan.applied[ri].rule;
            let hk = &rule.hot_keys;
            let conc = item.params.kind() == Kind::Concurrency;
            // A queue refusing a caller that cannot wait (`algo::without_waiting`) still
            // admits those that can: its refusal is not theirs to repeat.
            let no_wait = matches!(
                item.params,
                crate::algo::Params::LeakyQueue { max_delay: 0, .. }
            );
            if item.enforce && (!hk.deny_cache || item.charge_rejected || conc || no_wait) {
                deny = false;
            }
            let this = match hk.lease {
                LeaseMode::Off => None,
                LeaseMode::Auto => Some(CallLease {
                    batch: auto_batch(&item.params),
                    auto: true,
                }),
                LeaseMode::Batch(n) => Some(CallLease {
                    batch: n,
                    auto: false,
                }),
            };
            // A batch above the rule's capacity could never be granted.
            let this = this.map(|t| CallLease {
                batch: t.batch.min(lease_capacity(&item.params)).max(1),
                ..t
            });
            match (this, lease) {
                (None, _) => leases = false,
                (Some(t), None) => lease = Some(t),
                (Some(t), Some(l)) => {
                    lease = Some(CallLease {
                        batch: l.batch.min(t.batch),
                        auto: l.auto || t.auto,
                    })
                }
            }
            if item.charge_rejected || conc {
                leases = false;
            }
            let synced = hk
                .sync_interval
                .or(hk.local_share.then_some(gate::SHARE_INTERVAL))
                .map(|iv| gate::effective_interval(&item.params, iv));
            match synced {
                Some(iv) if !conc && !item.charge_rejected => {
                    gate = Some(match gate {
                        None => CallGate {
                            interval: iv,
                            share: hk.local_share,
                        },
                        Some(g) => CallGate {
                            interval: g.interval.min(iv),
                            share: g.share || hk.local_share,
                        },
                    });
                }
                _ => gates = false,
            }
            if hk.sample <= 1 || conc {
                samples = false;
            } else {
                let this = CallSample {
                    every: u64::from(hk.sample),
                    block: hk.sample_block,
                };
                sample = Some(match sample {
                    None => this,
                    Some(s) => CallSample {
                        every: s.every.min(this.every),
                        block: s.block || this.block,
                    },
                });
            }
        }
        CallPolicy {
            deny_cache: deny,
            lease: if leases { lease } else { None },
            sample: if samples { sample } else { None },
            gate: if gates { gate } else { None },
        }
    }
}

/// Where a planned call goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Answered by the daemon itself (a cached refusal, or units spent from a lease).
    Local(CallResult),
    /// Send the call as planned.
    Store,
    /// Send the call with this cost instead: a lease of `batch` units, the request's cost
    /// included. Report the answer with [`Layer::answered`] and [`Sent::Lease`].
    Lease {
        /// Units asked for.
        batch: u64,
    },
    /// A lease call for this key is already in flight: wait for it, then route again.
    Wait,
    /// This request is its key's sample: send it with this cost (N × its own). Report the
    /// answer with [`Sent::Sample`].
    Sample {
        /// Units asked for.
        cost: u64,
    },
}

/// What was sent for a call, reported back with its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The call as planned.
    Plain,
    /// A lease call of `batch` units.
    Lease {
        /// Units asked for.
        batch: u64,
    },
    /// A sample at `cost`.
    Sample {
        /// Units asked for.
        cost: u64,
    },
}

impl Sent {
    /// What was sent for `call`: the call itself or the call at another cost.
    pub fn call<'c>(&self, call: &'c Call) -> std::borrow::Cow<'c, Call> {
        match *self {
            Sent::Plain => std::borrow::Cow::Borrowed(call),
            Sent::Lease { batch: cost } | Sent::Sample { cost } => {
                std::borrow::Cow::Owned(with_cost(call, cost))
            }
        }
    }
}

impl From<&Route> for Option<Sent> {
    fn from(r: &Route) -> Option<Sent> {
        match *r {
            Route::Store => Some(Sent::Plain),
            Route::Lease { batch } => Some(Sent::Lease { batch }),
            Route::Sample { cost } => Some(Sent::Sample { cost }),
            Route::Local(_) | Route::Wait => None,
        }
    }
}

/// After a store answer: the request's answer, or one more lease call to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// The answer to the request.
    Answer(CallResult),
    /// Send the call again with this cost (a smaller lease: what a window still holds).
    Again {
        /// Units asked for.
        batch: u64,
    },
}

/// Counters of one layer, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests refused from the deny cache.
    pub deny_hits: u64,
    /// Refusals remembered.
    pub deny_inserts: u64,
    /// Refusals not remembered because the cache was full.
    pub deny_full: u64,
    /// Requests served from leased units.
    pub lease_spent: u64,
    /// Requests refused while a refused lease call waits for its retry time.
    pub lease_blocked: u64,
    /// Lease calls the store answered.
    pub lease_calls: u64,
    /// Units leased.
    pub leased_units: u64,
    /// Units given back (handed to the store; the store may find them expired).
    pub returned_units: u64,
    /// Units of leases dropped without a give-back (the window they were taken in ended).
    pub expired_units: u64,
    /// Samples sent to the store.
    pub samples: u64,
    /// Requests answered like the last sample, without the store.
    pub sample_skipped: u64,
    /// Requests refused by a refused sample's block.
    pub sample_blocked: u64,
    /// Requests admitted by a gate (counted here, synced later).
    pub gate_admitted: u64,
    /// Requests refused by a sync gate whose budget is spent.
    pub gate_refused: u64,
    /// Requests of a gated key sent to the store (first call, past the share, stale gate).
    pub gate_to_store: u64,
    /// Sync calls the store answered.
    pub sync_calls: u64,
    /// Units added to shared counts by answered sync calls (what they took).
    pub synced_units: u64,
    /// Units of answered syncs a bucket could not take, sent again with the next sync.
    pub sync_carried: u64,
    /// Sync calls that failed (their units stay pending).
    pub sync_failures: u64,
}

/// Sums of counters: the daemon adds its shards' layers, the simulator its daemons'.
impl std::ops::AddAssign<&Stats> for Stats {
    fn add_assign(&mut self, o: &Stats) {
        self.deny_hits += o.deny_hits;
        self.deny_inserts += o.deny_inserts;
        self.deny_full += o.deny_full;
        self.lease_spent += o.lease_spent;
        self.lease_blocked += o.lease_blocked;
        self.lease_calls += o.lease_calls;
        self.leased_units += o.leased_units;
        self.returned_units += o.returned_units;
        self.expired_units += o.expired_units;
        self.samples += o.samples;
        self.sample_skipped += o.sample_skipped;
        self.sample_blocked += o.sample_blocked;
        self.gate_admitted += o.gate_admitted;
        self.gate_refused += o.gate_refused;
        self.gate_to_store += o.gate_to_store;
        self.sync_calls += o.sync_calls;
        self.synced_units += o.synced_units;
        self.sync_carried += o.sync_carried;
        self.sync_failures += o.sync_failures;
    }
}

/// One daemon's hot-key state (or one shard of it).
#[derive(Debug)]
pub struct Layer {
    version: u64,
    deny: DenyCache,
    leases: Leases,
    samples: Samples,
    gates: Gates,
    detector: Detector,
    daemons: u64,
    stats: Stats,
}

impl Layer {
    /// A layer holding at most `deny_entries` cached refusals and `leases` leases, its maps
    /// keyed by seed 0: the simulator's and tests' (runs replay byte for byte).
    pub fn new(deny_entries: usize, leases: usize) -> Layer {
        Layer::with_seed(deny_entries, leases, 0)
    }

    /// [`Layer::new`] with maps keyed by `seed`: the daemon draws it from the OS, so clients
    /// cannot choose keys that pile up in one place of a map (the core draws nothing itself).
    pub fn with_seed(deny_entries: usize, leases: usize, seed: u64) -> Layer {
        Layer {
            version: 0,
            deny: DenyCache::new(deny_entries, seed),
            leases: Leases::new(leases, seed ^ 0x9e37_79b9_7f4a_7c15),
            samples: Samples::new(leases, seed ^ 0x2545_f491_4f6c_dd1d),
            gates: Gates::new(leases, seed ^ 0x5851_f42d_4c95_7f2d),
            detector: Detector::new(),
            daemons: 1,
            stats: Stats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Refusals held now (after expiry).
    pub fn deny_entries(&self) -> usize {
        self.deny.len()
    }

    /// Leases held now.
    pub fn lease_entries(&self) -> usize {
        self.leases.len()
    }

    /// Gated keys held now.
    pub fn gate_entries(&self) -> usize {
        self.gates.len()
    }

    /// Units admitted by gates that never reached the shared count (see [`Gates::lost`]).
    pub fn gate_lost(&self) -> u64 {
        self.gates.lost()
    }

    /// The daemons in this daemon's region as its membership reports them now (itself
    /// included): a local share is the rule's numbers ÷ this. The shell sets it whenever the
    /// membership changes; a daemon without one is alone (1).
    pub fn set_daemons(&mut self, daemons: u64) {
        self.daemons = daemons.max(1);
    }

    /// A new rule version drops every cached refusal and retires every lease: the numbers
    /// they were taken under may have changed (gates compare their numbers per call).
    fn sync_version(&mut self, version: u64, now: Micros) {
        if version != self.version {
            self.version = version;
            self.deny.clear();
            self.samples.clear();
            self.leases.retire_all(now);
            // Gates stay: a gate answers only calls of its own keys and numbers, and its
            // pending units must keep counting against the key under the new version.
        }
    }

    /// Where planned call `pc` goes, under `policy`, with rules of `version`.
    pub fn route(&mut self, pc: &PlannedCall, policy: CallPolicy, version: u64) -> Route {
        self.route_inner(pc, policy, version, false)
    }

    /// [`Layer::route`] for a request that waited behind its key's lease call
    /// ([`Route::Wait`]). Its `now` is when it arrived, before that call's answer: it is
    /// never refused for a next batch "not there yet" by that clock (under a slow store a
    /// whole queue of waiters would be), it asks for the next batch instead.
    pub fn route_after_wait(
        &mut self,
        pc: &PlannedCall,
        policy: CallPolicy,
        version: u64,
    ) -> Route {
        self.route_inner(pc, policy, version, true)
    }

    fn route_inner(
        &mut self,
        pc: &PlannedCall,
        policy: CallPolicy,
        version: u64,
        waited: bool,
    ) -> Route {
        let call = &pc.call;
        let now = call.now;
        self.sync_version(version, now);
        if call.cost == 0 {
            return Route::Store;
        }
        if let Some(g) = policy.gate {
            let h = lease::fingerprint(call);
            match self.gates.route(h, call, g, self.daemons) {
                Gated::Admitted(r) => {
                    self.stats.gate_admitted += 1;
                    return Route::Local(r);
                }
                Gated::Refused(r) => {
                    self.stats.gate_refused += 1;
                    return Route::Local(r);
                }
                Gated::Store => self.stats.gate_to_store += 1,
            }
        }
        if let Some(l) = policy.lease
            && call.cost < l.batch
        {
            let h = lease::fingerprint(call);
            let hot = !l.auto || self.detector.observe(h, now) >= AUTO_HOT_RATE.max(l.batch);
            if hot {
                match self.leases.spend(h, call, waited) {
                    lease::Spend::Served(r) => {
                        self.stats.lease_spent += 1;
                        return Route::Local(r);
                    }
                    lease::Spend::Blocked(r) => {
                        self.stats.lease_blocked += 1;
                        return Route::Local(r);
                    }
                    lease::Spend::InFlight => return Route::Wait,
                    lease::Spend::Refill => {
                        if self.leases.start_refill(h, call) {
                            return Route::Lease { batch: l.batch };
                        }
                        // No room for another lease: ask as planned.
                    }
                }
            }
        }
        if let Some(sm) = policy.sample {
            let h = lease::fingerprint(call);
            return match self.samples.pick(h, call, sm.every, sm.block) {
                Pick::Local(r) => {
                    if r.allowed {
                        self.stats.sample_skipped += 1;
                    } else {
                        self.stats.sample_blocked += 1;
                    }
                    Route::Local(r)
                }
                Pick::Sample(cost) => {
                    self.stats.samples += 1;
                    Route::Sample { cost }
                }
            };
        }
        if policy.deny_cache
            && let Some(r) = self.deny.lookup(call)
        {
            self.stats.deny_hits += 1;
            return Route::Local(r);
        }
        Route::Store
    }

    /// Whether [`Layer::answered`] has anything to do with this answer: a shell may skip the
    /// lock (and the call) when not. An admitted plain call of an ungated key changes
    /// nothing here.
    pub fn wants(policy: CallPolicy, sent: Sent, result: &CallResult) -> bool {
        !matches!(sent, Sent::Plain) || !result.allowed || policy.gate.is_some()
    }

    /// Takes back the store's answer to what was sent for `pc`.
    pub fn answered(
        &mut self,
        pc: &PlannedCall,
        policy: CallPolicy,
        sent: Sent,
        result: CallResult,
    ) -> Next {
        let call = &pc.call;
        match sent {
            Sent::Plain => {
                if let Some(g) = policy.gate
                    && call.cost > 0
                {
                    let h = lease::fingerprint(call);
                    self.gates.answered(h, call, g, self.daemons, &result);
                }
                if !result.allowed && policy.deny_cache {
                    match self.deny.remember(call, &result) {
                        true => self.stats.deny_inserts += 1,
                        false => self.stats.deny_full += 1,
                    }
                }
                Next::Answer(result)
            }
            Sent::Sample { .. } => {
                let h = lease::fingerprint(call);
                let block = policy.sample.is_some_and(|s| s.block);
                self.samples.sampled(h, call, &result, block);
                Next::Answer(result)
            }
            Sent::Lease { batch } => {
                // Counted answered: a call the breaker or the deadline stopped is no lease call.
                self.stats.lease_calls += 1;
                let h = lease::fingerprint(call);
                match self.leases.refilled(h, call, batch, result) {
                    Refill::Granted(r) => {
                        self.stats.leased_units += batch;
                        Next::Answer(r)
                    }
                    Refill::Refused(r) => Next::Answer(r),
                    Refill::Smaller(b) => Next::Again { batch: b },
                }
            }
        }
    }

    /// A lease call failed (store error, deadline): the key may lease again at once.
    pub fn lease_failed(&mut self, pc: &PlannedCall) {
        let h = lease::fingerprint(&pc.call);
        self.leases.refill_failed(h, &pc.call);
    }

    /// Expires cached refusals and returns the give-backs of leases gone quiet, expired or
    /// retired by a rule change: run it every [`lease::SWEEP`] or so.
    pub fn sweep(&mut self, now: Micros) -> Vec<GiveBack> {
        self.deny.expire(now);
        self.samples.expire(now);
        self.detector.roll(now);
        let (back, returned, expired) = self.leases.sweep(now);
        self.count_back(returned, expired);
        back
    }

    /// The sync calls due at `now`: run it with [`Layer::sweep`], send each and report its
    /// answer with [`Layer::synced`]. One call per gated key per interval.
    pub fn syncs(&mut self, now: Micros) -> Vec<SyncCall> {
        self.gates.syncs(now)
    }

    /// Every gate's pending units as sync calls (shutdown).
    pub fn drain_syncs(&mut self, now: Micros) -> Vec<SyncCall> {
        self.gates.retire_all(now);
        self.gates.syncs(now)
    }

    /// The store's answer to a sync call, `None` when it failed. Returns the units the shared
    /// count took (0 for a failed call; less than the call's cost when a bucket could not take
    /// them all, the rest sent again with the next sync).
    pub fn synced(&mut self, s: &SyncCall, result: Option<CallResult>, now: Micros) -> u64 {
        let answered = result.is_some();
        let carried = self.gates.synced(s, result, now);
        if answered {
            self.stats.sync_calls += 1;
            self.stats.synced_units += s.call.cost - carried;
            self.stats.sync_carried += carried;
            s.call.cost - carried
        } else {
            self.stats.sync_failures += 1;
            0
        }
    }

    /// Every lease's give-back (shutdown).
    pub fn drain(&mut self, now: Micros) -> Vec<GiveBack> {
        let (back, returned, expired) = self.leases.drain(now);
        self.count_back(returned, expired);
        back
    }

    fn count_back(&mut self, returned: u64, expired: u64) {
        self.stats.returned_units += returned;
        self.stats.expired_units += expired;
    }
}

impl Layer {
    /// One planned call through the layer with a synchronous store (the simulator's, and
    /// tests'): `send` runs a call on the store, `None` when it failed. The daemon's shell
    /// runs the same steps around its async store. `None`: the store failed (the caller
    /// answers by the rules' failure modes).
    pub fn call_sync(
        &mut self,
        pc: &PlannedCall,
        policy: CallPolicy,
        version: u64,
        mut send: impl FnMut(&Call) -> Option<CallResult>,
    ) -> Option<CallResult> {
        let route = self.route(pc, policy, version);
        let mut sent = match route {
            Route::Local(r) => return Some(r),
            // Nothing is in flight in a synchronous store; a stalled refill has been given up.
            Route::Wait => Sent::Plain,
            ref r => Option::<Sent>::from(r).unwrap_or(Sent::Plain),
        };
        loop {
            let r = send(&sent.call(&pc.call));
            let Some(r) = r else {
                if let Sent::Lease { .. } = sent {
                    self.lease_failed(pc);
                }
                return None;
            };
            match self.answered(pc, policy, sent, r) {
                Next::Answer(r) => return Some(r),
                Next::Again { batch } => sent = Sent::Lease { batch },
            }
        }
    }
}

/// The call `pc` with another cost: the lease call a [`Route::Lease`] asks for.
pub fn with_cost(call: &Call, cost: u64) -> Call {
    Call {
        cost,
        ..call.clone()
    }
}
