//! The `ShouldRateLimit` method: checks an Envoy request's descriptors through the engine
//! (concurrently when there are several), counts a descriptor's `limit` override in its own
//! fixed window through the same store path, and answers unknown domains with no limit.

use super::response::Outcome;
use super::translate::{descriptors, override_unit};
use super::{EnvoyConfig, EnvoyError, MAX_ENVOY_DESCRIPTORS};
use crate::engine::{CheckError, Engine};
use sluice_core::Remote;
use sluice_core::algo::{MAX_LIMIT, Params, Window};
use sluice_core::decision::{Decision, plan};
use sluice_core::matching::Descriptors;
use sluice_core::rules::{Domain, FailureMode, HeaderMode, KeyField, Mode, Rule, Scope};
use sluice_core::time::SECOND;
use sluice_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use sluice_proto::envoy::service::ratelimit::v3 as rls;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tonic::{Request, Response, Status};

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

    /// `ShouldRateLimit`'s decisions, or the `INVALID_ARGUMENT` Envoy should see; what the
    /// gRPC port calls, without the tonic trait's boxed future.
    pub async fn answer(&self, req: rls::RateLimitRequest) -> Result<Outcome, Status> {
        self.decide(req).await.map_err(|e| {
            // The engine already counted the requests it refused.
            if !matches!(e, EnvoyError::Check(_)) {
                self.engine
                    .metrics
                    .bad_requests
                    .fetch_add(1, Ordering::Relaxed);
            }
            Status::invalid_argument(e.to_string())
        })
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
            // Envoy's answer has no delay: a shaping rule refuses what would have to wait.
            None => self
                .engine
                .check_waiting(domain, pairs, cost, false)
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
            key: keys.into_iter().map(KeyField::whole).collect(),
            cost: None,
            params: Params::FixedWindow {
                limit: u64::from(limit.requests_per_unit).min(MAX_LIMIT),
                window: Window::Epoch(unit_s * SECOND),
            },
            mode: Mode::Enforce,
            on_store_failure: FailureMode::Local,
            scope: Scope::Region,
            rollout_pct: 100,
            enforce_on: None,
            canary_shadowed: false,
            headers: HeaderMode::Full,
            charge_rejected: false,
            share_threshold_pct: 10,
            title: None,
            hot_keys: sluice_core::hotkeys::HotKeys::default(),
            store: None,
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

#[tonic::async_trait]
impl rls::rate_limit_service_server::RateLimitService for RateLimitService {
    async fn should_rate_limit(
        &self,
        req: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let outcome = self.answer(req.into_inner()).await?;
        outcome.response(&self.config).map(Response::new)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::UnavailableAs;
    use crate::metrics::Metrics;
    use sluice_core::batch::{Call, CallResult};
    use sluice_core::breaker::BreakerState;
    use sluice_core::decision::HeaderSet;
    use sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use sluice_proto::envoy::service::ratelimit::v3::rate_limit_response::{
        Code as RlsCode, rate_limit::Unit,
    };
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
        // A rule counting an address by network: anything else is INVALID_ARGUMENT.
        let set = sluice_core::rules::parse_yaml(
            "domain: edge\nrules:\n  - { id: net, key: [remote_address/64], algorithm: fixed_window, limit: 5, window: 1m }\n",
        )
        .expect("valid rules");
        s.engine.rules.publish(set);
        let err = s
            .answer(req("edge", vec![desc(&[("remote_address", "10.1.1")])], 1))
            .await
            .expect_err("no address");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("must be an IP address"), "{err:?}");
        let ok = ask(
            &s,
            req("edge", vec![desc(&[("remote_address", "2001:db8::9")])], 1),
        )
        .await;
        assert_eq!(ok.overall_code, RlsCode::Ok as i32);
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

    /// Envoy's answer has no delay: a shaping rule refuses there what would have to wait,
    /// and that refusal takes no departure from the queue the other APIs wait in.
    #[tokio::test]
    async fn a_shaping_rule_refuses_envoy_what_would_wait() {
        let s = memory();
        let set = sluice_core::rules::parse_yaml(
            "domain: sms\nrules:\n  - { id: queue, key: [user], algorithm: leaky_queue, rate: 1/1m, max_delay: 10m }\n",
        )
        .expect("valid rules");
        s.engine.rules.publish(set);
        let envoy = || req("sms", vec![desc(&[("user", "u")])], 1);
        let json = || vec![("user".to_string(), "u".to_string())];
        assert_eq!(ask(&s, envoy()).await.overall_code, RlsCode::Ok as i32);
        let refused = ask(&s, envoy()).await;
        assert_eq!(refused.overall_code, RlsCode::OverLimit as i32);
        let first = s.engine.check("sms", json(), 1).await.expect("a check");
        assert!(first.decision.allowed());
        // One minute apart, less the time since the first departure: Envoy took only that one.
        assert!(
            (1..=60_000).contains(&first.decision.delay_ms),
            "{:?}",
            first.decision
        );
        assert_eq!(
            ask(&s, envoy()).await.overall_code,
            RlsCode::OverLimit as i32
        );
        let second = s.engine.check("sms", json(), 1).await.expect("a check");
        let d = second.decision.delay_ms;
        assert!((60_001..=120_000).contains(&d), "{:?}", second.decision);
    }
}
