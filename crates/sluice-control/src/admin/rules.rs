//! One rule's endpoints: list (filtered by domain and `match` fields), get, put, delete,
//! set its mode (`:shadow`, `:enforce`, `:off`) and its history.

use super::AdminState;
use super::error::{ApiError, ApiResult, ok};
use super::request::{Change, Query, json_body};
use crate::edit::Edit;
use crate::model::{Kind, State};
use crate::store::CommitError;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State as AxState};
use serde_json::{Value, json};

fn rule_json(state: &State, domain: &str, id: &str) -> Option<Value> {
    let e = state
        .entries
        .get(&crate::model::EntryKey::rule(domain, id))?;
    Some(json!({"domain": domain, "id": id, "position": e.position, "rule": e.body}))
}

/// Whether a rule's `match` is consistent with the filter: each filtered field is absent
/// from the rule, `*`, or equal.
fn matches_filter(body: &Value, filter: &[(String, String)]) -> bool {
    let m = body.get("match").and_then(Value::as_object);
    filter.iter().all(|(k, v)| match m.and_then(|m| m.get(k)) {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s == "*" || s == v,
        Some(other) => other.to_string().as_str() == v.as_str(),
    })
}

pub(super) async fn list_rules(
    AxState(st): AxState<AdminState>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let q = Query::parse(raw)?;
    let domain = q.domain();
    let filter: Vec<(String, String)> =
        q.0.iter().filter(|(k, _)| k != "domain").cloned().collect();
    let (version, state) = st.current().await?;
    let mut rules = Vec::new();
    for d in state.domains() {
        if domain.as_deref().is_some_and(|want| want != d) {
            continue;
        }
        for (k, e) in state.list(d, Kind::Rule) {
            if matches_filter(&e.body, &filter) {
                rules.push(
                    json!({"domain": d, "id": k.key, "position": e.position, "rule": e.body}),
                );
            }
        }
    }
    ok(json!({"version": version, "rules": rules}))
}

pub(super) async fn get_rule(
    AxState(st): AxState<AdminState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let q = Query::parse(raw)?;
    let (version, state) = st.current().await?;
    let domain = crate::edit::resolve_domain(&state, q.domain().as_deref(), Some(&id), false)
        .map_err(CommitError::from)?;
    let mut v = rule_json(&state, &domain, &id)
        .ok_or_else(|| ApiError::not_found(format!("no rule {id:?} in domain {domain:?}")))?;
    v["version"] = json!(version);
    ok(v)
}

pub(super) async fn put_rule(
    AxState(st): AxState<AdminState>,
    Path(id): Path<String>,
    change: Change,
    body: Bytes,
) -> ApiResult {
    change
        .commit(&st, |q, _| {
            Ok(Edit::PutRule {
                domain: q.domain(),
                id,
                body: json_body(&body)?,
            })
        })
        .await
}

pub(super) async fn delete_rule(
    AxState(st): AxState<AdminState>,
    Path(id): Path<String>,
    change: Change,
) -> ApiResult {
    change
        .commit(&st, |q, _| {
            Ok(Edit::DeleteRule {
                domain: q.domain(),
                id,
            })
        })
        .await
}

pub(super) async fn rule_action(
    AxState(st): AxState<AdminState>,
    Path(id_action): Path<String>,
    change: Change,
) -> ApiResult {
    change
        .commit(&st, |q, _| {
            // Rule ids may contain ':', the action never does: split at the last one.
            let Some((id, action)) = id_action.rsplit_once(':') else {
                return Err(ApiError::not_found(format!(
                    "POST /v1/rules/{id_action} needs an action: /v1/rules/{id_action}:shadow, :enforce or :off"
                )));
            };
            let mode = match action {
                "shadow" => "shadow",
                "enforce" => "enforce",
                "off" => "off",
                other => {
                    return Err(ApiError::not_found(format!(
                        "unknown action {other:?}; expected shadow, enforce or off"
                    )));
                }
            };
            Ok(Edit::SetMode {
                domain: q.domain(),
                id: id.to_string(),
                mode,
            })
        })
        .await
}

pub(super) async fn rule_history(
    AxState(st): AxState<AdminState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let q = Query::parse(raw)?;
    let items = st
        .store()?
        .history(Kind::Rule, q.domain().as_deref(), &id, q.limit()?)
        .await?;
    if items.is_empty() {
        return Err(ApiError::not_found(format!("rule {id:?} has no history")));
    }
    ok(json!({"id": id, "history": items}))
}
