//! Rules from PostgreSQL: the daemon's side of the control plane.
//!
//! [`PgSource::start`] loads the whole rule set (validated by sluice-core, versioned by the
//! counter) and publishes it; if PostgreSQL is unreachable it starts from the disk snapshot
//! instead ([`crate::snapshot`]). [`PgSource::spawn`] then keeps it current:
//!
//! - **Push.** A dedicated connection `LISTEN`s on [`CHANNEL`]; every commit `NOTIFY`s, and
//!   the notification wakes the puller at once (a change is live in milliseconds).
//! - **Pull.** Every `poll` (30 s by default), and after every reconnect, the puller asks for
//!   "everything after version N" ([`pull_after`]). This is what makes a lost notification
//!   harmless: a `LISTEN` link can die silently, and `NOTIFY`s sent meanwhile are gone.
//! - **Atomic.** The records pulled are applied to a copy of the state, the whole set is
//!   validated, and only then swapped in with one [`Published::publish`]. A set that fails
//!   validation is not applied at all; the daemon keeps its last good set and reports the
//!   error in its status row.
//! - **Snapshot and status.** After each change the set is written to the rules cache, and
//!   the daemon's loaded version is upserted into `sluice_daemons` (also every
//!   `report_every`, as a heartbeat).
//!
//! Both connections reconnect with capped exponential backoff. The `LISTEN` connection may
//! use its own URL (`listen_url`), so queries can go through a transaction-mode pooler
//! (PgBouncer), which cannot carry `LISTEN`, while notifications come straight from the
//! server.

use crate::Published;
use crate::db::{self, CHANNEL, DbError, version_to};
use crate::model::State;
use crate::snapshot::Snapshot;
use crate::store::{load_current, pull_after};
use sluice_core::rules::RuleSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, Client, IsolationLevel};

/// How the daemon reaches PostgreSQL and how often it checks.
#[derive(Clone, Debug)]
pub struct PgConfig {
    /// Connection URL for queries (`postgres://user@host:5432/db`).
    pub url: String,
    /// Connection URL for `LISTEN`, when it must differ (a pooler in front of `url`).
    pub listen_url: Option<String>,
    /// Pull interval: the bound on how stale a daemon gets when notifications are lost.
    pub poll: Duration,
    /// Heartbeat interval of the status row.
    pub report_every: Duration,
    /// Where the last loaded set is kept on disk; `None` = no cache (a restart while
    /// PostgreSQL is down then has no rules and fails).
    pub cache: Option<PathBuf>,
    /// This daemon's id in `sluice_daemons`.
    pub daemon_id: String,
    /// This daemon's region.
    pub region: String,
    /// How long to wait for a connection before falling back or retrying.
    pub connect_timeout: Duration,
    /// Apply pending schema migrations on start.
    pub migrate: bool,
}

impl PgConfig {
    /// Defaults: pull every 30 s, heartbeat every 10 s, 3 s connect timeout, migrate on
    /// start, no cache.
    pub fn new(
        url: impl Into<String>,
        daemon_id: impl Into<String>,
        region: impl Into<String>,
    ) -> PgConfig {
        PgConfig {
            url: url.into(),
            listen_url: None,
            poll: Duration::from_secs(30),
            report_every: Duration::from_secs(10),
            cache: None,
            daemon_id: daemon_id.into(),
            region: region.into(),
            connect_timeout: Duration::from_secs(3),
            migrate: true,
        }
    }
}

/// A default daemon id: the host name, which is stable across restarts (a pod name on
/// Kubernetes), so a restarted daemon updates its own status row instead of adding one.
pub fn default_daemon_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "sluiced".to_string())
}

/// Why the source could not start.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The URL is malformed: a configuration error, permanent.
    #[error(transparent)]
    Config(DbError),
    /// Neither PostgreSQL nor the rules cache gave a valid set. Retryable: start again once
    /// PostgreSQL is reachable.
    #[error("no rules to serve: PostgreSQL: {pg}; rules cache: {cache}")]
    NoRules {
        /// Why PostgreSQL gave none.
        pg: String,
        /// Why the cache gave none.
        cache: String,
    },
}

