//! Envoy wire compatibility: a client generated from Envoy's own protos by a third party (the
//! `envoy-types` crate, not Sluice's proto/envoy files) talks to a real `sluiced` process and
//! gets Envoy's answers: OK then OVER_LIMIT, one status per descriptor in order, hits_addend
//! as cost, a descriptor's limit override, the rate limit headers.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use sluice_testkit::SluicedOnRules;
use std::net::SocketAddr;
use tonic::transport::Channel;

const RULES: &str = r#"
domain: edge
rules:
  # As `sluicectl import-envoy` writes them: the depth is part of the match.
  - id: per-user
    match: { envoy.keys: user }
    key: [user]
    algorithm: fixed_window
    limit: 5
    window: 1h
  - id: per-ip
    match: { envoy.keys: remote_address }
    key: [remote_address]
    algorithm: fixed_window
    limit: 1000
    window: 1m
"#;

fn start() -> SluicedOnRules {
    SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)")
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to sluiced's gRPC port")
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    hits_addend: u32,
) -> RateLimitResponse {
    c.should_rate_limit(RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend,
    })
    .await
    .expect("ShouldRateLimit answers")
    .into_inner()
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_generated_client_gets_envoy_answers() {
    let r = start();
    let mut c = client(r.grpc).await;

    // hits_addend 0 counts 1; 3 counts 3: 4 of the 5 an hour are gone.
    let first = ask(&mut c, vec![desc(&[("user", "alice")])], 0).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(first.statuses.len(), 1);
    assert_eq!(first.statuses[0].limit_remaining, 4);
    let lim = first.statuses[0]
        .current_limit
        .as_ref()
        .expect("current_limit");
    assert_eq!(lim.requests_per_unit, 5);
    assert_eq!(lim.unit, Unit::Hour as i32);
    assert_eq!(lim.name, "per-user");
    let reset = first.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("reset");
    assert!((1..=3600).contains(&reset.seconds), "{reset:?}");
    assert_eq!(header(&first, "X-RateLimit-Limit"), Some("5"));
    assert_eq!(header(&first, "X-RateLimit-Remaining"), Some("4"));
    assert!(header(&first, "Retry-After").is_none());

    let r3 = ask(&mut c, vec![desc(&[("user", "alice")])], 3).await;
    assert_eq!(r3.overall_code, Code::Ok as i32);
    assert_eq!(r3.statuses[0].limit_remaining, 1);

    // Two descriptors: the ip passes, alice asks 2 of her last 1: one status each, in order,
    // and the whole request is over the limit.
    let over = ask(
        &mut c,
        vec![
            desc(&[("remote_address", "10.0.0.7")]),
            desc(&[("user", "alice")]),
        ],
        2,
    )
    .await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    assert_eq!(over.statuses.len(), 2);
    assert_eq!(over.statuses[0].code, Code::Ok as i32);
    assert_eq!(over.statuses[0].limit_remaining, 998);
    assert_eq!(
        over.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit)),
        Some((1000, Unit::Minute as i32))
    );
    assert_eq!(over.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(
        over.statuses[1].limit_remaining, 1,
        "a refused request takes nothing"
    );
    assert!(header(&over, "Retry-After").is_some_and(|v| v.parse::<u64>().is_ok_and(|s| s >= 1)));
    assert!(String::from_utf8_lossy(&over.raw_body).contains("\"status\":429"));

    // Exactly the last one still passes, then alice is out.
    assert_eq!(
        ask(&mut c, vec![desc(&[("user", "alice")])], 1)
            .await
            .overall_code,
        Code::Ok as i32
    );
    let out = ask(&mut c, vec![desc(&[("user", "alice")])], 1).await;
    assert_eq!(out.overall_code, Code::OverLimit as i32);
    assert_eq!(out.statuses[0].limit_remaining, 0);

    // Another user is unaffected; a deeper descriptor matches no rule and passes unlimited.
    let bob = ask(&mut c, vec![desc(&[("user", "bob")])], 1).await;
    assert_eq!(bob.statuses[0].limit_remaining, 4);
    let deeper = ask(&mut c, vec![desc(&[("user", "alice"), ("path", "/x")])], 1).await;
    assert_eq!(deeper.overall_code, Code::Ok as i32);
    assert_eq!(deeper.statuses[0].current_limit, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_override_replaces_the_configured_limit() {
    let r = start();
    let mut c = client(r.grpc).await;
    let mut d = desc(&[("user", "carol")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: RateLimitUnit::Day as i32,
    });
    let a = ask(&mut c, vec![d.clone()], 1).await;
    assert_eq!(a.overall_code, Code::Ok as i32);
    let lim = a.statuses[0]
        .current_limit
        .as_ref()
        .expect("override limit");
    assert_eq!((lim.requests_per_unit, lim.unit), (2, Unit::Day as i32));
    assert_eq!(a.statuses[0].limit_remaining, 1);
    assert_eq!(
        ask(&mut c, vec![d.clone()], 1).await.overall_code,
        Code::Ok as i32
    );
    let b = ask(&mut c, vec![d], 1).await;
    assert_eq!(b.overall_code, Code::OverLimit as i32);
    assert_eq!(b.statuses[0].code, Code::OverLimit as i32);
    // The configured 5 an hour for carol was not touched.
    let plain = ask(&mut c, vec![desc(&[("user", "carol")])], 1).await;
    assert_eq!(plain.statuses[0].limit_remaining, 4);

    // Bad input is INVALID_ARGUMENT, as Envoy's reference service answers.
    let e = c
        .should_rate_limit(RateLimitRequest {
            domain: String::new(),
            descriptors: vec![desc(&[("user", "x")])],
            hits_addend: 1,
        })
        .await
        .expect_err("empty domain");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = c
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![],
            hits_addend: 1,
        })
        .await
        .expect_err("no descriptors");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}
