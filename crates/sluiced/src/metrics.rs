//! Prometheus text metrics without a metrics crate: a handful of atomics, rendered on
//! `GET /metrics`. The hot path only increments atomics (a latency observation adds to one
//! bucket; the cumulative figures are summed on render); a write lock is taken once per rule
//! id ever seen.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Upper bounds (seconds) of the latency histogram buckets.
const BUCKETS: [f64; 12] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
];

/// A histogram rendered in Prometheus' cumulative shape. Each bucket counts only the
/// observations that fall in it (an observation is one atomic add, not one per bucket above
/// it); [`Histogram::render`] sums them into the cumulative `le` series.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, secs: f64) {
        // Above the last bound (or NaN): only in `+Inf`, which is the count.
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((secs * 1e9) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        // An observation under way may be in its bucket and not yet in the count: `+Inf`
        // never falls below the buckets.
        let n = self.count.load(Ordering::Relaxed).max(cumulative);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {n}");
        let lb = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{lb} {}",
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count{lb} {n}");
    }
}

/// The counters of one domain's rules, by rule id.
type DomainCounters = BTreeMap<Arc<str>, Arc<RuleCounters>>;

/// Decision counters of one rule, by outcome.
#[derive(Debug, Default)]
pub struct RuleCounters {
    /// Admitted by this rule.
    pub allowed: AtomicU64,
    /// Refused by this rule.
    pub over_limit: AtomicU64,
    /// Would have refused (shadow).
    pub shadow_denied: AtomicU64,
    /// Store failed, rule failed open.
    pub failed_open: AtomicU64,
    /// Store failed, rule failed closed.
    pub failed_closed: AtomicU64,
    /// Store failed, decided on a local bucket.
    pub local: AtomicU64,
}

/// A part of the daemon that renders its own series (the regions' gossip counters), so that
/// they keep their own types and labels.
pub trait Exporter: Send + Sync + std::fmt::Debug {
    /// Appends Prometheus text to `out`.
    fn render(&self, out: &mut String);
}

/// Everything the daemon exports.
#[derive(Debug, Default)]
pub struct Metrics {
    /// By domain, then rule id: rule ids are unique within a domain only.
    rules: RwLock<BTreeMap<Arc<str>, DomainCounters>>,
    exporters: RwLock<Vec<Arc<dyn Exporter>>>,
    /// End-to-end check latency.
    pub check_latency: Histogram,
    /// Store call latency.
    pub store_latency: Histogram,
    /// Checks by final code.
    pub checks_ok: AtomicU64,
    /// Checks answered OVER_LIMIT.
    pub checks_over_limit: AtomicU64,
    /// Checks answered UNAVAILABLE.
    pub checks_unavailable: AtomicU64,
    /// Requests refused as bad input.
    pub bad_requests: AtomicU64,
    /// Store call failures.
    pub store_errors: AtomicU64,
    /// Checks whose deciding panicked (a bug), answered by the rules' failure modes.
    pub panics: AtomicU64,
    /// Concurrency releases whose store call failed (the slot expires by its timeout).
    pub release_failures: AtomicU64,
}

impl Metrics {
    /// The counters of a domain's rule, created on first use.
    pub fn rule(&self, domain: &str, id: &Arc<str>) -> Arc<RuleCounters> {
        if let Some(c) = self
            .rules
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(domain)
            .and_then(|d| d.get(id))
        {
            return c.clone();
        }
        let mut w = self.rules.write().unwrap_or_else(|p| p.into_inner());
        if !w.contains_key(domain) {
            w.insert(Arc::from(domain), BTreeMap::new());
        }
        w.get_mut(domain)
            .map(|d| d.entry(id.clone()).or_default().clone())
            .unwrap_or_default()
    }

    /// Adds a part whose series [`Metrics::render`] appends.
    pub fn add_exporter(&self, e: Arc<dyn Exporter>) {
        self.exporters
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }

