//! A request as the descriptors the rules key on: `route`, `method`, `api_key`, `tier`, `ip`.

use std::collections::HashMap;

use http::{HeaderMap, Request};

use crate::config::Config;
use crate::ip::client_ip;

/// The descriptors of `req` under `config`. A descriptor the request does not carry (no key,
/// no tier header, no peer address) is left out, so rules keyed on it do not apply.
pub fn descriptors<B>(config: &Config, req: &Request<B>) -> HashMap<String, String> {
    let mut d = HashMap::with_capacity(5);
    d.insert(
        "route".to_string(),
        config.routes.route(req.method(), req.uri().path()),
    );
    d.insert("method".to_string(), req.method().as_str().to_string());
    if let Some(key) = api_key(config, req.headers()) {
        d.insert("api_key".to_string(), key);
    }
    if let Some(tier) = config
        .tier_header
        .as_ref()
        .and_then(|h| header_str(req.headers(), h))
    {
        d.insert("tier".to_string(), tier.to_string());
    }
    if let Some(peer) = (config.peer)(req.extensions()) {
        let ip = client_ip(peer, req.headers(), &config.trusted_proxies);
        d.insert("ip".to_string(), ip.to_string());
    }
    d
}

/// A header's value as non-empty trimmed text, if it is one.
fn header_str<'a>(headers: &'a HeaderMap, name: &http::HeaderName) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The API key: the configured header, else `Authorization: Bearer <token>` (scheme in any
/// case).
fn api_key(config: &Config, headers: &HeaderMap) -> Option<String> {
    if let Some(key) = config
        .api_key_header
        .as_ref()
        .and_then(|h| header_str(headers, h))
    {
        return Some(key.to_string());
    }
    if !config.bearer_api_key {
        return None;
    }
    let auth = header_str(headers, &http::header::AUTHORIZATION)?;
    let (scheme, token) = auth.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Routes;
    use http::HeaderName;
    use std::net::SocketAddr;

    fn config() -> Config {
        let mut c = Config::new("api");
        c.routes = Routes::new(["/v1/users/{id}"], "*").expect("valid");
        c.api_key_header = Some(HeaderName::from_static("x-api-key"));
        c.tier_header = Some(HeaderName::from_static("x-tier"));
        c.trusted_proxies = vec!["10.0.0.0/8".parse().expect("cidr")];
        c
    }

    fn request(
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        peer: Option<&str>,
    ) -> Request<()> {
        let mut b = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut req = b.body(()).expect("request");
        if let Some(p) = peer {
            let addr: SocketAddr = p.parse().expect("addr");
            req.extensions_mut().insert(addr);
        }
        req
    }

    #[test]
    fn route_method_key_tier_and_ip() {
        let req = request(
            "GET",
            "/v1/users/42?x=1",
            &[("x-api-key", "k1"), ("x-tier", "gold")],
            Some("198.51.100.7:5000"),
        );
        let d = descriptors(&config(), &req);
        let want: HashMap<String, String> = [
            ("route", "GET /v1/users/{id}"),
            ("method", "GET"),
            ("api_key", "k1"),
            ("tier", "gold"),
            ("ip", "198.51.100.7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(d, want);
    }

    #[test]
    fn unmatched_paths_get_the_fallback_and_absent_parts_are_left_out() {
        let d = descriptors(&config(), &request("POST", "/health", &[], None));
        assert_eq!(d.get("route").map(String::as_str), Some("POST *"));
        assert!(!d.contains_key("api_key"));
        assert!(!d.contains_key("tier"));
        assert!(!d.contains_key("ip"));
    }

    #[test]
    fn the_key_header_comes_before_bearer_and_bearer_can_be_off() {
        let c = config();
        let both = request(
            "GET",
            "/",
            &[("x-api-key", "hdr"), ("authorization", "Bearer tok")],
            None,
        );
        assert_eq!(descriptors(&c, &both)["api_key"], "hdr");
        let bearer = request("GET", "/", &[("authorization", "bearer  tok ")], None);
        assert_eq!(descriptors(&c, &bearer)["api_key"], "tok");
        let basic = request("GET", "/", &[("authorization", "Basic dXNlcg==")], None);
        assert!(!descriptors(&c, &basic).contains_key("api_key"));
        let mut off = config();
        off.bearer_api_key = false;
        assert!(!descriptors(&off, &bearer).contains_key("api_key"));
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let c = config();
        let spoofed = request(
            "GET",
            "/",
            &[("x-forwarded-for", "1.1.1.1")],
            Some("203.0.113.5:1"),
        );
        assert_eq!(descriptors(&c, &spoofed)["ip"], "203.0.113.5");
        let proxied = request(
            "GET",
            "/",
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.9")],
            Some("10.1.1.1:1"),
        );
        assert_eq!(descriptors(&c, &proxied)["ip"], "198.51.100.9");
    }
}
