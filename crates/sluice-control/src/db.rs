//! PostgreSQL plumbing shared by the admin API, the daemon's watcher and `sluicectl migrate`:
//! connecting, telling a retryable error from a permanent one, and the schema with its
//! idempotent migrations.
//!
//! # Schema
//!
//! - `sluice_version`: one row, the version counter. Every change takes it `FOR UPDATE`, so
//!   changes are serialised and versions are gapless and committed in order; its
//!   `instance` tells a snapshot which database it came from.
//! - `sluice_changes`: one row per version: who (the self-declared actor and the token's
//!   principal, and the approver of a held change), when, what action.
//! - `sluice_rules` / `sluice_overrides`: the current entries (body in the rule format, jsonb).
//! - `sluice_domains`: each domain's settings (`{"require_default": true}`), an entry too.
//! - `sluice_history`: every version of every entry (a `NULL` body is a deletion), the source
//!   of "everything after version N" and of rollbacks.
//! - `sluice_daemons`: what each daemon reports: region, loaded version, last seen, error.
//! - `sluice_pending`: changes held for a second principal (more than 10× tighter, forced),
//!   with the edit, the diff shown, who proposed it, when it expires and how it was decided.
//!
//! Migrations run in one transaction under an advisory lock, so daemons starting together
//! apply them once; a database already up to date is not touched (no DDL, so a daemon's role
//! needs no `CREATE` privilege once `sluicectl migrate` has run).

use crate::pgtls::{self, MakeRustls, RustlsStream};
use std::time::Duration;
use tokio_postgres::{Client, Config, Socket};

/// The channel `NOTIFY` announces new versions on (payload: the version).
pub const CHANNEL: &str = "sluice_rules";

/// Arbitrary constant key of the advisory lock that serialises migrations.
const MIGRATION_LOCK: i64 = 0x5155_4943_455f_4d47;

/// The migrations, in order; never edit a released one, add a new one.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "rules, overrides, history, version counter, daemon status",
        r#"
CREATE TABLE sluice_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   bigint  NOT NULL CHECK (version >= 0),
    instance  text    NOT NULL
);
INSERT INTO sluice_version (singleton, version, instance)
    VALUES (true, 0, md5(random()::text || clock_timestamp()::text));

CREATE TABLE sluice_changes (
    version bigint      PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL,
    action  text        NOT NULL,
    detail  jsonb       NOT NULL DEFAULT '{}'
);

CREATE TABLE sluice_rules (
    domain   text    NOT NULL,
    id       text    NOT NULL,
    position integer NOT NULL,
    body     jsonb   NOT NULL,
    version  bigint  NOT NULL REFERENCES sluice_changes (version),
    PRIMARY KEY (domain, id)
);

CREATE TABLE sluice_overrides (
    domain   text    NOT NULL,
    key      text    NOT NULL,
    position integer NOT NULL,
    body     jsonb   NOT NULL,
    version  bigint  NOT NULL REFERENCES sluice_changes (version),
    PRIMARY KEY (domain, key)
);

CREATE TABLE sluice_history (
    version  bigint  NOT NULL REFERENCES sluice_changes (version),
    kind     text    NOT NULL CHECK (kind IN ('rule', 'override')),
    domain   text    NOT NULL,
    key      text    NOT NULL,
    position integer NOT NULL,
    body     jsonb,
    PRIMARY KEY (version, kind, domain, key)
);
CREATE INDEX sluice_history_by_key ON sluice_history (kind, domain, key, version);

CREATE TABLE sluice_daemons (
    daemon_id  text        PRIMARY KEY,
    region     text        NOT NULL,
    version    bigint      NOT NULL,
    source     text        NOT NULL,
    started_at timestamptz NOT NULL,
    loaded_at  timestamptz,
    last_seen  timestamptz NOT NULL,
    last_error text
);
"#,
    ),
    (
        2,
        "principals in the change log, pending changes",
        r#"
ALTER TABLE sluice_changes
    ADD COLUMN principal   text NOT NULL DEFAULT 'unknown',
    ADD COLUMN approved_by text;

CREATE TABLE sluice_pending (
    id           bigserial   PRIMARY KEY,
    principal    text        NOT NULL,
    actor        text        NOT NULL,
    action       text        NOT NULL,
    edit         jsonb       NOT NULL,
    expect_version bigint,
    base_version bigint      NOT NULL,
    changes      jsonb       NOT NULL,
    reasons      jsonb       NOT NULL,
    created      timestamptz NOT NULL DEFAULT now(),
    expires      timestamptz NOT NULL,
    state        text        NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'approved', 'rejected')),
    decided_by   text,
    decided_at   timestamptz,
    version      bigint
);
"#,
    ),
    (
        3,
        "domain settings",
        r#"
CREATE TABLE sluice_domains (
    domain   text    NOT NULL,
    key      text    NOT NULL,
    position integer NOT NULL,
    body     jsonb   NOT NULL,
    version  bigint  NOT NULL REFERENCES sluice_changes (version),
    PRIMARY KEY (domain, key)
);
ALTER TABLE sluice_history DROP CONSTRAINT sluice_history_kind_check;
ALTER TABLE sluice_history ADD CONSTRAINT sluice_history_kind_check
    CHECK (kind IN ('rule', 'override', 'domain'));
"#,
    ),
    (
        4,
        "what each rule does on each daemon (enforce_on canaries)",
        r#"
ALTER TABLE sluice_daemons ADD COLUMN rules jsonb;
"#,
    ),
];

/// A PostgreSQL failure, split by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// Unreachable, connection lost, timed out, or the server is shutting down: retry later.
    #[error("PostgreSQL unavailable: {0}")]
    Unavailable(String),
    /// The server refused the statement (permissions, a schema from a newer release,
    /// constraint): retrying will not help until someone fixes it.
    #[error("PostgreSQL refused: {0}")]
    Refused(String),
    /// The URL is not a valid connection string.
    #[error("invalid PostgreSQL URL: {0}")]
    BadUrl(String),
}

