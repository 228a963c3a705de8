//! A running gossip node: the bound socket, chitchat for membership, and two tasks, the
//! shipper (every `ship_interval`: select, pack, send to the other regions, or to this
//! region's sender) and the receiver (check, decode, merge, and pass a relayed packet on in
//! this region).
//!
//! The daemon talks to it through three calls: [`Node::observe`] after each decision on a
//! global rule, [`Node::remote_for`] when planning one, and [`Node::render_metrics`].

use crate::forward::Forwarding;
use crate::metrics::{Gauges, GossipMetrics};
use crate::pack;
use crate::transport::{FramedTransport, Inbound, Relays};
use crate::wire::{CodecError, FrameCodec, MAX_DATAGRAM};
use chitchat::{
    ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, NodeState, ProtocolVersion,
    spawn_chitchat,
};
use sluice_clock::{Clock, SystemClock};
use sluice_core::liveness::SenderWatch;
use sluice_core::merge::RemoteCounts;
use sluice_core::relay::Collected;
use sluice_core::ship::{Budget, LocalUsage, Observed};
use sluice_core::{Micros, Params, Remote};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

mod receive;
mod ship;

use receive::receive_loop;
use ship::ship_loop;

/// The chitchat key under which a daemon publishes its region.
pub const REGION_KEY: &str = "sluice.region";
/// The chitchat key under which a daemon publishes the counts format it reads.
pub const FORMAT_KEY: &str = "sluice.counts_format";
/// The chitchat key under which a daemon says it relays (`shippers: region_sender`): only
/// such members are elected their region's sender and receiver.
pub const RELAY_KEY: &str = "sluice.relay";
/// The chitchat key under which a relaying daemon publishes its fan-out when it forwards
/// (`gossip.fanout` above 0): only regions whose sender forwards form the ring.
pub const FANOUT_KEY: &str = "sluice.fanout";

/// Wall-clock now in epoch microseconds (figures carry epoch-aligned windows).
pub fn now_micros() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as Micros)
        .unwrap_or(0)
}

/// Which daemons of a region ship its figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Shippers {
    /// Every daemon ships what it observed (receivers keep the max per region). Correct
    /// however the load balancer spreads keys; cross-region traffic grows with the daemons
    /// here times the daemons elsewhere.
    EveryDaemon,
    /// Every daemon sends its selection to its region's sender (inside the region), which
    /// ships the max per key once per remote region, to that region's receiver, which passes
    /// it on to its region's daemons. Correct under any load balancing; cross-region traffic
    /// grows with region pairs × busy keys. Sender and receiver are elected from the live
    /// membership ([`sluice_core::relay`]).
    #[default]
    RegionSender,
    /// Only the live daemon of the region with the lowest node id ships: one sender per
    /// region. It only knows the keys it decided, so this fits when every daemon sees every
    /// busy key (an even spread), not sticky routing.
    OnePerRegion,
}

/// Resolves the rule a received figure belongs to.
pub trait RuleLookup: Send + Sync + 'static {
    /// The numbers of `rule` for figures of `identity` (the store key's hash tag, starting
    /// with the escaped domain), when this daemon runs it as a `scope: global` rule; `None`
    /// otherwise (the figure is dropped and counted as `unknown_rule`: a region-scoped rule
    /// never takes figures from elsewhere).
    fn global_params(&self, identity: &str, rule: &str) -> Option<Params>;
}

