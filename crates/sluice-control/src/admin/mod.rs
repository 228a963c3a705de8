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
//! POST   /v1/rules:what-if                    {"domains":[...],"since":"1h"} replay the log
//! GET    /v1/rules:status                     the version each daemon serves
//! GET    /v1/rules:history                    the latest versions: who, when, what
//! GET    /v1/rules:export                     every domain as rule-format documents
//! GET    /v1/overrides[?domain=D]
//! PUT    /v1/overrides/{rule}/{name=value,...}  numbers or {"exempt":true}; rule `*` = all
//! DELETE /v1/overrides/{rule}/{name=value,...}
//! GET    /v1/pending[?all=true]               changes held for a second principal
//! POST   /v1/pending/{id}:approve | :reject   another principal applies it, or anyone drops it
//! GET    /ui                                  the operator console (sign-in form without a session)
//! GET    /healthz                             no token needed
//! ```
//!
//! Every write answers with the new version (`{"version": 43, "changed": true, ...}`); `force`
//! and `dry_run` are query flags (`?force=true`) or, for POSTs with a JSON body, fields.
//! Errors are `{"error": {"code", "message", "problems"?, "retryable"}}`.
//!
//! Auth: admin tokens for writes, read tokens (or an admin token) for reads, as
//! `Authorization: Bearer <token>`, compared in constant time. Each token names a principal
//! (`SLUICE_ADMIN_TOKEN` is `admin`), recorded with every version; a forced tightening of
//! more than 10× is held until a different principal approves it. With no token configured
//! the API is open (one principal, `anonymous`), and [`serve_admin`] refuses to listen on
//! anything but loopback. `X-Sluice-Actor: alice` adds a self-declared name to the history.
//!
//! # Layout
//!
//! - `console`: the operator console at `/ui` (page, sign-in, sign-out).
//! - `session`: console sessions: cookie, expiry, CSRF value.
//! - `auth`: tokens ([`AdminConfig`]), the loopback rule for an open API, the auth layer.
//! - `error`: the error answer every handler returns.
//! - `extra`: a daemon's own routes behind the same tokens ([`behind_tokens`]).
//! - `request`: what a request brings: the query, the JSON body, the commit options.
//! - `rules`: one rule (`/v1/rules`, `/v1/rules/{id}`).
//! - `versions`: the whole set and its versions (`/v1/rules:apply`, `:rollback`, …).
//! - `overrides`: `/v1/overrides`.
//! - `pending`: `/v1/pending`: held changes, approve and reject.
//! - `whatif`: `/v1/rules:what-if` over the daemon's decision log ([`what_if_routes`]).

mod auth;
mod console;
mod error;
mod extra;
pub use extra::behind_tokens;
mod overrides;
mod pending;
mod request;
mod rules;
mod session;
mod versions;
mod whatif;
pub use whatif::{DecisionSource, LogWindow, what_if_routes};

pub use auth::{
    ANONYMOUS, AdminConfig, ENV_ADMIN_PRINCIPAL, ENV_READ_PRINCIPAL, Token, TokenSpec,
    check_exposure, constant_time_eq,
};

use crate::Published;
use crate::model::State;
use crate::store::Store;
use auth::authenticate;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post, put};
use error::ApiError;
use overrides::{delete_override, list_overrides, put_override};
use pending::{list_pending, pending_action};
use rules::{delete_rule, get_rule, list_rules, put_rule, rule_action, rule_history};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use versions::{apply_docs, changes, export, rollback, shadow_all, status};

/// Largest request body for one rule or override.
const MAX_BODY: usize = 256 * 1024;
/// Largest `apply` body (whole domains).
const MAX_APPLY_BODY: usize = 32 * 1024 * 1024;

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
    /// A configured token is unusable (unreadable file, empty, shared by two principals).
    #[error("admin tokens: {0}")]
    Tokens(String),
    /// The listener failed.
    #[error("admin API: {0}")]
    Io(#[from] std::io::Error),
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
    /// The set the daemon serving this API runs (over PostgreSQL too), for its own entry
    /// in `GET /v1/rules:status`.
    serving: Option<Arc<Published>>,
    auth: AdminConfig,
    console: console::Console,
}

impl AdminState {
    /// The full API over PostgreSQL.
    pub fn postgres(store: Arc<Store>, auth: AdminConfig) -> AdminState {
        AdminState {
            inner: Arc::new(Inner {
                store: Some(store),
                published: None,
                serving: None,
                auth,
                console: Default::default(),
            }),
        }
    }

    /// [`AdminState::postgres`] on a daemon serving `served`: `GET /v1/rules:status` also
    /// says what each rule does on this very daemon (enforced, or shadowed by its
    /// `enforce_on`), current to the second rather than to its last report.
    pub fn postgres_serving(
        store: Arc<Store>,
        auth: AdminConfig,
        served: Arc<Published>,
    ) -> AdminState {
        AdminState {
            inner: Arc::new(Inner {
                store: Some(store),
                published: None,
                serving: Some(served),
                auth,
                console: Default::default(),
            }),
        }
    }

    /// Reads only, from the rules a daemon serves (the YAML file source); writes answer
    /// 501 and say to edit the file.
    pub fn read_only(published: Arc<Published>, auth: AdminConfig) -> AdminState {
        AdminState {
            inner: Arc::new(Inner {
                store: None,
                published: Some(published.clone()),
                serving: Some(published),
                auth,
                console: Default::default(),
            }),
        }
    }

    /// Marks the console's session cookies `Secure`: call it when the listener serves TLS.
    pub fn set_secure_cookies(&self, on: bool) {
        self.inner.console.set_secure(on);
    }

    fn console(&self) -> &console::Console {
        &self.inner.console
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

    /// This daemon's own entry for `GET /v1/rules:status`: its id and what each rule does
    /// here ([`crate::placements_json`]).
    fn this_daemon(&self) -> Option<serde_json::Value> {
        let p = self.inner.serving.as_ref()?;
        let set = p.load();
        Some(serde_json::json!({
            "daemon_id": p.daemon(),
            "version": set.version,
            "rules": crate::placements_json(&set),
        }))
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
        .route("/v1/pending", get(list_pending))
        .route("/v1/pending/{id}", post(pending_action))
        .merge(console::routes())
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
    state.inner.auth.check()?;
    check_exposure(addr, &state.inner.auth)?;
    tracing::info!(%addr, read_only = state.inner.store.is_none(), auth = !state.inner.auth.open(), "admin API listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
