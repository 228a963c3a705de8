//! A minimal HTTP/1.1 keep-alive client over a tokio `TcpStream`: one connection per worker,
//! one request at a time, `Content-Length` bodies only (what sluiced's JSON API sends). Kept
//! this small so the client's own cost stays low and visible next to the server's.

use anyhow::{Context as _, anyhow, bail};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Largest response head or body accepted.
const MAX_RESPONSE: usize = 1 << 20;

/// A response's status line and framing, parsed from its head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Status code.
    pub status: u16,
    /// Bytes of the head, through the blank line.
    pub head_len: usize,
    /// Body length.
    pub content_length: usize,
    /// The server will close the connection after this response.
    pub close: bool,
}

/// Parses a response head, `Ok(None)` while it is incomplete.
pub fn parse_head(buf: &[u8]) -> anyhow::Result<Option<Head>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_RESPONSE {
            bail!("response head over {MAX_RESPONSE} bytes");
        }
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[..end]).context("response head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        bail!("not an HTTP/1.x response: {status_line:?}");
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let mut content_length = None;
    let mut close = version == "HTTP/1.0";
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            bail!("bad header line {line:?}");
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = Some(
                value
                    .parse::<usize>()
                    .with_context(|| format!("bad content-length {value:?}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            bail!("transfer-encoding {value:?} is not supported by this client");
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    let content_length = content_length.unwrap_or(0);
    if content_length > MAX_RESPONSE {
        bail!("response body of {content_length} bytes is too large");
    }
    Ok(Some(Head {
        status,
        head_len: end + 4,
        content_length,
        close,
    }))
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
        let r = self.exchange(path, body).await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    async fn exchange(&mut self, path: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
        if self.conn.is_none() {
            let s = TcpStream::connect(self.addr)
                .await
                .with_context(|| format!("connecting to {}", self.addr))?;
            s.set_nodelay(true)?;
            self.conn = Some(s);
            self.buf.clear();
        }
        let conn = self.conn.as_mut().ok_or_else(|| anyhow!("no connection"))?;
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
        conn.write_all(&self.request).await?;

        let head = loop {
            if let Some(h) = parse_head(&self.buf)? {
                break h;
            }
            if self.read_more().await? == 0 {
                bail!("connection closed before the response head");
            }
        };
        let total = head.head_len + head.content_length;
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
    fn heads_parse_incrementally() {
        let full =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(parse_head(&full[..20]).expect("partial"), None);
        let h = parse_head(full).expect("ok").expect("complete");
        assert_eq!(h.status, 200);
        assert_eq!(h.content_length, 5);
        assert_eq!(&full[h.head_len..], b"hello");
        assert!(!h.close);
        let h = parse_head(b"HTTP/1.1 429 Too Many\r\nConnection: close\r\n\r\n")
            .expect("ok")
            .expect("complete");
        assert_eq!((h.status, h.content_length, h.close), (429, 0, true));
        assert!(parse_head(b"SSH-2.0\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").is_err());
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
