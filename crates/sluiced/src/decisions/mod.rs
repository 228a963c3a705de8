//! The decision log: a bounded, sampled record of recent checks on local disk, so an operator
//! changing a rule can see what it decided (and a what-if replay can read it back).
//!
//! The hot path only asks the sampler ([`sample`], sans-IO) and, for a kept check, builds its
//! record ([`record`]) and hands it to a bounded channel; a writer thread of its own appends
//! JSON lines and rotates the files ([`files`]). A full channel drops the record and counts it
//! (`sluice_decision_log_dropped_total`): a slow disk never slows a check. The admin API serves
//! the newest records ([`api`], `GET /v1/decisions`).
//!
//! # Layout
//!
//! - [`sample`]: which checks are kept (per-identity budgets; refusals always, up to a cap).
//! - [`record`]: one record, without credentials.
//! - [`files`]: JSON lines on disk, rotation by size and age, reading newest first.
//! - [`api`]: `GET /v1/decisions` on the admin listener.

pub mod api;
pub mod files;
pub mod record;
pub mod sample;

use crate::clock::{Clock as _, SystemClock};
use anyhow::Context as _;
use serde::Deserialize;
use sluice_core::Micros;
use sluice_core::algo::parse_rate;
use sluice_core::decision::{Decision, Plan};
use sluice_core::time::parse_span;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `decision_log` in the config file (docs/decision-log.md).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DecisionLogConfig {
    /// On by default; `false` turns the log off.
    pub enabled: bool,
    /// Where the files go (default `$TMPDIR/sluiced-<HTTP port>/decisions`).
    pub dir: Option<PathBuf>,
    /// All files together, bytes.
    pub max_bytes: u64,
    /// One file, bytes, before the next is started.
    pub file_bytes: u64,
    /// Records older than this are deleted (whole files).
    pub max_age: String,
    /// One file's span of time before the next is started.
    pub file_age: String,
    /// Records waiting for the writer; beyond, they are dropped and counted.
    pub queue: usize,
    /// Descriptor names (lower-case substrings) whose values are hashed, never written.
    pub redact: Vec<String>,
    /// What is kept.
    pub sample: SampleFile,
}

/// `decision_log.sample`: the sampler's budgets as the config file writes them.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SampleFile {
    /// Share of allowed checks considered (0 to 1); refusals are never thinned.
    pub fraction: f64,
    /// Allowed checks kept per identity (a rate of the rule format: `1/1s`, `10/1m`)...
    pub per_identity: String,
    /// ...up to this many at once.
    pub per_identity_burst: u64,
    /// Refusals and shadow would-refusals kept per identity...
    pub refusals_per_identity: String,
    /// ...up to this many at once.
    pub refusals_burst: u64,
    /// Allowed checks kept in all (the rate's count is its burst).
    pub max_allowed: String,
    /// Refusals kept in all.
    pub max_refusals: String,
    /// Slots of each per-identity table (memory: about 40 bytes a slot).
    pub slots: usize,
}

impl Default for SampleFile {
    fn default() -> SampleFile {
        SampleFile {
            fraction: 1.0,
            per_identity: "1/1s".into(),
            per_identity_burst: 5,
            refusals_per_identity: "10/1s".into(),
            refusals_burst: 20,
            max_allowed: "500/1s".into(),
            max_refusals: "1000/1s".into(),
            slots: 16_384,
        }
    }
}

impl Default for DecisionLogConfig {
    fn default() -> DecisionLogConfig {
        DecisionLogConfig {
            enabled: true,
            dir: None,
            max_bytes: 256 * 1024 * 1024,
            file_bytes: 16 * 1024 * 1024,
            max_age: "1d".into(),
            file_age: "1h".into(),
            queue: 4096,
            redact: [
                "authorization",
                "cookie",
                "token",
                "secret",
                "password",
                "x-api-key",
            ]
            .map(String::from)
            .to_vec(),
            sample: SampleFile::default(),
        }
    }
}

fn span(field: &str, text: &str) -> anyhow::Result<Micros> {
    parse_span(text)
        .ok()
        .and_then(|s| s.fixed())
        .with_context(|| {
            format!("decision_log.{field}: expected a duration like 1h or 1d, got {text:?}")
        })
}

fn budget(field: &str, rate: &str, burst: Option<u64>) -> anyhow::Result<sample::Budget> {
    let rate = parse_rate(rate).map_err(|e| anyhow::anyhow!("decision_log.sample.{field}: {e}"))?;
    let burst = burst.unwrap_or(rate.tokens());
    anyhow::ensure!(
        (1..=1_000_000).contains(&burst),
        "decision_log.sample.{field}: its burst must be 1 to 1000000"
    );
    rate.fits(burst)
        .map_err(|e| anyhow::anyhow!("decision_log.sample.{field}: {e}"))?;
    Ok(sample::Budget { rate, burst })
}

