//! The daemon's one gossip port, and how chitchat's messages get framed on it.
//!
//! Every datagram on the gossip port is a frame ([`crate::wire`]): the cluster id and, with a
//! shared key, an HMAC tag. chitchat authenticates nothing itself, and 0.13 keeps its message
//! encoding crate-private, so a transport cannot frame chitchat's bytes directly. Instead
//! chitchat runs on its own UDP transport bound to a private loopback port, and talks to the
//! world only through *relays*:
//!
//! ```text
//!   chitchat ──send(peer)──▶ relay[peer] (127.0.0.1:eph) ──frame+tag──▶ gossip port ──▶ peer
//!   peer ──▶ gossip port ──check frame──▶ relay[peer] ──raw──▶ chitchat (from = relay[peer])
//! ```
//!
//! [`FramedTransport`] wraps chitchat's socket so that a send to `peer` goes to `peer`'s relay
//! and a message from a relay is reported as coming from its `peer`. chitchat never sees an
//! unchecked byte from the network, and its replies are framed like everything else. Relays
//! are created for peers chitchat talks to and for senders of *valid* frames, up to a bound
//! ([`MAX_RELAYS`]); what exceeds it is dropped and counted.
//!
//! The reader of the gossip port ([`Relays::run`]) also receives counts frames: their
//! payloads are queued (bounded: when the queue is full the datagram is dropped and counted,
//! so merging never stalls membership) for the node's receiver task. Nothing received can
//! stop it: only a broken socket does.
//!
//! Processes on the daemon's own host are trusted: the loopback ports are not authenticated.

use crate::metrics::GossipMetrics;
use crate::wire::{FrameCodec, Kind, MAX_DATAGRAM, Reject};
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpTransport};
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Most peers with a relay (a relay is a loopback socket and a task).
pub const MAX_RELAYS: usize = 4096;

/// A received counts payload and who sent it.
pub(crate) type Inbound = (SocketAddr, Vec<u8>);

/// Errors a UDP socket reports because of *another* host (an ICMP port unreachable from a
/// stopped peer surfaces on a later receive): not a reason to stop.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::OutOfMemory
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || e.raw_os_error() == Some(113) // EHOSTUNREACH
}

struct Relay {
    socket: Arc<UdpSocket>,
    addr: SocketAddr,
}

