//! Busy-key selection for the delta shipper: which of this region's global figures to send
//! to the other regions this interval.
//!
//! Every decision on a global rule tells the shipper the region's figure for that key (the
//! `usage` of its [`crate::Outcome`] for windows: the count the region's store returned; or
//! the region's cumulative consumption for buckets). [`LocalUsage`] keeps the latest figure
//! per `(key, window)`, and once per interval [`LocalUsage::select`] picks what to ship:
//!
//! - only *busy* keys: by default ([`BusyOn::SeenShare`]) those whose count as the decision
//!   saw it (local + remote) is above `share_threshold / regions` of the limit. Quiet keys are never shared; that is the
//!   threshold's blind spot, under `share_threshold × limit` in all however many regions
//!   there are, on top of the sync delay (docs/regions.md, docs/accuracy.md measures it).
//!   Quiet keys are not even tracked: what a daemon holds grows with its busy keys;
//! - only figures that changed since they were last shipped, plus unchanged busy ones whose
//!   last shipment is older than `resend_after` (anti-entropy: a lost message is otherwise
//!   only repaired by the next change);
//! - nearest their limit first, up to a byte and entry budget per interval (chitchat pushes
//!   about one ~64 KB delta per round; a larger backlog would lag without bound). What does
//!   not fit is *deferred*: it stays dirty and competes again next interval, and its number is
//!   reported for a metric.
//!
//! Sizes are estimated as a compact protobuf would encode them ([`entry_bytes`],
//! [`message_bytes`]); the gossip crate's real encoding is its own, the estimate is what the
//! budget and the simulator's bytes/s use.

use crate::algo::{Kind, Outcome, Params};
use crate::decision::{Answer, Plan};
use crate::hash::{InlineKey, Keyed, KeyedMap};
use crate::matching::Applied;
use crate::merge::figure_window;
use crate::rules::Scope;
use crate::time::{MILLI, Micros, stepped_back};
use serde::{Deserialize, Serialize};

/// What a key's share threshold is judged on: a setting of the daemon (`gossip.busy_on`)
/// and of a simulation (`[gossip] busy_on`), one type so both record alike.
///
/// Worst cases per window of a global rule with limit `L` (a bucket's burst), threshold `θ`
/// and `R` regions, on top of the sync delay (docs/regions.md derives them):
/// [`BusyOn::RegionShare`] and [`BusyOn::SeenShare`] `L × (1 + θ × (R − 1) / R)`, under
/// `(1 + θ) × L` for any `R`; the three others `L + (R − 1) × θ × L`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BusyOn {
    /// The count the decision saw, this region's plus the others' figures, against `θ / R`
    /// of the limit (the default). A region ships a key once it holds more than its share of
    /// the threshold, so what the regions leave unshipped adds up to under `θ × L` however
    /// many they are; and a region that hears of a key busy elsewhere ships its own small
    /// count too. Buckets are judged on the larger of the region's cumulative consumption
    /// and the drain.
    #[default]
    SeenShare,
    /// The region's own figure against `θ / R`: the same bound as `seen_share`, fewer bytes,
    /// but a region's count under its share stays unshipped even when the key is busy
    /// elsewhere. Buckets are judged on the region's cumulative consumption.
    RegionShare,
    /// The region's own count against `θ` of the limit (the default before `seen_share`):
    /// traffic kept under the threshold in every region is never shared.
    RegionCount,
    /// The count the decision saw against `θ`: a region held back by the others' figures
    /// ships its own small count, but a key quiet everywhere is never shared.
    SeenCount,
    /// The region's own count against `θ`, and every key another region's figure weighed in
    /// on (once any region ships a key, every region deciding on it ships it too).
    Heard,
}

/// A share of a limit, in parts per million: the threshold a figure must pass to be shipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Threshold(u32);

impl Threshold {
    /// A rule's `share_threshold` in percent, as is.
    pub const fn percent(pct: u8) -> Threshold {
        Threshold(pct as u32 * 10_000)
    }

