//! `GET /v1/decisions?rule=&identity=&since=&until=&limit=`: the newest records first, on the
//! admin listener behind the read token (the admin API's own auth layer). `until` pages back
//! through a window (a what-if reads whole windows from every daemon).
//!
//! Bounded: at most [`MAX_LIMIT`] records, read from at most [`MAX_SCAN`] bytes of the newest
//! files, on a blocking thread (the files are local disk, but a check never waits on them).

use super::DecisionLog;
use crate::clock::{Clock as _, SystemClock};
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use sluice_core::Micros;
use std::sync::Arc;

/// Records one answer holds at most.
pub const MAX_LIMIT: usize = 1000;
/// Records an answer holds without `limit`.
pub const DEFAULT_LIMIT: usize = 100;
/// Bytes of the newest files one request reads at most.
pub const MAX_SCAN: u64 = 64 * 1024 * 1024;

/// What a request asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    /// Records in which this rule applied.
    pub rule: Option<String>,
    /// Records of this identity (the record's, or one of its rules').
    pub identity: Option<String>,
    /// Records at or after this time, epoch µs.
    pub since: Option<Micros>,
    /// Records before this time, epoch µs.
    pub until: Option<Micros>,
    /// At most this many.
    pub limit: usize,
}

/// `since` or `until`: epoch microseconds, or a duration back from `now` (`5m`, `1h`).
fn time(field: &str, v: &str, now: Micros) -> Result<Micros, String> {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v
            .parse()
            .map_err(|_| format!("{field}: {v:?} is out of range"));
    }
    let back = sluice_core::time::parse_span(v)
        .ok()
        .and_then(|s| s.fixed())
        .ok_or_else(|| {
            format!("{field}: expected epoch microseconds or a duration like 5m, got {v:?}")
        })?;
    Ok(now.saturating_sub(back))
}

impl Filter {
    /// Parses a query string at `now`: `since` and `until` are epoch microseconds or a
    /// duration back from now (`5m`, `1h`).
    pub fn parse(query: Option<&str>, now: Micros) -> Result<Filter, String> {
        let mut f = Filter {
            limit: DEFAULT_LIMIT,
            ..Filter::default()
        };
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = v.replace('+', " ");
            let v = percent_encoding::percent_decode_str(&v)
                .decode_utf8()
                .map_err(|_| format!("{k}: not UTF-8"))?
                .into_owned();
            match k {
                "rule" => f.rule = Some(v),
                "identity" => f.identity = Some(v),
                "since" => f.since = Some(time("since", &v, now)?),
                "until" => f.until = Some(time("until", &v, now)?),
                "limit" => {
                    f.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| format!("limit: expected 1 to {MAX_LIMIT}, got {v:?}"))?
                }
                other => {
                    return Err(format!(
                        "unknown query field {other:?} (rule, identity, since, until, limit)"
                    ));
                }
            }
        }
        Ok(f)
    }

    /// Whether record `r` is asked for.
    pub fn matches(&self, r: &Value) -> bool {
        let rules = r.get("rules").and_then(Value::as_array);
        let any_rule = |field: &str, want: &str| {
            rules.is_some_and(|rs| {
                rs.iter()
                    .any(|x| x.get(field).and_then(Value::as_str) == Some(want))
            })
        };
        if let Some(since) = self.since
            && r.get("ts")
                .and_then(Value::as_u64)
                .is_none_or(|ts| ts < since)
        {
            return false;
        }
        if let Some(until) = self.until
            && r.get("ts")
                .and_then(Value::as_u64)
                .is_none_or(|ts| ts >= until)
        {
            return false;
        }
        if let Some(rule) = &self.rule
            && !any_rule("id", rule)
        {
            return false;
        }
        if let Some(id) = &self.identity
            && r.get("identity").and_then(Value::as_str) != Some(id.as_str())
            && !any_rule("identity", id)
        {
            return false;
        }
        true
    }
}

impl DecisionLog {
    /// The newest records `f` asks for, newest first (a partly written last line is skipped).
    pub fn query(&self, f: &Filter) -> std::io::Result<Vec<Value>> {
        self.scan(f).map(|(records, _)| records)
    }

