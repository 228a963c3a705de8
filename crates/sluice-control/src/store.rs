//! The admin side of PostgreSQL: reading the rules, their history and the daemons' status,
//! and committing a change as one transaction that bumps the version.
//!
//! A commit locks the version row (`SELECT … FOR UPDATE`), so changes are serialised: it
//! reads the current state, applies the [`Edit`], validates the *whole* resulting set with
//! sluice-core, refuses a tightening of more than [`MAX_TIGHTENING`]× (holds it for a second
//! principal when forced, [`crate::pending`]), and only
//! then writes the current tables, the history rows, the change record, the new version and
//! a `NOTIFY` (delivered at commit). A refused change writes nothing.
//!
//! The queries daemons use to load and pull ([`load_current`], [`pull_after`]) live here too,
//! next to the writes they must agree with.

use crate::db::{self, CHANNEL, DbError, Migrated, version_from, version_to};
use crate::edit::{Edit, EditError, apply};
use crate::model::{Change, Kind, MAX_TIGHTENING, Op, Record, State, tightenings};
use serde::Serialize;
use serde_json::Value;
use sluice_core::rules::RulesError;
use std::time::Duration;
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::{Client, GenericClient, IsolationLevel};

/// How long one admin request may spend in PostgreSQL before it is reported unavailable.
const STATEMENT_BUDGET: Duration = Duration::from_secs(10);

/// `timestamptz` as RFC 3339 UTC text, so no date-time crate is needed.
const TS: &str = r#"'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'"#;

/// Why a change was not committed. Each variant maps to one HTTP status in the admin API.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// PostgreSQL failed (see [`DbError::is_retryable`]).
    #[error(transparent)]
    Db(#[from] DbError),
    /// The rule or override does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed or exceeds a bound.
    #[error("{0}")]
    BadRequest(String),
    /// The resulting rule set is invalid: nothing was written.
    #[error(transparent)]
    Invalid(RulesError),
    /// The change tightens something more than [`MAX_TIGHTENING`]× and was not forced.
    #[error(
        "refused: {}; send force=true to hold it as a pending change until another principal approves it",
        .0.join("; ")
    )]
    Tightening(Vec<String>),
    /// The principal who proposed a held change tried to approve it.
    #[error("{0}")]
    SamePrincipal(String),
    /// The held change was already approved or rejected.
    #[error("{0}")]
    Decided(String),
    /// The held change expired before anyone approved it.
    #[error("{0}")]
    Expired(String),
    /// The rules changed since the version the caller based its change on.
    #[error("the rules changed since version {expected} (now {current}); review the diff again")]
    Conflict {
        /// The version the caller expected.
        expected: u64,
        /// The current version.
        current: u64,
    },
}

impl From<EditError> for CommitError {
    fn from(e: EditError) -> CommitError {
        match e {
            EditError::NotFound(m) => CommitError::NotFound(m),
            EditError::BadRequest(m) => CommitError::BadRequest(m),
            EditError::Invalid(e) => CommitError::Invalid(e),
        }
    }
}

impl From<tokio_postgres::Error> for CommitError {
    fn from(e: tokio_postgres::Error) -> CommitError {
        CommitError::Db(e.into())
    }
}

/// How to commit: who asks, and whether to force, only preview, or check the base version.
#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    /// Recorded in the change log (the `X-Sluice-Actor` header, or the principal).
    pub actor: String,
    /// The authenticated principal (the token's), recorded with the version.
    pub principal: String,
    /// Hold a tightening of more than [`MAX_TIGHTENING`]× for a second principal's approval
    /// instead of refusing it.
    pub force: bool,
    /// Validate and compute the diff, write nothing.
    pub dry_run: bool,
    /// Refuse with [`CommitError::Conflict`] unless the current version is this one.
    pub expect_version: Option<u64>,
    /// Set only when a held change is approved: its id and the approver, so the tightening
    /// it was held for is applied and both principals are recorded.
    pub(crate) approval: Option<(i64, String)>,
}

