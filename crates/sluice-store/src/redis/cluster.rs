//! [`RedisClusterStore`]: a Redis Cluster, routed by this store.
//!
//! Every key of one call shares the `{identity}` hash tag, so a call is one single-slot script:
//! the store looks the slot up in its own slot map and sends the `EVALSHA` over the one
//! multiplexed connection it keeps to the node owning that slot. Nothing is shared between
//! nodes on the call path (no lock, no queue, no refresh to wait for), so a node that is dead,
//! stalled or being failed over delays only the calls for its own slots.
//!
//! # Why not the redis crate's cluster client
//!
//! It was used first and failed the failover test (`tests/failures.rs`) in two ways:
//!
//! - It learns a new slot owner only from an error one of its own attempts sees. With a
//!   primary that stops answering (a crashed host, a partition: the test pauses it), every
//!   attempt outlives the call's few-ms deadline, the caller drops it, and the client never
//!   sees an error: it kept sending that shard's calls to the dead node long after the replica
//!   was promoted.
//! - Its slot refresh runs under one lock over every node's connection, re-validating or
//!   re-connecting each node of the map (PING, connect) while it holds it, and its request
//!   task polls no in-flight request of any node until the refresh is over. A refresh is
//!   triggered by every failed call, so the dead node's calls kept stalling the healthy nodes'.
//!
//! Routing ourselves is a small amount of code because the call shape is fixed (one script,
//! one slot), and it makes the deadline and "never charge twice" rules ours to enforce.
//!
//! # Guarantees
//!
//! - **Deadline**: the whole call (redirections, a `NOSCRIPT` reload, `TRYAGAIN` waits) runs
//!   under the store's `timeout_ms`; past it the call is a retryable `Timeout` and is dropped.
//!   Its stale bound (`stale.rs`) keeps a node that gets to it later from running it.
//! - **At most once**: a script is only sent again after a reply proving it did not run:
//!   `MOVED`, `ASK`, `TRYAGAIN` or `NOSCRIPT`. A timeout or a broken connection is never
//!   retried (the script may have run).
//! - **Redirections**: `MOVED` updates the slot's owner at once, retries on the new owner and
//!   asks for a refresh of the whole map; `ASK` sends `ASKING` + the script to the importing
//!   node in one write (a pipeline, so no other caller's command can come between them on the
//!   shared connection).
//! - **Slot map**: refreshed from `CLUSTER SLOTS` of any node that answers, every second and
//!   soon after a failed call or a `MOVED`, in the background.
//! - **Shard numbers** ([`Store::shard_of`], the daemon's circuit breakers): a node keeps the
//!   index it was first seen owning slots with. A promoted replica is a new node with a new
//!   index, so its breaker starts closed while the dead primary's stays open.

