//! Who may call the admin API: the tokens, each naming its principal (admin for changes, read
//! for reads, compared in constant time), the refusal to serve an open API beyond loopback, and the layer that
//! establishes the [`Caller`] of every request.

use super::error::ApiError;
use super::session;
use super::{AdminError, AdminState};
use axum::extract::{Request, State as AxState};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;

/// One bearer token and the principal it authenticates: the name recorded with every change
/// made with it, and the one a second approver must differ from.
#[derive(Clone)]
pub struct Token {
    /// Who holds it (`alice`, `deploy-bot`).
    pub principal: String,
    /// The secret.
    pub secret: String,
}

impl Token {
    /// A token for `principal`.
    pub fn new(principal: impl Into<String>, secret: impl Into<String>) -> Token {
        Token {
            principal: principal.into(),
            secret: secret.into(),
        }
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a token.
        write!(f, "Token({:?}, <redacted>)", self.principal)
    }
}

/// A token as configured (`admin_tokens: [{principal: alice, token_file: /run/secrets/alice}]`):
/// the secret inline (`token`) or, better, in a file of its own (`token_file`, trimmed).
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    /// Who holds it.
    pub principal: String,
    /// The secret itself.
    #[serde(default)]
    pub token: Option<String>,
    /// A file holding the secret.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for TokenSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSpec")
            .field("principal", &self.principal)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .finish()
    }
}

impl TokenSpec {
    /// Reads the secret (from the file if one is named).
    pub fn load(&self) -> Result<Token, AdminError> {
        let bad = |m: String| AdminError::Tokens(format!("principal {:?}: {m}", self.principal));
        let p = self.principal.trim();
        if p.is_empty() || p.len() > 64 || p.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad(
                "a principal is 1 to 64 characters without spaces".into()
            ));
        }
        let secret = match (&self.token, &self.token_file) {
            (Some(t), None) => t.trim().to_string(),
            (None, Some(f)) => std::fs::read_to_string(f)
                .map_err(|e| bad(format!("reading {}: {e}", f.display())))?
                .trim()
                .to_string(),
            _ => return Err(bad("give exactly one of token and token_file".into())),
        };
        if secret.is_empty() {
            return Err(bad("the token is empty".into()));
        }
        Ok(Token::new(p, secret))
    }
}

/// Tokens, from configuration or the environment: admin tokens allow changes (and reads),
/// read tokens only reads. Each names its principal.
#[derive(Clone, Debug, Default)]
pub struct AdminConfig {
    /// Allowed to change rules.
    pub admin: Vec<Token>,
    /// Allowed to read.
    pub read: Vec<Token>,
}

/// The principal of `SLUICE_ADMIN_TOKEN` (and of a single `admin_token` in the config).
pub const ENV_ADMIN_PRINCIPAL: &str = "admin";
/// The principal of `SLUICE_READ_TOKEN` (and of a single `read_token`).
pub const ENV_READ_PRINCIPAL: &str = "read";
/// The principal of every caller of an open (token-less, loopback-only) API: one principal,
/// so a held change cannot be approved there.
pub const ANONYMOUS: &str = "anonymous";

impl AdminConfig {
    /// One admin token (principal `admin`) and one read token (principal `read`), as
    /// `SLUICE_ADMIN_TOKEN` and `SLUICE_READ_TOKEN` give them.
    pub fn single(admin: Option<String>, read: Option<String>) -> AdminConfig {
        AdminConfig {
            admin: admin
                .map(|t| Token::new(ENV_ADMIN_PRINCIPAL, t))
                .into_iter()
                .collect(),
            read: read
                .map(|t| Token::new(ENV_READ_PRINCIPAL, t))
                .into_iter()
                .collect(),
        }
    }

    /// Tokens from `SLUICE_ADMIN_TOKEN` and `SLUICE_READ_TOKEN` (empty = unset).
    pub fn from_env() -> AdminConfig {
        let var = |k| {
            std::env::var(k)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        AdminConfig::single(var("SLUICE_ADMIN_TOKEN"), var("SLUICE_READ_TOKEN"))
    }

    /// Fills what is unset here from the environment (configuration wins: the environment's
    /// admin token counts only when no admin token is configured, likewise for reads).
    pub fn or_env(self) -> AdminConfig {
        let env = AdminConfig::from_env();
        AdminConfig {
            admin: if self.admin.is_empty() {
                env.admin
            } else {
                self.admin
            },
            read: if self.read.is_empty() {
                env.read
            } else {
                self.read
            },
        }
    }

    /// Refuses a secret given to two principals (which one made a change would be a guess).
    pub fn check(&self) -> Result<(), AdminError> {
        let all: Vec<&Token> = self.admin.iter().chain(&self.read).collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                if constant_time_eq(a.secret.as_bytes(), b.secret.as_bytes()) {
                    return Err(AdminError::Tokens(format!(
                        "principals {:?} and {:?} have the same token",
                        a.principal, b.principal
                    )));
                }
            }
        }
        Ok(())
    }

    pub(super) fn open(&self) -> bool {
        self.admin.is_empty() && self.read.is_empty()
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
    /// The token's principal ([`ANONYMOUS`] on an open API).
    pub(super) principal: String,
}

