//! `sluice-gateway`: a reverse proxy that checks each request with `sluiced`, for operators
//! without Envoy.
//!
//! It is [`sluice_tower::SluiceLayer`] over a streaming HTTP proxy: clients speak HTTP/1.1 or
//! h2 (cleartext, prior knowledge) to it; it asks the daemon, answers 429/503 itself or
//! forwards to one plain-HTTP upstream with the decision's RateLimit headers on the response.
//! Bodies stream both ways, hop-by-hop headers stay on their hop, the peer is appended to
//! `X-Forwarded-For`. Its own `/metrics` and `/healthz` listen on a separate address.
//!
//! # Layout
//!
//! - [`config`]: the config file ([`FileConfig`]) and the command line's addresses
//!   ([`Settings`]).
//! - [`proxy`]: the forwarding service under the layer.
//! - [`metrics`]: the counters, the check latency histogram, their text exposition.
//! - here: [`run`], the accept loops and the graceful shutdown.

pub mod config;
pub mod metrics;
pub mod proxy;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use sluice_tower::{GrpcLimiter, Limiter, SluiceLayer, Stats};
use tokio::net::TcpListener;
use tower_layer::Layer;
use tower_service::Service;

pub use config::{ConfigError, FileConfig, Settings};

use crate::metrics::{Metrics, Timed};
use crate::proxy::Proxy;

/// Why the gateway could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The daemon's address is not one the gRPC client takes.
    #[error("sluiced address: {0}")]
    Limiter(#[from] sluice_tower::CallError),
    /// The metrics address could not be bound.
    #[error("binding the metrics address {addr}: {source}")]
    BindMetrics {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Serves `listener` until `shutdown` completes, then stops accepting and lets in-flight
/// requests finish, for at most the configured shutdown timeout.
pub async fn run(
    listener: TcpListener,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunError> {
    let metrics = Arc::new(Metrics::default());
    let grpc = GrpcLimiter::connect_lazy(&settings.sluiced)?.with_deadline(settings.deadline());
    let limiter: Arc<dyn Limiter> = Arc::new(Timed {
        inner: Arc::new(grpc),
        metrics: metrics.clone(),
    });
    let layer = SluiceLayer::with_limiter(settings.layer_config()?, limiter);
    let stats = layer.stats();
    let service = layer.layer(Proxy::new(settings.upstream.clone(), metrics.clone()));

    let metrics_task = match settings.file.metrics_addr {
        Some(addr) => {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::BindMetrics { addr, source })?;
            tracing::info!(addr = %l.local_addr().unwrap_or(addr), "metrics listening");
            Some(tokio::spawn(serve_metrics(l, metrics, stats)))
        }
        None => None,
    };

    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The timer arms HTTP/1's header read timeout (30 s): a silent client holds no slot.
    builder.http1().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    tracing::info!(addr = ?listener.local_addr().ok(), upstream = %settings.upstream, sluiced = %settings.sluiced, "gateway listening");
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, mostly: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let svc = service.clone();
        let per_conn = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            // The layer reads the peer from this extension, the proxy appends it to XFF.
            req.extensions_mut().insert(peer);
            let mut svc = svc.clone();
            svc.call(req)
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), per_conn)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let timeout = Duration::from_secs(settings.file.shutdown_timeout_s);
    tracing::info!(?timeout, "shutting down: finishing in-flight requests");
    if tokio::time::timeout(timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?timeout,
            "in-flight requests cut off at the shutdown timeout"
        );
    }
    if let Some(t) = metrics_task {
        t.abort();
    }
    Ok(())
}

/// `/metrics` and `/healthz` on their own listener, HTTP/1.1.
async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>, stats: Arc<Stats>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (metrics, stats) = (metrics.clone(), stats.clone());
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (status, ctype, body) = match req.uri().path() {
                "/metrics" => (
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    metrics.render(&stats),
                ),
                "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
                _ => (
                    StatusCode::NOT_FOUND,
                    "text/plain",
                    "not found\n".to_string(),
                ),
            };
            let mut resp = Response::new(Full::new(Bytes::from(body)));
            *resp.status_mut() = status;
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(ctype),
            );
            async move { Ok::<_, Infallible>(resp) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
