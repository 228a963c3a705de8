//! Real nodes on loopback: membership, shipping, merging, and what is refused.

mod common;

use common::{OneRule, cfg, clear_of_window_end, params, wait_for};
use sluice_core::Params;
use sluice_core::algo::Kind;
use sluice_core::matching::store_key;
use sluice_core::ship::Observed;
use sluice_gossip::{Node, Reject, RuleLookup, now_micros};
use std::sync::Arc;
use std::time::Duration;

const KEY: &[u8] = b"a shared key of enough bytes";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures_reach_the_other_regions_and_nothing_else_gets_in() {
    clear_of_window_end().await;
    let a = Node::start(cfg("a", "a-1", &[], Some(KEY)), Arc::new(OneRule))
        .await
        .expect("a starts");
    let seed = [a.local_addr()];
    let b = Node::start(cfg("b", "b-1", &seed, Some(KEY)), Arc::new(OneRule))
        .await
        .expect("b starts");
    let c = Node::start(cfg("c", "c-1", &seed, Some(KEY)), Arc::new(OneRule))
        .await
        .expect("c starts");
    wait_for(
        "membership of three regions",
        Duration::from_secs(10),
        || [&a, &b, &c].iter().all(|n| n.members().len() == 3),
    )
    .await;

    let key = store_key("api|api_key=k1", "g", Kind::FixedWindow);
    let p = params();
    let now = now_micros();
    // 150 of 1,000 is above the default 10% threshold: busy, shipped.
    a.observe(&key, &p, now, Observed::count(150, 10));
    // 50 is not: never shipped (the blind spot).
    let quiet = store_key("api|api_key=k2", "g", Kind::FixedWindow);
    a.observe(&quiet, &p, now, Observed::count(50, 10));
    wait_for("b and c to hear a's figure", Duration::from_secs(5), || {
        [&b, &c]
            .iter()
            .all(|n| n.remote_for(&key, &p, now_micros()).cur == 150)
    })
    .await;
    assert_eq!(b.remote_for(&quiet, &p, now_micros()).cur, 0);
    // A daemon never counts its own region's figure as remote.
    assert_eq!(a.remote_for(&key, &p, now_micros()).cur, 0);
    // Figures only rise: a lower one later changes nothing.
    a.observe(&key, &p, now_micros(), Observed::count(170, 10));
    wait_for("the raise", Duration::from_secs(5), || {
        b.remote_for(&key, &p, now_micros()).cur == 170
    })
    .await;

    // What must be refused, and counted.
    let bad_before = b.metrics().rejected(Reject::BadTag);
    let intruder = Node::start(
        cfg(
            "evil",
            "evil-1",
            &[b.local_addr()],
            Some(b"not the shared key at all"),
        ),
        Arc::new(OneRule),
    )
    .await
    .expect("intruder starts");
    let raw = std::net::UdpSocket::bind("127.0.0.1:0").expect("raw socket");
    // Garbage, and a frame of another cluster.
    raw.send_to(b"definitely not a frame", b.local_addr())
        .expect("send");
    let mut other = Vec::new();
    sluice_gossip::FrameCodec::new("other-cluster", Some(KEY))
        .expect("codec")
        .seal(sluice_gossip::Kind::Counts, b"whatever", &mut other);
    raw.send_to(&other, b.local_addr()).expect("send");
    // An untagged frame of the right cluster.
    let mut untagged = Vec::new();
    sluice_gossip::FrameCodec::new("sluice", None)
        .expect("codec")
        .seal(sluice_gossip::Kind::Counts, b"whatever", &mut untagged);
    raw.send_to(&untagged, b.local_addr()).expect("send");
    wait_for(
        "the rejections to be counted",
        Duration::from_secs(5),
        || {
            let m = b.metrics();
            m.rejected(Reject::Malformed) >= 1
                && m.rejected(Reject::WrongCluster) >= 1
                && m.rejected(Reject::Unauthenticated) >= 1
                && m.rejected(Reject::BadTag) > bad_before
        },
    )
    .await;
    // The intruder (wrong key) never joined: b still sees three members.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.members().len(), 3, "{:?}", b.members());
    assert!(intruder.members().len() <= 1);

    // A figure of a rule the receivers do not run globally is dropped, not merged.
    let region_rule = store_key("api|api_key=k1", "regional", Kind::FixedWindow);
    a.observe(&region_rule, &p, now_micros(), Observed::count(500, 10));
    wait_for("unknown rule counted", Duration::from_secs(5), || {
        let mut out = String::new();
        b.render_metrics(&mut out);
        out.contains("sluice_gossip_figures_received_total{result=\"unknown_rule\"} 1")
    })
    .await;
    assert!(b.remote_snapshot().iter().all(|(k, ..)| k == &key));

    // A figure of rule `g` under another algorithm (an edit live at the sender only) is
    // dropped too: counts of one algorithm are never merged into another's.
    let edited = store_key("api|api_key=k1", "g", Kind::TokenBucket);
    a.observe(&edited, &p, now_micros(), Observed::count(500, 10));
    wait_for("other algorithm dropped", Duration::from_secs(5), || {
        let mut out = String::new();
        b.render_metrics(&mut out);
        out.contains("sluice_gossip_figures_received_total{result=\"unknown_rule\"} 2")
    })
    .await;
    assert!(b.remote_snapshot().iter().all(|(k, ..)| k == &key));

    // A silent region keeps its figures: stop a, b still adds them until the window ends.
    a.shutdown().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(b.remote_for(&key, &p, now_micros()).cur, 170);
    intruder.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shipper_per_region_and_no_key_works_too() {
    clear_of_window_end().await;
    let mut ca = cfg("a", "a-1", &[], None);
    ca.shippers = sluice_gossip::Shippers::OnePerRegion;
    let a1 = Node::start(ca, Arc::new(OneRule)).await.expect("a-1");
    let seed = [a1.local_addr()];
    let mut ca2 = cfg("a", "a-2", &seed, None);
    ca2.shippers = sluice_gossip::Shippers::OnePerRegion;
    let a2 = Node::start(ca2, Arc::new(OneRule)).await.expect("a-2");
    let b = Node::start(cfg("b", "b-1", &seed, None), Arc::new(OneRule))
        .await
        .expect("b");
    wait_for("membership", Duration::from_secs(10), || {
        [&a1, &a2, &b].iter().all(|n| n.members().len() == 3)
    })
    .await;
    wait_for("a-2 to stand down", Duration::from_secs(5), || {
        a1.shipping() && !a2.shipping()
    })
    .await;
    let key = store_key("api|api_key=k1", "g", Kind::FixedWindow);
    let p = params();
    a1.observe(&key, &p, now_micros(), Observed::count(300, 10));
    wait_for("b hears a", Duration::from_secs(5), || {
        b.remote_for(&key, &p, now_micros()).cur == 300
    })
    .await;
    // The standing-down daemon ships nothing.
    assert_eq!(a2.metrics().shipped(), 0);
    for n in [a1, a2, b] {
        n.shutdown().await;
    }
}

/// Answers like [`OneRule`] and records the identities it was asked about.
struct Recording(std::sync::Mutex<Vec<String>>);

impl RuleLookup for Recording {
    fn global_params(&self, identity: &str, rule: &str) -> Option<Params> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(identity.to_string());
        OneRule.global_params(identity, rule)
    }
}

