//! Overrides' endpoints: list, put and delete the per-identity numbers or exemption of a
//! rule (or of every rule, `*`), the identity given in the path as `name=value,...`.

use super::AdminState;
use super::error::{ApiError, ApiResult, ok};
use super::request::{Change, Query, json_body};
use crate::edit::Edit;
use crate::model::Kind;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State as AxState};
use serde_json::json;
use std::collections::BTreeMap;

pub(super) async fn list_overrides(
    AxState(st): AxState<AdminState>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let q = Query::parse(raw)?;
    let domain = q.domain();
    let (version, state) = st.current().await?;
    let mut out = Vec::new();
    for d in state.domains() {
        if domain.as_deref().is_some_and(|want| want != d) {
            continue;
        }
        for (k, e) in state.list(d, Kind::Override) {
            out.push(json!({"domain": d, "key": k.key, "override": e.body}));
        }
    }
    ok(json!({"version": version, "overrides": out}))
}

/// `name=value,name=value` from the path. Names cannot hold `,` or `=`, so a piece without
/// `name=` continues the previous value (a value may contain commas).
fn parse_identity(s: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for piece in s.split(',') {
        let named = piece.split_once('=').filter(|(n, _)| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        });
        match (named, out.last_mut()) {
            (Some((n, v)), _) => out.push((n.to_string(), v.to_string())),
            (None, Some(last)) => {
                last.1.push(',');
                last.1.push_str(piece);
            }
            (None, None) => {
                return Err(ApiError::bad(format!(
                    "the identity must be name=value[,name=value...], got {s:?}"
                )));
            }
        }
    }
    let n = out.len();
    let map: BTreeMap<String, String> = out.into_iter().collect();
    if map.len() != n {
        return Err(ApiError::bad(format!(
            "a name appears twice in the identity {s:?}"
        )));
    }
    Ok(map)
}

fn rule_part(rule: &str) -> Option<String> {
    (rule != "*").then(|| rule.to_string())
}

pub(super) async fn put_override(
    AxState(st): AxState<AdminState>,
    Path((rule, identity)): Path<(String, String)>,
    change: Change,
    body: Bytes,
) -> ApiResult {
    change
        .commit(&st, |q, _| {
            Ok(Edit::PutOverride {
                domain: q.domain(),
                rule: rule_part(&rule),
                identity: parse_identity(&identity)?,
                body: json_body(&body)?,
            })
        })
        .await
}

pub(super) async fn delete_override(
    AxState(st): AxState<AdminState>,
    Path((rule, identity)): Path<(String, String)>,
    change: Change,
) -> ApiResult {
    change
        .commit(&st, |q, _| {
            Ok(Edit::DeleteOverride {
                domain: q.domain(),
                rule: rule_part(&rule),
                identity: parse_identity(&identity)?,
            })
        })
        .await
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_parse_with_commas_in_values() {
        let m = parse_identity("api_key=k1,ip=1.2.3.4").expect("ok");
        assert_eq!(m["api_key"], "k1");
        assert_eq!(m["ip"], "1.2.3.4");
        let m = parse_identity("route=GET /a,b").expect("ok");
        assert_eq!(m["route"], "GET /a,b");
        assert!(parse_identity("novalue").is_err());
        assert!(parse_identity("a=1,a=2").is_err());
    }
}
