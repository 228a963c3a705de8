//! Who may call the admin API: the tokens (admin for changes, read for reads, compared in
//! constant time), the refusal to serve an open API beyond loopback, and the layer that
//! establishes the [`Caller`] of every request.

use super::error::ApiError;
use super::{AdminError, AdminState};
use axum::extract::{Request, State as AxState};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;

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

    pub(super) fn open(&self) -> bool {
        self.admin_token.is_none() && self.read_token.is_none()
    }
}

/// Refuses an open (token-less) admin API on a non-loopback address. Call it before binding
/// to fail fast on a bad configuration; [`serve_admin`](super::serve_admin) calls it too.
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

/// Who is asking, as established by the auth layer.
#[derive(Clone, Debug)]
pub(super) struct Caller {
    pub(super) role: &'static str,
}

pub(super) async fn authenticate(
    AxState(st): AxState<AdminState>,
    mut req: Request,
    next: Next,
) -> Response {
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
}
