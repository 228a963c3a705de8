//! `sluice-soak`: a long mixed load through several `sluiced` on one Redis, with per-rule
//! accounting, so a soak (bench/soak.sh, docs/soak.md) can assert what a person would check by
//! hand: no fail-open rule ever failed a check, memory stayed flat, and a quota whose window
//! spans the run counted exactly what the daemons admitted.
//!
//! The load is an open loop at a fixed total rate over sluice.v1 gRPC, spread over the daemons
//! in turn. Each check belongs to one rule (the descriptor `kind` selects it, `user` is the
//! identity); the rules file bench/soak.sh writes has one rule per algorithm and failure mode.
//! Concurrency checks that are admitted hold their slot for a while and are released by
//! request id. Every `--sample-s` seconds it prints one Markdown table row: each daemon's RSS
//! (VmRSS of its pid) and, per failure mode, checks sent, allowed, over limit, `UNAVAILABLE`
//! and failed (transport or gRPC error, deadline, or shed by the generator's in-flight cap).

#[allow(dead_code)]
#[path = "../keys.rs"]
mod keys;

use anyhow::{Context as _, bail};
use clap::Parser;
use sluice_proto::sluice::v1 as pb;
use sluice_proto::sluice::v1::limiter_client::LimiterClient;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// The generator shares two cores with the daemons and Redis: spend little per check.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Mixed-load soak client for sluiced (see bench/soak.sh).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// gRPC address of a daemon (repeat once per daemon).
    #[arg(long = "target", required = true)]
    targets: Vec<String>,
    /// The pid of each daemon, in --target order, for its RSS.
    #[arg(long = "pid")]
    pids: Vec<u32>,
    /// Domain of the soak rules.
    #[arg(long, default_value = "soak")]
    domain: String,
    /// Checks per second, all rules and daemons together.
    #[arg(long, default_value_t = 3000.0)]
    rate: f64,
    /// Seconds of load.
    #[arg(long, default_value_t = 1800.0)]
    duration: f64,
    /// Seconds between samples (one table row each).
    #[arg(long, default_value_t = 60.0)]
    sample_s: f64,
    /// The sample RSS is compared against: the last one must be within --rss-slack-pct of it.
    #[arg(long, default_value_t = 300.0)]
    warmup_s: f64,
    /// How far (percent) the last RSS sample may be above the post-warm-up one.
    #[arg(long, default_value_t = 10.0)]
    rss_slack_pct: f64,
    /// Identities of the many-key rules (Zipf-distributed).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// The quota rule's identity (`user` of kind `quota`).
    #[arg(long, default_value = "tenant-soak")]
    quota_identity: String,
    /// The quota rule's limit (as in the rules file), for the exact-count check.
    #[arg(long)]
    quota_limit: u64,
    /// Redis port: the quota's count is read back with redis-cli at the end.
    #[arg(long)]
    redis_port: u16,
    /// Each daemon's `/metrics` URL, in --target order: its late store calls are read at the
    /// end, which bound how far the quota's count may exceed its admissions.
    #[arg(long = "metrics-url")]
    metrics_urls: Vec<String>,
    /// Most checks in flight; a check due when all are taken is counted as failed (shed).
    #[arg(long, default_value_t = 2048)]
    max_in_flight: usize,
    /// Per-check deadline, milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Write the samples and totals as JSON here.
    #[arg(long)]
    json_out: Option<std::path::PathBuf>,
    /// Seed of the key draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// A rule's `on_store_failure`, which decides what counts as a failed check for it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fail {
    Open,
    Closed,
    Local,
}

impl Fail {
    const ALL: [Fail; 3] = [Fail::Open, Fail::Closed, Fail::Local];
    fn name(self) -> &'static str {
        match self {
            Fail::Open => "open",
            Fail::Closed => "closed",
            Fail::Local => "local",
        }
    }
}