impl DecisionLogConfig {
    /// Rotation and sampling as the log runs them; an error names the field.
    pub fn resolve(&self) -> anyhow::Result<(files::Rotation, sample::SampleConfig)> {
        anyhow::ensure!(
            self.file_bytes >= 4096 && self.max_bytes >= self.file_bytes,
            "decision_log: file_bytes must be at least 4096 and max_bytes at least file_bytes"
        );
        anyhow::ensure!(
            (1..=1_000_000).contains(&self.queue),
            "decision_log.queue must be 1 to 1000000"
        );
        let s = &self.sample;
        anyhow::ensure!(
            (0.0..=1.0).contains(&s.fraction),
            "decision_log.sample.fraction must be 0 to 1"
        );
        anyhow::ensure!(
            (2..=16_777_216).contains(&s.slots),
            "decision_log.sample.slots must be 2 to 16777216"
        );
        let rotation = files::Rotation {
            file_bytes: self.file_bytes,
            file_age: span("file_age", &self.file_age)?,
            max_bytes: self.max_bytes,
            max_age: span("max_age", &self.max_age)?,
        };
        let sample = sample::SampleConfig {
            fraction_ppm: (s.fraction * 1e6).round() as u32,
            allowed: budget("per_identity", &s.per_identity, Some(s.per_identity_burst))?,
            refused: budget(
                "refusals_per_identity",
                &s.refusals_per_identity,
                Some(s.refusals_burst),
            )?,
            allowed_total: budget("max_allowed", &s.max_allowed, None)?,
            refused_total: budget("max_refusals", &s.max_refusals, None)?,
            slots: s.slots,
        };
        Ok((rotation, sample))
    }

    /// The directory: `dir`, else `$TMPDIR/sluiced-<HTTP port>/decisions` (distinct for
    /// several daemons on one host, the same across one daemon's restarts).
    pub fn dir_for(&self, http_port: u16) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| {
            std::env::temp_dir()
                .join(format!("sluiced-{http_port}"))
                .join("decisions")
        })
    }
}

/// The log's counters, for `/metrics`.
#[derive(Debug, Default)]
struct Stats {
    written: AtomicU64,
    bytes: AtomicU64,
    rotations: AtomicU64,
    deleted: AtomicU64,
    dropped: AtomicU64,
    errors: AtomicU64,
    sampled_out: AtomicU64,
    disk_bytes: AtomicU64,
}

/// The running log: the sampler, the channel to the writer, the files' directory.
pub struct DecisionLog {
    sampler: Mutex<sample::Sampler>,
    tx: SyncSender<record::Record>,
    redact: record::Redact,
    nonce: AtomicU64,
    stats: Arc<Stats>,
    dir: PathBuf,
    counts_in: Option<String>,
}

impl std::fmt::Debug for DecisionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionLog")
            .field("dir", &self.dir)
            .field("stats", &self.stats)
            .finish()
    }
}

