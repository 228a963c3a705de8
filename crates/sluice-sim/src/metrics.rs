//! Ground truth and the measures.
//!
//! For every counter a rule keeps (a key of a global rule, or a key of a region rule in one
//! region) the simulator keeps the *truth*: units admitted per measurement window, across
//! all regions, and an *oracle*: the same algorithm (sluice-core's `evaluate` / `take`) run
//! on one exact global state fed with every admission. The oracle answers "would an exact,
//! instantly shared limiter have allowed this?", which is what a false rejection (denied
//! although the true global count was under the limit) and an over-admission are measured
//! against.
//!
//! Measurement windows: a window rule's own windows (aligned on the epoch like the rule's);
//! for token bucket and GCRA, periods of one full refill (`burst / rate`), in which an exact
//! bucket admits at most `burst + rate × period` units. Overshoot of a window = admitted /
//! that bound.
//!
//! Windows are folded into per-rule figures as soon as they are over, so memory does not grow
//! with keys × windows; the full series is kept only for counters worth plotting (the first
//! thousand counters, and any counter whose demand ever reached its allowance).

use crate::fx::FxMap;
use sluice_core::algo::{self, Kind, Params, Remote, Request};
use sluice_core::decision::Code;
use sluice_core::hotkeys::Stats;
use sluice_core::{Micros, State};
use smallvec::SmallVec;

/// One measurement window of one counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WinStat {
    /// Start.
    pub start: Micros,
    /// End.
    pub end: Micros,
    /// Units admitted (every region).
    pub admitted: u64,
    /// Units asked for (admitted or not).
    pub demand: u64,
    /// Units admitted per region (global counters only; empty for region counters).
    pub per_region: Vec<u64>,
}

/// The truth of one counter.
#[derive(Clone, Debug)]
pub struct Truth {
    /// Index of the rule in the domain.
    pub rule: usize,
    /// The region, for region-scope rules.
    pub region: Option<usize>,
    /// Store key.
    pub key: String,
    /// Effective numbers (overrides applied).
    pub params: Params,
    /// What an exact limiter admits per measurement window.
    pub allowed: u64,
    oracle: Option<State>,
    oracle_now: Micros,
    /// The last two windows, oldest first (a request of the previous window may still
    /// execute after the next one began).
    recent: Vec<WinStat>,
    /// Every finished window, for counters worth plotting.
    pub history: Option<Vec<WinStat>>,
    /// Units asked for over the run.
    pub demand: u64,
}

/// The measurement window holding `now` and what an exact limiter admits in it.
pub fn measure_window(params: &Params, now: Micros) -> (Micros, Micros, u64) {
    let aligned = |len: Micros| {
        let len = len.max(1);
        let s = now - now % len;
        (s, s + len)
    };
    match params {
        // Each key's own windows: an exact limiter admits up to twice the limit in an
        // epoch-aligned stretch of the window's length (the end of one window and the start
        // of the next), as a bucket admits its burst twice.
        Params::FixedWindow { limit, window } if window.per_key() => {
            let (s, e) = aligned(window.nominal());
            (s, e, 2 * limit)
        }
        Params::FixedWindow { limit, window } => {
            let (s, e) = window.bounds(now);
            (s, e, *limit)
        }
        Params::SlidingWindow { limit, window, .. } | Params::SlidingLog { limit, window } => {
            let (s, e) = aligned(*window);
            (s, e, *limit)
        }
        Params::TokenBucket { rate, burst } => {
            let len = params.window();
            let (s, e) = aligned(len);
            (s, e, burst + rate.tokens_in(len))
        }
        Params::Gcra { burst, .. } => {
            let (s, e) = aligned(params.window());
            (s, e, 2 * burst)
        }
        Params::Concurrency { limit, timeout } => {
            let (s, e) = aligned(*timeout);
            (s, e, *limit)
        }
        // A tenant may borrow the whole parent: the parent's bucket bounds it.
        Params::FairShare(fs) => {
            let len = params.window();
            let (s, e) = aligned(len);
            (s, e, fs.burst + fs.rate.tokens_in(len))
        }
        // Decided in a period: the rate's departures plus a full queue's worth waiting.
        Params::LeakyQueue { rate, .. } => {
            let (s, e) = aligned(rate.per());
            (s, e, rate.tokens() + params.limit())
        }
    }
}

