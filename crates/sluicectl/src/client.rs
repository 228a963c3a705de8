//! sluicectl's requests: the workspace's one HTTP/1.1 client (`sluice-http1`, one request per
//! connection, `https://` through rustls trusting `--ca-file` or the system's roots), with the
//! JSON headers every call sends.
//!
//! `sluicectl` makes a handful of requests per run, so a blocking std socket is all it needs;
//! an HTTP client crate would double the build for nothing.

use anyhow::Result;
use std::time::Duration;

/// Where requests go: `http(s)://host:port` plus an optional path prefix.
pub use sluice_http1::Target as Server;

/// A response: status, headers and body.
pub use sluice_http1::Response;

/// Sends one request with sluicectl's headers (`Accept` and `Content-Type` JSON, its
/// `User-Agent`) and reads the whole response.
pub fn request(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Response> {
    let agent = concat!("sluicectl/", env!("CARGO_PKG_VERSION"));
    let body = body.unwrap_or_default();
    let mut all = vec![("Accept", "application/json"), ("User-Agent", agent)];
    if !body.is_empty() || matches!(method, "POST" | "PUT") {
        all.push(("Content-Type", "application/json"));
    }
    all.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
    Ok(sluice_http1::request(
        server, method, path, &all, body, timeout,
    )?)
}

/// What [`encode`] escapes: everything but `A-Z a-z 0-9 - . _ ~ :` (ids stay readable).
const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':');

/// Percent-encodes a path segment or query value (everything but `A-Z a-z 0-9 - . _ ~ :`).
pub fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, COMPONENT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_keeps_ids_readable() {
        assert_eq!(encode("pay-burst:v2"), "pay-burst:v2");
        assert_eq!(encode("POST /v1/x"), "POST%20%2Fv1%2Fx");
        assert_eq!(encode("a,b=c"), "a%2Cb%3Dc");
        assert_eq!(encode("café 100%"), "caf%C3%A9%20100%25");
    }
}
