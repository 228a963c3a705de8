//! Forwarding between region senders, for dozens of regions: each region's sender ships its
//! figures to a few *peer* regions instead of all of them, and every receiver passes on the
//! other origins' figures it heard to its own peers.
//!
//! Point-to-point, a region's figures cross `R − 1` times per interval and the cluster carries
//! `R × (R − 1)` streams; with a fan-out `F` each region sends `F` streams whatever `R`, at
//! the price of a few hops of lag. Figures keep their origin region on every hop (the packet's
//! `region`), receivers merge by max per (origin, key, window) as they always did, so a figure
//! heard twice, late or by two paths changes nothing.
//!
//! - **Peers** ([`peers`]): the forwarding regions sorted by name form a ring; region `i`
//!   sends to `i + b^k` for `k < F` (mod `R`), with `b` the smallest base ≥ 2 for which
//!   `b^F ≥ R`: powers of two when `F ≥ log2 R`, so the diameter is about `log2 R` hops
//!   ([`hops`]). Up to `F + 1` regions that is every other region: point-to-point.
//! - **A region down** is routed around twice over: the ring is formed over the live
//!   membership, so once it drops a region the others' chords close over the gap; and before
//!   that, with `F ≥ 2` the ring (offset 1) and a chord reach past any one silent region
//!   ([`diameter`] with it down stays finite), so only figures sent to the dead one are lost.
//! - **What is forwarded** ([`Forwarder`]): per peer, the figures of origins other than the
//!   peer that rose since they were last forwarded to it (or were heard from it), highest
//!   first within the byte budget; a figure heard again `resend_after / 2` after it last went
//!   to a peer goes again, so the origin's periodic resend repairs a loss on any hop.
//! - **When**: at once, on receipt (and what the budget held back at the next receipt or the
//!   receiver's interval): a figure is then at most [`lag_bound`] old anywhere.

use crate::Micros;
use crate::ship::ShipEntry;
use std::collections::{HashMap, VecDeque};

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

/// The most hops a figure needs between two live regions of `n`, peers chosen on all `n` but
/// the regions in `down` silent (they neither receive nor forward); `None` if some live
/// region cannot reach another. Breadth first from every live region.
pub fn diameter(n: usize, fanout: usize, down: &[usize]) -> Option<usize> {
    let edges: Vec<Vec<usize>> = (0..n).map(|i| peers(n, i, fanout)).collect();
    let mut worst = 0;
    for from in (0..n).filter(|i| !down.contains(i)) {
        let mut dist = vec![usize::MAX; n];
        dist[from] = 0;
        let mut queue = VecDeque::from([from]);
        while let Some(at) = queue.pop_front() {
            for &to in &edges[at] {
                if dist[to] == usize::MAX && !down.contains(&to) {
                    dist[to] = dist[at] + 1;
                    queue.push_back(to);
                }
            }
        }
        for (to, d) in dist.iter().enumerate() {
            if down.contains(&to) {
                continue;
            }
            if *d == usize::MAX {
                return None;
            }
            worst = worst.max(*d);
        }
    }
    Some(worst)
}

