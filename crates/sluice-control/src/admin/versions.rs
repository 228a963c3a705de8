//! The whole rule set and its versions: apply whole domains, roll back to a version, the
//! shadow-all kill switch, which version each daemon serves, the change log and export.

use super::AdminState;
use super::error::{ApiError, ApiResult, ok};
use super::request::{Change, Query, body_flags, json_body};
use crate::edit::Edit;
use axum::body::Bytes;
use axum::extract::{RawQuery, State as AxState};
use serde_json::{Value, json};

pub(super) async fn apply_docs(
    AxState(st): AxState<AdminState>,
    change: Change,
    body: Bytes,
) -> ApiResult {
    change
        .commit(&st, |_, opts| {
            let v = json_body(&body)?;
            let docs = match v.get("domains") {
                Some(Value::Array(d)) if !d.is_empty() => d.clone(),
                _ => {
                    return Err(ApiError::bad(
                        "the body must be {\"domains\": [<domain document>, ...]} with at least one domain",
                    ));
                }
            };
            body_flags(opts, &v);
            opts.expect_version = match v.get("expect_version") {
                None | Some(Value::Null) => None,
                Some(n) => Some(n.as_u64().ok_or_else(|| {
                    ApiError::bad(format!("expect_version must be a version number, got {n}"))
                })?),
            };
            Ok(Edit::Apply { docs })
        })
        .await
}

pub(super) async fn rollback(
    AxState(st): AxState<AdminState>,
    change: Change,
    body: Bytes,
) -> ApiResult {
    change
        .commit(&st, |_, opts| {
            let v = json_body(&body)?;
            let Some(to) = v.get("to_version").and_then(Value::as_u64) else {
                return Err(ApiError::bad(
                    "the body must be {\"to_version\": N}: the version to restore (see GET /v1/rules:history)",
                ));
            };
            body_flags(opts, &v);
            Ok(Edit::Rollback { to })
        })
        .await
}

pub(super) async fn shadow_all(AxState(st): AxState<AdminState>, change: Change) -> ApiResult {
    change
        .commit(&st, |q, _| Ok(Edit::ShadowAll { domain: q.domain() }))
        .await
}

pub(super) async fn status(AxState(st): AxState<AdminState>) -> ApiResult {
    match &st.inner.store {
        Some(store) => {
            let s = store.status().await?;
            let mut v = serde_json::to_value(s).map_err(|e| ApiError::internal(&e.to_string()))?;
            if let (Some(me), Some(m)) = (st.this_daemon(), v.as_object_mut()) {
                m.insert("this_daemon".into(), me);
            }
            ok(v)
        }
        None => {
            let (version, _) = st.current().await?;
            let mut v = json!({"version": version, "daemons": [], "source": "file"});
            if let (Some(me), Some(m)) = (st.this_daemon(), v.as_object_mut()) {
                m.insert("this_daemon".into(), me);
            }
            ok(v)
        }
    }
}

pub(super) async fn changes(
    AxState(st): AxState<AdminState>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let q = Query::parse(raw)?;
    let c = st.store()?.changes(q.limit()?).await?;
    ok(json!({"changes": c}))
}

pub(super) async fn export(AxState(st): AxState<AdminState>, RawQuery(raw): RawQuery) -> ApiResult {
    let q = Query::parse(raw)?;
    let (version, state) = st.current().await?;
    let docs: Vec<Value> = match q.domain() {
        Some(d) if state.domains().contains(d.as_str()) => vec![state.domain_doc(&d)],
        Some(d) => return Err(ApiError::not_found(format!("no domain {d:?}"))),
        None => state.to_docs(),
    };
    ok(json!({"version": version, "domains": docs}))
}
