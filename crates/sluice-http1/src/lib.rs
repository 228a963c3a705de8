//! The workspace's one HTTP/1.1 client.
//!
//! The project's tools and tests talk to their own servers (sluiced's JSON API, `/metrics`,
//! the admin API): a few requests per run, or one keep-alive loop measured for its own cost.
//! An HTTP client crate and its runtime would double their builds for that, so this crate is
//! `std` only (rustls behind the `tls` feature) and holds the two pieces every caller shares:
//!
//! - [`parse_head`]: a sans-IO response head parser over a buffer, for callers that run their
//!   own I/O loop (the load generator's async keep-alive client).
//! - [`request`]: a blocking request on a fresh connection (`Connection: close`), the whole
//!   response read, framed by `Content-Length`, `chunked` or EOF.

mod client;
mod head;

pub use client::{Response, Target, request};
pub use head::{Body, Head, MAX_HEAD, headers, parse_head};

/// Why a request or a response failed, with the request it was (`GET http://host/path`).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {kind}")]
pub struct Error {
    /// The request (method and URL), or the URL that did not parse.
    pub what: String,
    /// What went wrong.
    pub kind: ErrorKind,
}

/// What went wrong in a request.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    /// Not an `http://` or `https://` URL this client can reach.
    #[error("{0}")]
    Url(&'static str),
    /// The request cannot be sent as given (a header holding a line break).
    #[error("{0}")]
    Request(&'static str),
    /// The socket failed at `step` (resolving, connecting, sending, reading).
    #[error("{step}: {source}")]
    Io {
        /// What the client was doing.
        step: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The server's answer is not HTTP/1.x this client understands.
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
    /// The TLS setup or handshake failed (or TLS is not built in).
    #[error("TLS: {0}")]
    Tls(String),
}

/// A response that is not HTTP/1.x as this client reads it, or larger than it accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(msg: impl Into<String>) -> ProtocolError {
        ProtocolError(msg.into())
    }
}
