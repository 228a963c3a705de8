//! The measures of a run, and their renderings: a table for people, JSON and CSV for
//! tools, and the per-window series behind the plots.
//!
//! Everything here is a pure function of the run's counters: no wall clock, no map order, no
//! float formatting that varies by platform, so the same run renders to the same bytes.

use crate::engine::{GossipCounters, HealTrack};
use crate::metrics::{Metrics, Truth, measure_window};
use crate::scenario::{BusyOn, Delivery, Scenario, Shippers};
use serde::Serialize;
use sluice_core::Micros;
use sluice_core::rules::Scope;
use sluice_core::time::{MILLI, SECOND};
use std::fmt::Write as _;

/// The measures of one rule.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RuleReport {
    /// Rule id.
    pub id: String,
    /// `global` or `region`.
    pub scope: String,
    /// Algorithm name.
    pub algorithm: String,
    /// What an exact limiter admits per measurement window (limit, or burst + rate × period).
    pub allowed_per_window: u64,
    /// Measurement window, seconds.
    pub window_s: f64,
    /// Counters seen (keys; × regions for region rules).
    pub counters: usize,
    /// Complete measurement windows with traffic.
    pub windows: usize,
    /// Of those, windows whose demand reached the allowance (where overshoot can happen).
    pub contested_windows: usize,
    /// Largest admitted / allowed over the measured windows (contested ones when any).
    pub overshoot_max: f64,
    /// 99th percentile of the same.
    pub overshoot_p99: f64,
    /// Mean of the same.
    pub overshoot_mean: f64,
    /// Units admitted beyond the allowance, summed over windows.
    pub excess_units: u64,
    /// Units asked for.
    pub demand: u64,
    /// Units admitted.
    pub admitted: u64,
    /// Requests this rule refused.
    pub denied: u64,
    /// Refusals while the exact global limiter had room.
    pub false_rejections: u64,
    /// False rejections per request that reached the rule, percent.
    pub false_rejection_pct: f64,
    /// Units admitted while the exact limiter had no room.
    pub over_admitted: u64,
    /// Units admitted per simulated second, every key of the rule.
    pub admitted_per_s: f64,
    /// The rule's rate per key, units per second (a window's limit over its length).
    pub limit_per_s: f64,
    /// Requests that reached the rule.
    pub requests: u64,
    /// Store calls made for them (as planned, or lease calls): what the hot-key layer did
    /// not answer itself.
    pub store_calls: u64,
    /// `store_calls / requests`.
    pub store_calls_per_request: f64,
    /// Refusals answered from a deny cache.
    pub deny_hits: u64,
    /// Requests served from leased units.
    pub lease_spent: u64,
    /// Requests refused while a refused lease call waited for its retry time.
    pub lease_blocked: u64,
    /// Lease calls sent.
    pub lease_calls: u64,
    /// Units leased.
    pub leased_units: u64,
    /// Leased units given back to the store unspent.
    pub returned_units: u64,
    /// Samples sent (`hot_keys.sample`).
    pub samples: u64,
    /// Requests answered like the last sample.
    pub sample_skipped: u64,
    /// Requests refused by a refused sample's block.
    pub sample_blocked: u64,
    /// Requests a gate admitted (`sync_interval`, `local_share`), to be synced.
    pub gate_admitted: u64,
    /// Units of those requests.
    pub gate_admitted_units: u64,
    /// Requests a sync gate refused.
    pub gate_refused: u64,
    /// Requests of gated keys sent to the store.
    pub gate_to_store: u64,
    /// Sync calls answered (counted in `store_calls`).
    pub sync_calls: u64,
    /// Sync calls failed (counted in `store_calls`).
    pub sync_failures: u64,
    /// Units the answered sync calls added to the store's counts.
    pub synced_units: u64,
    /// Gate-admitted units lost unsynced with a crashed daemon.
    pub gate_lost_units: u64,
}

