//! What the fuzz targets share: a daemon's engine on the memory store with a fixed clock,
//! and one property check per surface. The targets in `fuzz_targets/` feed libFuzzer's bytes
//! to these checks, and the crates' `tests/fuzz_regressions.rs` replay the committed inputs
//! through the same public functions (docs/fuzzing.md).

use prost::Message as _;
use sluice_core::rules::{RuleSet, from_values, parse_yaml};
use sluice_proto::envoy::service::ratelimit::v3 as rls;
use sluice_proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService as _;
use sluice_proto::sluice::v1 as pb;
use sluice_proto::sluice::v1::limiter_server::Limiter as _;
use sluiced::engine::Engine;
use sluiced::envoy::{EnvoyConfig, MAX_ENVOY_DESCRIPTORS, RateLimitService};
use sluiced::grpc::LimiterService;
use std::sync::{Arc, LazyLock};

/// Rules covering every algorithm, a matcher on the Envoy keys descriptor, shadow and
/// retry-only policies, so decoded requests reach every decision path.
pub const RULES: &str = r#"
domain: edge
rules:
  - { id: per-user, key: [user], algorithm: fixed_window, limit: 3, window: 1m }
  - { id: per-ip, match: { envoy.keys: remote_address }, key: [remote_address], algorithm: fixed_window, limit: 100, window: 10s }
  - { id: otp, key: [otp_user], algorithm: fixed_window, limit: 1, window: 1h, headers: retry_only }
  - { id: tb, key: [api_key], algorithm: token_bucket, rate_per_s: 5, burst: 10 }
  - { id: gc, key: [api_key, route], algorithm: gcra, rate_per_s: 2, burst: 2 }
  - { id: sw, key: [tenant], algorithm: sliding_window, limit: 5, window: 1s }
  - { id: sl, key: [tenant, route], algorithm: sliding_log, limit: 3, window: 1s, mode: shadow }
  - { id: cc, key: [job], algorithm: concurrency, limit: 2, timeout: 30s }
---
domain: api
rules:
  - { id: a, key: [k], algorithm: token_bucket, rate_per_s: 5, burst: 5 }
  - { id: b, key: [k], algorithm: sliding_window, limit: 5, window: 1s }
  - { id: c, key: [], algorithm: sliding_log, limit: 3, window: 1s }
"#;

/// A fresh engine on the memory store at a fixed wall time.
pub fn engine() -> Arc<Engine> {
    let set = parse_yaml(RULES).expect("the fuzz rules are valid");
    let engine = Engine::new(
        sluice_control::Published::new(set),
        Arc::new(sluice_store::MemoryStore::new(10_000)),
        Arc::new(sluiced::metrics::Metrics::default()),
        500,
        std::time::Duration::from_millis(50),
        "fuzz".into(),
        sluice_core::breaker::BreakerConfig::default(),
    )
    .with_clock(Arc::new(sluiced::clock::ManualClock::new(
        1_700_000_000_000_000,
    )));
    Arc::new(engine)
}

/// A current-thread runtime with timers (the HTTP body deadline needs them).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(runtime);
static ENVOY: LazyLock<RateLimitService> =
    LazyLock::new(|| RateLimitService::new(engine(), EnvoyConfig::default()));
static LIMITER: LazyLock<LimiterService> = LazyLock::new(|| LimiterService { engine: engine() });

/// Envoy RLS: the bytes as the gRPC port decodes them (`prost` decode of the message the
/// length prefix framed), then `ShouldRateLimit` as the port calls it. A request either is
/// refused as `INVALID_ARGUMENT` or answered with one status per descriptor, at most
/// [`MAX_ENVOY_DESCRIPTORS`], the overall code `OVER_LIMIT` exactly when one status is.
pub fn envoy_rls(data: &[u8]) {
    let Ok(req) = rls::RateLimitRequest::decode(data) else {
        return;
    };
    let n = req.descriptors.len();
    let bad_shape = req.domain.is_empty()
        || n == 0
        || n > MAX_ENVOY_DESCRIPTORS
        || req.descriptors.iter().any(|d| d.entries.is_empty());
    let r = RT.block_on(ENVOY.should_rate_limit(tonic::Request::new(req)));
    match r {
        Ok(resp) => {
            let resp = resp.into_inner();
            assert!(!bad_shape, "a malformed request was answered");
            assert_eq!(resp.statuses.len(), n, "one status per descriptor");
            let over = rls::rate_limit_response::Code::OverLimit as i32;
            let any_over = resp.statuses.iter().any(|s| s.code == over);
            assert_eq!(resp.overall_code == over, any_over, "overall code");
            assert!(
                resp.statuses.iter().all(|s| s.code != 0),
                "a status without a code"
            );
            assert!(
                resp.response_headers_to_add
                    .iter()
                    .all(|h| !h.key.is_empty())
            );
            let _ = resp.encode_to_vec();
        }
        Err(s) => {
            assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
            assert!(!s.message().is_empty());
        }
    }
}

