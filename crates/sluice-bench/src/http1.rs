//! A minimal HTTP/1.1 keep-alive client over a tokio `TcpStream`: one connection per worker,
//! one request at a time, `Content-Length` bodies only (what sluiced's JSON API, the gateway
//! and the bench upstream send): a JSON `POST` or a plain `GET`. Kept this small so the
//! client's own cost stays low and visible next to the server's; the response heads are parsed
//! by the workspace's one HTTP/1.1 parser (`sluice_http1::parse_head`).

use anyhow::{Context as _, anyhow, bail};
use sluice_http1::{Body, Head, parse_head};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Largest response body accepted.
const MAX_BODY: usize = 1 << 20;

/// The body length of a response head, `Content-Length` framing only.
fn body_len(head: &Head) -> anyhow::Result<usize> {
    match head.body {
        Body::Length(n) if n > MAX_BODY => bail!("response body of {n} bytes is too large"),
        Body::Length(n) => Ok(n),
        other => bail!("a response framed {other:?} is not supported by this client"),
    }
}

/// One keep-alive connection, reopened after an error or a `Connection: close`.
pub struct Http1 {
    addr: SocketAddr,
    conn: Option<TcpStream>,
    buf: Vec<u8>,
    request: Vec<u8>,
}

impl Http1 {
    /// A client for `addr`; connects on first use.
    pub fn new(addr: SocketAddr) -> Http1 {
        Http1 {
            addr,
            conn: None,
            buf: Vec::with_capacity(4096),
            request: Vec::with_capacity(512),
        }
    }

    /// Sends `POST path` with a JSON body; returns the status and the body.
    pub async fn post_json(&mut self, path: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
        self.request.clear();
        self.request.extend_from_slice(b"POST ");
        self.request.extend_from_slice(path.as_bytes());
        self.request.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        self.request
            .extend_from_slice(self.addr.to_string().as_bytes());
        self.request
            .extend_from_slice(b"\r\nContent-Type: application/json\r\nContent-Length: ");
        self.request
            .extend_from_slice(body.len().to_string().as_bytes());
        self.request.extend_from_slice(b"\r\n\r\n");
        self.request.extend_from_slice(body);
        self.send().await
    }

    /// Sends `GET path` with the given extra headers (name, value); returns the status and
    /// the body.
    pub async fn get(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        self.request.clear();
        self.request.extend_from_slice(b"GET ");
        self.request.extend_from_slice(path.as_bytes());
        self.request.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        self.request
            .extend_from_slice(self.addr.to_string().as_bytes());
        for (name, value) in headers {
            self.request.extend_from_slice(b"\r\n");
            self.request.extend_from_slice(name.as_bytes());
            self.request.extend_from_slice(b": ");
            self.request.extend_from_slice(value.as_bytes());
        }
        self.request.extend_from_slice(b"\r\n\r\n");
        self.send().await
    }

    /// Sends the request built in `self.request`; drops the connection after an error.
    async fn send(&mut self) -> anyhow::Result<(u16, Vec<u8>)> {
        let r = self.exchange().await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    async fn exchange(&mut self) -> anyhow::Result<(u16, Vec<u8>)> {
        if self.conn.is_none() {
            let s = TcpStream::connect(self.addr)
                .await
                .with_context(|| format!("connecting to {}", self.addr))?;
            s.set_nodelay(true)?;
            self.conn = Some(s);
            self.buf.clear();
        }
        let conn = self.conn.as_mut().ok_or_else(|| anyhow!("no connection"))?;
        conn.write_all(&self.request).await?;

        let head = loop {
            if let Some(h) = parse_head(&self.buf).context("reading the response head")? {
                break h;
            }
            if self.read_more().await? == 0 {
                bail!("connection closed before the response head");
            }
        };
        let total = head.head_len + body_len(&head)?;
        while self.buf.len() < total {
            if self.read_more().await? == 0 {
                bail!("connection closed inside the response body");
            }
        }
        let body = self.buf[head.head_len..total].to_vec();
        self.buf.drain(..total);
        if head.close {
            self.conn = None;
        }
        Ok((head.status, body))
    }

    async fn read_more(&mut self) -> anyhow::Result<usize> {
        let conn = self.conn.as_mut().ok_or_else(|| anyhow!("no connection"))?;
        let start = self.buf.len();
        self.buf.resize(start + 8192, 0);
        let n = conn.read(&mut self.buf[start..]).await;
        self.buf.truncate(start + *n.as_ref().unwrap_or(&0));
        Ok(n?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_content_length_bodies_are_read() {
        let head = |raw: &[u8]| parse_head(raw).expect("ok").expect("complete");
        let h = head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(body_len(&h).expect("framed"), 5);
        assert_eq!(
            body_len(&head(b"HTTP/1.1 204 No Content\r\n\r\n")).expect("empty"),
            0
        );
        assert!(
            body_len(&head(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            ))
            .is_err()
        );
        assert!(body_len(&head(b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n")).is_err());
    }

    #[tokio::test]
    async fn keeps_one_connection_alive() {
        use tokio::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.expect("accept");
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            for i in 0..2 {
                // Read one request (head + 2-byte body), answer it.
                loop {
                    let n = s.read(&mut buf).await.expect("read");
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(4).any(|w| w == b"\r\n\r\n") && seen.ends_with(b"{}") {
                        break;
                    }
                }
                seen.clear();
                let body = format!("{{\"n\":{i}}}");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(resp.as_bytes()).await.expect("write");
            }
        });
        let mut c = Http1::new(addr);
        assert_eq!(
            c.post_json("/x", b"{}").await.expect("first"),
            (200, b"{\"n\":0}".to_vec())
        );
        assert_eq!(
            c.post_json("/x", b"{}").await.expect("second"),
            (200, b"{\"n\":1}".to_vec())
        );
        server.await.expect("server");
    }
}
