//! The decision rendered for clients: rate limit headers and the refusal's problem body,
//! from one [`Decision`], so every front end (HTTP, gRPC, Envoy) says the same thing.

use super::{Code, Decision, QuotaUnit};
use crate::time::ceil_secs;
use std::fmt::Write as _;

/// Which rate limit headers a response carries besides `Retry-After`.
///
/// Clients differ: envoyproxy/ratelimit and Limitador send the `X-RateLimit-*` trio, newer
/// clients read the IETF draft's `RateLimit-Policy` / `RateLimit` pair. Sending only what a
/// fleet's clients read saves rendering and bytes on every response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderSet {
    /// Both: the draft's pair and the `X-RateLimit-*` trio.
    #[default]
    All,
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
    Ratelimit,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    XRatelimit,
}

/// The response headers for a decision: `Retry-After` when refused; `RateLimit-Policy` and
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers, an item per policy named by rule id) and
/// `X-RateLimit-Limit/Remaining/Reset` for the most restrictive policy, leaving out
/// `retry_only` rules.
pub fn headers(d: &Decision) -> Vec<(&'static str, String)> {
    headers_of(d, HeaderSet::All)
}

/// [`headers`], limited to one [`HeaderSet`] (`Retry-After` is always sent on a refusal).
pub fn headers_of(d: &Decision, set: HeaderSet) -> Vec<(&'static str, String)> {
    let mut out = Vec::with_capacity(6);
    if d.code != Code::Ok {
        let secs = ceil_secs(d.retry_after_ms * 1000).max(1);
        out.push(("Retry-After", decimal(secs)));
    }
    let visible = || d.policies.iter().filter(|p| p.figures_visible());
    if visible().next().is_none() {
        return out;
    }
    if set != HeaderSet::XRatelimit {
        let mut policy = String::new();
        let mut state = String::new();
        for (i, p) in visible().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            match p.unit {
                QuotaUnit::Requests => {
                    let _ = write!(policy, "{sep}\"{}\";q={};w={}", p.id, p.limit, p.window_s);
                    let _ = write!(state, "{sep}\"{}\";r={};t={}", p.id, p.remaining, p.reset_s);
                }
                // Slots in flight have no window, and no time to "full": a slot frees when a
                // request ends. `t` only on a refusal: the wait `Retry-After` gives (until a
                // held slot expires at the latest).
                QuotaUnit::ConcurrentRequests => {
                    let _ = write!(
                        policy,
                        "{sep}\"{}\";q={};qu=\"{}\"",
                        p.id,
                        p.limit,
                        p.unit.as_str()
                    );
                    let _ = write!(state, "{sep}\"{}\";r={}", p.id, p.remaining);
                    if !p.allowed {
                        let _ = write!(state, ";t={}", p.reset_s);
                    }
                }
            }
        }
        out.push(("RateLimit-Policy", policy));
        out.push(("RateLimit", state));
    }
    if set == HeaderSet::Ratelimit {
        return out;
    }
    // Most restrictive: fewest remaining, then smallest share of its limit, then first.
    if let Some(p) = visible().min_by(|a, b| {
        a.remaining.cmp(&b.remaining).then(
            (u128::from(a.remaining) * u128::from(b.limit))
                .cmp(&(u128::from(b.remaining) * u128::from(a.limit))),
        )
    }) {
        out.push(("X-RateLimit-Limit", decimal(p.limit)));
        out.push(("X-RateLimit-Remaining", decimal(p.remaining)));
        out.push(("X-RateLimit-Reset", decimal(p.reset_s)));
    }
    out
}

/// `n` in decimal: itoa's digits, a fraction of `to_string`'s cost through `core::fmt`, on
/// every answer that carries headers.
fn decimal(n: u64) -> String {
    itoa::Buffer::new().format(n).to_owned()
}

/// The `detail` of a refusal's problem body: the refusing rule's `title` when it has one
/// (RFC 9457's `detail` explains this occurrence; `title` stays the problem type's own
/// summary), then the wait: "Login attempts per account: retry in 60 s".
pub fn problem_detail(title: Option<&str>, retry_s: u64) -> String {
    match title {
        Some(t) => format!("{t}: retry in {retry_s} s"),
        None => format!("retry in {retry_s} s"),
    }
}

/// An `application/problem+json` body for a refused request, naming the violated policies
/// the client may see.
pub fn problem_json(d: &Decision) -> String {
    let violated: Vec<&str> = d
        .policies
        .iter()
        .filter(|p| !p.allowed && p.figures_visible())
        .map(|p| &*p.id)
        .collect();
    let (status, title, kind) = match d.code {
        Code::Unavailable => (503, "Service Unavailable", "about:blank"),
        _ => (
            429,
            "Too Many Requests",
            "https://iana.org/assignments/http-problem-types#quota-exceeded",
        ),
    };
    let retry = ceil_secs(d.retry_after_ms * 1000).max(1);
    serde_json::json!({
        "type": kind,
        "title": title,
        "status": status,
        "detail": problem_detail(title_of_refusal(d), retry),
        "violated-policies": violated,
    })
    .to_string()
}

/// The refusing rule's `title`, if it has one.
fn title_of_refusal(d: &Decision) -> Option<&str> {
    let id = d.decided_by.as_ref()?;
    d.policies.iter().find(|p| p.id == *id)?.title.as_deref()
}

/// Seconds for a `Retry-After` of `ms` milliseconds.
pub fn retry_after_secs(ms: u64) -> u64 {
    ceil_secs(ms * 1000).max(1)
}
