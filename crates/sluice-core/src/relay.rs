//! One sender per region: which daemon carries a region's figures across regions, which one
//! takes the others' in, and who passes them on inside the region.
//!
//! With every daemon shipping to every daemon elsewhere, cross-region traffic grows with the
//! square of the daemons. Since the daemons of a region count in one store, the region's
//! figure for a key is one number: one daemon per region (its *gateway*) can gather the
//! others' selections, ship the merged figures once per remote region to that region's
//! gateway, and the receiving gateway hands them to its region's other daemons. Cross-region
//! datagrams then grow with regions × busy keys.
//!
//! The election is a pure function of the live membership, so the daemon and the simulator
//! decide alike: a region's gateway is its live *relaying* member (one that takes part in
//! this scheme) with the lowest node id. Views of the membership differ for a moment after a
//! change (a gateway died, a daemon joined); two daemons that both believe they are the
//! gateway both ship, and a receiver that is not the gateway still passes the figures on.
//! That costs duplicates, never wrong counts: receivers keep the max per (region, key,
//! window), so a figure heard twice, or from two senders, merges to the same value.
//!
//! What the sender gathers from its daemons ([`Collected`]) and ships with its own selection
//! ([`merged`]) lives here too, so the daemon and the simulator gather alike.

use crate::Micros;
use crate::ship::ShipEntry;
use crate::time::stepped_back;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

/// One live member as the election sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    /// Unique node id.
    pub node_id: &'a str,
    /// The region it published.
    pub region: &'a str,
    /// Whether it takes part in relaying (gathers, forwards and fans out). Members that do
    /// not (another shipping mode, an older release) are never elected and are sent to
    /// directly.
    pub relays: bool,
    /// Whether it forwards other regions' figures to its peer regions (`gossip.fanout` above
    /// 0, [`crate::forward`]). Only regions whose gateway forwards form the ring; the others
    /// are shipped to point-to-point.
    pub forwards: bool,
}

/// How a datagram travels, which tells its receiver what to do with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hop {
    /// Straight to a daemon of another region, which merges it and passes it on to nobody.
    Direct,
    /// Inside a region, to its gateway: figures of the region to ship across.
    Collect,
    /// To another region's gateway, which merges it and fans it out in its region.
    Relay,
    /// Inside a region, from its gateway to the other daemons: merge, pass on to nobody.
    FanOut,
    /// To a peer region's gateway, other origins' figures passed on ([`crate::forward`]):
    /// merge, fan out in the region, and forward on to its own peers.
    Forward,
}

/// A region's gateway: its relaying live member with the lowest node id, if it has one.
pub fn gateway<'a>(members: &[Member<'a>], region: &str) -> Option<&'a str> {
    members
        .iter()
        .filter(|m| m.relays && m.region == region)
        .map(|m| m.node_id)
        .min()
}

/// What one relaying daemon sends in one interval; indices are into the members given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Whether this daemon is its region's gateway (ships across regions).
    pub sender: bool,
    /// Where this daemon's own selection goes when it is not the gateway.
    pub collect_to: Option<usize>,
    /// Cross-region destinations: each other region's gateway ([`Hop::Relay`]), or every
    /// member of a region with none ([`Hop::Direct`]).
    pub cross: Vec<(usize, Hop)>,
    /// The other members of this daemon's region: where a relayed packet is fanned out.
    pub fan_out: Vec<usize>,
    /// The gateways of this region's peer regions, when the ring forwards
    /// ([`crate::forward::peers`]): where the other origins' figures heard here are passed
    /// on ([`Hop::Forward`]). `cross` then holds only them among the forwarding regions.
    pub forward_to: Vec<usize>,
    /// The ring's gateways in ring order, when the ring forwards (empty otherwise), and the
    /// fan-out: what [`Plan::passes_on`] reads.
    pub ring: Vec<usize>,
    /// The fan-out the plan was made with.
    pub fanout: usize,
}

