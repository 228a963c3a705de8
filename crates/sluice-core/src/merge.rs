//! The merge layer: what other regions reported for global rules, and the remote figure a
//! decision adds to its local count.
//!
//! Every region ships, for each busy global key, one *figure* per window: the region's count
//! in that window (fixed and sliding windows), or the cumulative units the region consumed
//! (token bucket, GCRA). Figures only grow for a given `(region, key, window)`, so the merge is
//! a max: a lost message is repaired by the next one, a repeated or reordered one changes
//! nothing, and the order in which two regions' messages arrive does not matter (the merge is
//! commutative, associative and idempotent; the property tests below hold it to that).
//!
//! [`RemoteCounts`] holds, per store key, one slot per `(region, window start)`: what a daemon
//! holds grows with the number of *regions* and busy keys, never with the number of daemons
//! elsewhere, because every daemon of a region ships the same region-level figure (the count
//! its region's store returned) and the receiver keeps the max.
//!
//! [`RemoteCounts::remote_for`] turns the table into the [`Remote`] a decision on a global
//! rule's key takes. It is the one place that says what that figure is: the daemon (through
//! its gossip node) and the simulator both plan with it.
//!
//! - fixed window: `cur` = Σ other regions' counts of the window holding `now`;
//! - sliding window: `cur` and `prev` = Σ counts of the current and the previous window;
//! - token bucket, GCRA: `cur` = Σ other regions' cumulative consumption; the bucket state
//!   remembers how much of it it already drained (`seen`), so only the increase costs tokens.
//!   A region's consumption is counted per *generation* of its key (the figure's label is the
//!   key's birth stamp): when a region's key expired and restarted at 0, its last figure of
//!   the older generation is carried as a base under the new one, so the region's part of the
//!   sum never goes down and its new generation is drained from its first unit (see
//!   [`RemoteCounts::merge`]).
//!   The figure is always marked shared ([`Remote::shared_bucket`], heard of or not), so the
//!   store keeps the region's cumulative `used` beside the bucket and answers it as the
//!   outcome's `usage`: the figure the region ships ([`crate::ship::observed`]). It also
//!   carries the number of regions the caller counts, so a key new to this region starts
//!   with its share of the burst ([`Remote::fresh_share`]);
//! - sliding log, concurrency: not shared (they take no remote figure).
//!
//! A region that goes silent keeps its last figures until their windows end: a window slot
//! expires at the end of the last window it can weigh in (a fixed window's end, the end of the
//! *next* window for a sliding window). A cumulative figure has no window; a key's cumulative
//! slots are dropped together once none of them rose for a whole refill period (by then the
//! bucket has refilled what they drained). They are never dropped one at a time, which would
//! make the sum dip and then undercount (the bucket's `seen` would stay above it). A region's
//! base of older generations lives in its slots and goes with them: it is one integer per
//! slot however many times the key restarted (at most two generations per region are held,
//! older ones folded in), and it is kept exactly as long as the figures it sits under, until
//! none of the key's figures rose for a refill period, when every bucket that drained it has
//! refilled it.
//!
//! Nothing here reads a clock: `now` is an argument, as everywhere in the core.

use crate::algo::{Params, Remote};
use crate::hash::{InlineKey, Keyed, KeyedMap};
use crate::time::{MILLI, Micros, SECOND};

/// Where a rule's figure lives in time: which window it belongs to and until when it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FigureWindow {
    /// Start of the window; for a cumulative figure its generation's label (the key's birth,
    /// [`crate::Outcome::generation`]), which [`figure_window`] does not know: 0 there.
    pub start: Micros,
    /// When the figure stops weighing in any decision.
    pub expires: Micros,
    /// A cumulative consumption (token bucket, GCRA) rather than a count per window.
    pub cumulative: bool,
}

/// The window a global rule's figure at `now` belongs to, or `None` for algorithms whose
/// counts are not shared (sliding log, concurrency).
///
/// Both ends use it: the shipper to label what it sends, the receiver (through
/// [`RemoteCounts::merge`]) to know how long to keep it.
pub fn figure_window(params: &Params, now: Micros) -> Option<FigureWindow> {
    match params {
        Params::FixedWindow { window, .. } => {
            let (start, end) = window.bounds(now);
            Some(FigureWindow {
                start,
                expires: end,
                cumulative: false,
            })
        }
        Params::SlidingWindow { window, .. } => {
            let start = now - now % window;
            Some(FigureWindow {
                start,
                expires: start + 2 * window,
                cumulative: false,
            })
        }
        Params::TokenBucket { .. } | Params::Gcra { .. } => Some(FigureWindow {
            start: 0,
            expires: now.saturating_add(params.window()),
            cumulative: true,
        }),
        Params::SlidingLog { .. } | Params::Concurrency { .. } | Params::LeakyQueue { .. } => None,
        // Region scope only (`scope: global` is refused for it).
        Params::FairShare(_) => None,
    }
}

