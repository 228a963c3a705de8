//! Forwarding between region senders, for dozens of regions: each region's sender ships its
//! figures to a few *peer* regions instead of all of them, and every receiver passes on the
//! other origins' figures it heard to its own peers.
//!
//! Point-to-point, a region's sender ships to `R − 1` receivers each interval; with a
//! fan-out `F` it ships to `F` peer regions whatever `R`, and the figures reach the others in
//! a few hops. Figures keep their origin region on every hop (the packet's `region`), and
//! receivers merge by max per (origin, key, window) as they always did, so a figure heard
//! twice, late or by two paths changes nothing.
//!
//! - **Peers** ([`peers`]): the forwarding regions sorted by name form a ring; region `i`
//!   sends to `i + b^k` for `k < F` (mod `R`), with `b` the smallest base ≥ 2 for which
//!   `b^F ≥ R`: powers of two when `F ≥ log2 R`, so a figure takes at most about `log2 R`
//!   hops ([`hops`]). Up to `F + 1` regions that is every other region: point-to-point.
//! - **Along the origin's tree, not flooded** ([`passes_on`]): a region passes an origin's
//!   figures on only to the peers below it in that origin's broadcast tree (offsets from the
//!   origin in base `b`), so each region hears each figure once. Flooding every peer (each
//!   figure over every one of the `R × F` links) would cost `F` times the bytes of
//!   point-to-point; the tree costs the same bytes, spread over `F` streams per region.
//! - **What is forwarded** ([`Forwarder`]): per peer, the figures that rose since they were
//!   last forwarded to it (or were heard from it), highest first within the byte budget; a
//!   figure heard again `resend_after / 2` after it last went to a peer goes again, so the
//!   origin's periodic resend repairs a loss on any hop.
//! - **A region down** is routed around by the membership: the ring is formed over the live
//!   regions, so once the membership drops a region the trees close over the gap (until
//!   then, figures sent to it are lost for its subtree, as a datagram to a dead receiver is
//!   point-to-point; the next change or resend after the ring re-formed repairs them).
//! - **When**: at once, on receipt (what the budget held back goes at the next receipt or at
//!   the receiver's interval): a changed figure is at most [`lag_bound`] old anywhere.

use crate::Micros;
use crate::ship::ShipEntry;
use crate::time::stepped_back;
use std::collections::HashMap;

/// The chord base for `n` regions and fan-out `fanout`: the smallest `b ≥ 2` with
/// `b^fanout ≥ n`, so that `fanout` digits in base `b` span the ring.
fn base(n: usize, fanout: usize) -> usize {
    let mut b = 2usize;
    while (0..fanout)
        .try_fold(1usize, |p, _| p.checked_mul(b))
        .is_some_and(|p| p < n)
    {
        b += 1;
    }
    b
}

/// Whether `n` forwarding regions at fan-out `fanout` forward at all: not when `fanout` is 0
/// (point-to-point, the default) or every other region is a peer anyway (`n ≤ fanout + 1`).
pub fn forwarding(n: usize, fanout: usize) -> bool {
    fanout > 0 && n > fanout + 1
}

/// The peers of region `me` of `n` forwarding regions (indices into the regions sorted by
/// name): `me + b^k mod n` for `k < fanout`, distinct and never `me`; every other region when
/// [`forwarding`] is false.
pub fn peers(n: usize, me: usize, fanout: usize) -> Vec<usize> {
    if n == 0 || me >= n {
        return Vec::new();
    }
    if !forwarding(n, fanout) {
        return (0..n).filter(|i| *i != me).collect();
    }
    let b = base(n, fanout);
    let mut out = Vec::with_capacity(fanout);
    let mut step = 1usize;
    for _ in 0..fanout {
        let p = (me + step % n) % n;
        if p != me && !out.contains(&p) {
            out.push(p);
        }
        step = step.saturating_mul(b);
    }
    out
}

/// The base-`b` digits of `x` (lowest first), `digits` of them.
fn digits(mut x: usize, b: usize, digits: usize) -> Vec<usize> {
    (0..digits)
        .map(|_| {
            let d = x % b;
            x /= b;
            d
        })
        .collect()
}

