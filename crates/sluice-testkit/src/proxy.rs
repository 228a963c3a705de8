//! A loopback TCP forwarder whose links can be cut and restored.
//!
//! Killing a server is not the same failure as losing the network to it: a cut link leaves
//! the server running with its state, and the client must notice and reconnect (e.g. the
//! PostgreSQL `LISTEN` connection of the rule watcher, or a Redis link). Pointing the client
//! at a [`TcpProxy`] instead of the server lets a test provoke exactly that. It can also hold
//! new connections for a while before forwarding them ([`TcpProxy::delay_new_links`]): a slow
//! connection set-up (a far or loaded server, a TLS handshake) on loopback.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

/// How long the proxy waits to connect to its target before dropping the client.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Link {
    client: TcpStream,
    upstream: TcpStream,
}

impl Link {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.upstream.shutdown(Shutdown::Both);
    }
}

#[derive(Debug, Default)]
struct Shared {
    cut: AtomicBool,
    stop: AtomicBool,
    next_id: AtomicU64,
    links: Mutex<HashMap<u64, Link>>,
    accepted: AtomicU64,
    /// How long a new connection waits before it is forwarded, ms.
    link_delay_ms: AtomicU64,
}

impl Shared {
    fn links(&self) -> MutexGuard<'_, HashMap<u64, Link>> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A TCP forwarder on `127.0.0.1:<free port>` to a target address, one pair of threads per
/// connection.
///
/// [`cut`](Self::cut) closes every current connection and closes new ones as soon as they are
/// accepted, until [`restore`](Self::restore). Dropping the proxy stops it and closes all its
/// connections.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpProxy {
    /// Starts forwarding from a free loopback port to `target`.
    ///
    /// Configure the client under test with [`port`](Self::port) instead of the server's port.
    pub fn start(target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .context("binding the TCP proxy on 127.0.0.1:0")?;
        let addr = listener
            .local_addr()
            .context("reading the TCP proxy's address")?;
        let shared = Arc::new(Shared::default());
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("tcp-proxy-{}", addr.port()))
                .spawn(move || accept_loop(&listener, target, &shared))
                .context("spawning the TCP proxy thread")?
        };
        Ok(Self {
            addr,
            target,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The port clients should connect to.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address clients should connect to (`127.0.0.1:port`).
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address connections are forwarded to.
    #[must_use]
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Closes every current connection (both sides see EOF/reset) and closes new connections
    /// right after accepting them, until [`restore`](Self::restore).
    ///
    /// Simulates a network partition between the client and the server.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        let links: Vec<Link> = self.shared.links().drain().map(|(_, l)| l).collect();
        for link in &links {
            link.close();
        }
    }

    /// Forwards new connections again after a [`cut`](Self::cut).
    ///
    /// Ends the partition; clients must reconnect on their own.
    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// Holds every connection accepted from now on for `delay` before connecting it to the
    /// target: the client's connect succeeds at once, but nothing it sends reaches the server,
    /// and no answer comes back, before then. `Duration::ZERO` ends it.
    ///
    /// Simulates a slow connection set-up, to test what a client does before its first answer.
    pub fn delay_new_links(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.link_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Whether the proxy is currently cut.
    #[must_use]
    pub fn is_cut(&self) -> bool {
        self.shared.cut.load(Ordering::SeqCst)
    }

    /// How many forwarded connections are open now.
    ///
    /// Lets a test wait until the client under test has (re)connected.
    #[must_use]
    pub fn open_connections(&self) -> usize {
        self.shared.links().len()
    }

    /// How many connections the proxy has accepted in total (including ones closed by a cut).
    ///
    /// Lets a test see that a client tried to reconnect.
    #[must_use]
    pub fn accepted_connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.cut();
        // Wake the blocking accept() so the thread sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(handle) = self.acceptor.take() {
            let _ = handle.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, target: SocketAddr, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let client = match conn {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                // Transient (EMFILE, ECONNABORTED): back off and keep serving.
                eprintln!("sluice-testkit: TCP proxy accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if shared.cut.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let shared = Arc::clone(shared);
        // Connect in a thread so a slow target does not block other accepts.
        let _ = std::thread::Builder::new()
            .name("tcp-proxy-link".to_owned())
            .spawn(move || open_link(client, target, &shared));
    }
}

fn open_link(client: TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    let delay = shared.link_delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        std::thread::sleep(Duration::from_millis(delay));
    }
    let Ok(upstream) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let clones = (
        client.try_clone(),
        upstream.try_clone(),
        upstream.try_clone(),
        client.try_clone(),
    );
    let (Ok(c_read), Ok(u_write), Ok(u_read), Ok(c_write)) = clones else {
        let _ = client.shutdown(Shutdown::Both);
        let _ = upstream.shutdown(Shutdown::Both);
        return;
    };
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    {
        let mut links = shared.links();
        // A cut may have happened while we were connecting.
        if shared.cut.load(Ordering::SeqCst) || shared.stop.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = upstream.shutdown(Shutdown::Both);
            return;
        }
        links.insert(id, Link { client, upstream });
    }
    let done = Arc::new(AtomicU8::new(0));
    let up = {
        let (shared, done) = (Arc::clone(shared), Arc::clone(&done));
        move || pump(c_read, u_write, id, &shared, &done)
    };
    let down = {
        let (shared, done) = (Arc::clone(shared), Arc::clone(&done));
        move || pump(u_read, c_write, id, &shared, &done)
    };
    if std::thread::Builder::new()
        .name("tcp-proxy-up".to_owned())
        .spawn(up)
        .is_err()
    {
        if let Some(link) = shared.links().remove(&id) {
            link.close();
        }
        return;
    }
    down();
}

/// Copies `from` → `to` until EOF or error, then half-closes `to` (or closes both on error);
/// the second direction to finish forgets the link.
fn pump(mut from: TcpStream, mut to: TcpStream, id: u64, shared: &Shared, done: &AtomicU8) {
    let mut buf = [0u8; 16 * 1024];
    let clean_eof = loop {
        match from.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break false;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
    };
    if clean_eof {
        let _ = to.shutdown(Shutdown::Write);
    } else {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    }
    if done.fetch_add(1, Ordering::SeqCst) == 1
        && let Some(link) = shared.links().remove(&id)
    {
        link.close();
    }
}
