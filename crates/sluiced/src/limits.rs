//! Resource limits and self-protection: what one client, or too many, may make the daemon
//! hold, and what the daemon answers past it.
//!
//! A limiter that runs out of memory or queues without bound takes every gateway's requests
//! down with it, so each port bounds what a connection may hold (message size, streams, header
//! and body deadlines), how many connections it keeps (past the cap a new one is closed at
//! once), and the daemon bounds the checks it decides at once: past `max_in_flight` a check
//! is shed with a cheap answer the caller can act on (gRPC `UNAVAILABLE`, HTTP 503 with
//! `Retry-After`) instead of waiting in a queue. docs/failure.md has the figures.
//!
//! Every port accepts its connections in [`accept_loop`]. The gRPC port applies the rest in
//! [`crate::unary`]; the HTTP and admin ports are served by [`serve_http`], with
//! [`bounded_body`] in front of their routers.

use crate::metrics::Exporter;
use crate::tls::ServerTls;
use crate::workers::Workers;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::error::Elapsed;
use tokio_rustls::server::TlsStream;

/// Most streams one gRPC connection may be allowed: h2's budget for small DATA frames (half
/// the connection window, `unary::CONN_WINDOW`) must hold one trailing empty frame per call.
pub const MAX_GRPC_STREAMS: u32 = 1024;

/// The `limits:` section of the config file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Checks (and releases) being decided at once, over the gRPC and HTTP ports together;
    /// past it a check is shed at once.
    pub max_in_flight: usize,
    /// Open connections per port (gRPC, HTTP and admin each); past it a new connection is
    /// closed as soon as it is accepted.
    pub max_connections: usize,
    /// Largest gRPC request message and HTTP check/release body, bytes.
    pub max_message_bytes: usize,
    /// HTTP: the request line and headers must arrive within this (an idle keep-alive
    /// connection is closed after it too); gRPC: the connection preface and SETTINGS. ms.
    pub header_timeout_ms: u64,
    /// A request body must arrive whole within this of its headers, ms: a gRPC stream is
    /// reset, an HTTP request answered 408 and its connection closed.
    pub body_timeout_ms: u64,
    /// Calls open at once on one gRPC connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    pub grpc_max_concurrent_streams: u32,
    /// gRPC calls open at once over all connections, bodies not yet read included: the
    /// daemon's memory budget for streams (each holds up to a header block and a message).
    /// Past it a new call is answered `UNAVAILABLE` at once, its body unread.
    pub grpc_max_open_streams: usize,
    /// Largest request header block, bytes (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE and the
    /// HTTP/1 header size).
    pub max_header_bytes: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_in_flight: 4096,
            max_connections: 10_000,
            max_message_bytes: 64 << 10,
            header_timeout_ms: 5_000,
            body_timeout_ms: 5_000,
            // A gateway's burst on a new connection may arrive before the client has the
            // server's SETTINGS; streams past the limit would be refused.
            grpc_max_concurrent_streams: MAX_GRPC_STREAMS,
            // Twice the in-flight bound: a burst's bodies may still be on their way.
            grpc_max_open_streams: 8192,
            max_header_bytes: 8 << 10,
        }
    }
}

impl LimitsConfig {
    /// Refuses values that would disable a bound or break the gRPC port.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.max_in_flight > 0,
            "limits.max_in_flight must be greater than zero"
        );
        anyhow::ensure!(
            self.max_connections > 0,
            "limits.max_connections must be greater than zero"
        );
        anyhow::ensure!(
            (1024..=(16 << 20)).contains(&self.max_message_bytes),
            "limits.max_message_bytes must be 1024 to 16777216"
        );
        anyhow::ensure!(
            self.header_timeout_ms > 0 && self.body_timeout_ms > 0,
            "limits.header_timeout_ms and limits.body_timeout_ms must be greater than zero"
        );
        anyhow::ensure!(
            self.grpc_max_open_streams > 0,
            "limits.grpc_max_open_streams must be greater than zero"
        );
        anyhow::ensure!(
            (1..=MAX_GRPC_STREAMS).contains(&self.grpc_max_concurrent_streams),
            "limits.grpc_max_concurrent_streams must be 1 to {MAX_GRPC_STREAMS}"
        );
        anyhow::ensure!(
            (1024..=(1 << 20)).contains(&self.max_header_bytes),
            "limits.max_header_bytes must be 1024 to 1048576"
        );
        Ok(())
    }

    /// [`Self::header_timeout_ms`] as a duration.
    pub fn header_timeout(&self) -> Duration {
        Duration::from_millis(self.header_timeout_ms)
    }

    /// [`Self::body_timeout_ms`] as a duration.
    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms)
    }
}

