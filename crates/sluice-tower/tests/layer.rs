//! The layer end to end against the in-memory limiter and a `service_fn` upstream: each
//! branch's status, exact headers and body, the failure modes, and the concurrency release.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use sluice_proto::sluice::v1::{CheckResponse, Code, PolicyStatus};
use sluice_tower::{
    CallError, Config, FailureMode, FakeLimiter, GrpcLimiter, Limiter, ReleaseFor, Routes,
    SluiceBody, SluiceLayer,
};
use tower::{Layer, ServiceExt, service_fn};

fn config() -> Config {
    let mut c = Config::new("api");
    c.routes = Routes::new(["/v1/users/{id}"], "*").expect("valid templates");
    c
}

fn request() -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .method("GET")
        .uri("/v1/users/42")
        .header("authorization", "Bearer k1")
        .body(Full::new(Bytes::new()))
        .expect("request");
    req.extensions_mut()
        .insert(SocketAddr::from(([198, 51, 100, 7], 4000)));
    req
}

fn headers_of<B>(resp: &Response<B>) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().expect("ascii").to_string()))
        .collect();
    h.sort();
    h
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = list
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

fn rendered(list: &[(&str, &str)]) -> HashMap<String, String> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn allowed(request_id: &str) -> CheckResponse {
    CheckResponse {
        allowed: true,
        code: Code::Ok as i32,
        policies: vec![PolicyStatus {
            id: "burst".into(),
            limit: 10,
            window_s: 60,
            remaining: 9,
            reset_s: 60,
            ..Default::default()
        }],
        headers: rendered(&[
            ("RateLimit-Policy", "\"burst\";q=10;w=60"),
            ("RateLimit", "\"burst\";r=9;t=60"),
        ]),
        request_id: request_id.into(),
        ..Default::default()
    }
}

/// An allowed answer whose check took a concurrency slot.
fn holding(request_id: &str) -> CheckResponse {
    CheckResponse {
        release: true,
        ..allowed(request_id)
    }
}

async fn upstream_ok(_req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let resp = Response::builder()
        .header("x-upstream", "yes")
        .body(Full::new(Bytes::from_static(b"hello")))
        .expect("response");
    Ok(resp)
}

async fn body_text<B: Body<Data = Bytes>>(body: B) -> String
where
    B::Error: std::fmt::Debug,
{
    let bytes = body.collect().await.expect("body").to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

#[tokio::test]
async fn allowed_requests_are_forwarded_with_the_decisions_headers() {
    let fake = FakeLimiter::answering(allowed(""));
    let layer = SluiceLayer::new(config(), fake.clone());
    let resp = layer
        .layer(service_fn(upstream_ok))
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        headers_of(&resp),
        pairs(&[
            ("x-upstream", "yes"),
            ("ratelimit-policy", "\"burst\";q=10;w=60"),
            ("ratelimit", "\"burst\";r=9;t=60"),
        ])
    );
    assert_eq!(body_text(resp.into_body()).await, "hello");
    let checks = fake.checks();
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].domain, "api");
    assert_eq!(
        checks[0].descriptors,
        rendered(&[
            ("route", "GET /v1/users/{id}"),
            ("method", "GET"),
            ("api_key", "k1"),
            ("ip", "198.51.100.7")
        ])
    );
    assert!(
        fake.releases().is_empty(),
        "no request id, nothing to release"
    );
    assert_eq!(layer.stats().allowed(), 1);
}

#[tokio::test]
async fn over_the_limit_is_a_429_problem_document() {
    let fake = FakeLimiter::answering(CheckResponse {
        allowed: false,
        code: Code::OverLimit as i32,
        decided_by: "burst".into(),
        retry_after_ms: 1500,
        policies: vec![
            PolicyStatus {
                id: "burst".into(),
                limit: 10,
                window_s: 60,
                remaining: 0,
                reset_s: 2,
                ..Default::default()
            },
            PolicyStatus {
                id: "daily".into(),
                limit: 1000,
                window_s: 86400,
                remaining: 7,
                reset_s: 900,
                ..Default::default()
            },
        ],
        headers: rendered(&[
            ("Retry-After", "2"),
            (
                "RateLimit-Policy",
                "\"burst\";q=10;w=60, \"daily\";q=1000;w=86400",
            ),
            ("RateLimit", "\"burst\";r=0;t=2, \"daily\";r=7;t=900"),
        ]),
        ..Default::default()
    });
    let layer = SluiceLayer::new(config(), fake.clone());
    let upstream = service_fn(|_req: Request<Full<Bytes>>| async {
        panic!("a refused request must not reach the upstream");
        #[allow(unreachable_code)]
        Ok::<Response<Full<Bytes>>, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let resp = layer
        .layer(upstream)
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        headers_of(&resp),
        pairs(&[
            ("retry-after", "2"),
            ("cache-control", "no-store"),
            ("content-type", "application/problem+json"),
            (
                "ratelimit-policy",
                "\"burst\";q=10;w=60, \"daily\";q=1000;w=86400"
            ),
            ("ratelimit", "\"burst\";r=0;t=2, \"daily\";r=7;t=900"),
        ])
    );
    let body: serde_json::Value =
        serde_json::from_str(&body_text(resp.into_body()).await).expect("json");
    assert_eq!(
        body,
        serde_json::json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "retry in 2 s",
            "violated-policies": ["burst"],
        })
    );
    assert_eq!(layer.stats().over_limit(), 1);
}

