//! The gateway side of Sluice: a `tower::Layer` that asks `sluiced` about each request and
//! turns the decision into what the API client sees.
//!
//! The daemon decides; a gateway still has to name the request (route template, API key,
//! tier, client IP behind its proxies), call the daemon within a deadline, answer a refusal
//! the way clients expect (429, `Retry-After`, the RateLimit headers, an RFC 9457 body), choose
//! what an outage of the limiter means, and release concurrency slots when a response is done.
//! This crate does that once, for axum, hyper or any tower-based proxy:
//!
//! ```no_run
//! # use std::convert::Infallible;
//! # use http::{Request, Response};
//! # use http_body_util::Full;
//! # use bytes::Bytes;
//! use sluice_tower::{Config, GrpcLimiter, Routes, SluiceLayer};
//! use tower::{Layer, service_fn};
//!
//! # async fn upstream(_: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
//! #     Ok(Response::new(Full::new(Bytes::new())))
//! # }
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = GrpcLimiter::connect_lazy("http://127.0.0.1:8081")?;
//! let mut config = Config::new("public-api");
//! config.routes = Routes::new(["/v1/users/{id}"], "*")?;
//! // In axum: `Router::new().route(...).layer(SluiceLayer::new(config, limiter))`.
//! let service = SluiceLayer::new(config, limiter).layer(service_fn(upstream));
//! # drop(service); Ok(()) }
//! ```
//!
//! Before each daemon call, the edge guard ([`edge`]) answers two cases itself: an identity
//! the daemon refused, until the refusal's retry time, and a client over a coarse flood rate
//! (off unless configured).
//!
//! # Layout
//!
//! - [`config`]: [`Config`] (domain, templates, key/tier headers, trusted proxies) and
//!   [`FailureMode`], [`ReleaseFor`].
//! - [`route`]: [`Routes`], path templates to the `route` descriptor.
//! - [`ip`]: [`Cidr`] and [`client_ip`], the peer or `X-Forwarded-For` behind trusted proxies.
//! - [`descriptors`]: a request as the descriptors rules key on.
//! - [`limiter`]: the [`Limiter`] seam and [`CallError`].
//! - [`grpc`]: [`GrpcLimiter`], the seam over tonic with a per-call deadline (3 ms default).
//! - [`fake`]: [`FakeLimiter`], in memory, for tests.
//! - [`edge`]: [`EdgeOptions`], the refusal memory and flood bucket of the core's guard.
//! - [`answer`]: the 429 and 503 answers and the decision's headers.
//! - [`body`]: [`SluiceBody`] and the [`ReleaseGuard`] riding in it.
//! - [`service`]: [`SluiceLayer`], [`SluiceService`] and their [`Stats`].

pub mod answer;
pub mod body;
pub mod config;
pub mod descriptors;
pub mod edge;
pub mod fake;
pub mod grpc;
pub mod ip;
pub mod limiter;
pub mod route;
pub mod service;

pub use body::{ReleaseGuard, SluiceBody};
pub use config::{Config, FailureMode, ReleaseFor};
pub use edge::{EdgeConfig, EdgeOptions, FloodLimit};
pub use fake::FakeLimiter;
pub use grpc::GrpcLimiter;
pub use ip::{Cidr, client_ip};
pub use limiter::{CallError, Limiter};
pub use route::Routes;
pub use service::{SluiceLayer, SluiceService, Stats};