/// Where the served set came from, as reported in the status row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Postgres,
    Snapshot,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Postgres => "postgres",
            Origin::Snapshot => "snapshot",
        }
    }
}

/// The PostgreSQL rule source of one daemon.
#[derive(Debug)]
pub struct PgSource {
    cfg: PgConfig,
    published: Arc<Published>,
    state: State,
    version: u64,
    instance: Option<String>,
    origin: Origin,
    last_error: Option<String>,
    started_at: f64,
}

impl PgSource {
    /// Loads the rule set from PostgreSQL (migrating first if configured), or from the
    /// rules cache when PostgreSQL cannot be reached, and publishes it.
    pub async fn start(cfg: PgConfig) -> Result<PgSource, SourceError> {
        let pg_cfg =
            db::config(&cfg.url, cfg.connect_timeout, "sluiced").map_err(SourceError::Config)?;
        if let Some(l) = &cfg.listen_url {
            db::config(l, cfg.connect_timeout, "sluiced").map_err(SourceError::Config)?;
        }
        let started_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let budget = cfg.connect_timeout * 3;
        let loaded = match tokio::time::timeout(budget, initial_load(&pg_cfg, cfg.migrate)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {}s", budget.as_secs())),
        };
        let (version, instance, state, set, origin) = match loaded {
            Ok((version, instance, state, set)) => {
                tracing::info!(
                    version,
                    rules = set.rule_count(),
                    "rules loaded from PostgreSQL"
                );
                (version, Some(instance), state, set, Origin::Postgres)
            }
            Err(pg) => {
                let Some(path) = &cfg.cache else {
                    return Err(SourceError::NoRules {
                        pg,
                        cache: "none configured (--rules-cache)".into(),
                    });
                };
                let snap = Snapshot::read(path).map_err(|e| SourceError::NoRules {
                    pg: pg.clone(),
                    cache: e.to_string(),
                })?;
                let state = snap.state();
                let set = state
                    .to_rule_set(snap.version)
                    .map_err(|e| SourceError::NoRules {
                        pg: pg.clone(),
                        cache: format!("{} holds an invalid set: {e}", path.display()),
                    })?;
                tracing::warn!(
                    version = snap.version,
                    rules = set.rule_count(),
                    cache = %path.display(),
                    error = %pg,
                    "PostgreSQL unreachable; serving the rules cache until it is back"
                );
                (
                    snap.version,
                    Some(snap.instance),
                    state,
                    set,
                    Origin::Snapshot,
                )
            }
        };
        let source = PgSource {
            published: Published::new(set),
            cfg,
            state,
            version,
            instance,
            origin,
            last_error: None,
            started_at,
        };
        if origin == Origin::Postgres {
            source.write_cache();
        }
        Ok(source)
    }

    /// The live set, for the engine to read on every request.
    pub fn published(&self) -> Arc<Published> {
        self.published.clone()
    }

    /// The version served now.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether the set came from the rules cache (PostgreSQL was unreachable at start).
    pub fn from_cache(&self) -> bool {
        self.origin == Origin::Snapshot
    }

