//! The edge guard in the layer, on tokio's paused clock: a remembered refusal keeps requests
//! off the limiter until its retry time, and a flood reaches it at most rate * t + burst times.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use sluice_proto::sluice::v1::{CheckResponse, Code, PolicyStatus, QuotaUnit};
use sluice_tower::{Config, FakeLimiter, FloodLimit, SluiceLayer};
use tower::{Layer, ServiceExt, service_fn};

fn request(key: &str) -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .uri("/v1/users/42")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::new()))
        .expect("request");
    req.extensions_mut()
        .insert(SocketAddr::from(([198, 51, 100, 7], 4000)));
    req
}

async fn upstream(_req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

fn refused(retry_after_ms: u64, rule: &str) -> CheckResponse {
    CheckResponse {
        allowed: false,
        code: Code::OverLimit as i32,
        decided_by: rule.into(),
        retry_after_ms,
        policies: vec![PolicyStatus {
            id: rule.into(),
            limit: 10,
            window_s: 60,
            remaining: 0,
            reset_s: 2,
            ..Default::default()
        }],
        headers: [
            ("RateLimit-Policy", format!("\"{rule}\";q=10;w=60")),
            ("RateLimit", format!("\"{rule}\";r=0;t=2")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
        ..Default::default()
    }
}

fn allowed() -> CheckResponse {
    CheckResponse {
        allowed: true,
        code: Code::Ok as i32,
        ..Default::default()
    }
}

async fn send(layer: &SluiceLayer, key: &str) -> (StatusCode, HashMap<String, String>, String) {
    let resp = layer
        .layer(service_fn(upstream))
        .oneshot(request(key))
        .await
        .expect("infallible");
    let status = resp.status();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().expect("ascii").to_string()))
        .collect();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        headers,
        String::from_utf8(body.to_vec()).expect("utf-8"),
    )
}

fn checks_for(fake: &FakeLimiter, key: &str) -> usize {
    fake.checks()
        .iter()
        .filter(|c| c.descriptors.get("api_key").map(String::as_str) == Some(key))
        .count()
}

/// A concurrency refusal may end before its retry time (another request releases its slot):
/// the answer marks the policy `concurrent-requests`, and the guard asks the limiter again
/// with no `never_remember` configured.
#[tokio::test(start_paused = true)]
async fn a_concurrency_refusal_is_never_remembered() {
    let fake = FakeLimiter::new(|_| {
        let mut r = refused(30_000, "in-flight");
        r.policies[0].quota_unit = QuotaUnit::ConcurrentRequests as i32;
        Ok(r)
    });
    let layer = SluiceLayer::new(Config::new("api"), fake.clone());
    for n in 1..=3 {
        assert_eq!(send(&layer, "busy").await.0, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            checks_for(&fake, "busy"),
            n,
            "every request asks the limiter"
        );
    }
    // The same refusal from a rate rule is remembered: one call for the next two.
    let fake = FakeLimiter::new(|_| Ok(refused(30_000, "per-key")));
    let layer = SluiceLayer::new(Config::new("api"), fake.clone());
    for _ in 0..3 {
        assert_eq!(send(&layer, "busy").await.0, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(checks_for(&fake, "busy"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refused_key_stays_off_the_limiter_until_its_retry_time() {
    let fake = FakeLimiter::new(|c| {
        Ok(
            if c.descriptors.get("api_key").map(String::as_str) == Some("bad") {
                refused(2_000, "per-key")
            } else {
                allowed()
            },
        )
    });
    let layer = SluiceLayer::new(Config::new("api"), fake.clone());
    let first = send(&layer, "bad").await;
    assert_eq!(first.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(first.1["retry-after"], "2");
    assert_eq!(checks_for(&fake, "bad"), 1);

    tokio::time::advance(Duration::from_millis(500)).await;
    let cached = send(&layer, "bad").await;
    assert_eq!(cached.0, StatusCode::TOO_MANY_REQUESTS);
    // The same answer, its wait counted down (1.5 s rounds up to 2, then 0.5 s to 1).
    assert_eq!(cached.1, first.1);
    assert_eq!(cached.2, first.2);
    tokio::time::advance(Duration::from_millis(1_000)).await;
    let later = send(&layer, "bad").await;
    assert_eq!(later.1["retry-after"], "1");
    assert_eq!(later.1["ratelimit"], first.1["ratelimit"]);
    assert!(later.2.contains("retry in 1 s"), "{}", later.2);
    assert_eq!(checks_for(&fake, "bad"), 1, "no call while remembered");

    assert_eq!(send(&layer, "good").await.0, StatusCode::OK, "another key");
    assert_eq!(checks_for(&fake, "good"), 1);

    tokio::time::advance(Duration::from_millis(499)).await;
    send(&layer, "bad").await;
    assert_eq!(checks_for(&fake, "bad"), 1, "1 ms before the retry time");
    tokio::time::advance(Duration::from_millis(1)).await;
    send(&layer, "bad").await;
    assert_eq!(checks_for(&fake, "bad"), 2, "asked again at the retry time");

    let stats = layer.stats();
    assert_eq!(stats.edge_cached(), 3);
    assert_eq!(stats.edge_flood(), 0);
    assert_eq!(stats.over_limit(), 5);
}

#[tokio::test(start_paused = true)]
async fn concurrency_refusals_and_memory_off_always_ask_the_limiter() {
    let fake = FakeLimiter::answering(refused(2_000, "in-flight"));
    let mut config = Config::new("api");
    config.edge.never_remember.insert("in-flight".into());
    let layer = SluiceLayer::new(config, fake.clone());
    for _ in 0..3 {
        send(&layer, "k").await;
    }
    assert_eq!(fake.checks().len(), 3);

    let fake = FakeLimiter::answering(refused(2_000, "per-key"));
    let mut config = Config::new("api");
    config.edge.guard.remember_refusals = false;
    let layer = SluiceLayer::new(config, fake.clone());
    for _ in 0..3 {
        send(&layer, "k").await;
    }
    assert_eq!(fake.checks().len(), 3);
    assert_eq!(layer.stats().edge_cached(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_flood_reaches_the_limiter_at_most_rate_t_plus_burst_times() {
    let fake = FakeLimiter::answering(allowed());
    let mut config = Config::new("api");
    // Coarse: 10x a customer's 10/s with a burst of 2.
    config.edge.flood_above(10, 2, 10);
    assert_eq!(
        config.edge.guard.flood,
        Some(FloodLimit {
            rate_per_s: 100,
            burst: 20
        })
    );
    let layer = SluiceLayer::new(config, fake.clone());
    // 50x the coarse rate for 2 s: 5,000 requests a second, one every 200 us.
    let (rate, burst, secs) = (100, 20, 2);
    let mut flooded = 0;
    for _ in 0..50 * rate * secs {
        if send(&layer, "flood").await.0 == StatusCode::TOO_MANY_REQUESTS {
            flooded += 1;
        }
        tokio::time::advance(Duration::from_micros(200)).await;
    }
    let reached = checks_for(&fake, "flood");
    assert!(reached <= (rate * secs + burst) as usize, "{reached}");
    assert!(
        reached >= (rate * secs) as usize,
        "{reached}: the bucket admits its rate"
    );
    assert_eq!(layer.stats().edge_flood(), flooded);
    assert_eq!(send(&layer, "calm").await.0, StatusCode::OK, "another key");
}
