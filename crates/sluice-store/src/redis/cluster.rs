//! [`RedisClusterStore`]: a Redis Cluster, one multiplexed connection per node.
//!
//! The redis crate's async cluster client keeps one multiplexed connection per node, routes
//! each `EVALSHA` by its first key's slot, and follows `MOVED` (slot map refresh) and `ASK`
//! (`ASKING` + retry on the importing node) during a resharding. Every key of one call shares
//! the `{identity}` hash tag, so a call is one single-slot script. Its timeouts are set to
//! Sluice's: the call's deadline (enforced here) comes first and an attempt's own timeout
//! (twice that) after it, so the client never re-sends a script that may have run while its
//! caller still waits (a rate limiter must not charge twice).
//!
//! The client's slot map is private, so this store keeps its own, only for
//! [`Store::shard_of`] (per-shard circuit breakers): refreshed from `CLUSTER SLOTS` every
//! second and soon after any failed call. Shard numbers are stable: a node keeps the index it
//! was first seen with.

use super::slot::{SLOTS, key_slot};
use super::{Engine, RedisConfig, bad_url, redact};
use crate::{BoxFuture, Store, StoreError};
use redis::Value;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use sluice_core::Micros;
use sluice_core::batch::{Call, CallResult};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// How often the shard map is refreshed when nothing fails.
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// The least time between two refreshes triggered by failures.
const REFRESH_MIN_GAP: Duration = Duration::from_millis(100);
/// Redirections (MOVED, ASK) and TRYAGAIN waits the client may take within one deadline.
const RETRIES: u32 = 3;

/// Slot → shard index, and the node address behind each index.
#[derive(Debug)]
struct ShardMap {
    /// One entry per slot: the index into `nodes` of its primary.
    slots: Vec<AtomicU16>,
    /// Node addresses (`host:port`) in first-seen order; an index never changes meaning.
    nodes: Mutex<Vec<String>>,
}

impl ShardMap {
    fn new() -> ShardMap {
        ShardMap {
            slots: (0..SLOTS).map(|_| AtomicU16::new(0)).collect(),
            nodes: Mutex::new(Vec::new()),
        }
    }

    fn index_of(&self, addr: &str) -> u16 {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        match nodes.iter().position(|n| n == addr) {
            Some(i) => i as u16,
            None => {
                nodes.push(addr.to_string());
                (nodes.len() - 1) as u16
            }
        }
    }

    /// Applies a `CLUSTER SLOTS` reply; returns false when it did not parse.
    fn apply(&self, reply: &Value) -> bool {
        let Value::Array(ranges) = reply else {
            return false;
        };
        for r in ranges {
            let Value::Array(fields) = r else {
                return false;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return false;
            };
            let host = match primary.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return false,
            };
            let Some(Value::Int(port)) = primary.get(1) else {
                return false;
            };
            let idx = self.index_of(&format!("{host}:{port}"));
            let (Ok(s), Ok(e)) = (usize::try_from(*start), usize::try_from(*end)) else {
                return false;
            };
            for slot in s..=e.min(SLOTS - 1) {
                self.slots[slot].store(idx, Ordering::Relaxed);
            }
        }
        true
    }
}

struct Inner {
    conn: ClusterConnection,
    engine: Engine,
    shards: ShardMap,
    refresh: Notify,
    seeds: Vec<String>,
}

/// The counter store on a Redis Cluster.
#[derive(Clone)]
pub struct RedisClusterStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClusterStore")
            .field("seeds", &self.inner.seeds)
            .field("engine", &self.inner.engine)
            .finish_non_exhaustive()
    }
}

