//! `--print-request` writes what h2load sends as its fixed body: one gRPC frame (flag 0, the
//! length, big-endian) holding the Envoy request for the hot key, read back here with a
//! third party's Envoy protos (`envoy-types`).

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message as _;
use std::process::Command;

#[test]
fn the_printed_request_is_one_grpc_frame_of_the_hot_keys_envoy_call() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["--print-request", "--domain", "bench", "--key-name", "user"])
        .args([
            "--key-prefix",
            "u",
            "--descriptor",
            "route=GET /",
            "--cost",
            "3",
        ])
        .output()
        .expect("run sluice-bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body = out.stdout;
    assert_eq!(body[0], 0, "uncompressed");
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    assert_eq!(len, body.len() - 5, "the prefix gives the message's length");
    let req = RateLimitRequest::decode(&body[5..]).expect("a RateLimitRequest");
    assert_eq!(req.domain, "bench");
    assert_eq!(req.hits_addend, 3);
    assert_eq!(req.descriptors.len(), 1);
    let entries: Vec<(&str, &str)> = req.descriptors[0]
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(entries, [("user", "u0"), ("route", "GET /")]);
}

#[test]
fn only_envoy_requests_are_printed() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["--print-request", "--api", "grpc"])
        .output()
        .expect("run sluice-bench");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
}
