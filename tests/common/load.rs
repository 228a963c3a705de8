//! Paced gRPC load on one key: tasks each sending checks on a schedule, and what came back.

use super::HANG;
use sluice_proto::sluice::v1::{CheckRequest, limiter_client::LimiterClient};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The runtime the gRPC clients run on: two workers, as the test machines have two cores.
pub fn grpc_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A connection to the daemon's gRPC port, without Nagle's delay on small answers.
pub async fn channel(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect to sluiced")
}

/// A check of one unit for `user` in `domain`.
pub fn check_request(domain: &str, user: &str) -> CheckRequest {
    CheckRequest {
        domain: domain.into(),
        descriptors: [("user".to_string(), user.to_string())].into(),
        cost: None,
    }
}

/// What a paced load got back.
#[derive(Debug, Default, Clone)]
pub struct Load {
    /// Checks sent.
    pub requests: u64,
    /// Answered allowed.
    pub allowed: u64,
    /// Answered refused.
    pub denied: u64,
    /// Failed or unanswered within [`HANG`].
    pub errors: u64,
    /// From the first request sent to the last answer received: every decision the daemons
    /// made lies inside it.
    pub first_sent: Option<Instant>,
    /// See `first_sent`.
    pub last_answered: Option<Instant>,
}

impl Load {
    /// Adds another load's answers, the span covering both.
    pub fn add(&mut self, o: &Load) {
        self.requests += o.requests;
        self.allowed += o.allowed;
        self.denied += o.denied;
        self.errors += o.errors;
        self.first_sent = match (self.first_sent, o.first_sent) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_answered = self.last_answered.max(o.last_answered);
    }

    /// From the first request sent to the last answer (zero for no request).
    pub fn span(&self) -> Duration {
        match (self.first_sent, self.last_answered) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        }
    }

    /// The requests a second it offered over its span.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.span().as_secs_f64().max(1e-9)
    }
}

/// `tasks` tasks each sending one check for `user` every `period` (catching up when an
/// answer was slow; their starts spread over the period), task `t` on `chans[t % len]`,
/// until `run` has passed.
pub async fn paced(
    chans: Vec<Channel>,
    domain: String,
    user: String,
    tasks: usize,
    period: Duration,
    run: Duration,
) -> Load {
    paced_requests(chans, check_request(&domain, &user), tasks, period, run).await
}

/// [`paced`] sending `req` (any descriptors) instead of one user's check.
pub async fn paced_requests(
    chans: Vec<Channel>,
    req: CheckRequest,
    tasks: usize,
    period: Duration,
    run: Duration,
) -> Load {
    let start = tokio::time::Instant::now();
    let end = Instant::now() + run;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let mut client = LimiterClient::new(chans[t % chans.len()].clone());
        let req = req.clone();
        // Staggered over the period, so the load is even rather than bursts of `tasks`.
        let first = start + period.mul_f64(t as f64 / tasks as f64);
        handles.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(first, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut load = Load::default();
            loop {
                tick.tick().await;
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                load.first_sent.get_or_insert(sent);
                load.requests += 1;
                match tokio::time::timeout(HANG, client.check(req.clone())).await {
                    Ok(Ok(r)) if r.get_ref().allowed => load.allowed += 1,
                    Ok(Ok(_)) => load.denied += 1,
                    _ => load.errors += 1,
                }
                load.last_answered = Some(Instant::now());
            }
            load
        }));
    }
    let mut total = Load::default();
    for h in handles {
        total.add(&h.await.expect("load task"));
    }
    total
}