#[tokio::test]
async fn retry_after_is_at_least_one_second() {
    let fake = FakeLimiter::answering(CheckResponse {
        allowed: false,
        code: Code::OverLimit as i32,
        decided_by: "burst".into(),
        retry_after_ms: 20,
        ..Default::default()
    });
    let resp = SluiceLayer::new(config(), fake)
        .layer(service_fn(upstream_ok))
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["retry-after"], "1");
}

async fn assert_503<B: Body<Data = Bytes>>(resp: Response<B>)
where
    B::Error: std::fmt::Debug,
{
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        headers_of(&resp),
        pairs(&[
            ("retry-after", "1"),
            ("cache-control", "no-store"),
            ("content-type", "application/problem+json")
        ])
    );
    let body: serde_json::Value =
        serde_json::from_str(&body_text(resp.into_body()).await).expect("json");
    assert_eq!(body["status"], 503);
    assert_eq!(body["title"], "Service Unavailable");
}

#[tokio::test]
async fn unavailable_is_a_503_with_retry_after_one() {
    let fake = FakeLimiter::answering(CheckResponse {
        allowed: false,
        code: Code::Unavailable as i32,
        decided_by: "strict".into(),
        ..Default::default()
    });
    let layer = SluiceLayer::new(config(), fake);
    assert_503(
        layer
            .layer(service_fn(upstream_ok))
            .oneshot(request())
            .await
            .expect("infallible"),
    )
    .await;
    assert_eq!(layer.stats().unavailable(), 1);
}

#[tokio::test]
async fn an_unreachable_limiter_fails_open_by_default_and_is_counted() {
    let fake = FakeLimiter::new(|_| Err(CallError::Unavailable("connection refused".into())));
    let layer = SluiceLayer::new(config(), fake);
    let resp = layer
        .layer(service_fn(upstream_ok))
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(headers_of(&resp), pairs(&[("x-upstream", "yes")]));
    assert_eq!(body_text(resp.into_body()).await, "hello");
    assert_eq!(layer.stats().failed_open(), 1);
    assert_eq!(layer.stats().allowed(), 0);
}

#[tokio::test]
async fn failing_closed_answers_503() {
    let fake = FakeLimiter::new(|_| Err(CallError::Deadline(Duration::from_millis(3))));
    let mut c = config();
    c.failure = FailureMode::Closed;
    let layer = SluiceLayer::new(c, fake);
    assert_503(
        layer
            .layer(service_fn(upstream_ok))
            .oneshot(request())
            .await
            .expect("infallible"),
    )
    .await;
    assert_eq!(layer.stats().failed_closed(), 1);
}

/// Two data frames, one per poll: a body that can be dropped half read.
struct TwoFrames(u8);

impl Body for TwoFrames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.0 >= 2 {
            return Poll::Ready(None);
        }
        self.0 += 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk")))))
    }
}

async fn streaming(_req: Request<Full<Bytes>>) -> Result<Response<TwoFrames>, Infallible> {
    Ok(Response::new(TwoFrames(0)))
}

#[tokio::test]
async fn the_slot_is_released_when_the_body_ends() {
    let fake = FakeLimiter::answering(holding("req-1"));
    let layer = SluiceLayer::new(config(), fake.clone());
    let resp = layer
        .layer(service_fn(streaming))
        .oneshot(request())
        .await
        .expect("infallible");
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("infallible");
    assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"chunk")));
    assert!(
        fake.releases().is_empty(),
        "still in flight after one frame of two"
    );
    body.frame().await.expect("a frame").expect("infallible");
    assert!(body.frame().await.is_none());
    let releases = fake.releases();
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].request_id, "req-1");
    assert_eq!(releases[0].domain, "api");
    assert_eq!(releases[0].descriptors, fake.checks()[0].descriptors);
    drop(body);
    assert_eq!(fake.releases().len(), 1, "released once, not again on drop");
}

#[tokio::test]
async fn the_slot_is_released_when_an_unfinished_body_is_dropped() {
    let fake = FakeLimiter::answering(holding("req-2"));
    let layer = SluiceLayer::new(config(), fake.clone());
    let resp = layer
        .layer(service_fn(streaming))
        .oneshot(request())
        .await
        .expect("infallible");
    let mut body = resp.into_body();
    body.frame().await.expect("a frame").expect("infallible");
    assert!(fake.releases().is_empty());
    drop(body);
    let releases = fake.releases();
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].request_id, "req-2");
}

/// One request through a layer of `c` on `fake`, to `upstream_ok`.
async fn through(c: Config, fake: &FakeLimiter) -> Response<SluiceBody<Full<Bytes>>> {
    SluiceLayer::new(c, fake.clone())
        .layer(service_fn(upstream_ok))
        .oneshot(request())
        .await
        .expect("infallible")
}

