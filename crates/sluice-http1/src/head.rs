//! Response heads, parsed from a buffer without I/O.

use crate::ProtocolError;

/// Largest response head accepted, to fail fast on something that is not HTTP.
pub const MAX_HEAD: usize = 64 * 1024;

/// How a response's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// `Content-Length` bytes (0 for `1xx`, `204` and `304`, which have no body).
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Neither: the body runs until the server closes the connection.
    UntilClose,
}

/// A response's status line and framing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Status code.
    pub status: u16,
    /// Bytes of the head, through the blank line.
    pub head_len: usize,
    /// How the body that follows is framed.
    pub body: Body,
    /// The server closes the connection after this response (`Connection: close`, or
    /// `HTTP/1.0`, or a body framed by the close).
    pub close: bool,
}

/// Parses the response head at the start of `buf`; `Ok(None)` while it is incomplete.
///
/// Callers with their own I/O loop read until this returns a head, then take
/// `head_len + n` bytes for a [`Body::Length`] body.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, ProtocolError> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            return Err(ProtocolError::new(format!(
                "response head over {MAX_HEAD} bytes"
            )));
        }
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[..end])
        .map_err(|_| ProtocolError::new("response head is not UTF-8"))?;
    let (status_line, rest) = text.split_once("\r\n").unwrap_or((text, ""));
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(ProtocolError::new(format!(
            "not an HTTP/1.x response: {status_line:?}"
        )));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ProtocolError::new(format!("bad status line {status_line:?}")))?;
    let mut length = None;
    let mut chunked = false;
    let mut close = version == "HTTP/1.0";
    for (name, value) in header_lines(rest) {
        let (name, value) = (name?, value);
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| ProtocolError::new(format!("bad Content-Length {value:?}")))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    let body = if (100..200).contains(&status) || status == 204 || status == 304 {
        Body::Length(0)
    } else if chunked {
        Body::Chunked
    } else if let Some(n) = length {
        Body::Length(n)
    } else {
        close = true;
        Body::UntilClose
    };
    Ok(Some(Head {
        status,
        head_len: end + 4,
        body,
        close,
    }))
}

/// The header lines of `text` (after the status line): `Err` for a line without a colon.
fn header_lines(text: &str) -> impl Iterator<Item = (Result<&str, ProtocolError>, &str)> {
    text.split("\r\n")
        .filter(|l| !l.is_empty())
        .map(|line| match line.split_once(':') {
            Some((k, v)) => (Ok(k.trim()), v.trim()),
            None => (
                Err(ProtocolError::new(format!("bad header line {line:?}"))),
                "",
            ),
        })
}

/// The headers of a head [`parse_head`] accepted (`head` is `&buf[..head_len]`), in order,
/// names as sent: for callers that look at more than the framing.
pub fn headers(head: &[u8]) -> impl Iterator<Item = (&str, &str)> {
    let text = std::str::from_utf8(head).unwrap_or_default();
    let rest = text.split_once("\r\n").map_or("", |(_, r)| r);
    header_lines(rest).filter_map(|(k, v)| k.ok().map(|k| (k, v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_incrementally() {
        let full =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(parse_head(&full[..20]), Ok(None));
        let h = parse_head(full).expect("ok").expect("complete");
        assert_eq!((h.status, h.body, h.close), (200, Body::Length(5), false));
        assert_eq!(&full[h.head_len..], b"hello");
        let names: Vec<_> = headers(&full[..h.head_len]).collect();
        assert_eq!(
            names,
            [
                ("content-type", "application/json"),
                ("Content-Length", "5")
            ]
        );
        let h =
            parse_head(b"HTTP/1.1 429 Too Many\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                .expect("ok")
                .expect("complete");
        assert_eq!((h.status, h.body, h.close), (429, Body::Length(0), true));
    }

    #[test]
    fn framing_follows_the_status_and_headers() {
        let body = |raw: &[u8]| parse_head(raw).expect("ok").expect("complete").body;
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"),
            Body::Chunked
        );
        assert_eq!(body(b"HTTP/1.1 204 No Content\r\n\r\n"), Body::Length(0));
        assert_eq!(body(b"HTTP/1.1 100 Continue\r\n\r\n"), Body::Length(0));
        let h = parse_head(b"HTTP/1.0 200 OK\r\n\r\n")
            .expect("ok")
            .expect("complete");
        assert_eq!((h.body, h.close), (Body::UntilClose, true));
    }

    #[test]
    fn garbage_is_refused() {
        assert!(parse_head(b"SSH-2.0\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/2 200\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 abc\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(parse_head(&vec![b'a'; MAX_HEAD + 1]).is_err());
    }
}