/// The window a reported figure labelled `start` belongs to, checked against the rule.
///
/// `None` when the label cannot be a window start of this rule (misaligned, or more than one
/// window in the future: a sender whose clock is that far ahead is broken).
fn reported_window(params: &Params, start: Micros, now: Micros) -> Option<FigureWindow> {
    match params {
        Params::FixedWindow { window, .. } => {
            let (s, end) = window.bounds(start);
            let ok = s == start && start <= now.saturating_add(window.nominal());
            ok.then_some(FigureWindow {
                start,
                expires: end,
                cumulative: false,
            })
        }
        Params::SlidingWindow { window, .. } => {
            let ok = start.is_multiple_of(*window) && start <= now.saturating_add(*window);
            ok.then_some(FigureWindow {
                start,
                expires: start + 2 * window,
                cumulative: false,
            })
        }
        Params::TokenBucket { .. } | Params::Gcra { .. } => {
            // A generation's label is a birth stamp in whole ms (0: a sender before labels),
            // never far ahead of this clock: a far-future label would make every later true
            // generation look older, and be ignored.
            let ahead = params.window().max(LABEL_AHEAD);
            let ok = start.is_multiple_of(MILLI) && start <= now.saturating_add(ahead);
            ok.then(|| figure_window(params, now))
                .flatten()
                .map(|fw| FigureWindow { start, ..fw })
        }
        Params::SlidingLog { .. } | Params::Concurrency { .. } | Params::LeakyQueue { .. } => None,
        Params::FairShare(_) => None,
    }
}

/// How far ahead of the receiver's clock a bucket generation's label may be (or its refill
/// period, when longer): a sender's clock that much ahead is broken.
pub const LABEL_AHEAD: Micros = 60 * SECOND;

/// What [`RemoteCounts::merge`] did with a report; the gossip layer counts these in metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merged {
    /// A slot was created.
    New,
    /// A slot's figure rose.
    Raised,
    /// Nothing changed: the figure was not above what is held (a repeat, a reordered or an
    /// older window's message).
    Unchanged,
    /// The report came from this daemon's own region (its counts are in the local store).
    OwnRegion,
    /// The window is already over.
    Expired,
    /// The rule's figures are not shared, or the window label is not a window of the rule.
    Rejected,
    /// The table is at its key bound; the report was dropped.
    Full,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    region: u16,
    /// A cumulative figure (token bucket, GCRA), whose `start` is its generation's label.
    cumulative: bool,
    start: Micros,
    count: u64,
    /// Cumulative figures only: older generations of this region carried under this one
    /// (their last figures, summed); 0 for windows.
    base: u64,
    expires: Micros,
}

/// A key's slots, inside the table's own slot: two other regions with two windows each fit
/// without a separate allocation (a cache miss per merge on large tables).
type Slots = smallvec::SmallVec<[Slot; 4]>;

/// Windows a region keeps per key: the current and the previous one (a sliding window weighs
/// both; a fixed window needs one, and the other holds a late report until it expires).
const WINDOWS_PER_REGION: usize = 2;

/// Other regions' latest figures for global rules, as one daemon has heard them.
#[derive(Clone, Debug)]
pub struct RemoteCounts {
    own: u16,
    regions: Vec<Box<str>>,
    keys: KeyedMap<InlineKey, Slots>,
    slots: usize,
    max_keys: usize,
    dropped: u64,
}

impl RemoteCounts {
    /// An empty table for a daemon of region `own`, holding at most `max_keys` keys (reports
    /// for new keys beyond it are dropped and counted: the bound keeps a flood of keys from
    /// exhausting a daemon's memory; dropping undercounts, which shows as overshoot).
    ///
    /// Keys come from other daemons' reports, so the table is hashed with [`Keyed`] under
    /// `seed`: the caller's secret (the daemon draws it from OS randomness; a simulation from
    /// its seed).
    pub fn new(own: &str, max_keys: usize, seed: u64) -> RemoteCounts {
        RemoteCounts {
            own: 0,
            regions: vec![own.into()],
            keys: KeyedMap::with_hasher(Keyed::new(seed)),
            slots: 0,
            max_keys,
            dropped: 0,
        }
    }

    fn region_index(&mut self, region: &str) -> Option<u16> {
        if let Some(i) = self.regions.iter().position(|r| &**r == region) {
            return Some(i as u16);
        }
        if self.regions.len() > usize::from(u16::MAX) {
            return None;
        }
        self.regions.push(region.into());
        Some((self.regions.len() - 1) as u16)
    }

