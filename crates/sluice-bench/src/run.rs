//! The load loops.
//!
//! - Closed loop: `concurrency` workers, each sending its next request when the last one
//!   answered. Finds the saturation throughput; its latencies hide queueing by design. On
//!   several threads ([`run_closed_threads`]) each thread runs its own single-threaded
//!   runtime with its share of the workers and connections, as h2load's `-t` does: on a
//!   work-stealing runtime the generator spent about 1.8 times the CPU per request (wakeups
//!   across threads, shared counters), CPU the server it measures shares.
//! - Open loop: requests are due at a fixed rate, `start + i / rate`, whether or not earlier
//!   ones have answered. A dedicated thread keeps that schedule (tokio's millisecond timer
//!   would send late) and starts each request as its own task; at most `concurrency` are in
//!   flight, and each latency is measured from the request's *intended* send time, so time
//!   spent waiting for a slot or behind a stalled server shows up in the percentiles instead
//!   of silently slowing the load (coordinated omission corrected, as in wrk2).
//!
//! Both stop at a deadline and, if given, after a number of requests; requests started in
//! the warm-up are answered but not measured.

use crate::keys::{Dist, Rng};
use crate::target::{Client, Shape, Verdict, channels};
use hdrhistogram::Histogram;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest latency recorded; slower answers are clamped to it.
const MAX_LATENCY_NS: u64 = 60_000_000_000;
/// Samples a worker keeps before merging them into the shared histograms.
const BATCH: usize = 256;

/// Open or closed loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// `concurrency` workers back to back.
    Closed,
    /// `rate` requests per second, `concurrency` workers at most in flight.
    Open {
        /// Requests per second.
        rate: f64,
    },
}

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What the requests look like.
    pub shape: Shape,
    /// Open or closed.
    pub mode: Mode,
    /// Workers (closed) or most requests in flight (open).
    pub concurrency: usize,
    /// HTTP/2 connections for the gRPC APIs.
    pub connections: usize,
    /// Key distribution.
    pub dist: Dist,
    /// Measured duration.
    pub duration: Duration,
    /// Unmeasured lead-in.
    pub warmup: Duration,
    /// Stop after this many requests (warm-up included).
    pub max_requests: Option<u64>,
    /// Per-request deadline; a request past it is an error.
    pub timeout: Duration,
    /// Seeds the key draws.
    pub seed: u64,
    /// Print a progress line every second on stderr.
    pub progress: bool,
}

/// Counts of one run.
#[derive(Debug, Default)]
struct Counters {
    allowed: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
}

/// A worker's counts not yet added to the shared ones: added with its latency batch, so
/// requests do not contend on shared counters.
#[derive(Debug, Default)]
struct Tally {
    /// `[allowed, denied, errors]`, all and measured.
    all: [u64; 3],
    measured: [u64; 3],
}

impl Tally {
    fn add(&mut self, r: &Result<Verdict, ()>, measured: bool) {
        let i = match r {
            Ok(Verdict::Allowed) => 0,
            Ok(Verdict::Denied) => 1,
            Err(()) => 2,
        };
        self.all[i] += 1;
        if measured {
            self.measured[i] += 1;
        }
    }
}

impl Counters {
    fn add_all(&self, n: &mut [u64; 3]) {
        for (c, n) in [&self.allowed, &self.denied, &self.errors]
            .into_iter()
            .zip(n)
        {
            if *n > 0 {
                c.fetch_add(std::mem::take(n), Ordering::Relaxed);
            }
        }
    }

    fn total(&self) -> u64 {
        self.allowed.load(Ordering::Relaxed)
            + self.denied.load(Ordering::Relaxed)
            + self.errors.load(Ordering::Relaxed)
    }
}

struct Histograms {
    measured: Histogram<u64>,
    interval: Histogram<u64>,
}

struct Shared {
    stop: AtomicBool,
    issued: AtomicU64,
    started: AtomicU64,
    measure_from: Instant,
    all: Counters,
    measured: Counters,
    hist: Mutex<Histograms>,
    first_error: Mutex<Option<String>>,
}