impl Truth {
    fn request(&mut self, now: Micros, cost: u64) -> Request<'static> {
        // The oracle's clock only moves forward: requests of two regions may execute a few
        // hundred microseconds out of order around a window boundary.
        self.oracle_now = self.oracle_now.max(now);
        Request {
            now: self.oracle_now,
            cost,
            request_id: "",
            remote: Remote::default(),
        }
    }

    /// Whether the exact limiter would admit `cost` units at `now`.
    pub fn oracle_allows(&mut self, now: Micros, cost: u64) -> bool {
        let req = self.request(now, cost);
        algo::evaluate(&self.params, self.oracle.as_ref(), &req).allowed
    }

    /// Charges the exact limiter; returns whether it had room.
    pub fn oracle_take(&mut self, now: Micros, cost: u64) -> bool {
        let req = self.request(now, cost);
        let fits = algo::evaluate(&self.params, self.oracle.as_ref(), &req).allowed;
        self.oracle = Some(algo::take(&self.params, self.oracle.as_ref(), &req).0);
        fits
    }

    /// The units admitted in `region` in the window holding `now` (global counters).
    pub fn region_count(&self, region: usize, now: Micros) -> u64 {
        let (start, _, _) = measure_window(&self.params, now);
        self.recent
            .iter()
            .find(|w| w.start == start)
            .and_then(|w| w.per_region.get(region).copied())
            .unwrap_or(0)
    }
}

/// Counters per rule.
#[derive(Clone, Debug, Default)]
pub struct RuleCounters {
    /// Units asked for.
    pub demand: u64,
    /// Units admitted.
    pub admitted: u64,
    /// Requests this rule refused (it decided).
    pub denied: u64,
    /// Refusals although every refusing counter's exact limiter had room.
    pub false_rejections: u64,
    /// Units admitted although the exact limiter had no room.
    pub over_admitted: u64,
    /// Admitted / allowed of measured windows whose demand reached the allowance.
    pub contested: Vec<f64>,
    /// Measured windows with traffic.
    pub windows: usize,
    /// Sum of their ratios.
    pub ratio_sum: f64,
    /// Largest ratio.
    pub ratio_max: f64,
    /// Ratios in bins of 0.001 (the last bin holds everything from 10.0 up).
    pub ratio_bins: Vec<u32>,
    /// Units admitted beyond the allowance, over measured windows.
    pub excess: u64,
    /// Requests of a window already folded (executed more than a window late).
    pub late: u64,
}

/// What the hot-key layer did for one rule: the calls of the rule's requests that reached
/// the store, and the layer's counters over those calls (each counter's change across a
/// call, given to every rule of the call).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HotRule {
    /// Requests the rule applied to (one per planned call holding it).
    pub requests: u64,
    /// Store calls made for them: calls as planned, lease calls and the sync calls of the
    /// rule's keys, failed ones included.
    pub store_calls: u64,
    /// Refusals answered from the deny cache.
    pub deny_hits: u64,
    /// Requests served from leased units.
    pub lease_spent: u64,
    /// Requests refused while a refused lease call waited for its retry time.
    pub lease_blocked: u64,
    /// Lease calls sent.
    pub lease_calls: u64,
    /// Units leased.
    pub leased_units: u64,
    /// Units in give-backs to the rule's keys (handed to the store).
    pub returned_units: u64,
    /// Samples sent (`hot_keys.sample`).
    pub samples: u64,
    /// Requests answered like the last sample.
    pub sample_skipped: u64,
    /// Requests refused by a refused sample's block.
    pub sample_blocked: u64,
    /// Requests a gate admitted (`hot_keys.sync_interval`, `local_share`), counted to sync.
    pub gate_admitted: u64,
    /// Units of those requests: what the rule's sync calls owe the store.
    pub gate_admitted_units: u64,
    /// Requests a sync gate refused (its budget spent until the next sync).
    pub gate_refused: u64,
    /// Requests of gated keys sent to the store (first request, past the share, stale).
    pub gate_to_store: u64,
    /// Sync calls the store answered (each also in `store_calls`).
    pub sync_calls: u64,
    /// Sync calls that failed, the store being out (also in `store_calls`).
    pub sync_failures: u64,
    /// Units added to the store's counts by answered sync calls.
    pub synced_units: u64,
    /// Units a gate admitted and never synced: its daemon crashed first.
    pub gate_lost_units: u64,
}

