//! gRPC `sluice.v1.Limiter`: the same engine and the same fields as the HTTP form.

use crate::engine::{CheckError, Checked, Engine};
use sluice_core::decision::{Code, PolicyStatus, QuotaUnit, headers};
use sluice_proto::sluice::v1 as pb;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The tonic service.
pub struct LimiterService {
    /// The engine.
    pub engine: Arc<Engine>,
}

/// A check's answer in `sluice.v1` terms: the JSON form's fields ([`crate::http`]), a
/// `retry_only` rule's figures left at 0 and the rule marked `retry_only`.
pub fn check_response(c: Checked) -> pb::CheckResponse {
    let d = &c.decision;
    pb::CheckResponse {
        allowed: d.allowed(),
        code: match d.code {
            Code::Ok => pb::Code::Ok,
            Code::OverLimit => pb::Code::OverLimit,
            Code::Unavailable => pb::Code::Unavailable,
        } as i32,
        decided_by: d.decided_by.as_deref().unwrap_or_default().to_string(),
        retry_after_ms: d.retry_after_ms,
        policies: d.policies.iter().map(policy_status).collect(),
        rules_version: d.rules_version,
        headers: headers(d)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        shadow_denied: d.shadow_denied.iter().map(|s| s.to_string()).collect(),
        request_id: c.request_id,
        release: d.holds_slot,
        delay_ms: d.delay_ms,
    }
}

/// One policy: its figures, or none for a `retry_only` rule.
fn policy_status(p: &PolicyStatus) -> pb::PolicyStatus {
    let mut out = pb::PolicyStatus {
        id: p.id.to_string(),
        title: p.title.as_deref().unwrap_or_default().to_string(),
        quota_unit: match p.unit {
            QuotaUnit::Requests => pb::QuotaUnit::Requests,
            QuotaUnit::ConcurrentRequests => pb::QuotaUnit::ConcurrentRequests,
        } as i32,
        ..Default::default()
    };
    if p.figures_visible() {
        out.limit = p.limit;
        out.window_s = p.window_s;
        out.remaining = p.remaining;
        out.reset_s = p.reset_s;
    } else {
        out.retry_only = true;
    }
    out
}

fn invalid(e: CheckError) -> Status {
    Status::invalid_argument(e.to_string())
}

#[tonic::async_trait]
impl pb::limiter_server::Limiter for LimiterService {
    async fn check(
        &self,
        req: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let r = req.into_inner();
        let c = self
            .engine
            .check(
                &r.domain,
                r.descriptors.into_iter().collect(),
                r.cost.unwrap_or(1),
            )
            .await
            .map_err(invalid)?;
        Ok(Response::new(check_response(c)))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let r = req.into_inner();
        let n = self
            .engine
            .release(
                &r.domain,
                r.descriptors.into_iter().collect(),
                &r.request_id,
            )
            .await
            .map_err(invalid)?;
        Ok(Response::new(pb::ReleaseResponse { released: n }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::tests::retry_only_refusal;

    #[test]
    fn a_retry_only_rule_shows_no_figures() {
        let r = check_response(retry_only_refusal());
        assert_eq!(r.code, pb::Code::OverLimit as i32);
        assert_eq!(r.decided_by, "otp");
        assert_eq!(r.retry_after_ms, 60_000);
        let otp = &r.policies[1];
        assert_eq!((otp.id.as_str(), otp.retry_only), ("otp", true), "{otp:?}");
        assert_eq!(
            (otp.limit, otp.window_s, otp.remaining, otp.reset_s),
            (0, 0, 0, 0)
        );
        let burst = &r.policies[0];
        assert!(!burst.retry_only);
        assert_eq!(
            (burst.limit, burst.window_s, burst.remaining, burst.reset_s),
            (10, 1, 7, 1)
        );
        assert_eq!(r.headers.get("Retry-After").map(String::as_str), Some("60"));
        assert!(
            !r.headers.values().any(|v| v.contains("otp")),
            "{:?}",
            r.headers
        );
        assert_eq!(burst.quota_unit, pb::QuotaUnit::Requests as i32);
    }

    #[test]
    fn a_concurrency_policy_says_its_unit() {
        let mut c = retry_only_refusal();
        c.decision.policies[0].unit = QuotaUnit::ConcurrentRequests;
        let r = check_response(c);
        assert_eq!(
            r.policies[0].quota_unit,
            pb::QuotaUnit::ConcurrentRequests as i32
        );
        assert_eq!(r.policies[1].quota_unit, pb::QuotaUnit::Requests as i32);
    }
}