    /// Prometheus text exposition; `extra` lets other parts (store, rules) append theirs.
    pub fn render(&self, extra: &[(&str, &str, u64)]) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP sluice_decisions_total Decisions by domain, rule and outcome.\n# TYPE sluice_decisions_total counter\n");
        let rules = self.rules.read().unwrap_or_else(|p| p.into_inner());
        for (domain, id, c) in rules
            .iter()
            .flat_map(|(d, rs)| rs.iter().map(move |(id, c)| (d, id, c)))
        {
            for (outcome, v) in [
                ("allowed", &c.allowed),
                ("over_limit", &c.over_limit),
                ("shadow_denied", &c.shadow_denied),
                ("failed_open", &c.failed_open),
                ("failed_closed", &c.failed_closed),
                ("local", &c.local),
            ] {
                let _ = writeln!(
                    out,
                    "sluice_decisions_total{{domain=\"{domain}\",rule=\"{id}\",outcome=\"{outcome}\"}} {}",
                    v.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str(
            "# HELP sluice_checks_total Checks by code.\n# TYPE sluice_checks_total counter\n",
        );
        for (code, v) in [
            ("OK", &self.checks_ok),
            ("OVER_LIMIT", &self.checks_over_limit),
            ("UNAVAILABLE", &self.checks_unavailable),
        ] {
            let _ = writeln!(
                out,
                "sluice_checks_total{{code=\"{code}\"}} {}",
                v.load(Ordering::Relaxed)
            );
        }
        for (name, help, v) in [
            (
                "sluice_bad_requests_total",
                "Checks refused as invalid input.",
                &self.bad_requests,
            ),
            (
                "sluice_store_errors_total",
                "Store calls that failed.",
                &self.store_errors,
            ),
            (
                "sluice_check_panics_total",
                "Checks whose deciding panicked (a bug), answered by the rules' failure modes.",
                &self.panics,
            ),
            (
                "sluice_release_failures_total",
                "Concurrency releases whose store call failed or timed out: the slot is freed only by its timeout.",
                &self.release_failures,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP sluice_check_duration_seconds Check latency inside the daemon.\n# TYPE sluice_check_duration_seconds histogram\n");
        self.check_latency
            .render(&mut out, "sluice_check_duration_seconds", "");
        out.push_str("# HELP sluice_store_duration_seconds Store call latency.\n# TYPE sluice_store_duration_seconds histogram\n");
        self.store_latency
            .render(&mut out, "sluice_store_duration_seconds", "");
        for (name, help, v) in extra {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        for e in self
            .exporters
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            e.render(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.rule("d", &Arc::from("r1"))
            .allowed
            .fetch_add(3, Ordering::Relaxed);
        m.check_latency.observe(0.0003);
        let t = m.render(&[("sluice_rules_version", "Loaded rules version.", 7)]);
        assert!(
            t.contains("sluice_decisions_total{domain=\"d\",rule=\"r1\",outcome=\"allowed\"} 3")
        );
        assert!(t.contains("sluice_check_duration_seconds_bucket{le=\"0.0005\"} 1"));
        assert!(t.contains("sluice_check_duration_seconds_bucket{le=\"0.00025\"} 0"));
        assert!(t.contains("sluice_check_duration_seconds_count 1"));
        assert!(t.contains("sluice_rules_version 7"));
    }

    #[test]
    fn histogram_buckets_render_cumulative() {
        let h = Histogram::default();
        for secs in [0.00001, 0.00005, 0.0003, 0.003, 0.5, 2.0] {
            h.observe(secs);
        }
        // Each observation is in one bucket only.
        let stored: Vec<u64> = h.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(stored, [2, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1]);
        let mut out = String::new();
        h.render(&mut out, "h", "");
        let expected = [
            ("0.00005", 2),
            ("0.0001", 2),
            ("0.00025", 2),
            ("0.0005", 3),
            ("0.001", 3),
            ("0.0025", 3),
            ("0.005", 4),
            ("0.01", 4),
            ("0.025", 4),
            ("0.05", 4),
            ("0.1", 4),
            ("1", 5),
            ("+Inf", 6),
        ];
        let lines: Vec<&str> = out.lines().collect();
        for (line, (le, n)) in lines.iter().zip(expected) {
            assert_eq!(*line, format!("h_bucket{{le=\"{le}\"}} {n}"));
        }
        assert_eq!(lines[expected.len()], "h_sum 2.50336");
        assert_eq!(lines[expected.len() + 1], "h_count 6");
    }
}