/// The hot-key layers of every daemon, summed (`sluice_core::hotkeys::Layer::stats`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HotKeysReport {
    /// Requests refused from a deny cache.
    pub deny_hits: u64,
    /// Refusals remembered.
    pub deny_inserts: u64,
    /// Refusals not remembered: the cache was full.
    pub deny_full: u64,
    /// Requests served from leased units.
    pub lease_spent: u64,
    /// Requests refused while a refused lease call waited for its retry time.
    pub lease_blocked: u64,
    /// Lease calls sent.
    pub lease_calls: u64,
    /// Units leased.
    pub leased_units: u64,
    /// Units given back (handed to the store).
    pub returned_units: u64,
    /// Units of leases that ended with their window unspent (not given back).
    pub expired_units: u64,
    /// Give-backs the store applied.
    pub give_backs: u64,
    /// Give-backs that found nothing to give back to.
    pub give_backs_moot: u64,
    /// Give-backs lost: the store was out.
    pub give_backs_failed: u64,
    /// Samples sent.
    pub samples: u64,
    /// Requests answered like the last sample.
    pub sample_skipped: u64,
    /// Requests refused by a refused sample's block.
    pub sample_blocked: u64,
    /// Requests gates admitted.
    pub gate_admitted: u64,
    /// Requests sync gates refused.
    pub gate_refused: u64,
    /// Requests of gated keys sent to the store.
    pub gate_to_store: u64,
    /// Sync calls answered.
    pub sync_calls: u64,
    /// Sync calls failed (their units stayed pending).
    pub sync_failures: u64,
    /// Units synced.
    pub synced_units: u64,
    /// Gate-admitted units whose sync was dropped unanswered (`Layer::gate_lost`).
    pub gate_lost_units: u64,
}

/// Traffic of one hop kind (`region_sender`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HopReport {
    /// Bytes sent per second, all regions (estimated protobuf, per receiving daemon).
    pub bytes_per_s: f64,
    /// Per sending region, in region order.
    pub bytes_per_s_by_region: Vec<f64>,
    /// Messages sent (one per receiving daemon).
    pub messages: u64,
}

/// `region_sender`'s traffic by hop, so that its cross-region bytes compare with the other
/// modes' and its in-region cost shows.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HopsReport {
    /// In a region, each daemon's selection to its sender.
    pub collect: HopReport,
    /// Across, a sender to another region's receiver.
    pub relay: HopReport,
    /// In a region, a receiver to its other daemons.
    pub fan_out: HopReport,
    /// Across, to every daemon of a region with no relaying member (none in a simulated
    /// run, where every daemon relays; kept so the hops add up as the daemon counts them).
    pub direct: HopReport,
    /// Across, other origins' figures a receiver forwarded to a peer region (`fanout`
    /// above 0 only), counted by the forwarding region; in the cross-region bytes too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forward: Option<HopReport>,
    /// In-region bytes per second (collect and fan out), all regions.
    pub in_region_bytes_per_s: f64,
}

/// Gossip measures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GossipReport {
    /// Cross-region bytes sent per second, all regions (estimated protobuf, per receiving
    /// daemon): every message in the other modes; with `region_sender` the relay and direct
    /// hops (the in-region ones are in `hops`).
    pub bytes_per_s: f64,
    /// Per region, in region order.
    pub bytes_per_s_by_region: Vec<f64>,
    /// Messages sent.
    pub messages: u64,
    /// Entries shipped (per shipment, not per receiver).
    pub entries: u64,
    /// Most entries in one shipment.
    pub max_entries_per_shipment: u64,
    /// Busy figures deferred by the budget, summed over intervals.
    pub deferred: u64,
    /// Messages lost at random.
    pub lost: u64,
    /// Messages dropped by partitions.
    pub cut: u64,
    /// Most remote slots any daemon held.
    pub max_remote_slots: usize,
    /// `region_sender` only (absent otherwise): the traffic by hop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hops: Option<HopsReport>,
}

/// Convergence after one heal.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HealReport {
    /// When the partition healed, s.
    pub at_s: f64,
    /// Seconds until every daemon's view held every busy count of the heal instant.
    pub converged_after_s: Option<f64>,
    /// Keys that had something to learn.
    pub keys: usize,
    /// Needs that ended with their window before being met.
    pub moot: usize,
}

/// Admitted per window for one busy counter, for windows.csv and the plot.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Series {
    /// Rule id.
    pub rule: String,
    /// Store key.
    pub key: String,
    /// Region of a region-scope counter.
    pub region: Option<String>,
    /// The allowance per window.
    pub allowed: u64,
    /// (window start s, admitted, demand, admitted per region).
    pub windows: Vec<(f64, u64, u64, Vec<u64>)>,
}

