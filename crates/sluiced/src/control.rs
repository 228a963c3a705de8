//! The control plane as the daemon wires it: which rule source runs (PostgreSQL with
//! `--postgres`, else the YAML file), and the admin API on its own listener. The work is in
//! sluice-control; this module only chooses and starts it, so `run` stays readable.

use crate::config::Config;
use crate::limits::{BodyLimits, Guard, Port};
use anyhow::Context as _;
use sluice_control::Published;
use sluice_control::admin::{AdminConfig, AdminState};
use sluice_control::postgres::{PgConfig, PgSource};
use sluice_control::store::Store;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A token from the config file. `Debug` never shows it, so a logged config leaks nothing.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The admin API's default address when rules come from PostgreSQL.
pub const DEFAULT_ADMIN_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8082);

/// The running rule source.
pub struct Rules {
    /// The live set the engine reads.
    pub published: Arc<Published>,
    /// Keeps it current; ends on stop.
    pub task: JoinHandle<()>,
    store: Option<Arc<Store>>,
    /// The decision log, when on: the admin API's `POST /v1/rules:what-if` replays it.
    pub decisions: Option<Arc<crate::decisions::DecisionLog>>,
}

/// Where the admin API listens: `admin_addr` if set; with PostgreSQL, 127.0.0.1:8082 by
/// default; with the file source, nowhere unless asked (so several file-backed daemons on one
/// host do not fight over a port they do not need).
pub fn admin_addr(cfg: &Config) -> Option<SocketAddr> {
    cfg.admin_addr
        .or_else(|| cfg.postgres.is_some().then_some(DEFAULT_ADMIN_ADDR))
}

/// The tokens: from the config (`admin_token` is principal `admin`, `admin_tokens` name
/// theirs; token files are read now), else `SLUICE_ADMIN_TOKEN` / `SLUICE_READ_TOKEN`.
pub fn admin_auth(cfg: &Config) -> anyhow::Result<AdminConfig> {
    let mut auth = AdminConfig::single(
        cfg.admin_token.as_ref().map(|s| s.0.clone()),
        cfg.read_token.as_ref().map(|s| s.0.clone()),
    );
    for t in &cfg.admin_tokens {
        auth.admin.push(t.load()?);
    }
    for t in &cfg.read_tokens {
        auth.read.push(t.load()?);
    }
    let auth = auth.or_env();
    auth.check()?;
    Ok(auth)
}

/// Binds the admin listener, refusing a token-less API on a non-loopback address first.
pub async fn bind_admin(cfg: &Config) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = admin_addr(cfg) else {
        return Ok(None);
    };
    sluice_control::admin::check_exposure(addr, &admin_auth(cfg)?)?;
    let l = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the admin API on {addr}"))?;
    Ok(Some(l))
}

/// This daemon's id in the status table: the configured one, else host name and HTTP port
/// (stable across restarts, distinct for several daemons on one host).
fn status_id(cfg: &Config) -> String {
    cfg.daemon_id.clone().unwrap_or_else(|| {
        format!(
            "{}:{}",
            sluice_control::postgres::default_daemon_id(),
            cfg.http_addr.port()
        )
    })
}

/// Starts the configured rule source and publishes its first set.
pub async fn start_rules(cfg: &Config, stop: watch::Receiver<bool>) -> anyhow::Result<Rules> {
    let Some(url) = &cfg.postgres else {
        let set = sluice_control::file::load(&cfg.rules)?;
        tracing::info!(rules = set.rule_count(), domains = set.domains.len(), path = %cfg.rules.display(), "rules loaded");
        let published = Published::new(set);
        published.serve_as(&cfg.daemon_id());
        let task = tokio::spawn(sluice_control::file::watch(
            cfg.rules.clone(),
            published.clone(),
            Duration::from_millis(cfg.rules_poll_ms),
            stop,
        ));
        return Ok(Rules {
            published,
            task,
            store: None,
            decisions: None,
        });
    };
    let mut pg = PgConfig::new(url.clone(), status_id(cfg), cfg.region.clone());
    pg.listen_url = cfg.postgres_listen.clone();
    pg.poll = Duration::from_secs(cfg.poll_s);
    pg.cache = cfg.rules_cache.clone();
    if pg.cache.is_none() {
        tracing::warn!(
            "no rules_cache (--rules-cache): a restart while PostgreSQL is down will have no rules to serve"
        );
    }
    let source = PgSource::start(pg).await?;
    let set = source.published().load();
    tracing::info!(
        version = set.version,
        rules = set.rule_count(),
        domains = set.domains.len(),
        from_cache = source.from_cache(),
        "rules loaded from the control plane"
    );
    let published = source.published();
    published.serve_as(&cfg.daemon_id());
    let task = source.spawn(stop);
    let store = Arc::new(Store::new(url)?.with_pending_ttl(Duration::from_secs(cfg.pending_ttl_s)));
    Ok(Rules {
        published,
        task,
        store: Some(store),
        decisions: None,
    })
}

