//! `sluiced`: parse flags and config, set up tracing, bind, run until SIGTERM/SIGINT.

use anyhow::Context as _;
use clap::Parser;
use sluiced::config::Config;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Every decision allocates a few short-lived keys, plans and buffers; mimalloc's per-thread
/// free lists serve them in a fraction of glibc's instructions, without its arena contention.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Sluice decision daemon.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// YAML config file; flags override its fields.
    #[arg(long)]
    config: Option<PathBuf>,
    /// HTTP listen address (default 127.0.0.1:8080).
    #[arg(long)]
    http_addr: Option<SocketAddr>,
    /// gRPC listen address (default 127.0.0.1:8081).
    #[arg(long)]
    grpc_addr: Option<SocketAddr>,
    /// Rules file (default deploy/rules.yaml).
    #[arg(long)]
    rules: Option<PathBuf>,
    /// Region name.
    #[arg(long)]
    region: Option<String>,
    /// Daemon id (default region-pid).
    #[arg(long)]
    daemon_id: Option<String>,
    /// Rules from this PostgreSQL instead of the file (`postgres://user@host:5432/db`).
    #[arg(long, env = "SLUICE_POSTGRES", hide_env_values = true)]
    postgres: Option<String>,
    /// Separate PostgreSQL URL for LISTEN (when --postgres goes through a pooler).
    #[arg(long)]
    postgres_listen: Option<String>,
    /// With --postgres: pull interval, seconds (default 30).
    #[arg(long)]
    poll_s: Option<u64>,
    /// With --postgres: disk copy of the last rules, for a restart while PostgreSQL is down.
    #[arg(long)]
    rules_cache: Option<PathBuf>,
    /// Admin API address (default 127.0.0.1:8082 with --postgres).
    #[arg(long)]
    admin_addr: Option<SocketAddr>,
    /// Count in this Redis (`redis://host:port/`) instead of in memory.
    #[arg(long, conflicts_with = "redis_cluster")]
    redis: Option<String>,
    /// Count in this Redis Cluster (comma-separated seed URLs).
    #[arg(long, value_delimiter = ',')]
    redis_cluster: Option<Vec<String>>,
    /// Quota journal file (totals of quotas survive store outages and restarts).
    #[arg(long)]
    journal: Option<PathBuf>,
    /// Deadline of one store call, ms (default 3).
    #[arg(long)]
    store_timeout_ms: Option<u64>,
    /// How long after a check Redis may still run its call, ms (default: the store deadline;
    /// 0: no bound).
    #[arg(long)]
    store_stale_after_ms: Option<u64>,
    /// Gossip UDP address (membership and counts between regions); regions are off without.
    #[arg(long)]
    gossip_addr: Option<SocketAddr>,
    /// A seed daemon's gossip address, `host:port` (repeatable).
    #[arg(long = "gossip-seed", value_name = "ADDR")]
    gossip_seed: Vec<String>,
    /// Cluster id: daemons of other clusters are ignored (default "sluice").
    #[arg(long)]
    cluster_id: Option<String>,
    /// Shared key authenticating gossip (HMAC-SHA256, at least 16 bytes). Prefer the
    /// environment variable: command lines are visible to every user of the host.
    #[arg(long, env = "SLUICE_GOSSIP_KEY", hide_env_values = true)]
    gossip_key: Option<String>,
    /// How often busy global figures are shipped, ms (default 1000).
    #[arg(long)]
    ship_interval_ms: Option<u64>,
    /// Threads: 0 = one per CPU the process may use; 1 = one single-threaded runtime (what
    /// a daemon pinned to one CPU gets with 0); N > 1: connections on N threads of their own,
    /// the rest on N work-stealing workers (default: the config's `worker_threads`, 0).
    #[arg(long)]
    worker_threads: Option<usize>,
}

fn config(args: &Args) -> anyhow::Result<Config> {
    let mut cfg = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
            Config::from_yaml(&text)
                .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?
        }
        None => Config::default(),
    };
    if let Some(a) = args.http_addr {
        cfg.http_addr = a;
    }
    if let Some(a) = args.grpc_addr {
        cfg.grpc_addr = a;
    }
    if let Some(r) = &args.rules {
        cfg.rules = r.clone();
    }
    if let Some(r) = &args.region {
        cfg.region = r.clone();
    }
    if let Some(d) = &args.daemon_id {
        cfg.daemon_id = Some(d.clone());
    }
    if let Some(p) = &args.postgres {
        cfg.postgres = Some(p.clone());
    }
    if let Some(p) = &args.postgres_listen {
        cfg.postgres_listen = Some(p.clone());
    }
    if let Some(s) = args.poll_s {
        cfg.poll_s = s;
    }
    if let Some(c) = &args.rules_cache {
        cfg.rules_cache = Some(c.clone());
    }
    if let Some(a) = args.admin_addr {
        cfg.admin_addr = Some(a);
    }
    if let Some(url) = &args.redis {
        cfg.store = sluiced::config::StoreConfig::Redis { url: url.clone() };
    }
    if let Some(urls) = &args.redis_cluster {
        cfg.store = sluiced::config::StoreConfig::RedisCluster { urls: urls.clone() };
    }
    if let Some(j) = &args.journal {
        cfg.journal = Some(j.clone());
    }
    if let Some(t) = args.store_timeout_ms {
        cfg.store_timeout_ms = t;
    }
    if let Some(t) = args.store_stale_after_ms {
        cfg.store_stale_after_ms = Some(t);
    }
    if let Some(a) = args.gossip_addr {
        cfg.gossip.addr = Some(a);
    }
    if !args.gossip_seed.is_empty() {
        cfg.gossip.seeds = args.gossip_seed.clone();
    }
    if let Some(c) = &args.cluster_id {
        cfg.gossip.cluster_id = c.clone();
    }
    if let Some(k) = &args.gossip_key {
        cfg.gossip.key = Some(k.clone());
        cfg.gossip.key_file = None;
    }
    if let Some(i) = args.ship_interval_ms {
        cfg.gossip.ship_interval_ms = i;
    }
    if let Some(n) = args.worker_threads {
        cfg.worker_threads = n;
    }
    cfg.validate()?;
    Ok(cfg)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = config(&args)?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.log));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    // On one CPU (a pinned daemon) the work-stealing scheduler only adds cost: every wakeup
    // goes through its shared queues (single-threaded: 13% more decisions/s, docs/benchmark.md).
    // With more, connections get threads of their own (`sluiced::workers`) and the rest of the
    // daemon (store clients, gossip, background tasks) this runtime.
    let threads = cfg.threads();
    let mut rt = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    let rt = rt.enable_all().build().context("starting the runtime")?;
    rt.block_on(async {
        let listeners = sluiced::Listeners::bind(&cfg).await?;
        sluiced::run(cfg, listeners, shutdown_signal()).await
    })
}