/// What a worker keeps between merges into [`Shared`].
struct Batch {
    latencies: Vec<(u64, bool)>,
    tally: Tally,
}

impl Batch {
    fn new(capacity: usize) -> Batch {
        Batch {
            latencies: Vec::with_capacity(capacity),
            tally: Tally::default(),
        }
    }
}

impl Shared {
    fn new(plan: &Plan, start: Instant) -> anyhow::Result<Arc<Shared>> {
        Ok(Arc::new(Shared {
            stop: AtomicBool::new(false),
            issued: AtomicU64::new(0),
            started: AtomicU64::new(0),
            measure_from: start + plan.warmup,
            all: Counters::default(),
            measured: Counters::default(),
            hist: Mutex::new(Histograms {
                measured: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)?,
                interval: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)?,
            }),
            first_error: Mutex::new(None),
        }))
    }

    fn merge(&self, batch: &mut Batch) {
        self.all.add_all(&mut batch.tally.all);
        self.measured.add_all(&mut batch.tally.measured);
        let batch = &mut batch.latencies;
        if batch.is_empty() {
            return;
        }
        if let Ok(mut h) = self.hist.lock() {
            for &(ns, measured) in batch.iter() {
                let ns = ns.clamp(1, MAX_LATENCY_NS);
                let _ = h.interval.record(ns);
                if measured {
                    let _ = h.measured.record(ns);
                }
            }
        }
        batch.clear();
    }
}

/// CPU seconds (user + system, all threads) this process has used, from /proc (Linux);
/// `None` elsewhere. Tells whether a run was limited by the load generator itself.
pub fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux platform Rust targets.
    Some(ticks as f64 / 100.0)
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Measured seconds.
    pub seconds: f64,
    /// Answered allowed.
    pub allowed: u64,
    /// Answered refused.
    pub denied: u64,
    /// Failed (transport, status, timeout).
    pub errors: u64,
    /// Open loop: requests due but never started before the deadline (the server fell
    /// behind the offered rate).
    pub unsent: u64,
    /// Latency of answered requests, ns.
    pub latency: Histogram<u64>,
    /// The first error seen, to explain a non-zero count.
    pub first_error: Option<String>,
    /// CPU seconds the load generator used over the whole run (warm-up included) and the
    /// run's wall-clock seconds: a share near the threads available means the client was the
    /// bottleneck, not the server.
    pub client_cpu: Option<(f64, f64)>,
}

/// Key `k` as the workers send it: the prefix, then the number.
pub(crate) fn key_string(out: &mut String, prefix: &str, k: u64) {
    out.clear();
    out.push_str(prefix);
    let _ = write!(out, "{k}");
}

async fn one(
    client: &mut Client,
    shape: &Shape,
    key: &str,
    timeout: Duration,
    shared: &Shared,
) -> Result<Verdict, ()> {
    match tokio::time::timeout(timeout, client.call(shape, key)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            note_error(shared, format!("{e:#}"));
            Err(())
        }
        Err(_) => {
            note_error(shared, format!("timed out after {timeout:?}"));
            Err(())
        }
    }
}

fn note_error(shared: &Shared, e: String) {
    if let Ok(mut f) = shared.first_error.lock()
        && f.is_none()
    {
        *f = Some(e);
    }
}

fn record(
    shared: &Shared,
    batch: &mut Batch,
    r: Result<Verdict, ()>,
    from: Instant,
    measured: bool,
) {
    batch.tally.add(&r, measured);
    if r.is_ok() {
        batch
            .latencies
            .push((from.elapsed().as_nanos() as u64, measured));
    }
    if batch.latencies.len() >= BATCH || batch.tally.all[2] >= BATCH as u64 {
        shared.merge(batch);
    }
}

/// What the open loop's request tasks share.
struct Open {
    /// Requests in flight at most (`--concurrency`); waiting for a slot counts as latency.
    sem: Arc<tokio::sync::Semaphore>,
    /// Idle clients (HTTP keep-alive connections; cheap handles over `chans` for gRPC).
    pool: Mutex<Vec<Client>>,
    chans: Vec<crate::target::Link>,
    in_flight: AtomicU64,
}