/// What a commit did.
#[derive(Clone, Debug, Serialize)]
pub struct Committed {
    /// The version now current (the new one, or the unchanged one).
    pub version: u64,
    /// The version before.
    pub previous_version: u64,
    /// Whether anything changed (an identical `PUT` changes nothing and bumps nothing).
    pub changed: bool,
    /// Only previewed.
    pub dry_run: bool,
    /// Entry by entry.
    pub changes: Vec<Change>,
    /// A dry run of a forced tightening: the real call would be held for approval.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_approval: bool,
    /// Held for a second principal instead of applied (answered with 202).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<crate::pending::PendingChange>,
}

/// One version of one entry, for `GET /v1/rules/{id}/history`.
#[derive(Clone, Debug, Serialize)]
pub struct HistoryItem {
    /// The version that wrote it.
    pub version: u64,
    /// Domain name.
    pub domain: String,
    /// Who (self-declared).
    pub actor: String,
    /// The authenticated principal.
    pub principal: String,
    /// The second principal, for a change that was held and approved.
    pub approved_by: Option<String>,
    /// What action (`put`, `shadow`, `rollback`, …).
    pub action: String,
    /// When (RFC 3339, UTC).
    pub at: String,
    /// The body, or `null` when this version deleted it.
    pub body: Option<Value>,
}

/// One version, for `GET /v1/rules:history`.
#[derive(Clone, Debug, Serialize)]
pub struct ChangeInfo {
    /// The version.
    pub version: u64,
    /// Who (self-declared).
    pub actor: String,
    /// The authenticated principal.
    pub principal: String,
    /// The second principal, for a change that was held and approved.
    pub approved_by: Option<String>,
    /// What action.
    pub action: String,
    /// When (RFC 3339, UTC).
    pub at: String,
    /// Entries written.
    pub entries: i64,
    /// Extra detail (e.g. `{"to_version": 3}` for a rollback).
    pub detail: Value,
}

/// What one daemon last reported.
#[derive(Clone, Debug, Serialize)]
pub struct DaemonStatus {
    /// The daemon's id.
    pub daemon_id: String,
    /// Its region.
    pub region: String,
    /// The rules version it serves.
    pub version: u64,
    /// `postgres` or `snapshot` (serving its disk copy, PostgreSQL unreachable at start).
    pub source: String,
    /// When it last reported (RFC 3339, UTC).
    pub last_seen: String,
    /// Seconds since then.
    pub age_s: f64,
    /// Its version is the current one.
    pub current: bool,
    /// The last problem it reported (e.g. a set it refused), if any.
    pub last_error: Option<String>,
    /// What each rule does on it, as of its last report: `[{domain, rule, mode,
    /// canary_shadowed}]` ([`crate::placements_json`]), so a canary's progress (`enforce_on`)
    /// is visible daemon by daemon. Empty for a daemon of a release that does not report it.
    pub rules: Value,
}

/// The answer to `GET /v1/rules:status`.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    /// The current version in PostgreSQL.
    pub version: u64,
    /// Every daemon that ever reported, by region and id.
    pub daemons: Vec<DaemonStatus>,
}

/// The admin API's handle on PostgreSQL: one lazily (re)connected connection. Admin traffic
/// is a few requests a minute and commits are serialised by the version lock anyway, so a
/// pool would buy nothing.
#[derive(Debug)]
pub struct Store {
    cfg: db::DbConfig,
    client: Mutex<Option<Client>>,
    pending_ttl: Duration,
}

/// How long a held change waits for its approver by default.
pub const DEFAULT_PENDING_TTL: Duration = Duration::from_secs(24 * 3600);

impl Store {
    /// A store for `url`; connects on first use, so the admin API can start while
    /// PostgreSQL is down and answer 503 until it is back.
    pub fn new(url: &str) -> Result<Store, DbError> {
        Ok(Store {
            cfg: db::config(url, Duration::from_secs(3), "sluice-admin")?,
            client: Mutex::new(None),
            pending_ttl: DEFAULT_PENDING_TTL,
        })
    }

    /// Held changes expire after `ttl` (default [`DEFAULT_PENDING_TTL`]).
    pub fn with_pending_ttl(mut self, ttl: Duration) -> Store {
        self.pending_ttl = ttl;
        self
    }