/// Store calls per request over time for one rule, for calls.csv and the plot.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CallsSeries {
    /// Rule id.
    pub rule: String,
    /// The rule's calls per request over the whole run.
    pub mean: f64,
    /// (second, requests that arrived in it, store calls made for them).
    pub seconds: Vec<(u64, u64, u64)>,
}

/// Everything a run measured.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// What it answers.
    pub description: String,
    /// The seed.
    pub seed: u64,
    /// Region names.
    pub regions: Vec<String>,
    /// Daemons per region.
    pub daemons_per_region: usize,
    /// Simulated seconds.
    pub duration_s: f64,
    /// Ship interval at the start, ms.
    pub ship_interval_ms: f64,
    /// Threshold override at the start (fraction), if any.
    pub share_threshold: Option<f64>,
    /// Who ships.
    pub shippers: Shippers,
    /// What the threshold is judged on.
    pub busy_on: BusyOn,
    /// How shipments reach a region's daemons.
    pub delivery: Delivery,
    /// Each region's clock offset from the reference clock, ms; left out when every clock
    /// is on time (reports of runs without skew stay as they were).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clock_offset_ms: Vec<f64>,
    /// Requests decided.
    pub requests: u64,
    /// Admitted.
    pub admitted: u64,
    /// Refused.
    pub denied: u64,
    /// Answered UNAVAILABLE.
    pub unavailable: u64,
    /// Lost in flight with a region.
    pub failed_in_flight: u64,
    /// Store calls per decided request (what reached the store: the hot-key layer answers
    /// the rest).
    pub store_calls_per_request: f64,
    /// Store calls answered as failed (the store out, or refused by a daemon's breaker).
    pub store_failures: u64,
    /// Store calls the daemons' breakers refused (not sent), sync calls included.
    pub breaker_refused: u64,
    /// Times a daemon's breaker opened.
    pub breaker_opened: u64,
    /// Admissions a daemon journals (quota windows decided while their store call failed);
    /// counted, not replayed.
    pub journaled: u64,
    /// Rule verdicts from a daemon's local bucket.
    pub local_answers: u64,
    /// Store calls lost in failovers.
    pub lost_writes: u64,
    /// Per store, the main one (`default`) first, when the scenario has named stores (left
    /// out otherwise: reports of runs without them stay as they were).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stores: Vec<crate::per_store::StoreReport>,
    /// Gossip.
    pub gossip: GossipReport,
    /// The hot-key layers.
    pub hot_keys: HotKeysReport,
    /// One per heal.
    pub heals: Vec<HealReport>,
    /// One per rule, in rule order.
    pub rules: Vec<RuleReport>,
    /// Busiest counters' windows.
    pub series: Vec<Series>,
    /// Per rule with requests: store calls per request, second by second.
    pub calls: Vec<CallsSeries>,
}

impl Report {
    /// The slowest convergence among the heals that converged (none: `None`): the CSVs'
    /// one run-level figure for heals.
    pub fn converged_after_s(&self) -> Option<f64> {
        self.heals
            .iter()
            .filter_map(|h| h.converged_after_s)
            .fold(None, |a: Option<f64>, s| Some(a.map_or(s, |a| a.max(s))))
    }
}