/// One open-loop request, due at `due`: waits for a slot, sends, records from `due`.
async fn open_request(
    open: Arc<Open>,
    shared: Arc<Shared>,
    shape: Arc<Shape>,
    dist: Dist,
    (seed, i, due, timeout): (u64, u64, Instant, Duration),
) {
    let permit = open.sem.clone().acquire_owned().await;
    if permit.is_ok() && !shared.stop.load(Ordering::Relaxed) {
        shared.started.fetch_add(1, Ordering::Relaxed);
        let pooled = open.pool.lock().ok().and_then(|mut p| p.pop());
        let client = match pooled {
            Some(c) => Ok(c),
            None => Client::new(
                &shape,
                open.chans
                    .get(i as usize % open.chans.len().max(1))
                    .cloned(),
            ),
        };
        match client {
            Ok(mut client) => {
                // The i-th key is the same whichever task sends it.
                let mut key = String::new();
                key_string(
                    &mut key,
                    &shape.key_prefix,
                    dist.sample(&mut Rng::stream(seed, i)),
                );
                let r = one(&mut client, &shape, &key, timeout, &shared).await;
                if let Ok(mut p) = open.pool.lock() {
                    p.push(client);
                }
                let mut batch = Batch::new(1);
                record(&shared, &mut batch, r, due, due >= shared.measure_from);
                shared.merge(&mut batch);
            }
            Err(e) => {
                note_error(&shared, format!("{e:#}"));
                let mut batch = Batch::new(0);
                record(
                    &shared,
                    &mut batch,
                    Err(()),
                    due,
                    due >= shared.measure_from,
                );
                shared.merge(&mut batch);
            }
        }
    }
    drop(permit);
    open.in_flight.fetch_sub(1, Ordering::Relaxed);
}

/// Runs the plan to its end.
pub async fn run(plan: Plan) -> anyhow::Result<Outcome> {
    anyhow::ensure!(plan.concurrency > 0, "--concurrency must be at least 1");
    let chans = match plan.shape.api {
        crate::target::Api::Http | crate::target::Api::Get => Vec::new(),
        api => {
            channels(
                api,
                plan.shape.addr,
                plan.connections.clamp(1, plan.concurrency),
            )
            .await?
        }
    };
    let cpu_before = own_cpu_seconds();
    let start = Instant::now();
    let shared = Shared::new(&plan, start)?;
    let end = start + plan.warmup + plan.duration;
    let shape = Arc::new(plan.shape.clone());

    let progress = plan.progress.then(|| {
        let shared = shared.clone();
        tokio::spawn(progress_lines(shared, start))
    });

    let unsent;
    match plan.mode {
        Mode::Closed => {
            closed_shard(&plan, &shape, &chans, &shared, end, (0, 1)).await?;
            unsent = 0;
        }
        Mode::Open { rate } => {
            anyhow::ensure!(
                rate.is_finite() && rate > 0.0,
                "--rate must be a positive number"
            );
            let window = plan.warmup + plan.duration;
            let mut total = (window.as_secs_f64() * rate).floor() as u64;
            if let Some(max) = plan.max_requests {
                total = total.min(max);
            }
            let open = Arc::new(Open {
                sem: Arc::new(tokio::sync::Semaphore::new(plan.concurrency)),
                pool: Mutex::new(Vec::new()),
                chans: chans.clone(),
                in_flight: AtomicU64::new(0),
            });
            // A dedicated thread keeps the schedule: tokio's timer has millisecond
            // granularity, which at these rates would send requests up to 1 ms late and
            // charge that to the server.
            let dispatch = {
                let (open, shared, shape, dist) = (
                    open.clone(),
                    shared.clone(),
                    shape.clone(),
                    plan.dist.clone(),
                );
                let (seed, timeout) = (plan.seed, plan.timeout);
                let handle = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || {
                    let interval = 1e9 / rate;
                    let mut i = 0u64;
                    while i < total {
                        let due = start + Duration::from_nanos((i as f64 * interval) as u64);
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                        if Instant::now() >= end {
                            break;
                        }
                        // Everything already due goes out now, each with its own send time.
                        let now = Instant::now();
                        while i < total
                            && start + Duration::from_nanos((i as f64 * interval) as u64) <= now
                        {
                            let due = start + Duration::from_nanos((i as f64 * interval) as u64);
                            open.in_flight.fetch_add(1, Ordering::Relaxed);
                            handle.spawn(open_request(
                                open.clone(),
                                shared.clone(),
                                shape.clone(),
                                dist.clone(),
                                (seed, i, due, timeout),
                            ));
                            i += 1;
                        }
                    }
                    i
                })
            };
            let scheduled = dispatch.await?;
            if scheduled < total || Instant::now() >= end {
                // Requests still waiting for a slot at the deadline are not sent: the server
                // fell behind the offered rate.
                tokio::time::sleep_until(end.into()).await;
                shared.stop.store(true, Ordering::Relaxed);
            }
            // Otherwise --requests ended the run early: the requests in flight finish.
            let drain_until = Instant::now() + plan.timeout + Duration::from_secs(1);
            while open.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < drain_until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            unsent = scheduled.saturating_sub(shared.started.load(Ordering::Relaxed));
        }
    }
    if let Some(p) = progress {
        p.abort();
    }
    outcome(&plan, &shared, start, cpu_before, unsent)
}