    /// Keeps the set current until `shutdown` turns true: the `LISTEN` task and the puller.
    pub fn spawn(self, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        let kick = Arc::new(Notify::new());
        let listen_url = self
            .cfg
            .listen_url
            .clone()
            .unwrap_or_else(|| self.cfg.url.clone());
        let listener = tokio::spawn(listen(
            listen_url,
            self.cfg.connect_timeout,
            kick.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(async move {
            self.run(kick, shutdown).await;
            let _ = listener.await;
        })
    }

    async fn run(mut self, kick: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
        let pg_cfg = match db::config(&self.cfg.url, self.cfg.connect_timeout, "sluiced") {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "rules puller cannot start");
                return;
            }
        };
        let mut client: Option<Client> = None;
        let mut backoff = Backoff::new();
        let mut need_sync = true;
        let mut next_poll = Instant::now() + self.cfg.poll;
        let mut next_report = Instant::now();
        let mut migrated = self.origin == Origin::Postgres || !self.cfg.migrate;
        loop {
            if *shutdown.borrow() {
                return;
            }
            if client.as_ref().is_none_or(Client::is_closed) {
                let attempt = tokio::time::timeout(self.cfg.connect_timeout * 2, async {
                    let mut c = db::connect(&pg_cfg).await?;
                    if !migrated {
                        db::migrate(&mut c).await?;
                    }
                    Ok::<_, DbError>(c)
                })
                .await
                .unwrap_or_else(|_| Err(DbError::Unavailable("connect timed out".into())));
                match attempt {
                    Ok(c) => {
                        // The backoff is reset by a successful pull, not by a connect: a
                        // server that accepts connections but fails every query must not be
                        // hammered.
                        migrated = true;
                        client = Some(c);
                        need_sync = true;
                    }
                    Err(e) => {
                        backoff.failed(&e, "rules puller");
                        if sleep_or_shutdown(backoff.delay(), &mut shutdown).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let Some(c) = client.as_mut() else { continue };
            if need_sync {
                match tokio::time::timeout(Duration::from_secs(30), self.sync(c)).await {
                    Ok(Ok(changed)) => {
                        if backoff.failures > 0 {
                            tracing::info!("rules puller back in touch with PostgreSQL");
                        }
                        backoff.reset();
                        need_sync = false;
                        next_poll = Instant::now() + self.cfg.poll;
                        if changed {
                            next_report = Instant::now();
                        }
                    }
                    Ok(Err(e)) => {
                        client = None;
                        backoff.failed(&e, "pulling rule changes");
                        if sleep_or_shutdown(backoff.delay(), &mut shutdown).await {
                            return;
                        }
                        continue;
                    }
                    Err(_) => {
                        client = None;
                        let e = DbError::Unavailable("pull timed out".into());
                        backoff.failed(&e, "pulling rule changes");
                        if sleep_or_shutdown(backoff.delay(), &mut shutdown).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            if Instant::now() >= next_report {
                let reported = tokio::time::timeout(Duration::from_secs(10), self.report(c)).await;
                match reported {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) if e.is_retryable() => {
                        client = None;
                        backoff.failed(&e, "reporting status");
                        if sleep_or_shutdown(backoff.delay(), &mut shutdown).await {
                            return;
                        }
                        continue;
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "reporting status failed"),
                    Err(_) => {
                        client = None;
                        let e = DbError::Unavailable("status report timed out".into());
                        backoff.failed(&e, "reporting status");
                        if sleep_or_shutdown(backoff.delay(), &mut shutdown).await {
                            return;
                        }
                        continue;
                    }
                }
                next_report = Instant::now() + self.cfg.report_every;
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = kick.notified() => need_sync = true,
                _ = tokio::time::sleep_until(next_poll) => need_sync = true,
                _ = tokio::time::sleep_until(next_report) => {}
            }
        }
    }

    /// Pulls what is newer than the served version and publishes it as one swap. Returns
    /// whether the served set (or its error) changed.
    async fn sync(&mut self, c: &mut Client) -> Result<bool, DbError> {
        let tx = c
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let (db_version, instance, records) = pull_after(&tx, self.version).await?;
        let same_db = self.instance.as_deref() == Some(instance.as_str());
        let (version, state) = if !same_db || db_version < self.version {
            // Another database, or this one restored from an older backup: history after
            // our version says nothing about it; take everything.
            tracing::warn!(
                served = self.version,
                database = db_version,
                "rules database changed identity or went back in time; reloading everything"
            );
            let (v, _, s) = load_current(&tx).await?;
            (v, s)
        } else if db_version == self.version {
            tx.commit().await?;
            if self.origin == Origin::Snapshot {
                self.origin = Origin::Postgres;
                tracing::info!(
                    version = self.version,
                    "PostgreSQL is back; the cached rules are current"
                );
                return Ok(true);
            }
            return Ok(false);
        } else {
            let mut s = self.state.clone();
            for r in records {
                s.apply_record(r);
            }
            (db_version, s)
        };
        tx.commit().await?;
        let set = state
            .to_rule_set(version)
            .map_err(|e| e.to_string())
            .and_then(|set| self.published.admits(&set).map(|()| set));
        match set {
            Ok(set) => {
                self.publish(version, instance, state, set);
                Ok(true)
            }
            Err(e) => {
                let msg = format!("version {version} refused, serving {}: {e}", self.version);
                let new = self.last_error.as_deref() != Some(msg.as_str());
                if new {
                    tracing::error!(error = %e, version, served = self.version, "rule set from PostgreSQL refused; keeping the last good set");
                    self.published.refuse();
                }
                self.last_error = Some(msg);
                Ok(new)
            }
        }
    }

    fn publish(&mut self, version: u64, instance: String, state: State, set: RuleSet) {
        let from = self.version;
        let rules = set.rule_count();
        self.published.publish(set);
        self.state = state;
        self.version = version;
        self.instance = Some(instance);
        self.origin = Origin::Postgres;
        self.last_error = None;
        tracing::info!(from, version, rules, "rules updated");
        self.write_cache();
    }

    fn write_cache(&self) {
        let (Some(path), Some(instance)) = (&self.cfg.cache, &self.instance) else {
            return;
        };
        let snap = Snapshot::new(self.version, instance, &self.state);
        if let Err(e) = snap.write(path) {
            tracing::warn!(error = %e, "could not write the rules cache; a restart while PostgreSQL is down would serve an older copy");
        }
    }

    async fn report(&self, c: &Client) -> Result<(), DbError> {
        c.execute(
            "INSERT INTO sluice_daemons
                 (daemon_id, region, version, source, started_at, loaded_at, last_seen, last_error, rules)
             VALUES ($1, $2, $3, $4, to_timestamp($5), now(), now(), $6, $7)
             ON CONFLICT (daemon_id) DO UPDATE SET
                 region = EXCLUDED.region,
                 version = EXCLUDED.version,
                 source = EXCLUDED.source,
                 started_at = EXCLUDED.started_at,
                 loaded_at = CASE WHEN sluice_daemons.version = EXCLUDED.version
                                  THEN sluice_daemons.loaded_at ELSE now() END,
                 last_seen = now(),
                 last_error = EXCLUDED.last_error,
                 rules = EXCLUDED.rules",
            &[
                &self.cfg.daemon_id,
                &self.cfg.region,
                &version_to(self.version),
                &self.origin.as_str(),
                &self.started_at,
                &self.last_error,
                &crate::placements_json(&self.published.load()),
            ],
        )
        .await?;
        Ok(())
    }
}

/// Connects, migrates if asked, and loads everything in one consistent read.
async fn initial_load(
    cfg: &db::DbConfig,
    migrate: bool,
) -> Result<(u64, String, State, RuleSet), String> {
    let mut c = db::connect(cfg).await.map_err(|e| e.to_string())?;
    if migrate {
        db::migrate(&mut c).await.map_err(|e| e.to_string())?;
    }
    let tx = c
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(|e| DbError::from(e).to_string())?;
    let (version, instance, state) = load_current(&tx).await.map_err(|e| e.to_string())?;
    tx.commit()
        .await
        .map_err(|e| DbError::from(e).to_string())?;
    let set = state
        .to_rule_set(version)
        .map_err(|e| format!("the rules in PostgreSQL (version {version}) are invalid: {e}"))?;
    Ok((version, instance, state, set))
}

/// The `LISTEN` loop: wakes the puller on every notification and after every (re)connect.
async fn listen(
    url: String,
    connect_timeout: Duration,
    kick: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let cfg = match db::config(&url, connect_timeout, "sluiced-listen") {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "rules listener cannot start");
            return;
        }
    };
    let mut backoff = Backoff::new();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let connected = tokio::time::timeout(connect_timeout * 2, cfg.connect_raw()).await;
        match connected {
            Ok(Ok((client, mut conn))) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    loop {
                        match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                if tx.send(n.payload().to_string()).is_err() {
                                    return None;
                                }
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => return Some(e.to_string()),
                            None => return None,
                        }
                    }
                });
                let listening = tokio::time::timeout(
                    connect_timeout * 2,
                    client.batch_execute(&format!("LISTEN {CHANNEL}")),
                )
                .await;
                match listening {
                    Ok(Ok(())) => {
                        if backoff.failures > 0 {
                            tracing::info!("rules listener reconnected");
                        }
                        backoff.reset();
                        // Whatever was notified while we were away is pulled now.
                        kick.notify_one();
                        loop {
                            tokio::select! {
                                _ = shutdown.changed() => {
                                    driver.abort();
                                    return;
                                }
                                msg = rx.recv() => match msg {
                                    Some(v) => {
                                        tracing::debug!(version = %v, "rules change notified");
                                        kick.notify_one();
                                    }
                                    None => break,
                                }
                            }
                        }
                        let why = driver
                            .await
                            .ok()
                            .flatten()
                            .unwrap_or_else(|| "closed".into());
                        backoff.failed(
                            &DbError::Unavailable(why),
                            "rules listener (changes still arrive by pull)",
                        );
                    }
                    Ok(Err(e)) => {
                        driver.abort();
                        backoff.failed(&DbError::from(e), "rules listener");
                    }
                    Err(_) => {
                        driver.abort();
                        backoff.failed(
                            &DbError::Unavailable("LISTEN timed out".into()),
                            "rules listener",
                        );
                    }
                }
                drop(client);
            }
            Ok(Err(e)) => backoff.failed(&DbError::from(e), "rules listener"),
            Err(_) => backoff.failed(
                &DbError::Unavailable("connect timed out".into()),
                "rules listener",
            ),
        }
        if sleep_or_shutdown(backoff.delay(), &mut shutdown).await {
            return;
        }
    }
}