use super::script::{Script, classify};
use super::slot::{SLOTS, key_slot};
use super::{
    Engine, RedisConfig, WARM_UP_TAG, bad_url, check_bounded, client_for, give_back_with, redact,
    release_with,
};
use crate::{BoxFuture, Store, StoreError};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{
    ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, RedisResult,
    ServerErrorKind, Value,
};
use sluice_core::Micros;
use sluice_core::batch::{Call, CallResult, GiveBack};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// How often the slot map is refreshed when nothing fails.
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// The least time between two refreshes triggered by failures.
const REFRESH_MIN_GAP: Duration = Duration::from_millis(100);
/// How long one node may take to answer `CLUSTER SLOTS` (background, never a call's time).
const REFRESH_TIMEOUT: Duration = Duration::from_millis(500);
/// Nodes asked for `CLUSTER SLOTS` at once; the first good answer wins. A few, so one dead or
/// stalled node costs no refresh time, without asking every node of a big cluster each second.
const REFRESH_FANOUT: usize = 3;
/// Redirections (`MOVED`, `ASK`) one call may follow. A slot moves once per resharding step;
/// more than this in one call means the map is churning and the call should fail fast.
const REDIRECTS: u32 = 5;
/// The first wait after `TRYAGAIN` (a multi-key call meeting a slot half migrated), doubled up
/// to [`TRYAGAIN_MAX_WAIT`]; the call's deadline bounds the total.
const TRYAGAIN_FIRST_WAIT: Duration = Duration::from_millis(1);
const TRYAGAIN_MAX_WAIT: Duration = Duration::from_millis(16);
/// Commands that may wait in a node connection's queue before callers block: the daemon runs
/// hundreds of concurrent checks, the crate's default of 50 would make them queue.
const PIPELINE_BUFFER: usize = 4096;
/// Response timeout of a node connection. Calls are bounded by their own (shorter) deadline;
/// this bounds background commands (`CLUSTER SLOTS`, `SCRIPT LOAD`), which a 3 ms figure
/// would make fail on a busy machine.
const BACKGROUND_TIMEOUT: Duration = Duration::from_millis(500);
/// A slot whose owner is not known yet (no map yet).
const UNKNOWN: u16 = u16::MAX;
/// Hash tags tried to find one whose slot a given node owns, for its warm-up calls: enough
/// that even a node owning a single slot is all but certainly hit (miss ≈ e^-8); a node
/// without one is still connected and has its scripts loaded.
const WARM_UP_TAG_TRIES: usize = 1 << 17;

/// One cluster node and the one multiplexed connection every call to it shares (pipelined;
/// re-made in the background after it drops, while calls fail fast).
struct Node {
    /// `host:port`, as `CLUSTER SLOTS` and redirections name it.
    addr: String,
    conn: ConnectionManager,
    /// The scripts were loaded here (or a load is under way) since the node took slots, so the
    /// first call after a failover or resharding needs no `EVAL`.
    preloaded: AtomicBool,
}

/// Every node the store has a connection to, and the shard numbering.
#[derive(Default)]
struct Registry {
    /// Seeds, slot owners and `ASK` targets, by address.
    by_addr: HashMap<String, Arc<Node>>,
    /// Shard index → node, in the order nodes were first seen owning slots; never reordered,
    /// so an index keeps naming the same node (and the daemon's breaker for it).
    numbered: Vec<Arc<Node>>,
    /// The slot owners in the last map applied: asked first for the next one.
    owners: Vec<Arc<Node>>,
}

struct Inner {
    engine: Engine,
    /// Slot → index into `Registry::numbered` ([`UNKNOWN`] before the first map).
    slots: Vec<AtomicU16>,
    registry: RwLock<Registry>,
    /// The first seed's connection settings (AUTH, db, protocol, TLS or not); other nodes
    /// differ by address.
    template: ConnectionInfo,
    /// The TLS files every node's `rediss://` connection uses, read once at start.
    certs: Option<redis::TlsCertificates>,
    node_cfg: ConnectionManagerConfig,
    /// Seed addresses (`host:port`), asked when the map is unknown or no known node answers.
    seeds: Vec<String>,
    next_seed: AtomicUsize,
    /// Seed URLs without passwords, for `Debug` and logs.
    seed_urls: Vec<String>,
    /// Wakes the refresher early (a failed call, a `MOVED`).
    refresh: Notify,
}

/// The counter store on a Redis Cluster.
#[derive(Clone)]
pub struct RedisClusterStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClusterStore")
            .field("seeds", &self.inner.seed_urls)
            .field("engine", &self.inner.engine)
            .finish_non_exhaustive()
    }
}

