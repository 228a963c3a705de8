//! gRPC `sluice.v1.Limiter`: the same engine and the same fields as the HTTP form.

use crate::engine::{CheckError, Engine};
use sluice_core::decision::{Code, headers};
use sluice_proto::sluice::v1 as pb;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The tonic service.
pub struct LimiterService {
    /// The engine.
    pub engine: Arc<Engine>,
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
        let d = &c.decision;
        Ok(Response::new(pb::CheckResponse {
            allowed: d.allowed(),
            code: match d.code {
                Code::Ok => pb::Code::Ok,
                Code::OverLimit => pb::Code::OverLimit,
                Code::Unavailable => pb::Code::Unavailable,
            } as i32,
            decided_by: d.decided_by.as_deref().unwrap_or_default().to_string(),
            retry_after_ms: d.retry_after_ms,
            policies: d
                .policies
                .iter()
                .map(|p| pb::PolicyStatus {
                    id: p.id.to_string(),
                    limit: p.limit,
                    window_s: p.window_s,
                    remaining: p.remaining,
                    reset_s: p.reset_s,
                })
                .collect(),
            rules_version: d.rules_version,
            headers: headers(d)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            shadow_denied: d.shadow_denied.iter().map(|s| s.to_string()).collect(),
            request_id: c.request_id,
        }))
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