/// Sleeps, returning `true` if shutdown was asked meanwhile.
async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *shutdown.borrow(),
        _ = shutdown.changed() => true,
    }
}

/// Capped exponential backoff with jitter: 100 ms doubling to 5 s. Logs the first failure
/// of a run at warn and the rest at debug, so an outage is one line, not thousands.
#[derive(Debug)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    const BASE: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn new() -> Backoff {
        Backoff { failures: 0 }
    }

    fn reset(&mut self) {
        self.failures = 0;
    }

    fn failed(&mut self, e: &DbError, what: &str) {
        self.failures = self.failures.saturating_add(1);
        if self.failures == 1 {
            tracing::warn!(error = %e, "{what}: PostgreSQL failed; retrying with backoff");
        } else {
            tracing::debug!(error = %e, attempt = self.failures, "{what}: still failing");
        }
    }

    fn delay(&self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(6);
        let d = (Self::BASE * 2u32.pow(exp)).min(Self::MAX);
        // Up to 25% jitter from the clock's nanoseconds: no RNG needed, and daemons that
        // lost PostgreSQL together do not reconnect in lockstep.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.subsec_nanos());
        d + d.mul_f64(f64::from(nanos % 1000) / 4000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap() {
        let mut b = Backoff::new();
        let e = DbError::Unavailable("x".into());
        b.failed(&e, "t");
        assert!(b.delay() >= Duration::from_millis(100) && b.delay() <= Duration::from_millis(125));
        for _ in 0..20 {
            b.failed(&e, "t");
        }
        assert!(b.delay() >= Duration::from_secs(5) && b.delay() <= Duration::from_millis(6250));
        b.reset();
        assert_eq!(b.failures, 0);
    }
}
