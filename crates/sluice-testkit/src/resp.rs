//! A tiny blocking RESP2 client, for test assertions only.
//!
//! Tests need to look inside Redis (`GET`, `CLUSTER KEYSLOT`, `TTL`, …) without pulling a Redis
//! client crate into every test, and need precise control over timeouts (a paused server must
//! make a `PING` time out). This speaks just enough RESP2 over a [`std::net::TcpStream`]: a
//! command is sent as an array of bulk strings and one reply is parsed.
//!
//! # String format of replies
//!
//! [`RespConn::cmd`] and [`RedisServer::cmd`](crate::RedisServer::cmd) flatten a reply into a
//! `String` (see [`Reply::flatten`]):
//!
//! | reply              | string                                        |
//! |--------------------|-----------------------------------------------|
//! | simple string      | its text, e.g. `OK`, `PONG`                   |
//! | error (top level)  | returned as `Err`, message `redis error: …`   |
//! | error (in array)   | `(error) <message>`                           |
//! | integer            | decimal, e.g. `42`, `-2`                      |
//! | bulk string        | its bytes, lossy UTF-8                        |
//! | nil (bulk / array) | `(nil)`                                       |
//! | array              | elements flattened and joined with `\n`; an empty array is `""` |
//!
//! Use [`RespConn::cmd_reply`] for the structured [`Reply`] (binary keys, nested arrays).

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

/// Largest bulk string or array we accept, to fail fast on a corrupt stream.
const MAX_LEN: usize = 512 * 1024 * 1024;

/// One parsed RESP2 reply.
///
/// Kept structured so callers can tell a nil from an empty string, and keep binary keys intact
/// (e.g. keys returned by `CLUSTER GETKEYSINSLOT` fed back into `MIGRATE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A simple string (`+OK`).
    Status(String),
    /// An error reply (`-ERR …`), with the message without the leading `-`.
    Error(String),
    /// An integer (`:42`).
    Integer(i64),
    /// A bulk string (`$3\r\nfoo`).
    Bulk(Vec<u8>),
    /// A nil bulk string or nil array (`$-1`, `*-1`).
    Nil,
    /// An array of replies.
    Array(Vec<Reply>),
}

impl Reply {
    /// The reply as one string, in the format documented at the [module level](self).
    ///
    /// Lets assertions compare against a literal (`"OK"`, `"(nil)"`, `"a\nb"`).
    #[must_use]
    pub fn flatten(&self) -> String {
        match self {
            Reply::Status(s) => s.clone(),
            Reply::Error(e) => format!("(error) {e}"),
            Reply::Integer(n) => n.to_string(),
            Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Reply::Nil => "(nil)".to_owned(),
            Reply::Array(items) => items
                .iter()
                .map(Reply::flatten)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// The elements of an array reply as raw bytes (bulk or status strings), for replies that
    /// are lists of keys or names; an error for any other shape.
    pub fn into_bytes_list(self) -> Result<Vec<Vec<u8>>> {
        match self {
            Reply::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    Reply::Bulk(b) => Ok(b),
                    Reply::Status(s) => Ok(s.into_bytes()),
                    other => Err(anyhow!("expected a string in the array, got {other:?}")),
                })
                .collect(),
            Reply::Nil => Ok(Vec::new()),
            other => Err(anyhow!("expected an array reply, got {other:?}")),
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.flatten())
    }
}

/// One blocking RESP2 connection.
///
/// A persistent link, for tests that need to watch one connection break (e.g. through a cut
/// [`TcpProxy`](crate::TcpProxy)) or that send many commands.
#[derive(Debug)]
pub struct RespConn {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl RespConn {
    /// Connects to `addr`, with `timeout` for the connect and then for every read and write.
    ///
    /// The timeout is what makes a stopped (SIGSTOPped) or unreachable server observable: the
    /// call errors instead of hanging the test.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connecting to redis at {addr}"))?;
        stream
            .set_nodelay(true)
            .with_context(|| format!("setting TCP_NODELAY on {addr}"))?;
        let writer = stream
            .try_clone()
            .with_context(|| format!("cloning the socket to {addr}"))?;
        let conn = Self {
            addr,
            reader: BufReader::new(stream),
            writer,
        };
        conn.set_timeout(timeout)?;
        Ok(conn)
    }

    /// Changes the read and write timeout of this connection.
    ///
    /// For a test that connects with a generous timeout, then probes with a short one.
    pub fn set_timeout(&self, timeout: Duration) -> Result<()> {
        let t = Some(timeout.max(Duration::from_millis(1)));
        self.writer
            .set_read_timeout(t)
            .and_then(|()| self.writer.set_write_timeout(t))
            .with_context(|| format!("setting timeouts on the connection to {}", self.addr))
    }

