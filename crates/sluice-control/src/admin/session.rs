//! Console sessions: what a browser holds after signing in once with a token, so the token
//! itself never sits in a cookie, a URL or the page.
//!
//! Sans-IO: the caller passes the time and the random bytes, so expiry and the CSRF check are
//! tested without a clock or a browser. The table lives in the daemon's memory: a restart
//! signs every browser out, and a session is valid only on the daemon that issued it.

use super::auth::constant_time_eq;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The cookie holding the session id.
pub(super) const COOKIE: &str = "sluice_session";
/// The header a console write carries its session's CSRF value in. A page on another site
/// cannot set it (it would need a CORS preflight this API never answers) nor read the value.
pub(super) const CSRF_HEADER: &str = "x-sluice-csrf";
/// A session ends this long after sign-in, however busy.
pub(super) const MAX_AGE: Duration = Duration::from_secs(8 * 3600);
/// A session ends after this long without a request (the console's refresh counts).
pub(super) const IDLE: Duration = Duration::from_secs(30 * 60);
/// Sessions held at most; past it, the one used longest ago goes.
const MAX_SESSIONS: usize = 1024;
/// Random bytes a session takes: 16 for its id, 16 for its CSRF value.
pub(super) const RANDOM_BYTES: usize = 32;

/// One signed-in browser.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Session {
    /// The principal of the token it signed in with.
    pub(super) principal: String,
    /// Signed in with an admin token: may write.
    pub(super) write: bool,
    /// What its writes must carry in [`CSRF_HEADER`].
    pub(super) csrf: String,
    created: Instant,
    last: Instant,
}

/// Why a session's request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refusal {
    /// No such session, or it expired.
    #[error("no session, or it expired: sign in again at /ui")]
    NoSession,
    /// A write without the session's CSRF value.
    #[error("a console write needs the session's X-Sluice-CSRF header")]
    Csrf,
    /// A write by a session signed in with a read token.
    #[error(
        "this session signed in with a read token: sign in with an admin token to change rules"
    )]
    ReadOnly,
}

/// Every live session, by id.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    by_id: HashMap<String, Session>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    /// Opens a session for `principal` at `now` from `random` (fresh OS randomness): its id
    /// (the cookie's value) and the session.
    pub(super) fn open(
        &mut self,
        principal: &str,
        write: bool,
        now: Instant,
        random: [u8; RANDOM_BYTES],
    ) -> (String, Session) {
        self.by_id.retain(|_, s| live(s, now));
        if self.by_id.len() >= MAX_SESSIONS
            && let Some(oldest) = self
                .by_id
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone())
        {
            self.by_id.remove(&oldest);
        }
        let id = hex(&random[..16]);
        let s = Session {
            principal: principal.to_string(),
            write,
            csrf: hex(&random[16..]),
            created: now,
            last: now,
        };
        self.by_id.insert(id.clone(), s.clone());
        (id, s)
    }

    /// The session `id` names at `now`, if live (and marks it used); an expired one is
    /// dropped.
    pub(super) fn get(&mut self, id: &str, now: Instant) -> Option<Session> {
        let s = self.by_id.get_mut(id)?;
        if !live(s, now) {
            self.by_id.remove(id);
            return None;
        }
        s.last = now;
        Some(s.clone())
    }

    /// Whether session `id` may make a request at `now`: any read; a write only with its CSRF
    /// value and an admin token's principal.
    pub(super) fn authorize(
        &mut self,
        id: &str,
        write: bool,
        csrf: Option<&str>,
        now: Instant,
    ) -> Result<Session, Refusal> {
        let s = self.get(id, now).ok_or(Refusal::NoSession)?;
        if write {
            let presented = csrf.unwrap_or_default();
            if !constant_time_eq(presented.as_bytes(), s.csrf.as_bytes()) {
                return Err(Refusal::Csrf);
            }
            if !s.write {
                return Err(Refusal::ReadOnly);
            }
        }
        Ok(s)
    }

    /// Ends session `id` (sign-out).
    pub(super) fn close(&mut self, id: &str) {
        self.by_id.remove(id);
    }
}

fn live(s: &Session, now: Instant) -> bool {
    now.saturating_duration_since(s.created) < MAX_AGE
        && now.saturating_duration_since(s.last) < IDLE
}

