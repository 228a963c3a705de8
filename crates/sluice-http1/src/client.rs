//! A blocking client: one request per connection (`Connection: close`), the whole response read.

use std::io::{BufRead, BufReader, Cursor, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use crate::head::{Body, headers, parse_head};
use crate::{Error, ErrorKind, ProtocolError};

/// Largest response body read, to fail fast on a runaway stream.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Where requests go: `http(s)://host:port` plus an optional path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `https://`: TLS, verified against `ca_file` or the system's roots (`tls` feature).
    pub tls: bool,
    /// PEM CA certificates for `https://`; `None` trusts the system's roots.
    pub ca_file: Option<PathBuf>,
    /// `host:port` to connect to (and send as `Host`).
    pub authority: String,
    /// Prefix prepended to every path (no trailing slash), e.g. behind a proxy.
    pub prefix: String,
}

impl Target {
    /// Parses `http(s)://host[:port][/prefix]`; a bare `host:port` is taken as `http://`.
    pub fn parse(url: &str) -> Result<Target, Error> {
        let bad = |why| Error {
            what: url.to_string(),
            kind: ErrorKind::Url(why),
        };
        let tls = url.starts_with("https://");
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if let Some(r) = url.strip_prefix("https://") {
            r
        } else if url.contains("://") {
            return Err(bad("expected an http:// or https:// URL"));
        } else {
            url
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !authority.ends_with(']')
        {
            authority.to_string()
        } else {
            format!("{authority}:{}", if tls { 443 } else { 80 })
        };
        Ok(Target {
            tls,
            ca_file: None,
            authority,
            prefix: path.trim_end_matches('/').to_string(),
        })
    }

    /// Plain `http://` to `addr`, no prefix: a test's daemon on a loopback port.
    pub fn plain(addr: SocketAddr) -> Target {
        Target {
            tls: false,
            ca_file: None,
            authority: addr.to_string(),
            prefix: String::new(),
        }
    }

    /// The host part of the authority, without port or IPv6 brackets (the TLS server name).
    pub fn host(&self) -> &str {
        self.authority
            .rsplit_once(':')
            .map_or(self.authority.as_str(), |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']')
    }
}

/// A parsed response.
///
/// Headers keep their order and original case; look them up case-insensitively with
/// [`header`](Self::header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code, e.g. 200 or 429.
    pub status: u16,
    /// The headers in order, names as sent by the server.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (case-insensitive), e.g. `Retry-After`.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8), for JSON and error messages.
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request to `target` and reads the whole response.
///
/// `path` is the request target after the prefix (`/v1/limits:check?x=1`); `headers` follow
/// `Host` and `Connection: close`; a `Content-Length` is added for a non-empty body or a
/// `POST`/`PUT`/`PATCH` unless given. `timeout` bounds the connect, the write and each read.
pub fn request(
    target: &Target,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, Error> {
    let scheme = if target.tls { "https" } else { "http" };
    let path = format!("{}{path}", target.prefix);
    send(target, method, &path, headers, body, timeout).map_err(|kind| Error {
        what: format!("{method} {scheme}://{}{path}", target.authority),
        kind,
    })
}

fn io(step: &'static str) -> impl FnOnce(std::io::Error) -> ErrorKind {
    move |source| ErrorKind::Io { step, source }
}

fn send(
    target: &Target,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, ErrorKind> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        target.authority
    );
    for (k, v) in headers {
        if k.contains(['\r', '\n', ':']) || v.contains(['\r', '\n']) {
            return Err(ErrorKind::Request("a header holds a line break"));
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let has_len = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    let wants_len = !body.is_empty()
        || ["POST", "PUT", "PATCH"]
            .iter()
            .any(|m| m.eq_ignore_ascii_case(method));
    if wants_len && !has_len {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);

    let tcp = connect(&target.authority, timeout)?;
    let t = Some(timeout.max(Duration::from_millis(1)));
    tcp.set_read_timeout(t)
        .and_then(|()| tcp.set_write_timeout(t))
        .map_err(io("setting socket timeouts"))?;
    let head_request = method.eq_ignore_ascii_case("HEAD");
    if target.tls {
        let mut stream = tls::wrap(target, tcp)?;
        exchange(&mut stream, &bytes, head_request)
    } else {
        let mut stream = tcp;
        exchange(&mut stream, &bytes, head_request)
    }
}

/// Connects to the first address of `authority` that answers.
fn connect(authority: &str, timeout: Duration) -> Result<TcpStream, ErrorKind> {
    let mut last = None;
    for a in authority.to_socket_addrs().map_err(io("resolving"))? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => io("connecting")(e),
        None => ErrorKind::Url("the host resolves to no address"),
    })
}

fn exchange(
    stream: &mut (impl Read + Write),
    request: &[u8],
    head_request: bool,
) -> Result<Response, ErrorKind> {
    stream
        .write_all(request)
        .and_then(|()| stream.flush())
        .map_err(io("sending the request"))?;
    read_response(stream, head_request)
}

/// Reads one response (skipping interim `1xx` responses).
pub(crate) fn read_response(r: &mut impl Read, head_request: bool) -> Result<Response, ErrorKind> {
    let mut buf = Vec::with_capacity(8192);
    loop {
        let head = loop {
            if let Some(h) = parse_head(&buf)? {
                break h;
            }
            if fill(r, &mut buf)? == 0 {
                return Err(ProtocolError::new(
                    "connection closed before the response was complete",
                )
                .into());
            }
        };
        if (100..200).contains(&head.status) {
            buf.drain(..head.head_len);
            continue;
        }
        let names = headers(&buf[..head.head_len])
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        buf.drain(..head.head_len);
        let body = if head_request {
            Vec::new()
        } else {
            match head.body {
                Body::Length(n) => {
                    if n > MAX_BODY {
                        return Err(too_large());
                    }
                    while buf.len() < n {
                        if fill(r, &mut buf)? == 0 {
                            return Err(ProtocolError::new(
                                "connection closed inside the response body",
                            )
                            .into());
                        }
                    }
                    buf.truncate(n);
                    buf
                }
                Body::Chunked => read_chunked(&mut BufReader::new(Cursor::new(buf).chain(r)))?,
                Body::UntilClose => {
                    let mut body = Vec::new();
                    Cursor::new(buf)
                        .chain(r)
                        .take(MAX_BODY as u64 + 1)
                        .read_to_end(&mut body)
                        .map_err(io("reading the response body"))?;
                    if body.len() > MAX_BODY {
                        return Err(too_large());
                    }
                    body
                }
            }
        };
        return Ok(Response {
            status: head.status,
            headers: names,
            body,
        });
    }
}

fn too_large() -> ErrorKind {
    ProtocolError::new(format!("response body over {MAX_BODY} bytes")).into()
}

/// Reads more of the response into `buf`; 0 at EOF.
fn fill(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<usize, ErrorKind> {
    let start = buf.len();
    buf.resize(start + 8192, 0);
    let n = r.read(&mut buf[start..]);
    buf.truncate(start + *n.as_ref().unwrap_or(&0));
    n.map_err(io("reading the response"))
}

fn read_line(r: &mut impl BufRead) -> Result<String, ErrorKind> {
    let mut line = Vec::new();
    let n = r
        .read_until(b'\n', &mut line)
        .map_err(io("reading the response body"))?;
    if n == 0 {
        return Err(ProtocolError::new("connection closed inside a chunked body").into());
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn read_chunked(r: &mut impl BufRead) -> Result<Vec<u8>, ErrorKind> {
    let mut body = Vec::new();
    loop {
        let line = read_line(r)?;
        let size_hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| ProtocolError::new(format!("bad chunk size line {line:?}")))?;
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
            return Err(too_large());
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])
            .map_err(io("reading a chunk"))?;
        if !read_line(r)?.is_empty() {
            return Err(ProtocolError::new("chunk not followed by CRLF").into());
        }
    }
}

#[cfg(feature = "tls")]
mod tls {
    use super::{ErrorKind, Target, TcpStream};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use std::sync::Arc;