/// `host:port` → its parts (the host may be an IPv6 address with colons).
fn split_addr(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// A redirection or map entry names `host:port`; an empty or unknown (`?`) host means "the
/// node you asked", as Redis writes it when a node does not know its own address.
fn resolve_host(addr: &str, asked: &str) -> String {
    match (split_addr(addr), split_addr(asked)) {
        (Some((host, port)), Some((asked_host, _))) if host.is_empty() || host == "?" => {
            format!("{asked_host}:{port}")
        }
        _ => addr.to_string(),
    }
}

/// One slot range of a `CLUSTER SLOTS` reply: first slot, last slot, primary `host:port`.
type SlotRange = (usize, usize, String);

/// Parses a `CLUSTER SLOTS` reply (`[[start, end, [host, port, id, ...], replicas...], ...]`)
/// as a whole: a reply that does not parse changes nothing.
fn parse_slots(reply: &Value, asked: &str) -> Option<Vec<SlotRange>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let Value::Array(fields) = r else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let host = match primary.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return None,
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            return None;
        };
        let (Ok(s), Ok(e)) = (usize::try_from(*start), usize::try_from(*end)) else {
            return None;
        };
        if s > e || e >= SLOTS {
            return None;
        }
        out.push((s, e, resolve_host(&format!("{host}:{port}"), asked)));
    }
    Some(out)
}

impl Inner {
    fn read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The node at `addr`, connecting lazily the first time it is named.
    fn node(&self, addr: &str) -> Result<Arc<Node>, StoreError> {
        if let Some(n) = self.read().by_addr.get(addr) {
            return Ok(n.clone());
        }
        let (host, port) = split_addr(addr).ok_or_else(|| {
            StoreError::Server(format!("redis cluster: bad node address {addr:?}"))
        })?;
        let node_addr = match self.template.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host.to_string(), port),
        };
        let info = self.template.clone().set_addr(node_addr);
        let client = client_for(info, self.certs.as_ref()).map_err(|e| bad_url(addr, &e))?;
        let conn = ConnectionManager::new_lazy_with_config(client, self.node_cfg.clone())
            .map_err(|e| bad_url(addr, &e))?;
        let created = Arc::new(Node {
            addr: addr.to_string(),
            conn,
            preloaded: AtomicBool::new(false),
        });
        Ok(self
            .write()
            .by_addr
            .entry(addr.to_string())
            .or_insert(created)
            .clone())
    }

    /// The shard index of the slot owner at `addr` (numbered on first sight) and its node.
    fn shard(&self, addr: &str) -> Result<(u16, Arc<Node>), StoreError> {
        let find = |r: &Registry| r.numbered.iter().position(|n| n.addr == addr);
        {
            let r = self.read();
            if let Some(i) = find(&r) {
                return Ok((i as u16, r.numbered[i].clone()));
            }
        }
        let node = self.node(addr)?;
        let mut w = self.write();
        if let Some(i) = find(&w) {
            return Ok((i as u16, w.numbered[i].clone()));
        }
        if w.numbered.len() >= usize::from(UNKNOWN) {
            return Err(StoreError::Server(
                "redis cluster: more nodes than shard numbers".into(),
            ));
        }
        w.numbered.push(node.clone());
        Ok(((w.numbered.len() - 1) as u16, node))
    }

    /// The node owning `slot` in the current map.
    fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        let idx = self.slots[usize::from(slot)].load(Ordering::Relaxed);
        if idx == UNKNOWN {
            return None;
        }
        self.read().numbered.get(usize::from(idx)).cloned()
    }

    /// A warm-up hash tag whose slot `node` owns in the current map, if one is found.
    fn warm_up_tag(&self, node: &Arc<Node>) -> Option<String> {
        let idx = self
            .read()
            .numbered
            .iter()
            .position(|n| Arc::ptr_eq(n, node))?;
        let idx = u16::try_from(idx).ok()?;
        (0..WARM_UP_TAG_TRIES)
            .map(|i| format!("{WARM_UP_TAG}-{i}"))
            .find(|t| {
                let slot = key_slot(&format!("sl:{{{t}}}:w"));
                self.slots[usize::from(slot)].load(Ordering::Relaxed) == idx
            })
    }

    /// A seed, in turn: where a call goes before any map is known (its reply redirects it).
    fn any_seed(&self) -> Result<Arc<Node>, StoreError> {
        let i = self.next_seed.fetch_add(1, Ordering::Relaxed) % self.seeds.len();
        self.node(&self.seeds[i])
    }

    /// Something failed: refresh the map soon (rate-limited by the refresher).
    fn suspect(&self) {
        self.refresh.notify_one();
    }

    /// Applies a parsed map; returns the nodes owning slots in it.
    fn apply(&self, ranges: &[SlotRange]) -> Result<Vec<Arc<Node>>, StoreError> {
        let mut owners: Vec<(u16, Arc<Node>)> = Vec::new();
        for (start, end, addr) in ranges {
            let idx = match owners.iter().find(|(_, n)| &n.addr == addr) {
                Some((i, _)) => *i,
                None => {
                    let o = self.shard(addr)?;
                    let i = o.0;
                    owners.push(o);
                    i
                }
            };
            for slot in &self.slots[*start..=*end] {
                slot.store(idx, Ordering::Relaxed);
            }
        }
        let owners: Vec<Arc<Node>> = owners.into_iter().map(|(_, n)| n).collect();
        self.write().owners = owners.clone();
        Ok(owners)
    }

    /// One call: the script on the slot's owner, following redirections, within the deadline.
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let slot = keys.first().map_or(0, |k| key_slot(k));
        match tokio::time::timeout(self.engine.timeout, self.route(script, slot, keys, args)).await
        {
            Ok(r) => r,
            Err(_) => {
                // A stalled node answers nothing, not even MOVED: only a fresh map shows its
                // replica took over.
                self.suspect();
                Err(StoreError::Timeout(self.engine.timeout_ms))
            }
        }
    }

    async fn route(
        &self,
        script: &Script,
        slot: u16,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let mut node = match self.owner(slot) {
            Some(n) => n,
            None => self.any_seed()?,
        };
        let mut asking = false;
        let mut by_body = false;
        let mut redirects = 0;
        let mut wait = TRYAGAIN_FIRST_WAIT;
        loop {
            let err = match attempt(&node, script, by_body, asking, keys, args).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            // Only replies proving the script did not run lead to sending it again.
            match err.kind() {
                ErrorKind::Server(ServerErrorKind::NoScript) if !by_body => {
                    self.engine.count_noscript();
                    by_body = true;
                }
                ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask))
                    if redirects < REDIRECTS =>
                {
                    redirects += 1;
                    let Some((to, to_slot)) = err.redirect_node() else {
                        return Err(classify(&err, keys, self.engine.timeout_ms));
                    };
                    let to = resolve_host(to, &node.addr);
                    if kind == ServerErrorKind::Moved {
                        let (idx, owner) = self.shard(&to)?;
                        if let Some(s) = self.slots.get(usize::from(to_slot)) {
                            s.store(idx, Ordering::Relaxed);
                        }
                        self.suspect();
                        node = owner;
                        asking = false;
                    } else {
                        node = self.node(&to)?;
                        asking = true;
                    }
                }
                ErrorKind::Server(ServerErrorKind::TryAgain) => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(TRYAGAIN_MAX_WAIT);
                }
                _ => {
                    let e = classify(&err, keys, self.engine.timeout_ms);
                    if e.retryable() {
                        self.suspect();
                    }
                    return Err(e);
                }
            }
        }
    }
}

