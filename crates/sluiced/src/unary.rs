//! The gRPC port: a lean unary gRPC server on the `h2` crate, serving `sluice.v1.Limiter` and
//! Envoy's `RateLimitService` through their tonic service traits.
//!
//! Every method Sluice serves is unary and small, and a gateway calls one per request, so
//! the transport is most of a memory-store decision's cost. tonic's server runs each call
//! through tower layers, an axum router, boxed streaming bodies and hyper's per-stream
//! machinery; here a call is one HTTP/2 stream read to its end, one message decoded, the
//! service's method called, and the answer sent as headers, one DATA frame and trailers
//! (docs/benchmark.md has the profile and the figures).
//!
//! What it keeps of the gRPC over HTTP/2 protocol: `POST` with `content-type:
//! application/grpc[+proto]`, length-prefixed uncompressed messages up to
//! `limits.max_message_bytes` (a bigger one is `RESOURCE_EXHAUSTED` from its prefix, unread),
//! `grpc-status`/`grpc-message` trailers (a trailers-only response for errors),
//! `UNIMPLEMENTED` for unknown methods and compressed messages, and `grpc-timeout`: a call
//! whose caller's deadline has passed is not started, or stops waiting, and is answered
//! `DEADLINE_EXCEEDED`.
//!
//! What one connection may hold is bounded ([`crate::limits`]): streams, header block and
//! windows by the HTTP/2 settings, a body by `limits.body_timeout_ms` (the stream is reset),
//! the handshake by `limits.header_timeout_ms`; checks past `limits.max_in_flight` are shed
//! with `UNAVAILABLE`, which Envoy's `failure_mode_deny` applies to.

use crate::envoy::RateLimitService;
use crate::grpc::LimiterService;
use crate::limits::{Guard, Port};
use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use sluice_proto::envoy::service::ratelimit::v3 as rls;
use sluice_proto::sluice::v1 as pb;
use sluice_proto::sluice::v1::limiter_server::Limiter as _;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Code, Status};

/// Connection-level receive window: what request bodies one connection may hold, in h2's
/// buffers and in its calls together (a call returns its message's capacity when it ends,
/// not when it reads it).
///
/// Its half is also h2's budget for small DATA frames: h2 closes a connection (GOAWAY,
/// ENHANCE_YOUR_CALM) whose peer sent more small DATA frames that are not the stream's last
/// than the calls have read yet. Clients that end a request with an empty DATA frame
/// (grpc-go does) send one such frame per call: at most
/// [`MAX_GRPC_STREAMS`](crate::limits::MAX_GRPC_STREAMS) × 256 bytes of overhead, which the
/// budget must hold with room to spare, or a gateway's burst of calls would get its
/// connection torn down by the limiter.
pub const CONN_WINDOW: u32 = 1 << 20;
const _: () = assert!(crate::limits::MAX_GRPC_STREAMS as u64 * 256 * 2 <= CONN_WINDOW as u64 / 2);

/// The services behind the port.
pub struct Services {
    /// `sluice.v1.Limiter`.
    pub limiter: LimiterService,
    /// `envoy.service.ratelimit.v3.RateLimitService`.
    pub envoy: RateLimitService,
    /// The limits in force, shared with the HTTP port.
    pub guard: Arc<Guard>,
}

/// The methods served, by path.
#[derive(Clone, Copy)]
enum Method {
    Check,
    Release,
    ShouldRateLimit,
}

impl Method {
    fn of(path: &str) -> Option<Method> {
        match path {
            "/sluice.v1.Limiter/Check" => Some(Method::Check),
            "/sluice.v1.Limiter/Release" => Some(Method::Release),
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" => {
                Some(Method::ShouldRateLimit)
            }
            _ => None,
        }
    }
}

/// Serves the gRPC port until `stop` turns true, then asks every connection to finish its
/// open calls (HTTP/2 GOAWAY) and returns when they have. With `workers`, each connection
/// and its calls run on one connection thread.
pub async fn serve(
    listener: TcpListener,
    services: Arc<Services>,
    stop: watch::Receiver<bool>,
    workers: Option<Arc<crate::workers::Workers>>,
) {
    let guard = services.guard.clone();
    crate::limits::accept_loop(
        listener,
        &guard,
        Port::Grpc,
        stop,
        workers,
        move |tcp, tls, permit, stop| {
            let services = services.clone();
            async move {
                match tls {
                    None => connection(tcp, services, permit, stop).await,
                    Some(tls) => {
                        // The TLS handshake within the handshake deadline (ALPN h2).
                        let limits = services.guard.limits();
                        match crate::limits::tls_handshake(&tls, tcp, limits).await {
                            Ok(Ok(s)) => connection(s, services, permit, stop).await,
                            Ok(Err(e)) => tracing::debug!(error = %e, "gRPC TLS handshake failed"),
                            Err(_) => services.guard.handshake_timed_out(),
                        }
                    }
                }
            }
        },
    )
    .await;
}