    /// Parts per million of the limit.
    pub const fn ppm(self) -> u32 {
        self.0
    }
}

/// How a shipper judges keys busy: the rule and the number of regions sharing the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusyRule {
    /// What the threshold is judged on.
    pub on: BusyOn,
    /// Regions sharing global limits, at least 1 (the daemon: the regions its membership
    /// lists, or `gossip.regions` if more; a simulation: its regions).
    pub regions: usize,
}

impl BusyRule {
    /// The threshold a figure of a rule whose `share_threshold` is `pct` percent must pass:
    /// `pct / regions` for [`BusyOn::SeenShare`] and [`BusyOn::RegionShare`], `pct`
    /// otherwise.
    pub fn threshold(&self, pct: u8) -> Threshold {
        let t = Threshold::percent(pct);
        match self.on {
            BusyOn::RegionShare | BusyOn::SeenShare => Threshold(t.0 / self.regions.max(1) as u32),
            _ => t,
        }
    }
}

/// What the delta shipper records of one global rule's outcome ([`LocalUsage::observe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The figure shipped: the region's count in the window, or a bucket's cumulative `used`.
    pub figure: u64,
    /// What the threshold is judged on.
    pub busy: u64,
    /// How near its limit the key is, for the shipping order: the count the decision saw
    /// (local + remote) for buckets, `busy` for windows.
    pub rank: u64,
    /// The share of the limit `busy` must pass (0 for a key heard of, with [`BusyOn::Heard`]).
    pub threshold: Threshold,
    /// A bucket figure's generation label ([`Outcome::generation`]), shipped as its window
    /// start; 0 for windows (their window comes from the decision's `now`).
    pub generation: Micros,
}

impl Observed {
    /// A window's count `c` against `pct` percent: figure, busy and rank all `c`.
    pub fn count(c: u64, pct: u8) -> Observed {
        Observed {
            figure: c,
            busy: c,
            rank: c,
            threshold: Threshold::percent(pct),
            generation: 0,
        }
    }
}

/// The figure, busy value and threshold a store's `outcome` for a global rule whose
/// `share_threshold` is `pct` percent gives its shipper, or `None` for algorithms whose
/// counts are not shared (sliding log, concurrency).
///
/// Windows ship the region's count (`usage`) and are busy on it or, with
/// [`BusyOn::SeenCount`] and [`BusyOn::SeenShare`], on the count the decision saw
/// (`limit − remaining`). Buckets ship the store's cumulative `used` (`usage` of a shared
/// bucket: the decision's remote figure came from
/// [`crate::merge::RemoteCounts::remote_for`]); with [`BusyOn::RegionShare`] they are busy on
/// it, with [`BusyOn::SeenShare`] on the larger of it and how drained the bucket is
/// (`limit − remaining`, remote drain included), otherwise on the drain. A bucket's outcome does not say whether a remote figure weighed in, so
/// [`BusyOn::Heard`] judges buckets as [`BusyOn::RegionCount`] does.
pub fn observed(params: &Params, outcome: &Outcome, rule: BusyRule, pct: u8) -> Option<Observed> {
    let seen = outcome.limit.saturating_sub(outcome.remaining);
    let threshold = rule.threshold(pct);
    match params.kind() {
        Kind::FixedWindow | Kind::SlidingWindow => {
            let busy = match rule.on {
                BusyOn::SeenCount | BusyOn::SeenShare => seen,
                _ => outcome.usage,
            };
            // A decision that saw more than the region's count weighed a remote figure.
            let heard = rule.on == BusyOn::Heard && seen > outcome.usage;
            Some(Observed {
                figure: outcome.usage,
                busy,
                rank: busy.max(seen * u64::from(heard)),
                threshold: if heard { Threshold(0) } else { threshold },
                generation: 0,
            })
        }
        Kind::TokenBucket | Kind::Gcra => Some(Observed {
            figure: outcome.usage,
            busy: match rule.on {
                BusyOn::RegionShare => outcome.usage,
                BusyOn::SeenShare => outcome.usage.max(seen),
                _ => seen,
            },
            rank: seen,
            threshold,
            generation: outcome.generation,
        }),
        Kind::SlidingLog | Kind::Concurrency | Kind::LeakyQueue => None,
    }
}