    /// The server address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends one command and returns the flattened reply; an error reply is an `Err`.
    ///
    /// The common case in tests: `conn.cmd(&["GET", "k"])? == "v"`. See the
    /// [module docs](self) for the string format.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<String> {
        match self.cmd_reply(args)? {
            Reply::Error(e) => Err(anyhow!(
                "redis error from {} for {}: {e}",
                self.addr,
                command_name(args)
            )),
            reply => Ok(reply.flatten()),
        }
    }

    /// Sends one command and returns the structured reply, error replies included as
    /// [`Reply::Error`] (only I/O and protocol failures are an `Err`).
    ///
    /// For tests that assert on an error (`MOVED`, `ASK`, `NOSCRIPT`) or need binary data.
    pub fn cmd_reply<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<Reply> {
        if args.is_empty() {
            bail!("empty redis command");
        }
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            let arg = arg.as_ref();
            buf.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            buf.extend_from_slice(arg);
            buf.extend_from_slice(b"\r\n");
        }
        let name = command_name(args);
        self.writer
            .write_all(&buf)
            .and_then(|()| self.writer.flush())
            .with_context(|| format!("sending {name} to redis at {}", self.addr))?;
        read_reply(&mut self.reader)
            .with_context(|| format!("reading the reply to {name} from redis at {}", self.addr))
    }
}

/// Sends one command on a fresh connection and returns the flattened reply.
///
/// The one-shot form of [`RespConn::cmd`], with `timeout` for connect, write and read.
pub fn cmd_once<A: AsRef<[u8]>>(addr: SocketAddr, args: &[A], timeout: Duration) -> Result<String> {
    RespConn::connect(addr, timeout)?.cmd(args)
}

fn command_name<A: AsRef<[u8]>>(args: &[A]) -> String {
    args.first()
        .map(|a| String::from_utf8_lossy(a.as_ref()).to_uppercase())
        .unwrap_or_default()
}

fn read_line(r: &mut impl BufRead) -> Result<String> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 {
        bail!("connection closed by the server");
    }
    if !line.ends_with(b"\r\n") {
        bail!(
            "malformed RESP line (no CRLF): {:?}",
            String::from_utf8_lossy(&line)
        );
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|e| anyhow!("non-UTF-8 RESP header line: {e}"))
}

fn parse_len(s: &str) -> Result<Option<usize>> {
    let n: i64 = s
        .parse()
        .map_err(|e| anyhow!("bad RESP length {s:?}: {e}"))?;
    if n < 0 {
        return Ok(None);
    }
    let n = usize::try_from(n).map_err(|e| anyhow!("bad RESP length {s:?}: {e}"))?;
    if n > MAX_LEN {
        bail!("RESP length {n} is too large");
    }
    Ok(Some(n))
}

/// Reads one RESP2 reply.
pub(crate) fn read_reply(r: &mut impl BufRead) -> Result<Reply> {
    let line = read_line(r)?;
    let (kind, rest) = line.split_at(line.chars().next().map_or(0, char::len_utf8));
    match kind {
        "+" => Ok(Reply::Status(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => rest
            .parse()
            .map(Reply::Integer)
            .map_err(|e| anyhow!("bad RESP integer {rest:?}: {e}")),
        "$" => match parse_len(rest)? {
            None => Ok(Reply::Nil),
            Some(n) => {
                let mut data = vec![0; n + 2];
                r.read_exact(&mut data)?;
                if !data.ends_with(b"\r\n") {
                    bail!("bulk string of {n} bytes not followed by CRLF");
                }
                data.truncate(n);
                Ok(Reply::Bulk(data))
            }
        },
        "*" => match parse_len(rest)? {
            None => Ok(Reply::Nil),
            Some(n) => {
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(read_reply(r)?);
                }
                Ok(Reply::Array(items))
            }
        },
        _ => bail!("unexpected RESP reply line {line:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Reply> {
        read_reply(&mut BufReader::new(bytes))
    }

    #[test]
    fn parses_every_reply_kind() -> Result<()> {
        assert_eq!(parse(b"+PONG\r\n")?, Reply::Status("PONG".into()));
        assert_eq!(parse(b"-ERR nope\r\n")?, Reply::Error("ERR nope".into()));
        assert_eq!(parse(b":-7\r\n")?, Reply::Integer(-7));
        assert_eq!(parse(b"$3\r\nfoo\r\n")?, Reply::Bulk(b"foo".to_vec()));
        assert_eq!(parse(b"$0\r\n\r\n")?, Reply::Bulk(Vec::new()));
        assert_eq!(parse(b"$-1\r\n")?, Reply::Nil);
        assert_eq!(parse(b"*-1\r\n")?, Reply::Nil);
        let arr = parse(b"*3\r\n$1\r\na\r\n:2\r\n*2\r\n+x\r\n$-1\r\n")?;
        assert_eq!(arr.flatten(), "a\n2\nx\n(nil)");
        assert_eq!(parse(b"*0\r\n")?.flatten(), "");
        Ok(())
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse(b"?what\r\n").is_err());
        assert!(parse(b"+no crlf").is_err());
        assert!(parse(b"$5\r\nab\r\n").is_err());
        assert!(parse(b"").is_err());
    }
}