/// One client connection: HTTP/2 with a task per call, so a call waiting on the store does
/// not hold up the others. Closed if its preface and SETTINGS (confirmed by a PING answered)
/// have not arrived within `limits.header_timeout_ms`.
async fn connection<S>(
    tcp: S,
    services: Arc<Services>,
    permit: crate::limits::Connection,
    mut stop: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + crate::tls::NoDelay + Unpin + Send + 'static,
{
    tcp.no_delay();
    let limits = services.guard.limits();
    let settled_by = Instant::now() + limits.header_timeout();
    // A stream's window holds its largest message, so no call waits on a window update.
    let stream_window = u32::try_from(limits.max_message_bytes + 5).unwrap_or(u32::MAX);
    let handshake = h2::server::Builder::new()
        .initial_window_size(stream_window)
        .initial_connection_window_size(CONN_WINDOW)
        .max_concurrent_streams(limits.grpc_max_concurrent_streams)
        .max_header_list_size(limits.max_header_bytes)
        .max_frame_size(16 << 10)
        .max_send_buffer_size(64 << 10)
        .handshake::<_, Bytes>(tcp);
    let mut conn = tokio::select! {
        c = tokio::time::timeout_at(settled_by, handshake) => match c {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "gRPC handshake failed");
                return;
            }
            Err(_) => {
                services.guard.handshake_timed_out();
                return;
            }
        },
        _ = stop.changed() => return,
    };
    // The client's SETTINGS must precede anything else it sends: its answer to a PING means
    // they arrived.
    let pong = conn.ping_pong();
    let settled = async move {
        match pong {
            Some(mut p) => p.ping(h2::Ping::opaque()).await.is_ok(),
            None => true,
        }
    };
    tokio::pin!(settled);
    let mut confirmed = false;
    let mut stopping = *stop.borrow();
    if stopping {
        conn.graceful_shutdown();
    }
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    // Boxed: a call's future is kilobytes, and tokio moves a spawned
                    // future by value several times (into the task, into its stage); a
                    // box moves as one pointer. 46,000 -> 43,000 instructions a check.
                    tokio::spawn(Box::pin(call(services.clone(), req, respond)));
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "gRPC connection ended");
                    break;
                }
                None => break,
            },
            ok = &mut settled, if !confirmed => {
                if !ok {
                    break;
                }
                confirmed = true;
            }
            _ = tokio::time::sleep_until(settled_by), if !confirmed => {
                services.guard.handshake_timed_out();
                break;
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.graceful_shutdown();
            }
        }
    }
    drop(permit);
}