/// One rule of the soak's rules file and the share of the load it gets.
struct Stream {
    /// The rule id, also the `kind` descriptor that selects it.
    id: &'static str,
    algorithm: &'static str,
    fail: Fail,
    /// Percent of all checks.
    weight: u64,
    dist: keys::Dist,
    /// Concurrency: how long an admitted check holds its slot before it is released.
    hold: Option<Duration>,
    counts: Counts,
}

/// What happened to one rule's checks so far.
#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    allowed: AtomicU64,
    over: AtomicU64,
    unavailable: AtomicU64,
    failed: AtomicU64,
    released: AtomicU64,
    /// Releases answered with no slot freed: the daemon's store call failed (the slot then
    /// expires by its timeout) or the slot had already expired.
    not_freed: AtomicU64,
    release_failed: AtomicU64,
}

/// A snapshot of [`Counts`] (or a sum of several).
#[derive(Default, Clone, Copy, Debug)]
struct Snap {
    sent: u64,
    allowed: u64,
    over: u64,
    unavailable: u64,
    failed: u64,
    released: u64,
    not_freed: u64,
    release_failed: u64,
}

impl Counts {
    fn snap(&self) -> Snap {
        Snap {
            sent: self.sent.load(Relaxed),
            allowed: self.allowed.load(Relaxed),
            over: self.over.load(Relaxed),
            unavailable: self.unavailable.load(Relaxed),
            failed: self.failed.load(Relaxed),
            released: self.released.load(Relaxed),
            not_freed: self.not_freed.load(Relaxed),
            release_failed: self.release_failed.load(Relaxed),
        }
    }
}

impl Snap {
    fn add(mut self, o: Snap) -> Snap {
        self.sent += o.sent;
        self.allowed += o.allowed;
        self.over += o.over;
        self.unavailable += o.unavailable;
        self.failed += o.failed;
        self.released += o.released;
        self.not_freed += o.not_freed;
        self.release_failed += o.release_failed;
        self
    }
    fn minus(self, o: Snap) -> Snap {
        Snap {
            sent: self.sent - o.sent,
            allowed: self.allowed - o.allowed,
            over: self.over - o.over,
            unavailable: self.unavailable - o.unavailable,
            failed: self.failed - o.failed,
            released: self.released - o.released,
            not_freed: self.not_freed - o.not_freed,
            release_failed: self.release_failed - o.release_failed,
        }
    }
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "sent": self.sent, "allowed": self.allowed, "over_limit": self.over,
            "unavailable": self.unavailable, "failed": self.failed,
            "released": self.released, "not_freed": self.not_freed,
            "release_failed": self.release_failed,
        })
    }
}

/// The soak's rules, in the order of the rules file bench/soak.sh writes.
fn streams(keys_n: u64) -> anyhow::Result<Vec<Stream>> {
    let zipf = keys::Dist::new("zipf", keys_n, 1.1)?;
    let hot = keys::Dist::new("uniform", 5, 1.0)?;
    let one = keys::Dist::new("hot", 1, 1.0)?;
    let s = |id, algorithm, fail, weight, dist: &keys::Dist, hold| Stream {
        id,
        algorithm,
        fail,
        weight,
        dist: dist.clone(),
        hold,
        counts: Counts::default(),
    };
    Ok(vec![
        s("tb", "token_bucket", Fail::Open, 20, &zipf, None),
        s("gcra", "gcra", Fail::Local, 15, &zipf, None),
        s("fw", "fixed_window", Fail::Closed, 15, &zipf, None),
        s("sw", "sliding_window", Fail::Open, 10, &hot, None),
        s("sl", "sliding_log", Fail::Closed, 10, &hot, None),
        s(
            "conc",
            "concurrency",
            Fail::Open,
            15,
            &keys::Dist::new("zipf", 1000, 1.1)?,
            Some(Duration::from_millis(20)),
        ),
        s(
            "quota",
            "fixed_window",
            Fail::Closed,
            QUOTA_WEIGHT_PCT,
            &one,
            None,
        ),
    ])
}

