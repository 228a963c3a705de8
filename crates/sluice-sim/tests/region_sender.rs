//! `shippers = "region_sender"`, the daemon's default: every daemon collects its selection to
//! its region's sender, which ships once per region pair, and the receiver fans out. It must
//! deliver the figures as `every_daemon` does (a global rule's overshoot stays bounded), cut
//! the cross-region bytes by about the daemons per region squared, and follow the membership
//! when a sender dies; with a fan-out, senders ship to their peer regions and receivers
//! forward the rest, for about the same bytes. The simulator is seeded: every figure here is
//! the same on every run.

use sluice_sim::report::{self, Report, RuleReport};
use sluice_sim::{Scenario, load, parse, run};
use std::path::PathBuf;

/// The simulator's prediction of the 3 regions × 3 daemons fleet test.
fn fleet(params: &[(&str, &str)]) -> Scenario {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/regions/sim-fleet.toml");
    let params: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    load(&path.to_string_lossy(), &params).unwrap_or_else(|e| panic!("sim-fleet.toml: {e}"))
}

fn go(sc: &Scenario) -> Report {
    run(sc, sc.seed, &mut |_| {})
}

fn rule(r: &Report) -> &RuleReport {
    &r.rules[0]
}

#[test]
fn one_sender_per_region_delivers_the_figures_with_a_ninth_of_the_cross_region_bytes() {
    let mode = |m: &'static str| [("shippers", m), ("duration_s", "600")];
    let every = go(&fleet(&mode("every_daemon")));
    let relayed_sc = fleet(&mode("region_sender"));
    let relayed = go(&relayed_sc);
    // The figures arrive: up to one interval later for a daemon that is not the sender (the
    // collect waits for the sender's tick), so a little more overshoot, still bounded.
    let (e, r) = (rule(&every), rule(&relayed));
    assert!(r.overshoot_max < 1.05, "region_sender {}", r.overshoot_max);
    assert!(
        r.overshoot_max <= e.overshoot_max + 0.03,
        "region_sender {} against every_daemon {}",
        r.overshoot_max,
        e.overshoot_max
    );
    assert_eq!(r.false_rejections, 0);
    // Cross-region bytes: one copy per region pair instead of 3 × 3; the sender's record of
    // what it shipped keeps the even spread's duplicates from going across a second time.
    let ratio = every.gossip.bytes_per_s / relayed.gossip.bytes_per_s;
    assert!(ratio >= 6.0, "cross-region bytes only ÷ {ratio}");
    for (a, b) in every
        .gossip
        .bytes_per_s_by_region
        .iter()
        .zip(&relayed.gossip.bytes_per_s_by_region)
    {
        assert!(
            a / b >= 5.0,
            "a region's cross-region bytes {a} against {b}"
        );
    }
    let hops = relayed
        .gossip
        .hops
        .as_ref()
        .expect("hops with region_sender");
    assert_eq!(hops.relay.bytes_per_s, relayed.gossip.bytes_per_s);
    assert_eq!(hops.relay.messages, relayed.gossip.messages);
    assert_eq!(hops.direct.messages, 0, "every simulated daemon relays");
    // Inside a region: two daemons collect to the sender, the receiver fans out to two.
    assert!(hops.collect.messages > 0 && hops.fan_out.messages > 0);
    assert_eq!(
        hops.in_region_bytes_per_s,
        hops.collect.bytes_per_s + hops.fan_out.bytes_per_s
    );
    // The other modes' reports are as they were: no hops.
    assert!(every.gossip.hops.is_none());
    assert!(!report::json(&every).contains("\"hops\""));
    assert!(report::table(&relayed).contains("hops (region_sender"));
    // Same seed, same bytes.
    assert_eq!(report::json(&relayed), report::json(&go(&relayed_sc)));
}

#[test]
fn per_region_delivery_relays_alike() {
    let mode = |d: &'static str| [("shippers", "region_sender"), ("delivery", d)];
    let each = go(&fleet(&mode("per_daemon")));
    let shared = go(&fleet(&mode("per_region")));
    // The receiver's fan out merges into the table its region shares: counted, the same
    // traffic, and the figures as timely up to the in-region hop.
    let (a, b) = (&each.gossip, &shared.gossip);
    let ratio = b.bytes_per_s / a.bytes_per_s;
    assert!((ratio - 1.0).abs() < 0.05, "{ratio}");
    let (ha, hb) = (
        a.hops.as_ref().expect("hops"),
        b.hops.as_ref().expect("hops"),
    );
    let fan = hb.fan_out.bytes_per_s / ha.fan_out.bytes_per_s;
    assert!((fan - 1.0).abs() < 0.05, "{fan}");
    let d = rule(&each).overshoot_max - rule(&shared).overshoot_max;
    assert!(d.abs() < 0.02, "{d}");
}

