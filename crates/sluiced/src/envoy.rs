//! Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! on the gRPC port, so an Envoy fleet moves to Sluice by changing the address of its
//! `rate_limit_service` cluster (docs/envoy.md).
//!
//! # Mapping
//!
//! - Each Envoy descriptor (a list of entries) is one check through [`Engine::check`]: its
//!   entries become Sluice descriptors (a key that repeats within one descriptor becomes
//!   `key.2`, `key.3`, …), plus [`KEYS_DESCRIPTOR`] = the entry keys joined by `/`, which lets
//!   rules imported from an envoyproxy/ratelimit config apply only at their own depth, as they
//!   do there. Rules that do not name it ignore it.
//! - `hits_addend` is the cost; 0 (unset) means 1, as in Envoy. A descriptor's own
//!   `hits_addend` (newer Envoys) wins over the request's; 0 there is a peek that takes
//!   nothing. A descriptor with `is_negative_hits` asks for a refund, which Sluice's
//!   algorithms do not have: it is answered OK without counting (docs/envoy.md).
//! - One [`DescriptorStatus`] per descriptor, in order: `OVER_LIMIT` when that check refused;
//!   `current_limit`, `limit_remaining` and `duration_until_reset` from the refusing policy,
//!   or else from the most restrictive one; `overall_code` is `OVER_LIMIT` if any descriptor
//!   is. A policy with `headers: retry_only` never shows its numbers here either.
//! - A descriptor's `limit` override replaces the rules for that descriptor, as Envoy's own
//!   service does: the request is counted in a fixed window of one `unit` holding
//!   `requests_per_unit`, keyed by the domain and every entry (rule id `envoy-override-<unit>`).
//! - An unknown domain is allowed with no limit (envoyproxy/ratelimit does the same); an empty
//!   domain, no descriptors, or bad entries are `INVALID_ARGUMENT`.
//! - Envoy has no code for "could not decide". A fail-closed rule whose store failed answers,
//!   by default, `OVER_LIMIT` with `Retry-After: 1` and a 503 problem body, so the request is
//!   refused whatever Envoy's `failure_mode_deny` says; [`UnavailableAs::Error`] answers gRPC
//!   `UNAVAILABLE` instead and leaves the choice to `failure_mode_deny`.
//! - `response_headers_to_add` carries the core's headers ([`headers`]) for the whole request,
//!   and `raw_body` the problem body of a refusal; both can be switched off.

use crate::engine::{CheckError, Engine};
use serde::Deserialize;
use sluice_core::Remote;
use sluice_core::algo::{MAX_LIMIT, Params, Window};
use sluice_core::decision::{
    Code, Decision, HeaderSet, PolicyStatus, headers_of, plan, problem_json,
};
use sluice_core::matching::Descriptors;
use sluice_core::rules::{Domain, FailureMode, HeaderMode, Mode, Rule, Scope};
use sluice_core::time::SECOND;
use sluice_proto::envoy::config::core::v3::HeaderValue;
use sluice_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use sluice_proto::envoy::service::ratelimit::v3 as rls;
use sluice_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as RlsCode, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tonic::{Request, Response, Status};

/// The synthetic descriptor naming an Envoy descriptor's entry keys, in order, joined by `/`.
pub const KEYS_DESCRIPTOR: &str = "envoy.keys";

/// Most descriptors one Envoy request may carry (Envoy sends a handful per route).
pub const MAX_ENVOY_DESCRIPTORS: usize = 64;

/// How a decision the store could not make (a fail-closed rule, `UNAVAILABLE`) reaches Envoy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnavailableAs {
    /// `OVER_LIMIT` with `Retry-After: 1` and a 503 problem body: refused whatever Envoy's
    /// `failure_mode_deny` says, which is what a fail-closed rule asks for.
    #[default]
    OverLimit,
    /// gRPC status `UNAVAILABLE`: Envoy then applies its `failure_mode_deny` (default: allow).
    Error,
}

/// The `envoy:` section of the daemon config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvoyConfig {
    /// Send the core's rate limit headers in `response_headers_to_add`.
    pub response_headers: bool,
    /// Which of them: `all` (default), `ratelimit` (the IETF draft's pair) or `x_ratelimit`
    /// (the `X-RateLimit-*` trio that envoyproxy/ratelimit and Limitador send).
    pub header_set: HeaderSet,
    /// Send the problem body of a refusal in `raw_body`.
    pub raw_body: bool,
    /// How `UNAVAILABLE` decisions are answered.
    pub unavailable_as: UnavailableAs,
}

