//! The layer holds a request a shaping rule admitted with `delay_ms` until its departure, and
//! answers 429 when the delay is past its `max_wait`. Tokio's paused clock: no wall time.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use sluice_proto::sluice::v1::{CheckResponse, Code, PolicyStatus};
use sluice_tower::{Config, FakeLimiter, SluiceLayer};
use tokio::time::Instant;
use tower::{Layer, ServiceExt, service_fn};

fn request() -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .method("POST")
        .uri("/v1/sms")
        .body(Full::new(Bytes::new()))
        .expect("request");
    req.extensions_mut()
        .insert(SocketAddr::from(([198, 51, 100, 7], 4000)));
    req
}

fn shaped(delay_ms: u64) -> CheckResponse {
    CheckResponse {
        allowed: true,
        code: Code::Ok as i32,
        delay_ms,
        policies: vec![PolicyStatus {
            id: "aggregator".into(),
            limit: 201,
            window_s: 1,
            remaining: 40,
            reset_s: 2,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// An upstream that records the (paused) instant of every call: `(calls, service)`.
macro_rules! recording {
    () => {{
        let calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let seen = calls.clone();
        let svc = service_fn(move |_req: Request<Full<Bytes>>| {
            let seen = seen.clone();
            async move {
                seen.lock().expect("lock").push(Instant::now());
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"sent"))))
            }
        });
        (calls, svc)
    }};
}

#[tokio::test(start_paused = true)]
async fn a_shaped_request_leaves_after_its_delay_not_before() {
    let layer = SluiceLayer::new(Config::new("sms"), FakeLimiter::answering(shaped(1_500)));
    let (calls, upstream) = recording!();
    let start = Instant::now();
    let pending = tokio::spawn(layer.layer(upstream).oneshot(request()));
    // One millisecond before its departure the upstream has not been called...
    tokio::time::sleep(Duration::from_millis(1_499)).await;
    assert!(calls.lock().expect("lock").is_empty(), "forwarded early");
    // ...and at it, it has.
    let resp = pending.await.expect("task").expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    let at = calls.lock().expect("lock").clone();
    assert_eq!(at.len(), 1);
    assert_eq!(at[0] - start, Duration::from_millis(1_500));
    assert_eq!(layer.stats().delayed(), 1);
    assert_eq!(layer.stats().allowed(), 1);
}

#[tokio::test(start_paused = true)]
async fn no_delay_is_forwarded_at_once() {
    let layer = SluiceLayer::new(Config::new("sms"), FakeLimiter::answering(shaped(0)));
    let (calls, upstream) = recording!();
    let start = Instant::now();
    let resp = layer
        .layer(upstream)
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(calls.lock().expect("lock")[0] - start, Duration::ZERO);
    assert_eq!(layer.stats().delayed(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_delay_past_max_wait_is_a_429_at_once() {
    let mut config = Config::new("sms");
    config.max_wait = Duration::from_secs(1);
    let layer = SluiceLayer::new(config, FakeLimiter::answering(shaped(3_200)));
    let (calls, upstream) = recording!();
    let start = Instant::now();
    let resp = layer
        .layer(upstream)
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(Instant::now() - start, Duration::ZERO, "it did not wait");
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    // 2.2 s past the ceiling, in whole seconds rounded up.
    assert_eq!(
        resp.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"3"[..])
    );
    assert!(calls.lock().expect("lock").is_empty());
    let s = layer.stats();
    assert_eq!((s.allowed(), s.over_limit(), s.delay_refused()), (0, 1, 1));
    // Exactly at the ceiling it waits.
    let layer = SluiceLayer::new(
        {
            let mut c = Config::new("sms");
            c.max_wait = Duration::from_secs(1);
            c
        },
        FakeLimiter::answering(shaped(1_000)),
    );
    let (calls, upstream) = recording!();
    let start = Instant::now();
    let resp = layer
        .layer(upstream)
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        calls.lock().expect("lock")[0] - start,
        Duration::from_secs(1)
    );
}