/// Sends the script once to `node`: `EVALSHA` (or `EVAL` after `NOSCRIPT`), preceded by
/// `ASKING` in the same write when following an `ASK`. Server error replies come back as
/// errors.
async fn attempt(
    node: &Node,
    script: &Script,
    by_body: bool,
    asking: bool,
    keys: &[String],
    args: &[String],
) -> RedisResult<Value> {
    let mut eval = if by_body {
        let mut c = redis::cmd("EVAL");
        c.arg(script.body);
        c
    } else {
        let mut c = redis::cmd("EVALSHA");
        c.arg(&script.sha);
        c
    };
    eval.arg(keys.len()).arg(keys).arg(args);
    let mut conn = node.conn.clone();
    if !asking {
        return conn.req_packed_command(&eval).await?.extract_error();
    }
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").add_command(eval);
    // Skip ASKING's "OK"; keep the script's reply.
    let mut replies = conn.req_packed_commands(&pipe, 1, 1).await?;
    match replies.pop() {
        Some(v) => v.extract_error(),
        None => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "no reply to the script after ASKING",
        ))),
    }
}

/// `CLUSTER SLOTS` from one node, for the background refresh.
async fn cluster_slots(node: Arc<Node>) -> (Arc<Node>, Option<Value>) {
    let mut conn = node.conn.clone();
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let reply = match tokio::time::timeout(REFRESH_TIMEOUT, conn.req_packed_command(&cmd)).await {
        Ok(Ok(v)) => v.extract_error().ok(),
        _ => None,
    };
    (node, reply)
}

