//! The admin HTTP API: operators change rules without a deploy.
//!
//! Served by each daemon on its own listener (`--admin-addr`, default `127.0.0.1:8082`), so it
//! can be firewalled apart from the check API. Every write goes to PostgreSQL as one versioned
//! transaction ([`crate::store`]) and reaches every daemon by push; the daemon serving the
//! request is not special. Bodies are in the rule format (JSON).
//!
//! ```text
//! GET    /v1/rules[?domain=D&route=...]      list (other query fields filter on `match`)
//! GET    /v1/rules/{id}                       one rule
//! PUT    /v1/rules/{id}[?domain=D&force=true] create or replace
//! DELETE /v1/rules/{id}
//! POST   /v1/rules/{id}:shadow | :enforce | :off
//! GET    /v1/rules/{id}/history               every version of the rule
//! POST   /v1/rules:apply                      {"domains":[...],"dry_run":true} whole domains
//! POST   /v1/rules:rollback                   {"to_version": 42}
//! POST   /v1/rules:shadow-all[?domain=D]      kill switch: every enforcing rule to shadow
//! GET    /v1/rules:status                     the version each daemon serves
//! GET    /v1/rules:history                    the latest versions: who, when, what
//! GET    /v1/rules:export                     every domain as rule-format documents
//! GET    /v1/overrides[?domain=D]
//! PUT    /v1/overrides/{rule}/{name=value,...}  numbers or {"exempt":true}; rule `*` = all
//! DELETE /v1/overrides/{rule}/{name=value,...}
//! GET    /healthz                             no token needed
//! ```
//!
//! Every write answers with the new version (`{"version": 43, "changed": true, ...}`); `force`
//! and `dry_run` are query flags (`?force=true`) or, for POSTs with a JSON body, fields.
//! Errors are `{"error": {"code", "message", "problems"?, "retryable"}}`.
//!
//! Auth: `SLUICE_ADMIN_TOKEN` for writes, `SLUICE_READ_TOKEN` (or the admin token) for reads,
//! as `Authorization: Bearer <token>`, compared in constant time. With no token configured
//! the API is open, and [`serve_admin`] refuses to listen on anything but loopback.
//! `X-Sluice-Actor: alice` names who made a change in the history (self-declared: the token
//! is what authenticates).

