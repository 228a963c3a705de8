//! The layer's own cost per request, the limiter's round trip left out: a request through
//! `SluiceLayer` on the in-memory limiter next to the bare upstream, both driven by one
//! current-thread runtime (`cargo bench -p sluice-tower --bench layer`).
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
use sluice_tower::{CallError, Config, Limiter, Routes, SluiceLayer};
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
    let layer = SluiceLayer::new(config, fixed);
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
    g.bench_function("through the layer", |b| {
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
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
