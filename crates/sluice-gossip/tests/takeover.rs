//! `shippers: region_sender` at the default timings (1 s shipments, 500 ms gossip rounds):
//! a live sender is never replaced, and one that goes silent is replaced from its last sign
//! of life within one interval (`sluice_core::liveness`), before the membership's failure
//! detector calls it dead; the other regions then reach its region through its successor.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use common::{clear_of_window_end, params, wait_for};
use sluice_core::algo::Kind;
use sluice_core::matching::store_key;
use sluice_core::ship::Observed;
use sluice_gossip::{Config, Node, Scope, Shippers, now_micros};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const KEY: &[u8] = b"a shared key of enough bytes";

/// The default timings, not the fast ones of the other node tests.
fn cfg(region: &str, id: &str, seeds: &[SocketAddr]) -> Config {
    let mut c = common::cfg(region, id, seeds, Some(KEY));
    let d = Config::new(region, id, c.listen_addr);
    (c.ship_interval, c.gossip_interval) = (d.ship_interval, d.gossip_interval);
    c.shippers = Shippers::RegionSender;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_sender_is_replaced_within_an_interval_and_a_live_one_never() {
    clear_of_window_end().await;
    let nodes = cluster::cluster(3, 3, cfg, true).await;
    let (p, k) = (
        params(),
        store_key("api|api_key=k1", "g", Kind::FixedWindow),
    );

    // Ten intervals with figures flowing from a non-sender of every region: nobody takes
    // over, nobody but the senders sends across, and the figures arrive everywhere.
    let takeovers = |ns: &[Vec<Node>]| -> Vec<u64> {
        ns.iter()
            .flatten()
            .map(|n| n.metrics().sender_takeovers())
            .collect()
    };
    // Before the membership settled each daemon was its own sender for a moment.
    let cross = |ns: &[Vec<Node>]| -> Vec<u64> {
        ns.iter()
            .flatten()
            .map(|n| n.metrics().packets_sent(Scope::CrossRegion))
            .collect()
    };
    let settled = cross(&nodes);
    let quiet_until = Instant::now() + Duration::from_secs(10);
    let mut count = 100;
    while Instant::now() < quiet_until {
        count += 1;
        nodes[0][2].observe(&k, &p, now_micros(), Observed::count(count, 10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for("a's figure in b and c", Duration::from_secs(10), || {
        nodes[1..]
            .iter()
            .flatten()
            .all(|n| n.remote_for(&k, &p, now_micros()).cur == count)
    })
    .await;
    assert!(
        takeovers(&nodes).iter().all(|t| *t == 0),
        "{:?}",
        takeovers(&nodes)
    );
    let quiet = cross(&nodes);
    for (i, (q, s)) in quiet.iter().zip(&settled).enumerate() {
        // a-1 ships a's figure; b's and c's senders have nothing to ship, the others send
        // nothing across.
        assert_eq!(i == 0, q > s, "daemon {i}: {settled:?} -> {quiet:?}");
    }

    // a's sender goes silent. a-2 takes over: it sends across before the membership of any
    // daemon has dropped a-1.
    nodes[0][0].shutdown().await;
    let killed = Instant::now();
    let (a2, a3) = (&nodes[0][1], &nodes[0][2]);
    let before = a2.metrics().packets_sent(Scope::CrossRegion);
    wait_for("a-2 to take over", Duration::from_secs(30), || {
        a2.metrics().sender_takeovers() == 1
            && a2.metrics().packets_sent(Scope::CrossRegion) > before
    })
    .await;
    let took = killed.elapsed();
    let listed = cluster::listed_but_a1(&nodes);
    assert!(
        listed.iter().all(|l| *l == 9),
        "the membership had dropped a-1 first: {listed:?}"
    );
    assert!(a2.region_sender());

    // b's figures reach a-3 through a-2, the daemon that now relays for a.
    let kb = store_key("api|api_key=k2", "g", Kind::FixedWindow);
    nodes[1][2].observe(&kb, &p, now_micros(), Observed::count(300, 10));
    wait_for("b's figure at a-3", Duration::from_secs(30), || {
        a3.remote_for(&kb, &p, now_micros()).cur == 300
    })
    .await;
    let heard = killed.elapsed();
    wait_for(
        "the membership to drop a-1",
        Duration::from_secs(30),
        || a2.members().len() == 8,
    )
    .await;
    eprintln!(
        "takeover: a-2 sent across {:.2} s after a-1 stopped; b's figure reached a-3 after {:.2} s; a-2's membership dropped a-1 after {:.2} s",
        took.as_secs_f64(),
        heard.as_secs_f64(),
        killed.elapsed().as_secs_f64()
    );
    // Only a-2 took over, once.
    let t = takeovers(&nodes);
    assert_eq!(t.iter().sum::<u64>(), 1, "{t:?}");
    for n in nodes.iter().flatten().skip(1) {
        n.shutdown().await;
    }
}