/// 3 regions × 3 daemons, one key at 3× a global limit spread evenly; eu's sender (its first
/// daemon, the lowest id) crashes at 100 s, a second daemon of us stops at 200 s.
const SENDER_DIES: &str = r#"
name = "sender-dies"
duration_s = 300
seed = 3
regions = ["eu", "us", "ap"]
daemons_per_region = 3
[gossip]
shippers = "region_sender"
delay_ms = { dist = "uniform", min = 30, max = 80 }
[measure]
warmup_s = 60
[[rules]]
id = "g"
key = ["api_key"]
algorithm = "fixed_window"
limit = 1000
window = "1m"
scope = "global"
[[traffic]]
rate_per_s = 50
keys = { kind = "one", name = "k" }
[[events]]
kind = "daemon_down"
at_s = 100
region = "eu"
daemon = 0
[[events]]
kind = "daemon_down"
at_s = 200
region = "us"
daemon = 1
graceful = true
"#;

#[test]
fn a_dead_sender_is_replaced_by_the_next_id() {
    let sc = parse(SENDER_DIES, &[]).unwrap_or_else(|e| panic!("{e}"));
    let r = go(&sc);
    // Were eu's figures stuck with its dead sender, the other regions would admit a third of
    // the limit more in every window after 100 s.
    assert!(rule(&r).overshoot_max < 1.06, "{}", rule(&r).overshoot_max);
    let relay = &r
        .gossip
        .hops
        .as_ref()
        .expect("hops")
        .relay
        .bytes_per_s_by_region;
    // eu keeps shipping across after its sender died (its second daemon, elected next), as
    // much as the other regions.
    let others = (relay[1] + relay[2]) / 2.0;
    assert!(relay[0] > 0.8 * others, "eu {} against {others}", relay[0]);
    // The same with every daemon shipping, for the bound.
    let every =
        go(&parse(SENDER_DIES, &[("shippers".into(), "every_daemon".into())]).expect("parses"));
    assert!(rule(&r).overshoot_max <= rule(&every).overshoot_max + 0.03);
}

/// `ship-interval.toml` over `n` regions (us-east, eu-west, ap-south, r3, …) with one sender
/// per region and fan-out `fanout`.
fn regions(n: usize, fanout: usize) -> Scenario {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../simulations/ship-interval.toml");
    let names: Vec<String> = ["us-east", "eu-west", "ap-south"]
        .iter()
        .map(|s| s.to_string())
        .chain((3..n).map(|i| format!("r{i}")))
        .collect();
    let list = format!(
        "[{}]",
        names
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let params: Vec<(String, String)> = [
        ("regions", list),
        ("shippers", "region_sender".into()),
        ("fanout", fanout.to_string()),
        ("duration_s", "240".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    load(&path.to_string_lossy(), &params).unwrap_or_else(|e| panic!("ship-interval.toml: {e}"))
}

#[test]
fn with_a_fan_out_senders_ship_to_their_peers_and_receivers_forward_the_rest() {
    let p2p = go(&regions(12, 0));
    let fwd = go(&regions(12, 3));
    let (a, b) = (p2p.gossip.hops.as_ref(), fwd.gossip.hops.as_ref());
    let (a, b) = (a.expect("hops"), b.expect("hops"));
    // Point-to-point reports no forward hop; with a fan-out the senders relay to 3 peers
    // instead of 11 and the receivers forward the rest.
    assert!(a.forward.is_none());
    let forward = b.forward.as_ref().expect("a forward hop with a fan-out");
    assert!(forward.messages > 0);
    assert!(
        b.relay.messages * 3 < a.relay.messages,
        "{} against {}",
        b.relay.messages,
        a.relay.messages
    );
    // Each region hears each figure once either way: cross-region bytes about the same.
    let ratio = fwd.gossip.bytes_per_s / p2p.gossip.bytes_per_s;
    assert!(
        (0.7..=1.1).contains(&ratio),
        "forwarding sent {ratio} of point-to-point's bytes"
    );
    // The figures arrive, a few hops later: overshoot close to point-to-point's.
    for (x, y) in p2p.rules.iter().zip(&fwd.rules) {
        assert_eq!(y.false_rejections, 0);
        assert!(
            y.overshoot_max <= x.overshoot_max + 0.03,
            "{}: {} forwarding against {}",
            x.id,
            y.overshoot_max,
            x.overshoot_max
        );
    }
}