    /// The TLS client side on `tcp`, verifying the server's name in `target.authority`
    /// against `target.ca_file` or the system's roots (the ring provider the daemon uses too).
    pub(super) fn wrap(
        target: &Target,
        tcp: TcpStream,
    ) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, ErrorKind> {
        let tls = |e: &dyn std::fmt::Display| ErrorKind::Tls(e.to_string());
        let mut roots = rustls::RootCertStore::empty();
        match &target.ca_file {
            Some(path) => {
                let read = |e: &dyn std::fmt::Display| {
                    ErrorKind::Tls(format!("reading {}: {e}", path.display()))
                };
                for c in CertificateDer::pem_file_iter(path).map_err(|e| read(&e))? {
                    roots.add(c.map_err(|e| read(&e))?).map_err(|e| read(&e))?;
                }
            }
            None => {
                for c in rustls_native_certs::load_native_certs().certs {
                    // One unusable system certificate does not stop the others.
                    let _ = roots.add(c);
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls(&e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let host = target.host();
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| ErrorKind::Tls(format!("{host}: not a TLS server name")))?;
        let conn = rustls::ClientConnection::new(Arc::new(cfg), name).map_err(|e| tls(&e))?;
        Ok(rustls::StreamOwned::new(conn, tcp))
    }
}

#[cfg(not(feature = "tls"))]
mod tls {
    use super::{ErrorKind, Target, TcpStream};

    /// Without the `tls` feature an `https://` target is refused.
    pub(super) fn wrap(_: &Target, _: TcpStream) -> Result<TcpStream, ErrorKind> {
        Err(ErrorKind::Tls(
            "this build has no TLS client (sluice-http1's `tls` feature)".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn parse(raw: &[u8]) -> Result<Response, ErrorKind> {
        read_response(&mut &raw[..], false)
    }

    #[test]
    fn targets_parse() {
        let s = Target::parse("http://127.0.0.1:8082").expect("ok");
        assert_eq!(
            (s.authority.as_str(), s.prefix.as_str()),
            ("127.0.0.1:8082", "")
        );
        let s = Target::parse("http://admin.internal/sluice/").expect("ok");
        assert_eq!(
            (s.authority.as_str(), s.prefix.as_str()),
            ("admin.internal:80", "/sluice")
        );
        assert_eq!(
            Target::parse("localhost:9").expect("ok").authority,
            "localhost:9"
        );
        let s = Target::parse("https://admin.internal").expect("ok");
        assert_eq!((s.authority.as_str(), s.tls), ("admin.internal:443", true));
        assert_eq!(Target::parse("https://[::1]").expect("ok").host(), "::1");
        assert!(!Target::parse("http://x").expect("ok").tls);
        assert!(Target::parse("ftp://x").is_err());
        assert!(Target::parse("http:///x").is_err());
    }

    #[test]
    fn content_length_body() {
        let r = parse(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 5\r\n\r\nhelloEXTRA")
            .expect("ok");
        assert_eq!(r.status, 429);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.text(), "hello");
    }

    #[test]
    fn chunked_body_and_interim_response() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n6\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nX-Trailer: y\r\n\r\n";
        let r = parse(raw).expect("ok");
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "Wikipedia in \r\n\r\nchunks.");
    }

    #[test]
    fn eof_framed_body_and_no_body_statuses() {
        let r = parse(b"HTTP/1.0 200 OK\r\n\r\nuntil eof").expect("ok");
        assert_eq!(r.text(), "until eof");
        assert!(
            parse(b"HTTP/1.1 204 No Content\r\n\r\n")
                .expect("ok")
                .body
                .is_empty()
        );
        let head = read_response(
            &mut &b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"[..],
            true,
        );
        assert!(head.expect("ok").body.is_empty());
        assert!(parse(b"garbage\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab").is_err());
    }

    /// The socket tests one at a time: the refused-connection test frees a port the kernel
    /// may hand to the other's listener at once (CI saw it connect to that server).
    static SOCKETS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn round_trip_against_a_local_server() {
        let _one = SOCKETS.lock().unwrap_or_else(|p| p.into_inner());
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || -> std::io::Result<String> {
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
        let resp = request(
            &Target::plain(addr),
            "POST",
            "/v1/limits:check",
            &[("Content-Type", "application/json")],
            b"{\"a\":1}",
            Duration::from_secs(10),
        )
        .expect("a response");
        assert_eq!((resp.status, resp.text().as_str()), (201, "ok"));
        let seen = server.join().expect("server thread").expect("server io");
        assert!(
            seen.starts_with("POST /v1/limits:check HTTP/1.1\r\n"),
            "{seen}"
        );
        assert!(seen.contains(&format!("Host: {addr}\r\n")), "{seen}");
        assert!(seen.contains("Content-Length: 7\r\n"), "{seen}");
        assert!(seen.contains("Connection: close\r\n"), "{seen}");
        assert!(seen.ends_with("{\"a\":1}"), "{seen}");
    }

    #[test]
    fn errors_name_the_request_and_line_breaks_are_refused() {
        let _one = SOCKETS.lock().unwrap_or_else(|p| p.into_inner());
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let e = request(
            &Target::plain(addr),
            "GET",
            "/healthz",
            &[],
            b"",
            Duration::from_secs(5),
        )
        .expect_err("nothing listens");
        assert!(
            e.to_string()
                .starts_with(&format!("GET http://{addr}/healthz: connecting")),
            "{e}"
        );
        let e = request(
            &Target::plain(addr),
            "GET",
            "/",
            &[("X-A", "b\r\nX-Injected: 1")],
            b"",
            Duration::from_secs(5),
        )
        .expect_err("refused before connecting");
        assert!(matches!(e.kind, ErrorKind::Request(_)), "{e}");
    }
}
