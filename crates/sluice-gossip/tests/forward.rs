//! `gossip.fanout` with real nodes on loopback: twelve regions of one daemon, fan-out 3. A
//! figure changed in one region reaches the eleven others through its three peers and along
//! its tree, each region hearing it once: as many cross-region datagrams as point-to-point,
//! at most `sluice_core::forward::hops` hops.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use common::{clear_of_window_end, params, wait_for};
use sluice_core::algo::Kind;
use sluice_core::forward::{hops, passes_on};
use sluice_core::matching::store_key;
use sluice_core::ship::Observed;
use sluice_gossip::{Scope, Shippers, now_micros};
use std::time::Duration;

const REGIONS: usize = 12;
const FANOUT: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_figure_reaches_every_region_along_its_tree_once() {
    clear_of_window_end().await;
    let nodes = cluster::cluster(
        REGIONS,
        1,
        |r, id, seeds| {
            let mut c = common::cfg(r, id, seeds, Some(b"a shared key of enough bytes"));
            c.shippers = Shippers::RegionSender;
            c.fanout = FANOUT;
            // No periodic resend while the test runs: every datagram counted is the change's.
            c.budget.resend_after = 3_600_000_000;
            c
        },
        true,
    )
    .await;
    let nodes: Vec<_> = nodes.into_iter().flatten().collect();
    // Every daemon planned its interval with the whole ring (the membership settled before
    // its last tick), so that all agree on the trees.
    wait_for("the whole ring everywhere", Duration::from_secs(10), || {
        nodes
            .iter()
            .all(|n| n.gauges().forward_ring == REGIONS as u64)
    })
    .await;
    let p = params();
    let k = store_key("api|api_key=k1", "g", Kind::FixedWindow);
    // Regions a..l sort as the ring does: a is 0. Nothing was busy before.
    let before: Vec<u64> = nodes
        .iter()
        .map(|n| n.metrics().packets_sent(Scope::CrossRegion))
        .collect();
    assert!(before.iter().all(|b| *b == 0), "{before:?}");
    nodes[0].observe(&k, &p, now_micros(), Observed::count(150, 10));
    wait_for("a's figure everywhere", Duration::from_secs(20), || {
        nodes[1..]
            .iter()
            .all(|n| n.remote_for(&k, &p, now_micros()).cur == 150)
    })
    .await;
    // Attributed to a on every hop.
    for n in &nodes[1..] {
        let held = n.remote_snapshot();
        assert!(held.iter().all(|(_, region, ..)| region == "a"), "{held:?}");
    }
    // a shipped to its three peers only; every other region forwarded it to exactly the
    // children it has in a's tree, once each.
    let sent: Vec<u64> = nodes
        .iter()
        .map(|n| n.metrics().packets_sent(Scope::CrossRegion))
        .collect();
    let forwarded: Vec<(u64, u64)> = nodes
        .iter()
        .map(|n| n.metrics().forwarded_total())
        .collect();
    let children = |me: usize| {
        (0..REGIONS)
            .filter(|p| passes_on(REGIONS, me, 0, *p, FANOUT))
            .count() as u64
    };
    assert_eq!(sent[0], FANOUT as u64, "{sent:?}");
    assert_eq!(forwarded[0], (0, 0));
    for r in 1..REGIONS {
        assert_eq!(
            forwarded[r],
            (children(r), children(r)),
            "region {r}: {forwarded:?}"
        );
        assert_eq!(sent[r], children(r), "region {r}: {sent:?}");
    }
    // Eleven datagrams across in all, point-to-point's count, in at most four hops.
    assert_eq!(sent.iter().sum::<u64>(), (REGIONS - 1) as u64);
    assert_eq!(hops(REGIONS, FANOUT), 4);
    for n in &nodes {
        n.shutdown().await;
    }
}
