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
//! [`MAX_MESSAGE`] bytes, `grpc-status`/`grpc-message` trailers (a trailers-only response for
//! errors), `UNIMPLEMENTED` for unknown methods and compressed messages. `grpc-timeout` is
//! not enforced: the engine's store deadline (milliseconds) bounds every decision, and a
//! caller that gives up resets its stream.

use crate::envoy::RateLimitService;
use crate::grpc::LimiterService;
use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, StatusCode};
use sluice_proto::envoy::service::ratelimit::v3 as rls;
use sluice_proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService as _;
use sluice_proto::sluice::v1 as pb;
use sluice_proto::sluice::v1::limiter_server::Limiter as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::{Code, Status};

/// Largest request message accepted, as tonic's default: a gateway's request is a few
/// hundred bytes, and a bigger one is refused before it is buffered whole.
pub const MAX_MESSAGE: usize = 4 << 20;

/// Streams one connection may have open at once; a caller past it waits (HTTP/2 flow).
///
/// h2 closes a connection (GOAWAY, ENHANCE_YOUR_CALM) whose peer sent more small DATA frames
/// that are not the stream's last than the calls have read yet, within a budget of half the
/// connection window ([`CONN_WINDOW`]). Clients that end a request with an empty DATA frame
/// (grpc-go does) send one such frame per call: at most `MAX_STREAMS` × 256 bytes of
/// overhead, which the budget must hold with room to spare, or a gateway's burst of calls
/// would get its connection torn down by the limiter.
const MAX_STREAMS: u32 = 1024;
/// Connection-level receive window: its half is h2's budget for small DATA frames.
const CONN_WINDOW: u32 = 1 << 20;
const _: () = assert!(MAX_STREAMS as u64 * 256 * 2 <= CONN_WINDOW as u64 / 2);

/// The services behind the port.
pub struct Services {
    /// `sluice.v1.Limiter`.
    pub limiter: LimiterService,
    /// `envoy.service.ratelimit.v3.RateLimitService`.
    pub envoy: RateLimitService,
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
/// open calls (HTTP/2 GOAWAY) and returns when they have.
pub async fn serve(
    listener: TcpListener,
    services: Arc<Services>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    conns.spawn(connection(tcp, services.clone(), stop.clone()));
                }
                Err(e) => {
                    // Out of file descriptors, mostly: back off rather than spin.
                    tracing::warn!(error = %e, "gRPC accept failed");
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

/// One client connection: HTTP/2 with a task per call, so a call waiting on the store does
/// not hold up the others.
async fn connection(tcp: TcpStream, services: Arc<Services>, mut stop: watch::Receiver<bool>) {
    let _ = tcp.set_nodelay(true);
    let handshake = h2::server::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(CONN_WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(16 << 10)
        .handshake::<_, Bytes>(tcp);
    let mut conn = tokio::select! {
        c = handshake => match c {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "gRPC handshake failed");
                return;
            }
        },
        _ = stop.changed() => return,
    };
    let mut stopping = *stop.borrow();
    if stopping {
        conn.graceful_shutdown();
    }
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    tokio::spawn(call(services.clone(), req, respond));
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "gRPC connection ended");
                    return;
                }
                None => return,
            },
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.graceful_shutdown();
            }
        }
    }
}

/// One call: checks the request, reads its message, runs the method, sends the answer.
async fn call(
    services: Arc<Services>,
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let (parts, body) = req.into_parts();
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
    let msg = match read_message(body).await {
        Ok(m) => m,
        Err(status) => return fail(&mut respond, &status),
    };
    let answer = match method {
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
            run(&msg, |m: rls::RateLimitRequest| {
                services.envoy.should_rate_limit(tonic::Request::new(m))
            })
            .await
        }
    };
    match answer {
        Ok(body) => {
            let head = http::Response::builder()
                .status(StatusCode::OK)
                .header(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/grpc"),
                )
                .body(());
            let Ok(head) = head else { return };
            let Ok(mut stream) = respond.send_response(head, false) else {
                return;
            };
            if stream.send_data(body, false).is_ok() {
                let mut trailers = HeaderMap::with_capacity(1);
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                let _ = stream.send_trailers(trailers);
            }
        }
        Err(status) => fail(&mut respond, &status),
    }
}