fn secs(us: Micros) -> f64 {
    us as f64 / SECOND as f64
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Nearest-rank percentile from bins of 0.001.
fn bin_percentile(bins: &[u32], total: usize, p: f64) -> f64 {
    let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0u64;
    for (i, b) in bins.iter().enumerate() {
        seen += u64::from(*b);
        if seen >= rank {
            return i as f64 / 1000.0;
        }
    }
    0.0
}

fn rule_report(sc: &Scenario, m: &Metrics, i: usize) -> RuleReport {
    let rule = &sc.domain().rules[i];
    let c = &m.rules[i];
    let h = m.hot.get(i).cloned().unwrap_or_default();
    let (start, end, allowed) = measure_window(&rule.params, sc.warmup);
    let counters = m.truths.iter().filter(|t| t.rule == i).count();
    let (max, p99, mean) = if c.contested.is_empty() {
        // No window reached its allowance: figures over every window with traffic, from
        // bins of 0.001.
        let mean = if c.windows == 0 {
            0.0
        } else {
            c.ratio_sum / c.windows as f64
        };
        (
            c.ratio_max,
            bin_percentile(&c.ratio_bins, c.windows, 99.0),
            mean,
        )
    } else {
        let mut v = c.contested.clone();
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (v.last().copied().unwrap_or(0.0), percentile(&v, 99.0), mean)
    };
    RuleReport {
        id: rule.id.to_string(),
        scope: match rule.scope {
            Scope::Global => "global",
            Scope::Region => "region",
        }
        .into(),
        algorithm: rule.params.kind().name().into(),
        allowed_per_window: allowed,
        window_s: secs(end - start),
        counters,
        windows: c.windows,
        contested_windows: c.contested.len(),
        overshoot_max: max,
        overshoot_p99: p99,
        overshoot_mean: mean,
        excess_units: c.excess,
        demand: c.demand,
        admitted: c.admitted,
        denied: c.denied,
        false_rejections: c.false_rejections,
        false_rejection_pct: if c.demand == 0 {
            0.0
        } else {
            100.0 * c.false_rejections as f64 / c.demand as f64
        },
        over_admitted: c.over_admitted,
        admitted_per_s: c.admitted as f64 / secs(sc.duration).max(1e-9),
        limit_per_s: limit_per_s(&rule.params),
        requests: h.requests,
        store_calls: h.store_calls,
        store_calls_per_request: if h.requests == 0 {
            0.0
        } else {
            h.store_calls as f64 / h.requests as f64
        },
        deny_hits: h.deny_hits,
        lease_spent: h.lease_spent,
        lease_blocked: h.lease_blocked,
        lease_calls: h.lease_calls,
        leased_units: h.leased_units,
        returned_units: h.returned_units,
        samples: h.samples,
        sample_skipped: h.sample_skipped,
        sample_blocked: h.sample_blocked,
        gate_admitted: h.gate_admitted,
        gate_admitted_units: h.gate_admitted_units,
        gate_refused: h.gate_refused,
        gate_to_store: h.gate_to_store,
        sync_calls: h.sync_calls,
        sync_failures: h.sync_failures,
        synced_units: h.synced_units,
        gate_lost_units: h.gate_lost_units,
    }
}

/// A rule's rate per key in units per second: a bucket's rate, a window's limit over its
/// length.
fn limit_per_s(p: &sluice_core::Params) -> f64 {
    match p {
        sluice_core::Params::TokenBucket { rate, .. } | sluice_core::Params::Gcra { rate, .. } => {
            rate.per_second_f64()
        }
        p => p.limit() as f64 / secs(p.window()).max(1e-9),
    }
}

fn series(sc: &Scenario, t: &Truth) -> Series {
    Series {
        rule: sc.domain().rules[t.rule].id.to_string(),
        key: t.key.clone(),
        region: t.region.map(|r| sc.regions[r].clone()),
        allowed: t.allowed,
        windows: t
            .history
            .iter()
            .flatten()
            .map(|w| (secs(w.start), w.admitted, w.demand, w.per_region.clone()))
            .collect(),
    }
}

/// Builds the report of a finished run.
pub fn build(
    sc: &Scenario,
    seed: u64,
    m: &Metrics,
    g: &GossipCounters,
    heals: &[HealTrack],
) -> Report {
    let dur = secs(sc.duration).max(1e-9);
    let rules = (0..sc.domain().rules.len())
        .map(|i| rule_report(sc, m, i))
        .collect();
    let mut series_out = Vec::new();
    for i in 0..sc.domain().rules.len() {
        let mut ts: Vec<&Truth> = m
            .truths
            .iter()
            .filter(|t| t.rule == i && t.history.is_some())
            .collect();
        // Busiest first; ties by key so the choice is stable.
        ts.sort_by(|a, b| b.demand.cmp(&a.demand).then_with(|| a.key.cmp(&b.key)));
        for t in ts.into_iter().take(sc.plot_keys) {
            series_out.push(series(sc, t));
        }
    }
    let calls = rules_out_calls(sc, m);
    Report {
        scenario: sc.name.clone(),
        description: sc.description.clone(),
        seed,
        regions: sc.regions.clone(),
        daemons_per_region: sc.daemons,
        duration_s: secs(sc.duration),
        ship_interval_ms: sc.gossip.interval as f64 / MILLI as f64,
        share_threshold: sc.gossip.threshold_pct.map(|p| f64::from(p) / 100.0),
        shippers: sc.gossip.shippers,
        busy_on: sc.gossip.busy_on,
        delivery: sc.gossip.delivery,
        clock_offset_ms: if sc.clock_offset.iter().all(|o| *o == 0) {
            Vec::new()
        } else {
            sc.clock_offset
                .iter()
                .map(|o| *o as f64 / MILLI as f64)
                .collect()
        },
        requests: m.requests,
        admitted: m.admitted,
        denied: m.denied,
        unavailable: m.unavailable,
        failed_in_flight: m.failed_in_flight,
        store_calls_per_request: if m.requests == 0 {
            0.0
        } else {
            m.store_calls as f64 / m.requests as f64
        },
        store_failures: m.store_failures,
        breaker_refused: m.breaker_refused,
        breaker_opened: m.breaker_opened,
        journaled: m.journaled,
        local_answers: m.local_answers,
        lost_writes: m.lost_writes,
        stores: crate::per_store::reports(sc, m),
        hot_keys: HotKeysReport {
            deny_hits: m.layer.deny_hits,
            deny_inserts: m.layer.deny_inserts,
            deny_full: m.layer.deny_full,
            lease_spent: m.layer.lease_spent,
            lease_blocked: m.layer.lease_blocked,
            lease_calls: m.layer.lease_calls,
            leased_units: m.layer.leased_units,
            returned_units: m.layer.returned_units,
            expired_units: m.layer.expired_units,
            give_backs: m.give_backs,
            give_backs_moot: m.give_backs_moot,
            give_backs_failed: m.give_backs_failed,
            samples: m.layer.samples,
            sample_skipped: m.layer.sample_skipped,
            sample_blocked: m.layer.sample_blocked,
            gate_admitted: m.layer.gate_admitted,
            gate_refused: m.layer.gate_refused,
            gate_to_store: m.layer.gate_to_store,
            sync_calls: m.layer.sync_calls,
            sync_failures: m.layer.sync_failures,
            synced_units: m.layer.synced_units,
            gate_lost_units: m.gate_lost_units,
        },
        gossip: GossipReport {
            bytes_per_s: g.bytes as f64 / dur,
            bytes_per_s_by_region: g.bytes_by_region.iter().map(|b| *b as f64 / dur).collect(),
            messages: g.messages,
            entries: g.entries,
            max_entries_per_shipment: g.max_batch,
            deferred: g.deferred,
            lost: g.lost,
            cut: g.cut,
            max_remote_slots: g.max_remote_slots,
            hops: (sc.gossip.shippers == Shippers::RegionSender).then(|| {
                let hop = |h: &crate::engine::HopCounters| {
                    let by: Vec<f64> = (0..sc.regions.len())
                        .map(|r| h.bytes_by_region.get(r).copied().unwrap_or(0) as f64 / dur)
                        .collect();
                    HopReport {
                        bytes_per_s: by.iter().sum(),
                        bytes_per_s_by_region: by,
                        messages: h.messages,
                    }
                };
                let (collect, fan_out) = (hop(&g.collect), hop(&g.fan_out));
                HopsReport {
                    in_region_bytes_per_s: collect.bytes_per_s + fan_out.bytes_per_s,
                    collect,
                    relay: hop(&g.relay),
                    fan_out,
                    direct: hop(&g.direct),
                    forward: (sc.gossip.fanout > 0).then(|| hop(&g.forward)),
                }
            }),
        },
        heals: heals
            .iter()
            .map(|h| HealReport {
                at_s: secs(h.at),
                converged_after_s: h.done.map(|d| secs(d - h.at)),
                keys: h.keys,
                moot: h.moot,
            })
            .collect(),
        rules,
        series: series_out,
        calls,
    }
}

fn rules_out_calls(sc: &Scenario, m: &Metrics) -> Vec<CallsSeries> {
    sc.domain()
        .rules
        .iter()
        .enumerate()
        .filter_map(|(i, rule)| {
            let h = m.hot.get(i)?;
            if h.requests == 0 {
                return None;
            }
            let per_s = m.calls_per_s.get(i)?;
            Some(CallsSeries {
                rule: rule.id.to_string(),
                mean: h.store_calls as f64 / h.requests as f64,
                seconds: per_s
                    .iter()
                    .enumerate()
                    .filter(|(_, (n, _))| *n > 0)
                    .map(|(t, (n, c))| (t as u64, *n, *c))
                    .collect(),
            })
        })
        .collect()
}

mod render;
pub use render::{
    RULES_CSV_HEADER, calls_csv, json, pad, rule_csv, summary_csv, table, thousands, trim,
    windows_csv,
};