/// Every global rule of a decision the shared store answered, with what its shipper records:
/// the daemon and the simulator feed their [`LocalUsage`] from this, and nothing else.
/// `threshold_pct` overrides every rule's `share_threshold` (a simulation's setting).
///
/// Failed calls are skipped (a local bucket's answer is no region figure), as are region
/// rules and unshared algorithms.
pub fn observations<'p, 'a>(
    plan: &'p Plan<'a>,
    answers: &'p [Answer],
    rule: BusyRule,
    threshold_pct: Option<u8>,
) -> impl Iterator<Item = (&'p Applied<'a>, Observed)> + 'p {
    plan.calls
        .iter()
        .zip(answers)
        .filter_map(|(pc, ans)| match ans {
            Answer::Done(res) => Some((pc, res)),
            Answer::Failed { .. } => None,
        })
        .flat_map(move |(pc, res)| {
            pc.rules
                .iter()
                .zip(&res.outcomes)
                .filter_map(move |(&ai, o)| {
                    let a = plan.applied.get(ai)?;
                    if a.rule.scope != Scope::Global {
                        return None;
                    }
                    let pct = threshold_pct.unwrap_or(a.rule.share_threshold_pct);
                    Some((a, observed(&a.params, o, rule, pct)?))
                })
        })
}

/// One figure to send: the region's `count` for `key` in the window starting at
/// `window_start` (for a cumulative bucket figure, its generation's label).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShipEntry {
    /// Store key ([`crate::keys`]): the receiver finds the rule from it.
    pub key: String,
    /// Window start, epoch microseconds (whole milliseconds for every rule the validator
    /// accepts); for a bucket its generation's birth (whole milliseconds; 0 unlabelled).
    pub window_start: Micros,
    /// The figure.
    pub count: u64,
}

impl ShipEntry {
    /// Its estimated bytes in a shipment ([`entry_bytes`]): what budgets count.
    pub fn bytes(&self) -> usize {
        entry_bytes(&self.key, self.window_start, self.count)
    }
}

/// What one interval may ship.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Most entry bytes per interval (as estimated by [`entry_bytes`]).
    pub max_bytes: usize,
    /// Most entries per interval.
    pub max_entries: usize,
    /// Re-ship an unchanged busy figure once its last shipment is this old (0: never).
    pub resend_after: Micros,
}

impl Default for Budget {
    /// 8,000,000 entry bytes (about 6,000 datagrams of 1,400 bytes: a bound against a
    /// runaway shipment, not a rate the links are expected to carry), no entry bound,
    /// re-ship unchanged figures every 5 s. The daemon's and the simulator's defaults are
    /// this one value.
    fn default() -> Self {
        Budget {
            max_bytes: 8_000_000,
            max_entries: usize::MAX,
            resend_after: 5_000 * MILLI,
        }
    }
}

/// One interval's selection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// What to send, nearest their limit first.
    pub entries: Vec<ShipEntry>,
    /// Estimated bytes of the entries (without the message header: see [`message_bytes`]).
    pub bytes: usize,
    /// Busy, changed figures that did not fit the budget.
    pub deferred: usize,
    /// Observations under the threshold since the last selection (not tracked, not
    /// shipped), plus tracked figures that changed but fell under it.
    pub quiet: usize,
}

#[derive(Clone, Debug)]
struct Tracked {
    start: Micros,
    expires: Micros,
    figure: u64,
    busy: u64,
    rank: u64,
    limit: u64,
    threshold: Threshold,
    shipped: Option<u64>,
    shipped_at: Micros,
}

