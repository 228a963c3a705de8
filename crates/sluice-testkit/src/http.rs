//! Blocking HTTP/1.1 calls to the daemons' JSON and admin APIs and `/metrics`, on the
//! workspace's one client (`sluice-http1`): no HTTP client crate or async runtime in every test.
//! One request per connection (`Connection: close`); responses framed by `Content-Length`,
//! `chunked` encoding, or EOF.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use sluice_http1::Target;

/// A parsed HTTP response: status, headers (look them up with `header`), body.
pub use sluice_http1::Response as HttpResponse;

/// Default timeout for connect, write and each read.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

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
    Ok(sluice_http1::request(
        &Target::plain(addr),
        method,
        path,
        headers,
        body,
        timeout,
    )?)
}