/// The most region-to-region hops with `n` live forwarding regions at fan-out `fanout` (1
/// when point-to-point, 0 alone).
pub fn hops(n: usize, fanout: usize) -> usize {
    diameter(n, fanout, &[]).unwrap_or(n.saturating_sub(1))
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

    /// What goes to `peer` now, grouped by origin: figures of every origin but `peer` that are
    /// above what `peer` was sent (or sent us), or heard again `resend_after / 2` after it
    /// last was; the highest first (ties by origin, key, window, so a simulation replays),
    /// within `max_bytes` ([`ShipEntry::bytes`]). What is taken is recorded as sent; the
    /// rest waits for the next call.
    pub fn take(
        &mut self,
        peer: &str,
        now: Micros,
        resend_after: Micros,
        max_bytes: usize,
    ) -> Vec<(String, Vec<ShipEntry>)> {
        let sent = self.sent.entry(peer.to_string()).or_default();
        let mut due: Vec<(&Fig, u64)> = self
            .figures
            .iter()
            .filter(|(f, _)| f.0 != peer)
            .filter(|(f, (c, at))| {
                sent.get(*f)
                    .is_none_or(|(s, s_at)| c > s || *at >= s_at.saturating_add(resend_after / 2))
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

    /// Forgets figures not heard for `keep` (an origin resends its busy figures every
    /// `resend_after`: twice that is a figure nobody ships any more), and peers not in
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
        assert_eq!(hops(4, 3), 1);
        assert_eq!(hops(1, 3), 0);
        assert!(peers(0, 0, 3).is_empty() && peers(3, 3, 1).is_empty());
        assert_eq!(lag_bound(4, 1_000_000, 100_000), 1_400_000);
    }

    #[test]
    fn one_region_down_is_routed_around_with_two_chords_not_one() {
        assert_eq!(diameter(12, 1, &[]), Some(11));
        assert_eq!(diameter(12, 1, &[5]), None);
        let d = diameter(12, 3, &[5]).expect("connected");
        assert!(d > hops(12, 3) - 1 && d <= 2 * hops(12, 3), "{d}");
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
        assert!(f.take("a", 2, 1_000, usize::MAX).is_empty());
        // To b: a's figure only; to c: both, a's first by origin.
        assert_eq!(
            f.take("b", 2, 1_000, usize::MAX),
            vec![("a".into(), vec![e("k1", 10)])]
        );
        let to_c = f.take("c", 2, 1_000, usize::MAX);
        assert_eq!(
            to_c,
            vec![
                ("a".into(), vec![e("k1", 10)]),
                ("b".into(), vec![e("k2", 5)])
            ]
        );
        // Sent: nothing again until it rises.
        assert!(f.take("c", 3, 1_000, usize::MAX).is_empty());
        assert!(f.heard("a", Some("a"), "k1", 0, 12, 4, 100));
        assert_eq!(
            f.take("c", 5, 1_000, usize::MAX),
            vec![("a".into(), vec![e("k1", 12)])]
        );
        // A resend heard half `resend_after` later goes again (repairs a lost forward).
        assert!(!f.heard("a", Some("a"), "k1", 0, 12, 505, 100));
        assert_eq!(
            f.take("c", 506, 1_000, usize::MAX),
            vec![("a".into(), vec![e("k1", 12)])]
        );
        assert!(!f.heard("a", Some("a"), "k1", 0, 12, 600, 100));
        assert!(f.take("c", 601, 1_000, usize::MAX).is_empty());
    }

    #[test]
    fn the_budget_takes_the_highest_first_and_the_rest_waits() {
        let mut f = Forwarder::default();
        for (k, n) in [("k1", 1), ("k2", 30), ("k3", 20)] {
            f.heard("a", None, k, 0, n, 0, 100);
        }
        let one = e("k1", 10).bytes();
        assert_eq!(
            f.take("b", 0, 1_000, 2 * one),
            vec![("a".into(), vec![e("k2", 30), e("k3", 20)])]
        );
        assert_eq!(
            f.take("b", 0, 1_000, 2 * one),
            vec![("a".into(), vec![e("k1", 1)])]
        );
        // The bound: a new figure beyond it is dropped, a known one still rises.
        assert!(!f.heard("a", None, "k4", 0, 1, 0, 3));
        assert!(f.heard("a", None, "k1", 0, 2, 0, 3));
        // Swept: not heard for `keep`; a peer no longer in the ring is forgotten.
        f.heard("a", None, "k2", 0, 30, 900, 100);
        f.sweep(1_000, 500, &["c"]);
        assert_eq!(f.len(), 1);
        assert_eq!(
            f.take("b", 1_000, 1_000, usize::MAX),
            vec![("a".into(), vec![e("k2", 30)])]
        );
    }

    /// Runs forwarding rounds over `n` regions (peers on all `n`, `down` silent): each round
    /// every live region takes what is due for each peer and the peer hears it next round,
    /// delivered in a shuffled order with duplicates. Returns per region the max heard per
    /// origin, and the round in which each (origin, region) first saw `target`.
    #[allow(clippy::type_complexity)]
    fn run(
        n: usize,
        fanout: usize,
        down: &[usize],
        rounds: usize,
        changes: &[(usize, u64)],
        order: &[usize],
    ) -> (Vec<BTreeMap<usize, u64>>, BTreeMap<(usize, usize), usize>) {
        let name = |i: usize| format!("r{i:02}");
        let mut fw: Vec<Forwarder> = (0..n).map(|_| Forwarder::default()).collect();
        let mut held: Vec<BTreeMap<usize, u64>> = vec![BTreeMap::new(); n];
        let mut reached = BTreeMap::new();
        let mut inbox: Vec<Vec<(usize, usize, u64)>> = vec![Vec::new(); n];
        let target: BTreeMap<usize, u64> = changes.iter().fold(BTreeMap::new(), |mut m, (o, c)| {
            let v = m.entry(*o).or_insert(0);
            *v = (*v).max(*c);
            m
        });
        for round in 0..rounds {
            // Origins ship their own figure to their peers (round 0: all changes at once).
            let mut next: Vec<Vec<(usize, usize, u64)>> = vec![Vec::new(); n];
            if round == 0 {
                for &(o, c) in changes {
                    if down.contains(&o) {
                        continue;
                    }
                    let v = held[o].entry(o).or_insert(0);
                    *v = (*v).max(c);
                    for p in peers(n, o, fanout) {
                        next[p].push((o, o, c));
                    }
                }
            }
            for r in 0..n {
                if down.contains(&r) {
                    continue;
                }
                let mut got = std::mem::take(&mut inbox[r]);
                // Reorder and duplicate.
                let len = got.len();
                for i in 0..len {
                    let j = order[(i + round + r) % order.len()] % len;
                    got.swap(i, j);
                }
                got.extend(got.clone().into_iter().take(order.len() % 3));
                for (origin, via, c) in got {
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
                    let before = *v;
                    *v = (*v).max(c);
                    assert!(*v >= before, "a figure never falls");
                }
                for p in peers(n, r, fanout) {
                    for (origin, es) in fw[r].take(&name(p), round as Micros, 1_000_000, usize::MAX)
                    {
                        let o: usize = origin[1..].parse().unwrap_or(usize::MAX);
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
                if !down.contains(&r) {
                    inbox[r].extend(m);
                }
            }
        }
        (held, reached)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every origin's figure reaches every live region within the hop bound (one round
        /// per hop), with one region down too (within the diameter without it), and neither
        /// duplicates nor reordering lowers a figure.
        #[test]
        fn every_figure_reaches_every_region_within_the_hops(
            n in 2usize..40,
            fanout in 1usize..7,
            dead in proptest::option::of(0usize..40),
            changes in proptest::collection::vec((0usize..40, 1u64..1000), 1..12),
            order in proptest::collection::vec(0usize..64, 1..8),
        ) {
            let down: Vec<usize> = dead.filter(|d| *d < n && fanout >= 2).into_iter().collect();
            let changes: Vec<(usize, u64)> = changes.into_iter().map(|(o, c)| (o % n, c)).collect();
            let bound = diameter(n, fanout, &down);
            prop_assert!(bound.is_some(), "connected with one region down at fan-out >= 2");
            let bound = bound.unwrap_or(0);
            let (held, reached) = run(n, fanout, &down, bound + 2, &changes, &order);
            for &(o, _) in changes.iter().filter(|(o, _)| !down.contains(o)) {
                let want = changes.iter().filter(|(x, _)| *x == o).map(|(_, c)| *c).max();
                for r in (0..n).filter(|r| !down.contains(r)) {
                    prop_assert_eq!(held[r].get(&o).copied(), want, "origin {} at {}", o, r);
                    // Seen by round `bound` (round 0 is the origin's own shipment's hop).
                    let at = reached.get(&(o, r)).copied();
                    prop_assert!(at.is_some_and(|a| a <= bound), "origin {} at {}: {:?} > {}", o, r, at, bound);
                }
            }
        }
    }
}