impl DbError {
    /// Whether retrying (after a backoff) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, DbError::Unavailable(_))
    }
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> DbError {
        let msg = match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => {
                // tokio-postgres keeps the useful part ("Connection refused") in the source.
                let mut m = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    m.push_str(&format!(": {s}"));
                    src = s.source();
                }
                m
            }
        };
        match e.code().map(|c| c.code()) {
            // No SQLSTATE: an I/O or protocol error, the connection is gone.
            None => DbError::Unavailable(msg),
            // Connection exceptions, serialization failures, deadlocks, insufficient
            // resources, operator intervention (shutdown, cannot connect now).
            Some(c)
                if c.starts_with("08")
                    || c == "40001"
                    || c == "40P01"
                    || c.starts_with("53")
                    || c.starts_with("57P") =>
            {
                DbError::Unavailable(msg)
            }
            Some(_) => DbError::Refused(msg),
        }
    }
}

/// Connection settings and the TLS to negotiate with them (used when `sslmode` is
/// `prefer`, `require`, `verify-ca` or `verify-full`).
#[derive(Clone)]
pub struct DbConfig {
    pg: Config,
    tls: MakeRustls,
}

impl std::fmt::Debug for DbConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Config's own Debug redacts the password.
        f.debug_struct("DbConfig")
            .field("pg", &self.pg)
            .finish_non_exhaustive()
    }
}

/// A connection and its driver, TLS or not.
pub type Connection = tokio_postgres::Connection<Socket, RustlsStream<Socket>>;

impl DbConfig {
    /// The tokio-postgres settings.
    pub fn pg(&self) -> &Config {
        &self.pg
    }

    /// Connects, leaving the driver to the caller (for `LISTEN`, which polls it).
    pub async fn connect_raw(&self) -> Result<(Client, Connection), tokio_postgres::Error> {
        self.pg.connect(self.tls.clone()).await
    }
}

/// Parses a URL (or key=value connection string) and sets the timeouts Sluice relies on:
/// a connect timeout, so a dead server is noticed in seconds rather than the kernel's
/// minutes, and TCP keepalives, so a silently dropped `LISTEN` link is noticed too.
/// `sslmode=verify-ca|verify-full` and `sslrootcert=FILE` are read as libpq reads them
/// ([`pgtls`]).
pub fn config(url: &str, connect_timeout: Duration, app: &str) -> Result<DbConfig, DbError> {
    let split = pgtls::split_url(url);
    let mut cfg: Config = split
        .url
        .parse()
        .map_err(|e: tokio_postgres::Error| DbError::BadUrl(e.to_string()))?;
    let tls = pgtls::client_config(
        split.verify,
        split.root_cert.as_deref().map(std::path::Path::new),
    )
    .map_err(DbError::BadUrl)?;
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(connect_timeout);
    }
    cfg.keepalives(true)
        .keepalives_idle(Duration::from_secs(15))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3);
    if cfg.get_application_name().is_none() {
        cfg.application_name(app);
    }
    Ok(DbConfig {
        pg: cfg,
        tls: MakeRustls::new(tls),
    })
}

/// Connects and spawns the connection's driver; the client fails once the link is lost
/// ([`Client::is_closed`]). For connections that only query (not `LISTEN`).
pub async fn connect(cfg: &DbConfig) -> Result<Client, DbError> {
    let (client, conn) = cfg.connect_raw().await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// What [`migrate`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migrated {
    /// Migrations applied now, by number and name.
    pub applied: Vec<(i32, String)>,
    /// The schema version afterwards.
    pub schema_version: i32,
    /// The newest schema this release knows.
    pub known: i32,
}

/// Applies the migrations not applied yet. Idempotent and safe to run concurrently from
/// many daemons; a schema newer than this release is left alone (with a warning), since
/// migrations are additive and an older daemon can still read it during a rolling upgrade.
pub async fn migrate(client: &mut Client) -> Result<Migrated, DbError> {
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if let Some(v) = schema_version(client).await?
        && v >= known
    {
        if v > known {
            tracing::warn!(
                schema = v,
                known,
                "the rules schema is newer than this release; not migrating"
            );
        }
        return Ok(Migrated {
            applied: vec![],
            schema_version: v,
            known,
        });
    }
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS sluice_schema_migrations (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let done: Vec<i32> = tx
        .query("SELECT version FROM sluice_schema_migrations", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut applied = Vec::new();
    for (v, name, sql) in MIGRATIONS {
        if done.contains(v) {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO sluice_schema_migrations (version, name) VALUES ($1, $2)",
            &[v, name],
        )
        .await?;
        tracing::info!(migration = v, name, "applied rules schema migration");
        applied.push((*v, name.to_string()));
    }
    tx.commit().await?;
    Ok(Migrated {
        applied,
        schema_version: known.max(done.iter().copied().max().unwrap_or(0)),
        known,
    })
}

/// The highest applied migration, or `None` on an empty database.
async fn schema_version(client: &Client) -> Result<Option<i32>, DbError> {
    let row = client
        .query_one(
            "SELECT to_regclass('sluice_schema_migrations') IS NOT NULL",
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(None);
    }
    let row = client
        .query_one("SELECT max(version) FROM sluice_schema_migrations", &[])
        .await?;
    Ok(row.get::<_, Option<i32>>(0))
}

/// `u64` version from a `bigint` column (never negative: a CHECK constraint holds it).
pub(crate) fn version_from(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// `bigint` parameter from a `u64` version (saturating; versions never come near 2^63).
pub(crate) fn version_to(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