/// Bins of 0.001 up to a ratio of 10.
pub const RATIO_BINS: usize = 10_001;

/// Everything the run counts.
#[derive(Debug)]
pub struct Metrics {
    regions: usize,
    warmup: Micros,
    duration: Micros,
    /// One per counter.
    pub truths: Vec<Truth>,
    /// One per rule of the domain.
    pub rules: Vec<RuleCounters>,
    /// Requests decided.
    pub requests: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests refused (over a limit).
    pub denied: u64,
    /// Requests answered UNAVAILABLE (a fail-closed rule without a store).
    pub unavailable: u64,
    /// Requests lost with a region that went down while they were in flight.
    pub failed_in_flight: u64,
    /// Requests that found every region down (or every daemon of their region).
    pub no_region: u64,
    /// Store calls that reached the store (as planned, or lease calls), failed ones
    /// included; the hot-key layer answers the others itself.
    pub store_calls: u64,
    /// Store calls answered as failed: the store out, or refused by the daemon's breaker.
    pub store_failures: u64,
    /// Store calls the daemons' breakers refused, sync calls included (not sent: not in
    /// `store_calls`).
    pub breaker_refused: u64,
    /// Times a daemon's breaker opened.
    pub breaker_opened: u64,
    /// Admissions the daemons journal (`guard::journaled`: quota-sized fixed windows whose
    /// store call failed). The simulator keeps no journal: they are counted, not replayed.
    pub journaled: u64,
    /// Rules answered by a daemon's local bucket.
    pub local_answers: u64,
    /// Store calls lost in failovers.
    pub lost_writes: u64,
    /// Per store slot (the main store, then the named ones): the engine's counters of it.
    pub stores: Vec<crate::per_store::StoreCounters>,
    /// Per rule: what the hot-key layer did (the engine counts these).
    pub hot: Vec<HotRule>,
    /// Per rule, per simulated second (of the requests' arrival): requests and the store
    /// calls made for them.
    pub calls_per_s: Vec<Vec<(u64, u64)>>,
    /// Every daemon's hot-key layer counters, summed (restarted daemons' included).
    pub layer: Stats,
    /// Give-backs the store applied (`Ok(true)`).
    pub give_backs: u64,
    /// Give-backs that found nothing to give back to (`Ok(false)`: no state, or the window
    /// ended).
    pub give_backs_moot: u64,
    /// Give-backs not applied: the store was out, or refused them. Their units are lost
    /// (the safe side, as in the daemon).
    pub give_backs_failed: u64,
    /// Units gates admitted whose sync call was dropped unanswered (`Layer::gate_lost`).
    pub gate_lost_units: u64,
}

/// Counter ids by store key: the engine numbers counters as it meets them, so the thread
/// that keeps the truths learns each one once, with its key and numbers.
#[derive(Debug)]
pub struct TruthIndex {
    global: FxMap<String, u32>,
    regional: Vec<FxMap<String, u32>>,
    next: u32,
}

impl TruthIndex {
    /// No counters yet, over `regions` regions.
    pub fn new(regions: usize) -> TruthIndex {
        TruthIndex {
            global: FxMap::default(),
            regional: vec![FxMap::default(); regions],
            next: 0,
        }
    }

    /// The id of `key`'s counter (of rule `rule`; `region` is `Some` for region-scope
    /// rules, which count per region), and the counter to create when it is new.
    pub fn id(
        &mut self,
        rule: usize,
        region: Option<usize>,
        key: &str,
        params: &Params,
    ) -> (u32, Option<NewTruth>) {
        let map = match region {
            None => &mut self.global,
            Some(r) => &mut self.regional[r],
        };
        if let Some(&id) = map.get(key) {
            return (id, None);
        }
        let id = self.next;
        self.next += 1;
        map.insert(key.to_string(), id);
        let new = NewTruth {
            id,
            rule,
            region,
            key: key.to_string(),
            params: params.clone(),
        };
        (id, Some(new))
    }
}

/// A counter met for the first time.
#[derive(Clone, Debug)]
pub struct NewTruth {
    /// Its id (counters are numbered in the order they are met).
    pub id: u32,
    /// Index of the rule in the domain.
    pub rule: usize,
    /// The region, for region-scope rules.
    pub region: Option<usize>,
    /// Store key.
    pub key: String,
    /// Effective numbers.
    pub params: Params,
}