/// The share of all checks that go to the quota rule, for the rules file's limit.
const QUOTA_WEIGHT_PCT: u64 = 15;

/// Everything the checks share.
struct Shared {
    domain: String,
    streams: Vec<Stream>,
    quota: usize,
    quota_identity: String,
    /// Quota admissions per daemon.
    quota_by_daemon: Vec<AtomicU64>,
    clients: Vec<Vec<LimiterClient<Channel>>>,
    timeout: Duration,
    /// Latency of answered checks in the current sample, microseconds.
    hist: Mutex<hdrhistogram::Histogram<u64>>,
}

async fn one_check(sh: Arc<Shared>, si: usize, daemon: usize, conn: usize, key: u64) {
    let st = &sh.streams[si];
    let user = if si == sh.quota {
        sh.quota_identity.clone()
    } else {
        format!("u{key}")
    };
    let descriptors: HashMap<String, String> = HashMap::from([
        ("kind".to_string(), st.id.to_string()),
        ("user".to_string(), user),
    ]);
    let mut client = sh.clients[daemon][conn].clone();
    let req = pb::CheckRequest {
        domain: sh.domain.clone(),
        descriptors: descriptors.clone(),
        cost: None,
    };
    let t0 = Instant::now();
    let r = tokio::time::timeout(sh.timeout, client.check(req)).await;
    let us = t0.elapsed().as_micros() as u64;
    let c = &st.counts;
    let resp = match r {
        Ok(Ok(resp)) => resp.into_inner(),
        _ => {
            c.failed.fetch_add(1, Relaxed);
            return;
        }
    };
    if let Ok(mut h) = sh.hist.lock() {
        let _ = h.record(us.max(1));
    }
    match pb::Code::try_from(resp.code) {
        Ok(pb::Code::Ok) if resp.allowed => {
            c.allowed.fetch_add(1, Relaxed);
            if si == sh.quota {
                sh.quota_by_daemon[daemon].fetch_add(1, Relaxed);
            }
        }
        Ok(pb::Code::OverLimit) => {
            c.over.fetch_add(1, Relaxed);
        }
        Ok(pb::Code::Unavailable) => {
            c.unavailable.fetch_add(1, Relaxed);
        }
        _ => {
            c.failed.fetch_add(1, Relaxed);
        }
    }
    if let (Some(hold), true) = (st.hold, resp.allowed) {
        tokio::time::sleep(hold).await;
        let rel = pb::ReleaseRequest {
            domain: sh.domain.clone(),
            descriptors,
            request_id: resp.request_id,
        };
        match tokio::time::timeout(sh.timeout, client.release(rel)).await {
            Ok(Ok(r)) if r.get_ref().released >= 1 => c.released.fetch_add(1, Relaxed),
            Ok(Ok(_)) => c.not_freed.fetch_add(1, Relaxed),
            _ => c.release_failed.fetch_add(1, Relaxed),
        };
    }
}

/// VmRSS of a process, kB (0 when it is gone).
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn by_mode(sh: &Shared, f: Fail) -> Snap {
    sh.streams
        .iter()
        .filter(|s| s.fail == f)
        .fold(Snap::default(), |a, s| a.add(s.counts.snap()))
}

/// One sample: when, each daemon's RSS, the interval's counts per mode, its p99.
struct Sample {
    t_s: f64,
    rss_kb: Vec<u64>,
    modes: Vec<Snap>,
    p99_us: u64,
    max_us: u64,
    /// The quota's admissions so far and its count in Redis (None: unreadable, Redis down).
    quota: (u64, Option<u64>),
}

