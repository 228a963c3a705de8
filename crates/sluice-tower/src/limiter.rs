//! The seam between the layer and the daemon: a [`Limiter`] answers checks and takes releases.
//!
//! The layer holds an `Arc<dyn Limiter>`, so a gateway's tests (and this crate's) run against
//! [`crate::fake::FakeLimiter`] and production against [`crate::grpc::GrpcLimiter`].

use std::future::Future;
use std::pin::Pin;

use sluice_proto::sluice::v1::{CheckRequest, CheckResponse, ReleaseRequest};

/// A boxed, sendable future: what the trait's methods return, so the trait is object-safe.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Why a call to the limiter gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No answer within the deadline.
    #[error("no answer within {0:?}")]
    Deadline(std::time::Duration),
    /// The daemon could not be reached or was briefly unable to answer (transport errors,
    /// `UNAVAILABLE`, `RESOURCE_EXHAUSTED`): the next call may succeed.
    #[error("limiter unavailable: {0}")]
    Unavailable(String),
    /// The daemon refused the call itself (`INVALID_ARGUMENT`, an unknown method, ...): retrying
    /// the same call will not help.
    #[error("limiter refused the call: {0}")]
    Refused(String),
}

impl CallError {
    /// Whether the same call might succeed later.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, CallError::Refused(_))
    }
}

/// Decides requests: `sluice.v1.Limiter`'s Check and Release.
pub trait Limiter: Send + Sync {
    /// May this request proceed? Being over a limit is an answer, not an error.
    fn check(&self, req: CheckRequest) -> BoxFuture<Result<CheckResponse, CallError>>;
    /// Frees the concurrency slots of an earlier check's `request_id`. Called once, when the
    /// call is made (the returned future only carries it).
    fn release(&self, req: ReleaseRequest) -> BoxFuture<Result<u32, CallError>>;
}
