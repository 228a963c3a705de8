//! Hierarchical fair shares end to end: a real redis-server, two real `sluiced` processes
//! sharing it, one `fair_share` rule (a parent of 60/s, burst 60, tenants weighted gold 0.5,
//! silver and bronze 0.25).
//!
//! 1. Tenant A alone offers three times the parent: it borrows the parent's spare capacity
//!    and is admitted at about the parent's rate, far above its own share.
//! 2. A, B and C then all offer twice the parent: each is squeezed to about its share
//!    (30, 15 and 15 a second), and together they never exceed the parent.
//!
//! Counts are bounded by the rule's numbers over the measured span (first request sent to
//! last answer received, which holds every decision): the parent's ceiling `burst + rate ×
//! span` is exact; the floors and the bands around each share leave 20% for a loaded
//! machine's stalls (a stall longer than the reserve's refill, 0.5 s here, loses refill).

use sluice_proto::sluice::v1::CheckRequest;
use sluice_testkit::RedisServer;
use sluice_tests::common::load::{Load, channel, grpc_runtime, paced_requests};
use sluice_tests::common::node::{Node, start};
use sluice_tests::common::serial;
use std::time::Duration;
use tonic::transport::Channel;

const RATE: f64 = 60.0;
const BURST: f64 = 60.0;
/// The default `borrow_above`: half the burst.
const RESERVE: f64 = 30.0;

const RULES: &str = "domain: fs
rules:
  - id: backend
    key: [tenant]
    algorithm: token_bucket
    rate_per_s: 60
    burst: 60
    fair_share: { by: tier, values: { gold: 0.5, silver: 0.25 }, default: 0.25 }
";

fn request(tenant: &str, tier: &str) -> CheckRequest {
    CheckRequest {
        domain: "fs".into(),
        descriptors: [
            ("tenant".to_string(), tenant.to_string()),
            ("tier".to_string(), tier.to_string()),
        ]
        .into(),
        cost: None,
    }
}

/// `per_s` checks a second for one tenant for `run`, from 4 tasks spread over both daemons.
async fn offer(chans: Vec<Channel>, tenant: &str, tier: &str, per_s: f64, run: Duration) -> Load {
    const TASKS: usize = 4;
    let period = Duration::from_secs_f64(TASKS as f64 / per_s);
    paced_requests(chans, request(tenant, tier), TASKS, period, run).await
}

fn redis() -> RedisServer {
    match RedisServer::start() {
        Ok(s) => s,
        Err(e) => panic!("this test needs a real redis-server: {e:#}"),
    }
}

#[test]
fn tenants_borrow_an_idle_parent_and_are_squeezed_to_their_shares_when_it_is_busy() {
    let _serial = serial();
    let redis = redis();
    let nodes: Vec<Node> = (0..2).map(|_| start(&redis, RULES, "")).collect();
    let rt = grpc_runtime();
    rt.block_on(async {
        let mut chans = Vec::new();
        for n in &nodes {
            chans.push(channel(n.grpc).await);
        }

        // 1. A alone at three times the parent.
        let a = offer(chans.clone(), "A", "gold", 3.0 * RATE, Duration::from_secs(10)).await;
        let span = a.span().as_secs_f64();
        let rate = a.allowed as f64 / span;
        println!(
            "alone: A offered {:.0}/s, admitted {} in {span:.2} s = {rate:.1}/s (parent {RATE}/s, A's share 30/s)",
            a.rate(),
            a.allowed
        );
        assert_eq!(a.errors, 0, "{a:?}");
        assert!(a.allowed as f64 <= BURST + RATE * span, "{a:?}");
        assert!(a.allowed as f64 >= 0.8 * RATE * span, "borrowed too little: {a:?}");
        // More than its own bucket could ever give: it borrowed.
        assert!(a.allowed as f64 > 30.0 + 30.0 * span, "{a:?}");

        // 2. All three at twice the parent each.
        let run = Duration::from_secs(20);
        let (a, b, c) = tokio::join!(
            offer(chans.clone(), "A", "gold", 2.0 * RATE, run),
            offer(chans.clone(), "B", "silver", 2.0 * RATE, run),
            offer(chans.clone(), "C", "bronze", 2.0 * RATE, run),
        );
        let mut all = a.clone();
        all.add(&b);
        all.add(&c);
        let span = all.span().as_secs_f64();
        let per_s = |l: &Load| l.allowed as f64 / span;
        println!(
            "busy: A {:.1}/s, B {:.1}/s, C {:.1}/s, total {:.1}/s over {span:.2} s (shares 30, 15, 15; parent {RATE}/s)",
            per_s(&a),
            per_s(&b),
            per_s(&c),
            per_s(&all)
        );
        assert_eq!(all.errors, 0, "{all:?}");
        // Never more than the parent, whoever asked.
        assert!(all.allowed as f64 <= BURST + RATE * span, "{all:?}");
        for (name, l, share) in [("A", &a, 0.5), ("B", &b, 0.25), ("C", &c, 0.25)] {
            let own = share * RATE * span;
            // Its own bucket's burst and refill, what the reserve lent at the start, and the
            // band for stalls.
            let ceiling = share * BURST + own + (BURST - RESERVE) + 0.2 * own;
            assert!(
                (l.allowed as f64) >= 0.8 * own && (l.allowed as f64) <= ceiling,
                "{name}: {} admitted, share {own:.0} in {span:.2} s: {l:?}",
                l.allowed
            );
        }
    });
}
