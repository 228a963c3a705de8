//! A daemon's `/metrics` read into one value per series, for assertions on its counters.
//!
//! Tests assert on what the daemon counted (calls to the store, cache hits, shed checks); each
//! reading the Prometheus text by hand had its own parser. [`Metrics`] is the one: a series is
//! its name with its labels exactly as exported (`sluice_checks_total{code="OK"}`), its value
//! the number after the last space. Comment lines (`# HELP`, `# TYPE`) are skipped.

use std::collections::HashMap;
use std::net::SocketAddr;

use anyhow::{Context, Result};

use crate::http::http_get;

/// One scrape of `/metrics`: every series and its value.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    series: HashMap<String, f64>,
}

impl Metrics {
    /// `GET /metrics` on `addr` (the daemon's HTTP port), parsed.
    ///
    /// Errors when the request fails; the body is parsed whatever the status (a body that is
    /// no metrics text has no series).
    pub fn scrape(addr: SocketAddr) -> Result<Self> {
        let r = http_get(addr, "/metrics").with_context(|| format!("GET {addr}/metrics"))?;
        Ok(Self::parse(&r.text()))
    }

    /// The series of a Prometheus text exposition; lines that are not `series value` are
    /// skipped.
    pub fn parse(text: &str) -> Self {
        let series = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, v) = l.rsplit_once(' ')?;
                Some((name.to_string(), v.trim().parse().ok()?))
            })
            .collect();
        Self { series }
    }

    /// The value of `series` (name with its labels), if exported.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.series.get(series).copied()
    }

    /// The whole value of `series`, a counter or a gauge the daemon must export.
    ///
    /// Panics when it is absent, listing what is there: a missing series is a test failure,
    /// never a zero.
    pub fn count(&self, series: &str) -> u64 {
        self[series] as u64
    }

    /// The whole value of `series`, 0 when it is not exported (yet: a labelled series appears
    /// with its first event).
    pub fn count_or_zero(&self, series: &str) -> u64 {
        self.get(series).map_or(0, |v| v as u64)
    }
}

impl std::ops::Index<&str> for Metrics {
    type Output = f64;

    /// The value of `series`; panics when it is absent, listing the series there are.
    fn index(&self, series: &str) -> &f64 {
        self.series.get(series).unwrap_or_else(|| {
            let mut names: Vec<&String> = self.series.keys().collect();
            names.sort();
            panic!("no {series} in /metrics: {names:?}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_with_labels_are_read_exactly_and_comments_skipped() {
        let m = Metrics::parse(
            "# TYPE sluice_checks_total counter\nsluice_checks_total{code=\"OK\"} 12\nsluice_checks_total{code=\"OVER_LIMIT\"} 3\nsluice_store_duration_seconds_sum 0.25\nsluice_gates 0\n",
        );
        assert_eq!(m.count("sluice_checks_total{code=\"OK\"}"), 12);
        assert_eq!(m.count("sluice_checks_total{code=\"OVER_LIMIT\"}"), 3);
        assert_eq!(m["sluice_store_duration_seconds_sum"], 0.25);
        assert_eq!(m.count("sluice_gates"), 0);
        assert_eq!(m.get("sluice_checks_total"), None);
        assert_eq!(
            m.count_or_zero("sluice_checks_total{code=\"UNAVAILABLE\"}"),
            0
        );
        assert_eq!(m.get("# TYPE sluice_checks_total"), None);
    }

    #[test]
    #[should_panic(expected = "no sluice_leases in /metrics")]
    fn an_absent_series_is_a_failure() {
        Metrics::parse("sluice_gates 1\n").count("sluice_leases");
    }
}
