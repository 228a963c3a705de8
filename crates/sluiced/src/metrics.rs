//! Prometheus text metrics without a metrics crate: a handful of atomics, rendered on
//! `GET /metrics`. The hot path only increments atomics: a decision's per-rule counters are
//! found in a table resolved once per published rule set ([`Metrics::resolve`]), and a
//! latency observation adds to one bucket; the cumulative figures are summed on render.

use arc_swap::ArcSwap;
use sluice_control::Published;
use sluice_core::decision::{Decision, Via};
use sluice_core::rules::{Domain, RuleSet};
use sluice_metrics::{self as prom, Counts, Kind};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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

    fn render(&self, out: &mut String, name: &str, labels: &[(&str, &str)]) {
        prom::Histogram {
            bounds: &BUCKETS,
            counts: Counts::PerBucket(&self.counts.each_ref().map(|c| c.load(Ordering::Relaxed))),
            count: self.count.load(Ordering::Relaxed),
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
        .write(out, name, labels);
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

impl RuleCounters {
    /// The counter of a policy's verdict.
    fn of_verdict(&self, via: Via, allowed: bool) -> &AtomicU64 {
        match (via, allowed) {
            (Via::FailedOpen, _) => &self.failed_open,
            (Via::FailedClosed, _) => &self.failed_closed,
            (Via::Local, _) => &self.local,
            (Via::Store, true) => &self.allowed,
            (Via::Store, false) => &self.over_limit,
        }
    }

    /// Whether nothing was ever counted: such a rule has no series yet (as before it is first
    /// decided), so resolving a rule set up front adds none.
    fn untouched(&self) -> bool {
        [
            &self.allowed,
            &self.over_limit,
            &self.shadow_denied,
            &self.failed_open,
            &self.failed_closed,
            &self.local,
        ]
        .iter()
        .all(|c| c.load(Ordering::Relaxed) == 0)
    }
}

/// A domain's and a rule id's addresses: the table's key.
type Addr = (usize, usize);

/// The per-rule counters of one published rule set, keyed by the address of the rule's
/// [`Domain`] and of its id (an [`Arc<str>`] a decision's policies share with the rule), so
/// the hot path hashes two integers and never compares strings. The table holds the set, so
/// none of those addresses can be reused while they are keys: an equal address is the same
/// allocation, hence the same domain and id. A rule of no published set (Envoy's limit
/// overrides) or of a set newer than the table is simply not found and goes the slow way.
#[derive(Debug, Default)]
struct RuleTable {
    set: Option<Arc<RuleSet>>,
    by_addr: HashMap<Addr, Arc<RuleCounters>, foldhash::fast::FixedState>,
}

fn addr(domain: &Domain, id: &Arc<str>) -> Addr {
    (
        std::ptr::from_ref(domain) as usize,
        Arc::as_ptr(id).cast::<u8>() as usize,
    )
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
    /// By domain, then rule id: rule ids are unique within a domain only. Every counter
    /// ever made stays here (a rule removed keeps its totals: a counter does not go back),
    /// and a republished rule finds its own again.
    rules: RwLock<BTreeMap<Arc<str>, DomainCounters>>,
    /// The live rule set's counters, swapped whole by [`Metrics::resolve`].
    table: ArcSwap<RuleTable>,
    /// One resolver at a time (the publish watcher, or a check that met a newer set).
    resolving: Mutex<()>,
    exporters: RwLock<Vec<Arc<dyn Exporter>>>,
    /// End-to-end check latency.
    pub check_latency: Histogram,
    /// Store call latency of the main store.
    pub store_latency: Histogram,
    /// Store call latency of each named store (`stores:`), by name: rendered under the
    /// same series with its `store` label.
    pub named_store_latency: RwLock<Vec<(Arc<str>, Arc<Histogram>)>>,
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
    /// Counts a decision's policies and shadow refusals for `domain`'s rules. A rule of the
    /// table's set is an index and an atomic add; any other takes [`Metrics::rule`], and
    /// resolves `rules`' current set first when the table is behind it.
    pub fn count(&self, rules: &Published, domain: &Domain, d: &Decision) {
        let table = self.table.load();
        for pol in &d.policies {
            self.with_rule(&table, rules, domain, &pol.id, |c| {
                c.of_verdict(pol.via, pol.allowed)
                    .fetch_add(1, Ordering::Relaxed);
            });
        }
        for id in &d.shadow_denied {
            self.with_rule(&table, rules, domain, id, |c| {
                c.shadow_denied.fetch_add(1, Ordering::Relaxed);
            });
        }
    }

    /// Runs `f` on a rule's counters: from the table, else the slow way.
    #[inline]
    fn with_rule(
        &self,
        table: &RuleTable,
        rules: &Published,
        domain: &Domain,
        id: &Arc<str>,
        f: impl FnOnce(&RuleCounters),
    ) {
        match table.by_addr.get(&addr(domain, id)) {
            Some(c) => f(c),
            None => f(&self.missed(rules, domain, id)),
        }
    }

    /// A rule not in the table: a set published since it was resolved (its first checks,
    /// before the watcher got to it), or a rule of no set.
    #[cold]
    fn missed(&self, rules: &Published, domain: &Domain, id: &Arc<str>) -> Arc<RuleCounters> {
        if let Ok(_one) = self.resolving.try_lock() {
            self.resolve_locked(rules);
        }
        self.rule(&domain.name, id)
    }

    /// Resolves the counters of `rules`' current set into the table the hot path reads:
    /// called on every publish (and by a check that meets a set the table is behind).
    pub fn resolve(&self, rules: &Published) {
        let _one = self.resolving.lock().unwrap_or_else(|p| p.into_inner());
        self.resolve_locked(rules);
    }

    /// [`Metrics::resolve`] under `resolving`: the set is read under the lock, so the last
    /// resolver stores the newest set it could see.
    fn resolve_locked(&self, rules: &Published) {
        let set = rules.load();
        if self
            .table
            .load()
            .set
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &set))
        {
            return;
        }
        let mut by_addr = HashMap::with_capacity_and_hasher(set.rule_count(), Default::default());
        {
            let mut w = self.rules.write().unwrap_or_else(|p| p.into_inner());
            for dom in set.domains.values() {
                if !w.contains_key(dom.name.as_str()) {
                    w.insert(Arc::from(dom.name.as_str()), BTreeMap::new());
                }
                let Some(counters) = w.get_mut(dom.name.as_str()) else {
                    continue;
                };
                for r in &dom.rules {
                    let c = counters.entry(r.id.clone()).or_default().clone();
                    by_addr.insert(addr(dom, &r.id), c);
                }
            }
        }
        self.table.store(Arc::new(RuleTable {
            set: Some(set),
            by_addr,
        }));
    }

    /// Resolves the table on every publish until `stop` fires, so the first checks on a new
    /// set already find their counters.
    pub async fn follow(&self, rules: &Published, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut changes = rules.subscribe();
        loop {
            self.resolve(rules);
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                _ = stop.changed() => return,
            }
        }
    }

    /// The counters of a domain's rule, created on first use: the slow way, a lock and a
    /// lookup by name.
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
        let decisions = "sluice_decisions_total";
        prom::header(
            &mut out,
            decisions,
            "Decisions by domain, rule and outcome.",
            Kind::Counter,
        );
        let rules = self.rules.read().unwrap_or_else(|p| p.into_inner());
        for (domain, id, c) in rules
            .iter()
            .flat_map(|(d, rs)| rs.iter().map(move |(id, c)| (d, id, c)))
            .filter(|(_, _, c)| !c.untouched())
        {
            for (outcome, v) in [
                ("allowed", &c.allowed),
                ("over_limit", &c.over_limit),
                ("shadow_denied", &c.shadow_denied),
                ("failed_open", &c.failed_open),
                ("failed_closed", &c.failed_closed),
                ("local", &c.local),
            ] {
                let labels = [("domain", &**domain), ("rule", &**id), ("outcome", outcome)];
                prom::sample(&mut out, decisions, &labels, v.load(Ordering::Relaxed));
            }
        }
        let checks = "sluice_checks_total";
        prom::header(&mut out, checks, "Checks by code.", Kind::Counter);
        for (code, v) in [
            ("OK", &self.checks_ok),
            ("OVER_LIMIT", &self.checks_over_limit),
            ("UNAVAILABLE", &self.checks_unavailable),
        ] {
            prom::sample(
                &mut out,
                checks,
                &[("code", code)],
                v.load(Ordering::Relaxed),
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
            prom::counter(&mut out, name, help, v.load(Ordering::Relaxed));
        }
        let name = "sluice_check_duration_seconds";
        prom::header(
            &mut out,
            name,
            "Check latency inside the daemon.",
            Kind::Histogram,
        );
        self.check_latency.render(&mut out, name, &[]);
        let name = "sluice_store_duration_seconds";
        prom::header(
            &mut out,
            name,
            "Store call latency, by store (default: the main one).",
            Kind::Histogram,
        );
        self.store_latency
            .render(&mut out, name, &[("store", sluice_core::stores::DEFAULT)]);
        for (store, h) in self
            .named_store_latency
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            h.render(&mut out, name, &[("store", store)]);
        }
        for (name, help, v) in extra {
            prom::gauge(&mut out, name, help, *v);
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
    use sluice_core::decision::{Code, PolicyStatus, QuotaUnit};
    use sluice_core::rules::{HeaderMode, parse_yaml};

    const TWO: &str = "domain: d
rules:
  - { id: r1, key: [k], algorithm: fixed_window, limit: 10, window: 1h }
  - { id: r2, key: [k], algorithm: fixed_window, limit: 10, window: 1h }
";
    const ONE: &str = "domain: d
rules:
  - { id: r1, key: [k], algorithm: fixed_window, limit: 10, window: 1h }
";

    /// A decision of `domain`'s rule `id` as the core makes it: the policy shares the rule's id.
    fn decision(domain: &Domain, id: &str, via: Via, allowed: bool) -> Decision {
        let rule = domain.rule(id).expect("rule in the set");
        Decision {
            code: Code::Ok,
            decided_by: None,
            retry_after_ms: 0,
            delay_ms: 0,
            policies: vec![PolicyStatus {
                id: rule.id.clone(),
                limit: 10,
                window_s: 3600,
                remaining: 9,
                reset_s: 1,
                allowed,
                retry_after_ms: 0,
                headers: HeaderMode::Full,
                via,
                unit: QuotaUnit::Requests,
                title: None,
            }],
            shadow_denied: Vec::new(),
            rules_version: 0,
            holds_slot: false,
        }
    }

    fn series(m: &Metrics, rule: &str, outcome: &str) -> Option<u64> {
        let prefix = format!(
            "sluice_decisions_total{{domain=\"d\",rule=\"{rule}\",outcome=\"{outcome}\"}} "
        );
        m.render(&[])
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(|v| v.parse().expect("a count")))
    }

    fn table_len(m: &Metrics) -> usize {
        m.table.load().by_addr.len()
    }

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
        h.render(&mut out, "h", &[]);
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

    #[test]
    fn a_published_set_is_counted_through_its_table() {
        let published = Published::new(parse_yaml(TWO).expect("valid rules"));
        let m = Metrics::default();
        m.resolve(&published);
        assert_eq!(table_len(&m), 2);
        let set = published.load();
        let d = set.domain("d").expect("domain");
        m.count(&published, d, &decision(d, "r1", Via::Store, true));
        m.count(&published, d, &decision(d, "r1", Via::Store, false));
        m.count(&published, d, &decision(d, "r1", Via::Local, true));
        assert_eq!(series(&m, "r1", "allowed"), Some(1));
        assert_eq!(series(&m, "r1", "over_limit"), Some(1));
        assert_eq!(series(&m, "r1", "local"), Some(1));
        assert_eq!(series(&m, "r1", "failed_open"), Some(0));
        // Resolved but never decided: no series, as before counters were made up front.
        assert_eq!(series(&m, "r2", "allowed"), None);
    }

    #[test]
    fn counters_survive_a_republish_and_a_removed_rule_keeps_its_totals() {
        let published = Published::new(parse_yaml(TWO).expect("valid rules"));
        let m = Metrics::default();
        m.resolve(&published);
        let old = published.load();
        let d = old.domain("d").expect("domain");
        m.count(&published, d, &decision(d, "r1", Via::Store, true));
        m.count(&published, d, &decision(d, "r2", Via::Store, true));
        // The same rule parsed again: new allocations, the same counter.
        published.publish(parse_yaml(ONE).expect("valid rules"));
        m.resolve(&published);
        assert_eq!(table_len(&m), 1);
        let new = published.load();
        let d = new.domain("d").expect("domain");
        m.count(&published, d, &decision(d, "r1", Via::Store, true));
        assert_eq!(series(&m, "r1", "allowed"), Some(2));
        assert_eq!(
            series(&m, "r2", "allowed"),
            Some(1),
            "a counter does not go back"
        );
    }

    #[test]
    fn a_check_on_a_set_the_table_is_behind_counts_and_resolves_it() {
        let published = Published::new(parse_yaml(ONE).expect("valid rules"));
        let m = Metrics::default();
        m.resolve(&published);
        published.publish(parse_yaml(TWO).expect("valid rules"));
        let set = published.load();
        let d = set.domain("d").expect("domain");
        m.count(&published, d, &decision(d, "r2", Via::FailedOpen, true));
        assert_eq!(series(&m, "r2", "failed_open"), Some(1));
        assert_eq!(table_len(&m), 2, "the check resolved the new set");
        m.count(&published, d, &decision(d, "r2", Via::FailedOpen, true));
        assert_eq!(series(&m, "r2", "failed_open"), Some(2));
    }

    #[test]
    fn a_rule_of_no_set_and_shadow_refusals_are_counted() {
        let published = Published::new(parse_yaml(ONE).expect("valid rules"));
        let m = Metrics::default();
        m.resolve(&published);
        let set = published.load();
        // Envoy's limit override: a synthetic domain of the same name, a rule of no set.
        let synthetic = Domain::new("d".into(), vec![set.domains["d"].rules[0].clone()], vec![]);
        let mut dec = decision(&synthetic, "r1", Via::FailedClosed, false);
        dec.shadow_denied.push(set.domains["d"].rules[0].id.clone());
        m.count(&published, &synthetic, &dec);
        m.count(&published, &set.domains["d"], &dec);
        assert_eq!(series(&m, "r1", "failed_closed"), Some(2));
        assert_eq!(series(&m, "r1", "shadow_denied"), Some(2));
    }

    /// Waits (boundedly) until the table holds `n` rules.
    async fn table_reaches(m: &Metrics, n: usize) {
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while table_len(m) != n {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the table never held {n} rules"));
    }

    #[tokio::test]
    async fn the_table_follows_each_publish() {
        let published = Published::new(parse_yaml(ONE).expect("valid rules"));
        let m = Arc::new(Metrics::default());
        let (stop, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn({
            let (m, published) = (m.clone(), published.clone());
            async move { m.follow(&published, rx).await }
        });
        table_reaches(&m, 1).await;
        published.publish(parse_yaml(TWO).expect("valid rules"));
        table_reaches(&m, 2).await;
        let _ = stop.send(true);
        task.await.expect("the watcher ends on stop");
    }

    /// An exporter's text goes after the daemon's own.
    #[derive(Debug)]
    struct Fixed;

    impl Exporter for Fixed {
        fn render(&self, out: &mut String) {
            out.push_str("exported 1\n");
        }
    }

    /// The whole exposition, byte for byte (`testdata/metrics.prom`): what scrapers and
    /// dashboards were built on.
    #[test]
    fn renders_the_same_text() {
        let m = Metrics::default();
        let r = m.rule("d", &Arc::from("r1"));
        r.allowed.fetch_add(3, Ordering::Relaxed);
        r.local.fetch_add(1, Ordering::Relaxed);
        m.rule("d", &Arc::from("r0"));
        m.rule("e", &Arc::from("x"))
            .shadow_denied
            .fetch_add(5, Ordering::Relaxed);
        for secs in [0.0003, 0.03, 3.0] {
            m.check_latency.observe(secs);
        }
        m.store_latency.observe(0.00001);
        m.checks_ok.fetch_add(4, Ordering::Relaxed);
        m.panics.fetch_add(1, Ordering::Relaxed);
        m.add_exporter(Arc::new(Fixed));
        let t = m.render(&[
            ("sluice_rules_version", "Loaded rules version.", 7),
            ("g2", "Other.", 0),
        ]);
        assert_eq!(t, include_str!("../testdata/metrics.prom"));
    }
}
