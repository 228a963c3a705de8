//! A minimal blocking HTTP/1.1 client over [`std::net::TcpStream`].
//!
//! End-to-end tests call the daemons' JSON and admin APIs and `/metrics`; this avoids pulling
//! an HTTP client crate (and an async runtime) into every test. One request per connection
//! (`Connection: close`); responses framed by `Content-Length`, `chunked` encoding, or EOF.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};

/// Default timeout for connect, write and each read.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body accepted, to fail fast on a runaway stream.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// A parsed HTTP response.
///
/// Headers keep their order and original case; look them up case-insensitively with
/// [`header`](Self::header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code, e.g. 200 or 429.
    pub status: u16,
    /// The headers in order, names as sent by the server.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header named `name` (case-insensitive), e.g. `Retry-After`.
    ///
    /// For asserting on the rate-limit headers.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8), for JSON assertions and error messages.
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one HTTP/1.1 request to `addr` and reads the whole response (10 s timeouts).
///
/// `path` is the request target (`/v1/limits:check?x=1`); `headers` are added after `Host`
/// and `Connection: close`; a `Content-Length` is added for a non-empty body or a
/// `POST`/`PUT`/`PATCH` unless given. Tests use it to call the daemon's JSON API:
/// `http_request(addr, "POST", "/v1/limits:check", &[("content-type", "application/json")],
/// json.as_bytes())`.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<HttpResponse> {
    http_request_timeout(addr, method, path, headers, body, DEFAULT_TIMEOUT)
}

/// `GET path` with no extra headers.
///
/// For health checks and `/metrics`.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<HttpResponse> {
    http_request(addr, "GET", path, &[], b"")
}

/// [`http_request`] with a caller-chosen timeout for connect, write and each read.
///
/// For polling loops that must not hang on a stuck server.
pub fn http_request_timeout(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<HttpResponse> {
    let what = format!("{method} http://{addr}{path}");
    let inner = || -> Result<HttpResponse> {
        let mut stream = TcpStream::connect_timeout(&addr, timeout).context("connecting")?;
        let t = Some(timeout.max(Duration::from_millis(1)));
        stream
            .set_read_timeout(t)
            .and_then(|()| stream.set_write_timeout(t))
            .context("setting socket timeouts")?;
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        let has_len = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
        let wants_len = !body.is_empty()
            || ["POST", "PUT", "PATCH"]
                .iter()
                .any(|m| m.eq_ignore_ascii_case(method));
        if wants_len && !has_len {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        stream
            .write_all(&bytes)
            .and_then(|()| stream.flush())
            .context("sending the request")?;
        read_response(
            &mut BufReader::new(stream),
            method.eq_ignore_ascii_case("HEAD"),
        )
    };
    inner().with_context(|| what)
}

fn read_line(r: &mut impl BufRead) -> Result<String> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line).context("reading a line")?;
    ensure!(n > 0, "connection closed before the response was complete");
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Reads one response (skipping interim `1xx` responses).
pub(crate) fn read_response(r: &mut impl BufRead, head_request: bool) -> Result<HttpResponse> {
    loop {
        let status_line = read_line(r)?;
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        ensure!(
            version.starts_with("HTTP/"),
            "not an HTTP response: {status_line:?}"
        );
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
        let mut headers = Vec::new();
        loop {
            let line = read_line(r)?;
            if line.is_empty() {
                break;
            }
            let (k, v) = line
                .split_once(':')
                .ok_or_else(|| anyhow!("bad header line {line:?}"))?;
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        if (100..200).contains(&status) {
            continue;
        }
        let mut resp = HttpResponse {
            status,
            headers,
            body: Vec::new(),
        };
        if head_request || status == 204 || status == 304 {
            return Ok(resp);
        }
        let chunked = resp
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            resp.body = read_chunked(r)?;
        } else if let Some(len) = resp.header("content-length") {
            let len: usize = len
                .parse()
                .map_err(|e| anyhow!("bad Content-Length {len:?}: {e}"))?;
            ensure!(len <= MAX_BODY, "response body of {len} bytes is too large");
            resp.body = vec![0; len];
            r.read_exact(&mut resp.body)
                .context("reading the response body")?;
        } else {
            r.take(MAX_BODY as u64 + 1)
                .read_to_end(&mut resp.body)
                .context("reading the response body")?;
            ensure!(resp.body.len() <= MAX_BODY, "response body is too large");
        }
        return Ok(resp);
    }
}

fn read_chunked(r: &mut impl BufRead) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(r)?;
        let size_hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|e| anyhow!("bad chunk size line {line:?}: {e}"))?;
        if size == 0 {
            // Trailers, up to the empty line (tolerate EOF).
            loop {
                match read_line(r) {
                    Ok(l) if !l.is_empty() => {}
                    _ => return Ok(body),
                }
            }
        }
        if body.len() + size > MAX_BODY {
            bail!("chunked response body is too large");
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])
            .context("reading a chunk")?;
        let crlf = read_line(r)?;
        ensure!(crlf.is_empty(), "chunk not followed by CRLF");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn parse(raw: &[u8]) -> Result<HttpResponse> {
        read_response(&mut BufReader::new(raw), false)
    }

    #[test]
    fn content_length_body() -> Result<()> {
        let r = parse(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 5\r\n\r\nhelloEXTRA")?;
        assert_eq!(r.status, 429);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.text(), "hello");
        Ok(())
    }

    #[test]
    fn chunked_body_and_interim_response() -> Result<()> {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n6\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nX-Trailer: y\r\n\r\n";
        let r = parse(raw)?;
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "Wikipedia in \r\n\r\nchunks.");
        Ok(())
    }

    #[test]
    fn eof_framed_body_and_no_body_statuses() -> Result<()> {
        assert_eq!(
            parse(b"HTTP/1.0 200 OK\r\n\r\nuntil eof")?.text(),
            "until eof"
        );
        assert!(parse(b"HTTP/1.1 204 No Content\r\n\r\n")?.body.is_empty());
        assert!(parse(b"garbage\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort").is_err());
        Ok(())
    }

    #[test]
    fn round_trip_against_a_local_server() -> Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let server = std::thread::spawn(move || -> Result<String> {
            let (stream, _) = listener.accept()?;
            let mut reader = BufReader::new(stream.try_clone()?);
            let mut head = String::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line)?;
                if line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let mut body = [0u8; 7];
            reader.read_exact(&mut body)?;
            let mut stream = stream;
            stream.write_all(
                b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            )?;
            Ok(format!("{head}{}", String::from_utf8_lossy(&body)))
        });
        let resp = http_request(
            addr,
            "POST",
            "/v1/limits:check",
            &[("Content-Type", "application/json")],
            b"{\"a\":1}",
        )?;
        assert_eq!(resp.status, 201);
        assert_eq!(resp.text(), "ok");
        let seen = server
            .join()
            .map_err(|_| anyhow!("server thread panicked"))??;
        assert!(
            seen.starts_with("POST /v1/limits:check HTTP/1.1\r\n"),
            "{seen}"
        );
        assert!(seen.contains("Content-Length: 7\r\n"), "{seen}");
        assert!(seen.contains("Connection: close\r\n"), "{seen}");
        assert!(seen.ends_with("{\"a\":1}"), "{seen}");
        Ok(())
    }
}