use crate::Published;
use crate::edit::Edit;
use crate::model::{Kind, State};
use crate::store::{CommitError, CommitOptions, Store};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{
    DefaultBodyLimit, FromRequestParts, Path, RawQuery, Request, State as AxState,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

/// Largest request body for one rule or override.
const MAX_BODY: usize = 256 * 1024;
/// Largest `apply` body (whole domains).
const MAX_APPLY_BODY: usize = 32 * 1024 * 1024;

/// Tokens, from configuration or the environment.
#[derive(Clone, Default)]
pub struct AdminConfig {
    /// Required for writes (`SLUICE_ADMIN_TOKEN`); also allows reads.
    pub admin_token: Option<String>,
    /// Allows reads (`SLUICE_READ_TOKEN`).
    pub read_token: Option<String>,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a token.
        f.debug_struct("AdminConfig")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<set>"))
            .field("read_token", &self.read_token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl AdminConfig {
    /// Tokens from `SLUICE_ADMIN_TOKEN` and `SLUICE_READ_TOKEN` (empty = unset).
    pub fn from_env() -> AdminConfig {
        let var = |k| {
            std::env::var(k)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        AdminConfig {
            admin_token: var("SLUICE_ADMIN_TOKEN"),
            read_token: var("SLUICE_READ_TOKEN"),
        }
    }

    /// Fills what is unset here from the environment (configuration wins).
    pub fn or_env(self) -> AdminConfig {
        let env = AdminConfig::from_env();
        AdminConfig {
            admin_token: self.admin_token.or(env.admin_token),
            read_token: self.read_token.or(env.read_token),
        }
    }

    fn open(&self) -> bool {
        self.admin_token.is_none() && self.read_token.is_none()
    }
}

/// Why the admin API could not be served.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No token is configured and the address is reachable from other hosts.
    #[error(
        "refusing to serve the admin API on {addr} without a token: set SLUICE_ADMIN_TOKEN \
         (and SLUICE_READ_TOKEN for read-only access), or bind it to 127.0.0.1"
    )]
    Insecure {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The listener failed.
    #[error("admin API: {0}")]
    Io(#[from] std::io::Error),
}

/// Refuses an open (token-less) admin API on a non-loopback address. Call it before binding
/// to fail fast on a bad configuration; [`serve_admin`] calls it too.
pub fn check_exposure(addr: SocketAddr, auth: &AdminConfig) -> Result<(), AdminError> {
    if auth.open() && !addr.ip().is_loopback() {
        return Err(AdminError::Insecure { addr });
    }
    Ok(())
}

/// Compares two secrets in time that depends only on their lengths, never on where they
/// first differ, so a token cannot be guessed byte by byte from response times.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    let n = a.len().max(b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// What the admin API serves from: PostgreSQL (read-write) or a daemon's published set
/// (read-only, for daemons whose rules come from a YAML file).
#[derive(Clone, Debug)]
pub struct AdminState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Option<Arc<Store>>,
    published: Option<Arc<Published>>,
    auth: AdminConfig,
}

impl AdminState {
    /// The full API over PostgreSQL.
    pub fn postgres(store: Arc<Store>, auth: AdminConfig) -> AdminState {
        AdminState {
            inner: Arc::new(Inner {
                store: Some(store),
                published: None,
                auth,
            }),
        }
    }

    /// Reads only, from the rules a daemon serves (the YAML file source); writes answer
    /// 501 and say to edit the file.
    pub fn read_only(published: Arc<Published>, auth: AdminConfig) -> AdminState {
        AdminState {
            inner: Arc::new(Inner {
                store: None,
                published: Some(published),
                auth,
            }),
        }
    }

    fn store(&self) -> Result<&Arc<Store>, ApiError> {
        self.inner.store.as_ref().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "READ_ONLY_SOURCE",
                "this daemon reads its rules from a YAML file: edit the file (it is reloaded \
                 when it changes), or run the daemons with --postgres to manage rules here",
            )
        })
    }

    async fn current(&self) -> Result<(u64, State), ApiError> {
        if let Some(store) = &self.inner.store {
            return Ok(store.current().await?);
        }
        let set = self
            .inner
            .published
            .as_ref()
            .map(|p| p.load())
            .ok_or_else(|| ApiError::internal("no rule source"))?;
        let docs: Vec<Value> = set.domains.values().map(|d| d.to_value()).collect();
        let state = State::from_docs(&docs).map_err(|e| ApiError::internal(&e.to_string()))?;
        Ok((set.version, state))
    }
}

/// An error answer: status, stable code, message, and the validation problems if any.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    problems: Option<Value>,
    retryable: bool,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            problems: None,
            retryable: false,
        }
    }

    fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }

    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
    }

    fn internal(message: &str) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", message)
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(e: crate::db::DbError) -> ApiError {
        let retryable = e.is_retryable();
        let (status, code) = if retryable {
            (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
        } else {
            (StatusCode::INTERNAL_SERVER_ERROR, "DATABASE_ERROR")
        };
        ApiError {
            retryable,
            ..ApiError::new(status, code, e.to_string())
        }
    }
}

impl From<CommitError> for ApiError {
    fn from(e: CommitError) -> ApiError {
        let message = e.to_string();
        match e {
            CommitError::Db(db) => db.into(),
            CommitError::NotFound(_) => ApiError::not_found(message),
            CommitError::BadRequest(_) => ApiError::bad(message),
            CommitError::Invalid(rules) => ApiError {
                problems: Some(Value::Array(
                    rules
                        .problems
                        .iter()
                        .map(|p| json!({"at": p.at, "field": p.field, "message": p.message}))
                        .collect(),
                )),
                ..ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "INVALID_RULES", message)
            },
            CommitError::Tightening(msgs) => ApiError {
                problems: Some(json!(msgs)),
                ..ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "TIGHTENING_REFUSED",
                    message,
                )
            },
            CommitError::Conflict { .. } => {
                ApiError::new(StatusCode::CONFLICT, "CONFLICT", message)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut err =
            json!({"code": self.code, "message": self.message, "retryable": self.retryable});
        if let Some(p) = self.problems {
            err["problems"] = p;
        }
        let mut resp = (self.status, axum::Json(json!({"error": err}))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"sluice-admin\""),
            );
        }
        resp
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok(v: Value) -> ApiResult {
    Ok(axum::Json(v).into_response())
}