/// Whether region `me` passes `origin`'s figures on to its peer `peer` (indices into the
/// ring of `n`): only along `origin`'s broadcast tree, so that each region hears each figure
/// once, as point-to-point, and the bytes do not grow with the fan-out. Offsets are taken
/// from the origin, `x = me − origin mod n`, written in base `b`: region `x` passes on to
/// `x + b^k` (below `n`, no wrap) for every `k` up to the position of `x`'s lowest non-zero
/// digit (every `k` for the origin itself) whose digit is below `b − 1`, so that `x + b^k`
/// has `x` as its one parent (`x + b^k` less its lowest digit's unit). The path from the
/// origin to `y` is `y`'s digit sum long: at most [`hops`].
pub fn passes_on(n: usize, me: usize, origin: usize, peer: usize, fanout: usize) -> bool {
    if !forwarding(n, fanout) || me >= n || origin >= n || peer >= n {
        // Point-to-point: every region hears the origin itself.
        return false;
    }
    let b = base(n, fanout);
    let x = (me + n - origin) % n;
    let y = (peer + n - origin) % n;
    if y <= x {
        return false;
    }
    let dx = digits(x, b, fanout);
    let low = dx.iter().position(|d| *d != 0).unwrap_or(fanout);
    let mut step = 1usize;
    for (k, d) in dx.iter().enumerate() {
        if k > low {
            break;
        }
        if x + step == y {
            return *d < b - 1;
        }
        step = step.saturating_mul(b);
    }
    false
}

/// The most region-to-region hops a figure takes with `n` forwarding regions at fan-out
/// `fanout`: the largest digit sum of an offset below `n` in base `b` (1 when
/// point-to-point, 0 alone). About `log2 n` when `fanout ≥ log2 n`.
pub fn hops(n: usize, fanout: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    if !forwarding(n, fanout) {
        return 1;
    }
    let b = base(n, fanout);
    (1..n)
        .map(|y| digits(y, b, fanout).iter().sum::<usize>())
        .max()
        .unwrap_or(1)
}

/// How old a region's figure may be anywhere once it changed, with forwarding at once: the
/// wait for the origin's next shipment (`interval`), then `hops` links of at most `delay`
/// each (a fan-out inside the receiving region adds its local hop).
pub fn lag_bound(hops: usize, interval: Micros, delay: Micros) -> Micros {
    interval + hops as Micros * delay
}

/// One figure: (origin region, store key, window start).
type Fig = (String, String, Micros);

/// Other origins' figures a region's receiver heard, and what went to each peer: the table
/// forwarding reads ([`Forwarder::take`]). Bounded: beyond `max` figures new ones are dropped
/// (the origin's resend brings them again).
#[derive(Debug, Default)]
pub struct Forwarder {
    /// The max heard per figure, and when it was last heard (a resend included).
    figures: HashMap<Fig, (u64, Micros)>,
    /// Per peer region: the figure it was sent (or sent us) and when.
    sent: HashMap<String, HashMap<Fig, (u64, Micros)>>,
}

impl Forwarder {
    /// A figure of `origin` heard at `now`, from region `via` when known (which has it, so it
    /// is not sent back). Returns whether it rose (new or higher); false also when the table
    /// is full and it was dropped.
    #[allow(clippy::too_many_arguments)]
    pub fn heard(
        &mut self,
        origin: &str,
        via: Option<&str>,
        key: &str,
        window_start: Micros,
        count: u64,
        now: Micros,
        max: usize,
    ) -> bool {
        let fig = (origin.to_string(), key.to_string(), window_start);
        let full = self.figures.len() >= max;
        let rose = match self.figures.get_mut(&fig) {
            Some((c, at)) => {
                *at = now;
                let rose = count > *c;
                *c = (*c).max(count);
                rose
            }
            None if full => return false,
            None => {
                self.figures.insert(fig.clone(), (count, now));
                true
            }
        };
        if let Some(v) = via {
            let s = self.sent.entry(v.to_string()).or_default();
            let e = s.entry(fig).or_insert((count, now));
            if count >= e.0 {
                *e = (count, now);
            }
        }
        rose
    }

