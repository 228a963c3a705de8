//! A settled cluster of real nodes on loopback, for the tests that need several regions of
//! several daemons (included with `#[path]` by those tests only).

use crate::common::{OneRule, wait_for};
use sluice_gossip::{Config, Node};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// `regions` regions (a, b, c…) of `daemons` daemons each (`a-1`, `a-2`…), configured by
/// `cfg(region, id, seeds)`, all settled: every daemon sees every other, and when they
/// relay, each knows whether it is its region's sender (the lowest id, `x-1`).
pub async fn cluster(
    regions: usize,
    daemons: usize,
    cfg: impl Fn(&str, &str, &[SocketAddr]) -> Config,
    relaying: bool,
) -> Vec<Vec<Node>> {
    let first = Node::start(cfg("a", "a-1", &[]), Arc::new(OneRule))
        .await
        .expect("a-1 starts");
    let seed = [first.local_addr()];
    let mut out: Vec<Vec<Node>> = Vec::new();
    let mut first = Some(first);
    for r in 0..regions {
        let region = ((b'a' + r as u8) as char).to_string();
        let mut nodes = Vec::new();
        for d in 1..=daemons {
            let node = match first.take() {
                Some(n) => n,
                None => Node::start(
                    cfg(&region, &format!("{region}-{d}"), &seed),
                    Arc::new(OneRule),
                )
                .await
                .expect("node starts"),
            };
            nodes.push(node);
        }
        out.push(nodes);
    }
    let all = regions * daemons;
    wait_for("the membership to settle", Duration::from_secs(60), || {
        out.iter().flatten().all(|n| n.members().len() == all)
    })
    .await;
    if relaying {
        wait_for("one sender per region", Duration::from_secs(10), || {
            out.iter().all(|ns| {
                ns.iter()
                    .enumerate()
                    .all(|(i, n)| n.region_sender() == (i == 0))
            })
        })
        .await;
    }
    out
}

/// How many members each daemon but a-1 lists: whether the membership dropped a-1 yet.
#[allow(
    dead_code,
    reason = "the takeover tests use it; the other tests including this file do not"
)]
pub fn listed_but_a1(nodes: &[Vec<Node>]) -> Vec<usize> {
    nodes
        .iter()
        .flatten()
        .skip(1)
        .map(|n| n.members().len())
        .collect()
}