/// The daemon's listening ports, for per-port counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// gRPC and Envoy RLS.
    Grpc = 0,
    /// HTTP JSON checks, health, metrics.
    Http = 1,
    /// The admin API.
    Admin = 2,
}

impl Port {
    const ALL: [Port; 3] = [Port::Grpc, Port::Http, Port::Admin];

    fn name(self) -> &'static str {
        match self {
            Port::Grpc => "grpc",
            Port::Http => "http",
            Port::Admin => "admin",
        }
    }
}

/// One counter per port.
#[derive(Debug, Default)]
struct PerPort([AtomicU64; 3]);

impl PerPort {
    fn add(&self, port: Port) {
        self.0[port as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self, port: Port) -> u64 {
        self.0[port as usize].load(Ordering::Relaxed)
    }
}

/// The limits in force and their counters, shared by the ports; exported in `/metrics`.
#[derive(Debug)]
pub struct Guard {
    limits: LimitsConfig,
    in_flight: AtomicUsize,
    streams: AtomicUsize,
    streams_refused: AtomicU64,
    open: [AtomicUsize; 3],
    shed: PerPort,
    refused: PerPort,
    body_timeouts: PerPort,
    too_large: PerPort,
    handshake_timeouts: AtomicU64,
    deadline_exceeded: AtomicU64,
}

/// A check being decided: holds one of the `max_in_flight` places until dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a Guard);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An open gRPC call: holds one of the `grpc_max_open_streams` places until dropped.
#[derive(Debug)]
pub struct OpenStream<'a>(&'a Guard);