/// Allowed with `answer` under `release`; the releases sent once the response is dropped.
async fn releases_after(answer: CheckResponse, release: ReleaseFor) -> usize {
    let fake = FakeLimiter::answering(answer);
    let mut c = config();
    c.release = release;
    let resp = through(c, &fake).await;
    drop(resp);
    fake.releases().len()
}

#[tokio::test]
async fn by_default_only_answers_that_took_a_slot_are_released() {
    assert_eq!(config().release, ReleaseFor::SlotTaken);
    assert_eq!(
        releases_after(holding("req-6"), ReleaseFor::SlotTaken).await,
        1
    );
    assert_eq!(
        releases_after(allowed("req-7"), ReleaseFor::SlotTaken).await,
        0
    );
    // For a daemon older than the flag: every request id, flag or not.
    assert_eq!(
        releases_after(allowed("req-8"), ReleaseFor::AnyRequestId).await,
        1
    );
}

#[tokio::test]
async fn only_the_named_concurrency_rules_are_released() {
    let fake = FakeLimiter::answering(allowed("req-4"));
    let mut c = config();
    c.release = ReleaseFor::Rules(["in-flight".to_string()].into());
    let layer = SluiceLayer::new(c.clone(), fake.clone());
    let resp = layer
        .layer(service_fn(upstream_ok))
        .oneshot(request())
        .await
        .expect("infallible");
    drop(resp);
    assert!(
        fake.releases().is_empty(),
        "no in-flight policy in the decision"
    );
    let mut held = allowed("req-5");
    held.policies.push(PolicyStatus {
        id: "in-flight".into(),
        limit: 1,
        window_s: 60,
        remaining: 0,
        reset_s: 60,
        ..Default::default()
    });
    let fake = FakeLimiter::answering(held);
    let resp = through(c, &fake).await;
    drop(resp);
    assert_eq!(fake.releases().len(), 1);
}

#[tokio::test]
async fn the_slot_is_released_when_the_upstream_fails() {
    let fake = FakeLimiter::answering(holding("req-3"));
    let layer = SluiceLayer::new(config(), fake.clone());
    let failing = service_fn(|_req: Request<Full<Bytes>>| async {
        Err::<Response<Full<Bytes>>, &str>("upstream down")
    });
    let err = layer
        .layer(failing)
        .oneshot(request())
        .await
        .expect_err("the upstream's error");
    assert_eq!(err, "upstream down");
    assert_eq!(fake.releases().len(), 1);
}

#[tokio::test]
async fn a_limiter_past_its_deadline_is_a_deadline_error() {
    // Accepts the connection and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = silent.local_addr().expect("addr");
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
        }
    });
    let limiter = GrpcLimiter::connect_lazy(&format!("http://{addr}"))
        .expect("valid address")
        .with_deadline(Duration::from_millis(50));
    let err = limiter
        .check(Default::default())
        .await
        .expect_err("no answer");
    assert!(
        matches!(err, CallError::Deadline(d) if d == Duration::from_millis(50)),
        "{err:?}"
    );
    assert!(err.is_retryable());
    hold.abort();
}

#[tokio::test]
async fn an_unreachable_limiter_is_a_retryable_error() {
    // A port just freed: nothing listens on it.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let limiter = GrpcLimiter::connect_lazy(&format!("http://127.0.0.1:{port}"))
        .expect("valid address")
        .with_deadline(Duration::from_secs(5));
    let err = limiter
        .check(Default::default())
        .await
        .expect_err("refused");
    assert!(matches!(err, CallError::Unavailable(_)), "{err:?}");
    assert!(err.is_retryable());
    let eager = GrpcLimiter::connect(&format!("http://127.0.0.1:{port}")).await;
    assert!(matches!(eager, Err(CallError::Unavailable(_))), "{eager:?}");
}

/// A refusal whose check still took a slot (a concurrency rule admitted it, another rule
/// refused it): released at once, or the slot would be held to its timeout.
#[tokio::test]
async fn a_refusal_that_took_a_slot_is_released_at_once() {
    let refused_holding = CheckResponse {
        allowed: false,
        code: Code::OverLimit as i32,
        decided_by: "burst".into(),
        retry_after_ms: 1_000,
        release: true,
        ..allowed("req-9")
    };
    let fake = FakeLimiter::answering(refused_holding.clone());
    let resp = through(config(), &fake).await;
    assert_eq!(resp.status(), 429);
    let releases = fake.releases();
    assert_eq!(releases.len(), 1, "released before the 429 is answered");
    assert_eq!(releases[0].request_id, "req-9");
    assert_eq!(releases[0].descriptors, fake.checks()[0].descriptors);
    // A refusal that took nothing sends nothing.
    let fake = FakeLimiter::answering(CheckResponse {
        release: false,
        ..refused_holding
    });
    let resp = through(config(), &fake).await;
    assert_eq!(resp.status(), 429);
    assert!(fake.releases().is_empty());
}