/// Who is asking, as established by the auth layer.
#[derive(Clone, Debug)]
struct Caller {
    role: &'static str,
}

/// The admin API's routes over `state`.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/v1/rules", get(list_rules))
        .route(
            "/v1/rules:apply",
            post(apply_docs).layer(DefaultBodyLimit::max(MAX_APPLY_BODY)),
        )
        .route("/v1/rules:rollback", post(rollback))
        .route("/v1/rules:shadow-all", post(shadow_all))
        .route("/v1/rules:status", get(status))
        .route("/v1/rules:history", get(changes))
        .route("/v1/rules:export", get(export))
        .route(
            "/v1/rules/{id}",
            get(get_rule)
                .put(put_rule)
                .delete(delete_rule)
                .post(rule_action),
        )
        .route("/v1/rules/{id}/history", get(rule_history))
        .route("/v1/overrides", get(list_overrides))
        .route(
            "/v1/overrides/{rule}/{identity}",
            put(put_override).delete(delete_override),
        )
        .fallback(|| async {
            ApiError::not_found("no such endpoint; see docs/control-plane.md for the admin API")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// Serves the admin API on `listener` until `shutdown` completes (then drains in-flight
/// requests). Refuses an open API on a non-loopback address ([`check_exposure`]).
pub async fn serve_admin<F>(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: F,
) -> Result<(), AdminError>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let addr = listener.local_addr()?;
    check_exposure(addr, &state.inner.auth)?;
    tracing::info!(%addr, read_only = state.inner.store.is_none(), auth = !state.inner.auth.open(), "admin API listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

async fn authenticate(AxState(st): AxState<AdminState>, mut req: Request, next: Next) -> Response {
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let write = !matches!(*req.method(), Method::GET | Method::HEAD);
    let auth = &st.inner.auth;
    let role = if auth.open() {
        Ok("loopback (no token)")
    } else {
        let presented = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        let is = |t: &Option<String>, p: &str| {
            t.as_deref()
                .is_some_and(|t| constant_time_eq(t.as_bytes(), p.as_bytes()))
        };
        match presented {
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHENTICATED",
                "send Authorization: Bearer <token> (SLUICE_ADMIN_TOKEN for changes, \
                 SLUICE_READ_TOKEN for reads)",
            )),
            Some(p) if is(&auth.admin_token, p) => Ok("admin token"),
            Some(p) if is(&auth.read_token, p) => {
                if write {
                    Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "PERMISSION_DENIED",
                        "the read token cannot change rules; use SLUICE_ADMIN_TOKEN",
                    ))
                } else {
                    Ok("read token")
                }
            }
            Some(_) => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHENTICATED",
                "the token is not valid here",
            )),
        }
    };
    match role {
        Ok(role) => {
            req.extensions_mut().insert(Caller { role });
            next.run(req).await
        }
        Err(e) => {
            tracing::warn!(method = %req.method(), path = %req.uri().path(), code = e.code, "admin request refused");
            e.into_response()
        }
    }
}

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
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: Option<String>) -> Result<Query, ApiError> {
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

    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    fn flag(&self, k: &str) -> Result<bool, ApiError> {
        match self.get(k) {
            None => Ok(false),
            Some("" | "true" | "1" | "yes") => Ok(true),
            Some("false" | "0" | "no") => Ok(false),
            Some(other) => Err(ApiError::bad(format!(
                "{k} must be true or false, got {other:?}"
            ))),
        }
    }

    fn limit(&self) -> Result<i64, ApiError> {
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

    fn domain(&self) -> Option<String> {
        self.get("domain").map(str::to_string)
    }
}

fn options(
    headers: &HeaderMap,
    caller: Option<&Caller>,
    q: &Query,
) -> Result<CommitOptions, ApiError> {
    let role = caller.map_or("unknown", |c| c.role);
    let actor = headers
        .get("x-sluice-actor")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|a| !a.is_empty() && a.len() <= 128 && a.chars().all(|c| !c.is_control()))
        .map_or_else(|| role.to_string(), |a| format!("{a} ({role})"));
    Ok(CommitOptions {
        actor,
        force: q.flag("force")?,
        dry_run: q.flag("dry_run")?,
        expect_version: None,
    })
}