/// The session id in a `Cookie` header, if any.
pub(super) fn from_cookie(header: &str) -> Option<&str> {
    header
        .split(';')
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// The `Set-Cookie` value for session `id`: HttpOnly (no script reads it), SameSite=Strict
/// (no other site's page sends it), `Secure` on a TLS listener, and gone when the session
/// would end anyway.
pub(super) fn set_cookie(id: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        MAX_AGE.as_secs()
    )
}

/// The `Set-Cookie` value that removes the cookie (sign-out).
pub(super) fn clear_cookie(secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
}

/// Whether a request's `Origin` (when the browser sent one) is the listener it reached
/// (`Host`): a sign-in or a write posted from another site's page is refused even where a
/// browser would send the cookie.
pub(super) fn same_origin(origin: Option<&str>, host: Option<&str>) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((authority, host), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: u8) -> [u8; RANDOM_BYTES] {
        let mut r = [n; RANDOM_BYTES];
        r[16] = n.wrapping_add(1);
        r
    }

    #[test]
    fn a_session_expires_idle_or_old() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        let (id, _) = s.open("alice", true, t0, random(1));
        assert_eq!(id.len(), 32);
        assert!(s.get(&id, t0 + IDLE - Duration::from_secs(1)).is_some());
        // Idle counts from the last request.
        assert!(s.get(&id, t0 + 2 * IDLE).is_none());
        // Gone for good once expired.
        assert!(s.get(&id, t0).is_none());

        let (id, _) = s.open("alice", true, t0, random(2));
        let mut t = t0;
        while t < t0 + MAX_AGE - IDLE {
            t += IDLE / 2;
            assert!(s.get(&id, t).is_some(), "kept alive by use");
        }
        assert!(
            s.get(&id, t0 + MAX_AGE).is_none(),
            "ends at MAX_AGE however busy"
        );
    }

    #[test]
    fn writes_need_the_csrf_value_and_an_admin_principal() {
        let now = Instant::now();
        let mut s = Sessions::default();
        let (admin, a) = s.open("alice", true, now, random(3));
        let (read, r) = s.open("grafana", false, now, random(4));
        assert_ne!(a.csrf, r.csrf);
        assert!(s.authorize(&admin, false, None, now).is_ok());
        assert_eq!(
            s.authorize(&admin, true, None, now),
            Err(Refusal::Csrf),
            "a cross-site form cannot send the header"
        );
        assert_eq!(
            s.authorize(&admin, true, Some(&r.csrf), now),
            Err(Refusal::Csrf),
            "another session's value"
        );
        assert_eq!(
            s.authorize(&admin, true, Some(&a.csrf), now)
                .map(|s| s.principal),
            Ok("alice".into())
        );
        assert!(s.authorize(&read, false, None, now).is_ok());
        assert_eq!(
            s.authorize(&read, true, Some(&r.csrf), now),
            Err(Refusal::ReadOnly)
        );
        s.close(&admin);
        assert_eq!(
            s.authorize(&admin, false, None, now),
            Err(Refusal::NoSession)
        );
        assert_eq!(
            s.authorize("nope", false, None, now),
            Err(Refusal::NoSession)
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let now = Instant::now();
        let mut s = Sessions::default();
        let mut first = None;
        for i in 0..=MAX_SESSIONS {
            let mut r = [0u8; RANDOM_BYTES];
            r[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let (id, _) = s.open("p", false, now + Duration::from_millis(i as u64), r);
            first.get_or_insert(id);
        }
        assert_eq!(s.by_id.len(), MAX_SESSIONS);
        let first = first.expect("opened");
        assert!(s.get(&first, now).is_none(), "the oldest went");
    }

    #[test]
    fn cookies_and_origins() {
        assert_eq!(from_cookie("a=1; sluice_session=abc ; b=2"), Some("abc"));
        assert_eq!(from_cookie("sluice_session="), None);
        assert_eq!(from_cookie("other=1"), None);
        let c = set_cookie("abc", false);
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict"),
            "{c}"
        );
        assert!(!c.contains("Secure"), "{c}");
        assert!(set_cookie("abc", true).ends_with("; Secure"));
        assert!(clear_cookie(true).contains("Max-Age=0"));
        assert!(same_origin(None, Some("127.0.0.1:8082")));
        assert!(same_origin(
            Some("http://127.0.0.1:8082"),
            Some("127.0.0.1:8082")
        ));
        assert!(!same_origin(
            Some("https://evil.example"),
            Some("127.0.0.1:8082")
        ));
        assert!(!same_origin(Some("null"), Some("127.0.0.1:8082")));
    }
}