/// The closed loop on `threads` threads, each a single-threaded runtime with its share of
/// the workers and connections (at least one each), the counts and latencies shared.
pub fn run_closed_threads(plan: &Plan, threads: usize) -> anyhow::Result<Outcome> {
    anyhow::ensure!(plan.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(
        matches!(plan.mode, Mode::Closed),
        "only the closed loop runs on threads of its own"
    );
    let threads = threads.clamp(1, plan.concurrency);
    let cpu_before = own_cpu_seconds();
    let start = Instant::now();
    let shared = Shared::new(plan, start)?;
    let end = start + plan.warmup + plan.duration;
    let shape = Arc::new(plan.shape.clone());
    let ran: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (shared, shape) = (&shared, &shape);
                s.spawn(move || -> anyhow::Result<()> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    rt.block_on(async {
                        let progress = (plan.progress && i == 0)
                            .then(|| tokio::spawn(progress_lines(shared.clone(), start)));
                        // This thread's connections: its share of them, at least one.
                        let n = (plan.connections / threads
                            + usize::from(i < plan.connections % threads))
                        .max(1);
                        let chans = match plan.shape.api {
                            crate::target::Api::Http | crate::target::Api::Get => Vec::new(),
                            api => channels(api, plan.shape.addr, n).await?,
                        };
                        let r = closed_shard(plan, shape, &chans, shared, end, (i, threads)).await;
                        if let Some(p) = progress {
                            p.abort();
                        }
                        r
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a load thread panicked")))
            })
            .collect()
    });
    for r in ran {
        r?;
    }
    outcome(plan, &shared, start, cpu_before, 0)
}