#[derive(Default)]
struct Table {
    by_peer: HashMap<SocketAddr, Arc<Relay>>,
    peer_of: HashMap<SocketAddr, SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

/// The gossip port, chitchat's relays, and the counts queue.
pub(crate) struct Relays {
    external: Arc<UdpSocket>,
    codec: Arc<FrameCodec>,
    metrics: Arc<GossipMetrics>,
    counts: mpsc::Sender<Inbound>,
    /// chitchat's private socket, known once chitchat opened it.
    chitchat_addr: OnceLock<SocketAddr>,
    table: Mutex<Table>,
}

impl Relays {
    pub(crate) fn new(
        external: Arc<UdpSocket>,
        codec: Arc<FrameCodec>,
        metrics: Arc<GossipMetrics>,
        counts: mpsc::Sender<Inbound>,
    ) -> Arc<Relays> {
        Arc::new(Relays {
            external,
            codec,
            metrics,
            counts,
            chitchat_addr: OnceLock::new(),
            table: Mutex::new(Table::default()),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The relay of `peer`, created if there is room.
    fn relay_for(self: &Arc<Self>, peer: SocketAddr) -> Option<Arc<Relay>> {
        let mut t = self.table();
        if let Some(r) = t.by_peer.get(&peer) {
            return Some(r.clone());
        }
        if t.by_peer.len() >= MAX_RELAYS {
            self.metrics.relay_full();
            return None;
        }
        let std_socket = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).ok()?;
        std_socket.set_nonblocking(true).ok()?;
        let socket = Arc::new(UdpSocket::from_std(std_socket).ok()?);
        let addr = socket.local_addr().ok()?;
        let relay = Arc::new(Relay { socket, addr });
        t.by_peer.insert(peer, relay.clone());
        t.peer_of.insert(addr, peer);
        let task = tokio::spawn(outbound(self.clone(), relay.clone(), peer));
        t.tasks.push(task);
        Some(relay)
    }

    fn peer_of(&self, relay_addr: SocketAddr) -> Option<SocketAddr> {
        self.table().peer_of.get(&relay_addr).copied()
    }

    /// Stops every relay task.
    pub(crate) fn shutdown(&self) {
        let mut t = self.table();
        for task in t.tasks.drain(..) {
            task.abort();
        }
        t.by_peer.clear();
        t.peer_of.clear();
    }

    /// Reads the gossip port until `stop`: counts to the queue, membership to chitchat
    /// through the sender's relay, everything else dropped and counted.
    pub(crate) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut buf = vec![0u8; MAX_DATAGRAM + 1].into_boxed_slice();
        loop {
            let (n, from) = tokio::select! {
                r = self.external.recv_from(&mut buf) => match r {
                    Ok(r) => r,
                    Err(e) if transient(&e) => continue,
                    Err(e) => {
                        tracing::error!(error = %e, "gossip port broken: no more counts or membership");
                        return;
                    }
                },
                _ = stop.changed() => return,
            };
            let m = &self.metrics;
            m.frame_received(n);
            if n > MAX_DATAGRAM {
                m.reject(Reject::Malformed);
                continue;
            }
            match self.codec.open(&buf[..n]) {
                Ok((Kind::Counts, payload)) => {
                    if self.counts.try_send((from, payload.to_vec())).is_err() {
                        m.reject(Reject::Overload);
                    }
                }
                Ok((Kind::Membership, payload)) => {
                    let (Some(to), Some(relay)) =
                        (self.chitchat_addr.get().copied(), self.relay_for(from))
                    else {
                        continue;
                    };
                    if let Err(e) = relay.socket.send_to(payload, to).await
                        && !transient(&e)
                    {
                        tracing::debug!(error = %e, "relaying a membership message failed");
                    }
                }
                Err(r) => {
                    m.reject(r);
                    tracing::debug!(%from, reason = r.label(), "gossip frame dropped");
                }
            }
        }
    }
}

/// chitchat's messages to `peer`: read from its relay, framed, sent from the gossip port.
async fn outbound(relays: Arc<Relays>, relay: Arc<Relay>, peer: SocketAddr) {
    let mut buf = vec![0u8; MAX_DATAGRAM + 1].into_boxed_slice();
    let mut frame = Vec::with_capacity(2048);
    loop {
        let (n, from) = match relay.socket.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) if transient(&e) => continue,
            Err(_) => return,
        };
        if Some(&from) != relays.chitchat_addr.get() {
            // Only chitchat's socket may speak through a relay.
            continue;
        }
        relays.codec.seal(Kind::Membership, &buf[..n], &mut frame);
        if frame.len() > MAX_DATAGRAM {
            // chitchat fills datagrams up to the UDP maximum; the frame's bytes push a full
            // one over. Only reachable with hundreds of daemons (docs/regions.md).
            relays.metrics.membership_oversize();
            continue;
        }
        if let Err(e) = relays.external.send_to(&frame, peer).await
            && !transient(&e)
        {
            tracing::debug!(%peer, error = %e, "membership frame not sent");
        }
    }
}

/// The [`Transport`] chitchat opens: its own UDP socket on a private loopback port, wrapped
/// so that it reaches peers only through their relays.
pub(crate) struct FramedTransport {
    pub(crate) relays: Arc<Relays>,
}

#[async_trait::async_trait]
impl Transport for FramedTransport {
    async fn open(&self, _listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let inner = UdpTransport
            .open(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await?;
        let addr = inner.local_addr()?;
        self.relays
            .chitchat_addr
            .set(addr)
            .map_err(|_| anyhow::anyhow!("the gossip transport is already open"))?;
        Ok(Box::new(FramedSocket {
            inner,
            relays: self.relays.clone(),
        }))
    }
}

struct FramedSocket {
    inner: Box<dyn Socket>,
    relays: Arc<Relays>,
}

#[async_trait::async_trait]
impl Socket for FramedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.relays.external.local_addr()?)
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        match self.relays.relay_for(to) {
            Some(relay) => self.inner.send(relay.addr, envelope).await,
            None => Ok(SendOutcome { num_bytes_sent: 0 }),
        }
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let mut out = self.inner.recv().await?;
            // Anything but a relay (another local process) is not a peer: drop it.
            if let Some(peer) = self.relays.peer_of(out.from_addr) {
                out.from_addr = peer;
                return Ok(out);
            }
        }
    }
}