/// One enforced rule of a decided request, as the truths need it.
#[derive(Clone, Copy, Debug)]
pub struct Counter {
    /// Counter id.
    pub id: u32,
    /// Index of the rule in the domain.
    pub rule: u32,
    /// Refused requests still cost quota.
    pub charge_rejected: bool,
    /// This rule refused the request (not by failing closed).
    pub refusing: bool,
}

/// One decided request, as the truths need it: plain numbers, so it can be counted on
/// another thread while the engine goes on.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Region that decided (at most `MAX_REGIONS`, 64).
    pub region: u8,
    /// The daemon's now.
    pub now: Micros,
    /// Units asked for.
    pub cost: u64,
    /// The decision.
    pub code: Code,
    /// Rules answered by a daemon's local bucket.
    pub local: u32,
    /// Which of `counters` decided a refusal.
    pub decided_by: Option<u32>,
    /// The enforced rules, in decision order.
    pub counters: SmallVec<[Counter; 4]>,
}

/// A global window counter that some region counted above its threshold at a heal.
#[derive(Clone, Debug)]
pub struct HealCount {
    /// Store key.
    pub key: String,
    /// Index of the rule in the domain.
    pub rule: usize,
    /// End of the window holding the heal.
    pub end: Micros,
    /// Per region: its count, or 0 below the threshold or down.
    pub counts: Vec<u64>,
}

/// Counters kept with their whole series regardless of demand.
const ALWAYS_KEEP: usize = 1_000;

impl Metrics {
    /// Empty counters for `rules` rules over `regions` regions; windows are measured when
    /// they lie in `[warmup, duration]`.
    pub fn new(rules: usize, regions: usize, warmup: Micros, duration: Micros) -> Metrics {
        Metrics {
            regions,
            warmup,
            duration,
            truths: Vec::new(),
            rules: vec![RuleCounters::default(); rules],
            requests: 0,
            admitted: 0,
            denied: 0,
            unavailable: 0,
            failed_in_flight: 0,
            no_region: 0,
            store_calls: 0,
            store_failures: 0,
            breaker_refused: 0,
            breaker_opened: 0,
            journaled: 0,
            local_answers: 0,
            lost_writes: 0,
            stores: Vec::new(),
            hot: vec![HotRule::default(); rules],
            calls_per_s: vec![Vec::new(); rules],
            layer: Stats::default(),
            give_backs: 0,
            give_backs_moot: 0,
            give_backs_failed: 0,
            gate_lost_units: 0,
        }
    }

    /// Adds the counter [`TruthIndex::id`] numbered `id`; ids arrive in order.
    pub fn push_truth(&mut self, t: NewTruth) {
        let id = self.truths.len();
        debug_assert_eq!(id, t.id as usize, "truths arrive in id order");
        let (_, _, allowed) = measure_window(&t.params, 0);
        self.truths.push(Truth {
            rule: t.rule,
            region: t.region,
            key: t.key,
            params: t.params,
            allowed,
            oracle: None,
            oracle_now: 0,
            recent: Vec::with_capacity(2),
            history: (id < ALWAYS_KEEP).then(Vec::new),
            demand: 0,
        });
    }

    /// Counts one decided request: what [`Measured`] says the decision did to each counter.
    pub fn record(&mut self, m: &Measured) {
        match m.code {
            Code::Ok => self.admitted += 1,
            Code::OverLimit => self.denied += 1,
            Code::Unavailable => self.unavailable += 1,
        }
        self.local_answers += u64::from(m.local);
        for c in &m.counters {
            self.demand(c.id as usize, m.now, m.cost);
        }
        if m.code == Code::OverLimit {
            let mut refusing = 0;
            let mut all_room = true;
            for c in m.counters.iter().filter(|c| c.refusing) {
                refusing += 1;
                all_room &= self.truths[c.id as usize].oracle_allows(m.now, m.cost);
            }
            if let Some(c) = m.decided_by.and_then(|i| m.counters.get(i as usize)) {
                let rc = &mut self.rules[c.rule as usize];
                rc.denied += 1;
                if refusing > 0 && all_room {
                    rc.false_rejections += 1;
                }
            }
        }
        if m.code == Code::Ok {
            for c in &m.counters {
                self.admit(c.id as usize, m.now, usize::from(m.region), m.cost);
            }
        } else {
            for c in m.counters.iter().filter(|c| c.charge_rejected) {
                self.truths[c.id as usize].oracle_take(m.now, m.cost);
            }
        }
    }