    /// What goes to `peer` now, grouped by origin: figures of the origins `passes_on` accepts
    /// (its origin's tree runs from here to `peer`: [`passes_on`]), never `peer`'s own, that are
    /// above what `peer` was sent (or sent us), or heard again `resend_after / 2` after it
    /// last was (or the clock [`stepped_back`] more than that since); the highest first (ties
    /// by origin, key, window, so a simulation replays), within `max_bytes` ([`ShipEntry::bytes`]). What is taken is recorded as sent; the
    /// rest waits for the next call.
    pub fn take(
        &mut self,
        peer: &str,
        now: Micros,
        resend_after: Micros,
        max_bytes: usize,
        passes_on: impl Fn(&str) -> bool,
    ) -> Vec<(String, Vec<ShipEntry>)> {
        let sent = self.sent.entry(peer.to_string()).or_default();
        let mut due: Vec<(&Fig, u64)> = self
            .figures
            .iter()
            .filter(|(f, _)| f.0 != peer && passes_on(&f.0))
            .filter(|(f, (c, at))| {
                // The slack: the receive loop and the ship loop both call this, and their
                // readings race.
                sent.get(*f).is_none_or(|(s, s_at)| {
                    c > s
                        || *at >= s_at.saturating_add(resend_after / 2)
                        || stepped_back(now, *s_at, resend_after / 2)
                })
            })
            .map(|(f, (c, _))| (f, *c))
            .collect();
        due.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let mut by: Vec<(String, Vec<ShipEntry>)> = Vec::new();
        let mut used = 0;
        for ((origin, key, w), c) in due {
            let e = ShipEntry {
                key: key.clone(),
                window_start: *w,
                count: c,
            };
            let b = e.bytes();
            if used + b > max_bytes {
                break;
            }
            used += b;
            sent.insert((origin.clone(), key.clone(), *w), (c, now));
            match by.iter_mut().find(|(o, _)| o == origin) {
                Some((_, es)) => es.push(e),
                None => by.push((origin.clone(), vec![e])),
            }
        }
        by.sort_by(|a, b| a.0.cmp(&b.0));
        by
    }

    /// How long a figure not heard again is kept: twice the longer of the origin's resend
    /// period and the ship interval, past which nobody ships it any more. The daemon and the
    /// simulator sweep with it.
    pub fn keep_for(resend_after: Micros, interval: Micros) -> Micros {
        2 * resend_after.max(interval)
    }

    /// Forgets figures not heard for `keep` ([`Forwarder::keep_for`]), and peers not in
    /// `peers` (a ring that changed starts afresh with a new peer).
    pub fn sweep(&mut self, now: Micros, keep: Micros, peers: &[&str]) {
        self.figures
            .retain(|_, (_, at)| now.saturating_sub(*at) <= keep);
        let figures = &self.figures;
        self.sent.retain(|p, _| peers.contains(&p.as_str()));
        for s in self.sent.values_mut() {
            s.retain(|f, _| figures.contains_key(f));
        }
    }

    /// Forgets what went to every peer: everything held goes again, along the trees, at the
    /// next [`Forwarder::take`]. With [`crate::ship::LocalUsage::resend_all`], when a region
    /// comes back: what was forwarded to it while it was cut off was lost, and a figure that
    /// no longer changes would otherwise reach it only after `resend_after`.
    pub fn resend_all(&mut self) {
        self.sent.clear();
    }

