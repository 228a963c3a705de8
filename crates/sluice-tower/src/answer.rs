//! The answers the layer gives itself: 429 for a client over its limit, 503 when the request
//! cannot be decided, and the decision's headers on a forwarded response.

use std::collections::HashMap;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use sluice_core::decision::problem_detail;
use sluice_proto::sluice::v1::CheckResponse;

/// The problem type of a 429 (RFC 9457; IANA's registered quota-exceeded type).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Sets the decision's rendered headers (`RateLimit-Policy`, `RateLimit`, `X-RateLimit-*`,
/// `Retry-After`) on `map`, replacing any of the same name. A name or value that is not a
/// valid header is skipped.
pub fn apply_headers(map: &mut HeaderMap, headers: &HashMap<String, String>) {
    for (name, value) in headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) else {
            tracing::debug!(%name, "skipping a decision header that is not a valid header");
            continue;
        };
        map.insert(name, value);
    }
}

/// `Retry-After` seconds for `ms`: rounded up, at least 1.
pub fn retry_after_secs(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// The policies a client may be told it violated: the refusing rule and any other policy at
/// zero remaining, each only if the daemon's `RateLimit-Policy` names it (`retry_only` rules
/// are left out of it, and so stay unnamed here). Without that header (the `X-RateLimit-*`
/// set alone), only the refusing rule, when the decision carries any rate limit header.
pub fn violated_policies(resp: &CheckResponse) -> Vec<String> {
    let policy = resp
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("ratelimit-policy"))
        .map(|(_, v)| v.as_str());
    let visible = |id: &str| match policy {
        Some(p) => p.contains(&format!("\"{id}\";")),
        None => resp
            .headers
            .keys()
            .any(|k| k.to_ascii_lowercase().starts_with("x-ratelimit-")),
    };
    let mut out: Vec<String> = Vec::new();
    if !resp.decided_by.is_empty() && visible(&resp.decided_by) {
        out.push(resp.decided_by.clone());
    }
    if policy.is_some() {
        for p in &resp.policies {
            if p.remaining == 0 && visible(&p.id) && !out.contains(&p.id) {
                out.push(p.id.clone());
            }
        }
    }
    out
}

/// The refusing rule's title, when the daemon sent one.
fn refusal_title(resp: &CheckResponse) -> Option<&str> {
    resp.policies
        .iter()
        .find(|p| p.id == resp.decided_by && !p.title.is_empty())
        .map(|p| p.title.as_str())
}

fn problem(status: StatusCode, body: serde_json::Value, retry_after: u64) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::from(body.to_string()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

/// The 429 for a refusal: the decision's headers, `Retry-After` in whole seconds, no caching,
/// and an RFC 9457 body naming the violated policies.
pub fn too_many_requests(resp: &CheckResponse) -> Response<Bytes> {
    let secs = retry_after_secs(resp.retry_after_ms);
    let body = serde_json::json!({
        "type": QUOTA_EXCEEDED,
        "title": "Too Many Requests",
        "status": 429,
        "detail": problem_detail(refusal_title(resp), secs),
        "violated-policies": violated_policies(resp),
    });
    let mut out = problem(StatusCode::TOO_MANY_REQUESTS, body, secs);
    let mut decided = HeaderMap::new();
    apply_headers(&mut decided, &resp.headers);
    for (name, value) in decided {
        // The layer's own Retry-After, Cache-Control and Content-Type stand.
        if let Some(name) = name.filter(|n| !out.headers().contains_key(n)) {
            out.headers_mut().insert(name, value);
        }
    }
    out
}

/// The edge guard's 429 for a client over its coarse flood rate: `Retry-After` in whole
/// seconds, no caching, an RFC 9457 body naming no policy (the rate is the gateway's own).
pub fn flood_refusal(retry_after_ms: u64) -> Response<Bytes> {
    let secs = retry_after_secs(retry_after_ms);
    let body = serde_json::json!({
        "type": QUOTA_EXCEEDED,
        "title": "Too Many Requests",
        "status": 429,
        "detail": format!("too many requests from this client; retry in {secs} s"),
    });
    problem(StatusCode::TOO_MANY_REQUESTS, body, secs)
}

/// The 503 when a request cannot be decided (`UNAVAILABLE`, or the limiter is down and the
/// layer fails closed): `Retry-After: 1`, no caching, an RFC 9457 body.
pub fn service_unavailable(detail: &str) -> Response<Bytes> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": detail,
    });
    problem(StatusCode::SERVICE_UNAVAILABLE, body, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::sluice::v1::PolicyStatus;

    fn policy(id: &str, remaining: u64) -> PolicyStatus {
        PolicyStatus {
            id: id.into(),
            limit: 10,
            window_s: 60,
            remaining,
            reset_s: 5,
            ..Default::default()
        }
    }

    #[test]
    fn retry_after_rounds_up_to_at_least_one_second() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1000), 1);
        assert_eq!(retry_after_secs(1001), 2);
        assert_eq!(retry_after_secs(59_999), 60);
    }

    #[test]
    fn the_refusing_rules_title_explains_the_429() {
        let mut resp = CheckResponse {
            decided_by: "login".into(),
            retry_after_ms: 59_001,
            policies: vec![PolicyStatus {
                id: "login".into(),
                retry_only: true,
                title: "Login attempts per account".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let body = |r: &CheckResponse| -> serde_json::Value {
            serde_json::from_slice(too_many_requests(r).body()).expect("json")
        };
        let b = body(&resp);
        assert_eq!(b["title"], "Too Many Requests");
        assert_eq!(b["detail"], "Login attempts per account: retry in 60 s");
        resp.policies[0].title.clear();
        assert_eq!(body(&resp)["detail"], "retry in 60 s");
    }

    #[test]
    fn only_policies_the_headers_name_are_violated() {
        let resp = CheckResponse {
            decided_by: "burst".into(),
            policies: vec![
                policy("burst", 0),
                policy("daily", 0),
                policy("otp", 0),
                policy("ok", 3),
            ],
            headers: [(
                "RateLimit-Policy".to_string(),
                "\"burst\";q=10;w=60, \"daily\";q=10;w=60, \"ok\";q=10;w=60".to_string(),
            )]
            .into(),
            ..Default::default()
        };
        assert_eq!(violated_policies(&resp), vec!["burst", "daily"]);
        let retry_only = CheckResponse {
            decided_by: "otp".into(),
            policies: vec![policy("otp", 0)],
            headers: [("Retry-After".to_string(), "60".to_string())].into(),
            ..Default::default()
        };
        assert!(violated_policies(&retry_only).is_empty());
        let x_only = CheckResponse {
            decided_by: "burst".into(),
            policies: vec![policy("burst", 0)],
            headers: [("X-RateLimit-Limit".to_string(), "10".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(violated_policies(&x_only), vec!["burst"]);
    }
}
