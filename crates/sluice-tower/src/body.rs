//! The response body the layer hands back: the upstream's, carrying the concurrency slot's
//! release, or the layer's own problem document.
//!
//! A concurrency rule counts requests in flight, and a request is in flight until its response
//! body is done. The [`ReleaseGuard`] rides in the body and sends the release when the body
//! ends, fails or is dropped unfinished (a client that hangs up), so a slot is never leaked to
//! its expiry.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use sluice_proto::sluice::v1::ReleaseRequest;

use crate::limiter::Limiter;

/// Sends one `Release` when fired or dropped, whichever comes first.
pub struct ReleaseGuard {
    limiter: Arc<dyn Limiter>,
    req: Option<ReleaseRequest>,
}

impl std::fmt::Debug for ReleaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseGuard")
            .field("req", &self.req)
            .finish_non_exhaustive()
    }
}

impl ReleaseGuard {
    /// A guard that will release `req`'s slots through `limiter`.
    pub fn new(limiter: Arc<dyn Limiter>, req: ReleaseRequest) -> Self {
        ReleaseGuard {
            limiter,
            req: Some(req),
        }
    }

    /// Sends the release now (once; later calls and the drop do nothing). The call runs on
    /// the current tokio runtime; outside one it is logged and left to the slot's expiry.
    pub fn fire(&mut self) {
        let Some(req) = self.req.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(request_id = %req.request_id, "no runtime to send a release on; the slot waits for its expiry");
            return;
        };
        let id = req.request_id.clone();
        let call = self.limiter.release(req);
        rt.spawn(async move {
            if let Err(e) = call.await {
                tracing::warn!(request_id = %id, error = %e, "release failed; the slot waits for its expiry");
            }
        });
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        self.fire();
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Upstream { #[pin] body: B, guard: Option<ReleaseGuard> },
        Full { data: Option<Bytes> },
    }
}

pin_project_lite::pin_project! {
    /// The layer's response body: the upstream's (with its release guard, if any) or the
    /// layer's own answer.
    pub struct SluiceBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

impl<B> std::fmt::Debug for SluiceBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Upstream { guard, .. } => f
                .debug_struct("SluiceBody::Upstream")
                .field("guard", guard)
                .finish_non_exhaustive(),
            Kind::Full { data } => f
                .debug_struct("SluiceBody::Full")
                .field("data", data)
                .finish(),
        }
    }
}

impl<B> SluiceBody<B> {
    /// The upstream's body, releasing through `guard` when it is done.
    pub fn upstream(body: B, guard: Option<ReleaseGuard>) -> Self {
        SluiceBody {
            kind: Kind::Upstream { body, guard },
        }
    }

    /// A body of the layer's own.
    pub fn full(data: Bytes) -> Self {
        SluiceBody {
            kind: Kind::Full { data: Some(data) },
        }
    }
}

impl<B: Body<Data = Bytes>> Body for SluiceBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Upstream { mut body, guard } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                let done = match &frame {
                    None | Some(Err(_)) => true,
                    Some(Ok(_)) => body.is_end_stream(),
                };
                if done && let Some(mut g) = guard.take() {
                    g.fire();
                }
                Poll::Ready(frame)
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Upstream { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
