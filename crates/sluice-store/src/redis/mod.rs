//! The Redis stores: a fleet of daemons sharing one exact count per key.
//!
//! Every call runs `lua/check.lua` by `EVALSHA` (reloaded by `EVAL` when a restarted or
//! failed-over Redis answers `NOSCRIPT`; releases and give-backs run `lua/release.lua` and
//! `lua/give_back.lua` the same way), over one multiplexed connection per node that
//! pipelines concurrent calls; the standalone store also groups calls that queue behind
//! the runs in flight into one script run (see `standalone.rs`). The arithmetic is the core's, transcribed into Lua and held to
//! it by the differential test; this module only moves calls and replies and classifies
//! failures. Key layout, the clock decision, timeouts and memory per key: `docs/redis.md`.
//!
//! # Layout
//!
//! - [`RedisConfig`] and [`connect`]: what the daemon calls at start.
//! - [`RedisStore`]: one standalone Redis (or a primary behind a proxy/sentinel address).
//! - [`RedisClusterStore`]: a Redis Cluster, routed by this store from its own slot map: one
//!   connection per node, each call sent to the node owning its slot, MOVED/ASK/TRYAGAIN
//!   followed within the call's deadline, so one failed node never holds up the others.
//! - [`item_keys`] / [`key_slot`]: the keys an item touches and their Cluster slot.
//!
//! # Start-up
//!
//! [`connect`] makes no connection it waits for; [`Store::warm_up`] does: it connects, loads
//! the scripts and runs one call of each script (per node on a Cluster) with a start-up
//! budget, so that the first checks a daemon serves meet the hot path's few-ms deadline.

mod cluster;
mod script;
mod slot;
mod stale;
mod standalone;

pub use cluster::RedisClusterStore;
pub use script::{
    CHECK_SCRIPT, GIVE_BACK_SCRIPT, RELEASE_SCRIPT, ScriptCall, decode_check, decode_give_back,
    encode_check, encode_give_back, item_keys, script_sha,
};
pub use slot::key_slot;
pub use standalone::RedisStore;

use crate::{Store, StoreError};
use redis::aio::ConnectionLike;
use script::{Script, classify, decode_release};
use sluice_core::algo::Window;
use sluice_core::batch::{Call, CallResult, GiveBack, Item};
use sluice_core::time::SECOND;
use sluice_core::{Micros, Params, Rate, Remote};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How to reach Redis. The daemon maps its `store:` config and `--redis` flags onto it.
///
/// AUTH and TLS come through the URL (`redis://user:pass@host:6379/0`, `rediss://` for TLS,
/// verified against the system's roots or [`RedisTlsConfig::ca_file`]: see `docs/tls.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// One URL for a standalone Redis; the seed nodes of a Cluster.
    pub urls: Vec<String>,
    /// Whether `urls` are Redis Cluster seed nodes.
    pub cluster: bool,
    /// Deadline of one store call, whole (the hot path's budget, not a per-attempt figure).
    pub timeout_ms: u64,
    /// Deadline of establishing one connection.
    pub connect_timeout_ms: u64,
    /// How long after a call's `now` Redis may still run it (see `stale.rs`): `None` is
    /// the call deadline (`timeout_ms`), `Some(0)` turns the bound off. Above the clock skew
    /// between daemons and Redis, or skewed calls cost a second round trip.
    pub stale_after_ms: Option<u64>,
    /// Trust and client certificate for `rediss://` URLs (every Cluster node alike).
    pub tls: RedisTlsConfig,
}

/// The files a `rediss://` connection uses beyond the URL. All optional: with none, the
/// server certificate is verified against the system's roots and no client certificate is
/// sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTlsConfig {
    /// PEM CA certificates to verify the server with, instead of the system's roots (a
    /// private CA, as Redis deployments usually have).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for a Redis with `tls-auth-clients yes`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl RedisTlsConfig {
    /// The certificates the redis crate takes, read from the files; `None` when no file is
    /// set (the crate's defaults apply). A missing or unreadable file is a configuration
    /// error, reported at start.
    pub(crate) fn certificates(&self) -> Result<Option<redis::TlsCertificates>, StoreError> {
        let read = |p: &PathBuf| {
            std::fs::read(p)
                .map_err(|e| StoreError::Server(format!("redis: reading {}: {e}", p.display())))
        };
        let client_tls = match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
                client_cert: read(c)?,
                client_key: read(k)?,
            }),
            (None, None) => None,
            _ => {
                return Err(StoreError::Server(
                    "redis: tls cert_file and key_file go together".into(),
                ));
            }
        };
        let root_cert = self.ca_file.as_ref().map(read).transpose()?;
        if client_tls.is_none() && root_cert.is_none() {
            return Ok(None);
        }
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

