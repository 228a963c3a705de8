//! `sluice-bench`: a load generator for rate limiters, with HDR latency histograms.
//!
//! It speaks Sluice's gRPC `Check`, Envoy's `ShouldRateLimit` (so the same load can be
//! offered to Sluice and to any other Envoy rate limit service, such as Limitador) and
//! Sluice's HTTP JSON API; `--api get` sends a plain HTTP `GET`, to a gateway or straight
//! to its upstream, so the latency a gateway adds is one subtraction. Closed loop finds
//! saturation; open loop offers a fixed rate and measures latency from each request's
//! intended send time. See docs/benchmark.md.
//!
//! # Layout
//!
//! - [`keys`]: key distributions (hot, uniform, Zipf) over a seeded generator.
//! - [`target`]: the APIs' clients (and a plain `GET`, for gateways).
//! - [`http1`]: the minimal HTTP/1.1 keep-alive client behind the HTTP API.
//! - [`h2grpc`]: the lean unary gRPC client on HTTP/2 behind the Envoy API.
//! - [`run`]: the open and closed loops, histograms, progress line.
//! - [`report`]: text and JSON output.

mod h2grpc;
mod http1;
mod keys;
mod report;
mod run;
mod target;

use anyhow::{Context as _, bail};
use clap::Parser;
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::time::Duration;

/// The generator shares the machine with the server it measures: the less CPU it spends per
/// request, the more the server gets.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Load generator for sluiced (gRPC, Envoy RLS, HTTP) and other Envoy rate limit services.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Which API to call.
    #[arg(long, value_enum, default_value = "envoy")]
    api: target::Api,
    /// Server address, host:port (gRPC port for grpc/envoy, HTTP port for http and get).
    #[arg(long, required_unless_present = "print_request")]
    addr: Option<String>,
    /// Domain (a Limitador namespace).
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Descriptor that carries the drawn key.
    #[arg(long, default_value = "user")]
    key_name: String,
    /// Key values are this prefix followed by the key's number.
    #[arg(long, default_value = "u")]
    key_prefix: String,
    /// A fixed descriptor sent with every request, NAME=VALUE (repeatable).
    #[arg(long = "descriptor", value_name = "NAME=VALUE")]
    descriptors: Vec<String>,
    /// Key distribution.
    #[arg(long, default_value = "uniform", value_parser = ["hot", "uniform", "zipf"])]
    dist: String,
    /// Number of distinct keys (uniform, zipf).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Zipf exponent.
    #[arg(long, default_value_t = 1.1)]
    zipf_s: f64,
    /// Cost of each request (Envoy hits_addend).
    #[arg(long, default_value_t = 1)]
    cost: u32,
    /// `--api get`: the path requested.
    #[arg(long, default_value = "/")]
    path: String,
    /// `--api get`: send the drawn key in this header (e.g. a gateway's API key header);
    /// without it no key is sent.
    #[arg(long)]
    key_header: Option<String>,
    /// Open loop at this many requests per second; without it, closed loop.
    #[arg(long)]
    rate: Option<f64>,
    /// Closed loop: workers. Open loop: most requests in flight.
    #[arg(long)]
    concurrency: Option<usize>,
    /// HTTP/2 connections for grpc/envoy (HTTP uses one per worker).
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Measured duration, seconds (at most 3600).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Unmeasured warm-up before it, seconds.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Stop after this many requests, warm-up included.
    #[arg(long)]
    requests: Option<u64>,
    /// Per-request deadline, milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Seed of the key draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Threads (default: the CPUs this process may run on). Closed loop: a single-threaded
    /// runtime on each, with its share of the workers and connections; open loop: the
    /// workers of one work-stealing runtime.
    #[arg(long)]
    threads: Option<usize>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// Send nothing: write the gRPC request body of the Envoy call for the hot key (key 0,
    /// the descriptors and cost as given) to stdout, 5-byte gRPC prefix included, for load
    /// generators that send one fixed body (h2load -d, bench/h2load-compare.sh).
    #[arg(long)]
    print_request: bool,
}