/// A gossip node's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// This daemon's region.
    pub region: String,
    /// Unique id of this daemon in the cluster.
    pub node_id: String,
    /// Members of other clusters are ignored.
    pub cluster_id: String,
    /// UDP address to bind (membership and counts).
    pub listen_addr: SocketAddr,
    /// Address other daemons reach this one at (default: the bound address; required when
    /// binding a wildcard address).
    pub advertise_addr: Option<SocketAddr>,
    /// Seed nodes' gossip addresses (`host:port`; names are re-resolved every minute).
    pub seeds: Vec<String>,
    /// Shared key authenticating every frame (HMAC-SHA256), at least 16 bytes.
    pub key: Option<Vec<u8>>,
    /// How often figures are shipped.
    pub ship_interval: Duration,
    /// chitchat's gossip round.
    pub gossip_interval: Duration,
    /// How long this region's sender may stay silent before the election passes it over
    /// (`region_sender`; [`sluice_core::liveness`]). `None`: three quarters of the ship
    /// interval (three missed beacons), so a dead sender is replaced within one interval
    /// instead of the membership's several seconds, at the price of a duplicate shipment
    /// when a live one is slow. At least half the ship interval (two beacons).
    pub sender_stale_after: Option<Duration>,
    /// What one interval may ship.
    pub budget: Budget,
    /// Largest datagram sent (frame included). 1,400 fits a 1,500-byte Ethernet MTU, so
    /// nothing is fragmented across the WAN (a lost fragment loses the whole datagram).
    pub max_datagram: usize,
    /// Key bound of the remote table.
    pub max_remote_keys: usize,
    /// Which daemons ship.
    pub shippers: Shippers,
    /// Received counts datagrams waiting to be merged, at most.
    pub recv_queue: usize,
    /// `region_sender`: how many peer regions this region's sender ships and forwards to
    /// ([`sluice_core::forward`]); 0 (the default) ships to every other region, as does any
    /// fan-out while the forwarding regions are at most `fanout + 1`.
    pub fanout: usize,
    /// Where the node reads time: the wall clock for what other daemons compare (ship times,
    /// windows), the monotonic one for how long this region's sender has been silent, so a
    /// stepped wall clock neither passes a live sender over nor keeps a dead one elected.
    pub clock: Arc<dyn Clock>,
}

impl Config {
    /// Settings with the defaults for everything but identity and address.
    pub fn new(region: &str, node_id: &str, listen_addr: SocketAddr) -> Config {
        Config {
            region: region.to_string(),
            node_id: node_id.to_string(),
            cluster_id: "sluice".to_string(),
            listen_addr,
            advertise_addr: None,
            seeds: Vec::new(),
            key: None,
            ship_interval: Duration::from_secs(1),
            gossip_interval: Duration::from_millis(500),
            sender_stale_after: None,
            budget: Budget::default(),
            max_datagram: 1_400,
            max_remote_keys: 1_000_000,
            shippers: Shippers::default(),
            recv_queue: 8_192,
            fanout: 0,
            clock: Arc::new(SystemClock::new()),
        }
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// A setting is out of range.
    #[error("gossip config: {0}")]
    Config(String),
    /// Cluster id or key refused.
    #[error("gossip config: {0}")]
    Codec(#[from] CodecError),
    /// The gossip address could not be bound.
    #[error("binding the gossip address {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// chitchat did not start.
    #[error("starting membership: {0}")]
    Membership(String),
}

/// A live member as this daemon sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Node id.
    pub node_id: String,
    /// Region it published.
    pub region: String,
    /// Its gossip address.
    pub addr: SocketAddr,
    /// Whether it relays (`shippers: region_sender`), so it can be elected.
    pub relays: bool,
    /// Whether it forwards other regions' figures to peer regions (`gossip.fanout` above 0).
    pub forwards: bool,
}

struct Inner {
    cfg: Config,
    codec: Arc<FrameCodec>,
    socket: Arc<UdpSocket>,
    usage: Mutex<LocalUsage>,
    remote: RwLock<RemoteCounts>,
    metrics: Arc<GossipMetrics>,
    lookup: Arc<dyn RuleLookup>,
    shipping: AtomicBool,
    region_sender: AtomicBool,
    collected: Mutex<Collected>,
    regions: AtomicUsize,
    seq: AtomicU64,
    live: watch::Receiver<BTreeMap<ChitchatId, NodeState>>,
    /// Signs of life the sender election takes into account ([`liveness`]).
    watch: Mutex<SenderWatch>,
    /// This region's members as last listed, to put back a sender the membership dropped
    /// while the watch still counts on it.
    region_seen: Mutex<RegionSeen>,
    /// When this daemon last sent a datagram inside its region (monotonic µs): a sender that did
    /// lately needs no beacon.
    in_region_at: AtomicU64,
    /// Other regions' figures to pass on to peer regions (`fanout` above 0).
    forwarding: Forwarding,
}

/// This region's members as the sender election last saw them listed, by node id (pruned to
/// those listed and the one kept), and the sender it keeps after the membership dropped it.
#[derive(Default)]
struct RegionSeen {
    listed: HashMap<String, Member>,
    keeping: Option<String>,
}

/// A running gossip node. Dropping it aborts its tasks; [`Node::shutdown`] stops them.
pub struct Node {
    inner: Arc<Inner>,
    relays: Arc<Relays>,
    chitchat: Mutex<Option<ChitchatHandle>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stop: watch::Sender<bool>,
    local_addr: SocketAddr,
}

fn bind(addr: SocketAddr) -> Result<UdpSocket, GossipError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let err = |source| GossipError::Bind { addr, source };
    let s =
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(err)?;
    // A burst of 100k figures is ~1 MB; the kernel caps these at net.core.[rw]mem_max, which
    // is fine: they are a best effort against drops during a burst.
    let _ = s.set_recv_buffer_size(8 << 20);
    let _ = s.set_send_buffer_size(8 << 20);
    s.set_nonblocking(true).map_err(err)?;
    s.bind(&addr.into()).map_err(err)?;
    UdpSocket::from_std(s.into()).map_err(err)
}