impl RedisClusterStore {
    /// Builds the cluster client over the seed URLs (connections are made in the
    /// background), tries to load the scripts and the slot map once (failures are logged, not
    /// fatal), and starts the shard map refresher, which stops when the store is dropped.
    pub async fn connect(cfg: &RedisConfig) -> Result<RedisClusterStore, StoreError> {
        cfg.validate()?;
        let seeds: Vec<String> = cfg.urls.iter().map(|u| redact(u)).collect();
        // An attempt may only time out after the caller's deadline has passed: the client
        // re-sends a timed-out attempt while its caller still waits, and a script that ran but
        // answered late would then be charged twice. Once the caller's deadline drops the
        // request, the client retries nothing more.
        let attempt_timeout = cfg.timeout() * 2;
        let client = ClusterClientBuilder::new(cfg.urls.iter().map(String::as_str))
            .connection_timeout(cfg.connect_timeout())
            .response_timeout(attempt_timeout)
            .overall_response_timeout(Some(attempt_timeout))
            .retries(RETRIES)
            .min_retry_wait(1)
            .max_retry_wait(cfg.timeout_ms.max(2))
            .build()
            .map_err(|e| bad_url(&cfg.urls.join(","), &e))?;
        let conn = client.get_pending_async_connection_with_config(
            redis::cluster::ClusterConfig::new()
                .set_connection_timeout(cfg.connect_timeout())
                .set_response_timeout(attempt_timeout),
        );
        let inner = Arc::new(Inner {
            conn,
            engine: Engine::new(cfg),
            shards: ShardMap::new(),
            refresh: Notify::new(),
            seeds,
        });
        let store = RedisClusterStore { inner };
        let mut c = store.inner.conn.clone();
        if let Err(e) = store.inner.engine.preload(&mut c).await {
            tracing::warn!(seeds = ?store.inner.seeds, error = %e, "redis cluster not reachable at start; will retry on use");
        }
        Self::refresh_once(&store.inner).await;
        tokio::spawn(Self::refresher(Arc::downgrade(&store.inner)));
        Ok(store)
    }

    async fn refresh_once(inner: &Inner) -> bool {
        let mut conn = inner.conn.clone();
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let fut = cmd.query_async::<Value>(&mut conn);
        match tokio::time::timeout(Duration::from_millis(500), fut).await {
            Ok(Ok(v)) => inner.shards.apply(&v),
            _ => false,
        }
    }

    async fn refresher(weak: Weak<Inner>) {
        loop {
            let Some(inner) = weak.upgrade() else { return };
            tokio::select! {
                _ = tokio::time::sleep(REFRESH_EVERY) => {}
                _ = inner.refresh.notified() => {}
            }
            if !Self::refresh_once(&inner).await {
                tracing::debug!("redis cluster: shard map refresh failed");
            }
            drop(inner);
            tokio::time::sleep(REFRESH_MIN_GAP).await;
        }
    }

    /// Node addresses by shard index, as [`Store::shard_of`] numbers them.
    pub fn shard_nodes(&self) -> Vec<String> {
        self.inner
            .shards
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Refreshes the shard map now (tests, admin); false when `CLUSTER SLOTS` failed.
    pub async fn refresh_shards(&self) -> bool {
        Self::refresh_once(&self.inner).await
    }

    /// How many times a node answered `NOSCRIPT` (a new primary after failover or resharding,
    /// a restart) and the script was reloaded: a metric.
    pub fn noscript_reloads(&self) -> u64 {
        self.inner.engine.noscript_reloads()
    }

    fn after<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if matches!(r, Err(StoreError::Unavailable(_) | StoreError::Timeout(_))) {
            self.inner.refresh.notify_one();
        }
        r
    }
}

impl Store for RedisClusterStore {
    fn noscript_reloads(&self) -> u64 {
        self.inner.engine.noscript_reloads()
    }

    fn check<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<CallResult, StoreError>> {
        Box::pin(async move {
            let mut conn = self.inner.conn.clone();
            let r = self.inner.engine.check(&mut conn, call).await;
            self.after(r)
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        request_id: &'a str,
        now: Micros,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut conn = self.inner.conn.clone();
            let r = self
                .inner
                .engine
                .release(&mut conn, key, request_id, now)
                .await;
            self.after(r)
        })
    }

    fn shard_of(&self, key: &str) -> usize {
        usize::from(self.inner.shards.slots[usize::from(key_slot(key))].load(Ordering::Relaxed))
    }

    fn kind(&self) -> &'static str {
        "redis_cluster"
    }
}