    /// Adds the counters another instance kept (the engine counts requests, store calls and
    /// failures itself; the truths are counted here).
    pub fn add_counts(&mut self, o: &Metrics) {
        self.requests += o.requests;
        self.admitted += o.admitted;
        self.denied += o.denied;
        self.unavailable += o.unavailable;
        self.failed_in_flight += o.failed_in_flight;
        self.no_region += o.no_region;
        self.store_calls += o.store_calls;
        self.store_failures += o.store_failures;
        self.breaker_refused += o.breaker_refused;
        self.breaker_opened += o.breaker_opened;
        self.journaled += o.journaled;
        self.local_answers += o.local_answers;
        self.lost_writes += o.lost_writes;
        crate::per_store::add_counts(&mut self.stores, &o.stores);
        for (a, b) in self.hot.iter_mut().zip(&o.hot) {
            a.requests += b.requests;
            a.store_calls += b.store_calls;
            a.deny_hits += b.deny_hits;
            a.lease_spent += b.lease_spent;
            a.lease_blocked += b.lease_blocked;
            a.lease_calls += b.lease_calls;
            a.leased_units += b.leased_units;
            a.returned_units += b.returned_units;
            a.samples += b.samples;
            a.sample_skipped += b.sample_skipped;
            a.sample_blocked += b.sample_blocked;
            a.gate_admitted += b.gate_admitted;
            a.gate_admitted_units += b.gate_admitted_units;
            a.gate_refused += b.gate_refused;
            a.gate_to_store += b.gate_to_store;
            a.sync_calls += b.sync_calls;
            a.sync_failures += b.sync_failures;
            a.synced_units += b.synced_units;
            a.gate_lost_units += b.gate_lost_units;
        }
        for (a, b) in self.calls_per_s.iter_mut().zip(&o.calls_per_s) {
            if a.len() < b.len() {
                a.resize(b.len(), (0, 0));
            }
            for (x, y) in a.iter_mut().zip(b) {
                x.0 += y.0;
                x.1 += y.1;
            }
        }
        self.layer += &o.layer;
        self.give_backs += o.give_backs;
        self.give_backs_moot += o.give_backs_moot;
        self.give_backs_failed += o.give_backs_failed;
        self.gate_lost_units += o.gate_lost_units;
    }

    /// Global window counters some region counted above its share threshold in the window
    /// holding `now`: what daemons must learn after a heal. `th[rule]` is the threshold on a
    /// region's count, parts per million of the limit; a region that is down counts 0.
    pub fn heal_counts(&self, now: Micros, up: &[bool], th: &[u64]) -> Vec<HealCount> {
        let mut out = Vec::new();
        for t in &self.truths {
            if t.region.is_some()
                || !matches!(t.params.kind(), Kind::FixedWindow | Kind::SlidingWindow)
            {
                continue;
            }
            let (_, end, _) = measure_window(&t.params, now);
            let limit = t.params.limit();
            let counts: Vec<u64> = (0..up.len())
                .map(|r| {
                    let c = t.region_count(r, now);
                    if up[r]
                        && u128::from(c) * 1_000_000 > u128::from(limit) * u128::from(th[t.rule])
                    {
                        c
                    } else {
                        0
                    }
                })
                .collect();
            if counts.iter().any(|c| *c > 0) {
                out.push(HealCount {
                    key: t.key.clone(),
                    rule: t.rule,
                    end,
                    counts,
                });
            }
        }
        out
    }

    /// The window of counter `id` holding `now`, or `None` when it was already folded.
    fn window(&mut self, id: usize, now: Micros) -> Option<&mut WinStat> {
        let t = &self.truths[id];
        let (start, end, _) = measure_window(&t.params, now);
        let pos = t.recent.iter().position(|w| w.start == start);
        let pos = match pos {
            Some(p) => p,
            None if t.recent.last().is_none_or(|w| w.start < start) => {
                let per_region = if t.region.is_none() {
                    vec![0; self.regions]
                } else {
                    Vec::new()
                };
                let t = &mut self.truths[id];
                t.recent.push(WinStat {
                    start,
                    end,
                    admitted: 0,
                    demand: 0,
                    per_region,
                });
                if t.recent.len() > 2 {
                    let w = t.recent.remove(0);
                    self.fold(id, w);
                }
                self.truths[id].recent.len() - 1
            }
            None if t.recent.len() < 2 && t.recent.first().is_some_and(|w| w.start > start) => {
                let per_region = if t.region.is_none() {
                    vec![0; self.regions]
                } else {
                    Vec::new()
                };
                self.truths[id].recent.insert(
                    0,
                    WinStat {
                        start,
                        end,
                        admitted: 0,
                        demand: 0,
                        per_region,
                    },
                );
                0
            }
            None => {
                let rule = self.truths[id].rule;
                self.rules[rule].late += 1;
                return None;
            }
        };
        Some(&mut self.truths[id].recent[pos])
    }