    pub(crate) async fn client(&self) -> Result<MutexGuard<'_, Option<Client>>, DbError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(Client::is_closed) {
            *guard = None;
            *guard = Some(db::connect(&self.cfg).await?);
        }
        Ok(guard)
    }

    pub(crate) async fn with_budget<T, E: From<DbError>>(
        &self,
        f: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        match tokio::time::timeout(STATEMENT_BUDGET, f).await {
            Ok(r) => r,
            Err(_) => {
                // The connection may be stuck mid-statement: start afresh next time.
                if let Ok(mut g) = self.client.try_lock() {
                    *g = None;
                }
                Err(DbError::Unavailable(format!(
                    "no answer within {}s",
                    STATEMENT_BUDGET.as_secs()
                ))
                .into())
            }
        }
    }

    /// Applies pending migrations (see [`db::migrate`]).
    pub async fn migrate(&self) -> Result<Migrated, DbError> {
        self.with_budget(async {
            let mut g = self.client().await?;
            let c = g.as_mut().ok_or_else(gone)?;
            db::migrate(c).await
        })
        .await
    }

    /// The current version and state, read consistently.
    pub async fn current(&self) -> Result<(u64, State), DbError> {
        self.with_budget(async {
            let mut g = self.client().await?;
            let c = g.as_mut().ok_or_else(gone)?;
            let tx = c
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await?;
            let (version, _, state) = load_current(&tx).await?;
            tx.commit().await?;
            Ok((version, state))
        })
        .await
    }

    /// Every version of one entry, newest first (at most `limit`).
    pub async fn history(
        &self,
        kind: Kind,
        domain: Option<&str>,
        key: &str,
        limit: i64,
    ) -> Result<Vec<HistoryItem>, DbError> {
        self.with_budget(async {
            let g = self.client().await?;
            let c = g.as_ref().ok_or_else(gone)?;
            let sql = format!(
                "SELECT h.version, h.domain, c.actor, c.principal, c.approved_by, c.action, to_char(c.at AT TIME ZONE 'UTC', {TS}), h.body
                 FROM sluice_history h JOIN sluice_changes c USING (version)
                 WHERE h.kind = $1 AND h.key = $2 AND ($3::text IS NULL OR h.domain = $3)
                 ORDER BY h.version DESC LIMIT $4"
            );
            let rows = c
                .query(&sql, &[&kind.as_str(), &key, &domain, &limit])
                .await?;
            Ok(rows
                .iter()
                .map(|r| HistoryItem {
                    version: version_from(r.get(0)),
                    domain: r.get(1),
                    actor: r.get(2),
                    principal: r.get(3),
                    approved_by: r.get(4),
                    action: r.get(5),
                    at: r.get(6),
                    body: r.get(7),
                })
                .collect())
        })
        .await
    }

    /// The latest versions, newest first (at most `limit`): what `rollback --to` picks from.
    pub async fn changes(&self, limit: i64) -> Result<Vec<ChangeInfo>, DbError> {
        self.with_budget(async {
            let g = self.client().await?;
            let c = g.as_ref().ok_or_else(gone)?;
            let sql = format!(
                "SELECT c.version, c.actor, c.action, to_char(c.at AT TIME ZONE 'UTC', {TS}), c.detail,
                        c.principal, c.approved_by,
                        (SELECT count(*) FROM sluice_history h WHERE h.version = c.version)
                 FROM sluice_changes c ORDER BY c.version DESC LIMIT $1"
            );
            let rows = c.query(&sql, &[&limit]).await?;
            Ok(rows
                .iter()
                .map(|r| ChangeInfo {
                    version: version_from(r.get(0)),
                    actor: r.get(1),
                    action: r.get(2),
                    at: r.get(3),
                    detail: r.get(4),
                    principal: r.get(5),
                    approved_by: r.get(6),
                    entries: r.get(7),
                })
                .collect())
        })
        .await
    }

    /// The current version and every daemon's report.
    pub async fn status(&self) -> Result<Status, DbError> {
        self.with_budget(async {
            let g = self.client().await?;
            let c = g.as_ref().ok_or_else(gone)?;
            let version = version_from(
                c.query_one("SELECT version FROM sluice_version", &[])
                    .await?
                    .get(0),
            );
            let sql = format!(
                "SELECT daemon_id, region, version, source, to_char(last_seen AT TIME ZONE 'UTC', {TS}),
                        extract(epoch FROM now() - last_seen)::float8, last_error, rules
                 FROM sluice_daemons ORDER BY region, daemon_id"
            );
            let daemons = c
                .query(&sql, &[])
                .await?
                .iter()
                .map(|r| {
                    let v = version_from(r.get(2));
                    DaemonStatus {
                        daemon_id: r.get(0),
                        region: r.get(1),
                        version: v,
                        source: r.get(3),
                        last_seen: r.get(4),
                        age_s: r.get(5),
                        current: v == version,
                        last_error: r.get(6),
                        rules: r
                            .get::<_, Option<Value>>(7)
                            .unwrap_or_else(|| Value::Array(Vec::new())),
                    }
                })
                .collect();
            Ok(Status { version, daemons })
        })
        .await
    }

    /// Applies `edit` as one new version (see the module docs for the checks).
    pub async fn commit(
        &self,
        edit: &Edit,
        opts: &CommitOptions,
    ) -> Result<Committed, CommitError> {
        self.with_budget(async {
            let mut g = self.client().await?;
            let c = g.as_mut().ok_or_else(gone)?;
            let tx = c.transaction().await?;
            let done = commit_in(&tx, edit, opts, self.pending_ttl).await?;
            tx.commit().await?;
            if done.changed {
                tracing::info!(
                    version = done.version,
                    action = edit.action(),
                    actor = %opts.actor,
                    principal = %opts.principal,
                    entries = done.changes.len(),
                    "rules changed"
                );
            }
            Ok(done)
        })
        .await
    }
}