fn secs(name: &str, v: f64, max: f64) -> anyhow::Result<Duration> {
    if !(v.is_finite() && (0.0..=max).contains(&v)) {
        bail!("--{name} must be 0 to {max} seconds, got {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

fn shape(a: &Args, addr: SocketAddr) -> anyhow::Result<target::Shape> {
    let mut extra = Vec::new();
    for d in &a.descriptors {
        let Some((k, v)) = d.split_once('=') else {
            bail!("--descriptor {d:?} must be NAME=VALUE");
        };
        extra.push((k.to_string(), v.to_string()));
    }
    // Both go into the request head as written: no byte may end a line or a token early.
    if !a.path.starts_with('/') || a.path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        bail!(
            "--path {:?} must start with / and hold no spaces or control characters",
            a.path
        );
    }
    if let Some(h) = &a.key_header
        && (h.is_empty()
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)))
    {
        bail!("--key-header {h:?} is not a header name");
    }
    Ok(target::Shape {
        api: a.api,
        addr,
        domain: a.domain.clone(),
        key_name: a.key_name.clone(),
        key_prefix: a.key_prefix.clone(),
        extra,
        cost: a.cost,
        path: a.path.clone(),
        key_header: a.key_header.clone(),
    })
}

fn plan(a: &Args) -> anyhow::Result<run::Plan> {
    let Some(name) = a.addr.as_deref() else {
        bail!("--addr is required");
    };
    let addr: SocketAddr = name
        .to_socket_addrs()
        .with_context(|| format!("resolving --addr {name}"))?
        .next()
        .with_context(|| format!("--addr {name} resolves to nothing"))?;
    let duration = secs("duration", a.duration, 3600.0)?;
    if duration.is_zero() {
        bail!("--duration must be more than 0");
    }
    let mode = match a.rate {
        Some(rate) if rate.is_finite() && rate > 0.0 => run::Mode::Open { rate },
        Some(rate) => bail!("--rate must be a positive number, got {rate}"),
        None => run::Mode::Closed,
    };
    let concurrency = a.concurrency.unwrap_or(match mode {
        run::Mode::Closed => 64,
        run::Mode::Open { .. } => 512,
    });
    if concurrency == 0 || concurrency > 100_000 {
        bail!("--concurrency must be 1 to 100000");
    }
    Ok(run::Plan {
        shape: shape(a, addr)?,
        mode,
        concurrency,
        connections: a.connections.max(1),
        dist: keys::Dist::new(&a.dist, a.keys, a.zipf_s)?,
        duration,
        warmup: secs("warmup", a.warmup, 600.0)?,
        max_requests: a.requests,
        timeout: Duration::from_millis(a.timeout_ms.max(1)),
        seed: a.seed,
        progress: !a.quiet,
    })
}

/// `--print-request`: the framed body of the hot key's Envoy call, on stdout.
fn print_request(a: &Args) -> anyhow::Result<()> {
    use std::io::Write as _;
    if a.api != target::Api::Envoy {
        bail!("--print-request writes Envoy RLS requests: use --api envoy");
    }
    // No connection is made: the address is not part of the body.
    let shape = shape(a, SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let mut key = String::new();
    run::key_string(&mut key, &shape.key_prefix, 0);
    let body = h2grpc::frame(&target::envoy_request(&shape, &key))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&body)
        .context("writing the request to stdout")?;
    out.flush().context("writing the request to stdout")?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.print_request {
        return print_request(&args);
    }
    let plan = plan(&args)?;
    // The closed loop runs a single-threaded runtime per thread, each with its share of the
    // workers and connections: the work-stealing scheduler's shared queues only cost the
    // generator CPU. The open loop keeps the multi-threaded one: its dispatcher thread
    // spawns every request from outside the runtime, and a single-threaded runtime woken for
    // each one adds milliseconds.
    let threads = args.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        |t| t.max(1),
    );
    let outcome = match plan.mode {
        run::Mode::Closed if threads > 1 => run::run_closed_threads(&plan, threads)?,
        run::Mode::Closed => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(run::run(plan.clone()))?,
        run::Mode::Open { .. } => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
            .block_on(run::run(plan.clone()))?,
    };
    if args.json {
        println!("{}", report::json(&plan, &outcome));
    } else {
        print!("{}", report::text(&plan, &outcome));
    }
    if outcome.allowed + outcome.denied == 0 {
        bail!(
            "no request was answered{}",
            outcome
                .first_error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}