impl Plan {
    /// Whether this region passes `origin`'s figures on to `peer` (region names): only
    /// along the origin's tree ([`crate::forward::passes_on`]), so each region hears each
    /// figure once.
    pub fn passes_on(&self, members: &[Member<'_>], me: &str, origin: &str, peer: &str) -> bool {
        let at = |r: &str| {
            self.ring
                .iter()
                .position(|&g| members.get(g).is_some_and(|m| m.region == r))
        };
        match (at(me), at(origin), at(peer)) {
            (Some(m), Some(o), Some(p)) => {
                crate::forward::passes_on(self.ring.len(), m, o, p, self.fanout)
            }
            _ => false,
        }
    }
}

/// The plan of `members[me]`, a relaying member, point-to-point (every other region's
/// gateway). Members must be unique by node id.
pub fn plan(members: &[Member<'_>], me: usize) -> Plan {
    plan_with(members, me, 0)
}

/// The plan of `members[me]` with fan-out `fanout` ([`crate::forward`]): when this region's
/// gateway forwards and the forwarding regions are more than `fanout + 1`, it ships across only
/// to its peer regions among them (and point-to-point to the regions that do not forward).
pub fn plan_with(members: &[Member<'_>], me: usize, fanout: usize) -> Plan {
    let Some(this) = members.get(me) else {
        return Plan::default();
    };
    let gw = |region: &str| {
        members
            .iter()
            .enumerate()
            .filter(|(_, m)| (m.relays || m.node_id == this.node_id) && m.region == region)
            .min_by_key(|(_, m)| m.node_id)
            .map(|(i, _)| i)
    };
    let own = gw(this.region);
    let sender = own == Some(me);
    let mut cross = Vec::new();
    let mut regions: Vec<&str> = members
        .iter()
        .map(|m| m.region)
        .filter(|r| *r != this.region)
        .collect();
    regions.sort_unstable();
    regions.dedup();
    // The ring: the regions, this one included, whose gateway forwards, sorted by name.
    let mut ring: Vec<&str> = regions
        .iter()
        .copied()
        .chain(std::iter::once(this.region))
        .filter(|r| gw(r).is_some_and(|g| members[g].forwards))
        .collect();
    ring.sort_unstable();
    let mut forward_to = Vec::new();
    let mut ring_gw = Vec::new();
    let mut peers: Option<Vec<&str>> = None;
    if let Some(at) = ring.iter().position(|r| *r == this.region)
        && crate::forward::forwarding(ring.len(), fanout)
    {
        let ps: Vec<&str> = crate::forward::peers(ring.len(), at, fanout)
            .into_iter()
            .map(|i| ring[i])
            .collect();
        forward_to = ps.iter().filter_map(|r| gw(r)).collect();
        ring_gw = ring.iter().filter_map(|r| gw(r)).collect();
        peers = Some(ps);
    }
    for r in regions {
        if let Some(ps) = &peers
            && ring.contains(&r)
            && !ps.contains(&r)
        {
            continue;
        }
        match gw(r) {
            Some(g) => cross.push((g, Hop::Relay)),
            None => cross.extend(
                members
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.region == r)
                    .map(|(i, _)| (i, Hop::Direct)),
            ),
        }
    }
    let fan_out = members
        .iter()
        .enumerate()
        .filter(|(i, m)| *i != me && m.region == this.region)
        .map(|(i, _)| i)
        .collect();
    Plan {
        sender,
        collect_to: if sender { None } else { own },
        cross,
        fan_out,
        forward_to,
        ring: ring_gw,
        fanout,
    }
}

/// Cross-region datagrams per interval for `regions` regions of `daemons` daemons each,
/// when a region's selection fills `packets` datagrams: every daemon to every daemon
/// elsewhere (`every_daemon`), against one gateway to one gateway per region pair.
pub fn cross_datagrams(regions: u64, daemons: u64, packets: u64, relayed: bool) -> u64 {
    let pairs = regions * regions.saturating_sub(1);
    match relayed {
        true => pairs * packets,
        false => pairs * daemons * daemons * packets,
    }
}

/// Figures this region's daemons sent to this one to ship across, max per (key, window),
/// until the next shipment takes them. Bounded: beyond `max` keys new ones are dropped
/// (their daemons resend them on the next change or after `resend_after`).
///
/// It also remembers what the last two shipments across carried: a daemon of the region that
/// decided the same key reports the same region-level figure, often just after the sender
/// shipped it (daemons' intervals have their own phases), and shipping it again would double
/// the cross-region bytes for nothing. A figure only rises per (key, window), so one at or
/// below what was shipped is no news. The record is forgotten after half `resend_after`, so
/// that the daemons' periodic resends still repair a lost datagram.
#[derive(Debug, Default)]
pub struct Collected {
    figures: HashMap<(String, Micros), u64>,
    shipped: [HashMap<(String, Micros), u64>; 2],
    shipped_at: Micros,
}

impl Collected {
    /// Adds one figure; false if the table is full and it was dropped.
    pub fn add(&mut self, key: String, window_start: Micros, count: u64, max: usize) -> bool {
        let full = self.figures.len() >= max;
        match self.figures.entry((key, window_start)) {
            Entry::Occupied(mut c) => {
                let c = c.get_mut();
                *c = (*c).max(count);
            }
            Entry::Vacant(_) if full => return false,
            Entry::Vacant(v) => {
                v.insert(count);
            }
        }
        true
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.figures.is_empty()
    }

    /// Records what was just shipped across at `now` (the record before it is kept too).
    pub fn shipped(&mut self, entries: &[ShipEntry], now: Micros) {
        if entries.is_empty() {
            return;
        }
        self.shipped[1] = std::mem::take(&mut self.shipped[0]);
        self.shipped[0] = entries
            .iter()
            .map(|e| ((e.key.clone(), e.window_start), e.count))
            .collect();
        self.shipped_at = now;
    }

    /// Takes everything gathered that is above what the last two shipments carried (a
    /// record older than half `resend_after` is dropped first: a daemon's resend comes
    /// `resend_after` after its own shipment, which may precede the sender's by up to an
    /// interval, and must not be taken for a duplicate).
    ///
    /// At most `max_bytes` of entries (as [`crate::ship::entry_bytes`] estimates them) are
    /// taken, the highest figures first (ties by key and window, so a simulation replays);
    /// the rest waits in the table for the next shipment, so a sender's shipment stays
    /// within the interval's budget however many daemons collect to it ([`gather_budget`]).
    pub fn take(&mut self, now: Micros, resend_after: Micros, max_bytes: usize) -> Vec<ShipEntry> {
        // Also after a clock [`stepped_back`]: the daemons' resends must still get through.
        if stepped_back(now, self.shipped_at, 0) || now - self.shipped_at > resend_after / 2 {
            self.shipped = Default::default();
        }
        let shipped = &self.shipped;
        let mut news: Vec<((String, Micros), u64)> = std::mem::take(&mut self.figures)
            .into_iter()
            .filter(|(k, c)| shipped.iter().all(|m| m.get(k).is_none_or(|s| c > s)))
            .collect();
        let all: usize = news
            .iter()
            .map(|((key, w), c)| crate::ship::entry_bytes(key, *w, *c))
            .sum();
        if all > max_bytes {
            news.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            let mut used = 0;
            let mut fits = 0;
            for ((key, w), c) in &news {
                let b = crate::ship::entry_bytes(key, *w, *c);
                if used + b > max_bytes {
                    break;
                }
                used += b;
                fits += 1;
            }
            self.figures.extend(news.drain(fits..));
        }
        news.into_iter()
            .map(|((key, window_start), count)| ShipEntry {
                key,
                window_start,
                count,
            })
            .collect()
    }
}

/// A daemon's own selection and what it gathered, one entry per (key, window), the max.
pub fn merged(own: Vec<ShipEntry>, gathered: Vec<ShipEntry>) -> Vec<ShipEntry> {
    if gathered.is_empty() {
        return own;
    }
    let mut by: HashMap<(String, Micros), u64> = HashMap::with_capacity(own.len());
    for e in own.into_iter().chain(gathered) {
        let c = by.entry((e.key, e.window_start)).or_insert(0);
        *c = (*c).max(e.count);
    }
    by.into_iter()
        .map(|((key, window_start), count)| ShipEntry {
            key,
            window_start,
            count,
        })
        .collect()
}

/// The entry bytes a daemon may take from its [`Collected`] this interval: what the budget
/// leaves beside its own selection when it is the sender (both go across in one shipment),
/// the whole budget otherwise (only the gathered figures go across). Without it a sender
/// shipped its own budget's worth plus everything its daemons collected: up to a budget per
/// daemon of its region, on the WAN, in one burst.
pub fn gather_budget(sender: bool, own: &[ShipEntry], max_bytes: usize) -> usize {
    if !sender {
        return max_bytes;
    }
    let own: usize = own.iter().map(ShipEntry::bytes).sum();
    max_bytes.saturating_sub(own)
}

/// What a relaying daemon sends in one interval, split from its own selection and what its
/// region's daemons collected to it. The split is a decision, so it lives here: the daemon and
/// the simulator ship alike.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shipment {
    /// To the region's sender ([`Hop::Collect`]): this daemon's own selection, when it is not
    /// the sender.
    pub collect: Vec<ShipEntry>,
    /// Across, to [`Plan::cross`]: the sender's own selection merged with what it gathered; a
    /// daemon that is not the sender ships what was gathered here anyway (another daemon's view
    /// elected it), so nothing collected is dropped.
    pub across: Vec<ShipEntry>,
    /// Whether `across` is to be recorded with [`Collected::shipped`]: only by a sender with
    /// peers in its region. Alone, nothing is collected to it that could repeat a shipment, and
    /// a non-sender's shipment is not the region's.
    pub record: bool,
}

/// The shipment of a daemon that is its region's sender or not (`sender`), with or without
/// other live daemons in its region (`peers`), from its own selection and what it gathered
/// ([`Collected::take`]).
pub fn shipment(
    sender: bool,
    peers: bool,
    own: Vec<ShipEntry>,
    gathered: Vec<ShipEntry>,
) -> Shipment {
    if sender {
        Shipment {
            collect: Vec::new(),
            across: merged(own, gathered),
            record: peers,
        }
    } else {
        Shipment {
            collect: own,
            across: gathered,
            record: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m<'a>(node_id: &'a str, region: &'a str, relays: bool) -> Member<'a> {
        Member {
            node_id,
            region,
            relays,
            forwards: false,
        }
    }

    fn cluster() -> Vec<Member<'static>> {
        vec![
            m("a-2", "a", true),
            m("a-1", "a", true),
            m("a-3", "a", true),
            m("b-3", "b", true),
            m("b-2", "b", true),
            m("c-1", "c", false),
            m("c-2", "c", false),
        ]
    }

    #[test]
    fn the_lowest_relaying_id_of_each_region_is_its_gateway() {
        let ms = cluster();
        assert_eq!(gateway(&ms, "a"), Some("a-1"));
        assert_eq!(gateway(&ms, "b"), Some("b-2"));
        // A region whose members do not relay has none: they are sent to directly.
        assert_eq!(gateway(&ms, "c"), None);
        assert_eq!(gateway(&ms, "nowhere"), None);
    }

    #[test]
    fn a_gateway_ships_once_per_region_and_the_others_collect_to_it() {
        let ms = cluster();
        let p = plan(&ms, 1);
        assert!(p.sender);
        assert_eq!(p.collect_to, None);
        assert_eq!(
            p.cross,
            vec![(4, Hop::Relay), (5, Hop::Direct), (6, Hop::Direct)]
        );
        assert_eq!(p.fan_out, vec![0, 2]);
        let p = plan(&ms, 2);
        assert!(!p.sender);
        assert_eq!(p.collect_to, Some(1));
        // A daemon that is not the gateway knows the cross targets too: figures that were
        // collected to it (a stale view elsewhere) are still shipped, not lost.
        assert_eq!(p.cross, plan(&ms, 1).cross);
    }

    #[test]
    fn the_dead_gateway_is_replaced_by_the_next_id() {
        let mut ms = cluster();
        ms.remove(1);
        assert_eq!(gateway(&ms, "a"), Some("a-2"));
        let p = plan(&ms, 0);
        assert!(p.sender);
        assert_eq!(plan(&ms, 1).collect_to, Some(0));
    }

    #[test]
    fn alone_a_daemon_is_its_own_gateway_even_before_it_is_listed_as_relaying() {
        let ms = [m("a-9", "a", false), m("b-1", "b", true)];
        let p = plan(&ms, 0);
        assert!(p.sender);
        assert_eq!(p.cross, vec![(1, Hop::Relay)]);
        assert!(p.fan_out.is_empty());
        assert_eq!(plan(&[], 0), Plan::default());
    }

    #[test]
    fn two_views_that_both_elect_themselves_only_duplicate() {
        // a-1 has not heard of a-0 yet: both believe they are a's gateway, and both ship to
        // b's gateway. What b holds is the max per key, so the duplicate changes nothing.
        let full = [
            m("a-0", "a", true),
            m("a-1", "a", true),
            m("b-1", "b", true),
        ];
        let partial = [m("a-1", "a", true), m("b-1", "b", true)];
        assert!(plan(&full, 0).sender);
        assert!(plan(&partial, 0).sender);
        let params = crate::Params::FixedWindow {
            limit: 1000,
            window: crate::algo::Window::Epoch(60_000_000),
        };
        let key = crate::matching::store_key("api|k=1", "g", crate::algo::Kind::FixedWindow);
        let now = 60_000_000 * 10 + 5;
        let mut b = crate::merge::RemoteCounts::new("b", 100, 7);
        // Both senders' figures for the key, and a late, lower one from the first.
        for figure in [170, 170, 150] {
            b.merge("a", &key, &params, 60_000_000 * 10, figure, now);
        }
        assert_eq!(b.remote_for(&key, &params, now, 2).cur, 170);
    }

    #[test]
    fn with_a_fan_out_a_gateway_ships_to_its_peers_and_forwards_to_them() {
        // Twelve regions r00..r11 of two daemons, all forwarding, but r11 does not; and c,
        // which does not relay, is sent to directly.
        let names: Vec<(String, String)> = (0..12)
            .flat_map(|r| (1..3).map(move |d| (format!("r{r:02}-{d}"), format!("r{r:02}"))))
            .collect();
        let mut ms: Vec<Member<'_>> = names
            .iter()
            .map(|(n, r)| Member {
                node_id: n,
                region: r,
                relays: true,
                forwards: r != "r11",
            })
            .chain([m("c-1", "c", false)])
            .collect();
        let region_of = |p: &Plan, ms: &[Member<'_>]| -> Vec<(String, Hop)> {
            p.cross
                .iter()
                .map(|&(i, h)| (ms[i].region.to_string(), h))
                .collect()
        };
        // r00 of 11 forwarding regions, fan-out 3: base 3, peers r01, r03, r09; r11 (does
        // not forward) and c point-to-point.
        let p = plan_with(&ms, 0, 3);
        assert!(p.sender);
        let peers: Vec<&str> = p.forward_to.iter().map(|&i| ms[i].node_id).collect();
        assert_eq!(peers, vec!["r01-1", "r03-1", "r09-1"]);
        let want: Vec<(String, Hop)> = [("c".to_string(), Hop::Direct)]
            .into_iter()
            .chain(
                ["r01", "r03", "r09", "r11"]
                    .iter()
                    .map(|r| (r.to_string(), Hop::Relay)),
            )
            .collect();
        assert_eq!(region_of(&p, &ms), want);
        // Along the origin's tree: r00 passes its own figures to every peer, r10's (one hop
        // from r10: offset 1) on to r01 (offset 2), and r01's (offset 10, a leaf) on to nobody.
        assert!(p.passes_on(&ms, "r00", "r00", "r03"));
        assert!(!p.passes_on(&ms, "r00", "r01", "r03"));
        assert!(p.passes_on(&ms, "r00", "r10", "r01"));
        assert!(!p.passes_on(&ms, "r00", "c", "r01"));
        // Fan-out 0, or a fan-out that covers every region: point-to-point as before.
        assert_eq!(plan_with(&ms, 0, 0), plan(&ms, 0));
        assert_eq!(plan_with(&ms, 0, 10).cross, plan(&ms, 0).cross);
        assert!(plan_with(&ms, 0, 10).forward_to.is_empty());
        // A region that does not forward ships point-to-point and forwards nothing.
        let p = plan_with(&ms, 22, 3);
        assert!(p.forward_to.is_empty() && p.cross.len() == 12);
        // r02 down (left the membership): the ring closes over it; r01's peers move on.
        ms.retain(|m| m.region != "r02");
        let p = plan_with(&ms, 2, 3);
        let peers: Vec<&str> = p.forward_to.iter().map(|&i| ms[i].region).collect();
        assert_eq!(peers, vec!["r03", "r05", "r00"]);
    }

    #[test]
    fn cross_region_traffic_grows_with_region_pairs_not_daemons() {
        assert_eq!(cross_datagrams(3, 3, 1, false), 54);
        assert_eq!(cross_datagrams(3, 3, 1, true), 6);
        assert_eq!(cross_datagrams(3, 30, 2, true), 12);
        assert_eq!(cross_datagrams(1, 5, 4, false), 0);
    }

    #[test]
    fn a_senders_shipment_stays_within_the_budget_and_the_rest_waits() {
        let e = |key: &str, count| ShipEntry {
            key: key.into(),
            window_start: 0,
            count,
        };
        let bytes = |es: &[ShipEntry]| -> usize { es.iter().map(ShipEntry::bytes).sum() };
        let one = bytes(&[e("k1", 10)]);
        let mut c = Collected::default();
        for (k, n) in [("k1", 10), ("k2", 30), ("k3", 20), ("k4", 20)] {
            assert!(c.add(k.into(), 0, n, 100));
        }
        // The sender's own selection takes one entry of a three-entry budget: two gathered
        // ones go, the highest first (ties by key), the other two wait.
        let own = [e("k9", 5)];
        let room = gather_budget(true, &own, 3 * one);
        assert_eq!(room, 2 * one);
        assert_eq!(gather_budget(false, &own, 3 * one), 3 * one);
        let got = c.take(0, 1000, room);
        assert_eq!(got, vec![e("k2", 30), e("k3", 20)]);
        assert!(bytes(&merged(own.to_vec(), got)) <= 3 * one);
        assert!(!c.is_empty());
        // Nothing fits: everything waits; then the rest goes.
        assert!(c.take(0, 1000, 0).is_empty());
        let mut rest = c.take(0, 1000, usize::MAX);
        rest.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(rest, vec![e("k1", 10), e("k4", 20)]);
        assert!(c.is_empty());
    }

    #[test]
    fn gathered_figures_keep_the_max_and_the_bound() {
        let mut c = Collected::default();
        assert!(c.add("k1".into(), 0, 5, 2));
        assert!(c.add("k1".into(), 0, 3, 2));
        assert!(c.add("k2".into(), 0, 1, 2));
        assert!(!c.add("k3".into(), 0, 1, 2));
        // A known key still rises when the table is full.
        assert!(c.add("k2".into(), 0, 9, 2));
        // The last shipment carried k2 at 9 already, k1 at less than 5.
        let e = |key: &str, count| ShipEntry {
            key: key.into(),
            window_start: 0,
            count,
        };
        c.shipped(&[e("k2", 9)], 100);
        c.shipped(&[e("k1", 4)], 200);
        // An empty shipment keeps the record.
        c.shipped(&[], 300);
        let got = c.take(300, 1000, usize::MAX);
        assert_eq!(got, vec![e("k1", 5)]);
        assert!(c.add("k2".into(), 0, 10, 2));
        let got = [got, c.take(300, 1000, usize::MAX)].concat();
        // Past `resend_after`, a resend at the shipped figure goes out again (repair).
        assert!(c.add("k9".into(), 0, 4, 2));
        c.shipped(&[e("k9", 4)], 400);
        assert!(c.add("k9".into(), 0, 4, 2));
        assert!(c.take(500, 1000, usize::MAX).is_empty());
        assert!(c.add("k9".into(), 0, 4, 2));
        assert_eq!(c.take(901, 1000, usize::MAX), vec![e("k9", 4)]);
        assert!(c.is_empty());
        // A clock stepped back (before the last shipment): how long ago it was is unknown,
        // so the record is dropped and a resend goes out again.
        c.shipped(&[e("k9", 4)], 1_000);
        assert!(c.add("k9".into(), 0, 4, 2));
        assert_eq!(c.take(700, 1000, usize::MAX), vec![e("k9", 4)]);
        let own = vec![ShipEntry {
            key: "k1".into(),
            window_start: 0,
            count: 7,
        }];
        let mut all = merged(own, got);
        all.sort_by(|a, b| a.key.cmp(&b.key));
        let counts: Vec<(&str, u64)> = all.iter().map(|e| (e.key.as_str(), e.count)).collect();
        assert_eq!(counts, vec![("k1", 7), ("k2", 10)]);
    }
}