pub(crate) fn gone() -> DbError {
    DbError::Unavailable("no connection".into())
}

/// Commits `edit` inside `tx` (the caller commits the transaction): checks, then either
/// writes the new version, or, for a forced tightening, the pending change that holds it.
pub(crate) async fn commit_in(
    tx: &tokio_postgres::Transaction<'_>,
    edit: &Edit,
    opts: &CommitOptions,
    pending_ttl: Duration,
) -> Result<Committed, CommitError> {
    let row = tx
        .query_one("SELECT version FROM sluice_version FOR UPDATE", &[])
        .await?;
    let version = version_from(row.get(0));
    if let Some(expected) = opts.expect_version
        && expected != version
    {
        return Err(CommitError::Conflict {
            expected,
            current: version,
        });
    }
    let (_, _, before) = load_current(tx).await?;
    let past = match edit {
        Edit::Rollback { to } => {
            if *to == 0 || *to > version {
                return Err(CommitError::BadRequest(format!(
                    "to_version must be between 1 and the current version {version}, got {to}"
                )));
            }
            Some(state_at(tx, *to).await?)
        }
        _ => None,
    };
    let after = apply(&before, edit, past.as_ref())?;
    let changes = before.diff(&after);
    let unchanged = Committed {
        version,
        previous_version: version,
        changed: false,
        dry_run: opts.dry_run,
        changes: vec![],
        needs_approval: false,
        pending: None,
    };
    if changes.is_empty() {
        return Ok(unchanged);
    }
    let next = version + 1;
    let after_set = after.to_rule_set(next).map_err(CommitError::Invalid)?;
    // An approved change was judged when it was held. A current set that no longer
    // validates (a newer release's stricter rules) has nothing trustworthy to compare with:
    // the change is judged on its own.
    let refused = match (&opts.approval, before.to_rule_set(version)) {
        (None, Ok(before_set)) => tightenings(&before_set, &after_set, &changes, MAX_TIGHTENING),
        _ => vec![],
    };
    if !refused.is_empty() && !opts.force {
        return Err(CommitError::Tightening(refused));
    }
    if opts.dry_run {
        return Ok(Committed {
            changes,
            changed: true,
            needs_approval: !refused.is_empty(),
            ..unchanged
        });
    }
    if !refused.is_empty() {
        let held =
            crate::pending::hold(tx, edit, opts, version, &changes, &refused, pending_ttl).await?;
        tracing::info!(pending = held.id, action = edit.action(), principal = %opts.principal, "change held for a second principal");
        return Ok(Committed {
            changes,
            pending: Some(held),
            ..unchanged
        });
    }
    let mut detail = match edit {
        Edit::Rollback { to } => serde_json::json!({"to_version": to}),
        _ => serde_json::json!({}),
    };
    let approved_by = opts.approval.as_ref().map(|(id, by)| {
        detail["pending"] = serde_json::json!(id);
        by.clone()
    });
    tx.execute(
        "UPDATE sluice_version SET version = $1",
        &[&version_to(next)],
    )
    .await?;
    tx.execute(
        "INSERT INTO sluice_changes (version, actor, action, detail, principal, approved_by)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            &version_to(next),
            &opts.actor,
            &edit.action(),
            &detail,
            &opts.principal,
            &approved_by,
        ],
    )
    .await?;
    for ch in &changes {
        let (table, keycol) = match ch.kind {
            Kind::Rule => ("sluice_rules", "id"),
            Kind::Override => ("sluice_overrides", "key"),
            Kind::Domain => ("sluice_domains", "key"),
        };
        match (&ch.op, &ch.after) {
            (Op::Delete, _) | (_, None) => {
                tx.execute(
                    &format!("DELETE FROM {table} WHERE domain = $1 AND {keycol} = $2"),
                    &[&ch.domain, &ch.key],
                )
                .await?;
            }
            (_, Some(body)) => {
                tx.execute(
                    &format!(
                        "INSERT INTO {table} (domain, {keycol}, position, body, version)
                         VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (domain, {keycol}) DO UPDATE
                         SET position = EXCLUDED.position, body = EXCLUDED.body, version = EXCLUDED.version"
                    ),
                    &[&ch.domain, &ch.key, &ch.position, body, &version_to(next)],
                )
                .await?;
            }
        }
        tx.execute(
            "INSERT INTO sluice_history (version, kind, domain, key, position, body)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &version_to(next),
                &ch.kind.as_str(),
                &ch.domain,
                &ch.key,
                &ch.position,
                &ch.after,
            ],
        )
        .await?;
    }
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &next.to_string()])
        .await?;
    Ok(Committed {
        version: next,
        previous_version: version,
        changed: true,
        dry_run: false,
        changes,
        needs_approval: false,
        pending: None,
    })
}