impl Default for EnvoyConfig {
    fn default() -> Self {
        EnvoyConfig {
            response_headers: true,
            header_set: HeaderSet::All,
            raw_body: true,
            unavailable_as: UnavailableAs::OverLimit,
        }
    }
}

/// Why a request was refused as input.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    /// The engine refused the descriptors.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// No descriptors.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// Too many descriptors.
    #[error("too many descriptors: {0} (at most {MAX_ENVOY_DESCRIPTORS})")]
    TooManyDescriptors(usize),
    /// A descriptor without entries.
    #[error("descriptor {0} has no entries")]
    NoEntries(usize),
    /// A `limit` override with an unknown unit.
    #[error("descriptor {index}: limit override has unknown unit {unit}")]
    BadUnit {
        /// Descriptor position.
        index: usize,
        /// The unit as sent.
        unit: i32,
    },
}

/// The tonic service.
pub struct RateLimitService {
    /// The engine.
    pub engine: Arc<Engine>,
    /// Options.
    pub config: EnvoyConfig,
}

impl RateLimitService {
    /// A service over an engine.
    pub fn new(engine: Arc<Engine>, config: EnvoyConfig) -> RateLimitService {
        RateLimitService { engine, config }
    }

    /// Decides an Envoy request; `Err` only for bad input.
    pub async fn decide(&self, req: rls::RateLimitRequest) -> Result<Outcome, EnvoyError> {
        if req.domain.is_empty() {
            return Err(CheckError::NoDomain.into());
        }
        if req.descriptors.is_empty() {
            return Err(EnvoyError::NoDescriptors);
        }
        if req.descriptors.len() > MAX_ENVOY_DESCRIPTORS {
            return Err(EnvoyError::TooManyDescriptors(req.descriptors.len()));
        }
        let cost = if req.hits_addend == 0 {
            1
        } else {
            u64::from(req.hits_addend)
        };
        let domain = req.domain;
        let mut decisions = Vec::with_capacity(req.descriptors.len());
        if req.descriptors.len() == 1 {
            for (i, d) in req.descriptors.into_iter().enumerate() {
                decisions.push(self.descriptor(&domain, i, d, cost).await?);
            }
        } else {
            let all = futures_util::future::join_all(
                req.descriptors
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| self.descriptor(&domain, i, d, cost)),
            )
            .await;
            for d in all {
                decisions.push(d?);
            }
        }
        Ok(Outcome { decisions })
    }

    async fn descriptor(
        &self,
        domain: &str,
        index: usize,
        d: RateLimitDescriptor,
        cost: u64,
    ) -> Result<Decision, EnvoyError> {
        if d.entries.is_empty() {
            return Err(EnvoyError::NoEntries(index));
        }
        let cost = d.hits_addend.unwrap_or(cost);
        if d.is_negative_hits {
            return Ok(Decision::unlimited(self.engine.rules.version()));
        }
        let (pairs, keys_len) = descriptors(d.entries);
        let r = match d.limit {
            Some(limit) => {
                let keys = pairs[..keys_len].iter().map(|(k, _)| k.clone()).collect();
                self.with_override(domain, index, pairs, keys, &limit, cost)
                    .await
            }
            None => self
                .engine
                .check(domain, pairs, cost)
                .await
                .map(|c| c.decision)
                .map_err(EnvoyError::from),
        };
        match r {
            Err(EnvoyError::Check(CheckError::UnknownDomain(_))) => {
                Ok(Decision::unlimited(self.engine.rules.version()))
            }
            r => r,
        }
    }

    /// Counts a descriptor with a `limit` override in its own fixed window, through the same
    /// core planning, store and local fallback as a rule.
    async fn with_override(
        &self,
        domain: &str,
        index: usize,
        pairs: Vec<(String, String)>,
        keys: Vec<String>,
        limit: &RateLimitOverride,
        cost: u64,
    ) -> Result<Decision, EnvoyError> {
        let started = Instant::now();
        let (unit_name, unit_s) = match override_unit(limit.unit) {
            Some(u) => u,
            None => {
                return Err(EnvoyError::BadUnit {
                    index,
                    unit: limit.unit,
                });
            }
        };
        if cost > MAX_LIMIT {
            return Err(CheckError::Cost(cost).into());
        }
        let d = Descriptors::new(pairs).map_err(CheckError::from)?;
        let rules = self.engine.rules.load();
        if rules.domain(domain).is_none() {
            return Err(CheckError::UnknownDomain(domain.chars().take(128).collect()).into());
        }
        let id = format!("envoy-override-{unit_name}");
        let rule = Rule {
            id: Arc::from(id.as_str()),
            group: None,
            matchers: Vec::new(),
            key: keys,
            params: Params::FixedWindow {
                limit: u64::from(limit.requests_per_unit).min(MAX_LIMIT),
                window: Window::Epoch(unit_s * SECOND),
            },
            mode: Mode::Enforce,
            on_store_failure: FailureMode::Local,
            scope: Scope::Region,
            rollout_pct: 100,
            headers: HeaderMode::Full,
            charge_rejected: false,
            share_threshold_pct: 10,
            hot_keys: sluice_core::hotkeys::HotKeys::default(),
            source: serde_json::Value::Null,
        };
        let synthetic = Domain::new(domain.to_string(), vec![rule], Vec::new());
        let now = self.engine.now();
        let p = plan(&synthetic, &d, now, cost, "envoy-override", |_| {
            Remote::default()
        });
        // The store calls go the way a rule's do: breaker, deadline, metrics, fallback.
        let answers = self.engine.answers(&p, rules.version).await;
        let decision = p.decide(rules.version, &answers);
        self.engine.count(&synthetic, &decision);
        self.engine.decided(started, &decision);
        Ok(decision)
    }
}