    /// Adds a finished window to its rule's figures (and to the counter's series).
    fn fold(&mut self, id: usize, w: WinStat) {
        let t = &mut self.truths[id];
        let allowed = t.allowed.max(1);
        if w.demand >= allowed && t.history.is_none() {
            t.history = Some(Vec::new());
        }
        let measured = w.start >= self.warmup && w.end <= self.duration && w.demand > 0;
        if measured {
            let rc = &mut self.rules[t.rule];
            let ratio = w.admitted as f64 / allowed as f64;
            rc.windows += 1;
            rc.ratio_sum += ratio;
            rc.ratio_max = rc.ratio_max.max(ratio);
            if rc.ratio_bins.is_empty() {
                rc.ratio_bins = vec![0; RATIO_BINS];
            }
            let bin = ((ratio * 1000.0).round() as usize).min(RATIO_BINS - 1);
            rc.ratio_bins[bin] += 1;
            if w.demand >= allowed {
                rc.contested.push(ratio);
            }
            rc.excess += w.admitted.saturating_sub(allowed);
        }
        if let Some(h) = &mut t.history
            && w.end <= self.duration
        {
            h.push(w);
        }
    }

    /// Folds every window still open: call once, at the end of the run.
    pub fn finish(&mut self) {
        for id in 0..self.truths.len() {
            let recent = std::mem::take(&mut self.truths[id].recent);
            for w in recent {
                self.fold(id, w);
            }
        }
    }

    /// A request for `cost` units reached counter `id`.
    pub fn demand(&mut self, id: usize, now: Micros, cost: u64) {
        let rule = self.truths[id].rule;
        self.truths[id].demand += cost;
        self.rules[rule].demand += cost;
        if let Some(w) = self.window(id, now) {
            w.demand += cost;
        }
    }

    /// Counter `id` admitted `cost` units in `region`.
    pub fn admit(&mut self, id: usize, now: Micros, region: usize, cost: u64) {
        let fits = self.truths[id].oracle_take(now, cost);
        let rule = self.truths[id].rule;
        if let Some(w) = self.window(id, now) {
            w.admitted += cost;
            if let Some(p) = w.per_region.get_mut(region) {
                *p += cost;
            }
        }
        let rc = &mut self.rules[rule];
        rc.admitted += cost;
        if !fits {
            rc.over_admitted += cost;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::algo::Window;
    use sluice_core::time::SECOND;

    const MIN: Micros = 60 * SECOND;

    #[test]
    fn windows_fold_into_rule_figures() {
        let p = Params::FixedWindow {
            limit: 10,
            window: Window::Epoch(MIN),
        };
        let mut m = Metrics::new(1, 2, 0, 3 * MIN);
        let mut index = TruthIndex::new(2);
        let (id, new) = index.id(0, None, "k", &p);
        m.push_truth(new.expect("new counter"));
        assert!(index.id(0, None, "k", &p).1.is_none(), "met once");
        let id = id as usize;
        for i in 0..12 {
            m.demand(id, i, 1);
            m.admit(id, i, (i % 2) as usize, 1);
        }
        // A late request of window 0 after window 1 began still counts.
        m.demand(id, MIN + 5, 1);
        m.demand(id, 5, 1);
        m.admit(id, 5, 0, 1);
        m.finish();
        let rc = &m.rules[0];
        assert_eq!(rc.contested, vec![1.3]);
        assert_eq!(rc.excess, 3);
        assert_eq!(rc.over_admitted, 3);
        assert_eq!(rc.windows, 2);
        let h = m.truths[id].history.as_ref().expect("kept");
        assert_eq!(h[0].per_region, vec![7, 6]);
        assert_eq!(rc.late, 0);
    }
}