fn row(s: &Sample) -> String {
    let rss: Vec<String> = s
        .rss_kb
        .iter()
        .map(|k| format!("{:.1}", *k as f64 / 1024.0))
        .collect();
    let mut out = format!("| {:>5.1} | {} |", s.t_s / 60.0, rss.join(" | "));
    for m in &s.modes {
        out.push_str(&format!(
            " {} / {} / {} / {} / {} |",
            m.sent, m.allowed, m.over, m.unavailable, m.failed
        ));
    }
    let redis = s.quota.1.map_or_else(|| "-".to_string(), |v| v.to_string());
    out.push_str(&format!(
        " {} / {} | {:.1} | {:.1} |",
        s.quota.0,
        redis,
        s.p99_us as f64 / 1000.0,
        s.max_us as f64 / 1000.0
    ));
    out
}

/// The quota's key in Redis (made by sluice_core::keys), found with redis-cli.
fn quota_key(port: u16, identity: &str) -> anyhow::Result<String> {
    let port = port.to_string();
    // `timeout`: a paused Redis must not hang the sampler.
    let scan = std::process::Command::new("timeout")
        .args([
            "2",
            "redis-cli",
            "-p",
            &port,
            "--scan",
            "--pattern",
            "*:f:quota:*",
        ])
        .output()
        .context("running redis-cli (install redis-tools)")?;
    let keys: Vec<String> = String::from_utf8_lossy(&scan.stdout)
        .lines()
        .filter(|k| k.contains(identity))
        .map(str::to_string)
        .collect();
    let [key] = keys.as_slice() else {
        bail!("expected one quota key in Redis, found {keys:?}");
    };
    Ok(key.clone())
}

/// The quota's count in Redis, read with redis-cli.
fn redis_count(port: u16, identity: &str) -> anyhow::Result<u64> {
    let key = quota_key(port, identity)?;
    let get = std::process::Command::new("timeout")
        .args(["2", "redis-cli", "-p", &port.to_string(), "GET", &key])
        .output()
        .context("running redis-cli")?;
    let v = String::from_utf8_lossy(&get.stdout).trim().to_string();
    v.parse()
        .with_context(|| format!("quota key {key} holds {v:?}"))
}

/// Whether a daemon's RSS samples `(seconds, kB)` are flat after `warmup_s`: the peak of the
/// second half of the samples after warm-up is at most `slack_pct` above the peak of the
/// first half. A leak raises the peak steadily (by its rate times half the run); the
/// allocator keeping or returning the memory of a burst moves single samples up and down
/// (a run measured 21.3 MiB at minute 5, 24.5 at 12, 22.3 at 19, 24.1 at 30), which the
/// last-against-first comparison took for growth.
fn rss_flat(samples: &[(f64, u64)], warmup_s: f64, slack_pct: f64) -> (bool, String) {
    let after: Vec<&(f64, u64)> = samples.iter().filter(|s| s.0 + 1.0 >= warmup_s).collect();
    if after.len() < 2 {
        return (
            false,
            format!("{} samples after warm-up, need 2", after.len()),
        );
    }
    let (first, second) = after.split_at(after.len() / 2);
    let peak = |h: &[&(f64, u64)]| h.iter().map(|s| s.1).max().unwrap_or(0);
    let (p1, p2) = (peak(first), peak(second));
    let mib = |kb: u64| kb as f64 / 1024.0;
    let pass = p1 > 0 && p2 as f64 <= p1 as f64 * (1.0 + slack_pct / 100.0);
    let (t0, t1, t2) = (first[0].0, second[0].0, second[second.len() - 1].0);
    (
        pass,
        format!(
            "peak {:.1} MiB over minutes {:.1}-{:.1}, peak {:.1} MiB over minutes {:.1}-{:.1} \
             (at most +{slack_pct}%); {:.1} MiB at minute {:.1}, {:.1} MiB at the end",
            mib(p1),
            t0 / 60.0,
            first[first.len() - 1].0 / 60.0,
            mib(p2),
            t1 / 60.0,
            t2 / 60.0,
            mib(first[0].1),
            t0 / 60.0,
            mib(second[second.len() - 1].1),
        ),
    )
}