/// busy / limit > threshold, in integers.
fn above(busy: u64, limit: u64, threshold: Threshold) -> bool {
    u128::from(busy) * 1_000_000 > u128::from(limit) * u128::from(threshold.ppm())
}

impl Tracked {
    fn is_busy(&self) -> bool {
        above(self.busy, self.limit, self.threshold)
    }

    /// Due when new, risen, or shipped `resend_after` ago (or before a clock that has
    /// since [`stepped_back`]).
    fn due(&self, now: Micros, resend_after: Micros) -> bool {
        match self.shipped {
            None => self.figure > 0,
            Some(s) => {
                self.figure > s
                    || (resend_after > 0
                        && (stepped_back(now, self.shipped_at, 0)
                            || now >= self.shipped_at + resend_after))
            }
        }
    }
}

/// This region's latest figures for global keys, as one daemon observed them.
#[derive(Clone, Debug)]
pub struct LocalUsage {
    keys: KeyedMap<InlineKey, Vec<Tracked>>,
    quiet_seen: usize,
}

impl LocalUsage {
    /// An empty table, hashed with [`Keyed`] under `seed` (keys come from clients: the
    /// daemon passes a secret drawn from OS randomness, a simulation one from its seed).
    /// Nothing depends on the map's order: [`LocalUsage::select`] sorts what it ships.
    pub fn new(seed: u64) -> LocalUsage {
        LocalUsage {
            keys: KeyedMap::with_hasher(Keyed::new(seed)),
            quiet_seen: 0,
        }
    }

    /// Records a decision's figure for a global rule's key at `now`: what
    /// [`observed`] made of its outcome. `figure` is what gets shipped, `busy` what the
    /// threshold is judged on, `rank` the shipping order. Rules whose counts are not shared
    /// (sliding log, concurrency) are ignored.
    pub fn observe(&mut self, key: &str, params: &Params, now: Micros, o: Observed) {
        let Observed {
            figure,
            busy,
            rank,
            threshold,
            generation,
        } = o;
        let Some(mut fw) = figure_window(params, now) else {
            return;
        };
        if fw.cumulative {
            // A bucket's figure is tracked per generation: a restarted key's figures go
            // under their own label, never max-merged with the old generation's.
            fw.start = generation;
        }
        let limit = params.limit();
        let windows = match self.keys.get_mut(key.as_bytes()) {
            Some(w) => w,
            None if !above(busy, limit, threshold) => {
                // A quiet key is not tracked: its figure is the store's (an absolute count,
                // or cumulative consumption), so the next decision reports it whole again.
                // What a daemon holds grows with its busy keys, not with every key it saw.
                self.quiet_seen += 1;
                return;
            }
            None => self
                .keys
                .entry(InlineKey::from_slice(key.as_bytes()))
                .or_default(),
        };
        if let Some(t) = windows.iter_mut().find(|t| t.start == fw.start) {
            t.figure = t.figure.max(figure);
            if fw.cumulative {
                t.busy = busy;
                t.rank = rank;
            } else {
                t.busy = t.busy.max(busy);
                t.rank = t.rank.max(rank);
            }
            t.limit = limit;
            // A key heard of stays shipped for the window (a threshold of 0 is sticky).
            t.threshold = if fw.cumulative {
                threshold
            } else {
                t.threshold.min(threshold)
            };
            t.expires = t.expires.max(fw.expires);
            return;
        }
        windows.retain(|t| t.expires > now);
        if windows.len() >= 2
            && let Some(i) = windows
                .iter()
                .enumerate()
                .min_by_key(|(_, t)| t.start)
                .map(|(i, _)| i)
        {
            windows.swap_remove(i);
        }
        windows.push(Tracked {
            start: fw.start,
            expires: fw.expires,
            figure,
            busy,
            rank,
            limit,
            threshold,
            shipped: None,
            shipped_at: 0,
        });
    }

