//! Changes held for a second principal: a forced change that tightens a rule more than
//! [`MAX_TIGHTENING`](crate::model::MAX_TIGHTENING)× is not applied by the one who forced it.
//! It is stored in `sluice_pending` (the edit, the diff shown, who proposed it, when it
//! expires) until a *different* principal approves it, which applies the same edit as a new
//! version recorded with both principals, or anyone with an admin token rejects it.
//!
//! Approval re-runs the edit on the rules as they are then, in the committing transaction,
//! with the whole set validated again (an `apply` keeps its `expect_version`, so a change
//! made in between is a conflict, as it would have been without the hold). Expiry is
//! judged by PostgreSQL's clock (`expires <= now()`), the one clock every daemon shares.

use crate::db::{DbError, version_from, version_to};
use crate::edit::Edit;
use crate::model::Change;
use crate::store::{CommitError, CommitOptions, Committed, Store, commit_in, gone};
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;
use tokio_postgres::{Row, Transaction};

/// `timestamptz` as RFC 3339 UTC text (as the store writes it).
const TS: &str = r#"'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'"#;

/// One held change, as `GET /v1/pending` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PendingChange {
    /// Its id (`POST /v1/pending/{id}:approve`).
    pub id: i64,
    /// Who proposed it (the token's principal): someone else must approve.
    pub principal: String,
    /// The proposer's self-declared name.
    pub actor: String,
    /// The edit's action (`put`, `apply`, `rollback`, …).
    pub action: String,
    /// The edit itself, as it will be applied.
    pub edit: Value,
    /// The version the diff was computed against.
    pub base_version: u64,
    /// The diff at that version, entry by entry.
    pub changes: Vec<Change>,
    /// Why it was held: each tightening of more than 10×.
    pub reasons: Vec<String>,
    /// When it was proposed (RFC 3339, UTC).
    pub created: String,
    /// When it stops being approvable (RFC 3339, UTC).
    pub expires: String,
    /// `pending`, `expired`, `approved` or `rejected`.
    pub state: String,
    /// Who approved or rejected it.
    pub decided_by: Option<String>,
    /// When.
    pub decided_at: Option<String>,
    /// The version its approval wrote.
    pub version: Option<u64>,
}

fn columns() -> String {
    format!(
        "id, principal, actor, action, edit, base_version, changes, reasons,
         to_char(created AT TIME ZONE 'UTC', {TS}), to_char(expires AT TIME ZONE 'UTC', {TS}),
         CASE WHEN state = 'pending' AND expires <= now() THEN 'expired' ELSE state END,
         decided_by, to_char(decided_at AT TIME ZONE 'UTC', {TS}), version, expect_version"
    )
}

fn from_row(r: &Row) -> PendingChange {
    PendingChange {
        id: r.get(0),
        principal: r.get(1),
        actor: r.get(2),
        action: r.get(3),
        edit: r.get(4),
        base_version: version_from(r.get(5)),
        changes: serde_json::from_value(r.get(6)).unwrap_or_default(),
        reasons: serde_json::from_value(r.get(7)).unwrap_or_default(),
        created: r.get(8),
        expires: r.get(9),
        state: r.get(10),
        decided_by: r.get(11),
        decided_at: r.get(12),
        version: r.get::<_, Option<i64>>(13).map(version_from),
    }
}

/// Stores `edit` as held (inside the committing transaction, with the version row locked).
pub(crate) async fn hold(
    tx: &Transaction<'_>,
    edit: &Edit,
    opts: &CommitOptions,
    base_version: u64,
    changes: &[Change],
    reasons: &[String],
    ttl: Duration,
) -> Result<PendingChange, CommitError> {
    let json = |v: Result<Value, serde_json::Error>| {
        v.map_err(|e| CommitError::BadRequest(format!("cannot hold this change: {e}")))
    };
    let sql = format!(
        "INSERT INTO sluice_pending
           (principal, actor, action, edit, expect_version, base_version, changes, reasons, expires)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9))
         RETURNING {}",
        columns()
    );
    let row = tx
        .query_one(
            &sql,
            &[
                &opts.principal,
                &opts.actor,
                &edit.action(),
                &json(serde_json::to_value(edit))?,
                &opts.expect_version.map(version_to),
                &version_to(base_version),
                &json(serde_json::to_value(changes))?,
                &json(serde_json::to_value(reasons))?,
                &ttl.as_secs_f64(),
            ],
        )
        .await?;
    Ok(from_row(&row))
}