/// One daemon's late store calls (`sluice_store_late_calls_total`, `..._skewed_calls_total`).
#[derive(Default, Clone, Copy, Debug)]
struct Late {
    ran: u64,
    stale: u64,
    lost: u64,
    skewed: u64,
}

impl Late {
    fn add(mut self, o: Late) -> Late {
        self.ran += o.ran;
        self.stale += o.stale;
        self.lost += o.lost;
        self.skewed += o.skewed;
        self
    }
    fn json(&self) -> serde_json::Value {
        serde_json::json!({ "ran": self.ran, "stale": self.stale, "lost": self.lost, "skewed": self.skewed })
    }
    /// From a Prometheus text page.
    fn parse(text: &str) -> Late {
        let mut l = Late::default();
        for line in text.lines() {
            let Some((name, v)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = v.parse::<u64>() else { continue };
            match name {
                "sluice_store_late_calls_total{result=\"ran\"}" => l.ran = v,
                "sluice_store_late_calls_total{result=\"stale\"}" => l.stale = v,
                "sluice_store_late_calls_total{result=\"lost\"}" => l.lost = v,
                "sluice_store_skewed_calls_total" => l.skewed = v,
                _ => {}
            }
        }
        l
    }
}

/// A daemon's late calls, read from its `/metrics` with curl (as redis-cli reads Redis); all
/// zero, and a warning, when it cannot be read.
fn late_calls(url: &str) -> Late {
    match std::process::Command::new("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
    {
        Ok(o) if o.status.success() => Late::parse(&String::from_utf8_lossy(&o.stdout)),
        other => {
            eprintln!("could not read {url} (install curl): {other:?}");
            Late::default()
        }
    }
}

async fn run(a: Args) -> anyhow::Result<bool> {
    if !(a.rate.is_finite() && a.rate > 0.0) {
        bail!("--rate must be positive");
    }
    let mut clients = Vec::new();
    for t in &a.targets {
        let mut conns = Vec::new();
        for _ in 0..2 {
            let ch = Endpoint::from_shared(format!("http://{t}"))?
                .tcp_nodelay(true)
                .connect()
                .await
                .with_context(|| format!("connecting to {t}"))?;
            conns.push(LimiterClient::new(ch));
        }
        clients.push(conns);
    }
    let streams = streams(a.keys)?;
    let quota = streams
        .iter()
        .position(|s| s.id == "quota")
        .context("no quota rule")?;
    let total_weight: u64 = streams.iter().map(|s| s.weight).sum();
    let sh = Arc::new(Shared {
        domain: a.domain.clone(),
        streams,
        quota,
        quota_identity: a.quota_identity.clone(),
        quota_by_daemon: a.targets.iter().map(|_| AtomicU64::new(0)).collect(),
        clients,
        timeout: Duration::from_millis(a.timeout_ms.max(1)),
        hist: Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2)?),
    });
    let n_daemons = a.targets.len();
    let duration = Duration::from_secs_f64(a.duration);
    let sem = Arc::new(tokio::sync::Semaphore::new(a.max_in_flight));

    // Header of the table the samples fill.
    let mut head = String::from("| min |");
    for i in 0..n_daemons {
        head.push_str(&format!(" RSS {} MiB |", i + 1));
    }
    for f in Fail::ALL {
        head.push_str(&format!(
            " {} sent / ok / over / unavail / failed |",
            f.name()
        ));
    }
    head.push_str(" quota ok / Redis | p99 ms | max ms |");
    println!("{head}");
    println!(
        "|{}",
        " ---: |".repeat(3 + n_daemons + Fail::ALL.len()) + " ---: |"
    );

