//! [`RedisStore`]: one standalone Redis over one multiplexed connection.
//!
//! The redis crate's `ConnectionManager` wraps a `MultiplexedConnection`: every concurrent
//! call is written to the one socket as it comes (pipelined), replies are matched in order,
//! and a dropped connection is re-made in the background while calls fail fast. Its own
//! defaults (500 ms response, 1 s connect, 6 retries) are replaced by Sluice's few-ms figures.
//!
//! Checks go through a batcher: while [`IN_FLIGHT`] script runs are already on their way,
//! further calls wait in a queue and leave together, as one `EVALSHA` carrying them all
//! (`lua/check.lua`'s batch form). A lone call leaves at once, as before; under load each
//! call costs Redis a fraction of a script invocation (the script's setup and the command's
//! dispatch are paid once a batch), which is what lets one daemon pass an unpipelined
//! client's throughput on the same Redis. Each call stays atomic, keeps its own deadline
//! (a call whose caller gave up is dropped before it is sent) and gets its own answer: an
//! error in one call is that call's error only. A Cluster cannot batch different identities
//! (different slots), so [`super::RedisClusterStore`] sends one call per script run.

use super::script::{ScriptCall, classify_text};
use super::{
    Engine, RedisConfig, bad_url, check_bounded, client_for, give_back_with, redact, release_with,
};
use crate::{BoxFuture, Store, StoreError};
use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sluice_core::Micros;
use sluice_core::batch::{Call, CallResult, GiveBack};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Commands that may wait in the multiplexer's queue before callers block: the daemon runs
/// hundreds of concurrent checks, the crate's default of 50 would make them queue.
const PIPELINE_BUFFER: usize = 4096;

/// Script runs on their way at once; further calls queue and leave as one batch. Enough to
/// keep Redis busy across the loopback round trip, few enough that batches form under load.
pub const IN_FLIGHT: usize = 4;
/// Most calls in one batch: bounds one script run (and so the wait of the calls behind it)
/// to well under a millisecond of Redis time.
pub const MAX_BATCH: usize = 64;
/// How long a script run waits for Redis's reply, its slot held, after its callers have
/// given up (they answer at their own few-ms deadline). Holding the slot is what stops a
/// stalled Redis from collecting a backlog: a paused server gets [`IN_FLIGHT`] runs, not one
/// per deadline. Past it the run is abandoned and its calls count as `lost`; a reply that
/// long late would be refused by its stale bound anyway.
const REPLY_WAIT: Duration = Duration::from_secs(30);
/// Calls that may wait for the batcher; beyond it callers wait (and time out at their
/// deadline) instead of growing the queue.
const QUEUE: usize = 8192;

/// One call waiting for the batcher.
struct Job {
    call: ScriptCall,
    reply: oneshot::Sender<Result<redis::Value, StoreError>>,
}

/// Calls and script runs the batcher made: calls / runs is the mean batch size.
#[derive(Debug, Default)]
struct BatchStats {
    runs: AtomicU64,
    calls: AtomicU64,
}

impl BatchStats {
    /// One script run carrying `calls` calls.
    fn count(&self, calls: usize) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.calls.fetch_add(calls as u64, Ordering::Relaxed);
    }
}

