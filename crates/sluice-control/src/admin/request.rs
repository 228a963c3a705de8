//! What a request brings besides its path: the query string (decoded strictly, with its
//! `domain`, `limit` and flags), the JSON body, and for a change the commit options (actor,
//! `force`, `dry_run`) that [`Change`] turns, with the edit, into one commit.

use super::AdminState;
use super::auth::Caller;
use super::error::{ApiError, ApiResult, ok};
use crate::edit::Edit;
use crate::store::CommitOptions;
use axum::body::Bytes;
use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::IntoResponse as _;
use serde_json::Value;
use std::convert::Infallible;

/// Decodes a query component (`+` as a space when `plus_is_space`); a `%` not followed by two
/// hex digits, or bytes that are not UTF-8, are a 400 (the `percent-encoding` crate would keep
/// a bad escape as sent).
fn percent_decode(s: &str, plus_is_space: bool) -> Result<String, ApiError> {
    let b = s.as_bytes();
    let bad_escape = b.iter().enumerate().any(|(i, &c)| {
        c == b'%'
            && !b
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if bad_escape {
        return Err(ApiError::bad(format!("bad percent-encoding in {s:?}")));
    }
    let spaced;
    let raw = if plus_is_space && s.contains('+') {
        spaced = s.replace('+', " ");
        spaced.as_str()
    } else {
        s
    };
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| ApiError::bad(format!("{s:?} is not UTF-8")))
}

/// Query string as decoded pairs, in order.
pub(super) struct Query(pub(super) Vec<(String, String)>);

impl Query {
    pub(super) fn parse(raw: Option<String>) -> Result<Query, ApiError> {
        let mut v = Vec::new();
        for part in raw
            .as_deref()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, val) = part.split_once('=').unwrap_or((part, ""));
            v.push((percent_decode(k, true)?, percent_decode(val, true)?));
        }
        Ok(Query(v))
    }

    pub(super) fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    pub(super) fn flag(&self, k: &str) -> Result<bool, ApiError> {
        match self.get(k) {
            None => Ok(false),
            Some("" | "true" | "1" | "yes") => Ok(true),
            Some("false" | "0" | "no") => Ok(false),
            Some(other) => Err(ApiError::bad(format!(
                "{k} must be true or false, got {other:?}"
            ))),
        }
    }

    pub(super) fn limit(&self) -> Result<i64, ApiError> {
        match self.get("limit") {
            None => Ok(100),
            Some(s) => match s.parse::<i64>() {
                Ok(n) if (1..=1000).contains(&n) => Ok(n),
                _ => Err(ApiError::bad(format!(
                    "limit must be a whole number from 1 to 1000, got {s:?}"
                ))),
            },
        }
    }

    pub(super) fn domain(&self) -> Option<String> {
        self.get("domain").map(str::to_string)
    }
}

fn options(
    headers: &HeaderMap,
    caller: Option<&Caller>,
    q: &Query,
) -> Result<CommitOptions, ApiError> {
    let principal = caller.map_or_else(|| super::ANONYMOUS.to_string(), |c| c.principal.clone());
    let actor = headers
        .get("x-sluice-actor")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|a| !a.is_empty() && a.len() <= 128 && a.chars().all(|c| !c.is_control()))
        .map_or_else(|| principal.clone(), str::to_string);
    Ok(CommitOptions {
        actor,
        principal,
        force: q.flag("force")?,
        dry_run: q.flag("dry_run")?,
        expect_version: None,
        approval: None,
    })
}

pub(super) fn json_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))
}

async fn commit(st: &AdminState, edit: Edit, opts: CommitOptions) -> ApiResult {
    let done = st.store()?.commit(&edit, &opts).await?;
    let held = done.pending.is_some();
    let v = serde_json::to_value(done).map_err(|e| ApiError::internal(&e.to_string()))?;
    if held {
        // Accepted, not applied: it waits for a second principal.
        return Ok((axum::http::StatusCode::ACCEPTED, axum::Json(v)).into_response());
    }
    ok(v)
}

/// What every change request brings besides its path and body: the query (`domain`, `force`,
/// `dry_run`), the headers (`X-Sluice-Actor`) and the caller the auth layer established.
/// Taking it never fails, so a bad query is still reported after the body is read.
pub(super) struct Change {
    raw: Option<String>,
    headers: HeaderMap,
    caller: Option<Caller>,
}

impl<S: Send + Sync> FromRequestParts<S> for Change {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Change, Infallible> {
        Ok(Change {
            raw: parts.uri.query().map(str::to_string),
            headers: parts.headers.clone(),
            caller: parts.extensions.get::<Caller>().cloned(),
        })
    }
}

impl Change {
    /// Parses the query and the commit options, makes the edit of them (which may amend the
    /// options from the body) and commits it: each handler says only what its edit is.
    pub(super) async fn commit(
        self,
        st: &AdminState,
        edit: impl FnOnce(&Query, &mut CommitOptions) -> Result<Edit, ApiError>,
    ) -> ApiResult {
        let q = Query::parse(self.raw)?;
        let mut opts = options(&self.headers, self.caller.as_ref(), &q)?;
        let edit = edit(&q, &mut opts)?;
        commit(st, edit, opts).await
    }
}

/// `force` and `dry_run` from a JSON body, on top of the query's.
pub(super) fn body_flags(opts: &mut CommitOptions, v: &Value) {
    opts.force |= v.get("force").and_then(Value::as_bool).unwrap_or(false);
    opts.dry_run |= v.get("dry_run").and_then(Value::as_bool).unwrap_or(false);
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_flags_are_strict() {
        let q = Query::parse(Some("route=POST%20%2Fv1%2Fpay&force=true&x=a+b".into())).expect("ok");
        assert_eq!(q.get("route"), Some("POST /v1/pay"));
        assert_eq!(q.get("x"), Some("a b"));
        assert!(q.flag("force").expect("flag"));
        assert!(!q.flag("dry_run").expect("flag"));
        let bad = Query::parse(Some("force=maybe".into())).expect("ok");
        assert!(bad.flag("force").is_err());
        assert!(Query::parse(Some("a=%zz".into())).is_err());
    }
}
