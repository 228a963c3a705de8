//! The layer against a real `sluiced` over gRPC: allowed requests carry the daemon's RateLimit
//! headers, the one past the limit is the layer's 429, and a held concurrency slot refuses the
//! next request on its route until the held body is dropped.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use sluice_testkit::SluicedOnRules;
use sluice_tower::{Config, FailureMode, GrpcLimiter, Routes, SluiceLayer};
use tower::{Layer, ServiceExt, service_fn};

const RULES: &str = r#"
domain: gw
rules:
  - { id: per-key, match: { route: "GET /v1/users/{id}" }, key: [api_key], algorithm: fixed_window, limit: 3, window: 1h }
  - { id: in-flight, match: { route: "GET /v1/slow" }, key: [route], algorithm: concurrency, limit: 1, timeout: 1m }
"#;

fn layer(daemon: &SluicedOnRules) -> SluiceLayer {
    // A debug daemon on a shared machine: a generous deadline, and failing closed so an
    // unanswered check shows as a 503, never as a silent pass.
    let limiter = GrpcLimiter::connect_lazy(&format!("http://{}", daemon.grpc))
        .expect("valid address")
        .with_deadline(Duration::from_secs(5));
    let mut config = Config::new("gw");
    config.routes = Routes::new(["/v1/users/{id}", "/v1/slow"], "*").expect("valid templates");
    config.failure = FailureMode::Closed;
    SluiceLayer::new(config, limiter)
}

fn get(path: &str, key: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::new()))
        .expect("request")
}

async fn upstream(_req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

fn header(resp: &Response<impl Sized>, name: &str) -> String {
    resp.headers()
        .get(name)
        .unwrap_or_else(|| panic!("{name} in {:?}", resp.headers()))
        .to_str()
        .expect("ascii")
        .to_string()
}

#[tokio::test]
async fn the_request_past_the_limit_is_a_429() {
    let daemon =
        SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)");
    let layer = layer(&daemon);
    for remaining in [2, 1, 0] {
        let resp = layer
            .layer(service_fn(upstream))
            .oneshot(get("/v1/users/42", "k1"))
            .await
            .expect("infallible");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "ratelimit-policy"), "\"per-key\";q=3;w=3600");
        let state = header(&resp, "ratelimit");
        assert!(
            state.starts_with(&format!("\"per-key\";r={remaining};t=")),
            "{state}"
        );
        assert_eq!(
            header(&resp, "x-ratelimit-remaining"),
            remaining.to_string()
        );
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"ok");
    }
    // Another user id is the same route; another key its own counter.
    let resp = layer
        .layer(service_fn(upstream))
        .oneshot(get("/v1/users/7", "k1"))
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resp, "content-type"), "application/problem+json");
    assert_eq!(header(&resp, "cache-control"), "no-store");
    let retry: u64 = header(&resp, "retry-after").parse().expect("seconds");
    assert!((1..=3600).contains(&retry), "{retry}");
    let body: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.expect("body").to_bytes())
            .expect("json");
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["per-key"]));
    let other = layer
        .layer(service_fn(upstream))
        .oneshot(get("/v1/users/42", "k2"))
        .await
        .expect("infallible");
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(layer.stats().allowed(), 4);
    assert_eq!(layer.stats().over_limit(), 1);
}

#[tokio::test]
async fn a_held_slot_refuses_the_next_request_until_its_body_is_dropped() {
    let daemon =
        SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)");
    let layer = layer(&daemon);
    let held = layer
        .layer(service_fn(upstream))
        .oneshot(get("/v1/slow", "k1"))
        .await
        .expect("infallible");
    assert_eq!(held.status(), StatusCode::OK);
    let refused = layer
        .layer(service_fn(upstream))
        .oneshot(get("/v1/slow", "k2"))
        .await
        .expect("infallible");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(layer.stats().over_limit(), 1);
    // Dropping the unfinished body sends the release; the slot frees once the daemon has it.
    drop(held);
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let resp = layer
            .layer(service_fn(upstream))
            .oneshot(get("/v1/slow", "k2"))
            .await
            .expect("infallible");
        if resp.status() == StatusCode::OK {
            break;
        }
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(
            tokio::time::Instant::now() < give_up,
            "the slot was never released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