/// Runs the closed loop's workers `w` with `w % shard.1 == shard.0` on this runtime, over
/// `chans`, until the deadline (or the request budget), and waits for them.
async fn closed_shard(
    plan: &Plan,
    shape: &Arc<Shape>,
    chans: &[crate::target::Link],
    shared: &Arc<Shared>,
    end: Instant,
    (shard, shards): (usize, usize),
) -> anyhow::Result<()> {
    let mut workers = Vec::with_capacity(plan.concurrency / shards + 1);
    for (j, w) in (shard..plan.concurrency).step_by(shards).enumerate() {
        let mut client = Client::new(shape, chans.get(j % chans.len().max(1)).cloned())?;
        let (shared, shape, dist) = (shared.clone(), shape.clone(), plan.dist.clone());
        let (seed, timeout, max) = (plan.seed, plan.timeout, plan.max_requests);
        workers.push(tokio::spawn(async move {
            // Seeded by the worker's number, whichever thread it runs on.
            let mut rng = Rng::stream(seed, w as u64);
            let mut key = String::new();
            let mut batch = Batch::new(BATCH);
            while !shared.stop.load(Ordering::Relaxed) && Instant::now() < end {
                if let Some(max) = max
                    && shared.issued.fetch_add(1, Ordering::Relaxed) >= max
                {
                    break;
                }
                key_string(&mut key, &shape.key_prefix, dist.sample(&mut rng));
                let t0 = Instant::now();
                let r = one(&mut client, &shape, &key, timeout, &shared).await;
                record(&shared, &mut batch, r, t0, t0 >= shared.measure_from);
            }
            shared.merge(&mut batch);
        }));
    }
    let shared2 = shared.clone();
    let stopper = tokio::spawn(async move {
        tokio::time::sleep_until(end.into()).await;
        shared2.stop.store(true, Ordering::Relaxed);
    });
    for w in workers {
        w.await?;
    }
    stopper.abort();
    Ok(())
}

/// What a run measured, read off its shared state at the end.
fn outcome(
    plan: &Plan,
    shared: &Shared,
    start: Instant,
    cpu_before: Option<f64>,
    unsent: u64,
) -> anyhow::Result<Outcome> {
    let seconds = match plan.mode {
        Mode::Open { rate } => {
            let due = plan.max_requests.map_or(f64::INFINITY, |m| m as f64 / rate);
            (due - plan.warmup.as_secs_f64()).clamp(0.0, plan.duration.as_secs_f64())
        }
        Mode::Closed => {
            let end = start + plan.warmup + plan.duration;
            let stopped = Instant::now().min(end);
            stopped
                .saturating_duration_since(shared.measure_from)
                .as_secs_f64()
        }
    };
    let latency = shared
        .hist
        .lock()
        .map(|h| h.measured.clone())
        .map_err(|_| anyhow::anyhow!("histogram lock poisoned"))?;
    let first_error = shared.first_error.lock().ok().and_then(|f| f.clone());
    let client_cpu = match (cpu_before, own_cpu_seconds()) {
        (Some(a), Some(b)) => Some((b - a, start.elapsed().as_secs_f64())),
        _ => None,
    };
    Ok(Outcome {
        seconds,
        allowed: shared.measured.allowed.load(Ordering::Relaxed),
        denied: shared.measured.denied.load(Ordering::Relaxed),
        errors: shared.measured.errors.load(Ordering::Relaxed),
        unsent,
        latency,
        first_error,
        client_cpu,
    })
}

async fn progress_lines(shared: Arc<Shared>, start: Instant) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let mut last = 0u64;
    loop {
        tick.tick().await;
        let total = shared.all.total();
        let (p50, p99) = match shared.hist.lock() {
            Ok(mut h) => {
                let r = (
                    h.interval.value_at_quantile(0.5),
                    h.interval.value_at_quantile(0.99),
                );
                h.interval.reset();
                r
            }
            Err(_) => (0, 0),
        };
        eprintln!(
            "[{:>4.0}s] {:>8} req/s  total {:>9}  allowed {:>9}  denied {:>9}  errors {:>6}  p50 {:>8.1}us  p99 {:>8.1}us",
            start.elapsed().as_secs_f64(),
            total - last,
            total,
            shared.all.allowed.load(Ordering::Relaxed),
            shared.all.denied.load(Ordering::Relaxed),
            shared.all.errors.load(Ordering::Relaxed),
            p50 as f64 / 1e3,
            p99 as f64 / 1e3,
        );
        last = total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_is_read_and_only_grows() {
        let a = own_cpu_seconds().expect("Linux /proc");
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = own_cpu_seconds().expect("Linux /proc");
        assert!(b >= a, "{a} then {b}");
    }

    #[test]
    fn keys_are_the_prefix_and_the_number() {
        let mut s = String::from("old");
        key_string(&mut s, "u", 42);
        assert_eq!(s, "u42");
    }
}
