//! The simulator decides global buckets on the daemon's path: the remote figure from
//! `RemoteCounts::remote_for` (marked shared, so the store keeps the region's `used`) and the
//! shipped figure from `ship::observations`, the two functions the daemon calls.

use sluice_sim::{load, run};
use std::path::PathBuf;

fn client_moves(params: &[(&str, &str)]) -> sluice_sim::Report {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../simulations/client-moves.toml");
    let params: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let sc = load(&path.to_string_lossy(), &params).unwrap_or_else(|e| panic!("{e}"));
    run(&sc, sc.seed, &mut |_| {})
}

/// One key at 100/s spread over all three regions, on a global bucket of 20/s, burst 200:
/// every region's bucket is drained by the others' figures. What a bucket cannot take of
/// them is owed and comes out of its refill, so the three regions together hold the bucket:
/// 6,214 units admitted of the exact 6,200 (burst + 300 s × 20/s). When a drain stopped at
/// an empty bucket and forgave the rest, each region refilled from empty at the whole rate
/// and the daemon's path admitted 14,751 (the simulator, then planning global buckets on a
/// path of its own, showed 6,214 and hid it).
#[test]
fn a_bucket_busy_in_every_region_is_decided_as_the_daemon_decides_it() {
    let r = client_moves(&[
        ("traffic.0.moves", "[]"),
        ("traffic.0.regions", r#"["us-east","eu-west","ap-south"]"#),
        ("traffic.0.rate_per_s", "100"),
    ]);
    let b = r
        .rules
        .iter()
        .find(|x| x.id == "global-bucket")
        .unwrap_or_else(|| panic!("no rule"));
    let exact = 200 + 300 * 20;
    assert!(
        (exact * 98 / 100..=exact * 102 / 100).contains(&b.admitted),
        "{} admitted of the exact {exact}",
        b.admitted
    );
}
