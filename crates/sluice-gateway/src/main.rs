//! `sluice-gateway`: parse flags and the config file, set up tracing, bind, run until
//! SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use sluice_gateway::{FileConfig, Settings};

/// A reverse proxy that checks each request with sluiced.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Listen address for clients (HTTP/1.1 and h2 cleartext).
    #[arg(long)]
    listen: SocketAddr,
    /// The upstream, `http://host:port`.
    #[arg(long)]
    upstream: String,
    /// sluiced's gRPC address, `host:port` or `http://host:port`.
    #[arg(long)]
    sluiced: String,
    /// YAML config file: domain, templates, headers, trusted proxies, deadline, failure mode,
    /// metrics address.
    #[arg(long)]
    config: Option<PathBuf>,
    /// `/metrics` and `/healthz` listen address; overrides the file's `metrics_addr`.
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let mut file = match &args.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    if args.metrics_addr.is_some() {
        file.metrics_addr = args.metrics_addr;
    }
    let settings = Settings::new(&args.upstream, &args.sluiced, file)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    sluice_gateway::run(listener, settings, shutdown_signal()).await?;
    Ok(())
}
