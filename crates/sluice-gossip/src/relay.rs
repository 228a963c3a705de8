//! Where a daemon's datagrams go: [`targets`] for `every_daemon` and `one_per_region`, and
//! for `shippers: region_sender` the core's election ([`sluice_core::relay`]) as addresses,
//! and the figures a region's sender gathers from its daemons.
//!
//! Every daemon of a region sends its busy selection to the region's sender (a
//! [`Hop::Collect`] packet); the sender keeps the max per (key, window), which is the
//! region's figure since its daemons count in one store, and ships its own selection and what
//! it gathered once per remote region, to that region's receiver ([`Hop::Relay`]), which
//! merges it and passes it on to the other daemons of its region ([`Hop::FanOut`]).

use crate::node::{Config, Member, Shippers};
use sluice_core::Micros;
use sluice_core::relay::{self, Hop};
use sluice_core::ship::ShipEntry;
use std::collections::HashMap;
use std::net::SocketAddr;

/// Who gets this daemon's figures, and whether it ships at all.
pub(crate) fn targets(cfg: &Config, live: &[Member]) -> (bool, Vec<SocketAddr>) {
    let ships = match cfg.shippers {
        Shippers::EveryDaemon | Shippers::RegionSender => true,
        Shippers::OnePerRegion => live
            .iter()
            .filter(|m| m.region == cfg.region)
            .map(|m| m.node_id.as_str())
            .chain(std::iter::once(cfg.node_id.as_str()))
            .min()
            .is_some_and(|first| first == cfg.node_id),
    };
    let mut to: Vec<SocketAddr> = live
        .iter()
        .filter(|m| m.region != cfg.region)
        .map(|m| m.addr)
        .collect();
    to.sort_unstable();
    to.dedup();
    (ships, to)
}

/// Where one daemon's datagrams go this interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Routes {
    /// This daemon is its region's sender (and receiver).
    pub sender: bool,
    /// The region's sender, when this daemon is not.
    pub collect_to: Option<SocketAddr>,
    /// Cross-region destinations and how each is reached.
    pub cross: Vec<(SocketAddr, Hop)>,
}

/// The routes of daemon `me` of `region`, from the live members (it may be missing from
/// them while the membership settles: it counts as relaying).
pub(crate) fn routes(me: &str, region: &str, live: &[Member]) -> Routes {
    let mut ms: Vec<relay::Member<'_>> = live
        .iter()
        .map(|m| relay::Member {
            node_id: &m.node_id,
            region: &m.region,
            relays: m.relays,
        })
        .collect();
    let at = match ms.iter().position(|m| m.node_id == me) {
        Some(i) => i,
        None => {
            ms.push(relay::Member {
                node_id: me,
                region,
                relays: true,
            });
            ms.len() - 1
        }
    };
    let p = relay::plan(&ms, at);
    let addr = |i: usize| live.get(i).map(|m| m.addr);
    let mut cross: Vec<(SocketAddr, Hop)> = p
        .cross
        .iter()
        .filter_map(|&(i, h)| Some((addr(i)?, h)))
        .collect();
    cross.sort_unstable_by_key(|(a, _)| *a);
    cross.dedup_by_key(|(a, _)| *a);
    Routes {
        sender: p.sender,
        collect_to: p.collect_to.and_then(addr),
        cross,
    }
}