impl Node {
    /// Binds, joins the cluster, and starts shipping and receiving.
    pub async fn start(cfg: Config, lookup: Arc<dyn RuleLookup>) -> Result<Node, GossipError> {
        let bad = |m: &str| Err(GossipError::Config(m.to_string()));
        if cfg.region.is_empty() || cfg.region.len() > pack::MAX_NAME {
            return bad("region must be 1 to 255 bytes");
        }
        if cfg.node_id.is_empty() || cfg.node_id.len() > pack::MAX_NAME {
            return bad("node id must be 1 to 255 bytes");
        }
        if !(512..=MAX_DATAGRAM).contains(&cfg.max_datagram) {
            return bad("max_datagram must be 512 to 65507");
        }
        if cfg.ship_interval < Duration::from_millis(10)
            || cfg.gossip_interval < Duration::from_millis(10)
        {
            return bad("ship and gossip intervals must be at least 10 ms");
        }
        if cfg
            .sender_stale_after
            .is_some_and(|d| d < cfg.ship_interval / 2)
        {
            return bad("sender_stale_after must be at least half the ship interval");
        }
        let codec = Arc::new(FrameCodec::new(&cfg.cluster_id, cfg.key.as_deref())?);
        let socket = Arc::new(bind(cfg.listen_addr)?);
        let local_addr = socket.local_addr().map_err(|source| GossipError::Bind {
            addr: cfg.listen_addr,
            source,
        })?;
        let advertise = match cfg.advertise_addr {
            Some(a) => a,
            None if local_addr.ip().is_unspecified() => {
                return bad("binding a wildcard address needs advertise_addr");
            }
            None => local_addr,
        };
        let metrics = Arc::new(GossipMetrics::default());
        let (tx, rx) = mpsc::channel::<Inbound>(cfg.recv_queue.max(1));
        let relays = Relays::new(socket.clone(), codec.clone(), metrics.clone(), tx);
        let transport = FramedTransport {
            relays: relays.clone(),
        };
        let generation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let chitchat_cfg = ChitchatConfig {
            chitchat_id: ChitchatId::new(cfg.node_id.clone(), generation, advertise),
            cluster_id: cfg.cluster_id.clone(),
            gossip_interval: cfg.gossip_interval,
            // Ignored: chitchat gets a private loopback socket (see the transport module).
            listen_addr: local_addr,
            seed_nodes: cfg.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                initial_interval: cfg.gossip_interval * 2,
                dead_node_grace_period: Duration::from_secs(3600),
                ..FailureDetectorConfig::default()
            },
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            // A member that has not published a region (another program on the cluster id)
            // is never a shipping target.
            extra_liveness_predicate: Some(Box::new(|s: &NodeState| {
                s.get(REGION_KEY).is_some_and(|r| !r.is_empty())
            })),
            protocol_version: ProtocolVersion::V0,
        };
        let mut published = vec![
            (REGION_KEY.to_string(), cfg.region.clone()),
            (
                FORMAT_KEY.to_string(),
                crate::wire::FORMAT_VERSION.to_string(),
            ),
        ];
        if cfg.shippers == Shippers::RegionSender {
            published.push((RELAY_KEY.to_string(), "1".to_string()));
            if cfg.fanout > 0 {
                published.push((FANOUT_KEY.to_string(), cfg.fanout.to_string()));
            }
        }
        let handle = spawn_chitchat(chitchat_cfg, published, &transport)
            .await
            .map_err(|e| GossipError::Membership(format!("{e:#}")))?;
        let live = handle.chitchat().lock().await.live_nodes_watcher();
        let inner = Arc::new(Inner {
            remote: RwLock::new(RemoteCounts::new(
                &cfg.region,
                cfg.max_remote_keys,
                os_seed(),
            )),
            usage: Mutex::new(LocalUsage::new(os_seed())),
            codec,
            socket,
            metrics,
            lookup,
            shipping: AtomicBool::new(true),
            region_sender: AtomicBool::new(cfg.shippers == Shippers::RegionSender),
            collected: Mutex::new(Collected::default()),
            regions: AtomicUsize::new(1),
            seq: AtomicU64::new(1),
            live,
            watch: Mutex::new(SenderWatch::default()),
            region_seen: Mutex::new(RegionSeen::default()),
            in_region_at: AtomicU64::new(0),
            forwarding: Forwarding::default(),
            cfg,
        });
        let (stop, stop_rx) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(relays.clone().run(stop_rx.clone())),
            tokio::spawn(ship_loop(inner.clone(), stop_rx.clone())),
            tokio::spawn(receive_loop(inner.clone(), rx, stop_rx)),
        ];
        tracing::info!(
            addr = %local_addr,
            %advertise,
            region = %inner.cfg.region,
            node = %inner.cfg.node_id,
            cluster = %inner.cfg.cluster_id,
            authenticated = inner.codec.keyed(),
            seeds = ?inner.cfg.seeds,
            "gossip listening"
        );
        Ok(Node {
            inner,
            relays,
            chitchat: Mutex::new(Some(handle)),
            tasks: Mutex::new(tasks),
            stop,
            local_addr,
        })
    }

    /// The bound gossip address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Records this region's figure for a global key after a decision (see
    /// [`LocalUsage::observe`]). A no-op on a daemon that does not ship.
    pub fn observe(&self, key: &str, params: &Params, now: Micros, o: Observed) {
        if !self.inner.shipping.load(Ordering::Relaxed) {
            return;
        }
        self.inner
            .usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(key, params, now, o);
    }

    /// Regions with a live member, this one included (at least 1), as of the last ship
    /// interval: what a region's share of a threshold divides by.
    pub fn regions(&self) -> usize {
        self.inner.regions.load(Ordering::Relaxed).max(1)
    }

    /// The other regions' figures a decision on `key` adds at `now`, a bucket's shared by
    /// [`Node::regions`] regions (a key new to this region starts with its share of the
    /// burst: [`Remote::fresh_share`]).
    pub fn remote_for(&self, key: &str, params: &Params, now: Micros) -> Remote {
        self.remote_among(key, params, now, self.regions())
    }

    /// [`Node::remote_for`] with a bucket shared by `regions` regions: for a daemon that
    /// counts more regions than the membership lists (its configured deployment), so a
    /// region that has not joined yet still takes its part of a new key's burst.
    pub fn remote_among(&self, key: &str, params: &Params, now: Micros, regions: usize) -> Remote {
        self.inner
            .remote
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .remote_for(key, params, now, regions)
    }

    /// Every remote slot as `(key, region, window start, figure)`, sorted (tests, debugging).
    pub fn remote_snapshot(&self) -> Vec<(String, String, Micros, u64)> {
        self.inner
            .remote
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .snapshot()
    }

    /// The counters.
    pub fn metrics(&self) -> &GossipMetrics {
        &self.inner.metrics
    }

    /// Live members, this daemon included, as chitchat last reported them.
    pub fn members(&self) -> Vec<Member> {
        members(&self.inner.live.borrow())
    }

    /// Live daemons of this daemon's region, itself included (at least 1): what a local
    /// share of a rule divides by.
    pub fn region_daemons(&self) -> u64 {
        let region = &self.inner.cfg.region;
        let n = self
            .members()
            .iter()
            .filter(|m| &m.region == region)
            .count();
        n.max(1) as u64
    }

    /// Whether this daemon currently ships its region's figures.
    pub fn shipping(&self) -> bool {
        self.inner.shipping.load(Ordering::Relaxed)
    }

    /// Whether this daemon is its region's sender and receiver (`region_sender`), as of the
    /// last ship interval.
    pub fn region_sender(&self) -> bool {
        self.inner.region_sender.load(Ordering::Relaxed)
    }

    /// Gauges sampled now.
    pub fn gauges(&self) -> Gauges {
        let (remote_keys, remote_slots) = {
            let r = self.inner.remote.read().unwrap_or_else(|p| p.into_inner());
            (r.len() as u64, r.slots() as u64)
        };
        let local_figures = self
            .inner
            .usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len() as u64;
        let m = self.members();
        let regions: BTreeSet<&str> = m.iter().map(|m| m.region.as_str()).collect();
        Gauges {
            remote_keys,
            remote_slots,
            local_figures,
            live_nodes: m.len().max(1) as u64,
            live_regions: regions.len().max(1) as u64,
            shipping: self.shipping(),
            region_sender: self.region_sender(),
            forward_ring: self.inner.forwarding.ring() as u64,
            keys: self.inner.codec.key_count() as u64,
            older_key_frames: self.inner.codec.older_key_opens(),
        }
    }

    /// Replaces the shared keys (a key rotation step, without a restart): the first seals,
    /// every one opens. Refused whole, the keys in use kept, if one is shorter than 16 bytes,
    /// there are none or more than two, or gossip started without a key.
    pub fn set_keys(&self, keys: &[&[u8]]) -> Result<(), CodecError> {
        let r = self.inner.codec.set_keys(keys);
        self.inner.metrics.key_change(r.is_ok());
        r
    }

    /// Appends this node's metrics in Prometheus text.
    pub fn render_metrics(&self, out: &mut String) {
        self.inner.metrics.render(out, &self.gauges());
    }

    /// Stops the tasks and leaves the cluster (peers see the node go silent). Idempotent.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let tasks: Vec<JoinHandle<()>> = self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        let handle = self
            .chitchat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.shutdown().await;
        }
        self.relays.shutdown();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            t.abort();
        }
        if let Some(h) = &*self.chitchat.lock().unwrap_or_else(|p| p.into_inner()) {
            h.abort();
        }
        self.relays.shutdown();
    }
}

fn members(live: &BTreeMap<ChitchatId, NodeState>) -> Vec<Member> {
    live.iter()
        .filter_map(|(id, st)| {
            Some(Member {
                node_id: id.node_id.to_string(),
                region: st.get(REGION_KEY)?.to_string(),
                addr: id.gossip_advertise_addr,
                relays: st.get(RELAY_KEY) == Some("1"),
                forwards: st.get(FANOUT_KEY).is_some_and(|f| f != "0"),
            })
        })
        .collect()
}

/// A secret seed for the hot-path maps of the merge and ship tables, drawn from OS
/// randomness (through std's randomly keyed hasher): their keys come from clients and peers,
/// and the core, which reads no randomness itself, takes the seed from this shell.
fn os_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
}