impl Drop for OpenStream<'_> {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An open connection: holds one of its port's `max_connections` places until dropped.
#[derive(Debug)]
pub struct Connection {
    guard: Arc<Guard>,
    port: Port,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.guard.open[self.port as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Guard {
    /// The guard of `limits`, nothing in flight.
    pub fn new(limits: LimitsConfig) -> Guard {
        Guard {
            limits,
            in_flight: AtomicUsize::new(0),
            streams: AtomicUsize::new(0),
            streams_refused: AtomicU64::new(0),
            open: Default::default(),
            shed: PerPort::default(),
            refused: PerPort::default(),
            body_timeouts: PerPort::default(),
            too_large: PerPort::default(),
            handshake_timeouts: AtomicU64::new(0),
            deadline_exceeded: AtomicU64::new(0),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &LimitsConfig {
        &self.limits
    }

    /// A place for one check, or `None` (counted as shed on `port`) when `max_in_flight`
    /// checks are being decided: the caller answers at once instead of queueing.
    pub fn enter(&self, port: Port) -> Option<InFlight<'_>> {
        let before = self.in_flight.fetch_add(1, Ordering::Relaxed);
        let permit = InFlight(self);
        if before >= self.limits.max_in_flight {
            drop(permit);
            self.shed.add(port);
            return None;
        }
        Some(permit)
    }

    /// A place for one more open gRPC call, or `None` (counted) when
    /// `grpc_max_open_streams` are open: the call is answered at once, its body unread.
    pub fn open_stream(&self) -> Option<OpenStream<'_>> {
        let before = self.streams.fetch_add(1, Ordering::Relaxed);
        let permit = OpenStream(self);
        if before >= self.limits.grpc_max_open_streams {
            drop(permit);
            self.streams_refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(permit)
    }

    /// A place for one more connection on `port`, or `None` (counted) past the cap.
    pub fn connection(self: &Arc<Self>, port: Port) -> Option<Connection> {
        let open = &self.open[port as usize];
        let before = open.fetch_add(1, Ordering::Relaxed);
        let permit = Connection {
            guard: self.clone(),
            port,
        };
        if before >= self.limits.max_connections {
            drop(permit);
            self.refused.add(port);
            return None;
        }
        Some(permit)
    }

    /// Counts a request whose body did not arrive in time.
    pub fn body_timed_out(&self, port: Port) {
        self.body_timeouts.add(port);
    }

    /// Counts a request refused for its size.
    pub fn too_large(&self, port: Port) {
        self.too_large.add(port);
    }

    /// Counts a gRPC connection closed for not completing its preface and SETTINGS.
    pub fn handshake_timed_out(&self) {
        self.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a gRPC call answered `DEADLINE_EXCEEDED` for its caller's `grpc-timeout`.
    pub fn deadline_exceeded(&self) {
        self.deadline_exceeded.fetch_add(1, Ordering::Relaxed);
    }
}

impl Exporter for Guard {
    fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP sluice_checks_in_flight Checks being decided now (bound: limits.max_in_flight {}).\n# TYPE sluice_checks_in_flight gauge\nsluice_checks_in_flight {}",
            self.limits.max_in_flight,
            self.in_flight.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP sluice_connections_open Open connections by port (bound: limits.max_connections {}).\n# TYPE sluice_connections_open gauge",
            self.limits.max_connections
        );
        for p in Port::ALL {
            let _ = writeln!(
                out,
                "sluice_connections_open{{port=\"{}\"}} {}",
                p.name(),
                self.open[p as usize].load(Ordering::Relaxed)
            );
        }
        for (name, help, c) in [
            (
                "sluice_checks_shed_total",
                "Checks answered at once (gRPC UNAVAILABLE, HTTP 503) because limits.max_in_flight were being decided.",
                &self.shed,
            ),
            (
                "sluice_connections_refused_total",
                "Connections closed on accept because limits.max_connections were open.",
                &self.refused,
            ),
            (
                "sluice_request_body_timeouts_total",
                "Requests whose body did not arrive within limits.body_timeout_ms.",
                &self.body_timeouts,
            ),
            (
                "sluice_requests_too_large_total",
                "Requests refused for their size (gRPC RESOURCE_EXHAUSTED, HTTP 413).",
                &self.too_large,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for p in Port::ALL {
                let _ = writeln!(out, "{name}{{port=\"{}\"}} {}", p.name(), c.get(p));
            }
        }
        let _ = writeln!(
            out,
            "# HELP sluice_grpc_streams_open gRPC calls open now, bodies not yet read included (bound: limits.grpc_max_open_streams {}).\n# TYPE sluice_grpc_streams_open gauge\nsluice_grpc_streams_open {}\n# HELP sluice_grpc_streams_refused_total gRPC calls answered UNAVAILABLE on arrival because limits.grpc_max_open_streams were open.\n# TYPE sluice_grpc_streams_refused_total counter\nsluice_grpc_streams_refused_total {}",
            self.limits.grpc_max_open_streams,
            self.streams.load(Ordering::Relaxed),
            self.streams_refused.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP sluice_grpc_handshake_timeouts_total gRPC connections closed for not completing their preface and SETTINGS within limits.header_timeout_ms.\n# TYPE sluice_grpc_handshake_timeouts_total counter\nsluice_grpc_handshake_timeouts_total {}",
            self.handshake_timeouts.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP sluice_grpc_deadline_exceeded_total gRPC calls answered DEADLINE_EXCEEDED because the caller's grpc-timeout had passed.\n# TYPE sluice_grpc_deadline_exceeded_total counter\nsluice_grpc_deadline_exceeded_total {}",
            self.deadline_exceeded.load(Ordering::Relaxed)
        );
    }
}

/// Closes a connection past the cap at once, with a reset rather than a FIN so that neither
/// side keeps it in TIME_WAIT.
pub fn refuse(tcp: TcpStream) {
    let _ = tcp.set_zero_linger();
    drop(tcp);
}

/// A port's accept loop, the same for the HTTP, admin and gRPC ports: until `stop` turns
/// true, each accepted connection takes one of `port`'s `max_connections` places (past the
/// cap it is closed at once, [`refuse`]) and is served by the task `serve` makes of it,
/// handed the listener's TLS if it serves TLS; a failed accept backs off. With `workers` the
/// task runs on one of the connection threads ([`crate::workers`]), else on the caller's
/// runtime. Then stops accepting and returns when every connection's task has finished.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    guard: &Arc<Guard>,
    port: Port,
    mut stop: watch::Receiver<bool>,
    workers: Option<Arc<Workers>>,
    serve: F,
) where
    F: Fn(TcpStream, Option<Arc<ServerTls>>, Connection, watch::Receiver<bool>) -> Fut
        + Clone
        + Send
        + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut conns = JoinSet::new();
    let tls = crate::tls::for_addr(listener.local_addr().ok());
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    let Some(permit) = guard.connection(port) else {
                        refuse(tcp);
                        continue;
                    };
                    let Some(slot) = workers.as_ref().and_then(|w| w.place()) else {
                        conns.spawn(serve(tcp, tls.clone(), permit, stop.clone()));
                        continue;
                    };
                    // The socket moves to the thread's own reactor, so that its readiness
                    // wakes that thread and no other.
                    let tcp = match tcp.into_std() {
                        Ok(tcp) => tcp,
                        Err(e) => {
                            tracing::warn!(error = %e, port = port.name(), "cannot move a connection to its thread");
                            continue;
                        }
                    };
                    let (serve, tls, stop) = (serve.clone(), tls.clone(), stop.clone());
                    let handle = slot.handle.clone();
                    conns.spawn_on(
                        async move {
                            let _slot = slot;
                            match TcpStream::from_std(tcp) {
                                Ok(tcp) => serve(tcp, tls, permit, stop).await,
                                Err(e) => tracing::warn!(error = %e, "cannot serve a connection on its thread"),
                            }
                        },
                        &handle,
                    );
                }
                Err(e) => {
                    // Out of file descriptors, mostly: back off rather than spin.
                    tracing::warn!(error = %e, port = port.name(), "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// The TLS handshake on an accepted connection (`TCP_NODELAY` set first), within
/// `header_timeout_ms`: the outer `Err` when it did not finish in time.
pub async fn tls_handshake(
    tls: &ServerTls,
    tcp: TcpStream,
    limits: &LimitsConfig,
) -> Result<std::io::Result<TlsStream<TcpStream>>, Elapsed> {
    let _ = tcp.set_nodelay(true);
    tokio::time::timeout(limits.header_timeout(), tls.accept(tcp)).await
}

/// Serves `app` over HTTP/1.1 on `listener` until `stop` turns true, within the limits of
/// `guard` for `port`: past `max_connections` a new connection is closed at once, and one
/// whose request headers do not arrive within `header_timeout_ms` is closed; on `workers`
/// when given. Then lets every connection finish its request in flight and returns when they
/// have.
pub async fn serve_http(
    listener: TcpListener,
    app: Router,
    guard: Arc<Guard>,
    port: Port,
    stop: watch::Receiver<bool>,
    workers: Option<Arc<Workers>>,
) {
    accept_loop(
        listener,
        &guard,
        port,
        stop,
        workers,
        move |tcp, tls, permit, stop| {
            let app = app.clone();
            async move {
                match tls {
                    None => http_connection(tcp, app, permit, stop).await,
                    Some(tls) => {
                        // The TLS handshake within the header deadline.
                        let limits = permit.guard.limits();
                        if let Ok(Ok(s)) = tls_handshake(&tls, tcp, limits).await {
                            http_connection(s, app, permit, stop).await;
                        }
                    }
                }
            }
        },
    )
    .await;
}

/// One HTTP/1.1 connection, closed gracefully (after its request in flight) on stop.
async fn http_connection<S>(
    tcp: S,
    app: Router,
    permit: Connection,
    mut stop: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + crate::tls::NoDelay + Unpin + Send + 'static,
{
    tcp.no_delay();
    let limits = permit.guard.limits().clone();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout())
        .max_header_size(limits.max_header_bytes as usize)
        // The read buffer holds a request's head and passes its body through: without a
        // bound hyper lets it grow to ~400 KiB per connection.
        .max_buf_size((2 * limits.max_header_bytes as usize).max(16 << 10));
    let service = hyper_util::service::TowerToHyperService::new(app);
    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
    tokio::pin!(conn);
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "HTTP connection ended");
                }
                break;
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    drop(permit);
}

/// What [`bounded_body`] enforces on one router.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// Counters.
    pub guard: Arc<Guard>,
    /// The port counted.
    pub port: Port,
    /// A declared `Content-Length` above this is answered 413 without reading the body
    /// (`None`: the router's own per-route limits apply as the body is read).
    pub max_bytes: Option<usize>,
}