/// The decisions of one Envoy request, one per descriptor in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// One per descriptor.
    pub decisions: Vec<Decision>,
}

impl Outcome {
    /// The decision for the whole request, as if one check had seen every policy: refused if
    /// any descriptor was (the longest wait wins), `UNAVAILABLE` if one could not be decided,
    /// and the policies of all descriptors, each rule id once (its most restrictive status).
    pub fn combined(&self) -> std::borrow::Cow<'_, Decision> {
        if let [one] = self.decisions.as_slice() {
            return std::borrow::Cow::Borrowed(one);
        }
        let version = self
            .decisions
            .iter()
            .map(|d| d.rules_version)
            .max()
            .unwrap_or(0);
        let mut out = Decision::unlimited(version);
        let mut refused: Option<&Decision> = None;
        let mut unavailable: Option<&Decision> = None;
        for d in &self.decisions {
            match d.code {
                Code::OverLimit if refused.is_none_or(|r| d.retry_after_ms > r.retry_after_ms) => {
                    refused = Some(d)
                }
                Code::Unavailable if unavailable.is_none() => unavailable = Some(d),
                _ => {}
            }
            for p in &d.policies {
                match out.policies.iter_mut().find(|q| q.id == p.id) {
                    Some(q) if p.remaining < q.remaining => *q = p.clone(),
                    Some(_) => {}
                    None => out.policies.push(p.clone()),
                }
            }
            for s in &d.shadow_denied {
                if !out.shadow_denied.contains(s) {
                    out.shadow_denied.push(s.clone());
                }
            }
        }
        if let Some(d) = refused.or(unavailable) {
            out.code = d.code;
            out.retry_after_ms = d.retry_after_ms;
            out.decided_by = d.decided_by.clone();
        }
        std::borrow::Cow::Owned(out)
    }

    /// The wire response, or the gRPC status Envoy should see.
    pub fn response(&self, cfg: &EnvoyConfig) -> Result<rls::RateLimitResponse, Status> {
        let all = self.combined();
        if all.code == Code::Unavailable && cfg.unavailable_as == UnavailableAs::Error {
            return Err(Status::unavailable(format!(
                "rule {} could not be decided: its store is unavailable and it fails closed",
                all.decided_by.as_deref().unwrap_or("?")
            )));
        }
        let statuses: Vec<DescriptorStatus> =
            self.decisions.iter().map(descriptor_status).collect();
        let overall = if all.code == Code::Ok {
            RlsCode::Ok
        } else {
            RlsCode::OverLimit
        };
        let mut response_headers_to_add = Vec::new();
        if cfg.response_headers {
            response_headers_to_add = headers_of(&all, cfg.header_set)
                .into_iter()
                .map(|(k, v)| header(k, v))
                .collect();
        }
        let mut raw_body = Vec::new();
        if cfg.raw_body && all.code != Code::Ok {
            raw_body = problem_json(&all).into_bytes();
            response_headers_to_add.push(header("Content-Type", "application/problem+json".into()));
        }
        Ok(rls::RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
            request_headers_to_add: Vec::new(),
            raw_body,
            dynamic_metadata: None,
            quota: None,
        })
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value,
        raw_value: Vec::new(),
    }
}

