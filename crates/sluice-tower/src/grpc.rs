//! [`GrpcLimiter`]: the [`Limiter`] over tonic, `sluice.v1.Limiter` on the daemon's gRPC port.

use std::time::Duration;

use sluice_proto::sluice::v1::limiter_client::LimiterClient;
use sluice_proto::sluice::v1::{CheckRequest, CheckResponse, ReleaseRequest};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use crate::limiter::{BoxFuture, CallError, Limiter};

/// The default deadline of a check: the daemon answers in well under a millisecond, and a
/// gateway should not hold a request long for a limiter that is not there.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(3);

/// A daemon's gRPC API on one tonic channel (lazily connected, reconnecting by itself).
#[derive(Debug, Clone)]
pub struct GrpcLimiter {
    client: LimiterClient<Channel>,
    deadline: Duration,
}

impl GrpcLimiter {
    /// A client of `uri` (`http://10.0.0.5:8081`) with the default deadline. Connects on the
    /// first call, within that call's deadline (so the first checks may fail over to the
    /// [`crate::FailureMode`]); must be called inside a tokio runtime.
    pub fn connect_lazy(uri: &str) -> Result<Self, CallError> {
        let endpoint = Endpoint::from_shared(uri.to_string())
            .map_err(|e| CallError::Refused(format!("bad limiter address {uri:?}: {e}")))?
            .tcp_nodelay(true);
        Ok(Self::new(endpoint.connect_lazy()))
    }

    /// A client of `uri`, connected before it returns: the first checks do not spend their
    /// deadline on the TCP and HTTP/2 handshakes.
    pub async fn connect(uri: &str) -> Result<Self, CallError> {
        let endpoint = Endpoint::from_shared(uri.to_string())
            .map_err(|e| CallError::Refused(format!("bad limiter address {uri:?}: {e}")))?
            .tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| CallError::Unavailable(format!("connecting to {uri}: {e}")))?;
        Ok(Self::new(channel))
    }

    /// A client on an existing channel, with the default deadline.
    pub fn new(channel: Channel) -> Self {
        GrpcLimiter {
            client: LimiterClient::new(channel),
            deadline: DEFAULT_DEADLINE,
        }
    }

    /// The same client with another per-call deadline (checks and releases).
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}

/// A status as retryable or not.
fn classify(status: tonic::Status) -> CallError {
    let text = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Unavailable
        | Code::ResourceExhausted
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::Cancelled
        | Code::Unknown
        | Code::Internal => CallError::Unavailable(text),
        _ => CallError::Refused(text),
    }
}

impl Limiter for GrpcLimiter {
    fn check(&self, req: CheckRequest) -> BoxFuture<Result<CheckResponse, CallError>> {
        let mut client = self.client.clone();
        let deadline = self.deadline;
        Box::pin(async move {
            match tokio::time::timeout(deadline, client.check(req)).await {
                Ok(Ok(resp)) => Ok(resp.into_inner()),
                Ok(Err(status)) => Err(classify(status)),
                Err(_) => Err(CallError::Deadline(deadline)),
            }
        })
    }

    fn release(&self, req: ReleaseRequest) -> BoxFuture<Result<u32, CallError>> {
        let mut client = self.client.clone();
        // A release is off the request's path: give it more time than a check.
        let deadline = self.deadline.max(Duration::from_millis(250));
        Box::pin(async move {
            match tokio::time::timeout(deadline, client.release(req)).await {
                Ok(Ok(resp)) => Ok(resp.into_inner().released),
                Ok(Err(status)) => Err(classify(status)),
                Err(_) => Err(CallError::Deadline(deadline)),
            }
        })
    }
}