/// The counter store on one standalone Redis.
pub struct RedisStore {
    conn: ConnectionManager,
    engine: Arc<Engine>,
    url: String,
    jobs: mpsc::Sender<Job>,
    slots: Arc<Semaphore>,
    stats: Arc<BatchStats>,
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
    /// logged, not fatal: see [`super::connect`]). [`Store::warm_up`] makes it ready to serve.
    pub async fn connect(cfg: &RedisConfig) -> Result<RedisStore, StoreError> {
        cfg.validate()?;
        if cfg.cluster {
            return Err(StoreError::Server(
                "redis: RedisStore is standalone; use RedisClusterStore for a cluster".into(),
            ));
        }
        let url = &cfg.urls[0];
        let certs = cfg.tls.certificates()?;
        let info = url
            .as_str()
            .into_connection_info()
            .map_err(|e| bad_url(url, &e))?;
        let client = client_for(info, certs.as_ref()).map_err(|e| bad_url(url, &e))?;
        let mgr_cfg = ConnectionManagerConfig::new()
            // Calls keep their own deadline; the connection waits as long as a run does.
            .set_response_timeout(Some(REPLY_WAIT))
            .set_connection_timeout(Some(cfg.connect_timeout()))
            // A reconnect retries once, quickly; calls meanwhile fail at their deadline and the
            // next call after a failure starts a new attempt.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(5))
            .set_max_delay(Duration::from_millis(50))
            .set_pipeline_buffer_size(PIPELINE_BUFFER);
        let conn = ConnectionManager::new_lazy_with_config(client, mgr_cfg)
            .map_err(|e| bad_url(url, &e))?;
        let engine = Arc::new(Engine::new(cfg));
        let stats = Arc::new(BatchStats::default());
        let (jobs, queue) = mpsc::channel(QUEUE);
        let slots = Arc::new(Semaphore::new(IN_FLIGHT));
        tokio::spawn(batcher(
            queue,
            conn.clone(),
            engine.clone(),
            slots.clone(),
            stats.clone(),
        ));
        let store = RedisStore {
            conn,
            engine,
            url: redact(url),
            jobs,
            slots,
            stats,
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

    /// Script runs and the calls they carried, since start: how much the batcher grouped.
    pub fn batch_stats(&self) -> (u64, u64) {
        (
            self.stats.runs.load(Ordering::Relaxed),
            self.stats.calls.load(Ordering::Relaxed),
        )
    }

    /// Sends the call at once when a slot is free and nobody queues (no wait for the
    /// batcher: an idle daemon's latency is the plain `EVALSHA`'s, run in the caller's own
    /// task); otherwise queues it for the next batch. Either way the script run holds its
    /// slot until Redis answers, however the caller ends (a direct run is [`Detached`]), so
    /// a caller that gives up at its deadline frees nothing: while Redis stalls no more than
    /// [`IN_FLIGHT`] runs are ever on the wire, and the late replies are counted (`stale.rs`).
    async fn queue_and_wait(&self, call: ScriptCall) -> Result<redis::Value, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job { call, reply };
        let direct = if self.jobs.capacity() == self.jobs.max_capacity() {
            self.slots.clone().try_acquire_owned().ok()
        } else {
            None
        };
        let queued = async {
            match direct {
                Some(slot) => {
                    self.stats.count(1);
                    let mut conn = self.conn.clone();
                    let engine = self.engine.clone();
                    Detached(Some(Box::pin(async move {
                        run_batch(&engine, &mut conn, vec![job]).await;
                        drop(slot);
                    })))
                    .await;
                }
                None => self.jobs.send(job).await.map_err(|_| {
                    StoreError::Unavailable("redis: the store is shutting down".into())
                })?,
            }
            answer
                .await
                .map_err(|_| StoreError::Unavailable("redis: the call was dropped".into()))?
        };
        // The deadline covers the wait for a slot and the batcher too.
        tokio::time::timeout(self.engine.timeout, queued)
            .await
            .map_err(|_| StoreError::Timeout(self.engine.timeout_ms))?
    }
}

/// A direct script run, driven by its caller's task (no task spawned per call on an idle
/// daemon's path: with the workers pinned to one CPU, one `bench/ab-redis.sh` run put a
/// spawn per call at +50 µs of p50), that outlives its caller: dropped before it ends (a deadline passed, the check was cancelled),
/// it is handed to the runtime to finish, its slot held until Redis answers.
struct Detached(Option<BoxFuture<'static, ()>>);

impl std::future::Future for Detached {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if let Some(run) = self.0.as_mut() {
            std::task::ready!(run.as_mut().poll(cx));
            self.0 = None;
        }
        std::task::Poll::Ready(())
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let (Some(run), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(run);
        }
    }
}

/// Forms batches: waits for a queued call, then for a slot of [`IN_FLIGHT`] (shared with
/// the callers' direct runs), then takes every call queued meanwhile (up to [`MAX_BATCH`])
/// and sends them as one script run. Ends when the store is dropped.
async fn batcher(
    mut queue: mpsc::Receiver<Job>,
    conn: ConnectionManager,
    engine: Arc<Engine>,
    slots: Arc<Semaphore>,
    stats: Arc<BatchStats>,
) {
    loop {
        let Some(first) = queue.recv().await else {
            return;
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut jobs = Vec::with_capacity(8);
        jobs.push(first);
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        // A caller past its deadline has its answer already (a timeout): not sending its
        // call keeps a slow Redis from also doing stale work.
        jobs.retain(|j| !j.reply.is_closed());
        if jobs.is_empty() {
            continue;
        }
        stats.count(jobs.len());
        let mut conn = conn.clone();
        let engine = engine.clone();
        tokio::spawn(async move {
            run_batch(&engine, &mut conn, jobs).await;
            drop(slot);
        });
    }
}

/// One script run for `jobs`: the plain form for one call, the batch form for more. Waits
/// for Redis's reply up to [`REPLY_WAIT`], past every caller's deadline: a reply nobody waits
/// for any more is still read, to count what became of the call.
async fn run_batch(engine: &Engine, conn: &mut ConnectionManager, mut jobs: Vec<Job>) {
    let answer = |job: Job, r: Result<redis::Value, StoreError>| {
        if let Err(r) = job.reply.send(r) {
            engine.staleness.late(&r);
        }
    };
    if jobs.len() == 1 {
        if let Some(job) = jobs.pop() {
            let r = engine
                .eval_within(
                    REPLY_WAIT,
                    conn,
                    &engine.check,
                    &job.call.keys,
                    &job.call.args,
                )
                .await;
            answer(job, r);
        }
        return;
    }
    let (keys, args, ends) = batch_form(&mut jobs);
    let e = match engine
        .eval_within(REPLY_WAIT, conn, &engine.check, &keys, &args)
        .await
    {
        Ok(redis::Value::Array(replies)) if replies.len() == jobs.len() => {
            let mut start = 0;
            for ((job, r), end) in jobs.into_iter().zip(replies).zip(ends) {
                let own = keys.get(start..end).unwrap_or_default();
                answer(job, one_reply(r, own));
                start = end;
            }
            return;
        }
        Ok(other) => StoreError::Server(format!(
            "unexpected reply from check.lua to a batch of {}: {other:?}",
            jobs.len()
        )),
        Err(e) => e,
    };
    // The run as a whole failed: every call of it did.
    for job in jobs {
        answer(job, Err(e.clone()));
    }
}

/// KEYS and ARGV of a batch: "B", the number of calls, then per call `"nk na"` (its key
/// count and argument count, one argument) and its arguments (see `lua/check.lua`). Keys and
/// arguments move into the batch; the third vector holds where each call's keys end in KEYS
/// (a call's error names its key).
fn batch_form(jobs: &mut [Job]) -> (Vec<String>, Vec<String>, Vec<usize>) {
    let nk: usize = jobs.iter().map(|j| j.call.keys.len()).sum();
    let na: usize = jobs.iter().map(|j| j.call.args.len() + 1).sum();
    let mut keys = Vec::with_capacity(nk);
    let mut args = Vec::with_capacity(na + 2);
    let mut ends = Vec::with_capacity(jobs.len());
    args.push("B".to_string());
    args.push(jobs.len().to_string());
    for j in jobs {
        args.push(super::script::joined(
            &[j.call.keys.len() as u64, j.call.args.len() as u64],
            12,
        ));
        keys.append(&mut j.call.keys);
        args.append(&mut j.call.args);
        ends.push(keys.len());
    }
    (keys, args, ends)
}

/// One call's part of a batch reply: its outcome array (or, for one fixed window, its count),
/// or a one-element array holding its error text.
fn one_reply(r: redis::Value, keys: &[String]) -> Result<redis::Value, StoreError> {
    if let redis::Value::Array(v) = &r
        && let [redis::Value::BulkString(text)] = v.as_slice()
    {
        return Err(classify_text(&String::from_utf8_lossy(text), keys));
    }
    Ok(r)
}

impl Store for RedisStore {
    fn noscript_reloads(&self) -> u64 {
        self.engine.noscript_reloads()
    }

    fn batch_stats(&self) -> (u64, u64) {
        RedisStore::batch_stats(self)
    }

    fn check<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<CallResult, StoreError>> {
        Box::pin(check_bounded(&self.engine, call, |enc| {
            self.queue_and_wait(enc)
        }))
    }

    fn late_replies(&self) -> crate::LateReplies {
        self.engine.staleness.snapshot()
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        request_id: &'a str,
        now: Micros,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(release_with(key, request_id, now, move |req| async move {
            let mut conn = self.conn.clone();
            let engine = &self.engine;
            engine
                .eval(&mut conn, &engine.release, &req.keys, &req.args)
                .await
        }))
    }

    /// Sent straight over the shared connection, like a release: never through the
    /// batcher or its [`IN_FLIGHT`] slots, so a give-back never holds up a check.
    fn give_back<'a>(&'a self, g: &'a GiveBack) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(give_back_with(g, move |req| async move {
            let mut conn = self.conn.clone();
            let engine = &self.engine;
            engine
                .eval(&mut conn, &engine.give_back, &req.keys, &req.args)
                .await
        }))
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn warm_up(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            self.engine
                .warm_up(&mut conn, Some(super::WARM_UP_TAG))
                .await
                .map_err(|e| {
                    tracing::debug!(url = %self.url, error = %e, "redis warm-up failed");
                    e
                })
        })
    }
}
