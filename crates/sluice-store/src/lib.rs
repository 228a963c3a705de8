//! Counter stores: where the state of every (rule, identity) lives.
//!
//! A store answers one [`Call`] (every rule of one identity) atomically: it runs the core's
//! [`sluice_core::batch::apply`] over the current states and writes the result back, under a
//! shard lock in memory or inside one Lua script in Redis. Stores never decide anything of
//! their own; the arithmetic is the core's.
//!
//! # Layout
//!
//! - [`Store`]: the async seam the daemon calls, object-safe so the store is chosen at start.
//! - [`memory`]: the sharded in-memory store (the embedded default, local buckets, the sim).
//! - [`redis`] (feature `redis`): standalone and Cluster stores running `lua/`.
//! - [`StoreError`]: failures, classified retryable or permanent.

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{RedisClusterStore, RedisConfig, RedisStore};

use sluice_core::Micros;
use sluice_core::batch::{Call, CallResult, GiveBack};
use std::future::Future;
use std::pin::Pin;

/// A boxed future, so [`Store`] can be used as `dyn Store`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a store call failed. Being over a limit is not an error: it is an outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The call did not answer within its deadline.
    #[error("store call timed out after {0} ms")]
    Timeout(u64),
    /// The store could not be reached (connection refused, reset, breaker open).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A key holds something that is not this algorithm's state.
    #[error("corrupt state at {key}: {detail}")]
    Corrupt {
        /// The key.
        key: String,
        /// What was wrong.
        detail: String,
    },
    /// The store answered with an error (script error, wrong type, OOM).
    #[error("store error: {0}")]
    Server(String),
    /// The store is at its key bound and may not take a new key.
    #[error("store full: {0}")]
    Full(String),
    /// The call reached the store after its stale bound and was not run: nothing changed.
    /// Seen by a caller still waiting, it means the daemon's clock and the store's disagree
    /// by more than the bound (or the daemon was slow to send), not an outage.
    #[error("store refused a stale call, {late_us} us past its bound (nothing changed)")]
    Stale {
        /// How far past the bound the store ran it, by the store's clock.
        late_us: u64,
    },
}

impl StoreError {
    /// Whether trying again later may succeed (a timeout, an outage) as opposed to a
    /// permanent problem with the data or the request.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout(_)
                | StoreError::Unavailable(_)
                | StoreError::Full(_)
                | StoreError::Stale { .. }
        )
    }

    /// Whether the error says the store (or its shard) is struggling or gone, which is what a
    /// circuit breaker counts. Corrupt state and a refused argument are problems of one key or
    /// one request: the store answered, so they never open a breaker for every other caller.
    pub fn is_outage(&self) -> bool {
        self.retryable() && !matches!(self, StoreError::Stale { .. })
    }

    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Corrupt { .. } => "corrupt",
            StoreError::Server(_) => "server",
            StoreError::Full(_) => "full",
            StoreError::Stale { .. } => "stale",
        }
    }
}

/// A give-back for an algorithm no lease can be taken from: the caller's mistake, permanent
/// (every store refuses it alike).
pub(crate) fn not_leasable(g: &GiveBack) -> StoreError {
    StoreError::Server(format!(
        "give-back to {}: {} cannot be leased",
        g.key,
        g.params.kind().name()
    ))
}

/// What became of store calls whose callers had already given up (a deadline passed), and
/// of calls refused as stale while their callers still waited. All zero for a store that
/// answers in the caller's own task (memory). See `redis/stale.rs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LateReplies {
    /// Run by the store after the caller gave up: they may have taken units the caller's
    /// answer never reported.
    pub ran: u64,
    /// Refused by the store's stale bound: nothing changed.
    pub stale: u64,
    /// No reply ever came (connection lost, the reply wait ran out): outcome unknown.
    pub lost: u64,
    /// Refused as stale while the caller still waited (clock skew), then re-sent unbounded.
    pub skewed: u64,
}

/// The async seam between the daemon and a counter store.
pub trait Store: Send + Sync + 'static {
    /// Checks every item of the call and takes from all when every enforced item allows.
    fn check<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<CallResult, StoreError>>;

    /// Frees a concurrency slot; `Ok(true)` when the id held one.
    fn release<'a>(
        &'a self,
        key: &'a str,
        request_id: &'a str,
        now: Micros,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Gives back units a lease took by a check and did not spend ([`GiveBack`], applied by
    /// the core's [`sluice_core::algo::give_back`] atomically on the key's state).
    /// `Ok(true)` when the state was written, `Ok(false)` when there was nothing to give
    /// back to (no state, or the window the units counted in has ended).
    ///
    /// Not on the hot path, but bounded by the store's call deadline like a check, and never
    /// in a check's way. Not idempotent: a give-back that failed (a timeout may have run) must
    /// not be sent again, or the units could come back twice and admit past the limit;
    /// dropping it loses them, the safe side. An algorithm that cannot be leased
    /// ([`sluice_core::algo::Kind::leasable`]) is refused as an error.
    ///
    /// The default refuses: a test double need not implement it, and a store that did not
    /// says so instead of dropping units silently.
    fn give_back<'a>(&'a self, g: &'a GiveBack) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = g;
        Box::pin(std::future::ready(Err(StoreError::Server(format!(
            "the {} store cannot give units back",
            self.kind()
        )))))
    }

    /// Whether calls can fail because the store is down or slow (a network store). A store
    /// without outages (in memory, in the daemon) is never put behind a circuit breaker:
    /// there is nothing to protect, and a breaker shared by every rule would turn one rule's
    /// bad key into refusals for all.
    fn outages(&self) -> bool {
        true
    }

    /// The shard (Redis node) a key lives on, for per-shard circuit breakers.
    fn shard_of(&self, _key: &str) -> usize {
        0
    }

    /// A short name for logs and metrics (`memory`, `redis`, `redis_cluster`).
    fn kind(&self) -> &'static str;

    /// Makes the store able to answer within its deadline before the daemon says it is
    /// ready: the first call over a new connection pays for the connection's set-up and for
    /// every first-time step (script cache, code paths), which can take longer than a few-ms
    /// deadline and would turn the first checks after a start into failures. A Redis store
    /// connects, loads its scripts and runs one call of each on every node; `Ok` at once where
    /// there is nothing to set up. A retryable error means "not yet": call it again later.
    fn warm_up(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    /// Scripts reloaded after `NOSCRIPT` (a restarted or failed-over Redis), for metrics.
    fn noscript_reloads(&self) -> u64 {
        0
    }

    /// Late replies so far, for metrics (see [`LateReplies`]).
    fn late_replies(&self) -> LateReplies {
        LateReplies::default()
    }

    /// Script runs made and the calls they carried (a batching store carries several per
    /// run), for metrics: calls / runs is the mean batch. `(0, 0)` where nothing batches.
    fn batch_stats(&self) -> (u64, u64) {
        (0, 0)
    }
}