/// The other live daemons of `region`: where a relayed packet is passed on.
pub(crate) fn fan_out(me: &str, region: &str, live: &[Member]) -> Vec<SocketAddr> {
    let mut to: Vec<SocketAddr> = live
        .iter()
        .filter(|m| m.region == region && m.node_id != me)
        .map(|m| m.addr)
        .collect();
    to.sort_unstable();
    to.dedup();
    to
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
pub(crate) struct Collected {
    figures: HashMap<(String, Micros), u64>,
    shipped: [HashMap<(String, Micros), u64>; 2],
    shipped_at: Micros,
}

impl Collected {
    /// Adds one figure; false if the table is full and it was dropped.
    pub fn add(&mut self, key: String, window_start: Micros, count: u64, max: usize) -> bool {
        let full = self.figures.len() >= max;
        match self.figures.get_mut(&(key.clone(), window_start)) {
            Some(c) => *c = (*c).max(count),
            None if full => return false,
            None => {
                self.figures.insert((key, window_start), count);
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
    pub fn take(&mut self, now: Micros, resend_after: Micros) -> Vec<ShipEntry> {
        if now.saturating_sub(self.shipped_at) > resend_after / 2 {
            self.shipped = Default::default();
        }
        let shipped = &self.shipped;
        std::mem::take(&mut self.figures)
            .into_iter()
            .filter(|(k, c)| shipped.iter().all(|m| m.get(k).is_none_or(|s| c > s)))
            .map(|((key, window_start), count)| ShipEntry {
                key,
                window_start,
                count,
            })
            .collect()
    }
}

/// A daemon's own selection and what it gathered, one entry per (key, window), the max.
pub(crate) fn merged(own: Vec<ShipEntry>, gathered: Vec<ShipEntry>) -> Vec<ShipEntry> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, region: &str, port: u16, relays: bool) -> Member {
        Member {
            node_id: id.into(),
            region: region.into(),
            addr: ([127, 0, 0, 1], port).into(),
            relays,
        }
    }

    fn live() -> Vec<Member> {
        vec![
            member("a-1", "a", 1, true),
            member("a-2", "a", 2, true),
            member("b-2", "b", 4, true),
            member("b-1", "b", 3, true),
            member("c-1", "c", 5, false),
            member("c-2", "c", 6, false),
        ]
    }

    #[test]
    fn routes_are_addresses_of_the_elected() {
        let r = routes("a-2", "a", &live());
        assert!(!r.sender);
        assert_eq!(r.collect_to.map(|a| a.port()), Some(1));
        let ports: Vec<(u16, Hop)> = r.cross.iter().map(|(a, h)| (a.port(), *h)).collect();
        assert_eq!(
            ports,
            vec![(3, Hop::Relay), (5, Hop::Direct), (6, Hop::Direct)]
        );
        assert!(routes("a-1", "a", &live()).sender);
        // Not yet in its own view of the membership: it counts as relaying, and is the
        // sender when its id is the lowest.
        assert!(routes("a-0", "a", &live()).sender);
        let f: Vec<u16> = fan_out("b-1", "b", &live())
            .iter()
            .map(|a| a.port())
            .collect();
        assert_eq!(f, vec![4]);
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
        let got = c.take(300, 1000);
        assert_eq!(got, vec![e("k1", 5)]);
        assert!(c.add("k2".into(), 0, 10, 2));
        let got = [got, c.take(300, 1000)].concat();
        // Past `resend_after`, a resend at the shipped figure goes out again (repair).
        assert!(c.add("k9".into(), 0, 4, 2));
        c.shipped(&[e("k9", 4)], 400);
        assert!(c.add("k9".into(), 0, 4, 2));
        assert!(c.take(500, 1000).is_empty());
        assert!(c.add("k9".into(), 0, 4, 2));
        assert_eq!(c.take(901, 1000), vec![e("k9", 4)]);
        assert!(c.is_empty());
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

    #[test]
    fn targets_are_the_other_regions_and_one_shipper_is_the_lowest_id() {
        let mut cfg = Config::new("eu", "eu-2", ([127, 0, 0, 1], 1).into());
        let live = vec![
            member("eu-1", "eu", 1, false),
            member("eu-2", "eu", 2, false),
            member("us-1", "us", 3, false),
            member("ap-1", "ap", 4, false),
        ];
        let (ships, to) = targets(&cfg, &live);
        assert!(ships);
        assert_eq!(to.len(), 2);
        assert!(to.iter().all(|a| a.port() >= 3));
        cfg.shippers = Shippers::OnePerRegion;
        assert!(!targets(&cfg, &live).0);
        cfg.node_id = "eu-1".into();
        assert!(targets(&cfg, &live).0);
        // Alone (or before membership settles), a daemon ships.
        assert!(targets(&cfg, &[]).0);
    }
}