    /// Picks this interval's entries (see the module docs) and marks them shipped. Drops
    /// figures whose windows are over.
    pub fn select(&mut self, now: Micros, budget: &Budget) -> Batch {
        let mut batch = Batch {
            quiet: std::mem::take(&mut self.quiet_seen),
            ..Batch::default()
        };
        // Keys as bytes: they went in as `str`, and bytes sort as the `str` would.
        let mut due: Vec<(&[u8], &mut Tracked)> = Vec::new();
        self.keys.retain(|_, w| {
            w.retain(|t| t.expires > now);
            !w.is_empty()
        });
        for (k, windows) in self.keys.iter_mut() {
            for t in windows.iter_mut() {
                if !t.due(now, budget.resend_after) {
                    continue;
                }
                if t.is_busy() {
                    due.push((k.as_slice(), t));
                } else if t.shipped.is_none_or(|s| t.figure > s) {
                    batch.quiet += 1;
                }
            }
        }
        // Nearest the limit first (largest rank/limit); ties by key and window, so the
        // choice does not depend on the map's order.
        due.sort_by(|(ka, a), (kb, b)| {
            (u128::from(b.rank) * u128::from(a.limit))
                .cmp(&(u128::from(a.rank) * u128::from(b.limit)))
                .then_with(|| ka.cmp(kb))
                .then_with(|| a.start.cmp(&b.start))
        });
        for (k, t) in due {
            let k = String::from_utf8_lossy(k);
            let size = entry_bytes(&k, t.start, t.figure);
            if batch.entries.len() >= budget.max_entries || batch.bytes + size > budget.max_bytes {
                batch.deferred += 1;
                continue;
            }
            batch.bytes += size;
            t.shipped = Some(t.figure);
            t.shipped_at = now;
            batch.entries.push(ShipEntry {
                key: k.into_owned(),
                window_start: t.start,
                count: t.figure,
            });
        }
        batch
    }

    /// Forgets what was shipped: every busy figure goes again at the next
    /// [`LocalUsage::select`]. Call it when a peer region comes back (a healed partition, a
    /// region restarting with empty tables): it may have missed figures that no longer
    /// change, which would otherwise reach it only after `resend_after`.
    pub fn resend_all(&mut self) {
        for t in self.keys.values_mut().flatten() {
            t.shipped = None;
        }
    }

    /// `(key, window)` figures held.
    pub fn len(&self) -> usize {
        self.keys.values().map(Vec::len).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Bytes of a protobuf varint.
pub fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros()).div_ceil(7) as usize
}

/// Estimated bytes of one entry as a compact protobuf encodes it:
///
/// ```text
/// message Entry { bytes key = 1; uint64 window_start_ms = 2; uint64 count = 3; }
/// ```
///
/// repeated inside the message: a tag and a length prefix around the entry, a tag and a length
/// before the key, a tag before each varint, and zero fields left out (proto3). Window starts
/// travel in milliseconds (6 bytes for today's epoch). Compression is not counted: keys of one
/// rule share long prefixes, so a compressing transport sends less.
pub fn entry_bytes(key: &str, window_start: Micros, count: u64) -> usize {
    let ms = window_start / MILLI;
    let mut inner = 1 + varint_len(key.len() as u64) + key.len();
    if ms > 0 {
        inner += 1 + varint_len(ms);
    }
    if count > 0 {
        inner += 1 + varint_len(count);
    }
    1 + varint_len(inner as u64) + inner
}

/// Estimated bytes of one shipped message from `region` carrying `entry_bytes` of entries:
/// a format version (2), the region name (2 + length), a sequence number (up to 6) and the
/// send time in milliseconds (7), then the entries.
pub fn message_bytes(region: &str, entry_bytes: usize) -> usize {
    2 + 2 + region.len() + 6 + 7 + entry_bytes
}

#[cfg(test)]
mod tests;
