//! The operator console at `/ui`: one page over the admin API's own reads (rules, daemons,
//! pending changes, the decision log, the daemon's `GET /v1/daemon`), served from the binary
//! (HTML, CSS and JS by `include_str!`, nothing fetched from elsewhere).
//!
//! A browser signs in once by posting a token to `/ui/login` and gets a session cookie
//! ([`super::session`]); the token is never stored in the browser nor put in a URL. Every
//! later call goes through the admin API's one auth layer, which takes the cookie as it takes
//! a bearer token: reads for any session, writes for a session of an admin token's principal
//! carrying its CSRF value. Without a session `/ui` is the sign-in form and the API answers 401.

use super::AdminState;
use super::auth::principal_of;
use super::session::{self, RANDOM_BYTES, Sessions};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State as AxState;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

const LOGIN_HTML: &str = include_str!("console/login.html");
const CONSOLE_HTML: &str = include_str!("console/console.html");
const CONSOLE_CSS: &str = include_str!("console/console.css");
const CONSOLE_JS: &str = include_str!("console/console.js");

/// Everything the page loads comes from this listener; no frame may hold it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's sessions and whether its cookies are `Secure` (a TLS listener).
#[derive(Debug, Default)]
pub(super) struct Console {
    sessions: Mutex<Sessions>,
    secure: AtomicBool,
}

impl Console {
    fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Sessions::authorize`] on the shared table.
    pub(super) fn authorize(
        &self,
        id: &str,
        write: bool,
        csrf: Option<&str>,
        now: Instant,
    ) -> Result<session::Session, session::Refusal> {
        self.sessions().authorize(id, write, csrf, now)
    }

    pub(super) fn set_secure(&self, on: bool) {
        self.secure.store(on, Ordering::Relaxed);
    }

    fn secure(&self) -> bool {
        self.secure.load(Ordering::Relaxed)
    }
}

/// The console's routes (outside the token layer: each handler checks the session itself).
pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/console.css", get(css))
        .route("/ui/console.js", get(js))
        .route("/ui/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
}

fn cookie_session(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(session::from_cookie)
        .map(str::to_string)
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Escapes text for an HTML element or a double-quoted attribute.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_FRAME_OPTIONS, "DENY"),
            // `no-referrer` would make the browser send `Origin: null` with the sign-in form.
            (header::REFERRER_POLICY, "same-origin"),
        ],
        body,
    )
        .into_response()
}

fn login_page(status: StatusCode, error: &str) -> Response {
    let error = if error.is_empty() {
        String::new()
    } else {
        format!(
            "<p class=\"error\" id=\"login-error\">{}</p>",
            escape(error)
        )
    };
    html(status, LOGIN_HTML.replace("{{error}}", &error))
}

fn console_page(principal: &str, write: bool, csrf: &str) -> Response {
    let body = CONSOLE_HTML
        .replace("{{principal}}", &escape(principal))
        .replace("{{write}}", if write { "true" } else { "false" })
        .replace("{{csrf}}", &escape(csrf));
    html(StatusCode::OK, body)
}

async fn page(AxState(st): AxState<AdminState>, headers: HeaderMap) -> Response {
    if st.inner.auth.open() {
        // No token configured (loopback only): the API is open, so is its console.
        return console_page(super::ANONYMOUS, true, "");
    }
    let now = Instant::now();
    match cookie_session(&headers).and_then(|id| st.console().sessions().get(&id, now)) {
        Some(s) => console_page(&s.principal, s.write, &s.csrf),
        None => login_page(StatusCode::OK, ""),
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", CONSOLE_CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", CONSOLE_JS)
}

/// The `token` field of a form body (`application/x-www-form-urlencoded`).
fn form_token(body: &[u8]) -> Option<String> {
    let body = std::str::from_utf8(body).ok()?;
    body.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "token").then(|| {
            let v = v.replace('+', " ");
            percent_encoding::percent_decode_str(&v)
                .decode_utf8()
                .ok()
                .map(|t| t.trim().to_string())
        })?
    })
}

async fn login(AxState(st): AxState<AdminState>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = &st.inner.auth;
    if auth.open() {
        return redirect_to_console(None);
    }
    if !session::same_origin(
        header_str(&headers, header::ORIGIN),
        header_str(&headers, header::HOST),
    ) {
        tracing::warn!("console sign-in refused: posted from another origin");
        return login_page(
            StatusCode::FORBIDDEN,
            "Sign in from this console's own page.",
        );
    }
    let Some(token) = form_token(&body).filter(|t| !t.is_empty()) else {
        return login_page(StatusCode::BAD_REQUEST, "Enter a token.");
    };
    let (principal, write) = match principal_of(auth, &token) {
        (Some(p), _) => (p, true),
        (None, Some(p)) => (p, false),
        (None, None) => {
            tracing::warn!("console sign-in refused: the token is not valid here");
            return login_page(StatusCode::UNAUTHORIZED, "That token is not valid here.");
        }
    };
    let mut random = [0u8; RANDOM_BYTES];
    if getrandom::fill(&mut random).is_err() {
        return login_page(
            StatusCode::INTERNAL_SERVER_ERROR,
            "No randomness for a session on this host.",
        );
    }
    let (id, _) = st
        .console()
        .sessions()
        .open(&principal, write, Instant::now(), random);
    tracing::info!(%principal, write, "console sign-in");
    redirect_to_console(Some(session::set_cookie(&id, st.console().secure())))
}

fn redirect_to_console(cookie: Option<String>) -> Response {
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/ui")]).into_response();
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

/// Sign-out: the session ends and the cookie is cleared. Needs the session's CSRF value, so
/// another site cannot sign an operator out either.
async fn logout(AxState(st): AxState<AdminState>, headers: HeaderMap) -> Response {
    let console = st.console();
    if let Some(id) = cookie_session(&headers) {
        let csrf = header_str(
            &headers,
            header::HeaderName::from_static(session::CSRF_HEADER),
        );
        let mut sessions = console.sessions();
        match sessions.get(&id, Instant::now()) {
            Some(s)
                if super::constant_time_eq(
                    csrf.unwrap_or_default().as_bytes(),
                    s.csrf.as_bytes(),
                ) =>
            {
                sessions.close(&id);
                tracing::info!(principal = %s.principal, "console sign-out");
            }
            Some(_) => {
                return (
                    StatusCode::FORBIDDEN,
                    "sign-out needs the session's X-Sluice-CSRF header\n",
                )
                    .into_response();
            }
            None => {}
        }
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    if let Ok(c) = HeaderValue::from_str(&session::clear_cookie(console.secure())) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_token_is_decoded_and_html_escaped() {
        assert_eq!(form_token(b"token=a%2Bb+c"), Some("a+b c".into()));
        assert_eq!(form_token(b"x=1&token=%20t%20"), Some("t".into()));
        assert_eq!(form_token(b"tokens=1"), None);
        assert_eq!(form_token(&[0xff]), None);
        assert_eq!(
            escape("<a href=\"x\">'&"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;"
        );
    }

    #[test]
    fn the_page_has_its_placeholders_and_no_external_asset() {
        for p in ["{{principal}}", "{{write}}", "{{csrf}}"] {
            assert!(CONSOLE_HTML.contains(p), "{p}");
        }
        assert!(LOGIN_HTML.contains("{{error}}"));
        for page in [LOGIN_HTML, CONSOLE_HTML, CONSOLE_CSS, CONSOLE_JS] {
            assert!(!page.contains("http://") && !page.contains("https://"));
        }
    }
}