/// Serves the admin API on `listener` until `stop`: read-write over PostgreSQL, read-only
/// over the file source, plus the daemon's own `extra` routes (the decision log) behind the
/// same tokens; within the port limits of `guard` (connections, header and body deadlines;
/// the API's own body caps per route).
pub fn spawn_admin(
    cfg: &Config,
    listener: TcpListener,
    rules: &Rules,
    extra: Option<axum::Router>,
    guard: Arc<Guard>,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let auth = match admin_auth(cfg) {
        Ok(a) => a,
        Err(e) => {
            // Checked when the listener was bound; a token file gone since: fail closed.
            tracing::error!(error = %e, "admin API not served");
            return tokio::spawn(async {});
        }
    };
    let state = match &rules.store {
        Some(store) => AdminState::postgres_serving(store.clone(), auth, rules.published.clone()),
        None => AdminState::read_only(rules.published.clone(), auth),
    };
    let bounds = BodyLimits {
        guard: guard.clone(),
        port: Port::Admin,
        max_bytes: None,
    };
    // Console cookies are `Secure` where the listener serves TLS.
    state.set_secure_cookies(crate::tls::for_addr(listener.local_addr().ok()).is_some());
    let mut app = sluice_control::admin::router(state.clone());
    if let Some(extra) = extra {
        app = app.merge(sluice_control::admin::behind_tokens(&state, extra));
    }
    if let Some(log) = rules.decisions.clone() {
        app = app.merge(sluice_control::admin::what_if_routes(&state, log));
    }
    let app = app.layer(axum::middleware::from_fn_with_state(
        bounds,
        crate::limits::bounded_body,
    ));
    tokio::spawn(crate::limits::serve_http(
        listener,
        app,
        guard,
        Port::Admin,
        stop,
        None,
    ))
}

/// `sluice_rule_enforced{domain, rule}`: 1 where this daemon enforces the rule, 0 where it
/// only shadows it (`mode: shadow`, or an `enforce_on` canary that leaves this daemon out) or
/// it is off. Summed over the fleet it is how far a canary has gone; next to
/// `sluice_decisions_total{outcome="shadow_denied"}` it says which daemons' would-refusals
/// are the preview of enforcing.
pub struct RuleEnforced(pub Arc<Published>);

impl std::fmt::Debug for RuleEnforced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RuleEnforced").finish_non_exhaustive()
    }
}

impl crate::metrics::Exporter for RuleEnforced {
    fn render(&self, out: &mut String) {
        let name = "sluice_rule_enforced";
        sluice_metrics::header(
            out,
            name,
            "1 where this daemon enforces the rule, 0 where it shadows it (mode: shadow, or enforce_on leaves this daemon out) or it is off.",
            sluice_metrics::Kind::Gauge,
        );
        for p in self.0.load().placements() {
            let on = u8::from(p.mode == sluice_core::rules::Mode::Enforce);
            sluice_metrics::sample(out, name, &[("domain", &p.domain), ("rule", &p.rule)], on);
        }
    }
}

/// `sluice_rules_refused_total`: rule sets validation refused, from the rules file or from
/// PostgreSQL (the last good set kept serving), counted where they were refused.
pub struct RulesRefused(pub Arc<Published>);

impl std::fmt::Debug for RulesRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RulesRefused")
            .field(&self.0.refusals())
            .finish()
    }
}

impl crate::metrics::Exporter for RulesRefused {
    fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "# HELP sluice_rules_refused_total Rule sets refused by validation (the last good set kept serving).\n# TYPE sluice_rules_refused_total counter\nsluice_rules_refused_total {}",
            self.0.refusals()
        );
    }
}