/// Decodes the request as `Req`, calls the method, and encodes its answer length-prefixed.
async fn run<Req, Resp, F>(msg: &[u8], method: impl FnOnce(Req) -> F) -> Result<Bytes, Status>
where
    Req: prost::Message + Default,
    Resp: prost::Message,
    F: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let req = Req::decode(msg)
        .map_err(|e| Status::internal(format!("failed to decode the request: {e}")))?;
    let resp = method(req).await?.into_inner();
    let len = resp.encoded_len();
    let prefix = u32::try_from(len).map_err(|_| Status::internal("response too large"))?;
    let mut out = BytesMut::with_capacity(5 + len);
    out.put_u8(0);
    out.put_u32(prefix);
    resp.encode(&mut out)
        .map_err(|e| Status::internal(format!("failed to encode the response: {e}")))?;
    Ok(out.freeze())
}

/// Reads the request body to its end and returns its one message, without the prefix.
async fn read_message(mut body: h2::RecvStream) -> Result<Bytes, Status> {
    // Most requests arrive in one DATA frame: it is used as it is, without a copy.
    let mut first: Option<Bytes> = None;
    let mut more = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| Status::cancelled(format!("request body: {e}")))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        match &first {
            None => first = Some(chunk),
            Some(f) => {
                if more.is_empty() {
                    more.extend_from_slice(f);
                }
                more.extend_from_slice(&chunk);
            }
        }
        let have = if more.is_empty() {
            first.as_ref().map_or(0, Bytes::len)
        } else {
            more.len()
        };
        if have > MAX_MESSAGE + 5 {
            return Err(Status::resource_exhausted(format!(
                "request larger than {MAX_MESSAGE} bytes"
            )));
        }
    }
    let mut buf = if more.is_empty() {
        first.unwrap_or_default()
    } else {
        more.freeze()
    };
    frame(&mut buf)?;
    Ok(buf)
}

/// Strips the 5-byte gRPC prefix from a whole body, checking it holds exactly one
/// uncompressed message.
fn frame(buf: &mut Bytes) -> Result<(), Status> {
    if buf.len() < 5 {
        return Err(Status::internal(format!(
            "request of {} bytes holds no gRPC message",
            buf.len()
        )));
    }
    match buf[0] {
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
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(Status::resource_exhausted(format!(
            "request larger than {MAX_MESSAGE} bytes"
        )));
    }
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
    h.insert("grpc-status", HeaderValue::from(status.code() as i32));
    if let Ok(m) = HeaderValue::from_str(&percent_encode(status.message())) {
        h.insert("grpc-message", m);
    }
    let _ = respond.send_response(r, true);
}

/// `grpc-message` is percent-encoded: bytes outside printable ASCII, and `%` itself.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        frame(&mut b).expect("one message");
        assert_eq!(&b[..], b"hello");
        let mut empty = framed(0, b"");
        frame(&mut empty).expect("an empty message is a default one");
        assert!(empty.is_empty());
    }

    #[test]
    fn bad_frames_are_refused_with_their_reason() {
        let mut short = Bytes::from_static(b"\0\0\0");
        assert_eq!(
            frame(&mut short).expect_err("refused").code(),
            Code::Internal
        );
        let mut zipped = framed(1, b"x");
        let zipped = frame(&mut zipped).expect_err("refused");
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
            frame(&mut unframed).expect_err("refused").code(),
            Code::Internal
        );
        let mut truncated = framed(0, b"hello");
        let mut t = truncated.split_to(truncated.len() - 1);
        assert_eq!(frame(&mut t).expect_err("refused").code(), Code::Internal);
        let mut two = BytesMut::from(&framed(0, b"a")[..]);
        two.extend_from_slice(&framed(0, b"b"));
        assert_eq!(
            frame(&mut two.freeze()).expect_err("refused").code(),
            Code::Internal
        );
        let mut huge = BytesMut::new();
        huge.put_u8(0);
        huge.put_u32(MAX_MESSAGE as u32 + 1);
        assert_eq!(
            frame(&mut huge.freeze()).expect_err("refused").code(),
            Code::ResourceExhausted
        );
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("plain text"), "plain text");
        assert_eq!(percent_encode("100% café\n"), "100%25 caf%C3%A9%0A");
    }
}