/// A client for `info`: with the TLS files when the address is TLS and files are set, so the
/// standalone store and every Cluster node connect alike.
pub(crate) fn client_for(
    info: redis::ConnectionInfo,
    certs: Option<&redis::TlsCertificates>,
) -> redis::RedisResult<redis::Client> {
    match (info.addr(), certs) {
        (redis::ConnectionAddr::TcpTls { .. }, Some(c)) => {
            redis::Client::build_with_tls(info, c.clone())
        }
        _ => redis::Client::open(info),
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            urls: vec!["redis://127.0.0.1:6379/".to_string()],
            cluster: false,
            timeout_ms: 3,
            connect_timeout_ms: 100,
            stale_after_ms: None,
            tls: RedisTlsConfig::default(),
        }
    }
}

impl RedisConfig {
    /// A standalone config for `url` with the default timeouts.
    pub fn standalone(url: impl Into<String>) -> RedisConfig {
        RedisConfig {
            urls: vec![url.into()],
            ..RedisConfig::default()
        }
    }

    /// A Cluster config for the seed `urls` with the default timeouts.
    pub fn cluster(urls: impl IntoIterator<Item = impl Into<String>>) -> RedisConfig {
        RedisConfig {
            urls: urls.into_iter().map(Into::into).collect(),
            cluster: true,
            ..RedisConfig::default()
        }
    }