/// sluice.v1: the first byte picks `Check` or `Release`, the rest is the message. A check
/// is refused as `INVALID_ARGUMENT` or answered with `allowed` agreeing with its code, and
/// a refusal names its rule.
pub fn sluice_v1(data: &[u8]) {
    let Some((&which, msg)) = data.split_first() else {
        return;
    };
    if which & 1 == 0 {
        let Ok(req) = pb::CheckRequest::decode(msg) else {
            return;
        };
        match RT.block_on(LIMITER.check(tonic::Request::new(req))) {
            Ok(r) => {
                let r = r.into_inner();
                assert_eq!(r.allowed, r.code == pb::Code::Ok as i32, "allowed vs code");
                assert!(r.code != pb::Code::Unspecified as i32);
                for p in &r.policies {
                    assert!(p.remaining <= p.limit, "remaining above the limit: {p:?}");
                }
                assert!(
                    r.allowed || !r.decided_by.is_empty(),
                    "a refusal names no rule"
                );
                let _ = r.encode_to_vec();
            }
            Err(s) => assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}"),
        }
    } else {
        let Ok(req) = pb::ReleaseRequest::decode(msg) else {
            return;
        };
        match RT.block_on(LIMITER.release(tonic::Request::new(req))) {
            Ok(r) => {
                let _ = r.into_inner().encode_to_vec();
            }
            Err(s) => assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}"),
        }
    }
}

static HTTP: LazyLock<axum::Router> = LazyLock::new(|| {
    sluiced::http::router(
        engine(),
        Arc::new(sluiced::limits::Guard::new(Default::default())),
    )
});

/// HTTP JSON: the first byte picks `/v1/limits:check` or `:release`, the rest is the body,
/// sent through the daemon's router. Every body is answered 200 or 400 (413 past the size
/// bound) with a JSON body, never 500; a check body is refused as unparsable exactly when
/// [`sluiced::http::parse_check`] refuses it.
pub fn http_body(data: &[u8]) {
    use tower::ServiceExt as _;
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let check = which & 1 == 0;
    let path = if check {
        "/v1/limits:check"
    } else {
        "/v1/limits:release"
    };
    let req = axum::http::Request::post(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_vec()))
        .expect("a request");
    let (status, bytes) = RT.block_on(async {
        let resp = HTTP.clone().oneshot(req).await.expect("infallible");
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("a body");
        (status, bytes)
    });
    assert!(
        matches!(status.as_u16(), 200 | 400 | 413),
        "status {status} for {body:?}"
    );
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("a JSON answer");
    if status == 200 {
        if check {
            assert!(v["allowed"].is_boolean(), "{v}");
        } else {
            assert!(v["released"].is_u64(), "{v}");
        }
    } else if status == 400 {
        let e = v["error"].as_str().expect("an error message");
        if check {
            let unparsable = e.starts_with("invalid check body");
            assert_eq!(
                unparsable,
                sluiced::http::parse_check(body).is_err(),
                "the handler and parse_check disagree: {e}"
            );
        }
    }
}

/// Gossip: the bytes as a datagram (frame check, unkeyed and keyed) and as a counts payload,
/// through [`sluice_gossip::wire_check::check_datagram`], the property the regression replay
/// (`crates/sluice-gossip/tests/fuzz_regressions.rs`) holds the decoder to as well. A frame
/// sealed by a codec opens to its payload; a keyed codec opens only what it sealed; a payload
/// that unpacks re-packs (as the daemon ships) to the same figures.
pub fn gossip_datagram(data: &[u8]) {
    if let Err(e) = sluice_gossip::wire_check::check_datagram(data) {
        panic!("{e}");
    }
}

/// Rule files: text that parses round-trips through the domains' stored form
/// (`Domain::to_value` → `from_values`) to an equal rule set, and serves a request; a
/// refusal names where each problem is.
pub fn rules_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_yaml(text) {
        Ok(set) => {
            let docs: Vec<_> = set.domains.values().map(|d| d.to_value()).collect();
            let again: RuleSet = from_values(&docs, set.version)
                .unwrap_or_else(|e| panic!("a parsed rule set does not re-parse: {e}"));
            assert_eq!(again, set, "rule set round trip");
            let d = sluice_core::matching::Descriptors::new(vec![
                ("api_key".into(), "k".into()),
                ("route".into(), "r".into()),
                ("user".into(), "u".into()),
            ])
            .expect("valid descriptors");
            for dom in set.domains.values() {
                let p = sluice_core::decision::plan(dom, &d, 1_700_000_000_000_000, 1, "f", |_| {
                    sluice_core::Remote::default()
                });
                let answers: Vec<_> = p
                    .calls
                    .iter()
                    .map(|c| {
                        sluice_core::decision::Answer::Done(
                            sluice_core::batch::apply(&c.call, &vec![None; c.call.items.len()]).0,
                        )
                    })
                    .collect();
                let dec = p.decide(set.version, &answers);
                let _ = sluice_core::decision::headers(&dec);
                let _ = sluice_core::decision::problem_json(&dec);
            }
        }
        Err(e) => {
            assert!(!e.problems.is_empty());
            for p in &e.problems {
                assert!(
                    !p.at.is_empty() && !p.field.is_empty() && !p.message.is_empty(),
                    "{p}"
                );
            }
        }
    }
}
