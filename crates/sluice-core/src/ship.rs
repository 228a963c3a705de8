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
use crate::time::{MILLI, Micros};
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
        Kind::SlidingLog | Kind::Concurrency => None,
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
    /// 60,000 entry bytes (under chitchat's ~64 KB delta with room for framing), no entry
    /// bound, re-ship unchanged figures every 5 s.
    fn default() -> Self {
        Budget {
            max_bytes: 60_000,
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

    fn due(&self, now: Micros, resend_after: Micros) -> bool {
        match self.shipped {
            None => self.figure > 0,
            Some(s) => {
                self.figure > s || (resend_after > 0 && now >= self.shipped_at + resend_after)
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
mod tests {
    use super::*;
    use crate::algo::{Rate, Window};
    use crate::time::SECOND;

    const MIN: Micros = 60 * SECOND;

    fn fixed(limit: u64) -> Params {
        Params::FixedWindow {
            limit,
            window: Window::Epoch(MIN),
        }
    }

    /// What [`observed`] would give for a region figure `figure`, busy on `busy`, against
    /// `pct` percent.
    fn ob(figure: u64, busy: u64, pct: u8) -> Observed {
        Observed {
            figure,
            busy,
            rank: busy,
            threshold: Threshold::percent(pct),
            generation: 0,
        }
    }

    fn unbounded() -> Budget {
        Budget {
            max_bytes: usize::MAX,
            max_entries: usize::MAX,
            resend_after: 0,
        }
    }

    #[test]
    fn only_busy_changed_figures_ship() {
        let mut u = LocalUsage::new(0);
        let p = fixed(1000);
        u.observe("quiet", &p, 1, ob(100, 100, 10)); // exactly 10%: not above
        u.observe("busy", &p, 1, ob(101, 101, 10));
        let b = u.select(2, &unbounded());
        assert_eq!(b.entries.len(), 1);
        assert_eq!(b.entries[0].key, "busy");
        assert_eq!(b.quiet, 1);
        // Unchanged: nothing to send.
        assert!(u.select(3, &unbounded()).entries.is_empty());
        u.observe("busy", &p, 4, ob(150, 150, 10));
        assert_eq!(u.select(5, &unbounded()).entries[0].count, 150);
        // A threshold of 0 shares every key with any usage.
        u.observe("quiet", &p, 6, ob(100, 100, 0));
        assert_eq!(u.select(7, &unbounded()).entries[0].key, "quiet");
    }

    #[test]
    fn quiet_keys_are_not_held() {
        let mut u = LocalUsage::new(0);
        for i in 0..1000 {
            u.observe(&format!("k{i}"), &fixed(1000), 1, ob(50, 50, 10));
        }
        assert!(u.is_empty());
        // Once busy, the key is tracked, and its next window too (quiet or not); the
        // window that ended is dropped.
        u.observe("k1", &fixed(1000), 2, ob(150, 150, 10));
        assert_eq!(u.len(), 1);
        u.observe("k1", &fixed(1000), MIN + 1, ob(3, 3, 10));
        assert_eq!(u.len(), 1);
        let b = u.select(MIN + 2, &unbounded());
        assert_eq!(b.entries.len(), 0, "window 0 is over, window 1 is quiet");
        assert_eq!(b.quiet, 1000 + 1);
    }

    #[test]
    fn nearest_the_limit_first_and_the_rest_deferred() {
        let mut u = LocalUsage::new(0);
        u.observe("a", &fixed(1000), 1, ob(200, 200, 10)); // 20%
        u.observe("b", &fixed(100), 1, ob(90, 90, 10)); // 90%
        u.observe("c", &fixed(1000), 1, ob(500, 500, 10)); // 50%
        let budget = Budget {
            max_entries: 2,
            ..unbounded()
        };
        let b = u.select(2, &budget);
        let keys: Vec<&str> = b.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["b", "c"]);
        assert_eq!(b.deferred, 1);
        // The deferred one goes next interval.
        let b = u.select(3, &budget);
        assert_eq!(b.entries[0].key, "a");
        assert_eq!(b.deferred, 0);
    }

    #[test]
    fn the_byte_budget_bounds_an_interval() {
        let mut u = LocalUsage::new(0);
        for i in 0..1000 {
            u.observe(&format!("sl:{{k{i}}}:r"), &fixed(100), 1, ob(50, 50, 10));
        }
        let budget = Budget {
            max_bytes: 1_000,
            ..unbounded()
        };
        let b = u.select(2, &budget);
        assert!(b.bytes <= 1_000);
        assert_eq!(b.entries.len() + b.deferred, 1000);
        assert_eq!(
            b.bytes,
            b.entries.iter().map(ShipEntry::bytes).sum::<usize>()
        );
    }

    #[test]
    fn unchanged_figures_are_resent_after_a_while() {
        let mut u = LocalUsage::new(0);
        u.observe("k", &fixed(100), 1, ob(50, 50, 10));
        let budget = Budget {
            resend_after: SECOND,
            ..unbounded()
        };
        assert_eq!(u.select(10, &budget).entries.len(), 1);
        assert!(u.select(SECOND, &budget).entries.is_empty());
        assert_eq!(u.select(SECOND + 10, &budget).entries.len(), 1);
    }

    #[test]
    fn resend_all_ships_unchanged_busy_figures_again() {
        let mut u = LocalUsage::new(0);
        u.observe("busy", &fixed(100), 1, ob(50, 50, 10));
        u.observe("quiet", &fixed(100), 1, ob(5, 5, 10));
        assert_eq!(u.select(2, &unbounded()).entries.len(), 1);
        assert!(u.select(3, &unbounded()).entries.is_empty());
        u.resend_all();
        let b = u.select(4, &unbounded());
        assert_eq!(b.entries.len(), 1);
        assert_eq!(b.entries[0].key, "busy");
    }

    #[test]
    fn windows_roll_and_expire() {
        let mut u = LocalUsage::new(0);
        let p = fixed(100);
        u.observe("k", &p, 1, ob(50, 50, 10));
        u.observe("k", &p, MIN + 1, ob(20, 20, 10));
        // The old window is over: only the new one ships.
        let b = u.select(MIN + 2, &unbounded());
        assert_eq!(b.entries.len(), 1);
        assert_eq!(b.entries[0].window_start, MIN);
        assert_eq!(u.len(), 1);
        // A sliding window's previous count still matters after it rolls.
        let s = Params::SlidingWindow {
            limit: 100,
            window: MIN,
        };
        u.observe("s", &s, MIN - 1, ob(60, 60, 10));
        u.observe("s", &s, MIN + 1, ob(1, 1, 10));
        let b = u.select(MIN + 2, &unbounded());
        assert!(
            b.entries
                .iter()
                .any(|e| e.key == "s" && e.window_start == 0 && e.count == 60)
        );
        assert_eq!(u.select(3 * MIN, &unbounded()).entries.len(), 0);
        assert!(u.is_empty());
    }

    #[test]
    fn buckets_ship_cumulative_figures_by_depletion() {
        let mut u = LocalUsage::new(0);
        let p = Params::TokenBucket {
            rate: Rate::per_second(10),
            burst: 100,
        };
        u.observe("b", &p, 1, ob(500, 50, 10));
        u.observe("b", &p, 2, ob(480, 5, 10)); // figures never go down; depletion may
        let b = u.select(3, &unbounded());
        assert!(b.entries.is_empty(), "5% drained is not busy");
        u.observe("b", &p, 4, ob(530, 40, 10));
        let b = u.select(5, &unbounded());
        assert_eq!(
            b.entries,
            vec![ShipEntry {
                key: "b".into(),
                window_start: 0,
                count: 530
            }]
        );
    }

    fn outcome(limit: u64, remaining: u64, usage: u64) -> Outcome {
        Outcome {
            allowed: true,
            limit,
            remaining,
            reset: 0,
            retry_after: 0,
            window: MIN,
            usage,
            generation: 0,
        }
    }

    fn rule(on: BusyOn, regions: usize) -> BusyRule {
        BusyRule { on, regions }
    }

    #[test]
    fn what_is_recorded_per_algorithm() {
        // A window saw 70 (30 of them remote), the region counted 40.
        let w = outcome(100, 30, 40);
        let rec = |p: &Params, o: &Outcome, on| {
            observed(p, o, rule(on, 4), 10).map(|r| (r.figure, r.busy, r.rank, r.threshold.ppm()))
        };
        for p in [
            fixed(100),
            Params::SlidingWindow {
                limit: 100,
                window: MIN,
            },
        ] {
            assert_eq!(
                rec(&p, &w, BusyOn::RegionCount),
                Some((40, 40, 40, 100_000))
            );
            assert_eq!(rec(&p, &w, BusyOn::SeenCount), Some((40, 70, 70, 100_000)));
            // Heard of (the decision saw more than the region's count): always shipped.
            assert_eq!(rec(&p, &w, BusyOn::Heard), Some((40, 40, 70, 0)));
            let alone = outcome(100, 60, 40);
            assert_eq!(rec(&p, &alone, BusyOn::Heard), Some((40, 40, 40, 100_000)));
            // A quarter of the threshold in each of 4 regions.
            assert_eq!(rec(&p, &w, BusyOn::RegionShare), Some((40, 40, 40, 25_000)));
            assert_eq!(rec(&p, &w, BusyOn::SeenShare), Some((40, 70, 70, 25_000)));
        }
        // A bucket ships the store's `used`, is ranked on how drained it is, and is busy on
        // how drained it is, on `used` with `region_share`, on the larger with `seen_share`.
        let b = outcome(100, 25, 500);
        for p in [
            Params::TokenBucket {
                rate: Rate::per_second(10),
                burst: 100,
            },
            Params::Gcra {
                rate: Rate::per_second(10),
                burst: 100,
            },
        ] {
            for on in [BusyOn::RegionCount, BusyOn::SeenCount, BusyOn::Heard] {
                assert_eq!(rec(&p, &b, on), Some((500, 75, 75, 100_000)));
            }
            assert_eq!(
                rec(&p, &b, BusyOn::RegionShare),
                Some((500, 500, 75, 25_000))
            );
            assert_eq!(rec(&p, &b, BusyOn::SeenShare), Some((500, 500, 75, 25_000)));
            let fresh = outcome(100, 25, 3);
            assert_eq!(
                rec(&p, &fresh, BusyOn::SeenShare),
                Some((3, 75, 75, 25_000))
            );
        }
        let log = Params::SlidingLog {
            limit: 100,
            window: MIN,
        };
        assert_eq!(rec(&log, &w, BusyOn::RegionCount), None);
    }

    /// What one region leaves unshipped of a window: the most it can count without its key
    /// becoming busy, for a 1,000 limit at 10%.
    fn hidden(on: BusyOn, regions: usize) -> u64 {
        let mut u = LocalUsage::new(0);
        let p = fixed(1000);
        for c in 1..=1000 {
            let o =
                observed(&p, &outcome(1000, 1000 - c, c), rule(on, regions), 10).expect("shared");
            u.observe("k", &p, 1, o);
            if !u.select(2, &unbounded()).entries.is_empty() {
                return c - 1;
            }
        }
        1000
    }

    #[test]
    fn region_share_hides_under_the_threshold_in_all_regions() {
        for regions in [1, 3, 10, 30, 200] {
            let h = hidden(BusyOn::RegionShare, regions);
            assert_eq!(h, 100 / regions as u64, "{regions} regions");
            assert_eq!(hidden(BusyOn::SeenShare, regions), h, "{regions} regions");
            // All the other regions together: under θ × L for any number of regions,
            // where the region's own count hides (R − 1) × θ × L.
            assert!((regions as u64 - 1) * h < 100, "{regions} regions");
            assert_eq!(hidden(BusyOn::RegionCount, regions), 100);
        }
        // The default is a bounded rule; a threshold of 0 splits to 0.
        assert_eq!(BusyOn::default(), BusyOn::SeenShare);
        assert_eq!(
            rule(BusyOn::RegionShare, 3).threshold(0),
            Threshold::percent(0)
        );
        assert_eq!(
            rule(BusyOn::RegionShare, 0).threshold(10),
            Threshold::percent(10)
        );
    }

    #[test]
    fn a_key_heard_of_stays_shipped_for_its_window() {
        let mut u = LocalUsage::new(0);
        let p = fixed(1000);
        let heard = rule(BusyOn::Heard, 3);
        // 5 of the region's own after 300 from elsewhere: shipped though far under 10%.
        u.observe(
            "k",
            &p,
            1,
            observed(&p, &outcome(1000, 695, 5), heard, 10).expect("w"),
        );
        assert_eq!(u.select(2, &unbounded()).entries[0].count, 5);
        // The remote figure gone from the view (expired elsewhere), the key still ships.
        u.observe(
            "k",
            &p,
            3,
            observed(&p, &outcome(1000, 994, 6), heard, 10).expect("w"),
        );
        assert_eq!(u.select(4, &unbounded()).entries[0].count, 6);
        // The next window starts quiet.
        u.observe(
            "k",
            &p,
            MIN + 1,
            observed(&p, &outcome(1000, 999, 1), heard, 10).expect("w"),
        );
        assert!(u.select(MIN + 2, &unbounded()).entries.is_empty());
    }

    #[test]
    fn observations_are_the_global_rules_the_store_answered() {
        use crate::batch::CallResult;
        use crate::decision::plan;
        use crate::matching::Descriptors;
        let set = crate::rules::parse_yaml(
            r#"
domain: d
rules:
  - { id: g, key: [k], algorithm: token_bucket, rate_per_s: 10, burst: 100, scope: global }
  - { id: r, key: [k], algorithm: fixed_window, limit: 10, window: 1m }
  - { id: u, key: [u], algorithm: fixed_window, limit: 10, window: 1m, scope: global }
"#,
        )
        .expect("valid");
        let dom = set.domain("d").expect("domain");
        let desc = Descriptors::new(vec![("k".into(), "a".into()), ("u".into(), "b".into())])
            .expect("valid");
        let p = plan(dom, &desc, MIN, 1, "r", |_| crate::Remote::default());
        assert_eq!(p.calls.len(), 2, "one call per identity");
        let done = |pc: &crate::decision::PlannedCall| {
            crate::decision::Answer::Done(CallResult {
                allowed: true,
                outcomes: pc
                    .rules
                    .iter()
                    .map(|&ai| match &*p.applied[ai].rule.id {
                        "g" => outcome(100, 90, 7),
                        _ => outcome(10, 6, 4),
                    })
                    .collect(),
            })
        };
        let ids = |answers: &[crate::decision::Answer]| -> Vec<(String, u64, u64)> {
            observations(&p, answers, rule(BusyOn::RegionCount, 3), None)
                .map(|(a, o)| (a.rule.id.to_string(), o.figure, o.busy))
                .collect()
        };
        let answers: Vec<_> = p.calls.iter().map(done).collect();
        // The region rule is not shipped.
        assert_eq!(ids(&answers), vec![("g".into(), 7, 10), ("u".into(), 4, 4)]);
        // A failed call's rules are not region figures (the second call is `u`'s identity).
        let failed = vec![
            answers[0].clone(),
            crate::decision::Answer::Failed { local: None },
        ];
        assert_eq!(ids(&failed), vec![("g".into(), 7, 10)]);
    }

    #[test]
    fn sizes_follow_protobuf() {
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(127), 1);
        assert_eq!(varint_len(128), 2);
        assert_eq!(varint_len(u64::MAX), 10);
        // 1,700,000,000,000 ms needs 41 bits: 6 bytes.
        let e = entry_bytes("sl:{a}:r", 1_700_000_000_000 * MILLI, 300);
        assert_eq!(e, 1 + 1 + (1 + 1 + 8) + (1 + 6) + (1 + 2));
        assert_eq!(entry_bytes("k", 0, 0), 1 + 1 + 3);
    }
}