fn json_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))
}

async fn commit(st: &AdminState, edit: Edit, opts: CommitOptions) -> ApiResult {
    let done = st.store()?.commit(&edit, &opts).await?;
    ok(serde_json::to_value(done).map_err(|e| ApiError::internal(&e.to_string()))?)
}

/// What every change request brings besides its path and body: the query (`domain`, `force`,
/// `dry_run`), the headers (`X-Sluice-Actor`) and the caller the auth layer established.
/// Taking it never fails, so a bad query is still reported after the body is read.
struct Change {
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
    async fn commit(
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
fn body_flags(opts: &mut CommitOptions, v: &Value) {
    opts.force |= v.get("force").and_then(Value::as_bool).unwrap_or(false);
    opts.dry_run |= v.get("dry_run").and_then(Value::as_bool).unwrap_or(false);
}

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

async fn list_rules(AxState(st): AxState<AdminState>, RawQuery(raw): RawQuery) -> ApiResult {
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

async fn get_rule(
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

async fn put_rule(
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

async fn delete_rule(
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

async fn rule_action(
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

async fn rule_history(
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

async fn apply_docs(AxState(st): AxState<AdminState>, change: Change, body: Bytes) -> ApiResult {
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

async fn rollback(AxState(st): AxState<AdminState>, change: Change, body: Bytes) -> ApiResult {
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

async fn shadow_all(AxState(st): AxState<AdminState>, change: Change) -> ApiResult {
    change
        .commit(&st, |q, _| Ok(Edit::ShadowAll { domain: q.domain() }))
        .await
}

async fn status(AxState(st): AxState<AdminState>) -> ApiResult {
    match &st.inner.store {
        Some(store) => {
            let s = store.status().await?;
            ok(serde_json::to_value(s).map_err(|e| ApiError::internal(&e.to_string()))?)
        }
        None => {
            let (version, _) = st.current().await?;
            ok(json!({"version": version, "daemons": [], "source": "file"}))
        }
    }
}

async fn changes(AxState(st): AxState<AdminState>, RawQuery(raw): RawQuery) -> ApiResult {
    let q = Query::parse(raw)?;
    let c = st.store()?.changes(q.limit()?).await?;
    ok(json!({"changes": c}))
}

async fn export(AxState(st): AxState<AdminState>, RawQuery(raw): RawQuery) -> ApiResult {
    let q = Query::parse(raw)?;
    let (version, state) = st.current().await?;
    let docs: Vec<Value> = match q.domain() {
        Some(d) if state.domains().contains(d.as_str()) => vec![state.domain_doc(&d)],
        Some(d) => return Err(ApiError::not_found(format!("no domain {d:?}"))),
        None => state.to_docs(),
    };
    ok(json!({"version": version, "domains": docs}))
}

async fn list_overrides(AxState(st): AxState<AdminState>, RawQuery(raw): RawQuery) -> ApiResult {
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

async fn put_override(
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

async fn delete_override(
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
    fn constant_time_eq_is_plain_equality() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
        // A shorter prefix padded with what the longer one holds must still differ.
        assert!(!constant_time_eq(b"ab\xff", b"ab"));
    }

    #[test]
    fn open_api_only_on_loopback() {
        let open = AdminConfig::default();
        let lo: SocketAddr = "127.0.0.1:8082".parse().expect("addr");
        let any: SocketAddr = "0.0.0.0:8082".parse().expect("addr");
        assert!(check_exposure(lo, &open).is_ok());
        assert!(matches!(
            check_exposure(any, &open),
            Err(AdminError::Insecure { .. })
        ));
        let with = AdminConfig {
            admin_token: Some("hunter2".into()),
            read_token: None,
        };
        assert!(check_exposure(any, &with).is_ok());
        assert!(
            !format!("{with:?}").contains("hunter2"),
            "tokens are never printed"
        );
    }

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