/// One call: checks the request, reads its message, runs the method, sends the answer.
///
/// Its body (the message's flow-control capacity) is held until the call ends, so that what
/// a connection's calls hold is bounded by the connection window.
async fn call(
    services: Arc<Services>,
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let started = Instant::now();
    let guard = &services.guard;
    let limits = guard.limits();
    // Held until the call ends, like its body's capacity: what all connections' calls hold
    // together is bounded, not only what one connection's do.
    let Some(_open) = guard.open_stream() else {
        return fail(&mut respond, &streams_full(limits.grpc_max_open_streams));
    };
    let (parts, mut body) = req.into_parts();
    if parts.method != http::Method::POST {
        let _ = respond.send_response(http_status(StatusCode::METHOD_NOT_ALLOWED), true);
        return;
    }
    let grpc = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !grpc {
        let _ = respond.send_response(http_status(StatusCode::UNSUPPORTED_MEDIA_TYPE), true);
        return;
    }
    let Some(method) = Method::of(parts.uri.path()) else {
        let status = Status::unimplemented(format!("unknown method {}", parts.uri.path()));
        return fail(&mut respond, &status);
    };
    let deadline = match grpc_timeout(&parts.headers) {
        Ok(t) => t.map(|t| started.checked_add(t).unwrap_or(started + FAR)),
        Err(status) => return fail(&mut respond, &status),
    };
    if deadline.is_some_and(|d| Instant::now() >= d) {
        guard.deadline_exceeded();
        return fail(&mut respond, &deadline_passed());
    }
    let body_by = started + limits.body_timeout();
    let read_by = deadline.map_or(body_by, |d| d.min(body_by));
    // Most bodies are in by now: read without arming a timer, and wait with one if not.
    let read = {
        let read = read_message(&mut body, limits.max_message_bytes);
        tokio::pin!(read);
        match std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
            Poll::Ready(r) => Ok(r),
            Poll::Pending => tokio::time::timeout_at(read_by, read).await,
        }
    };
    let msg = match read {
        Ok(Ok(m)) => m,
        Ok(Err(status)) => {
            if status.code() == Code::ResourceExhausted {
                guard.too_large(Port::Grpc);
            }
            return fail(&mut respond, &status);
        }
        Err(_) if read_by < body_by => {
            guard.deadline_exceeded();
            return fail(&mut respond, &deadline_passed());
        }
        Err(_) => {
            // The body never came: the stream is reset, and its place on the connection freed.
            guard.body_timed_out(Port::Grpc);
            respond.send_reset(h2::Reason::CANCEL);
            return;
        }
    };
    if deadline.is_some_and(|d| Instant::now() >= d) {
        guard.deadline_exceeded();
        return fail(&mut respond, &deadline_passed());
    }
    let Some(_in_flight) = guard.enter(Port::Grpc) else {
        return fail(&mut respond, &shed(limits.max_in_flight));
    };
    // Boxed for the same reason as the call itself: awaiting it would move it by value.
    let work = Box::pin(dispatch(&services, method, msg));
    let answer = match deadline {
        Some(d) => match tokio::time::timeout_at(d, work).await {
            Ok(a) => a,
            Err(_) => {
                guard.deadline_exceeded();
                Err(deadline_passed())
            }
        },
        None => work.await,
    };
    match answer {
        Ok(body) => {
            // Header names as constants: a name given as a string is parsed on every call.
            let mut head = http::Response::new(());
            head.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            let Ok(mut stream) = respond.send_response(head, false) else {
                return;
            };
            if stream.send_data(body, false).is_ok() {
                let mut trailers = HeaderMap::with_capacity(1);
                trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
                let _ = stream.send_trailers(trailers);
            }
        }
        Err(status) => fail(&mut respond, &status),
    }
    drop(body);
}

/// `grpc-status`.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-timeout`.
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// A deadline far enough to be none, for a `grpc-timeout` beyond what `Instant` holds.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The caller's deadline passed before its call could be answered.
fn deadline_passed() -> Status {
    Status::deadline_exceeded("the caller's deadline (grpc-timeout) passed")
}

/// The answer to a call that arrives while `grpc_max_open_streams` calls are open.
fn streams_full(max: usize) -> Status {
    overloaded(format!(
        "overloaded: {max} calls are open (limits.grpc_max_open_streams); retry shortly"
    ))
}

/// The answer to a check shed at the in-flight bound: `UNAVAILABLE` (which gRPC clients may
/// retry, and Envoy's `failure_mode_deny` applies to), with a pushback hint.
fn shed(max: usize) -> Status {
    overloaded(format!(
        "overloaded: {max} checks are being decided (limits.max_in_flight); retry shortly"
    ))
}

/// `UNAVAILABLE` with `grpc-retry-pushback-ms: 100`: cheap to send, and a hint to back off.
fn overloaded(message: String) -> Status {
    let mut md = tonic::metadata::MetadataMap::with_capacity(1);
    md.insert(
        "grpc-retry-pushback-ms",
        tonic::metadata::MetadataValue::from_static("100"),
    );
    Status::with_metadata(Code::Unavailable, message, md)
}

/// The caller's `grpc-timeout` (`1*8DIGIT` and a unit of `H M S m u n`), if it sent one.
fn grpc_timeout(headers: &HeaderMap) -> Result<Option<Duration>, Status> {
    let Some(v) = headers.get(GRPC_TIMEOUT) else {
        return Ok(None);
    };
    let bad = || Status::internal(format!("malformed grpc-timeout {v:?}"));
    let b = v.as_bytes();
    let (digits, unit) = b.split_at(b.len().saturating_sub(1));
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    let t = match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return Err(bad()),
    };
    Ok(Some(t))
}

/// Decodes the message for `method`, runs it, and encodes its answer.
async fn dispatch(services: &Services, method: Method, msg: Bytes) -> Result<Bytes, Status> {
    match method {
        Method::Check => {
            run(&msg, |m: pb::CheckRequest| {
                services.limiter.check(tonic::Request::new(m))
            })
            .await
        }
        Method::Release => {
            run(&msg, |m: pb::ReleaseRequest| {
                services.limiter.release(tonic::Request::new(m))
            })
            .await
        }
        Method::ShouldRateLimit => {
            let req = decode::<rls::RateLimitRequest>(&msg)?;
            let outcome = services.envoy.answer(req).await?;
            framed(|out| outcome.encode(&services.envoy.config, out))
        }
    }
}

