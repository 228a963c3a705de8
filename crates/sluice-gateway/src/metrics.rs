//! The gateway's own `/metrics`: what the layer decided, upstream failures, and how long the
//! limiter took.
//!
//! The workspace's Prometheus renderers live inside `sluiced` and `sluice-gossip`, for their
//! own series; this is the few lines the gateway needs, not a shared renderer.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sluice_proto::sluice::v1::{CheckRequest, CheckResponse, ReleaseRequest};
use sluice_tower::limiter::BoxFuture;
use sluice_tower::{CallError, Limiter, Stats};

/// Upper bounds of the check latency buckets, seconds: around the 3 ms default deadline.
const BUCKETS: [f64; 10] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.05, 0.25,
];

/// The check latency histogram (cumulative at render time).
#[derive(Debug, Default)]
pub struct Latency {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Latency {
    fn record(&self, secs: f64) {
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((secs * 1e9) as u64, Ordering::Relaxed);
    }
}

/// The gateway's counters, shared by the proxy and the metrics listener.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Upstream calls that failed (connect, reset): answered 502.
    pub upstream_errors: AtomicU64,
    /// Check latency, answered or not.
    pub check_latency: Latency,
}

impl Metrics {
    /// The Prometheus text exposition of these counters and the layer's `stats`.
    pub fn render(&self, stats: &Stats) -> String {
        let mut out = String::new();
        out.push_str("# HELP sluice_gateway_requests_total Requests by what the gateway did with them.\n# TYPE sluice_gateway_requests_total counter\n");
        for (outcome, v) in [
            ("forwarded", stats.allowed()),
            ("over_limit", stats.over_limit()),
            ("unavailable", stats.unavailable()),
            ("failed_open", stats.failed_open()),
            ("failed_closed", stats.failed_closed()),
        ] {
            let _ = writeln!(
                out,
                "sluice_gateway_requests_total{{outcome=\"{outcome}\"}} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP sluice_gateway_upstream_errors_total Upstream calls that failed (answered 502).\n# TYPE sluice_gateway_upstream_errors_total counter\nsluice_gateway_upstream_errors_total {}",
            self.upstream_errors.load(Ordering::Relaxed)
        );
        out.push_str("# HELP sluice_gateway_check_duration_seconds Time of one check with sluiced, answered or not.\n# TYPE sluice_gateway_check_duration_seconds histogram\n");
        let l = &self.check_latency;
        let mut cumulative = 0;
        for (b, c) in BUCKETS.iter().zip(&l.buckets) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "sluice_gateway_check_duration_seconds_bucket{{le=\"{b}\"}} {cumulative}"
            );
        }
        let count = l.count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "sluice_gateway_check_duration_seconds_bucket{{le=\"+Inf\"}} {count}\nsluice_gateway_check_duration_seconds_sum {}\nsluice_gateway_check_duration_seconds_count {count}",
            l.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        out
    }
}

/// A [`Limiter`] that times each check into [`Metrics::check_latency`].
pub struct Timed {
    /// The limiter timed.
    pub inner: Arc<dyn Limiter>,
    /// Where the time goes.
    pub metrics: Arc<Metrics>,
}

impl Limiter for Timed {
    fn check(&self, req: CheckRequest) -> BoxFuture<Result<CheckResponse, CallError>> {
        let fut = self.inner.check(req);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let start = Instant::now();
            let r = fut.await;
            metrics.check_latency.record(start.elapsed().as_secs_f64());
            r
        })
    }

    fn release(&self, req: ReleaseRequest) -> BoxFuture<Result<u32, CallError>> {
        self.inner.release(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let m = Metrics::default();
        m.check_latency.record(0.0002);
        m.check_latency.record(0.004);
        m.check_latency.record(1.0);
        let text = m.render(&Stats::default());
        assert!(text.contains("sluice_gateway_check_duration_seconds_bucket{le=\"0.00025\"} 1\n"));
        assert!(text.contains("sluice_gateway_check_duration_seconds_bucket{le=\"0.005\"} 2\n"));
        assert!(text.contains("sluice_gateway_check_duration_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("sluice_gateway_requests_total{outcome=\"failed_open\"} 0\n"));
    }
}