fn record(r: &tokio_postgres::Row) -> Option<Record> {
    Some(Record {
        kind: Kind::parse(r.get::<_, &str>(0))?,
        domain: r.get(1),
        key: r.get(2),
        position: r.get(3),
        body: r.get(4),
    })
}

/// The current version, the database's instance id and every entry. Call it inside a
/// repeatable-read transaction (or with the version row locked) for a consistent view.
pub async fn load_current(c: &impl GenericClient) -> Result<(u64, String, State), DbError> {
    let row = c
        .query_one("SELECT version, instance FROM sluice_version", &[])
        .await?;
    let (version, instance) = (version_from(row.get(0)), row.get(1));
    let rows = c
        .query(
            "SELECT 'rule', domain, id, position, body FROM sluice_rules
             UNION ALL
             SELECT 'override', domain, key, position, body FROM sluice_overrides
             UNION ALL
             SELECT 'domain', domain, key, position, body FROM sluice_domains",
            &[],
        )
        .await?;
    let mut state = State::default();
    for r in rows.iter().filter_map(record) {
        state.apply_record(r);
    }
    Ok((version, instance, state))
}

/// The state as it was right after `version` was committed, rebuilt from the history.
pub async fn state_at(c: &impl GenericClient, version: u64) -> Result<State, DbError> {
    let rows = c
        .query(
            "SELECT DISTINCT ON (kind, domain, key) kind, domain, key, position, body
             FROM sluice_history WHERE version <= $1
             ORDER BY kind, domain, key, version DESC",
            &[&version_to(version)],
        )
        .await?;
    let mut state = State::default();
    for r in rows.iter().filter_map(record) {
        state.apply_record(r);
    }
    Ok(state)
}

/// What a daemon at version `after` is missing: the current version, the database's
/// instance id, and every history record written since, oldest first (later records of the
/// same entry replace earlier ones when applied in order).
pub async fn pull_after(
    c: &impl GenericClient,
    after: u64,
) -> Result<(u64, String, Vec<Record>), DbError> {
    let row = c
        .query_one("SELECT version, instance FROM sluice_version", &[])
        .await?;
    let (version, instance) = (version_from(row.get(0)), row.get(1));
    if version <= after {
        return Ok((version, instance, vec![]));
    }
    let rows = c
        .query(
            "SELECT kind, domain, key, position, body FROM sluice_history
             WHERE version > $1 ORDER BY version",
            &[&version_to(after)],
        )
        .await?;
    Ok((version, instance, rows.iter().filter_map(record).collect()))
}
