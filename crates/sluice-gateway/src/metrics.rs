//! The gateway's own `/metrics`: what the layer decided, upstream failures, and how long the
//! limiter took.
//!
//! The series are the gateway's own; the text format is written by `sluice-metrics`, the
//! workspace's one writer.

use sluice_metrics::{self as prom, Counts, Kind};
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
        let requests = "sluice_gateway_requests_total";
        prom::header(
            &mut out,
            requests,
            "Requests by what the gateway did with them.",
            Kind::Counter,
        );
        for (outcome, v) in [
            ("forwarded", stats.allowed()),
            ("over_limit", stats.over_limit()),
            ("unavailable", stats.unavailable()),
            ("failed_open", stats.failed_open()),
            ("failed_closed", stats.failed_closed()),
        ] {
            prom::sample(&mut out, requests, &[("outcome", outcome)], v);
        }
        prom::counter(
            &mut out,
            "sluice_gateway_upstream_errors_total",
            "Upstream calls that failed (answered 502).",
            self.upstream_errors.load(Ordering::Relaxed),
        );
        let latency = "sluice_gateway_check_duration_seconds";
        prom::header(
            &mut out,
            latency,
            "Time of one check with sluiced, answered or not.",
            Kind::Histogram,
        );
        let l = &self.check_latency;
        prom::Histogram {
            bounds: &BUCKETS,
            counts: Counts::PerBucket(&l.buckets.each_ref().map(|c| c.load(Ordering::Relaxed))),
            count: l.count.load(Ordering::Relaxed),
            sum: l.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
        .write(&mut out, latency, &[]);
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

    /// The whole exposition, byte for byte: what scrapers and dashboards were built on.
    #[test]
    fn renders_the_same_text() {
        let m = Metrics::default();
        m.check_latency.record(0.0002);
        m.check_latency.record(0.004);
        m.check_latency.record(1.0);
        m.upstream_errors.fetch_add(2, Ordering::Relaxed);
        let expected = "\
# HELP sluice_gateway_requests_total Requests by what the gateway did with them.\n\
# TYPE sluice_gateway_requests_total counter\n\
sluice_gateway_requests_total{outcome=\"forwarded\"} 0\n\
sluice_gateway_requests_total{outcome=\"over_limit\"} 0\n\
sluice_gateway_requests_total{outcome=\"unavailable\"} 0\n\
sluice_gateway_requests_total{outcome=\"failed_open\"} 0\n\
sluice_gateway_requests_total{outcome=\"failed_closed\"} 0\n\
# HELP sluice_gateway_upstream_errors_total Upstream calls that failed (answered 502).\n\
# TYPE sluice_gateway_upstream_errors_total counter\n\
sluice_gateway_upstream_errors_total 2\n\
# HELP sluice_gateway_check_duration_seconds Time of one check with sluiced, answered or not.\n\
# TYPE sluice_gateway_check_duration_seconds histogram\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.0001\"} 0\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.00025\"} 1\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.0005\"} 1\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.001\"} 1\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.002\"} 1\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.003\"} 1\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.005\"} 2\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.01\"} 2\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.05\"} 2\n\
sluice_gateway_check_duration_seconds_bucket{le=\"0.25\"} 2\n\
sluice_gateway_check_duration_seconds_bucket{le=\"+Inf\"} 3\n\
sluice_gateway_check_duration_seconds_sum 1.0042\n\
sluice_gateway_check_duration_seconds_count 3\n\
";
        assert_eq!(m.render(&Stats::default()), expected);
    }
}
