//! Start-up: the daemon says it is ready, and decides checks, only once its store can answer
//! within the hot path's deadline.
//!
//! The first call over a new Redis connection pays one-time costs (the connection's set-up,
//! the script cache, first-time code paths) that can exceed a 3 ms deadline; served to a
//! client, that call is a store failure, and a fail-closed rule answers `UNAVAILABLE` from a
//! healthy Redis right after a (rolling) restart. So the daemon first runs
//! [`sluice_store::Store::warm_up`] (connect, load the scripts, one call of each, per node on
//! a Cluster), retrying until it succeeds or [`START_WAIT`] has passed; meanwhile `/healthz`
//! answers 503 `{"status":"starting"}`, HTTP checks wait, and the gRPC port is not served yet
//! (its connections wait in the listen backlog). A store still failing after [`START_WAIT`] is
//! an outage, not a reason to stay down: the daemon becomes ready anyway, each rule's
//! `on_store_failure` decides, and the warm-up goes on in the background (docs/failure.md).

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sluice_store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a start waits for the store to warm up before serving without it.
pub const START_WAIT: Duration = Duration::from_secs(5);
/// The pause between two failed warm-ups during the start.
const RETRY: Duration = Duration::from_millis(100);
/// The pause between two failed warm-ups once the daemon serves without a warm store.
const RETRY_SERVING: Duration = Duration::from_secs(1);

/// Whether the daemon is ready: set once, by [`warm_up`]; cheap to read on every request.
#[derive(Debug, Clone)]
pub struct Readiness {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            tx: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl Readiness {
    /// Ready from the start: for routers served without a start-up (tests, tools).
    pub fn ready() -> Readiness {
        let r = Readiness::default();
        r.set();
        r
    }

    /// Whether the daemon has become ready.
    pub fn is_ready(&self) -> bool {
        *self.tx.borrow()
    }

    /// Marks the daemon ready (for good).
    pub fn set(&self) {
        self.tx.send_replace(true);
    }

    /// Waits until the daemon is ready (at once when it is).
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so `wait_for` only ends by the value.
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// `router` behind [`Readiness`]: until ready, `/healthz` answers 503 `{"status":"starting"}`
/// and every other request but `/metrics` waits (at most [`START_WAIT`]) for readiness.
pub fn gated(router: Router, ready: &Readiness) -> Router {
    router.layer(axum::middleware::from_fn_with_state(ready.clone(), gate))
}

async fn gate(State(ready): State<Readiness>, req: Request, next: Next) -> Response {
    if !ready.is_ready() {
        match req.uri().path() {
            "/healthz" => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(serde_json::json!({ "status": "starting" })),
                )
                    .into_response();
            }
            "/metrics" => {}
            _ => ready.wait().await,
        }
    }
    next.run(req).await
}

/// Warms `store` up (see the module doc): returns once it answered or [`START_WAIT`] passed,
/// with `ready` set either way. In the second case the warm-up goes on in the background
/// until it succeeds or `stop` fires.
pub async fn warm_up(store: Arc<dyn Store>, ready: &Readiness, stop: watch::Receiver<bool>) {
    let started = tokio::time::Instant::now();
    let mut last = None;
    let attempts = async {
        loop {
            match attempt(&store).await {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(RETRY).await;
        }
    };
    if tokio::time::timeout(START_WAIT, attempts).await.is_ok() {
        tracing::info!(
            store = store.kind(),
            took_ms = started.elapsed().as_millis() as u64,
            "store warmed up (connected, scripts loaded, one call run): ready"
        );
        ready.set();
        return;
    }
    let error = last.map_or_else(
        || "the warm-up did not finish".to_string(),
        |e| e.to_string(),
    );
    tracing::warn!(
        store = store.kind(),
        wait_s = START_WAIT.as_secs(),
        %error,
        "store not ready in time; serving with each rule's on_store_failure and retrying in the background"
    );
    ready.set();
    tokio::spawn(keep_warming(store, stop));
}

/// One warm-up, run on a runtime worker: where the checks will run (the start itself runs on
/// the main thread), so the first-time work of the calls' path is done where it counts.
async fn attempt(store: &Arc<dyn Store>) -> Result<(), StoreError> {
    let store = store.clone();
    match tokio::spawn(async move { store.warm_up().await }).await {
        Ok(r) => r,
        Err(e) => Err(StoreError::Server(format!("the warm-up failed: {e}"))),
    }
}

/// The background warm-up of a store that was down at start.
async fn keep_warming(store: Arc<dyn Store>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RETRY_SERVING) => {}
            _ = stop.changed() => return,
        }
        tokio::select! {
            r = attempt(&store) => if r.is_ok() {
                tracing::info!(store = store.kind(), "store warmed up after the start");
                return;
            },
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_are_released_when_ready_and_later_ones_pass_at_once() {
        let ready = Readiness::default();
        assert!(!ready.is_ready());
        let waiter = tokio::spawn({
            let r = ready.clone();
            async move { r.wait().await }
        });
        ready.set();
        waiter.await.expect("the waiter ends once ready");
        assert!(ready.is_ready());
        ready.wait().await;
        assert!(Readiness::ready().is_ready());
    }
}