    /// [`DecisionLog::query`], and whether [`MAX_SCAN`] stopped the read before the
    /// filter's `since` was reached.
    fn scan(&self, f: &Filter) -> std::io::Result<(Vec<Value>, bool)> {
        let mut out = Vec::new();
        let cut = super::files::newest_first_in(&self.dir, MAX_SCAN, f.since, f.until, |line| {
            if let Ok(v) = serde_json::from_str::<Value>(line)
                && f.matches(&v)
            {
                out.push(v);
            }
            out.len() < f.limit
        })?;
        Ok((out, cut))
    }
}

impl sluice_control::admin::DecisionSource for DecisionLog {
    /// Every record of the window, from the files that may hold it (at most [`MAX_SCAN`]
    /// bytes of them, newest first).
    fn window(
        &self,
        since: Option<Micros>,
        until: Option<Micros>,
    ) -> Result<sluice_control::admin::LogWindow, String> {
        let f = Filter {
            since,
            until,
            limit: usize::MAX,
            ..Filter::default()
        };
        let (records, cut) = self.scan(&f).map_err(|e| e.to_string())?;
        Ok(sluice_control::admin::LogWindow {
            records,
            partial: cut.then(|| {
                format!(
                    "only the newest {} MiB of this daemon's decision log were read: the \
                     window's start was not reached",
                    MAX_SCAN >> 20
                )
            }),
        })
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = json!({ "error": { "code": code, "message": message, "retryable": status.is_server_error() } });
    (status, axum::Json(body)).into_response()
}

async fn list(State(log): State<Arc<DecisionLog>>, RawQuery(q): RawQuery) -> Response {
    let f = match Filter::parse(q.as_deref(), SystemClock::new().now()) {
        Ok(f) => f,
        Err(e) => return error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", &e),
    };
    let read = tokio::task::spawn_blocking(move || log.query(&f)).await;
    match read {
        Ok(Ok(records)) => {
            axum::Json(json!({ "count": records.len(), "decisions": records })).into_response()
        }
        Ok(Err(e)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            &format!("reading the decision log: {e}"),
        ),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "reading the decision log failed",
        ),
    }
}

/// The route, for the admin listener (behind its tokens: see `control::spawn_admin`).
pub fn router(log: Arc<DecisionLog>) -> Router {
    Router::new()
        .route("/v1/decisions", get(list))
        .with_state(log)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_query_and_filters() {
        let now = 1_700_000_000_000_000;
        let f = Filter::parse(
            Some("rule=burst&identity=api%7Ck%3D1&since=5m&limit=3"),
            now,
        )
        .expect("valid");
        assert_eq!(f.rule.as_deref(), Some("burst"));
        assert_eq!(f.identity.as_deref(), Some("api|k=1"));
        assert_eq!(f.since, Some(now - 300_000_000));
        assert_eq!(f.limit, 3);
        assert!(Filter::parse(Some("limit=0"), now).is_err());
        assert!(Filter::parse(Some("limit=1001"), now).is_err());
        assert!(Filter::parse(Some("since=yesterday"), now).is_err());
        assert!(Filter::parse(Some("rules=x"), now).is_err());
        assert_eq!(
            Filter::parse(None, now).expect("empty").limit,
            DEFAULT_LIMIT
        );
        let r = json!({"ts": now, "identity": "api|k=1", "rules": [{"id": "burst", "identity": "api|k=1"}]});
        assert!(f.matches(&r));
        let mut g = f.clone();
        g.rule = Some("other".into());
        assert!(!g.matches(&r));
        g = f.clone();
        g.since = Some(now + 1);
        assert!(!g.matches(&r));
        let u = Filter::parse(Some("until=1h"), now).expect("until");
        assert_eq!(u.until, Some(now - 3_600_000_000));
        assert!(!u.matches(&r), "until is exclusive of later records");
        let u = Filter::parse(Some(&format!("until={}", now + 1)), now).expect("until");
        assert!(u.matches(&r));
        let u = Filter::parse(Some(&format!("until={now}")), now).expect("until");
        assert!(!u.matches(&r), "until is exclusive");
        assert!(Filter::parse(Some("until=soon"), now).is_err());
    }
}
