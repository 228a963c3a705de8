//! `sluiced`, the decision daemon: wires the core, a store and a rule source, and serves
//! checks over gRPC and HTTP plus `/healthz` and `/metrics`.
//!
//! The binary stays thin (parse flags, set up tracing, bind, call [`run`]) so tests can run
//! the daemon in-process on their own listeners.
//!
//! # Layout
//!
//! - [`config`]: the config file and its defaults.
//! - [`engine`]: the hot path around the core (`engine/held.rs`: what a call holds across its
//!   await and undoes when cancelled).
//! - [`clock`]: the engine's wall and monotonic clocks, given from outside (the
//!   `sluice-clock` crate, shared with the gossip node).
//! - [`http`]: HTTP JSON API, health, metrics.
//! - [`unary`]: the gRPC port, a lean unary gRPC server on HTTP/2.
//! - [`grpc`]: the `sluice.v1.Limiter` service.
//! - [`envoy`]: Envoy's `envoy.service.ratelimit.v3.RateLimitService`, same gRPC port: the
//!   service, descriptor translation, and the response (statuses, headers).
//! - [`daemon_state`]: `GET /v1/daemon`, this daemon's breakers and gossip for the console.
//! - [`decisions`]: the decision log: sampled checks on local disk, `GET /v1/decisions`.
//! - [`hot`]: the hot-key layer's shell (deny cache, leases, give-backs).
//! - [`journal`]: quota admissions during store outages, replayed on recovery.
//! - [`limits`]: resource limits and self-protection (sizes, deadlines, connections, checks
//!   in flight) and the HTTP ports' accept loop.
//! - [`metrics`]: Prometheus text exposition.
//! - [`control`]: the rule source (YAML file or PostgreSQL) and the admin API.
//! - [`regions`]: gossip with the other regions (the delta shipper and the merge layer).
//! - [`startup`]: readiness: the store warmed up before `/healthz` says ready.
//! - [`tls`]: TLS on the listeners (reloaded on file change) and for `rediss://`.
//! - [`workers`]: connection threads, each a single-threaded runtime.

pub use sluice_clock as clock;
pub mod config;
pub mod control;
pub mod daemon_state;
pub mod decisions;
pub mod engine;
pub mod envoy;
pub mod grpc;
pub mod hot;
pub mod http;
pub mod journal;
pub mod limits;
pub mod metrics;
pub mod regions;
pub mod startup;
pub mod stores;
pub mod tls;
pub mod unary;
pub mod workers;

use anyhow::Context as _;
use config::{Config, StoreConfig};
use engine::Engine;
use sluice_store::{MemoryStore, Store};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The sockets the daemon serves on, bound by the caller.
pub struct Listeners {
    /// HTTP.
    pub http: TcpListener,
    /// gRPC.
    pub grpc: TcpListener,
    /// Admin API (`None` when not served: the file source without `admin_addr`).
    pub admin: Option<TcpListener>,
}

impl Listeners {
    /// Binds the configured addresses.
    pub async fn bind(cfg: &Config) -> anyhow::Result<Listeners> {
        let http = TcpListener::bind(cfg.http_addr)
            .await
            .with_context(|| format!("binding HTTP on {}", cfg.http_addr))?;
        let grpc = TcpListener::bind(cfg.grpc_addr)
            .await
            .with_context(|| format!("binding gRPC on {}", cfg.grpc_addr))?;
        let admin = control::bind_admin(cfg).await?;
        Ok(Listeners { http, grpc, admin })
    }
}

async fn build_store(cfg: &Config) -> anyhow::Result<(Arc<dyn Store>, Option<Arc<MemoryStore>>)> {
    let main = config::NamedStore {
        name: sluice_core::stores::DEFAULT.into(),
        store: cfg.store.clone(),
        timeout_ms: cfg.store_timeout_ms,
        stale_after_ms: cfg.store_stale_after_ms,
        connect_timeout_ms: cfg.store_connect_timeout_ms,
        breaker: cfg.breaker(),
    };
    build_one(cfg, &main).await
}

