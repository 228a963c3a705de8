//! [`FakeLimiter`]: an in-memory [`Limiter`] for tests of the layer and of gateways built on it.

use std::sync::{Arc, Mutex};

use sluice_proto::sluice::v1::{CheckRequest, CheckResponse, ReleaseRequest};

use crate::limiter::{BoxFuture, CallError, Limiter};

type Decide = dyn Fn(&CheckRequest) -> Result<CheckResponse, CallError> + Send + Sync;

/// Answers each check with a function of the request and records every check and release.
#[derive(Clone)]
pub struct FakeLimiter {
    decide: Arc<Decide>,
    checks: Arc<Mutex<Vec<CheckRequest>>>,
    releases: Arc<Mutex<Vec<ReleaseRequest>>>,
}

impl std::fmt::Debug for FakeLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeLimiter").finish_non_exhaustive()
    }
}

impl FakeLimiter {
    /// A limiter answering with `decide`.
    pub fn new(
        decide: impl Fn(&CheckRequest) -> Result<CheckResponse, CallError> + Send + Sync + 'static,
    ) -> Self {
        FakeLimiter {
            decide: Arc::new(decide),
            checks: Arc::default(),
            releases: Arc::default(),
        }
    }

    /// A limiter answering every check with `resp`.
    pub fn answering(resp: CheckResponse) -> Self {
        Self::new(move |_| Ok(resp.clone()))
    }

    /// The checks so far, in order.
    pub fn checks(&self) -> Vec<CheckRequest> {
        self.checks.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The releases so far, in order; recorded when `release` is called, before its future
    /// runs.
    pub fn releases(&self) -> Vec<ReleaseRequest> {
        self.releases.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Limiter for FakeLimiter {
    fn check(&self, req: CheckRequest) -> BoxFuture<Result<CheckResponse, CallError>> {
        let answer = (self.decide)(&req);
        if let Ok(mut checks) = self.checks.lock() {
            checks.push(req);
        }
        Box::pin(async move { answer })
    }

    fn release(&self, req: ReleaseRequest) -> BoxFuture<Result<u32, CallError>> {
        if let Ok(mut releases) = self.releases.lock() {
            releases.push(req);
        }
        Box::pin(async { Ok(1) })
    }
}