    /// Merges one report: `region` counted `count` for `key` in the window starting at
    /// `start` (for a cumulative figure, its generation's label: the key's birth, 0 from a
    /// sender before labels). Keeps the max per `(region, key, window)`; a cumulative figure
    /// of a newer generation carries the region's older ones as a base (`merge_generation`).
    ///
    /// `params` are the rule's numbers, found by the receiver from the rule id in the key;
    /// they say how long the figure counts and whether `start` is a window of the rule.
    pub fn merge(
        &mut self,
        region: &str,
        key: &str,
        params: &Params,
        start: Micros,
        count: u64,
        now: Micros,
    ) -> Merged {
        let Some(fw) = reported_window(params, start, now) else {
            return Merged::Rejected;
        };
        if fw.expires <= now {
            return Merged::Expired;
        }
        let Some(region) = self.region_index(region) else {
            return Merged::Full;
        };
        if region == self.own {
            return Merged::OwnRegion;
        }
        let full = self.keys.len() >= self.max_keys;
        let slots = match self.keys.get_mut(key.as_bytes()) {
            Some(slots) => slots,
            None if full => {
                self.dropped += 1;
                return Merged::Full;
            }
            None => self
                .keys
                .entry(InlineKey::from_slice(key.as_bytes()))
                .or_default(),
        };
        let before = slots.len();
        let result = if fw.cumulative {
            merge_generation(slots, region, fw, count)
        } else {
            merge_slot(slots, region, fw, count, now)
        };
        self.slots = self.slots + slots.len() - before;
        result
    }

    /// The remote figure a decision on a global rule's `key` adds at `now`, buckets marked
    /// shared by `regions` regions (the regions the caller counts, this one included: a
    /// fresh bucket key starts with its share of the burst, [`Remote::fresh_share`]): see
    /// the module docs. Every caller that plans a global rule uses this one function, so the
    /// daemon and the simulator decide alike.
    pub fn remote_for(&self, key: &str, params: &Params, now: Micros, regions: usize) -> Remote {
        let slots = self.keys.get(key.as_bytes());
        if let Params::TokenBucket { .. } | Params::Gcra { .. } = params {
            // Cumulative: every slot, expired or not. Summing a slot past its expiry costs
            // nothing (the bucket already drained it: `seen` covers it), and not dropping it
            // one at a time keeps the sum from dipping (see the module docs). Shared even
            // before any figure is heard: the region's `used` must count from its first take.
            return Remote::shared_bucket(slots.map_or(0, |s| sum(s, |_| true)), regions);
        }
        let Some(slots) = slots else {
            return Remote::default();
        };
        match params {
            Params::FixedWindow { window, .. } => {
                let (start, _) = window.bounds(now);
                Remote {
                    cur: sum(slots, |s| s.start == start && s.expires > now),
                    prev: 0,
                }
            }
            Params::SlidingWindow { window, .. } => {
                let start = now - now % window;
                Remote {
                    cur: sum(slots, |s| s.start == start),
                    prev: start
                        .checked_sub(*window)
                        .map_or(0, |p| sum(slots, |s| s.start == p)),
                }
            }
            Params::TokenBucket { .. }
            | Params::Gcra { .. }
            | Params::SlidingLog { .. }
            | Params::Concurrency { .. }
            | Params::LeakyQueue { .. }
            | Params::FairShare(_) => Remote::default(),
        }
    }

