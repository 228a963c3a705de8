//! Hierarchical fair shares end to end: a real redis-server, two real `sluiced` processes
//! sharing it, one `fair_share` rule (a parent of 60/s, burst 60, tenants weighted gold 0.5,
//! silver and bronze 0.25).
//!
//! 1. Tenant A alone offers three times the parent: it borrows the parent's spare capacity
//!    and is admitted at about the parent's rate, far above its own share.
//! 2. A, B and C then all offer twice the parent: each is squeezed to about its share
//!    (30, 15 and 15 a second), and together they never exceed the parent.
//!
//! 3. With `hot_keys.lease` (the parent is a hot key by construction), the same holds while
//!    store calls fall to about one per batch, and what the leases did not spend goes back
//!    to the parent (through `give_back.lua`) without a failure.
//!
//! Counts are bounded by the rule's numbers over the measured span (first request sent to
//! last answer received, which holds every decision): the parent's ceiling `burst + rate ×
//! span` is exact; the floors and the bands around each share leave 20% for a loaded
//! machine's stalls (a stall longer than the reserve's refill, 0.5 s here, loses refill).

use sluice_proto::sluice::v1::CheckRequest;
use sluice_proto::sluice::v1::limiter_client::LimiterClient;
use sluice_testkit::RedisServer;
use sluice_tests::common::load::{Load, channel, grpc_runtime, paced_requests};
use sluice_tests::common::node::{Node, start};
use sluice_tests::common::serial;
use std::time::{Duration, Instant};
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

/// Parent 300/s, the same shares, leased 10 units a call (the smallest tenant's burst is 75).
const LEASED: &str = "domain: fsl
rules:
  - id: backend
    key: [tenant]
    algorithm: token_bucket
    rate_per_s: 300
    burst: 300
    fair_share: { by: tier, values: { gold: 0.5, silver: 0.25 }, default: 0.25 }
    hot_keys: { lease: 10 }
";

fn request(domain: &str, tenant: &str, tier: &str) -> CheckRequest {
    CheckRequest {
        domain: domain.into(),
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
    offer_in(chans, "fs", tenant, tier, per_s, run).await
}

/// [`offer`] in `domain`.
async fn offer_in(
    chans: Vec<Channel>,
    domain: &str,
    tenant: &str,
    tier: &str,
    per_s: f64,
    run: Duration,
) -> Load {
    const TASKS: usize = 4;
    let period = Duration::from_secs_f64(TASKS as f64 / per_s);
    paced_requests(chans, request(domain, tenant, tier), TASKS, period, run).await
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
        held_to_shares("busy", [&a, &b, &c], RATE, BURST, RESERVE, 0.0);
    });
}