/// Middleware: a body declared larger than the cap is answered 413 at once, unread; a body
/// that has not arrived whole within `body_timeout_ms` of its headers ends the request with
/// 408 and the connection is closed. A 413 from the router's own limit is counted too.
pub async fn bounded_body(State(b): State<BodyLimits>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let (Some(max), Some(len)) = (b.max_bytes, declared)
        && len > max as u64
    {
        b.guard.too_large(b.port);
        return closing(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body of {len} bytes is larger than {max} bytes"),
        );
    }
    let tripped = Arc::new(AtomicBool::new(false));
    let deadline = tokio::time::Instant::now() + b.guard.limits().body_timeout();
    let req = req.map(|inner| {
        Body::new(DeadlineBody {
            inner,
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            tripped: tripped.clone(),
        })
    });
    let resp = next.run(req).await;
    if tripped.load(Ordering::Relaxed) {
        b.guard.body_timed_out(b.port);
        return closing(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} ms",
                b.guard.limits().body_timeout_ms
            ),
        );
    }
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE {
        b.guard.too_large(b.port);
    }
    resp
}

/// An error answer after which the connection is closed (its body may be half read).
fn closing(status: StatusCode, msg: String) -> Response {
    let mut r = (status, axum::Json(serde_json::json!({ "error": msg }))).into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A request body that fails once its deadline passes before it has ended.
struct DeadlineBody {
    inner: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
    tripped: Arc<AtomicBool>,
}

/// Why a [`DeadlineBody`] failed.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyTimeout;

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(f) => Poll::Ready(f.map(|r| r.map_err(Into::into))),
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.tripped.store(true, Ordering::Relaxed);
                    Poll::Ready(Some(Err(BodyTimeout.into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The HTTP answer to a shed check: 503, retry in a second, and why.
pub fn shed_response(guard: &Guard) -> Response {
    let mut r = (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(serde_json::json!({
            "error": format!(
                "overloaded: {} checks are being decided (limits.max_in_flight); retry shortly",
                guard.limits().max_in_flight
            ),
        })),
    )
        .into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_flight_bound_sheds_past_it_and_frees_on_drop() {
        let g = Guard::new(LimitsConfig {
            max_in_flight: 2,
            ..LimitsConfig::default()
        });
        let a = g.enter(Port::Grpc).expect("first");
        let _b = g.enter(Port::Http).expect("second");
        assert!(g.enter(Port::Http).is_none(), "the third is shed");
        assert_eq!(g.shed.get(Port::Http), 1);
        drop(a);
        assert!(g.enter(Port::Grpc).is_some(), "a place freed");
        let mut out = String::new();
        g.render(&mut out);
        assert!(
            out.contains("sluice_checks_shed_total{port=\"http\"} 1"),
            "{out}"
        );
        assert!(out.contains("sluice_checks_in_flight 1"), "{out}");
    }

    #[test]
    fn the_connection_cap_refuses_past_it() {
        let g = Arc::new(Guard::new(LimitsConfig {
            max_connections: 1,
            ..LimitsConfig::default()
        }));
        let c = g.connection(Port::Grpc).expect("first");
        assert!(g.connection(Port::Grpc).is_none());
        assert!(g.connection(Port::Http).is_some(), "per port");
        drop(c);
        assert!(g.connection(Port::Grpc).is_some());
        assert_eq!(g.refused.get(Port::Grpc), 1);
    }

    #[test]
    fn nonsense_limits_are_refused() {
        assert!(LimitsConfig::default().validate().is_ok());
        for bad in [
            LimitsConfig {
                max_in_flight: 0,
                ..LimitsConfig::default()
            },
            LimitsConfig {
                grpc_max_concurrent_streams: MAX_GRPC_STREAMS + 1,
                ..LimitsConfig::default()
            },
            LimitsConfig {
                max_message_bytes: 10,
                ..LimitsConfig::default()
            },
            LimitsConfig {
                body_timeout_ms: 0,
                ..LimitsConfig::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
