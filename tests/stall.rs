//! A daemon that stalls (SIGSTOP for twice the bound, then SIGCONT) does not take its own
//! stall for its region's sender's silence: two regions × two `sluiced` at the default gossip
//! timings, `shippers: region_sender` (docs/regions.md, "A daemon's own stall is not its
//! sender's silence").
//!
//! While a-2 is stopped, a-1's beacons queue in a-2's socket; when a-2 resumes, its election
//! may run before it reads them. A-2 is stopped three times; after each, once it has read
//! four more of a-1's datagrams (a second of beacons, eight runs of its election), it has
//! passed nobody over and a-1 is still the one sender of region a.

use sluice_testkit::{Daemon, TempDir, free_ports};
use sluice_tests::common::regions::{GLOBAL_RULES, gossip_daemon, metric, wait_until};
use std::net::SocketAddr;
use std::time::Duration;

/// A wait that does not end is a failure, not a measurement.
const HANG: Duration = Duration::from_secs(30);

const KEY: &str = "stall test gossip key, 32 bytes!";

const PASSED: &str = "sluice_gossip_senders_passed_over_total";
const ACCEPTED: &str = "sluice_gossip_packets_accepted_total";

struct Node {
    http: SocketAddr,
    daemon: Daemon,
}

fn start(dir: &TempDir, name: &str, region: &str, seeds: &[SocketAddr], ports: [u16; 3]) -> Node {
    let a = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let (http, grpc, gossip) = (a(ports[0]), a(ports[1]), a(ports[2]));
    let rules = dir.path().join("rules.yaml");
    let seeds: Vec<String> = seeds.iter().map(|s| format!("\"{s}\"")).collect();
    let config = dir.path().join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "http_addr: {http}\ngrpc_addr: {grpc}\nregion: {region}\ndaemon_id: {name}\n\
             rules: {}\ngossip:\n  addr: \"{gossip}\"\n  seeds: [{}]\n  cluster_id: stall\n  \
             shippers: region_sender\n  regions: 2\n",
            rules.display(),
            seeds.join(", "),
        ),
    )
    .expect("write config");
    let daemon = gossip_daemon(&config, KEY, http);
    Node { http, daemon }
}

#[test]
fn a_stalled_daemon_does_not_pass_its_live_sender_over() {
    let dir = TempDir::new("stall").expect("temp dir");
    std::fs::write(dir.path().join("rules.yaml"), GLOBAL_RULES).expect("write rules");
    let ports: Vec<[u16; 3]> = (0..4)
        .map(|_| {
            let p = free_ports(3);
            [p[0], p[1], p[2]]
        })
        .collect();
    let gossip = |i: usize| SocketAddr::from(([127, 0, 0, 1], ports[i][2]));
    let seeds = [gossip(0), gossip(2)];
    let names = [("a-1", "a"), ("a-2", "a"), ("b-1", "b"), ("b-2", "b")];
    let nodes: Vec<Node> = names
        .iter()
        .enumerate()
        .map(|(i, (name, region))| start(&dir, name, region, &seeds, ports[i]))
        .collect();
    wait_until("the membership to settle", HANG, || {
        nodes
            .iter()
            .all(|n| metric(n.http, "sluice_gossip_live_nodes") >= 4.0)
    });
    let sender = |n: &Node| metric(n.http, "sluice_gossip_region_sender");
    wait_until("one sender per region", HANG, || {
        nodes
            .iter()
            .enumerate()
            .all(|(i, n)| sender(n) == if i % 2 == 0 { 1.0 } else { 0.0 })
    });
    let a2 = &nodes[1];
    let quiet = metric(a2.http, PASSED);
    for round in 0..3 {
        a2.daemon.signal("STOP").expect("SIGSTOP a-2");
        // The stall itself: twice the bound (750 ms at the default 1 s interval).
        std::thread::sleep(Duration::from_millis(1_500));
        a2.daemon.signal("CONT").expect("SIGCONT a-2");
        let read = metric(a2.http, ACCEPTED);
        wait_until("a-2 to read a second of a-1's beacons", HANG, || {
            metric(a2.http, ACCEPTED) >= read + 4.0
        });
        assert_eq!(
            metric(a2.http, PASSED),
            quiet,
            "round {round}: a-2 passed a-1 over after its own stall\n{}",
            a2.daemon.logs()
        );
        assert_eq!(sender(a2), 0.0, "round {round}: a-2 took over");
    }
}
