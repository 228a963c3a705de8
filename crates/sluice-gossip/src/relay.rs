//! Where a daemon's datagrams go: [`targets`] for `every_daemon` and `one_per_region`, and
//! for `shippers: region_sender` the core's election ([`sluice_core::relay`]) as addresses.
//! What a region's sender gathers from its daemons is the core's [`relay::Collected`].
//!
//! Every daemon of a region sends its busy selection to the region's sender (a
//! [`Hop::Collect`] packet); the sender keeps the max per (key, window), which is the
//! region's figure since its daemons count in one store, and ships its own selection and what
//! it gathered once per remote region, to that region's receiver ([`Hop::Relay`]), which
//! merges it and passes it on to the other daemons of its region ([`Hop::FanOut`]).

use crate::node::{Config, Member, Shippers};
use sluice_core::relay::{self, Hop};
use std::net::SocketAddr;

/// The live members as the core's election takes them (borrowed, in the same order).
pub(crate) fn core_members(live: &[Member]) -> Vec<relay::Member<'_>> {
    live.iter()
        .map(|m| relay::Member {
            node_id: &m.node_id,
            region: &m.region,
            relays: m.relays,
            forwards: m.forwards,
        })
        .collect()
}

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
    /// The peer regions' receivers (`gossip.fanout`): address and region.
    pub forward_to: Vec<(SocketAddr, String)>,
    /// The forwarding regions in ring order (empty when the ring does not forward).
    pub ring: Vec<String>,
    /// The fan-out the routes were planned with.
    pub fanout: usize,
}

impl Routes {
    /// Whether `me` passes `origin`'s figures on to `peer` (region names): along the
    /// origin's tree ([`sluice_core::forward::passes_on`]).
    pub fn passes_on(&self, me: &str, origin: &str, peer: &str) -> bool {
        let at = |r: &str| self.ring.iter().position(|x| x == r);
        match (at(me), at(origin), at(peer)) {
            (Some(m), Some(o), Some(p)) => {
                sluice_core::forward::passes_on(self.ring.len(), m, o, p, self.fanout)
            }
            _ => false,
        }
    }
}

/// The routes of daemon `me` of `region` at fan-out `fanout`, from the live members (it
/// may be missing from them while the membership settles: it counts as relaying, and as
/// forwarding when `fanout` is above 0).
pub(crate) fn routes(me: &str, region: &str, live: &[Member], fanout: usize) -> Routes {
    let mut ms = core_members(live);
    let at = match ms.iter().position(|m| m.node_id == me) {
        Some(i) => i,
        None => {
            ms.push(relay::Member {
                node_id: me,
                region,
                relays: true,
                forwards: fanout > 0,
            });
            ms.len() - 1
        }
    };
    let p = relay::plan_with(&ms, at, fanout);
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
        forward_to: p
            .forward_to
            .iter()
            .filter_map(|&i| Some((addr(i)?, live.get(i)?.region.clone())))
            .collect(),
        ring: p
            .ring
            .iter()
            .filter_map(|&i| Some(live.get(i)?.region.clone()))
            .collect(),
        fanout,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, region: &str, port: u16, relays: bool) -> Member {
        Member {
            node_id: id.into(),
            region: region.into(),
            addr: ([127, 0, 0, 1], port).into(),
            relays,
            forwards: false,
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
        let r = routes("a-2", "a", &live(), 0);
        assert!(!r.sender);
        assert_eq!(r.collect_to.map(|a| a.port()), Some(1));
        let ports: Vec<(u16, Hop)> = r.cross.iter().map(|(a, h)| (a.port(), *h)).collect();
        assert_eq!(
            ports,
            vec![(3, Hop::Relay), (5, Hop::Direct), (6, Hop::Direct)]
        );
        assert!(routes("a-1", "a", &live(), 0).sender);
        // Not yet in its own view of the membership: it counts as relaying, and is the
        // sender when its id is the lowest.
        assert!(routes("a-0", "a", &live(), 0).sender);
        let f: Vec<u16> = fan_out("b-1", "b", &live())
            .iter()
            .map(|a| a.port())
            .collect();
        assert_eq!(f, vec![4]);
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
