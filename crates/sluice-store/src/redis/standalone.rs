//! [`RedisStore`]: one standalone Redis over one multiplexed connection.
//!
//! The redis crate's `ConnectionManager` wraps a `MultiplexedConnection`: every concurrent
//! call is written to the one socket as it comes (pipelined), replies are matched in order,
//! and a dropped connection is re-made in the background while calls fail fast. Its own
//! defaults (500 ms response, 1 s connect, 6 retries) are replaced by Sluice's few-ms figures.

use super::{Engine, RedisConfig, bad_url, redact};
use crate::{BoxFuture, Store, StoreError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sluice_core::Micros;
use sluice_core::batch::{Call, CallResult};
use std::time::Duration;

/// Commands that may wait in the multiplexer's queue before callers block: the daemon runs
/// hundreds of concurrent checks, the crate's default of 50 would make them queue.
const PIPELINE_BUFFER: usize = 4096;

/// The counter store on one standalone Redis.
pub struct RedisStore {
    conn: ConnectionManager,
    engine: Engine,
    url: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects lazily to `cfg.urls[0]` and tries to load the scripts once (a failure there is
    /// logged, not fatal: see [`super::connect`]).
    pub async fn connect(cfg: &RedisConfig) -> Result<RedisStore, StoreError> {
        cfg.validate()?;
        if cfg.cluster {
            return Err(StoreError::Server(
                "redis: RedisStore is standalone; use RedisClusterStore for a cluster".into(),
            ));
        }
        let url = &cfg.urls[0];
        let client = redis::Client::open(url.as_str()).map_err(|e| bad_url(url, &e))?;
        let mgr_cfg = ConnectionManagerConfig::new()
            .set_response_timeout(Some(cfg.timeout()))
            .set_connection_timeout(Some(cfg.connect_timeout()))
            // A reconnect retries once, quickly; calls meanwhile fail at their deadline and the
            // next call after a failure starts a new attempt.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(5))
            .set_max_delay(Duration::from_millis(50))
            .set_pipeline_buffer_size(PIPELINE_BUFFER);
        let conn = ConnectionManager::new_lazy_with_config(client, mgr_cfg)
            .map_err(|e| bad_url(url, &e))?;
        let store = RedisStore {
            conn,
            engine: Engine::new(cfg),
            url: redact(url),
        };
        let mut c = store.conn.clone();
        if let Err(e) = store.engine.preload(&mut c).await {
            tracing::warn!(url = %store.url, error = %e, "redis not reachable at start; will retry on use");
        }
        Ok(store)
    }

    /// How many times a Redis answered `NOSCRIPT` (restart, failover, `SCRIPT FLUSH`) and the
    /// script was reloaded: a metric.
    pub fn noscript_reloads(&self) -> u64 {
        self.engine.noscript_reloads()
    }
}

impl Store for RedisStore {
    fn noscript_reloads(&self) -> u64 {
        self.engine.noscript_reloads()
    }

    fn check<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<CallResult, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            self.engine.check(&mut conn, call).await
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        request_id: &'a str,
        now: Micros,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            self.engine.release(&mut conn, key, request_id, now).await
        })
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}