async fn locked(
    tx: &Transaction<'_>,
    id: i64,
) -> Result<(PendingChange, Option<u64>), CommitError> {
    let sql = format!(
        "SELECT {} FROM sluice_pending WHERE id = $1 FOR UPDATE",
        columns()
    );
    let row = tx
        .query_opt(&sql, &[&id])
        .await?
        .ok_or_else(|| CommitError::NotFound(format!("no pending change {id}")))?;
    let p = from_row(&row);
    match p.state.as_str() {
        "pending" => {}
        "expired" => {
            return Err(CommitError::Expired(format!(
                "pending change {id} expired at {}; propose it again",
                p.expires
            )));
        }
        other => {
            return Err(CommitError::Decided(format!(
                "pending change {id} was already {other} by {}",
                p.decided_by.as_deref().unwrap_or("?")
            )));
        }
    }
    let expect = row.get::<_, Option<i64>>(14).map(version_from);
    Ok((p, expect))
}

async fn decide(
    tx: &Transaction<'_>,
    id: i64,
    state: &str,
    by: &str,
    version: Option<u64>,
) -> Result<PendingChange, CommitError> {
    let sql = format!(
        "UPDATE sluice_pending SET state = $2, decided_by = $3, decided_at = now(), version = $4
         WHERE id = $1 RETURNING {}",
        columns()
    );
    let row = tx
        .query_one(&sql, &[&id, &state, &by, &version.map(version_to)])
        .await?;
    Ok(from_row(&row))
}

impl Store {
    /// Held changes, newest first: only those still awaiting approval, or with `all` every
    /// one (expired, approved, rejected too), at most `limit`.
    pub async fn pending(&self, all: bool, limit: i64) -> Result<Vec<PendingChange>, DbError> {
        self.with_budget(async {
            let g = self.client().await?;
            let c = g.as_ref().ok_or_else(gone)?;
            let sql = format!(
                "SELECT {} FROM sluice_pending
                 WHERE $1 OR (state = 'pending' AND expires > now())
                 ORDER BY id DESC LIMIT $2",
                columns()
            );
            let rows = c.query(&sql, &[&all, &limit]).await?;
            Ok(rows.iter().map(from_row).collect())
        })
        .await
    }

    /// Approves held change `id` as `principal` (who must not be its proposer): applies its
    /// edit as a new version recorded with both principals, in one transaction.
    pub async fn approve(
        &self,
        id: i64,
        principal: &str,
    ) -> Result<(Committed, PendingChange), CommitError> {
        self.with_budget(async {
            let mut g = self.client().await?;
            let c = g.as_mut().ok_or_else(gone)?;
            let tx = c.transaction().await?;
            let (p, expect_version) = locked(&tx, id).await?;
            if p.principal == principal {
                return Err(CommitError::SamePrincipal(format!(
                    "{principal} proposed pending change {id}; a different principal must approve it"
                )));
            }
            let edit: Edit = serde_json::from_value(p.edit.clone()).map_err(|e| {
                CommitError::BadRequest(format!("pending change {id} cannot be read: {e}"))
            })?;
            let opts = CommitOptions {
                actor: p.actor.clone(),
                principal: p.principal.clone(),
                expect_version,
                approval: Some((id, principal.to_string())),
                ..CommitOptions::default()
            };
            let done = commit_in(&tx, &edit, &opts, Duration::ZERO).await?;
            let version = done.changed.then_some(done.version);
            let p = decide(&tx, id, "approved", principal, version).await?;
            tx.commit().await?;
            tracing::info!(pending = id, version = done.version, proposer = %p.principal, approver = principal, "held change approved");
            Ok((done, p))
        })
        .await
    }

    /// Rejects held change `id` (its proposer may withdraw it too).
    pub async fn reject(&self, id: i64, principal: &str) -> Result<PendingChange, CommitError> {
        self.with_budget(async {
            let mut g = self.client().await?;
            let c = g.as_mut().ok_or_else(gone)?;
            let tx = c.transaction().await?;
            locked(&tx, id).await?;
            let p = decide(&tx, id, "rejected", principal, None).await?;
            tx.commit().await?;
            tracing::info!(pending = id, by = principal, "held change rejected");
            Ok(p)
        })
        .await
    }
}