fn decode<Req: prost::Message + Default>(msg: &[u8]) -> Result<Req, Status> {
    Req::decode(msg).map_err(|e| Status::internal(format!("failed to decode the request: {e}")))
}

/// A message `write` appends, length-prefixed.
fn framed(write: impl FnOnce(&mut BytesMut) -> Result<(), Status>) -> Result<Bytes, Status> {
    let mut out = BytesMut::with_capacity(256);
    out.put_bytes(0, 5);
    write(&mut out)?;
    let len = u32::try_from(out.len() - 5).map_err(|_| Status::internal("response too large"))?;
    out[1..5].copy_from_slice(&len.to_be_bytes());
    Ok(out.freeze())
}

/// Decodes the request as `Req`, calls the method, and encodes its answer length-prefixed.
async fn run<Req, Resp, F>(msg: &[u8], method: impl FnOnce(Req) -> F) -> Result<Bytes, Status>
where
    Req: prost::Message + Default,
    Resp: prost::Message,
    F: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let resp = method(decode(msg)?).await?.into_inner();
    framed(|out| {
        resp.encode(out)
            .map_err(|e| Status::internal(format!("failed to encode the response: {e}")))
    })
}

/// Reads the request body to its end and returns its one message, without the prefix.
///
/// The prefix is checked as soon as its five bytes are in: a message declared larger than
/// `max` is refused before any more of it is read. The capacity is not released here: the
/// call holds it until it ends (see [`CONN_WINDOW`]).
async fn read_message(body: &mut h2::RecvStream, max: usize) -> Result<Bytes, Status> {
    // Most requests arrive in one DATA frame: it is used as it is, without a copy.
    let mut one: Option<Bytes> = None;
    let mut many = BytesMut::new();
    let mut declared: Option<usize> = None;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| Status::cancelled(format!("request body: {e}")))?;
        if let Some(f) = one.take() {
            many.extend_from_slice(&f);
            many.extend_from_slice(&chunk);
        } else if many.is_empty() {
            one = Some(chunk);
        } else {
            many.extend_from_slice(&chunk);
        }
        let have: &[u8] = one.as_deref().unwrap_or(&many);
        if declared.is_none()
            && let Some(p) = have.first_chunk::<5>()
        {
            declared = Some(prefix(p, max)?);
        }
        if let Some(len) = declared
            && have.len() > len + 5
        {
            return Err(Status::internal(format!(
                "the gRPC prefix says {len} bytes, the body holds more"
            )));
        }
    }
    let mut buf = one.unwrap_or_else(|| many.freeze());
    frame(&mut buf, max)?;
    Ok(buf)
}

/// Checks a message's 5-byte prefix: uncompressed, and at most `max` bytes long, which it
/// returns.
fn prefix(p: &[u8; 5], max: usize) -> Result<usize, Status> {
    match p[0] {
        0 => {}
        1 => {
            // The gRPC spec: UNIMPLEMENTED, and the encodings the server accepts.
            let mut accept = tonic::metadata::MetadataMap::with_capacity(1);
            accept.insert(
                "grpc-accept-encoding",
                tonic::metadata::MetadataValue::from_static("identity"),
            );
            return Err(Status::with_metadata(
                Code::Unimplemented,
                "compressed messages are not supported: send them uncompressed",
                accept,
            ));
        }
        f => {
            return Err(Status::internal(format!(
                "invalid gRPC compression flag {f}: is the body length-prefixed?"
            )));
        }
    }
    let len = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize;
    if len > max {
        // As gRPC's own servers word it.
        return Err(Status::resource_exhausted(format!(
            "received message larger than max ({len} vs. {max})"
        )));
    }
    Ok(len)
}

/// Strips the 5-byte gRPC prefix from a whole body, checking it holds exactly one
/// uncompressed message of at most `max` bytes.
fn frame(buf: &mut Bytes, max: usize) -> Result<(), Status> {
    let Some(p) = buf.first_chunk::<5>() else {
        return Err(Status::internal(format!(
            "request of {} bytes holds no gRPC message",
            buf.len()
        )));
    };
    let len = prefix(p, max)?;
    if buf.len() - 5 != len {
        return Err(Status::internal(format!(
            "the gRPC prefix says {len} bytes, the body holds {}",
            buf.len() - 5
        )));
    }
    let _ = buf.split_to(5);
    Ok(())
}