/// One store, the main one or a named one, from its resolved settings.
async fn build_one(
    cfg: &Config,
    s: &config::NamedStore,
) -> anyhow::Result<(Arc<dyn Store>, Option<Arc<MemoryStore>>)> {
    let redis = |urls: Vec<String>, cluster: bool| sluice_store::redis::RedisConfig {
        urls,
        cluster,
        timeout_ms: s.timeout_ms,
        connect_timeout_ms: s.connect_timeout_ms,
        stale_after_ms: s.stale_after_ms,
        tls: cfg.redis_tls.to_store(),
    };
    match &s.store {
        StoreConfig::Memory { max_keys } => {
            let m = Arc::new(MemoryStore::new(*max_keys));
            Ok((m.clone() as Arc<dyn Store>, Some(m)))
        }
        StoreConfig::Redis { url } => {
            let s = sluice_store::redis::connect(&redis(vec![url.clone()], false)).await?;
            Ok((s, None))
        }
        StoreConfig::RedisCluster { urls } => {
            let s = sluice_store::redis::connect(&redis(urls.clone(), true)).await?;
            Ok((s, None))
        }
    }
}

/// Runs the daemon until `shutdown` completes, then drains in-flight requests and returns.
pub async fn run(
    cfg: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    cfg.validate()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Rules: PostgreSQL with `postgres`, else the YAML file (control.rs).
    let mut rules = control::start_rules(&cfg, stop_rx.clone()).await?;
    let published = rules.published.clone();
    // A set naming a store this daemon lacks is refused whole, the last good one kept
    // serving; the first set must name only stores it has.
    {
        let known: Vec<String> = cfg.stores.keys().cloned().collect();
        let admits = move |set: &sluice_core::rules::RuleSet| {
            let missing = sluice_core::stores::unknown(set, |s| known.iter().any(|k| k == s));
            if missing.is_empty() {
                Ok(())
            } else {
                Err(missing.join("; "))
            }
        };
        if let Err(why) = admits(&published.load()) {
            anyhow::bail!("the rules name stores this daemon does not have: {why}");
        }
        published.admit_only(Box::new(admits));
    }

    let (store, memory) = build_store(&cfg).await?;
    tracing::info!(store = store.kind(), "counter store configured");
    let metrics = Arc::new(metrics::Metrics::default());
    let guard = Arc::new(limits::Guard::new(cfg.limits.clone()));
    metrics.add_exporter(guard.clone());
    metrics.add_exporter(Arc::new(control::RulesRefused(published.clone())));
    metrics.add_exporter(Arc::new(control::RuleEnforced(published.clone())));
    let mut engine = Engine::new(
        published.clone(),
        store,
        metrics,
        (cfg.local_factor * 1000.0).round() as u64,
        Duration::from_millis(cfg.store_timeout_ms),
        cfg.daemon_id(),
        cfg.breaker(),
    );
    if let Some(path) = &cfg.journal {
        let j = journal::Journal::open(path.clone())
            .with_context(|| format!("opening the quota journal {}", path.display()))?;
        tracing::info!(path = %path.display(), backlog = j.backlog(), "quota journal open");
        engine.journal = Some(Arc::new(j));
    }
    for named in cfg.named_stores()? {
        let (store, memory) = build_one(&cfg, &named)
            .await
            .with_context(|| format!("store {:?} (stores:)", named.name))?;
        tracing::info!(name = %named.name, store = store.kind(), "named store configured");
        let mut b = stores::Backend::new(
            &named.name,
            store,
            memory,
            Duration::from_millis(named.timeout_ms),
            named.breaker,
        );
        // Its journal beside the main one's: `<journal>.<name>`.
        if let Some(path) = &cfg.journal {
            let mut p = path.clone().into_os_string();
            p.push(format!(".{}", named.name));
            let p = std::path::PathBuf::from(p);
            let j = journal::Journal::open(p.clone())
                .with_context(|| format!("opening the quota journal {}", p.display()))?;
            b.journal = Some(Arc::new(j));
        }
        engine.add_store(b);
    }
    if cfg.hot_keys.deny_entries > 0 || cfg.hot_keys.leases > 0 {
        let hot = Arc::new(hot::HotKeys::new(
            cfg.hot_keys.deny_entries,
            cfg.hot_keys.leases,
        ));
        engine.metrics.add_exporter(hot.clone());
        engine.hot = Some(hot);
    }
    if cfg.decision_log.enabled {
        let dir = cfg
            .decision_log
            .dir_for(listeners.http.local_addr()?.port());
        // Where a record's counts live, for a what-if replay: each memory store is the
        // daemon's own; a shared store (Redis) is the region's.
        let counts_in = match cfg.store {
            StoreConfig::Memory { .. } => format!("daemon:{}", cfg.daemon_id()),
            _ => cfg.region.clone(),
        };
        // The log is on by default: a directory it cannot write turns it off, not the daemon.
        match decisions::DecisionLog::start(&cfg.decision_log, &dir, Some(counts_in)) {
            Ok(log) => {
                tracing::info!(dir = %dir.display(), "decision log on");
                engine.metrics.add_exporter(log.clone());
                rules.decisions = Some(log.clone());
                engine.decisions = Some(log);
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "decision log off"),
        }
    }
    // Regions: other regions' figures into global rules, this region's out (regions.rs).
    let regions = regions::start(&cfg, published.clone(), &engine.metrics, engine.clock()).await?;
    if let Some(r) = &regions {
        engine.remote = Some(r.clone());
        engine.usage = Some(r.clone());
    }
    let engine = Arc::new(engine);
    // Per-rule counters, resolved on every publish: the hot path finds them without a lock.
    let counters = {
        let engine = engine.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move { engine.metrics.follow(&engine.rules, stop).await })
    };
    // Replays the quota journal once the store answers again, and fsyncs it.
    let replayer = {
        let engine = engine.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let Some(j) = engine.journal.clone() else {
                return;
            };
            loop {
                j.sync();
                j.replay(
                    engine.store.as_ref(),
                    engine.now(),
                    Duration::from_millis(250),
                )
                .await;
                for b in engine.named_stores() {
                    if let Some(nj) = &b.journal {
                        nj.sync();
                        nj.replay(b.store.as_ref(), engine.now(), Duration::from_millis(250))
                            .await;
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => { j.sync(); return; }
                }
            }
        })
    };

    // Idle state expires: sweep the memory stores so memory follows active keys.
    let sweeper = {
        let engine = engine.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                    _ = stop.changed() => return,
                }
                let now = engine.now();
                if let Some(m) = &memory {
                    m.sweep(now);
                }
                engine.local.sweep(now);
                for b in engine.named_stores() {
                    if let Some(m) = &b.memory {
                        m.sweep(now);
                    }
                    b.local.sweep(now);
                }
            }
        })
    };

    // Leases: what quiet keys did not spend goes back to the store; gated keys' pending
    // units are synced; local shares follow the region's membership (hot.rs).
    let give_back = {
        let engine = engine.clone();
        let regions = regions.clone();
        let mut stop = stop_rx.clone();
        let timeout = Duration::from_millis(cfg.store_timeout_ms.max(50));
        tokio::spawn(async move {
            let Some(hot) = engine.hot.clone() else {
                return;
            };
            let every = Duration::from_micros(sluice_core::hotkeys::lease::SWEEP);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.changed() => return,
                }
                if let Some(r) = &regions {
                    hot.set_daemons(r.region_daemons());
                }
                hot.sweep(&engine, engine.now(), timeout, false).await;
            }
        })
    };

    let http_addr = listeners.http.local_addr()?;
    let grpc_addr = listeners.grpc.local_addr()?;
    let mut served = vec![
        (tls::Listener::Http, http_addr),
        (tls::Listener::Grpc, grpc_addr),
    ];
    if let Some(a) = &listeners.admin {
        served.push((tls::Listener::Admin, a.local_addr()?));
    }
    tls::install(&cfg.tls, &served)?;
    // Connections on threads of their own when the daemon has more than one (workers.rs).
    let workers = match cfg.threads() {
        1 => None,
        n => Some(Arc::new(
            workers::Workers::start(n).context("starting the connection threads")?,
        )),
    };
    // HTTP serves at once (`/healthz` answers 503 while starting); checks wait for the store.
    let ready = startup::Readiness::default();
    let http = tokio::spawn(limits::serve_http(
        listeners.http,
        startup::gated(http::router(engine.clone(), guard.clone()), &ready),
        guard.clone(),
        limits::Port::Http,
        stop_rx.clone(),
        workers.clone(),
    ));
    // Named stores warm up beside the main one; they do not hold readiness back (a tenant's
    // store that is down answers its rules' failure modes, not everyone's).
    for b in engine.named_stores() {
        let (store, stop) = (b.store.clone(), stop_rx.clone());
        tokio::spawn(async move {
            startup::warm_up(store, &startup::Readiness::default(), stop).await;
        });
    }
    startup::warm_up(engine.store.clone(), &ready, stop_rx.clone()).await;
    let grpc = {
        let services = Arc::new(unary::Services {
            limiter: grpc::LimiterService {
                engine: engine.clone(),
            },
            envoy: envoy::RateLimitService::new(engine.clone(), cfg.envoy.clone()),
            guard: guard.clone(),
        });
        tokio::spawn(unary::serve(
            listeners.grpc,
            services,
            stop_rx.clone(),
            workers.clone(),
        ))
    };
    let admin = listeners.admin.map(|l| {
        let mut extra = daemon_state::router(
            engine.clone(),
            regions.clone(),
            cfg.daemon_id(),
            cfg.region.clone(),
        );
        if let Some(log) = engine.decisions.clone() {
            extra = extra.merge(decisions::api::router(log));
        }
        control::spawn_admin(&cfg, l, &rules, Some(extra), guard.clone(), stop_rx.clone())
    });
    tracing::info!(%http_addr, %grpc_addr, region = %cfg.region, daemon = %cfg.daemon_id(), "sluiced serving");

    shutdown.await;
    tracing::info!("shutting down: draining in-flight requests");
    let _ = stop_tx.send(true);
    // Drain, but boundedly: a client holding an idle connection open must not keep a
    // stopping daemon alive.
    let drain = Duration::from_millis(cfg.drain_timeout_ms);
    match tokio::time::timeout(drain, async { (http.await, grpc.await) }).await {
        Ok((h, g)) => {
            h.context("http task")?;
            g.context("grpc task")?;
        }
        Err(_) => tracing::warn!(
            timeout_ms = cfg.drain_timeout_ms,
            "drain timed out; closing remaining connections"
        ),
    }
    let _ = rules.task.await;
    if let Some(a) = admin {
        let _ = tokio::time::timeout(Duration::from_millis(cfg.drain_timeout_ms), a).await;
    }
    let _ = sweeper.await;
    let _ = counters.await;
    let _ = replayer.await;
    let _ = give_back.await;
    // In-flight checks have drained: every lease's unspent units go back.
    if let Some(hot) = &engine.hot {
        let timeout = Duration::from_millis(cfg.store_timeout_ms.max(50));
        hot.sweep(&engine, engine.now(), timeout, true).await;
    }
    if let Some(r) = &regions {
        r.shutdown().await;
    }
    tracing::info!("stopped");
    Ok(())
}
