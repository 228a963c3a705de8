//! Rotating the shared key on running nodes: every step of the rotation leaves figures
//! flowing both ways, while a node that skipped a step is locked out and counted.

mod common;

use common::{OneRule, clear_of_window_end, params, wait_for};
use sluice_core::algo::Kind;
use sluice_core::matching::store_key;
use sluice_core::ship::Observed;
use sluice_gossip::{Config, Node, Reject, now_micros};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const OLD: &[u8] = b"the old cluster key, 32 bytes...";
const NEW: &[u8] = b"the new cluster key, 32 bytes...";

fn cfg(region: &str, id: &str, seeds: &[SocketAddr]) -> Config {
    common::cfg(region, id, seeds, Some(OLD))
}

/// `from` takes `count` for a key of its own; `to` hears it.
async fn flows(from: &Node, to: &Node, key: &str, count: u64) {
    let p = params();
    let key = store_key(&format!("api|api_key={key}"), "g", Kind::FixedWindow);
    from.observe(&key, &p, now_micros(), Observed::count(count, 10));
    wait_for(
        &format!("{count} for {key} to arrive"),
        Duration::from_secs(10),
        || to.remote_for(&key, &p, now_micros()).cur == count,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotates_without_a_restart_and_a_skipped_step_is_refused() {
    clear_of_window_end().await;
    let a = Node::start(cfg("a", "a-1", &[]), Arc::new(OneRule))
        .await
        .expect("a starts");
    let b = Node::start(cfg("b", "b-1", &[a.local_addr()]), Arc::new(OneRule))
        .await
        .expect("b starts");
    wait_for("membership", Duration::from_secs(10), || {
        a.members().len() == 2 && b.members().len() == 2
    })
    .await;
    flows(&a, &b, "k0", 200).await;
    assert_eq!(a.gauges().keys, 1);

    // Step 1, half rolled out: b accepts the new key, a does not know it yet.
    b.set_keys(&[OLD, NEW]).expect("step 1 on b");
    flows(&a, &b, "k1", 201).await;
    flows(&b, &a, "k1b", 202).await;
    a.set_keys(&[OLD, NEW]).expect("step 1 on a");
    assert_eq!(a.gauges().keys, 2);

    // Step 2, half rolled out: a seals with the new key, b still with the old one.
    a.set_keys(&[NEW, OLD]).expect("step 2 on a");
    let older_on_a = a.gauges().older_key_frames;
    flows(&a, &b, "k2", 203).await;
    flows(&b, &a, "k2b", 204).await;
    assert!(
        a.gauges().older_key_frames > older_on_a,
        "a opened b's old-key frames and counted them"
    );
    b.set_keys(&[NEW, OLD]).expect("step 2 on b");

    // Step 3, half rolled out: b drops the old key.
    b.set_keys(&[NEW]).expect("step 3 on b");
    flows(&a, &b, "k3", 205).await;
    flows(&b, &a, "k3b", 206).await;
    a.set_keys(&[NEW]).expect("step 3 on a");
    flows(&a, &b, "k4", 207).await;
    assert_eq!(a.metrics().key_changes(), (3, 0));

    // A refused change keeps the keys in use.
    assert!(b.set_keys(&[b"short"]).is_err());
    assert!(b.set_keys(&[]).is_err());
    assert_eq!(b.metrics().key_changes(), (3, 2));
    flows(&a, &b, "k5", 208).await;

    // A node still on the old key alone is locked out, and counted.
    let bad = a.metrics().rejected(Reject::BadTag);
    let stale = Node::start(cfg("c", "c-1", &[a.local_addr()]), Arc::new(OneRule))
        .await
        .expect("c starts");
    wait_for("a to refuse c's frames", Duration::from_secs(10), || {
        a.metrics().rejected(Reject::BadTag) > bad
    })
    .await;
    assert!(
        a.members().iter().all(|m| m.region != "c"),
        "c never joins a"
    );
    stale.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
