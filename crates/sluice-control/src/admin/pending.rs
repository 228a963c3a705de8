//! Held changes (`/v1/pending`): list them, and approve or reject one. Approval needs a
//! principal other than the proposer's; see [`crate::pending`].

use super::AdminState;
use super::auth::Caller;
use super::error::{ApiError, ApiResult, ok};
use super::request::Query;
use axum::Extension;
use axum::extract::{Path, RawQuery, State as AxState};
use serde_json::json;

fn to_json<T: serde::Serialize>(v: &T) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(v).map_err(|e| ApiError::internal(&e.to_string()))
}

pub(super) async fn list_pending(
    AxState(st): AxState<AdminState>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let q = Query::parse(raw)?;
    let items = st.store()?.pending(q.flag("all")?, q.limit()?).await?;
    ok(json!({"pending": to_json(&items)?}))
}

pub(super) async fn pending_action(
    AxState(st): AxState<AdminState>,
    Path(id_action): Path<String>,
    caller: Option<Extension<Caller>>,
) -> ApiResult {
    let usage = || {
        ApiError::not_found(format!(
            "POST /v1/pending/{id_action}: expected /v1/pending/ID:approve or /v1/pending/ID:reject"
        ))
    };
    let (id, action) = id_action.split_once(':').ok_or_else(usage)?;
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::bad(format!("{id:?} is not a pending change id")))?;
    let principal = caller.map_or_else(|| super::ANONYMOUS.to_string(), |c| c.principal.clone());
    let store = st.store()?;
    match action {
        "approve" => {
            let (done, p) = store.approve(id, &principal).await?;
            let mut v = to_json(&done)?;
            v["approved"] = to_json(&p)?;
            ok(v)
        }
        "reject" => {
            let p = store.reject(id, &principal).await?;
            ok(json!({"rejected": to_json(&p)?}))
        }
        _ => Err(usage()),
    }
}