    /// Drops what no longer counts: window slots past their expiry, and a key's cumulative
    /// slots once all of them expired. Returns the number of slots dropped. The daemon calls
    /// it on a timer; decisions never depend on when it ran.
    pub fn sweep(&mut self, now: Micros) -> usize {
        let mut dropped = 0;
        self.keys.retain(|_, slots| {
            let before = slots.len();
            let cumulative = slots.first().is_some_and(|s| s.cumulative);
            if cumulative {
                if slots.iter().all(|s| s.expires <= now) {
                    slots.clear();
                }
            } else {
                slots.retain(|s| s.expires > now);
            }
            dropped += before - slots.len();
            !slots.is_empty()
        });
        self.slots -= dropped;
        dropped
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Slots held (at most regions × 2 per key).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Reports for new keys dropped at the key bound.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Every slot as `(key, region, window start, figure)`, sorted: for tests, debugging and
    /// an admin endpoint. Not for the hot path.
    pub fn snapshot(&self) -> Vec<(String, String, Micros, u64)> {
        let mut out: Vec<_> = self
            .keys
            .iter()
            .flat_map(|(k, slots)| {
                // Keys went in as `str`: the conversion is lossless.
                let k = String::from_utf8_lossy(k);
                slots.iter().map(move |s| {
                    (
                        k.to_string(),
                        self.regions[usize::from(s.region)].to_string(),
                        s.start,
                        s.count,
                    )
                })
            })
            .collect();
        out.sort();
        out
    }
}

fn sum(slots: &[Slot], keep: impl Fn(&Slot) -> bool) -> u64 {
    slots.iter().filter(|s| keep(s)).fold(0u64, |acc, s| {
        acc.saturating_add(s.count).saturating_add(s.base)
    })
}

/// A figure into the slot it already has: the max.
fn raise(s: &mut Slot, fw: FigureWindow, count: u64) -> Merged {
    if count <= s.count {
        return Merged::Unchanged;
    }
    s.count = count;
    // A cumulative figure that rises is in use: it counts for another refill period.
    s.expires = s.expires.max(fw.expires);
    Merged::Raised
}

/// A figure into a slot of its own (a window or generation not held yet).
fn push_slot(slots: &mut Slots, region: u16, fw: FigureWindow, count: u64) -> Merged {
    slots.push(Slot {
        region,
        cumulative: fw.cumulative,
        start: fw.start,
        count,
        base: 0,
        expires: fw.expires,
    });
    if count == 0 {
        Merged::Unchanged
    } else {
        Merged::New
    }
}

/// The max-merge of one figure into a key's slots.
fn merge_slot(slots: &mut Slots, region: u16, fw: FigureWindow, count: u64, now: Micros) -> Merged {
    if let Some(s) = slots
        .iter_mut()
        .find(|s| s.region == region && s.start == fw.start)
    {
        return raise(s, fw, count);
    }
    // Drop this region's slots that no longer count, then make room if it holds two windows.
    slots.retain(|s| s.region != region || s.expires > now);
    let mine = slots.iter().filter(|s| s.region == region).count();
    if mine >= WINDOWS_PER_REGION {
        let oldest = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.region == region)
            .min_by_key(|(_, s)| s.start)
            .map(|(i, s)| (i, s.start));
        match oldest {
            Some((_, start)) if start > fw.start => return Merged::Unchanged,
            Some((i, _)) => {
                slots.swap_remove(i);
            }
            None => {}
        }
    }
    push_slot(slots, region, fw, count)
}

/// Generations a region keeps per key, the older ones folded into the base: the current one
/// and the one before, so a late figure of the generation that just ended still counts.
const GENERATIONS_PER_REGION: usize = 2;

/// The merge of one cumulative figure labelled with its generation (`fw.start`, the key's
/// birth; 0 from a sender before labels) into a key's slots.
///
/// Within a generation, the max. A newer generation gets a slot of its own beside the
/// region's last one; a third folds the oldest's figure (and base) into the base of the
/// one after it, so what the region adds to the sum, Σ (base + figure) over its slots, never
/// goes down and a restarted key is drained from its first unit. A label older than every
/// generation held changes nothing (it may have been folded: adding it again would drain its
/// units twice). Unlabelled figures (an older sender's) and labelled ones of the same region
/// are never added up: a label-0 figure is max-merged into the region's only slot while that
/// slot is unlabelled, and ignored once a labelled one is held; a labelled figure takes over
/// an unlabelled slot as the same generation (max). So a region of older daemons behaves as
/// before, and a region mixing both never counts a unit twice.
fn merge_generation(slots: &mut Slots, region: u16, fw: FigureWindow, count: u64) -> Merged {
    let newest = slots
        .iter()
        .filter(|s| s.region == region)
        .map(|s| s.start)
        .max();
    match newest {
        // An unlabelled slot (the only one the region can have then) and a labelled figure:
        // the same generation, now labelled.
        Some(0) if fw.start > 0 => {
            let Some(s) = slots.iter_mut().find(|s| s.region == region) else {
                return Merged::Unchanged;
            };
            s.start = fw.start;
            return raise(s, fw, count);
        }
        Some(n) if fw.start == 0 && n > 0 => return Merged::Unchanged,
        _ => {}
    }
    if let Some(s) = slots
        .iter_mut()
        .find(|s| s.region == region && s.start == fw.start)
    {
        return raise(s, fw, count);
    }
    let held = slots.iter().filter(|s| s.region == region).count();
    let oldest = slots
        .iter()
        .filter(|s| s.region == region)
        .map(|s| s.start)
        .min()
        .unwrap_or(0);
    if held >= GENERATIONS_PER_REGION {
        if fw.start < oldest {
            return Merged::Unchanged;
        }
        // Fold the oldest generation into the next one's base.
        let Some(i) = slots
            .iter()
            .position(|s| s.region == region && s.start == oldest)
        else {
            return Merged::Unchanged;
        };
        let gone = slots.swap_remove(i);
        let next = slots
            .iter_mut()
            .filter(|s| s.region == region)
            .min_by_key(|s| s.start);
        if let Some(next) = next {
            next.base = next
                .base
                .saturating_add(gone.base)
                .saturating_add(gone.count);
            next.expires = next.expires.max(gone.expires);
        }
    }
    push_slot(slots, region, fw, count)
}

#[cfg(test)]
mod tests;