/// An Envoy descriptor's entries as Sluice descriptors (renamed keys, in order) followed by
/// [`KEYS_DESCRIPTOR`], and how many of them are entries.
pub fn descriptors(
    entries: Vec<
        sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry,
    >,
) -> (Vec<(String, String)>, usize) {
    let mut pairs: Vec<(String, String)> = Vec::with_capacity(entries.len() + 1);
    let mut path = String::new();
    for (i, e) in entries.into_iter().enumerate() {
        if i > 0 {
            path.push('/');
        }
        path.push_str(&e.key);
        let seen = pairs.iter().filter(|(k, _)| {
            *k == e.key || k.strip_prefix(e.key.as_str()).is_some_and(is_repeat_suffix)
        });
        let n = seen.count();
        let key = if n == 0 {
            e.key
        } else {
            format!("{}.{}", e.key, n + 1)
        };
        pairs.push((key, e.value));
    }
    let n = pairs.len();
    pairs.push((KEYS_DESCRIPTOR.to_string(), path));
    (pairs, n)
}

fn is_repeat_suffix(s: &str) -> bool {
    s.strip_prefix('.')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The window of a `limit` override's unit: its name and length in seconds. Month and year
/// are 30 and 365 days, as in envoyproxy/ratelimit.
pub fn override_unit(unit: i32) -> Option<(&'static str, u64)> {
    use sluice_proto::envoy::r#type::v3::RateLimitUnit as U;
    match U::try_from(unit).ok()? {
        U::Unknown => None,
        U::Second => Some(("second", 1)),
        U::Minute => Some(("minute", 60)),
        U::Hour => Some(("hour", 3_600)),
        U::Day => Some(("day", 86_400)),
        U::Week => Some(("week", 7 * 86_400)),
        U::Month => Some(("month", 30 * 86_400)),
        U::Year => Some(("year", 365 * 86_400)),
    }
}

const UNITS: [(Unit, u64); 7] = [
    (Unit::Second, 1),
    (Unit::Minute, 60),
    (Unit::Hour, 3_600),
    (Unit::Day, 86_400),
    (Unit::Week, 7 * 86_400),
    (Unit::Month, 30 * 86_400),
    (Unit::Year, 365 * 86_400),
];

/// A policy as Envoy's `RateLimit`: the unit closest to its window (by ratio), and the
/// quota scaled to that unit (exact when the window is one unit; rounded, at least 1, else).
pub fn rate_limit(p: &PolicyStatus) -> RateLimit {
    let w = p.window_s.max(1);
    let ratio = |u: u64| {
        let (a, b) = (w.max(u) as f64, w.min(u) as f64);
        a / b
    };
    let (unit, unit_s) = UNITS
        .iter()
        .copied()
        .min_by(|a, b| ratio(a.1).total_cmp(&ratio(b.1)))
        .unwrap_or((Unit::Second, 1));
    let scaled = if unit_s == w {
        p.limit
    } else {
        let v = (u128::from(p.limit) * u128::from(unit_s) + u128::from(w) / 2) / u128::from(w);
        (v as u64).max(u64::from(p.limit > 0))
    };
    RateLimit {
        name: p.id.to_string(),
        requests_per_unit: u32::try_from(scaled).unwrap_or(u32::MAX),
        unit: unit as i32,
    }
}

/// The status of one descriptor: its code, and the numbers of the refusing policy or else
/// the most restrictive one the client may see.
pub fn descriptor_status(d: &Decision) -> DescriptorStatus {
    let code = if d.code == Code::Ok {
        RlsCode::Ok
    } else {
        RlsCode::OverLimit
    };
    let deciding = d
        .decided_by
        .as_ref()
        .and_then(|id| d.policies.iter().find(|p| p.id == *id));
    let shown = match deciding {
        Some(p) => Some(p),
        None => d
            .policies
            .iter()
            .filter(|p| p.headers == HeaderMode::Full)
            .min_by(|a, b| {
                a.remaining.cmp(&b.remaining).then(
                    (u128::from(a.remaining) * u128::from(b.limit))
                        .cmp(&(u128::from(b.remaining) * u128::from(a.limit))),
                )
            }),
    };
    match shown {
        None => DescriptorStatus {
            code: code as i32,
            ..Default::default()
        },
        Some(p) if p.headers == HeaderMode::RetryOnly => DescriptorStatus {
            code: code as i32,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: Some(duration(p.reset_s)),
            quota: None,
        },
        Some(p) => DescriptorStatus {
            code: code as i32,
            current_limit: Some(rate_limit(p)),
            limit_remaining: u32::try_from(p.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(duration(p.reset_s)),
            quota: None,
        },
    }
}

fn duration(secs: u64) -> sluice_proto::prost_types::Duration {
    sluice_proto::prost_types::Duration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[tonic::async_trait]
impl rls::rate_limit_service_server::RateLimitService for RateLimitService {
    async fn should_rate_limit(
        &self,
        req: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let outcome = self.decide(req.into_inner()).await.map_err(|e| {
            // The engine already counted the requests it refused.
            if !matches!(e, EnvoyError::Check(_)) {
                self.engine
                    .metrics
                    .bad_requests
                    .fetch_add(1, Ordering::Relaxed);
            }
            Status::invalid_argument(e.to_string())
        })?;
        outcome.response(&self.config).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use sluice_core::batch::{Call, CallResult};
    use sluice_core::breaker::BreakerState;
    use sluice_core::decision::Via;
    use sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use sluice_store::{BoxFuture, MemoryStore, Store, StoreError};
    use std::time::Duration;

    const RULES: &str = r#"
domain: edge
rules:
  - { id: per-user, key: [user], algorithm: fixed_window, limit: 3, window: 1m }
  - { id: per-ip, match: { envoy.keys: remote_address }, key: [remote_address], algorithm: fixed_window, limit: 100, window: 10s }
  - { id: otp, key: [otp_user], algorithm: fixed_window, limit: 1, window: 1h, headers: retry_only }
  - { id: strict, key: [tenant], algorithm: fixed_window, limit: 5, window: 1m, on_store_failure: closed }
"#;

    fn service(store: Arc<dyn Store>, config: EnvoyConfig) -> RateLimitService {
        let set = sluice_core::rules::parse_yaml(RULES).expect("valid rules");
        let engine = Engine::new(
            sluice_control::Published::new(set),
            store,
            Arc::new(Metrics::default()),
            500,
            Duration::from_millis(50),
            "test".into(),
            sluice_core::breaker::BreakerConfig::default(),
        );
        RateLimitService::new(Arc::new(engine), config)
    }

    fn memory() -> RateLimitService {
        service(Arc::new(MemoryStore::new(1000)), EnvoyConfig::default())
    }

    fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn req(
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
        hits: u32,
    ) -> rls::RateLimitRequest {
        rls::RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: hits,
        }
    }

    async fn ask(s: &RateLimitService, r: rls::RateLimitRequest) -> rls::RateLimitResponse {
        let o = s.decide(r).await.expect("valid request");
        o.response(&s.config).expect("an answer")
    }

    fn header<'a>(r: &'a rls::RateLimitResponse, name: &str) -> Option<&'a str> {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.as_str())
    }

    #[tokio::test]
    async fn statuses_follow_descriptors_in_order_and_any_refusal_refuses() {
        let s = memory();
        // Three hits in one request take the whole per-user window.
        let r = ask(&s, req("edge", vec![desc(&[("user", "u1")])], 3)).await;
        assert_eq!(r.overall_code, RlsCode::Ok as i32);
        let st = &r.statuses[0];
        assert_eq!(st.limit_remaining, 0);
        let lim = st.current_limit.as_ref().expect("a limit");
        assert_eq!(
            (lim.requests_per_unit, lim.unit, lim.name.as_str()),
            (3, Unit::Minute as i32, "per-user")
        );
        assert!(
            st.duration_until_reset
                .as_ref()
                .is_some_and(|d| (1..=60).contains(&d.seconds))
        );
        assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("0"));
        assert!(r.raw_body.is_empty());

        // Now u1 is over, u2 and the ip are not: one status each, in order.
        let r = ask(
            &s,
            req(
                "edge",
                vec![
                    desc(&[("remote_address", "10.1.1.1")]),
                    desc(&[("user", "u1")]),
                    desc(&[("user", "u2")]),
                ],
                0,
            ),
        )
        .await;
        assert_eq!(r.overall_code, RlsCode::OverLimit as i32);
        let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
        assert_eq!(
            codes,
            vec![
                RlsCode::Ok as i32,
                RlsCode::OverLimit as i32,
                RlsCode::Ok as i32
            ]
        );
        // 100 per 10 s is reported in the closest unit, a minute: 600.
        let ip = r.statuses[0].current_limit.as_ref().expect("ip limit");
        assert_eq!((ip.requests_per_unit, ip.unit), (600, Unit::Minute as i32));
        assert_eq!(r.statuses[0].limit_remaining, 99);
        assert_eq!(
            r.statuses[2].limit_remaining, 2,
            "hits_addend 0 counts as 1"
        );
        assert!(header(&r, "Retry-After").is_some());
        let policy = header(&r, "RateLimit-Policy").expect("policy header");
        assert!(
            policy.contains("\"per-user\";q=3;w=60") && policy.contains("\"per-ip\""),
            "{policy}"
        );
        let body = String::from_utf8(r.raw_body.clone()).expect("utf-8");
        assert!(body.contains("\"status\":429"), "{body}");
    }

    #[tokio::test]
    async fn rules_for_another_depth_do_not_apply() {
        let s = memory();
        // per-ip names its depth (envoy.keys): a deeper descriptor does not count against it.
        let r = ask(
            &s,
            req(
                "edge",
                vec![desc(&[("remote_address", "10.9.9.9"), ("path", "/x")])],
                1,
            ),
        )
        .await;
        assert_eq!(r.statuses[0].current_limit, None);
        let r = ask(
            &s,
            req("edge", vec![desc(&[("remote_address", "10.9.9.9")])], 1),
        )
        .await;
        assert_eq!(r.statuses[0].limit_remaining, 99);
    }

    #[tokio::test]
    async fn a_limit_override_replaces_the_rules_for_that_descriptor() {
        let s = memory();
        let mut d = desc(&[("user", "u7")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: sluice_proto::envoy::r#type::v3::RateLimitUnit::Second as i32,
        });
        let r = ask(&s, req("edge", vec![d.clone()], 2)).await;
        assert_eq!(r.overall_code, RlsCode::Ok as i32);
        let lim = r.statuses[0]
            .current_limit
            .as_ref()
            .expect("override limit");
        assert_eq!(
            (lim.requests_per_unit, lim.unit, lim.name.as_str()),
            (2, Unit::Second as i32, "envoy-override-second")
        );
        let r = ask(&s, req("edge", vec![d.clone()], 1)).await;
        assert_eq!(r.overall_code, RlsCode::OverLimit as i32);
        // The rule's own counter (3 a minute) was never touched by the override.
        let r = ask(&s, req("edge", vec![desc(&[("user", "u7")])], 1)).await;
        assert_eq!(r.statuses[0].limit_remaining, 2);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: 0,
        });
        assert!(matches!(
            s.decide(req("edge", vec![d], 1)).await,
            Err(EnvoyError::BadUnit { index: 0, unit: 0 })
        ));
    }

    #[tokio::test]
    async fn a_descriptors_own_hits_win_and_refunds_count_nothing() {
        let s = memory();
        let mut d = desc(&[("user", "u9")]);
        d.hits_addend = Some(2);
        let r = ask(&s, req("edge", vec![d.clone(), desc(&[("user", "u8")])], 1)).await;
        assert_eq!(r.statuses[0].limit_remaining, 1, "the descriptor's 2 hits");
        assert_eq!(r.statuses[1].limit_remaining, 2, "the request's 1 hit");
        d.hits_addend = Some(0);
        let r = ask(&s, req("edge", vec![d.clone()], 1)).await;
        assert_eq!(r.statuses[0].limit_remaining, 1, "0 is a peek");
        d.hits_addend = Some(5);
        d.is_negative_hits = true;
        let r = ask(&s, req("edge", vec![d], 1)).await;
        assert_eq!(r.overall_code, RlsCode::Ok as i32);
        let r = ask(&s, req("edge", vec![desc(&[("user", "u9")])], 1)).await;
        assert_eq!(r.statuses[0].limit_remaining, 0, "no refund was made");
    }

    #[tokio::test]
    async fn retry_only_policies_show_no_numbers() {
        let s = memory();
        let d = || vec![desc(&[("otp_user", "a")])];
        let r = ask(&s, req("edge", d(), 1)).await;
        assert_eq!(r.statuses[0].current_limit, None);
        let r = ask(&s, req("edge", d(), 1)).await;
        assert_eq!(r.overall_code, RlsCode::OverLimit as i32);
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        let names: Vec<&str> = r
            .response_headers_to_add
            .iter()
            .map(|h| h.key.as_str())
            .collect();
        assert_eq!(names, vec!["Retry-After", "Content-Type"]);
    }

    #[tokio::test]
    async fn unknown_domains_pass_and_bad_input_is_refused() {
        let s = memory();
        let r = ask(&s, req("nope", vec![desc(&[("user", "u")])], 1)).await;
        assert_eq!(r.overall_code, RlsCode::Ok as i32);
        assert_eq!(r.statuses.len(), 1);
        assert!(matches!(
            s.decide(req("", vec![desc(&[("user", "u")])], 1)).await,
            Err(EnvoyError::Check(CheckError::NoDomain))
        ));
        assert!(matches!(
            s.decide(req("edge", vec![], 1)).await,
            Err(EnvoyError::NoDescriptors)
        ));
        assert!(matches!(
            s.decide(req("edge", vec![desc(&[])], 1)).await,
            Err(EnvoyError::NoEntries(0))
        ));
        let long = "v".repeat(300);
        assert!(
            s.decide(req("edge", vec![desc(&[("user", &long)])], 1))
                .await
                .is_err()
        );
    }

    #[test]
    fn repeated_keys_are_numbered_and_the_path_is_named() {
        let entries = [
            ("generic_key", "a"),
            ("generic_key", "b"),
            ("user", "u"),
            ("generic_key", "c"),
        ]
        .iter()
        .map(|(k, v)| Entry {
            key: k.to_string(),
            value: v.to_string(),
        })
        .collect();
        let (pairs, n) = descriptors(entries);
        let keys: Vec<&str> = pairs[..n].iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            vec!["generic_key", "generic_key.2", "user", "generic_key.3"]
        );
        assert_eq!(
            pairs.last().map(|(k, v)| (k.as_str(), v.as_str())),
            Some((KEYS_DESCRIPTOR, "generic_key/generic_key/user/generic_key"))
        );
    }

    #[test]
    fn limits_are_reported_in_the_closest_unit() {
        let p = |limit, window_s| PolicyStatus {
            id: Arc::from("r"),
            limit,
            window_s,
            remaining: 0,
            reset_s: 0,
            allowed: true,
            retry_after_ms: 0,
            headers: HeaderMode::Full,
            via: Via::Store,
        };
        let rl = |limit, w| {
            let r = rate_limit(&p(limit, w));
            (r.requests_per_unit, Unit::try_from(r.unit).expect("unit"))
        };
        assert_eq!(rl(10, 1), (10, Unit::Second));
        assert_eq!(rl(40, 2), (20, Unit::Second));
        assert_eq!(rl(1000, 3_600), (1000, Unit::Hour));
        assert_eq!(rl(10_000, 86_400), (10_000, Unit::Day));
        assert_eq!(rl(7, 7 * 86_400), (7, Unit::Week));
        assert_eq!(
            rl(1, 3_000),
            (1, Unit::Hour),
            "a small quota never rounds to 0"
        );
        assert_eq!(rl(u64::from(u32::MAX) * 2, 1), (u32::MAX, Unit::Second));
    }

    /// A store whose every call fails, as Redis does when it is down.
    struct Down;

    impl Store for Down {
        fn check<'a>(&'a self, _call: &'a Call) -> BoxFuture<'a, Result<CallResult, StoreError>> {
            Box::pin(async { Err(StoreError::Unavailable("connection refused".into())) })
        }
        fn release<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
            _: u64,
        ) -> BoxFuture<'a, Result<bool, StoreError>> {
            Box::pin(async { Err(StoreError::Unavailable("connection refused".into())) })
        }
        fn kind(&self) -> &'static str {
            "down"
        }
    }

    #[tokio::test]
    async fn the_header_set_picks_which_rate_limit_headers_envoy_gets() {
        let cfg = EnvoyConfig {
            header_set: HeaderSet::XRatelimit,
            ..EnvoyConfig::default()
        };
        let s = service(Arc::new(MemoryStore::new(1000)), cfg);
        let r = ask(&s, req("edge", vec![desc(&[("user", "u1")])], 1)).await;
        let names: Vec<&str> = r
            .response_headers_to_add
            .iter()
            .map(|h| h.key.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "X-RateLimit-Limit",
                "X-RateLimit-Remaining",
                "X-RateLimit-Reset"
            ]
        );
        assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("2"));
        let all = ask(&memory(), req("edge", vec![desc(&[("user", "u1")])], 1)).await;
        assert!(header(&all, "RateLimit-Policy").is_some());
        assert_eq!(header(&all, "X-RateLimit-Remaining"), Some("2"));
    }

    #[tokio::test]
    async fn a_limit_override_goes_through_the_breaker_and_the_metrics() {
        let s = service(Arc::new(Down), EnvoyConfig::default());
        let mut d = desc(&[("user", "u5")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 100,
            unit: Unit::Minute as i32,
        });
        for _ in 0..25 {
            let r = ask(&s, req("edge", vec![d.clone()], 1)).await;
            assert_eq!(r.overall_code, RlsCode::Ok as i32, "decided locally");
        }
        let m = &s.engine.metrics;
        let c = m.rule("edge", &Arc::from("envoy-override-minute"));
        assert_eq!(
            c.local.load(Ordering::Relaxed),
            25,
            "local verdicts, counted"
        );
        assert_eq!(m.checks_ok.load(Ordering::Relaxed), 25);
        // 20 failed calls in the window open the store's breaker, as a rule's calls would;
        // the calls after it are refused by the breaker, not sent to the store.
        assert!(
            s.engine
                .breaker_states()
                .iter()
                .any(|(_, st, opened)| *opened > 0 && matches!(st, BreakerState::Open { .. })),
            "{:?}",
            s.engine.breaker_states()
        );
        // The store saw 20 calls: the breaker answered the last 5 itself.
        assert_eq!(m.store_errors.load(Ordering::Relaxed), 20);
    }

    #[tokio::test]
    async fn a_fail_closed_rule_is_refused_by_default_or_an_error_when_asked() {
        let s = service(Arc::new(Down), EnvoyConfig::default());
        let r = ask(&s, req("edge", vec![desc(&[("tenant", "t1")])], 1)).await;
        assert_eq!(r.overall_code, RlsCode::OverLimit as i32);
        assert_eq!(r.statuses[0].code, RlsCode::OverLimit as i32);
        assert_eq!(header(&r, "Retry-After"), Some("1"));
        let body = String::from_utf8(r.raw_body.clone()).expect("utf-8");
        assert!(body.contains("\"status\":503"), "{body}");
        // A local-fallback rule keeps deciding on the daemon's own buckets.
        let r = ask(&s, req("edge", vec![desc(&[("user", "u1")])], 1)).await;
        assert_eq!(r.overall_code, RlsCode::Ok as i32);

        let cfg = EnvoyConfig {
            unavailable_as: UnavailableAs::Error,
            response_headers: false,
            raw_body: false,
            ..EnvoyConfig::default()
        };
        let s = service(Arc::new(Down), cfg);
        let o = s
            .decide(req("edge", vec![desc(&[("tenant", "t1")])], 1))
            .await
            .expect("valid");
        let status = o.response(&s.config).expect_err("gRPC UNAVAILABLE");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        let r = ask(&s, req("edge", vec![desc(&[("user", "u1")])], 1)).await;
        assert!(r.response_headers_to_add.is_empty(), "headers switched off");
    }
}