impl RedisClusterStore {
    /// Checks the seed URLs, loads the slot map and the scripts once (failures are logged, not
    /// fatal: see [`super::connect`]), and starts the map refresher, which stops when the
    /// store is dropped.
    pub async fn connect(cfg: &RedisConfig) -> Result<RedisClusterStore, StoreError> {
        cfg.validate()?;
        let mut seeds = Vec::with_capacity(cfg.urls.len());
        let mut template: Option<ConnectionInfo> = None;
        for url in &cfg.urls {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| bad_url(url, &e))?;
            let (ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. }) =
                info.addr()
            else {
                return Err(StoreError::Server(format!(
                    "redis cluster: seed {} is not a redis:// or rediss://host:port URL",
                    redact(url)
                )));
            };
            if let Some(first) = &template
                && matches!(first.addr(), ConnectionAddr::TcpTls { .. })
                    != matches!(info.addr(), ConnectionAddr::TcpTls { .. })
            {
                return Err(StoreError::Server(
                    "redis cluster: seeds mix redis:// and rediss://".into(),
                ));
            }
            seeds.push(format!("{host}:{port}"));
            template.get_or_insert(info);
        }
        let Some(template) = template else {
            return Err(StoreError::Server("redis: no URL configured".into()));
        };
        let node_cfg = ConnectionManagerConfig::new()
            .set_response_timeout(Some(cfg.timeout().max(BACKGROUND_TIMEOUT)))
            .set_connection_timeout(Some(cfg.connect_timeout()))
            // A reconnect retries once, quickly; calls meanwhile fail at their deadline and the
            // next call after a failure starts a new attempt.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(5))
            .set_max_delay(Duration::from_millis(50))
            .set_pipeline_buffer_size(PIPELINE_BUFFER);
        let inner = Arc::new(Inner {
            engine: Engine::new(cfg),
            slots: (0..SLOTS).map(|_| AtomicU16::new(UNKNOWN)).collect(),
            registry: RwLock::new(Registry::default()),
            template,
            certs: cfg.tls.certificates()?,
            node_cfg,
            seeds,
            next_seed: AtomicUsize::new(0),
            seed_urls: cfg.urls.iter().map(|u| redact(u)).collect(),
            refresh: Notify::new(),
        });
        for s in &inner.seeds {
            inner.node(s)?;
        }
        match Self::refresh_once(&inner).await {
            Some(owners) => {
                let loads: Vec<_> = owners
                    .into_iter()
                    .filter_map(|n| Self::preload(&inner, n))
                    .collect();
                for l in loads {
                    let _ = l.await;
                }
            }
            None => {
                tracing::warn!(seeds = ?inner.seed_urls, "redis cluster not reachable at start; will retry on use");
            }
        }
        tokio::spawn(Self::refresher(Arc::downgrade(&inner)));
        Ok(RedisClusterStore { inner })
    }

    /// Warms every slot owner up at once (see [`Store::warm_up`]): a fresh map, then on each
    /// primary its connection, every script and one call of each on a key of its own slots.
    /// Fails, naming the node, while any owner fails.
    async fn warm_up_all(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        let Some(owners) = Self::refresh_once(inner).await else {
            return Err(StoreError::Unavailable(
                "redis cluster: no node answered CLUSTER SLOTS".into(),
            ));
        };
        let mut nodes = tokio::task::JoinSet::new();
        for node in owners {
            let inner = inner.clone();
            nodes.spawn(async move {
                let tag = inner.warm_up_tag(&node);
                let mut conn = node.conn.clone();
                let r = inner.engine.warm_up(&mut conn, tag.as_deref()).await;
                if r.is_ok() {
                    node.preloaded.store(true, Ordering::Relaxed);
                }
                (node, r)
            });
        }
        let mut first = None;
        while let Some(joined) = nodes.join_next().await {
            let e = match joined {
                Ok((_, Ok(()))) => continue,
                Ok((node, Err(e))) => {
                    tracing::debug!(node = %node.addr, error = %e, "redis cluster: warm-up failed");
                    match e {
                        StoreError::Unavailable(m) => {
                            StoreError::Unavailable(format!("{}: {m}", node.addr))
                        }
                        other => other,
                    }
                }
                Err(e) => StoreError::Server(format!("redis cluster: warm-up task: {e}")),
            };
            first.get_or_insert(e);
        }
        first.map_or(Ok(()), Err)
    }

    /// Loads the scripts on `node` in the background unless done (or under way) already.
    fn preload(inner: &Arc<Inner>, node: Arc<Node>) -> Option<tokio::task::JoinHandle<()>> {
        if node.preloaded.swap(true, Ordering::Relaxed) {
            return None;
        }
        let inner = inner.clone();
        Some(tokio::spawn(async move {
            let mut conn = node.conn.clone();
            if let Err(e) = inner.engine.preload(&mut conn).await {
                // Not fatal: a call meeting NOSCRIPT reloads by EVAL. Try again next refresh.
                node.preloaded.store(false, Ordering::Relaxed);
                tracing::debug!(node = %node.addr, error = %e, "redis cluster: SCRIPT LOAD failed");
            }
        }))
    }

    /// Asks a few nodes at a time for `CLUSTER SLOTS` (the last map's slot owners first, then
    /// every other node the store knows, seeds included) and applies the first answer that
    /// parses. Returns the slot owners, or `None` when no node answered.
    async fn refresh_once(inner: &Arc<Inner>) -> Option<Vec<Arc<Node>>> {
        let candidates: Vec<Arc<Node>> = {
            let r = inner.read();
            let mut c: Vec<Arc<Node>> = r.owners.clone();
            // Start at a different owner each time, so one stalled node is not always first.
            if !c.is_empty() {
                let k = inner.next_seed.fetch_add(1, Ordering::Relaxed) % c.len();
                c.rotate_left(k);
            }
            for n in r.by_addr.values() {
                if !c.iter().any(|m| Arc::ptr_eq(m, n)) {
                    c.push(n.clone());
                }
            }
            c
        };
        for batch in candidates.chunks(REFRESH_FANOUT) {
            let mut asked = tokio::task::JoinSet::new();
            for n in batch {
                asked.spawn(cluster_slots(n.clone()));
            }
            while let Some(joined) = asked.join_next().await {
                let Ok((node, Some(reply))) = joined else {
                    continue;
                };
                let Some(ranges) = parse_slots(&reply, &node.addr) else {
                    tracing::debug!(node = %node.addr, "redis cluster: CLUSTER SLOTS reply did not parse");
                    continue;
                };
                match inner.apply(&ranges) {
                    Ok(owners) => return Some(owners),
                    Err(e) => tracing::warn!(error = %e, "redis cluster: slot map not applied"),
                }
            }
        }
        None
    }

    async fn refresher(weak: Weak<Inner>) {
        loop {
            let Some(inner) = weak.upgrade() else { return };
            tokio::select! {
                _ = tokio::time::sleep(REFRESH_EVERY) => {}
                _ = inner.refresh.notified() => {}
            }
            match Self::refresh_once(&inner).await {
                Some(owners) => {
                    for n in owners {
                        Self::preload(&inner, n);
                    }
                }
                None => tracing::debug!("redis cluster: slot map refresh failed"),
            }
            drop(inner);
            tokio::time::sleep(REFRESH_MIN_GAP).await;
        }
    }

    /// Node addresses by shard index, as [`Store::shard_of`] numbers them.
    pub fn shard_nodes(&self) -> Vec<String> {
        self.inner
            .read()
            .numbered
            .iter()
            .map(|n| n.addr.clone())
            .collect()
    }

    /// Refreshes the slot map now (tests, admin); false when no node answered `CLUSTER SLOTS`.
    pub async fn refresh_shards(&self) -> bool {
        Self::refresh_once(&self.inner).await.is_some()
    }

    /// How many times a node answered `NOSCRIPT` (a new primary after failover or resharding,
    /// a restart) and the script was reloaded: a metric.
    pub fn noscript_reloads(&self) -> u64 {
        self.inner.engine.noscript_reloads()
    }
}

