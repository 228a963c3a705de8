//! The layer's own cost per request, the limiter's round trip left out: a request through
//! `SluiceLayer` on the in-memory limiter next to the bare upstream, both driven by one
//! current-thread runtime; and a refusal answered from the edge guard's memory next to the
//! same refusal asked of the (in-memory) limiter (`cargo bench -p sluice-tower --bench layer`).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::convert::Infallible;
use std::hint::black_box;
use std::net::SocketAddr;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use sluice_proto::sluice::v1::{CheckRequest, CheckResponse, Code, PolicyStatus, ReleaseRequest};
use sluice_tower::limiter::BoxFuture;
use sluice_tower::{CallError, Config, FakeLimiter, Limiter, Routes, SluiceLayer};
use tower::{Layer, ServiceExt, service_fn};

fn request() -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .uri("/v1/users/42")
        .header("authorization", "Bearer k_8f2a")
        .header("x-forwarded-for", "198.51.100.7")
        .body(Full::new(Bytes::new()))
        .expect("request");
    req.extensions_mut()
        .insert(SocketAddr::from(([10, 0, 0, 1], 4000)));
    req
}

async fn upstream(_req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

/// One fixed answer, nothing recorded (the test fake keeps every check).
#[derive(Clone)]
struct Fixed(CheckResponse);

impl Limiter for Fixed {
    fn check(&self, _req: CheckRequest) -> BoxFuture<Result<CheckResponse, CallError>> {
        let answer = self.0.clone();
        Box::pin(async move { Ok(answer) })
    }
    fn release(&self, _req: ReleaseRequest) -> BoxFuture<Result<u32, CallError>> {
        Box::pin(async { Ok(0) })
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut config = Config::new("api");
    config.routes = Routes::new(
        [
            "/v1/users/{id}",
            "/v1/orders/{id}",
            "/v1/orders/{id}/items/{item}",
            "/v1/payments",
        ],
        "*",
    )
    .expect("valid templates");
    config.trusted_proxies = vec!["10.0.0.0/8".parse().expect("cidr")];
    let fixed = Fixed(CheckResponse {
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
        headers: [
            ("RateLimit-Policy", "\"burst\";q=10;w=60"),
            ("RateLimit", "\"burst\";r=9;t=60"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    });
    let mut no_edge = config.clone();
    no_edge.edge.guard.remember_refusals = false;
    let layer = SluiceLayer::new(config, fixed.clone());
    let layer_no_edge = SluiceLayer::new(no_edge, fixed);
    let mut g = c.benchmark_group("request");
    g.bench_function("bare upstream", |b| {
        b.iter(|| {
            rt.block_on(async {
                let resp = service_fn(upstream)
                    .oneshot(request())
                    .await
                    .expect("infallible");
                black_box(resp.into_body().collect().await.expect("body"))
            })
        })
    });
    for (name, layer) in [
        ("through the layer", &layer),
        ("through the layer, edge guard off", &layer_no_edge),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let resp = layer
                        .layer(service_fn(upstream))
                        .oneshot(request())
                        .await
                        .expect("infallible");
                    black_box(resp.into_body().collect().await.expect("body"))
                })
            })
        });
    }
    g.finish();

    // A refusal for 60 s: with refusal memory on, every request after the first is answered
    // by the guard; with it off, each one calls the fake limiter.
    let refusal = CheckResponse {
        allowed: false,
        code: Code::OverLimit as i32,
        decided_by: "burst".into(),
        retry_after_ms: 60_000,
        policies: vec![PolicyStatus {
            id: "burst".into(),
            limit: 10,
            window_s: 60,
            remaining: 0,
            reset_s: 60,
            ..Default::default()
        }],
        headers: [
            ("RateLimit-Policy", "\"burst\";q=10;w=60"),
            ("RateLimit", "\"burst\";r=0;t=60"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    };
    let mut off = Config::new("api");
    off.edge.guard.remember_refusals = false;
    let asked = SluiceLayer::new(off, FakeLimiter::answering(refusal.clone()));
    let cached = SluiceLayer::new(Config::new("api"), FakeLimiter::answering(refusal));
    let mut g = c.benchmark_group("refusal");
    for (name, layer) in [("limiter call (fake)", &asked), ("edge cached", &cached)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let resp = layer
                        .layer(service_fn(upstream))
                        .oneshot(request())
                        .await
                        .expect("infallible");
                    black_box(resp.into_body().collect().await.expect("body"))
                })
            })
        });
    }
    g.finish();
    assert!(cached.stats().edge_cached() > 0 && asked.stats().edge_cached() == 0);
}

criterion_group!(benches, bench);
criterion_main!(benches);
