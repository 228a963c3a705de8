//! [`SluiceLayer`] and [`SluiceService`]: one check per request, then forward or answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use sluice_proto::sluice::v1::{CheckRequest, CheckResponse, Code, ReleaseRequest};
use tower_layer::Layer;
use tower_service::Service;

use crate::answer::{apply_headers, service_unavailable, too_many_requests};
use crate::body::{ReleaseGuard, SluiceBody};
use crate::config::{Config, FailureMode};
use crate::descriptors::descriptors;
use crate::edge::{Edge, EdgeAnswer};
use crate::limiter::Limiter;

/// What the layer did, counted, for a gateway's metrics.
#[derive(Debug, Default)]
pub struct Stats {
    allowed: AtomicU64,
    over_limit: AtomicU64,
    unavailable: AtomicU64,
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
    edge_cached: AtomicU64,
    edge_flood: AtomicU64,
    delayed: AtomicU64,
    delay_refused: AtomicU64,
}

impl Stats {
    /// Requests the limiter allowed (and the layer forwarded).
    pub fn allowed(&self) -> u64 {
        self.allowed.load(Ordering::Relaxed)
    }
    /// Requests answered 429.
    pub fn over_limit(&self) -> u64 {
        self.over_limit.load(Ordering::Relaxed)
    }
    /// Requests answered 503 because the limiter said `UNAVAILABLE`.
    pub fn unavailable(&self) -> u64 {
        self.unavailable.load(Ordering::Relaxed)
    }
    /// Requests forwarded unchecked because the limiter did not answer.
    pub fn failed_open(&self) -> u64 {
        self.failed_open.load(Ordering::Relaxed)
    }
    /// Requests answered 503 because the limiter did not answer and the layer fails closed.
    pub fn failed_closed(&self) -> u64 {
        self.failed_closed.load(Ordering::Relaxed)
    }
    /// Requests the edge guard answered 429 from a remembered refusal, without a daemon call
    /// (counted in [`Stats::over_limit`] too).
    pub fn edge_cached(&self) -> u64 {
        self.edge_cached.load(Ordering::Relaxed)
    }
    /// Requests the edge guard answered 429 because their client exceeded the flood rate,
    /// without a daemon call (counted in [`Stats::over_limit`] too).
    pub fn edge_flood(&self) -> u64 {
        self.edge_flood.load(Ordering::Relaxed)
    }
    /// Allowed requests the layer held for their `delay_ms` (a shaping rule) before
    /// forwarding them (counted in [`Stats::allowed`] too).
    pub fn delayed(&self) -> u64 {
        self.delayed.load(Ordering::Relaxed)
    }
    /// Allowed requests answered 429 because their delay was past [`Config::max_wait`]
    /// (counted in [`Stats::over_limit`], not in [`Stats::allowed`]).
    pub fn delay_refused(&self) -> u64 {
        self.delay_refused.load(Ordering::Relaxed)
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Shared {
    config: Config,
    limiter: Arc<dyn Limiter>,
    stats: Arc<Stats>,
    /// `None` when the configuration turns every part of it off.
    edge: Option<Edge>,
}

/// The `tower::Layer`: wraps a gateway's service in a [`SluiceService`].
#[derive(Clone)]
pub struct SluiceLayer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SluiceLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SluiceLayer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl SluiceLayer {
    /// A layer checking every request under `config` with `limiter`.
    pub fn new(config: Config, limiter: impl Limiter + 'static) -> Self {
        Self::with_limiter(config, Arc::new(limiter))
    }

    /// [`SluiceLayer::new`] with a shared limiter.
    pub fn with_limiter(config: Config, limiter: Arc<dyn Limiter>) -> Self {
        SluiceLayer {
            shared: Arc::new(Shared {
                edge: Edge::enabled(&config.edge).then(|| Edge::new(&config.edge, &config.release)),
                config,
                limiter,
                stats: Arc::default(),
            }),
        }
    }

    /// The counts of what the layer (and every service it made) did.
    pub fn stats(&self) -> Arc<Stats> {
        self.shared.stats.clone()
    }
}

impl<S> Layer<S> for SluiceLayer {
    type Service = SluiceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SluiceService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// Checks each request with the limiter: forwards it when allowed (the decision's headers on
/// the upstream's response), answers 429 or 503 itself when not.
#[derive(Clone)]
pub struct SluiceService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for SluiceService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SluiceService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What to do with a request, from the limiter's answer.
enum Verdict {
    Forward(Option<CheckResponse>),
    Answer(Response<Bytes>),
}

fn verdict(shared: &Shared, answer: Result<CheckResponse, crate::limiter::CallError>) -> Verdict {
    let stats = &shared.stats;
    match answer {
        Ok(resp) if resp.allowed && !too_long(shared, &resp) => {
            bump(&stats.allowed);
            Verdict::Forward(Some(resp))
        }
        Ok(resp) if resp.allowed => {
            bump(&stats.over_limit);
            bump(&stats.delay_refused);
            Verdict::Answer(too_many_requests(&past_max_wait(shared, resp)))
        }
        Ok(resp) if resp.code == Code::Unavailable as i32 => {
            bump(&stats.unavailable);
            Verdict::Answer(service_unavailable(
                "the request could not be checked; retry in 1 s",
            ))
        }
        Ok(resp) => {
            bump(&stats.over_limit);
            Verdict::Answer(too_many_requests(&resp))
        }
        Err(e) => match shared.config.failure {
            FailureMode::Open => {
                tracing::warn!(error = %e, retryable = e.is_retryable(), "limiter did not answer; forwarding unchecked");
                bump(&stats.failed_open);
                Verdict::Forward(None)
            }
            FailureMode::Closed => {
                tracing::warn!(error = %e, retryable = e.is_retryable(), "limiter did not answer; refusing");
                bump(&stats.failed_closed);
                Verdict::Answer(service_unavailable(
                    "the rate limiter is unavailable; retry in 1 s",
                ))
            }
        },
    }
}

/// Whether an allowed answer asks the request to wait longer than the layer will hold it.
fn too_long(shared: &Shared, resp: &CheckResponse) -> bool {
    u128::from(resp.delay_ms) > shared.config.max_wait.as_millis()
}

/// An allowed answer whose delay is past [`Config::max_wait`] as a refusal: retry once the
/// wait would be back within the ceiling, decided by the shaping rule that asked for it (the
/// policy with the fewest units left).
fn past_max_wait(shared: &Shared, mut resp: CheckResponse) -> CheckResponse {
    let ceiling = u64::try_from(shared.config.max_wait.as_millis()).unwrap_or(u64::MAX);
    resp.allowed = false;
    resp.code = Code::OverLimit as i32;
    resp.retry_after_ms = resp.delay_ms - ceiling;
    resp.delay_ms = 0;
    if let Some(p) = resp.policies.iter().min_by_key(|p| p.remaining) {
        resp.decided_by = p.id.clone();
    }
    resp
}

/// The 429 the edge guard gave, counted.
fn edge_answer<B: Body<Data = Bytes>>(
    stats: &Stats,
    answer: EdgeAnswer,
) -> Response<SluiceBody<B>> {
    bump(&stats.over_limit);
    let resp = match answer {
        EdgeAnswer::Cached(r) => {
            bump(&stats.edge_cached);
            r
        }
        EdgeAnswer::Flood(r) => {
            bump(&stats.edge_flood);
            r
        }
    };
    resp.map(SluiceBody::full)
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for SluiceService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes>,
{
    type Response = Response<SluiceBody<ResB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The service polled ready is the one that takes the request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let descriptors = descriptors(&shared.config, &req);
            let check = CheckRequest {
                domain: shared.config.domain.clone(),
                descriptors,
                cost: None,
            };
            let identity = match &shared.edge {
                Some(edge) => {
                    let id = Edge::identity(&check.domain, &check.descriptors);
                    match edge.check(&id, &check.descriptors) {
                        Some(answer) => return Ok(edge_answer(&shared.stats, answer)),
                        None => Some(id),
                    }
                }
                None => None,
            };
            // Kept for the release: the check request moves into the call.
            let release_descriptors = check.descriptors.clone();
            let answer = shared.limiter.check(check).await;
            if let (Some(edge), Some(id), Ok(resp)) = (&shared.edge, identity, &answer) {
                edge.remember(id, resp);
            }
            // A refusal can still have taken a slot (a concurrency rule admitted the check,
            // another rule refused it): given back now, not held to the slot's timeout.
            let refused_slot = match &answer {
                Ok(r) if !r.allowed && r.release && !r.request_id.is_empty() => {
                    Some(r.request_id.clone())
                }
                _ => None,
            };
            let decision = match verdict(&shared, answer) {
                Verdict::Answer(resp) => {
                    if let Some(request_id) = refused_slot {
                        ReleaseGuard::new(
                            shared.limiter.clone(),
                            ReleaseRequest {
                                domain: shared.config.domain.clone(),
                                descriptors: release_descriptors,
                                request_id,
                            },
                        )
                        .fire();
                    }
                    return Ok(resp.map(SluiceBody::full));
                }
                Verdict::Forward(decision) => decision,
            };
            // Armed before the upstream call: a dropped call or an upstream error releases too.
            let guard = decision
                .as_ref()
                .filter(|d| !d.request_id.is_empty() && shared.config.release.wants(d))
                .map(|d| {
                    ReleaseGuard::new(
                        shared.limiter.clone(),
                        ReleaseRequest {
                            domain: shared.config.domain.clone(),
                            descriptors: release_descriptors,
                            request_id: d.request_id.clone(),
                        },
                    )
                });
            // A shaping rule admitted it to leave later: hold it until then.
            if let Some(d) = decision.as_ref().filter(|d| d.delay_ms > 0) {
                bump(&shared.stats.delayed);
                tokio::time::sleep(std::time::Duration::from_millis(d.delay_ms)).await;
            }
            let mut resp = inner.call(req).await?;
            if let Some(d) = &decision {
                apply_headers(resp.headers_mut(), &d.headers);
            }
            Ok(resp.map(|body| SluiceBody::upstream(body, guard)))
        })
    }
}