/// Leased (3. above): A, B and C each at twice a parent of 300/s, through two daemons that lease 10
/// units a store call. Units leave the parent before they are spent, so the parent's ceiling
/// stays exact; each tenant keeps to its share within the stall band and a batch per daemon.
#[test]
fn leased_tenants_keep_their_shares_with_a_store_call_a_batch() {
    const RATE: f64 = 300.0;
    const BURST: f64 = 300.0;
    const RESERVE: f64 = 150.0;
    const BATCH: f64 = 10.0;
    let _serial = serial();
    let redis = redis();
    let nodes: Vec<Node> = (0..2).map(|_| start(&redis, LEASED, "")).collect();
    let calls = |nodes: &[Node]| -> u64 {
        nodes
            .iter()
            .map(|n| {
                n.metrics()
                    .count("sluice_store_duration_seconds_count{store=\"default\"}")
            })
            .sum()
    };
    let before = calls(&nodes);
    let rt = grpc_runtime();
    let (a, b, c) = rt.block_on(async {
        let mut chans = Vec::new();
        for n in &nodes {
            chans.push(channel(n.grpc).await);
        }
        let run = Duration::from_secs(8);
        tokio::join!(
            offer_in(chans.clone(), "fsl", "A", "gold", 2.0 * RATE, run),
            offer_in(chans.clone(), "fsl", "B", "silver", 2.0 * RATE, run),
            offer_in(chans.clone(), "fsl", "C", "bronze", 2.0 * RATE, run),
        )
    });
    let store_calls = calls(&nodes) - before;
    let all = held_to_shares("leased", [&a, &b, &c], RATE, BURST, RESERVE, 2.0 * BATCH);
    let checks = all.allowed + all.denied;
    println!("leased: {checks} checks, {store_calls} store calls");
    // A call a request would be `checks` calls; leases make it about one per batch admitted
    // (refused leases and give-backs besides).
    assert!(
        store_calls * 3 <= checks,
        "{store_calls} store calls for {checks} checks"
    );
    // Quiet now: every lease's rest goes back to the parent, and the store takes it.
    let returned = quiet(&nodes);
    // One more request of A on each daemon, now that no lease is held: each takes a fresh
    // batch of 10 (a token bucket grants the batch or refuses it), spends 1 and, once quiet,
    // gives back exactly 9 to the parent.
    rt.block_on(async {
        for n in &nodes {
            let mut client = LimiterClient::new(channel(n.grpc).await);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let r = client
                    .check(request("fsl", "A", "gold"))
                    .await
                    .expect("a check")
                    .into_inner();
                if r.allowed {
                    break;
                }
                assert!(Instant::now() < deadline, "A never admitted again: {r:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let back = quiet(&nodes) - returned;
    println!(
        "leased: {returned} units given back after the load, then {back} after one request a daemon"
    );
    assert_eq!(
        back,
        2 * (BATCH as u64 - 1),
        "each daemon's fresh batch less its one request"
    );
}

/// A, B and C's loads (shares 0.5, 0.25, 0.25 of a parent of `rate` and `burst`) held to the
/// parent and each to its share: its own bucket's burst and refill, what the reserve lent at
/// the start, `slack` (units leased and still held when the parent turned busy) and a band
/// of 20% for a loaded machine's stalls. The three together.
fn held_to_shares(
    what: &str,
    l: [&Load; 3],
    rate: f64,
    burst: f64,
    reserve: f64,
    slack: f64,
) -> Load {
    let mut all = l[0].clone();
    all.add(l[1]);
    all.add(l[2]);
    let span = all.span().as_secs_f64();
    let per_s = |l: &Load| l.allowed as f64 / span;
    println!(
        "{what}: A {:.1}/s, B {:.1}/s, C {:.1}/s, total {:.1}/s over {span:.2} s (shares {}, {}, {}; parent {rate}/s)",
        per_s(l[0]),
        per_s(l[1]),
        per_s(l[2]),
        per_s(&all),
        rate / 2.0,
        rate / 4.0,
        rate / 4.0,
    );
    assert_eq!(all.errors, 0, "{all:?}");
    // Never more than the parent, whoever asked.
    assert!(all.allowed as f64 <= burst + rate * span, "{all:?}");
    for ((name, l), share) in ["A", "B", "C"].into_iter().zip(l).zip([0.5, 0.25, 0.25]) {
        let own = share * rate * span;
        let ceiling = share * burst + own + (burst - reserve) + slack + 0.2 * own;
        assert!(
            (l.allowed as f64) >= 0.8 * own && (l.allowed as f64) <= ceiling,
            "{name}: {} admitted, share {own:.0} in {span:.2} s: {l:?}",
            l.allowed
        );
    }
    all
}

/// Waits until neither daemon holds a lease (each gone back after 250 ms quiet), failing on
/// any give-back the store refused; the units given back so far.
fn quiet(nodes: &[Node]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m: Vec<_> = nodes.iter().map(Node::metrics).collect();
        let sum = |series: &str| m.iter().map(|m| m.count_or_zero(series)).sum::<u64>();
        assert_eq!(
            sum("sluice_lease_give_back_failures_total"),
            0,
            "a give-back failed"
        );
        if sum("sluice_leases") == 0 {
            return sum("sluice_lease_returned_units_total");
        }
        assert!(Instant::now() < deadline, "leases still held");
        std::thread::sleep(Duration::from_millis(100));
    }
}
