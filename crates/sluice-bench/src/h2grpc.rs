//! A lean unary gRPC client on the `h2` crate directly, for the Envoy RLS load.
//!
//! tonic's client runs each call through tower layers, a buffer task shared by the channel's
//! users and a task hyper spawns to stream the request body; on the generator's one core that
//! cost about as much CPU per request as a server spends deciding it, so saturation runs
//! measured the generator as much as the server (docs/benchmark.md). Here a call is one HTTP/2
//! stream on a shared connection: the headers, one DATA frame holding the length-prefixed
//! message, then the response's DATA and trailers read on the caller's own task.

use anyhow::{Context as _, bail};
use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use std::net::SocketAddr;

/// One HTTP/2 connection to one method; clones share it (each call is its own stream).
#[derive(Clone)]
pub struct Conn {
    send: h2::client::SendRequest<Bytes>,
    /// The method's URI, built once: cloning it per call copies no bytes.
    uri: http::Uri,
}

impl Conn {
    /// Connects to `addr` (plain-text HTTP/2, as gRPC without TLS) for the method at `path`
    /// (`/package.Service/Method`).
    pub async fn connect(addr: SocketAddr, path: &str) -> anyhow::Result<Conn> {
        let uri: http::Uri = format!("http://{addr}{path}")
            .parse()
            .with_context(|| format!("method path {path}"))?;
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        tcp.set_nodelay(true)?;
        // Windows of 1 MiB, as the servers set theirs. h2 also closes a connection whose
        // peer sent more small DATA frames than the application has read, within a budget
        // of half the connection window: with the 64 KiB default that was about 160
        // answers, and at 1,024 calls in flight over 4 connections the generator's own h2
        // tore its connections down (ENHANCE_YOUR_CALM, "too_many_data_frames") whenever its
        // tasks fell behind. Every gRPC answer is one small DATA frame before its trailers.
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 20)
            .handshake(tcp)
            .await
            .with_context(|| format!("HTTP/2 handshake with {addr}"))?;
        // The connection's I/O runs on its own task until the last `SendRequest` is dropped.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { send, uri })
    }

    /// Sends `msg` to the connection's method and returns the response message, encoded.
    pub async fn unary(&mut self, msg: &impl prost::Message) -> anyhow::Result<Bytes> {
        let body = frame(msg)?;
        let req = http::Request::builder()
            .method(http::Method::POST)
            .uri(self.uri.clone())
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(())?;
        // Waits while the server's limit on concurrent streams is reached.
        let mut send = self.send.clone().ready().await?;
        let (response, mut stream) = send.send_request(req, false)?;
        stream.send_data(body, true)?;
        let response = response.await?;
        if response.status() != http::StatusCode::OK {
            bail!("HTTP status {}", response.status());
        }
        // A trailers-only response carries grpc-status in its headers.
        if let Some(status) = response.headers().get("grpc-status") {
            grpc_ok(status, response.headers())?;
        }
        let mut body = response.into_body();
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            let _ = body.flow_control().release_capacity(chunk.len());
            buf.extend_from_slice(&chunk);
        }
        if let Some(t) = body.trailers().await? {
            match t.get("grpc-status") {
                Some(status) => grpc_ok(status, &t)?,
                None => bail!("trailers without grpc-status"),
            }
        }
        if buf.len() < 5 {
            bail!("response of {} bytes holds no gRPC message", buf.len());
        }
        if buf[0] != 0 {
            bail!("compressed response (flag {})", buf[0]);
        }
        buf.advance(1);
        let len = buf.get_u32() as usize;
        if buf.len() != len {
            bail!("gRPC message says {len} bytes, {} arrived", buf.len());
        }
        Ok(buf.freeze())
    }
}

/// `msg` as a gRPC request body: the 5-byte prefix (uncompressed, length) and the message.
pub fn frame(msg: &impl prost::Message) -> anyhow::Result<Bytes> {
    let mut body = BytesMut::with_capacity(5 + msg.encoded_len());
    body.put_u8(0);
    body.put_u32(u32::try_from(msg.encoded_len()).context("request too large")?);
    msg.encode(&mut body)?;
    Ok(body.freeze())
}

/// `grpc-status` 0, or the error it names.
fn grpc_ok(status: &http::HeaderValue, headers: &http::HeaderMap) -> anyhow::Result<()> {
    if status.as_bytes() == b"0" {
        return Ok(());
    }
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    bail!(
        "grpc-status {}: {message}",
        String::from_utf8_lossy(status.as_bytes())
    )
}

/// `grpc-message` is percent-encoded (the gRPC over HTTP/2 spec); bad escapes stay as sent.
fn percent_decode(b: &[u8]) -> String {
    percent_encoding::percent_decode(b)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(
            percent_decode(b"domain%20is%20required"),
            "domain is required"
        );
        assert_eq!(percent_decode(b"100%25 sure, %zz%2"), "100% sure, %zz%2");
        assert_eq!(percent_decode(b"caf%C3%A9"), "café");
    }
}