/// A response with only an HTTP status (not gRPC at all).
fn http_status(s: StatusCode) -> http::Response<()> {
    let mut r = http::Response::new(());
    *r.status_mut() = s;
    r
}

/// A trailers-only gRPC error response.
fn fail(respond: &mut h2::server::SendResponse<Bytes>, status: &Status) {
    let mut r = http::Response::new(());
    let h = r.headers_mut();
    h.extend(status.metadata().clone().into_headers());
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(GRPC_STATUS, HeaderValue::from(status.code() as i32));
    if let Ok(m) = HeaderValue::from_str(&percent_encode(status.message())) {
        h.insert("grpc-message", m);
    }
    let _ = respond.send_response(r, true);
}

/// `grpc-message` is percent-encoded: bytes outside printable ASCII, and `%` itself.
fn percent_encode(s: &str) -> String {
    const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
    percent_encoding::utf8_percent_encode(s, GRPC_MESSAGE).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 64 << 10;

    fn framed(flag: u8, msg: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u8(flag);
        b.put_u32(msg.len() as u32);
        b.extend_from_slice(msg);
        b.freeze()
    }

    #[test]
    fn a_whole_message_is_unframed() {
        let mut b = framed(0, b"hello");
        frame(&mut b, MAX).expect("one message");
        assert_eq!(&b[..], b"hello");
        let mut empty = framed(0, b"");
        frame(&mut empty, MAX).expect("an empty message is a default one");
        assert!(empty.is_empty());
    }

    #[test]
    fn bad_frames_are_refused_with_their_reason() {
        let mut short = Bytes::from_static(b"\0\0\0");
        assert_eq!(
            frame(&mut short, MAX).expect_err("refused").code(),
            Code::Internal
        );
        let mut zipped = framed(1, b"x");
        let zipped = frame(&mut zipped, MAX).expect_err("refused");
        assert_eq!(zipped.code(), Code::Unimplemented);
        assert_eq!(
            zipped
                .metadata()
                .get("grpc-accept-encoding")
                .map(|v| v.to_str().ok()),
            Some(Some("identity"))
        );
        let mut unframed = framed(10, b"x");
        assert_eq!(
            frame(&mut unframed, MAX).expect_err("refused").code(),
            Code::Internal
        );
        let mut truncated = framed(0, b"hello");
        let mut t = truncated.split_to(truncated.len() - 1);
        assert_eq!(
            frame(&mut t, MAX).expect_err("refused").code(),
            Code::Internal
        );
        let mut two = BytesMut::from(&framed(0, b"a")[..]);
        two.extend_from_slice(&framed(0, b"b"));
        assert_eq!(
            frame(&mut two.freeze(), MAX).expect_err("refused").code(),
            Code::Internal
        );
        let mut huge = BytesMut::new();
        huge.put_u8(0);
        huge.put_u32(MAX as u32 + 1);
        assert_eq!(
            frame(&mut huge.freeze(), MAX).expect_err("refused").code(),
            Code::ResourceExhausted
        );
    }

    #[test]
    fn grpc_timeouts_are_read_in_their_units() {
        let t = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", HeaderValue::from_static(v));
            grpc_timeout(&h)
        };
        assert_eq!(grpc_timeout(&HeaderMap::new()).ok(), Some(None));
        assert_eq!(t("2H").ok(), Some(Some(Duration::from_secs(7200))));
        assert_eq!(t("3M").ok(), Some(Some(Duration::from_secs(180))));
        assert_eq!(t("1S").ok(), Some(Some(Duration::from_secs(1))));
        assert_eq!(t("250m").ok(), Some(Some(Duration::from_millis(250))));
        assert_eq!(
            t("99999999u").ok(),
            Some(Some(Duration::from_micros(99_999_999)))
        );
        assert_eq!(t("1n").ok(), Some(Some(Duration::from_nanos(1))));
        for bad in ["", "m", "10", "123456789m", "1x", "-1m", "1.5S"] {
            assert_eq!(
                t(bad).map_err(|s| s.code()).err(),
                Some(Code::Internal),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_message_too_large_is_refused_from_its_prefix() {
        let p = [0, 0, 1, 0, 1];
        assert_eq!(
            prefix(&p, 65536).map_err(|s| s.code()).err(),
            Some(Code::ResourceExhausted)
        );
        assert_eq!(prefix(&p, 65537).ok(), Some(65537));
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("plain text"), "plain text");
        assert_eq!(percent_encode("100% café\n"), "100%25 caf%C3%A9%0A");
    }
}