/// A split rule's sub-counts have their own shares of the numbers, so a packet's figures
/// for two sub-counts of one identity are looked up each, not the first for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sub_count_of_a_split_rule_is_looked_up() {
    clear_of_window_end().await;
    let a = Node::start(cfg("a", "a-1", &[], Some(KEY)), Arc::new(OneRule))
        .await
        .expect("a starts");
    let rec = Arc::new(Recording(std::sync::Mutex::new(Vec::new())));
    let b = Node::start(cfg("b", "b-1", &[a.local_addr()], Some(KEY)), rec.clone())
        .await
        .expect("b starts");
    wait_for("membership of two regions", Duration::from_secs(10), || {
        [&a, &b].iter().all(|n| n.members().len() == 2)
    })
    .await;
    let p = params();
    let keys: Vec<String> = (0..2)
        .map(|part| {
            store_key(
                &sluice_core::keys::sub_identity("api|api_key=k1", part),
                "g",
                Kind::FixedWindow,
            )
        })
        .collect();
    let now = now_micros();
    for k in &keys {
        a.observe(k, &p, now, Observed::count(150, 10));
    }
    wait_for("b to hear both sub-counts", Duration::from_secs(5), || {
        keys.iter()
            .all(|k| b.remote_for(k, &p, now_micros()).cur == 150)
    })
    .await;
    let asked = rec.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for part in ["api|api_key=k1|#0", "api|api_key=k1|#1"] {
        assert!(
            asked.iter().any(|i| i == part),
            "{part} not looked up: {asked:?}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}