impl DecisionLog {
    /// Opens `dir` and starts the writer thread; it ends when the log is dropped. Records
    /// say their counts live in `counts_in` (the store's scope: see [`record::Record`]).
    pub fn start(
        cfg: &DecisionLogConfig,
        dir: &Path,
        counts_in: Option<String>,
    ) -> anyhow::Result<Arc<DecisionLog>> {
        let (rotation, sampling) = cfg.resolve()?;
        let clock = SystemClock::new();
        let files = files::Files::open(dir, rotation, clock.now())
            .with_context(|| format!("opening the decision log in {}", dir.display()))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.queue);
        let stats = Arc::new(Stats::default());
        stats.disk_bytes.store(files.bytes(), Ordering::Relaxed);
        let seed = {
            use std::hash::{BuildHasher as _, Hasher as _};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(clock.now());
            h.finish()
        };
        {
            let stats = stats.clone();
            std::thread::Builder::new()
                .name("decision-log".into())
                .spawn(move || write_loop(files, rx, &stats, clock))
                .context("starting the decision log's writer")?;
        }
        Ok(Arc::new(DecisionLog {
            sampler: Mutex::new(sample::Sampler::new(&sampling, seed)),
            tx,
            redact: record::Redact {
                names: cfg.redact.iter().map(|n| n.to_ascii_lowercase()).collect(),
                key: Default::default(),
            },
            nonce: AtomicU64::new(0),
            stats,
            dir: dir.to_path_buf(),
            counts_in,
        }))
    }

    /// The files' directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Called once per decided check: samples it and, if kept, queues its record. Never
    /// waits on the writer.
    pub fn observe(&self, domain: &str, p: &Plan<'_>, decision: &Decision, c: &record::Check<'_>) {
        let Some(a) = record::sampled_identity(p, decision) else {
            return;
        };
        let nonce = self.nonce.fetch_add(1, Ordering::Relaxed);
        let (verdict, weight) = self
            .sampler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sample(&a.identity, record::refused(decision), nonce, c.now);
        if verdict != sample::Verdict::Keep {
            self.stats.sampled_out.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut r = record::build(domain, p, decision, c, &self.redact);
        r.weight = weight;
        r.counts_in.clone_from(&self.counts_in);
        match self.tx.try_send(r) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The writer thread: append what arrives, flush when the queue is empty (so a reader sees
/// it), rotate and delete on time even when nothing arrives.
fn write_loop(
    mut files: files::Files,
    rx: Receiver<record::Record>,
    stats: &Stats,
    clock: SystemClock,
) {
    let mut line = Vec::with_capacity(1024);
    let mut write = |files: &mut files::Files, r: &record::Record| {
        line.clear();
        let done = serde_json::to_writer(&mut line, r)
            .map_err(std::io::Error::other)
            .and_then(|()| files.append(&line, clock.now()));
        match done {
            Ok(()) => {
                stats.written.fetch_add(1, Ordering::Relaxed);
                stats
                    .bytes
                    .fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
            }
            Err(e) => failed(stats, &e),
        }
    };
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(r) => {
                write(&mut files, &r);
                while let Ok(r) = rx.try_recv() {
                    write(&mut files, &r);
                }
                if let Err(e) = files.flush() {
                    failed(stats, &e);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = files.tick(clock.now()) {
                    failed(stats, &e);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = files.flush();
                return;
            }
        }
        stats.rotations.store(files.rotations, Ordering::Relaxed);
        stats.deleted.store(files.deleted, Ordering::Relaxed);
        stats.disk_bytes.store(files.bytes(), Ordering::Relaxed);
    }
}

fn failed(stats: &Stats, e: &std::io::Error) {
    let n = stats.errors.fetch_add(1, Ordering::Relaxed) + 1;
    // A full disk fails every write: logged the first time and every 1,000th.
    if n % 1_000 == 1 {
        tracing::warn!(error = %e, errors = n, "decision log write failed (sluice_decision_log_errors_total)");
    }
}

impl crate::metrics::Exporter for DecisionLog {
    fn render(&self, out: &mut String) {
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, help, v) in [
            (
                "sluice_decision_log_written_total",
                "Decision log records written.",
                get(&s.written),
            ),
            (
                "sluice_decision_log_bytes_total",
                "Decision log bytes written.",
                get(&s.bytes),
            ),
            (
                "sluice_decision_log_rotations_total",
                "Decision log files closed by size or age.",
                get(&s.rotations),
            ),
            (
                "sluice_decision_log_deleted_files_total",
                "Decision log files deleted by max_bytes or max_age.",
                get(&s.deleted),
            ),
            (
                "sluice_decision_log_dropped_total",
                "Decision log records dropped because the writer's queue was full.",
                get(&s.dropped),
            ),
            (
                "sluice_decision_log_sampled_out_total",
                "Checks the decision log's sampler did not keep (budgets, fraction).",
                get(&s.sampled_out),
            ),
            (
                "sluice_decision_log_errors_total",
                "Decision log writes that failed.",
                get(&s.errors),
            ),
        ] {
            sluice_metrics::counter(out, name, help, v);
        }
        sluice_metrics::gauge(
            out,
            "sluice_decision_log_disk_bytes",
            "Bytes the decision log's files hold.",
            get(&s.disk_bytes),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_resolve_and_bad_values_name_their_field() {
        DecisionLogConfig::default().resolve().expect("defaults");
        let mut c = DecisionLogConfig::default();
        c.sample.per_identity = "fast".into();
        let e = c.resolve().expect_err("a bad rate");
        assert!(format!("{e:#}").contains("per_identity"), "{e:#}");
        let c = DecisionLogConfig {
            max_age: "1mo".into(),
            ..Default::default()
        };
        assert!(c.resolve().is_err(), "a month is not a fixed age");
        assert!(
            DecisionLogConfig::default()
                .dir_for(8080)
                .ends_with("sluiced-8080/decisions")
        );
    }
}
