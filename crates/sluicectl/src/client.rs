//! A small blocking HTTP/1.1 client: one request per connection, JSON in and out.
//!
//! `sluicectl` makes a handful of requests per run, so a std `TcpStream` is all it needs;
//! an HTTP client crate would double the build for nothing. `https://` goes through rustls
//! (the ring provider the daemon uses too), trusting `--ca-file` or the system's roots.

use anyhow::{Context, Result, anyhow, bail, ensure};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Largest response body read.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Where requests go: `http(s)://host:port` plus an optional path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// `https://`: TLS, verified against `ca_file` or the system's roots.
    pub tls: bool,
    /// PEM CA certificates for `https://` (`--ca-file`).
    pub ca_file: Option<std::path::PathBuf>,
    /// `host:port` to connect to (and send as `Host`).
    pub authority: String,
    /// Prefix prepended to every path (no trailing slash), e.g. behind a proxy.
    pub prefix: String,
}

impl Server {
    /// Parses `http(s)://host[:port][/prefix]`; a bare `host:port` is taken as `http://`.
    pub fn parse(url: &str) -> Result<Server> {
        let tls = url.starts_with("https://");
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if let Some(r) = url.strip_prefix("https://") {
            r
        } else if url.contains("://") {
            bail!("{url}: expected an http:// or https:// URL");
        } else {
            url
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        ensure!(!authority.is_empty(), "{url}: no host");
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !authority.ends_with(']')
        {
            authority.to_string()
        } else {
            format!("{authority}:{}", if tls { 443 } else { 80 })
        };
        Ok(Server {
            tls,
            ca_file: None,
            authority,
            prefix: path.trim_end_matches('/').to_string(),
        })
    }
}

/// A response: status and body.
#[derive(Debug)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

/// Sends one request and reads the whole response.
pub fn request(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Response> {
    let target = format!("{}{path}", server.prefix);
    let scheme = if server.tls { "https" } else { "http" };
    let what = format!("{method} {scheme}://{}{target}", server.authority);
    let inner = || -> Result<Response> {
        let addrs: Vec<_> = server
            .authority
            .to_socket_addrs()
            .with_context(|| format!("resolving {}", server.authority))?
            .collect();
        let mut last = None;
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (stream, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(anyhow!(e).context("connecting")),
            (None, None) => bail!("{} resolves to no address", server.authority),
        };
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut stream: Box<dyn Conn> = if server.tls {
            Box::new(tls_stream(server, stream)?)
        } else {
            Box::new(stream)
        };
        let mut head = format!(
            "{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\nUser-Agent: sluicectl/{}\r\n",
            server.authority,
            env!("CARGO_PKG_VERSION")
        );
        for (k, v) in headers {
            ensure!(!v.contains(['\r', '\n']), "header {k} holds a line break");
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        let body = body.unwrap_or_default();
        if !body.is_empty() || matches!(method, "POST" | "PUT") {
            head.push_str("Content-Type: application/json\r\n");
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body);
        stream.write_all(&bytes).context("sending the request")?;
        read_response(&mut BufReader::new(stream))
    };
    inner().with_context(|| what)
}

/// A connection, plain or TLS.
trait Conn: Read + Write {}
impl<T: Read + Write> Conn for T {}

/// The TLS client side on `tcp`, verifying the server's name in `server.authority`.
fn tls_stream(
    server: &Server,
    tcp: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    match &server.ca_file {
        Some(path) => {
            for c in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("reading {}", path.display()))?
            {
                roots.add(c.with_context(|| format!("reading {}", path.display()))?)?;
            }
        }
        None => {
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c);
            }
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = server
        .authority
        .rsplit_once(':')
        .map_or(server.authority.as_str(), |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .with_context(|| format!("{host}: not a TLS server name"))?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name)?;
    Ok(rustls::StreamOwned::new(conn, tcp))
}

fn line(r: &mut impl BufRead) -> Result<String> {
    let mut buf = Vec::new();
    let n = r
        .read_until(b'\n', &mut buf)
        .context("reading the response")?;
    ensure!(n > 0, "the server closed the connection before answering");
    while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        buf.pop();
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn read_response(r: &mut impl BufRead) -> Result<Response> {
    loop {
        let status_line = line(r)?;
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .filter(|_| status_line.starts_with("HTTP/"))
            .ok_or_else(|| anyhow!("not an HTTP response: {status_line:?}"))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            let h = line(r)?;
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "content-length" {
                    length = Some(v.parse::<usize>().context("bad Content-Length")?);
                } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                    chunked = true;
                }
            }
        }
        if (100..200).contains(&status) {
            continue;
        }
        let mut body = Vec::new();
        if status == 204 || status == 304 {
        } else if chunked {
            loop {
                let size_line = line(r)?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .context("bad chunk size")?;
                if size == 0 {
                    break;
                }
                ensure!(body.len() + size <= MAX_BODY, "response too large");
                let start = body.len();
                body.resize(start + size, 0);
                r.read_exact(&mut body[start..])
                    .context("reading a chunk")?;
                line(r)?;
            }
        } else if let Some(n) = length {
            ensure!(n <= MAX_BODY, "response too large");
            body.resize(n, 0);
            r.read_exact(&mut body).context("reading the body")?;
        } else {
            r.take(MAX_BODY as u64).read_to_end(&mut body)?;
        }
        return Ok(Response { status, body });
    }
}

/// Percent-encodes a path segment or query value (everything but `A-Z a-z 0-9 - . _ ~ :`).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
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

    #[test]
    fn servers_parse() {
        let s = Server::parse("http://127.0.0.1:8082").expect("ok");
        assert_eq!(s.authority, "127.0.0.1:8082");
        assert_eq!(s.prefix, "");
        let s = Server::parse("http://admin.internal/sluice/").expect("ok");
        assert_eq!(s.authority, "admin.internal:80");
        assert_eq!(s.prefix, "/sluice");
        assert_eq!(
            Server::parse("localhost:9").expect("ok").authority,
            "localhost:9"
        );
        let s = Server::parse("https://admin.internal").expect("ok");
        assert_eq!((s.authority.as_str(), s.tls), ("admin.internal:443", true));
        assert!(!Server::parse("http://x").expect("ok").tls);
        assert!(Server::parse("ftp://x").is_err());
    }

    #[test]
    fn responses_parse() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n3\r\n\":1\r\n1\r\n}\r\n0\r\n\r\n";
        let r = read_response(&mut BufReader::new(&raw[..])).expect("ok");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"{\"a\":1}"[..]));
        let raw = b"HTTP/1.1 422 Unprocessable\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(
            read_response(&mut BufReader::new(&raw[..]))
                .expect("ok")
                .status,
            422
        );
        assert!(read_response(&mut BufReader::new(&b"nonsense\r\n\r\n"[..])).is_err());
    }

    #[test]
    fn encoding_keeps_ids_readable() {
        assert_eq!(encode("pay-burst:v2"), "pay-burst:v2");
        assert_eq!(encode("POST /v1/x"), "POST%20%2Fv1%2Fx");
        assert_eq!(encode("a,b=c"), "a%2Cb%3Dc");
    }
}