    fn validate(&self) -> Result<(), StoreError> {
        if self.urls.is_empty() {
            return Err(StoreError::Server("redis: no URL configured".into()));
        }
        if !self.cluster && self.urls.len() > 1 {
            return Err(StoreError::Server(format!(
                "redis: {} URLs given for a standalone Redis; set cluster for seed nodes",
                self.urls.len()
            )));
        }
        if self.timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return Err(StoreError::Server(
                "redis: timeout_ms and connect_timeout_ms must be at least 1".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

/// What one step of a warm-up may take beyond the connection's own set-up: a round trip at a
/// start's pace (a busy machine, a cold Redis), not the hot path's few ms.
const WARM_UP_SLACK: Duration = Duration::from_millis(500);

/// The hash tag of the warm-up calls' keys: no rule's key has it (a rule's tag holds its
/// domain and descriptors separated by `|`), and the calls only peek (cost 0).
pub(crate) const WARM_UP_TAG: &str = "sluice.warm-up";

/// Builds the store the config names: [`RedisStore`] for one URL, [`RedisClusterStore`] when
/// `cluster` is set.
///
/// Fails only on a configuration that can never work (no URL, an unparsable URL, a zero
/// timeout). A Redis that is down at start is not an error: connections are made lazily and
/// re-made in the background, calls fail with [`StoreError::Unavailable`] / `Timeout` until
/// it answers, and each rule's `on_store_failure` decides meanwhile. Must be called inside a
/// tokio runtime.
pub async fn connect(cfg: &RedisConfig) -> Result<Arc<dyn Store>, StoreError> {
    if cfg.cluster {
        Ok(Arc::new(RedisClusterStore::connect(cfg).await?))
    } else {
        Ok(Arc::new(RedisStore::connect(cfg).await?))
    }
}

/// What both stores share: the scripts, the deadline, the NOSCRIPT counter.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) check: Script,
    pub(crate) release: Script,
    pub(crate) give_back: Script,
    pub(crate) timeout: Duration,
    pub(crate) timeout_ms: u64,
    /// The budget of one warm-up step: a connection's set-up (two attempts, as the connection
    /// manager makes them) and a start's round trip.
    pub(crate) warm_up: Duration,
    /// The stale bound and the late-reply counters.
    pub(crate) staleness: stale::Staleness,
    noscript: AtomicU64,
}

impl Engine {
    pub(crate) fn new(cfg: &RedisConfig) -> Engine {
        Engine {
            check: Script::new(CHECK_SCRIPT),
            release: Script::new(RELEASE_SCRIPT),
            give_back: Script::new(GIVE_BACK_SCRIPT),
            timeout: cfg.timeout(),
            timeout_ms: cfg.timeout_ms,
            warm_up: cfg.connect_timeout() * 2 + WARM_UP_SLACK,
            staleness: stale::Staleness::new(cfg.stale_after_ms.unwrap_or(cfg.timeout_ms)),
            noscript: AtomicU64::new(0),
        }
    }

    pub(crate) fn noscript_reloads(&self) -> u64 {
        self.noscript.load(Ordering::Relaxed)
    }

    /// Records one `NOSCRIPT` answer (the metric), before the caller re-sends by `EVAL`.
    pub(crate) fn count_noscript(&self) {
        self.noscript.fetch_add(1, Ordering::Relaxed);
        tracing::info!("redis answered NOSCRIPT; reloading the script by EVAL");
    }

    /// `EVALSHA`, and on `NOSCRIPT` one `EVAL` of the body (which also caches it on that node),
    /// all within the call's deadline.
    pub(crate) async fn eval<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<redis::Value, StoreError> {
        self.eval_within(self.timeout, conn, script, keys, args)
            .await
    }

    /// [`Engine::eval`] within `deadline` instead of the call deadline (the warm-up's).
    pub(crate) async fn eval_within<C: ConnectionLike + Send>(
        &self,
        deadline: Duration,
        conn: &mut C,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<redis::Value, StoreError> {
        let cmd = |verb: &str, script_arg: &str| {
            let mut c = redis::cmd(verb);
            c.arg(script_arg).arg(keys.len()).arg(keys).arg(args);
            c
        };
        let attempt = async {
            match cmd("EVALSHA", &script.sha).query_async(conn).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    self.count_noscript();
                    cmd("EVAL", script.body).query_async(conn).await
                }
                other => other,
            }
        };
        match tokio::time::timeout(deadline, attempt).await {
            Err(_) => Err(StoreError::Timeout(deadline.as_millis() as u64)),
            Ok(Err(e)) => Err(classify(&e, keys, self.timeout_ms)),
            Ok(Ok(v)) => Ok(v),
        }
    }

    /// Warms one node up over `conn` (see [`Store::warm_up`]): waits for its connection
    /// (`PING`: the set-up, AUTH and the client's own first commands), loads the scripts and
    /// runs [`warm_up_calls`], [`warm_up_release`] and [`warm_up_give_back`] under the `{tag}`
    /// hash tag (none without
    /// a tag: a Cluster node without a known slot), each step within [`Engine::warm_up`]. The
    /// first error is returned; a retry starts over.
    pub(crate) async fn warm_up<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        tag: Option<&str>,
    ) -> Result<(), StoreError> {
        let ping = redis::cmd("PING");
        match tokio::time::timeout(self.warm_up, ping.query_async::<String>(conn)).await {
            Err(_) => return Err(StoreError::Timeout(self.warm_up.as_millis() as u64)),
            Ok(Err(e)) => return Err(classify(&e, &[], self.timeout_ms)),
            Ok(Ok(_)) => {}
        }
        self.preload(conn).await?;
        let Some(tag) = tag else {
            return Ok(());
        };
        let now = epoch_micros();
        for call in warm_up_calls(tag, now) {
            let enc = encode_check(&call)?;
            let reply = self
                .eval_within(self.warm_up, conn, &self.check, &enc.keys, &enc.args)
                .await?;
            decode_check(&call, &reply)?;
        }
        let req = warm_up_release(tag, now)?;
        let reply = self
            .eval_within(self.warm_up, conn, &self.release, &req.keys, &req.args)
            .await?;
        decode_release(&reply)?;
        let req = encode_give_back(&warm_up_give_back(tag, now))?;
        let reply = self
            .eval_within(self.warm_up, conn, &self.give_back, &req.keys, &req.args)
            .await?;
        decode_give_back(&reply).map(|_| ())
    }

    /// Loads every script on one node so the first calls need no `EVAL` fallback.
    pub(crate) async fn preload<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> Result<(), StoreError> {
        for s in [&self.check, &self.release, &self.give_back] {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(s.body);
            let fut = cmd.query_async::<String>(conn);
            match tokio::time::timeout(self.timeout.max(Duration::from_millis(500)), fut).await {
                Err(_) => return Err(StoreError::Timeout(self.timeout_ms)),
                Ok(Err(e)) => return Err(classify(&e, &[], self.timeout_ms)),
                Ok(Ok(_)) => {}
            }
        }
        Ok(())
    }
}

/// Now, in epoch microseconds, for the warm-up calls (the daemon's calls carry their own).
pub(crate) fn epoch_micros() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as Micros)
}

/// The check calls of a warm-up, on keys under the `{tag}` hash tag: peeks (cost 0: nothing
/// is taken, a lone fixed window writes nothing) at one fixed window, answered by its count
/// (the common call's reply), and at a fixed window and a token bucket together, answered by
/// outcome arrays, so both reply forms have been run and decoded once.
pub(crate) fn warm_up_calls(tag: &str, now: Micros) -> [Call; 2] {
    let item = |suffix: &str, params: Params| Item {
        key: format!("sl:{{{tag}}}:{suffix}"),
        params,
        enforce: true,
        charge_rejected: false,
        remote: Remote::default(),
    };
    let window = || {
        item(
            "w",
            Params::FixedWindow {
                limit: 1,
                window: Window::Epoch(SECOND),
            },
        )
    };
    let bucket = item(
        "b",
        Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 1,
        },
    );
    let call = |items| Call {
        now,
        cost: 0,
        request_id: "warm-up".to_string(),
        items,
    };
    [call(vec![window()]), call(vec![window(), bucket])]
}