impl Store for RedisClusterStore {
    fn noscript_reloads(&self) -> u64 {
        self.inner.engine.noscript_reloads()
    }

    fn check<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<CallResult, StoreError>> {
        let inner = &self.inner;
        Box::pin(check_bounded(&inner.engine, call, move |enc| async move {
            inner.eval(&inner.engine.check, &enc.keys, &enc.args).await
        }))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        request_id: &'a str,
        now: Micros,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let inner = &self.inner;
        Box::pin(release_with(key, request_id, now, move |req| async move {
            inner
                .eval(&inner.engine.release, &req.keys, &req.args)
                .await
        }))
    }

    /// Routed like a check (the key's slot, redirections followed, within the deadline).
    fn give_back<'a>(&'a self, g: &'a GiveBack) -> BoxFuture<'a, Result<bool, StoreError>> {
        let inner = &self.inner;
        Box::pin(give_back_with(g, move |req| async move {
            inner
                .eval(&inner.engine.give_back, &req.keys, &req.args)
                .await
        }))
    }

    fn shard_of(&self, key: &str) -> usize {
        match self.inner.slots[usize::from(key_slot(key))].load(Ordering::Relaxed) {
            UNKNOWN => 0,
            idx => usize::from(idx),
        }
    }

    fn kind(&self) -> &'static str {
        "redis_cluster"
    }

    fn warm_up(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.warm_up_all())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn addresses_split_and_unknown_hosts_mean_the_node_asked() {
        assert_eq!(split_addr("127.0.0.1:7000"), Some(("127.0.0.1", 7000)));
        assert_eq!(split_addr("::1:7000"), Some(("::1", 7000)));
        assert_eq!(split_addr("nope"), None);
        assert_eq!(resolve_host(":7001", "10.0.0.1:7000"), "10.0.0.1:7001");
        assert_eq!(resolve_host("?:7001", "10.0.0.1:7000"), "10.0.0.1:7001");
        assert_eq!(
            resolve_host("10.0.0.2:7001", "10.0.0.1:7000"),
            "10.0.0.2:7001"
        );
    }

    #[test]
    fn cluster_slots_parse_whole_or_not_at_all() {
        let range = |s: i64, e: i64, host: &str, port: i64| {
            Value::Array(vec![
                Value::Int(s),
                Value::Int(e),
                Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
                Value::Array(vec![bulk(host), Value::Int(port + 3), bulk("replica")]),
            ])
        };
        let ok = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 16383, "", 7001),
        ]);
        assert_eq!(
            parse_slots(&ok, "127.0.0.9:7005"),
            Some(vec![
                (0, 5460, "127.0.0.1:7000".to_string()),
                (5461, 16383, "127.0.0.9:7001".to_string()),
            ])
        );
        let out_of_range = Value::Array(vec![range(0, 16384, "h", 1)]);
        assert_eq!(parse_slots(&out_of_range, "h:1"), None);
        let odd = Value::Array(vec![range(0, 10, "h", 1), Value::Int(3)]);
        assert_eq!(parse_slots(&odd, "h:1"), None);
        assert_eq!(parse_slots(&Value::Nil, "h:1"), None);
    }
}
