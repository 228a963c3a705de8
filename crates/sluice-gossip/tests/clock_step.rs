//! A wall clock stepped under a running cluster (NTP, an operator) at the default timings:
//! the region's sender election measures silence on the monotonic clock, so a step forward
//! passes no live sender over and a step back does not keep a dead one elected
//! (`sluice_core::liveness`).

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use common::{clear_of_window_end, wait_for};
use sluice_clock::{Clock, SteppedClock};
use sluice_gossip::{Config, Node, Scope, Shippers};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const KEY: &[u8] = b"a shared key of enough bytes";
const MINUTE: i64 = 60_000_000;

/// The default timings (1 s shipments, 500 ms gossip rounds), every node on `clock`: one
/// machine's clock, stepped for all of them at once.
fn cfg(clock: Arc<SteppedClock>) -> impl Fn(&str, &str, &[SocketAddr]) -> Config {
    move |region, id, seeds| {
        let mut c = common::cfg(region, id, seeds, Some(KEY));
        let d = Config::new(region, id, c.listen_addr);
        (c.ship_interval, c.gossip_interval) = (d.ship_interval, d.gossip_interval);
        c.shippers = Shippers::RegionSender;
        c.clock = clock.clone();
        c
    }
}

/// Waits until a-1 has sent its region `rounds` more beacons (two datagrams each): the
/// other daemons' elections ran many times over (every eighth of an interval) meanwhile.
async fn beacons(a1: &Node, rounds: u64) {
    let from = a1.metrics().packets_sent(Scope::InRegion);
    wait_for("a-1's beacons", Duration::from_secs(30), || {
        a1.metrics().packets_sent(Scope::InRegion) >= from + 2 * rounds
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stepped_wall_clock_neither_replaces_a_live_sender_nor_keeps_a_dead_one() {
    clear_of_window_end().await;
    let clock = Arc::new(SteppedClock::new());
    let nodes = cluster::cluster(2, 3, cfg(clock.clone()), true).await;
    let passed = |ns: &[Vec<Node>]| -> Vec<u64> {
        ns.iter()
            .flatten()
            .map(|n| n.metrics().senders_passed_over())
            .collect()
    };
    let quiet = passed(&nodes);
    let a1 = &nodes[0][0];

    // Ten minutes forward: a wall-clock silence of ten minutes since a-1 was last heard,
    // and none on the monotonic clock. Eight beacon rounds later (two seconds, more than
    // twice the bound), nobody has been passed over.
    let wall = clock.now();
    clock.step_wall(10 * MINUTE);
    beacons(a1, 8).await;
    assert_eq!(
        passed(&nodes),
        quiet,
        "a step forward passed a live sender over"
    );

    // Seventy minutes back (an hour before the start). Then a-1 dies: a-2 takes over from
    // a-1's last sign of life, before the membership drops a-1, as with no step.
    clock.step_wall(-70 * MINUTE);
    assert!(clock.now() < wall);
    beacons(a1, 8).await;
    assert_eq!(
        passed(&nodes),
        quiet,
        "a step back passed a live sender over"
    );
    a1.shutdown().await;
    let a2 = &nodes[0][1];
    let before = a2.metrics().packets_sent(Scope::CrossRegion);
    wait_for("a-2 to take over", Duration::from_secs(30), || {
        a2.metrics().sender_takeovers() == 1
            && a2.metrics().packets_sent(Scope::CrossRegion) > before
    })
    .await;
    let listed = cluster::listed_but_a1(&nodes);
    assert!(
        listed.iter().all(|l| *l == 6),
        "a-2 took over only once the membership dropped a-1: {listed:?}"
    );
    for n in nodes.iter().flatten().skip(1) {
        n.shutdown().await;
    }
}
