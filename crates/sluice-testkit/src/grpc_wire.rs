//! Raw HTTP/2 gRPC calls, below any gRPC client library, for tests that check the wire.
//!
//! A generated client (tonic) hides what the limits and TLS tests assert on: a stream whose
//! body is never sent, extra request headers such as a malformed `grpc-timeout`, a message
//! framed by hand, and the `grpc-status` of a trailers-only answer to a request the server did
//! not read. These helpers speak h2 directly on a connection the test set up (plain TCP with
//! the windows it wants, or a TLS stream with ALPN `h2`), so each test keeps control of the
//! transport and shares only the gRPC framing and status reading.
//!
//! They are async (h2 needs a runtime); a sync test runs them on [`runtime`].

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use tokio::io::{AsyncRead, AsyncWrite};

/// The runtime sync tests run these helpers on: two workers (the test machines have two
/// cores), with I/O and timers.
///
/// A test that also polls blocking helpers (`/metrics` over [`crate::http_get`]) keeps a
/// worker free for the connection task while it does.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the test runtime")
}

/// One gRPC message on the wire: the uncompressed flag (0), its length (4 bytes, big-endian)
/// and the encoded protobuf.
///
/// gRPC's length-prefixed framing, made by hand so a test can send any message, including
/// one just under a size cap.
///
/// Errors when `msg` is 4 GiB or longer, which the 4-byte length cannot carry.
pub fn framed(msg: &[u8]) -> Result<Bytes> {
    let len = u32::try_from(msg.len())
        .with_context(|| format!("a gRPC message of {} bytes", msg.len()))?;
    let mut b = Vec::with_capacity(5 + msg.len());
    b.push(0);
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(msg);
    Ok(b.into())
}

/// The HTTP/2 handshake over `io` with `builder`'s settings; the connection's I/O is driven
/// on its own task until it ends.
///
/// `io` is whatever the test connected: a plain [`tokio::net::TcpStream`] or a TLS stream.
/// `h2::client::Builder::new()` gives h2's defaults, the same as `h2::client::handshake`.
pub async fn handshake<T>(io: T, builder: &h2::client::Builder) -> Result<SendRequest<Bytes>>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = builder
        .handshake::<_, Bytes>(io)
        .await
        .context("the HTTP/2 handshake")?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// Opens a gRPC call: its headers sent, its body left open for the test to send (or not).
///
/// `base` is the scheme and authority (`http://127.0.0.1:50051`, `https://localhost:50051`),
/// `path` the method (`/sluice.v1.Limiter/Check`), `headers` extra request headers such as
/// `grpc-timeout`. A stream opened and never given a body is how the tests hold one open.
pub async fn open(
    send: &SendRequest<Bytes>,
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(ResponseFuture, h2::SendStream<Bytes>)> {
    let mut req = http::Request::post(format!("{base}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(())
        .with_context(|| format!("a request for {base}{path}"))?;
    let mut ready = send
        .clone()
        .ready()
        .await
        .context("the connection is ready for a stream")?;
    ready
        .send_request(req, false)
        .context("sending the request headers")
}

/// A whole unary call: [`open`], the [`framed`] `msg` as its body, and the answer's
/// `grpc-status` (see [`status_of`]).
///
/// The status code as the server wrote it (`"0"` OK, `"8"` RESOURCE_EXHAUSTED, …), since
/// that is what the tests assert on.
pub async fn call(
    send: &SendRequest<Bytes>,
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
    msg: &[u8],
) -> Result<String> {
    let (resp, mut stream) = open(send, base, path, headers).await?;
    stream
        .send_data(framed(msg)?, true)
        .context("sending the message")?;
    status_of(resp).await
}

/// The `grpc-status` of an answer: from its headers when trailers-only, else from its
/// trailers after the body is read (and its flow-control capacity given back).
///
/// Errors when the HTTP status is not 200, when the stream is reset before an answer, or
/// when no `grpc-status` is sent.
pub async fn status_of(resp: ResponseFuture) -> Result<String> {
    let resp = resp.await.context("the response headers")?;
    ensure!(
        resp.status() == 200,
        "HTTP status {}, not 200",
        resp.status()
    );
    let text = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    if let Some(s) = text(resp.headers()) {
        // Trailers-only: the server may reset the rest of a request it did not read.
        return Ok(s);
    }
    let mut body = resp.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.context("the response body")?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body
        .trailers()
        .await
        .context("the response trailers")?
        .context("the answer ended without trailers")?;
    text(&trailers).context("no grpc-status in the trailers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_prefixed_with_its_flag_and_length() -> Result<()> {
        assert_eq!(&framed(b"abc")?[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(&framed(b"")?[..], &[0, 0, 0, 0, 0]);
        let big = vec![7u8; 70_000];
        let f = framed(&big)?;
        assert_eq!(&f[..5], &[0, 0, 1, 0x11, 0x70]);
        assert_eq!(f.len(), 70_005);
        assert!(f[5..].iter().all(|b| *b == 7));
        Ok(())
    }
}
