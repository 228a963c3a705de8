//! `POST /v1/rules:what-if`: replays this daemon's decision log over a window through the
//! current rule set and the candidate one the body describes, and answers the report
//! ([`crate::whatif::replay`]; docs/control-plane.md, "What-if").
//!
//! The body is `apply`'s (`{"domains": [...]}`) with an optional window (`"since"`,
//! `"until"`: epoch µs or a duration back, `1h` by default). The candidate is validated as
//! `apply` validates it (over PostgreSQL by the store's own dry run, forced so a tightening
//! of more than 10× is reported, not refused), so a bad set gets the same error. The log
//! belongs to the daemon, which hands it in as a [`DecisionSource`]; a fleet's report is
//! `sluicectl apply --what-if`, which reads every daemon's log.

use super::AdminState;
use super::error::{ApiError, ApiResult, ok};
use super::request::json_body;
use crate::edit::{Edit, apply};
use crate::store::{CommitError, CommitOptions};
use crate::whatif::{LoggedCheck, Window, replay};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State as AxState;
use axum::routing::post;
use serde_json::Value;
use sluice_core::Micros;
use std::sync::Arc;

/// What a [`DecisionSource`] read of a window.
#[derive(Debug, Clone, Default)]
pub struct LogWindow {
    /// The records, any order.
    pub records: Vec<Value>,
    /// Why not every record of the window could be read (a read bound), if so: said in
    /// the report.
    pub partial: Option<String>,
}

/// A daemon's decision log, as the what-if endpoint reads it.
pub trait DecisionSource: Send + Sync + std::fmt::Debug {
    /// Every record with `since <= ts < until` (a blocking read of local files: called on a
    /// blocking thread). The error is said to the caller as it is.
    fn window(&self, since: Option<Micros>, until: Option<Micros>) -> Result<LogWindow, String>;
}

#[derive(Clone, Debug)]
struct WhatIf {
    admin: AdminState,
    log: Arc<dyn DecisionSource>,
}

/// The what-if route over `log`, behind the admin API's tokens (a `POST`: the admin token,
/// though it writes nothing), ready to merge into [`super::router`]'s answer.
pub fn what_if_routes(state: &AdminState, log: Arc<dyn DecisionSource>) -> Router {
    let routes = Router::new()
        .route("/v1/rules:what-if", post(what_if))
        .with_state(WhatIf {
            admin: state.clone(),
            log,
        });
    super::behind_tokens(state, routes)
}

fn now() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as Micros)
}

/// `since` or `until` of the body: a string (epoch µs or a duration back) or a number (µs).
fn bound(v: &Value, field: &str) -> Result<Option<String>, ApiError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) if n.is_u64() => Ok(Some(n.to_string())),
        Some(other) => Err(ApiError::bad(format!(
            "{field}: expected epoch microseconds or a duration like \"1h\", got {other}"
        ))),
    }
}

async fn what_if(AxState(w): AxState<WhatIf>, body: Bytes) -> ApiResult {
    let v = json_body(&body)?;
    let docs = match v.get("domains") {
        Some(Value::Array(d)) if !d.is_empty() => d.clone(),
        _ => {
            return Err(ApiError::bad(
                "the body must be {\"domains\": [<domain document>, ...]} with at least one domain",
            ));
        }
    };
    let (since, until) = (bound(&v, "since")?, bound(&v, "until")?);
    let window = Window::parse(since.as_deref(), until.as_deref(), now())
        .map_err(|e| ApiError::bad(e.to_string()))?;
    let edit = Edit::Apply { docs };
    if let Ok(store) = w.admin.store() {
        // The same validation as apply, writing nothing.
        let opts = CommitOptions {
            force: true,
            dry_run: true,
            ..CommitOptions::default()
        };
        store.commit(&edit, &opts).await?;
    }
    let (version, state) = w.admin.current().await?;
    let next = apply(&state, &edit, None).map_err(CommitError::from)?;
    let invalid = |e| ApiError::from(CommitError::Invalid(e));
    let current = state.to_rule_set(version).map_err(invalid)?;
    let candidate = next.to_rule_set(version + 1).map_err(invalid)?;
    let log = w.log.clone();
    let raw = tokio::task::spawn_blocking(move || log.window(window.since, window.until))
        .await
        .map_err(|_| ApiError::internal("reading the decision log failed"))?
        .map_err(|e| ApiError::internal(&format!("reading the decision log: {e}")))?;
    let mut records = Vec::with_capacity(raw.records.len());
    for (i, r) in raw.records.into_iter().enumerate() {
        records
            .push(LoggedCheck::from_value(i, r).map_err(|e| ApiError::internal(&e.to_string()))?);
    }
    let mut report = replay(&records, &current, &candidate, window)
        .map_err(|e| ApiError::internal(&e.to_string()))?;
    if let Some(why) = raw.partial {
        report.note = format!("{}; {why}", report.note);
        report.partial = Some(why);
    }
    let mut out = serde_json::to_value(report).map_err(|e| ApiError::internal(&e.to_string()))?;
    if let Some(p) = &w.admin.inner.serving {
        out["daemon"] = p
            .daemon()
            .map_or(Value::Null, |d| Value::String(d.to_string()));
    }
    ok(out)
}