/// The principal `presented` authenticates: `(admin, read)`, each `None` when no token of
/// that kind matches. Every token is compared (no early exit), so the time does not say which
/// matched.
pub(super) fn principal_of(
    auth: &AdminConfig,
    presented: &str,
) -> (Option<String>, Option<String>) {
    let find = |ts: &[Token]| {
        let mut found = None;
        for t in ts {
            if constant_time_eq(t.secret.as_bytes(), presented.as_bytes()) && found.is_none() {
                found = Some(t.principal.clone());
            }
        }
        found
    };
    (find(&auth.admin), find(&auth.read))
}

/// Whether `path` is the console's own (`/ui`, `/ui/...`): its handlers decide between the
/// sign-in form and the page themselves.
fn console_path(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// A browser's request with a console session cookie and no token: reads for any session, a
/// write only from this origin, with the session's CSRF value, by an admin token's principal.
fn session_principal(
    st: &AdminState,
    req: &Request,
    id: &str,
    write: bool,
) -> Result<String, ApiError> {
    let h = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    if write && !session::same_origin(h(header::ORIGIN.as_str()), h(header::HOST.as_str())) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "a console write must come from the console's own origin",
        ));
    }
    let csrf = h(session::CSRF_HEADER);
    st.console()
        .authorize(id, write, csrf, std::time::Instant::now())
        .map(|s| s.principal)
        .map_err(|r| {
            let status = match r {
                session::Refusal::NoSession => StatusCode::UNAUTHORIZED,
                _ => StatusCode::FORBIDDEN,
            };
            let code = match r {
                session::Refusal::NoSession => "UNAUTHENTICATED",
                _ => "PERMISSION_DENIED",
            };
            ApiError::new(status, code, r.to_string())
        })
}

pub(super) async fn authenticate(
    AxState(st): AxState<AdminState>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.uri().path() == "/healthz" || console_path(req.uri().path()) {
        return next.run(req).await;
    }
    let write = !matches!(*req.method(), Method::GET | Method::HEAD);
    let auth = &st.inner.auth;
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let cookie = req
        .headers()
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(session::from_cookie)
        .map(str::to_string);
    let principal = if auth.open() {
        Ok(ANONYMOUS.to_string())
    } else {
        match (presented.map(|p| principal_of(auth, p)), cookie) {
            (None, Some(id)) => session_principal(&st, &req, &id, write),
            (None, None) => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHENTICATED",
                "send Authorization: Bearer <token> (an admin token for changes, a read \
                 token for reads), or sign in at /ui",
            )),
            (Some((Some(principal), _)), _) => Ok(principal),
            (Some((None, Some(principal))), _) => {
                if write {
                    Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "PERMISSION_DENIED",
                        "a read token cannot change rules; use an admin token",
                    ))
                } else {
                    Ok(principal)
                }
            }
            (Some((None, None)), _) => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHENTICATED",
                "the token is not valid here",
            )),
        }
    };
    match principal {
        Ok(principal) => {
            req.extensions_mut().insert(Caller { principal });
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
        let with = AdminConfig::single(Some("hunter2".into()), None);
        assert!(check_exposure(any, &with).is_ok());
        assert!(
            !format!("{with:?}").contains("hunter2"),
            "tokens are never printed"
        );
    }

    #[test]
    fn token_specs_load_and_a_shared_secret_is_refused() {
        let dir = std::env::temp_dir().join(format!("sluice-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("alice");
        std::fs::write(&file, "alice-secret\n").expect("write");
        let from_file = TokenSpec {
            principal: "alice".into(),
            token: None,
            token_file: Some(file),
        };
        let t = from_file.load().expect("loads");
        assert_eq!(
            (t.principal.as_str(), t.secret.as_str()),
            ("alice", "alice-secret")
        );
        assert!(!format!("{t:?}").contains("alice-secret"));
        let both = TokenSpec {
            token: Some("x".into()),
            ..from_file.clone()
        };
        assert!(both.load().is_err(), "token and token_file together");
        let spaced = TokenSpec {
            principal: "a b".into(),
            token: Some("x".into()),
            token_file: None,
        };
        assert!(spaced.load().is_err());
        let shared = AdminConfig {
            admin: vec![Token::new("alice", "same"), Token::new("bob", "same")],
            read: vec![],
        };
        assert!(shared.check().is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