/// The release call of a warm-up: a slot nobody holds, under the `{tag}` hash tag.
pub(crate) fn warm_up_release(tag: &str, now: Micros) -> Result<ScriptCall, StoreError> {
    release_request(&format!("sl:{{{tag}}}:c"), "warm-up", now)
}

/// The give-back of a warm-up: to a bucket nobody has, under the `{tag}` hash tag (nothing
/// to give back to: it writes nothing).
pub(crate) fn warm_up_give_back(tag: &str, now: Micros) -> GiveBack {
    GiveBack {
        key: format!("sl:{{{tag}}}:g"),
        params: Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 1,
        },
        units: 1,
        taken_at: now,
        now,
    }
}

/// The `EVALSHA` of a check bounded by `stale_at` (0: unbounded), or `None` for a call
/// without items (nothing to ask Redis).
pub(crate) fn check_request(
    call: &Call,
    stale_at: Micros,
) -> Result<Option<ScriptCall>, StoreError> {
    if call.items.is_empty() {
        return Ok(None);
    }
    encode_check(call).map(|c| Some(c.stale_after(stale_at)))
}

/// A check sent by `send` under the call's stale bound, decoded. A call refused by its bound
/// while still awaited says the clocks disagree (`stale.rs`): it is sent once more, unbounded,
/// so skew costs a round trip and never an answer.
pub(crate) async fn check_bounded<F, Fut>(
    engine: &Engine,
    call: &Call,
    send: F,
) -> Result<CallResult, StoreError>
where
    F: Fn(ScriptCall) -> Fut,
    Fut: std::future::Future<Output = Result<redis::Value, StoreError>>,
{
    let stale = &engine.staleness;
    let Some(enc) = check_request(call, stale.bound(call.now))? else {
        return Ok(nothing_to_check());
    };
    let reply = match send(enc).await {
        Err(StoreError::Stale { late_us }) => {
            stale.skewed(late_us);
            match check_request(call, 0)? {
                Some(enc) => send(enc).await?,
                None => return Ok(nothing_to_check()),
            }
        }
        other => other?,
    };
    decode_check(call, &reply)
}

/// A release of one concurrency key sent by `send` (the `EVALSHA` of `lua/release.lua`, the
/// way the store sends a script), decoded: whether the key held `request_id`.
pub(crate) async fn release_with<F, Fut>(
    key: &str,
    request_id: &str,
    now: Micros,
    send: F,
) -> Result<bool, StoreError>
where
    F: FnOnce(ScriptCall) -> Fut,
    Fut: std::future::Future<Output = Result<redis::Value, StoreError>>,
{
    let req = release_request(key, request_id, now)?;
    let reply = send(req).await?;
    decode_release(&reply)
}

/// A give-back sent by `send` (the `EVALSHA` of `lua/give_back.lua`, the way the store sends
/// a script), decoded: whether it wrote. An algorithm that cannot be leased, or numbers the
/// script cannot hold, are refused before anything is sent.
///
/// No stale bound, unlike a check: a give-back that runs after its caller gave up returns
/// units that were really left, computed at the caller's `now` (a window that ended by then
/// is a window that ended at `now`, never a later one). What a late run must never meet is a
/// second copy of itself, and the store sends each give-back once (`Store::give_back`).
pub(crate) async fn give_back_with<F, Fut>(g: &GiveBack, send: F) -> Result<bool, StoreError>
where
    F: FnOnce(ScriptCall) -> Fut,
    Fut: std::future::Future<Output = Result<redis::Value, StoreError>>,
{
    let req = encode_give_back(g)?;
    let reply = send(req).await?;
    decode_give_back(&reply)
}

/// The answer to a call without items: allowed, no outcomes.
pub(crate) fn nothing_to_check() -> CallResult {
    CallResult {
        allowed: true,
        outcomes: Vec::new(),
    }
}

/// The `EVALSHA` of `lua/release.lua` for one concurrency key.
pub(crate) fn release_request(
    key: &str,
    request_id: &str,
    now: Micros,
) -> Result<ScriptCall, StoreError> {
    if now > script::MAX_EXACT {
        return Err(StoreError::Server(format!("now = {now} exceeds 2^53")));
    }
    Ok(ScriptCall {
        keys: vec![key.to_string()],
        args: vec![now.to_string(), request_id.to_string()],
    })
}

/// A URL's parse error is permanent configuration trouble.
pub(crate) fn bad_url(url: &str, e: &redis::RedisError) -> StoreError {
    StoreError::Server(format!("redis: bad URL {}: {e}", redact(url)))
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}