    let start = Instant::now();
    let sampler = {
        let sh = sh.clone();
        let pids = a.pids.clone();
        let (port, ident) = (a.redis_port, a.quota_identity.clone());
        let every = Duration::from_secs_f64(a.sample_s.max(1.0));
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut last: Vec<Snap> = Fail::ALL.iter().map(|_| Snap::default()).collect();
            let take = |last: &mut Vec<Snap>, redis: Option<u64>| {
                let now: Vec<Snap> = Fail::ALL.iter().map(|f| by_mode(&sh, *f)).collect();
                let modes = now
                    .iter()
                    .zip(last.iter())
                    .map(|(n, l)| n.minus(*l))
                    .collect();
                *last = now;
                let (p99_us, max_us) = match sh.hist.lock() {
                    Ok(mut h) => {
                        let r = (h.value_at_quantile(0.99), h.max());
                        h.reset();
                        r
                    }
                    Err(_) => (0, 0),
                };
                Sample {
                    t_s: start.elapsed().as_secs_f64(),
                    rss_kb: pids.iter().map(|p| rss_kb(*p)).collect(),
                    modes,
                    p99_us,
                    max_us,
                    quota: (sh.streams[sh.quota].counts.allowed.load(Relaxed), redis),
                }
            };
            let mut next = start + every;
            loop {
                let end = start + duration;
                if next > end + Duration::from_millis(500) {
                    break;
                }
                tokio::time::sleep_until(next.min(end).into()).await;
                let admitted = sh.streams[sh.quota].counts.allowed.load(Relaxed);
                let ident = ident.clone();
                let redis = tokio::task::spawn_blocking(move || redis_count(port, &ident).ok())
                    .await
                    .ok()
                    .flatten();
                let mut s = take(&mut last, redis);
                s.quota.0 = admitted;
                println!("{}", row(&s));
                samples.push(s);
                if next >= end {
                    break;
                }
                next += every;
            }
            samples
        })
    };

    // The open loop: check i is due at start + i / rate, whatever happened before.
    let mut rng = keys::Rng::stream(a.seed, 0);
    let mut i: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let el = start.elapsed();
        if el >= duration {
            break;
        }
        let due = (el.as_secs_f64() * a.rate) as u64;
        while i < due {
            let mut w = rng.range(0, total_weight.saturating_sub(1));
            let si = sh
                .streams
                .iter()
                .position(|s| {
                    if w < s.weight {
                        true
                    } else {
                        w -= s.weight;
                        false
                    }
                })
                .unwrap_or(0);
            let key = sh.streams[si].dist.sample(&mut rng);
            let daemon = (i as usize) % n_daemons;
            let conn = (i as usize / n_daemons) % 2;
            sh.streams[si].counts.sent.fetch_add(1, Relaxed);
            match sem.clone().try_acquire_owned() {
                Ok(permit) => {
                    let sh = sh.clone();
                    tokio::spawn(async move {
                        one_check(sh, si, daemon, conn, key).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    sh.streams[si].counts.failed.fetch_add(1, Relaxed);
                }
            }
            i += 1;
        }
    }
    // Let the checks in flight finish (each has its deadline).
    let _ = tokio::time::timeout(
        sh.timeout * 3,
        sem.acquire_many(u32::try_from(a.max_in_flight).unwrap_or(u32::MAX)),
    )
    .await;
    let samples = sampler.await?;

    // Totals per rule.
    println!();
    println!(
        "| rule | algorithm | on_store_failure | sent | allowed | over limit | unavailable | failed | released |"
    );
    println!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut rules_json = Vec::new();
    for s in &sh.streams {
        let c = s.counts.snap();
        let rel = if s.hold.is_some() {
            format!(
                "{} freed, {} not freed, {} failed",
                c.released, c.not_freed, c.release_failed
            )
        } else {
            "-".to_string()
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.id,
            s.algorithm,
            s.fail.name(),
            c.sent,
            c.allowed,
            c.over,
            c.unavailable,
            c.failed,
            rel
        );
        let mut j = c.json();
        j["rule"] = s.id.into();
        j["algorithm"] = s.algorithm.into();
        j["on_store_failure"] = s.fail.name().into();
        rules_json.push(j);
    }

    // Assertions.
    let mut ok = true;
    let mut checks = Vec::new();
    let mut check = |pass: bool, what: String| {
        println!("- {} {what}", if pass { "PASS" } else { "FAIL" });
        checks.push(serde_json::json!({ "pass": pass, "what": what }));
        ok &= pass;
    };
    println!();
    for f in [Fail::Open, Fail::Local] {
        let m = by_mode(&sh, f);
        check(
            m.unavailable + m.failed == 0 && m.sent == m.allowed + m.over,
            format!(
                "on_store_failure {}: {} checks, {} failed, {} UNAVAILABLE (must be 0 and 0)",
                f.name(),
                m.sent,
                m.failed,
                m.unavailable
            ),
        );
    }
    let conc = sh
        .streams
        .iter()
        .find(|s| s.hold.is_some())
        .map(|s| s.counts.snap())
        .unwrap_or_default();
    check(
        conc.release_failed == 0 && conc.released + conc.not_freed == conc.allowed,
        format!(
            "concurrency: {} admitted, every release answered: {} freed, {} not freed (the \
             store call failed; the slot expires by its timeout), {} unanswered",
            conc.allowed, conc.released, conc.not_freed, conc.release_failed
        ),
    );
    let q = sh.streams[quota].counts.snap();
    let by_daemon: Vec<u64> = sh.quota_by_daemon.iter().map(|a| a.load(Relaxed)).collect();
    let redis = redis_count(a.redis_port, &a.quota_identity);
    let redis_s = match &redis {
        Ok(v) => v.to_string(),
        Err(e) => format!("unreadable ({e:#})"),
    };
    let exceeded = q.allowed + q.over + q.unavailable + q.failed > a.quota_limit;
    check(
        exceeded && q.over > 0,
        format!(
            "quota: the load exceeded the limit ({} checks sent, limit {}, {} over limit)",
            q.sent, a.quota_limit, q.over
        ),
    );
    // The daemons' late store calls: what ran after its caller gave up, or whose reply was
    // lost, is all the count may hold beyond the admissions.
    let late: Vec<Late> = a.metrics_urls.iter().map(|u| late_calls(u)).collect();
    let late_sum = late.iter().fold(Late::default(), |t, l| t.add(*l));
    let counted = redis.as_ref().ok().copied();
    let gap = counted.map(|c| c as i64 - q.allowed as i64);
    check(
        counted == Some(a.quota_limit),
        format!(
            "quota reached its limit: Redis's count {redis_s} == limit {}",
            a.quota_limit
        ),
    );
    check(
        a.metrics_urls.len() == a.targets.len()
            && gap.is_some_and(|g| g >= 0 && g as u64 <= late_sum.ran + late_sum.lost),
        format!(
            "quota count accounted for: Redis {redis_s} - admitted {} ({}) = {} <= late calls \
             that ran ({}) or were lost ({}), over both daemons (stale-refused: {}, skewed: {})",
            q.allowed,
            by_daemon
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" + "),
            gap.map_or_else(|| "?".to_string(), |g| g.to_string()),
            late_sum.ran,
            late_sum.lost,
            late_sum.stale,
            late_sum.skewed,
        ),
    );
    // RSS: a leak grows the envelope, the allocator's peaks come and go.
    for d in 0..n_daemons {
        let series: Vec<(f64, u64)> = samples.iter().map(|s| (s.t_s, s.rss_kb[d])).collect();
        let (pass, what) = rss_flat(&series, a.warmup_s, a.rss_slack_pct);
        check(pass, format!("daemon {} RSS flat: {what}", d + 1));
    }
    println!("\n{}", if ok { "soak PASSED" } else { "soak FAILED" });

    if let Some(path) = &a.json_out {
        let samples_json: Vec<_> = samples
            .iter()
            .map(|s| {
                let mut modes = serde_json::Map::new();
                for (f, m) in Fail::ALL.iter().zip(&s.modes) {
                    modes.insert(f.name().to_string(), m.json());
                }
                serde_json::json!({
                    "t_s": s.t_s, "rss_kb": s.rss_kb, "modes": modes,
                    "p99_us": s.p99_us, "max_us": s.max_us,
                    "quota_admitted": s.quota.0, "quota_redis": s.quota.1,
                })
            })
            .collect();
        let j = serde_json::json!({
            "rate": a.rate, "duration_s": a.duration, "daemons": a.targets,
            "samples": samples_json, "rules": rules_json,
            "quota": { "limit": a.quota_limit, "admitted": q.allowed, "by_daemon": by_daemon, "redis": redis.ok() },
            "late_calls": late.iter().map(|l| l.json()).collect::<Vec<_>>(),
            "checks": checks, "passed": ok,
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ok)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.quota_limit == 0 {
        bail!("--quota-limit must be positive");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let ok = rt.block_on(run(args))?;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_flat_when_peaks_come_and_go_and_not_when_it_grows() {
        let mb = |m: f64| (m * 1024.0) as u64;
        let run = |v: &[f64]| -> Vec<(f64, u64)> {
            v.iter()
                .enumerate()
                .map(|(i, m)| ((i as f64 + 1.0) * 60.0, mb(*m)))
                .collect()
        };
        // The measured run: a step up, down, up again.
        let wavy = run(&[
            20.1, 20.0, 20.6, 21.0, 21.3, 21.0, 21.0, 21.0, 20.5, 20.5, 20.5, 24.5, 24.3, 24.2,
            24.1, 24.0, 24.0, 24.1, 22.6, 22.4, 22.3, 22.3, 22.3, 22.3, 22.3, 24.1, 24.1, 24.1,
            24.1, 24.1,
        ]);
        assert!(rss_flat(&wavy, 300.0, 10.0).0);
        // A leak of 0.3 MiB a minute: +3.9 MiB between the halves' peaks (16%).
        let leak: Vec<f64> = (0..30).map(|i| 20.0 + 0.3 * f64::from(i)).collect();
        let (pass, what) = rss_flat(&run(&leak), 300.0, 10.0);
        assert!(!pass, "{what}");
        assert!(!rss_flat(&run(&[20.0]), 300.0, 10.0).0, "too few samples");
    }

    #[test]
    fn late_calls_are_read_from_the_metrics_page() {
        let page = "# HELP x\nsluice_store_late_calls_total{result=\"ran\"} 3\n\
                    sluice_store_late_calls_total{result=\"stale\"} 250\n\
                    sluice_store_late_calls_total{result=\"lost\"} 7\n\
                    sluice_store_skewed_calls_total 1\nsluice_other 9\n";
        let l = Late::parse(page);
        assert_eq!((l.ran, l.stale, l.lost, l.skewed), (3, 250, 7, 1));
    }

    #[test]
    fn weights_add_up_and_every_algorithm_and_mode_is_covered() {
        let s = streams(10).expect("streams");
        assert_eq!(s.iter().map(|s| s.weight).sum::<u64>(), 100);
        let q = s.iter().find(|s| s.id == "quota").expect("quota");
        assert_eq!(q.weight, QUOTA_WEIGHT_PCT);
        for alg in [
            "token_bucket",
            "gcra",
            "fixed_window",
            "sliding_window",
            "sliding_log",
            "concurrency",
        ] {
            assert!(s.iter().any(|s| s.algorithm == alg), "{alg}");
        }
        for f in Fail::ALL {
            assert!(s.iter().any(|s| s.fail == f), "{f:?}");
        }
    }
}