    /// Figures held.
    pub fn len(&self) -> usize {
        self.figures.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.figures.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn peers_are_a_ring_with_chords_and_point_to_point_when_few() {
        assert_eq!(peers(4, 0, 3), vec![1, 2, 3]);
        assert_eq!(peers(4, 2, 0), vec![0, 1, 3]);
        assert!(!forwarding(4, 3));
        assert!(forwarding(5, 3));
        // 12 regions, fan-out 3: base 3 (2^3 = 8 < 12 ≤ 27), offsets 1, 3, 9.
        assert_eq!(peers(12, 0, 3), vec![1, 3, 9]);
        assert_eq!(peers(12, 10, 3), vec![11, 1, 7]);
        // 60 regions, fan-out 6: powers of two, 1 to 32.
        assert_eq!(peers(60, 0, 6), vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(hops(60, 6), 5);
        assert_eq!(hops(12, 3), 4);
        assert_eq!(hops(60, 3), 8);
        assert_eq!(
            (hops(10, 4), hops(30, 4), hops(30, 5), hops(60, 4)),
            (3, 6, 4, 7)
        );
        assert_eq!(hops(4, 3), 1);
        assert_eq!(hops(1, 3), 0);
        assert!(peers(0, 0, 3).is_empty() && peers(3, 3, 1).is_empty());
        assert_eq!(lag_bound(4, 1_000_000, 100_000), 1_400_000);
    }

    #[test]
    fn an_origins_figures_follow_its_tree_each_region_once() {
        // 12 regions, fan-out 3, base 3. From origin 0: 0 -> 1, 3, 9; 1 -> 2; 2 (digit
        // 2 = b - 1) -> none; 3 -> 4, 6; 9 -> 10 (9 + 3 is past the ring).
        let kids =
            |me: usize| -> Vec<usize> { (0..12).filter(|p| passes_on(12, me, 0, *p, 3)).collect() };
        assert_eq!(kids(0), vec![1, 3, 9]);
        assert_eq!(kids(1), vec![2]);
        assert!(kids(2).is_empty());
        assert_eq!(kids(3), vec![4, 6]);
        assert_eq!(kids(9), vec![10]);
        assert!(kids(11).is_empty());
        // The same tree turned: origin 5.
        assert!(passes_on(12, 6, 5, 7, 3) && !passes_on(12, 7, 5, 6, 3));
        // Point-to-point: nobody passes on.
        assert!(!passes_on(4, 0, 1, 2, 3));
        // Every region but the origin has exactly one parent, for many sizes.
        for n in 2..70 {
            for f in 1..7 {
                for y in 1..n {
                    let parents = (0..n).filter(|x| passes_on(n, *x, 0, y, f)).count();
                    let want = usize::from(forwarding(n, f));
                    assert_eq!(parents, want, "n {n} fanout {f} region {y}");
                }
            }
        }
    }

    fn e(key: &str, count: u64) -> ShipEntry {
        ShipEntry {
            key: key.into(),
            window_start: 0,
            count,
        }
    }

    #[test]
    fn a_peer_gets_what_rose_since_and_never_its_own_or_what_it_sent() {
        let mut f = Forwarder::default();
        assert!(f.heard("a", Some("a"), "k1", 0, 10, 0, 100));
        assert!(f.heard("b", Some("a"), "k2", 0, 5, 0, 100));
        // Lower or equal: no news.
        assert!(!f.heard("a", Some("c"), "k1", 0, 9, 1, 100));
        // To a: only b's figure (a's own is a's; b's came from a though: a has it).
        assert!(f.take("a", 2, 1_000, usize::MAX, |_| true).is_empty());
        // To b: a's figure only; to c: both, a's first by origin.
        assert_eq!(
            f.take("b", 2, 1_000, usize::MAX, |_| true),
            vec![("a".into(), vec![e("k1", 10)])]
        );
        let to_c = f.take("c", 2, 1_000, usize::MAX, |_| true);
        assert_eq!(
            to_c,
            vec![
                ("a".into(), vec![e("k1", 10)]),
                ("b".into(), vec![e("k2", 5)])
            ]
        );
        // Sent: nothing again until it rises.
        assert!(f.take("c", 3, 1_000, usize::MAX, |_| true).is_empty());
        assert!(f.heard("a", Some("a"), "k1", 0, 12, 4, 100));
        assert_eq!(
            f.take("c", 5, 1_000, usize::MAX, |_| true),
            vec![("a".into(), vec![e("k1", 12)])]
        );
        // A resend heard half `resend_after` later goes again (repairs a lost forward).
        assert!(!f.heard("a", Some("a"), "k1", 0, 12, 505, 100));
        assert_eq!(
            f.take("c", 506, 1_000, usize::MAX, |_| true),
            vec![("a".into(), vec![e("k1", 12)])]
        );
        assert!(!f.heard("a", Some("a"), "k1", 0, 12, 600, 100));
        assert!(f.take("c", 601, 1_000, usize::MAX, |_| true).is_empty());
        // A reading a little before the last forward (two tasks' clocks racing) is not a
        // step. The clock steps back further (over half `resend_after` before the last
        // forward): how long ago that was is unknown, so the figure goes again, once.
        assert!(f.take("c", 400, 1_000, usize::MAX, |_| true).is_empty());
        assert!(!f.heard("a", Some("a"), "k1", 0, 12, 2, 100));
        assert_eq!(
            f.take("c", 3, 1_000, usize::MAX, |_| true),
            vec![("a".into(), vec![e("k1", 12)])]
        );
        assert!(f.take("c", 4, 1_000, usize::MAX, |_| true).is_empty());
    }

    #[test]
    fn the_budget_takes_the_highest_first_and_the_rest_waits() {
        let mut f = Forwarder::default();
        for (k, n) in [("k1", 1), ("k2", 30), ("k3", 20)] {
            f.heard("a", None, k, 0, n, 0, 100);
        }
        let one = e("k1", 10).bytes();
        assert_eq!(
            f.take("b", 0, 1_000, 2 * one, |_| true),
            vec![("a".into(), vec![e("k2", 30), e("k3", 20)])]
        );
        assert_eq!(
            f.take("b", 0, 1_000, 2 * one, |_| true),
            vec![("a".into(), vec![e("k1", 1)])]
        );
        // The bound: a new figure beyond it is dropped, a known one still rises.
        assert!(!f.heard("a", None, "k4", 0, 1, 0, 3));
        assert!(f.heard("a", None, "k1", 0, 2, 0, 3));
        // Swept: not heard for `keep`; a peer no longer in the ring is forgotten.
        f.heard("a", None, "k2", 0, 30, 900, 100);
        f.sweep(1_000, 500, &["c"]);
        assert_eq!(f.len(), 1);
        assert_eq!(f.take("c", 1_000, 1_000, usize::MAX, |_| true).len(), 1);
        assert!(f.take("c", 1_000, 1_000, usize::MAX, |_| true).is_empty());
        // A region back from a partition: everything goes to it again.
        f.resend_all();
        assert_eq!(f.take("c", 1_000, 1_000, usize::MAX, |_| true).len(), 1);
        assert_eq!(
            f.take("b", 1_000, 1_000, usize::MAX, |_| true),
            vec![("a".into(), vec![e("k2", 30)])]
        );
    }

    /// Runs forwarding rounds over the live regions `live` (the ring is formed over them, as
    /// the membership does once a region is down): each round every region takes what is due
    /// for each peer along the origins' trees and the peer hears it next round, in a shuffled
    /// order and with duplicates. Returns per region the max heard per origin, the round in
    /// which each (origin, region) first held the origin's highest figure, and how many
    /// distinct senders brought each (origin, region) its first copy of a rise.
    #[allow(clippy::type_complexity)]
    fn run(
        live: &[usize],
        fanout: usize,
        rounds: usize,
        changes: &[(usize, u64)],
        order: &[usize],
    ) -> (
        BTreeMap<usize, BTreeMap<usize, u64>>,
        BTreeMap<(usize, usize), usize>,
        BTreeMap<(usize, usize), usize>,
    ) {
        let n = live.len();
        let name = |i: usize| format!("r{:02}", live[i]);
        let mut fw: Vec<Forwarder> = (0..n).map(|_| Forwarder::default()).collect();
        let mut held: Vec<BTreeMap<usize, u64>> = vec![BTreeMap::new(); n];
        let mut reached = BTreeMap::new();
        let mut senders: BTreeMap<(usize, usize), std::collections::BTreeSet<usize>> =
            BTreeMap::new();
        let mut inbox: Vec<Vec<(usize, usize, u64)>> = vec![Vec::new(); n];
        let mut target: BTreeMap<usize, u64> = BTreeMap::new();
        for &(o, c) in changes {
            let v = target.entry(o).or_insert(0);
            *v = (*v).max(c);
        }
        for round in 0..rounds {
            let mut next: Vec<Vec<(usize, usize, u64)>> = vec![Vec::new(); n];
            if round == 0 {
                // Each origin ships its own figures to its peers, once, at its highest.
                for (&o, &c) in &target {
                    held[o].insert(o, c);
                    for p in peers(n, o, fanout) {
                        next[p].push((o, o, c));
                    }
                }
            }
            for r in 0..n {
                let mut got = std::mem::take(&mut inbox[r]);
                let len = got.len();
                for i in 0..len {
                    let j = order[(i + round + r) % order.len()] % len;
                    got.swap(i, j);
                }
                let dups: Vec<_> = got.iter().copied().take(order.len() % 3).collect();
                for (origin, via, c) in got.iter().copied() {
                    if held[r].get(&origin).is_none_or(|h| c > *h) {
                        senders.entry((origin, r)).or_default().insert(via);
                    }
                    fw[r].heard(
                        &name(origin),
                        Some(&name(via)),
                        "k",
                        0,
                        c,
                        round as Micros,
                        1000,
                    );
                    let v = held[r].entry(origin).or_insert(0);
                    *v = (*v).max(c);
                }
                for (origin, via, c) in dups {
                    let before = held[r].get(&origin).copied();
                    fw[r].heard(
                        &name(origin),
                        Some(&name(via)),
                        "k",
                        0,
                        c,
                        round as Micros,
                        1000,
                    );
                    let v = held[r].entry(origin).or_insert(0);
                    *v = (*v).max(c);
                    assert!(Some(*v) >= before, "a figure never falls");
                }
                for p in peers(n, r, fanout) {
                    let pos = |o: &str| live.iter().position(|x| format!("r{x:02}") == o);
                    let due = fw[r].take(&name(p), round as Micros, 1_000_000, usize::MAX, |o| {
                        pos(o).is_some_and(|o| passes_on(n, r, o, p, fanout))
                    });
                    for (origin, es) in due {
                        let Some(o) = pos(&origin) else { continue };
                        for e in es {
                            next[p].push((o, r, e.count));
                        }
                    }
                }
            }
            for (r, h) in held.iter().enumerate() {
                for (&o, &c) in h {
                    if target.get(&o) == Some(&c) {
                        reached.entry((o, r)).or_insert(round);
                    }
                }
            }
            for (r, m) in next.into_iter().enumerate() {
                inbox[r].extend(m);
            }
        }
        let heard = senders.into_iter().map(|(k, v)| (k, v.len())).collect();
        (held.into_iter().enumerate().collect(), reached, heard)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every origin's figure reaches every region within the hop bound (one round per
        /// hop), over a membership with or without a region down (the ring formed over the
        /// live ones), through exactly one parent; duplicates and reordering never lower it.
        #[test]
        fn every_figure_reaches_every_region_within_the_hops(
            n in 2usize..40,
            fanout in 1usize..7,
            dead in proptest::option::of(0usize..40),
            changes in proptest::collection::vec((0usize..40, 1u64..1000), 1..12),
            order in proptest::collection::vec(0usize..64, 1..8),
        ) {
            let live: Vec<usize> = (0..n).filter(|r| Some(*r) != dead.map(|d| d % n)).collect();
            let m = live.len();
            prop_assume!(m >= 1);
            let changes: Vec<(usize, u64)> = changes.into_iter().map(|(o, c)| (o % m, c)).collect();
            let bound = hops(m, fanout);
            let (held, reached, parents) = run(&live, fanout, bound + 2, &changes, &order);
            for &(o, _) in &changes {
                let want = changes.iter().filter(|(x, _)| *x == o).map(|(_, c)| *c).max();
                for r in 0..m {
                    prop_assert_eq!(held[&r].get(&o).copied(), want, "origin {} at {}", o, r);
                    let at = reached.get(&(o, r)).copied();
                    prop_assert!(at.is_some_and(|a| a <= bound), "origin {} at {}: {:?} > {}", o, r, at, bound);
                    if r != o {
                        prop_assert_eq!(parents.get(&(o, r)).copied(), Some(1), "origin {} at {}", o, r);
                    }
                }
            }
        }
    }
}
