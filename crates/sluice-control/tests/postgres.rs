//! The control plane against a real PostgreSQL: migrations, the admin API, push, pull, the
//! rules cache and status. Each test gets a throwaway database on the shared server
//! (127.0.0.1:5432); failures of the network are made with a `TcpProxy`, never by touching
//! the server.

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use sluice_control::Published;
use sluice_control::admin::{AdminConfig, AdminState, serve_admin};
use sluice_control::postgres::{PgConfig, PgSource};
use sluice_control::store::Store;
use sluice_core::matching::{Descriptors, applicable};
use sluice_testkit::{Postgres, TcpProxy, http_request};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

const ADMIN_TOKEN: &str = "admin-secret";
const READ_TOKEN: &str = "read-secret";

/// An admin API served in-process on a free loopback port.
struct Admin {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Admin {
    async fn start(url: &str) -> Result<Admin> {
        let store = Arc::new(Store::new(url)?);
        store.migrate().await?;
        let auth = AdminConfig::single(Some(ADMIN_TOKEN.into()), Some(READ_TOKEN.into()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_admin(
            listener,
            AdminState::postgres(store, auth),
            async {
                let _ = rx.await;
            },
        ));
        Ok(Admin {
            addr,
            stop: Some(tx),
        })
    }

    /// One request with the admin token; returns status and JSON body.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
        self.call_as(Some(ADMIN_TOKEN), method, path, body).await
    }

    async fn call_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let (addr, method, path) = (self.addr, method.to_string(), path.to_string());
        let token = token.map(|t| format!("Bearer {t}"));
        tokio::task::spawn_blocking(move || {
            let mut headers = vec![
                ("Content-Type", "application/json"),
                ("X-Sluice-Actor", "test"),
            ];
            if let Some(t) = &token {
                headers.push(("Authorization", t.as_str()));
            }
            let body = body.map(|b| b.to_string()).unwrap_or_default();
            let resp = http_request(addr, &method, &path, &headers, body.as_bytes())?;
            let v = if resp.body.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&resp.body)
                    .with_context(|| format!("{method} {path}: not JSON: {}", resp.text()))?
            };
            Ok((resp.status, v))
        })
        .await?
    }

    /// A write that must succeed; returns the new version.
    async fn write(&self, method: &str, path: &str, body: Option<Value>) -> Result<u64> {
        let (status, v) = self.call(method, path, body).await?;
        ensure!(status == 200, "{method} {path}: {status} {v}");
        v["version"]
            .as_u64()
            .with_context(|| format!("no version in {v}"))
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

fn login(limit: u64) -> Value {
    json!({"match": {"route": "POST /v1/login"}, "key": ["ip"], "algorithm": "sliding_window",
           "limit": limit, "window": "1m"})
}

fn source_config(url: &str, id: &str) -> PgConfig {
    let mut cfg = PgConfig::new(url, id, "test-region");
    cfg.report_every = Duration::from_millis(200);
    cfg.connect_timeout = Duration::from_secs(1);
    cfg
}

/// Waits until `published` serves at least `version`; returns how long it took.
async fn wait_version(published: &Published, version: u64, within: Duration) -> Result<Duration> {
    let start = Instant::now();
    let mut rx = published.subscribe();
    loop {
        if published.version() >= version {
            return Ok(start.elapsed());
        }
        let left = within.saturating_sub(start.elapsed());
        if left.is_zero() {
            bail!(
                "version {version} not served within {within:?} (serving {})",
                published.version()
            );
        }
        let _ = tokio::time::timeout(left, rx.changed()).await;
    }
}

fn limit_of(published: &Published, domain: &str, id: &str) -> Option<u64> {
    let set = published.load();
    set.domain(domain)?.rule(id).map(|r| r.params.limit())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_idempotent_under_concurrency() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = pg.url();
        tasks.push(tokio::spawn(async move {
            let store = Store::new(&url)?;
            Ok::<_, anyhow::Error>(store.migrate().await?)
        }));
    }
    let mut applied = 0;
    for t in tasks {
        applied += t.await??.applied.len();
    }
    assert_eq!(applied, 4, "migrations 1 to 4 applied exactly once");
    let again = Store::new(&pg.url())?.migrate().await?;
    assert!(again.applied.is_empty());
    assert_eq!(again.schema_version, again.known);
    let tables = pg.psql(
        "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables WHERE tablename LIKE 'sluice_%'",
    )?;
    assert_eq!(
        tables,
        "sluice_changes,sluice_daemons,sluice_domains,sluice_history,sluice_overrides,sluice_pending,sluice_rules,sluice_schema_migrations,sluice_version"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_changes_rules_and_a_daemon_follows_by_push() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let admin = Admin::start(&pg.url()).await?;
    let cache = std::env::temp_dir().join(format!("sluice-cache-{}.json", std::process::id()));
    let mut cfg = source_config(&pg.url(), "d1");
    cfg.cache = Some(cache.clone());
    let source = PgSource::start(cfg).await?;
    let published = source.published();
    assert_eq!(published.version(), 0);
    let (stop, stop_rx) = watch::channel(false);
    let task = source.spawn(stop_rx);

    // Create: the first rule names its domain.
    let v1 = admin
        .write("PUT", "/v1/rules/login?domain=api", Some(login(100)))
        .await?;
    assert_eq!(v1, 1);
    let took = wait_version(&published, 1, Duration::from_secs(1)).await?;
    eprintln!("push: live in {took:?}");
    assert_eq!(limit_of(&published, "api", "login"), Some(100));

    // An identical PUT changes nothing and bumps nothing.
    let (status, same) = admin
        .call("PUT", "/v1/rules/login", Some(login(100)))
        .await?;
    assert_eq!(
        (status, same["version"].as_u64(), same["changed"].as_bool()),
        (200, Some(1), Some(false))
    );

    // A bad change is refused with the rule and field named, and nothing changes.
    let mut bad = login(100);
    bad["algorithm"] = json!("leaky_bucket");
    let (status, err) = admin.call("PUT", "/v1/rules/login", Some(bad)).await?;
    assert_eq!(status, 422, "{err}");
    assert_eq!(err["error"]["code"], "INVALID_RULES");
    assert_eq!(err["error"]["problems"][0]["at"], "login");
    assert_eq!(err["error"]["problems"][0]["field"], "algorithm");
    let (_, cur) = admin.call("GET", "/v1/rules/login", None).await?;
    assert_eq!(
        (cur["version"].as_u64(), cur["rule"]["limit"].as_u64()),
        (Some(1), Some(100))
    );

    // More than 10× tighter is refused unless forced; exactly 10× is the attack response.
    let (status, err) = admin.call("PUT", "/v1/rules/login", Some(login(5))).await?;
    assert_eq!(status, 422, "{err}");
    assert_eq!(err["error"]["code"], "TIGHTENING_REFUSED");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("force=true"),
        "{err}"
    );
    let v2 = admin
        .write("PUT", "/v1/rules/login", Some(login(10)))
        .await?;
    assert_eq!(v2, 2);
    wait_version(&published, 2, Duration::from_secs(1)).await?;
    assert_eq!(limit_of(&published, "api", "login"), Some(10));
    let v3 = admin
        .write("PUT", "/v1/rules/login?force=true", Some(login(1)))
        .await?;
    wait_version(&published, v3, Duration::from_secs(1)).await?;
    assert_eq!(limit_of(&published, "api", "login"), Some(1));

    // Rollback to version 1 restores 100 as a new version.
    let (status, rb) = admin
        .call("POST", "/v1/rules:rollback", Some(json!({"to_version": 1})))
        .await?;
    assert_eq!(status, 200, "{rb}");
    let v4 = rb["version"].as_u64().context("version")?;
    assert_eq!(v4, v3 + 1);
    wait_version(&published, v4, Duration::from_secs(1)).await?;
    assert_eq!(limit_of(&published, "api", "login"), Some(100));

    // Modes: shadow, off, enforce; the kill switch.
    use sluice_core::rules::Mode;
    let mode = |p: &Published| {
        p.load()
            .domain("api")
            .and_then(|d| d.rule("login").map(|r| r.mode))
    };
    let v = admin.write("POST", "/v1/rules/login:shadow", None).await?;
    wait_version(&published, v, Duration::from_secs(1)).await?;
    assert_eq!(mode(&published), Some(Mode::Shadow));
    let v = admin.write("POST", "/v1/rules/login:off", None).await?;
    wait_version(&published, v, Duration::from_secs(1)).await?;
    assert_eq!(mode(&published), Some(Mode::Off));
    let v = admin.write("POST", "/v1/rules/login:enforce", None).await?;
    wait_version(&published, v, Duration::from_secs(1)).await?;
    assert_eq!(mode(&published), Some(Mode::Enforce));
    admin
        .write(
            "PUT",
            "/v1/rules/pay",
            Some(json!({"key": ["api_key"], "algorithm": "token_bucket", "rate_per_s": 20, "burst": 40})),
        )
        .await?;
    let (status, all) = admin.call("POST", "/v1/rules:shadow-all", None).await?;
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["changes"].as_array().map(Vec::len), Some(2), "{all}");
    let v = all["version"].as_u64().context("version")?;
    wait_version(&published, v, Duration::from_secs(1)).await?;
    let set = published.load();
    let api = set.domain("api").context("domain")?;
    assert!(api.rules.iter().all(|r| r.mode == Mode::Shadow));
    let (_, bad_action) = admin.call("POST", "/v1/rules/login:explode", None).await?;
    assert_eq!(bad_action["error"]["code"], "NOT_FOUND");

    // Overrides.
    let v = admin
        .write(
            "PUT",
            "/v1/overrides/pay/api_key=k_big",
            Some(json!({"rate_per_s": 200, "burst": 400})),
        )
        .await?;
    wait_version(&published, v, Duration::from_secs(1)).await?;
    assert_eq!(
        published.load().domain("api").map(|d| d.overrides.len()),
        Some(1)
    );
    let (_, ovs) = admin.call("GET", "/v1/overrides", None).await?;
    assert_eq!(ovs["overrides"][0]["key"], "pay/api_key=k_big");
    let (status, err) = admin
        .call(
            "PUT",
            "/v1/overrides/nope/api_key=k",
            Some(json!({"limit": 3})),
        )
        .await?;
    assert_eq!(status, 404, "{err}");
    let v = admin
        .write("DELETE", "/v1/overrides/pay/api_key=k_big", None)
        .await?;
    wait_version(&published, v, Duration::from_secs(1)).await?;
    assert_eq!(
        published.load().domain("api").map(|d| d.overrides.len()),
        Some(0)
    );

    // Listing with a route filter, history, and the change log.
    let (_, list) = admin
        .call("GET", "/v1/rules?route=POST%20%2Fv1%2Flogin", None)
        .await?;
    let ids: Vec<&str> = list["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        vec!["login", "pay"],
        "pay has no route matcher: it applies too"
    );
    let (_, list) = admin
        .call("GET", "/v1/rules?route=GET%20%2Fother", None)
        .await?;
    assert_eq!(list["rules"].as_array().map(Vec::len), Some(1));
    let (_, hist) = admin.call("GET", "/v1/rules/login/history", None).await?;
    let versions: Vec<u64> = hist["history"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["version"].as_u64())
        .collect();
    // shadow, off, enforce, (pay created), shadow-all
    assert_eq!(versions.first(), Some(&(v4 + 5)), "{hist}");
    assert_eq!(versions.len(), 8, "{hist}");
    assert_eq!(versions.last(), Some(&1));
    assert!(
        hist["history"][0]["actor"]
            .as_str()
            .unwrap_or("")
            .starts_with("test")
    );
    let (_, log) = admin.call("GET", "/v1/rules:history?limit=3", None).await?;
    assert_eq!(log["changes"].as_array().map(Vec::len), Some(3));

    // Delete; then a rollback to before the delete brings it back.
    let before_delete = admin.call("GET", "/v1/rules/login", None).await?.1["version"]
        .as_u64()
        .context("version")?;
    let v = admin.write("DELETE", "/v1/rules/login", None).await?;
    wait_version(&published, v, Duration::from_secs(1)).await?;
    assert!(limit_of(&published, "api", "login").is_none());
    let (status, _) = admin.call("GET", "/v1/rules/login", None).await?;
    assert_eq!(status, 404);
    let v = admin
        .write(
            "POST",
            "/v1/rules:rollback",
            Some(json!({"to_version": before_delete})),
        )
        .await?;
    wait_version(&published, v, Duration::from_secs(1)).await?;
    assert_eq!(limit_of(&published, "api", "login"), Some(100));

    // Status shows the daemon at the current version, and the cache holds it.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, st) = admin.call("GET", "/v1/rules:status", None).await?;
        if st["daemons"][0]["version"].as_u64() == Some(v) {
            assert_eq!(st["daemons"][0]["daemon_id"], "d1");
            assert_eq!(st["daemons"][0]["current"], true);
            break;
        }
        ensure!(Instant::now() < deadline, "status never converged: {st}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let snap = sluice_control::snapshot::Snapshot::read(&cache)?;
    assert_eq!(snap.version, v);

    let _ = stop.send(true);
    task.await?;
    let _ = std::fs::remove_file(&cache);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_reads_and_writes() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let admin = Admin::start(&pg.url()).await?;
    let (s, e) = admin.call_as(None, "GET", "/v1/rules", None).await?;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (401, Some("UNAUTHENTICATED"))
    );
    let (s, _) = admin
        .call_as(Some("wrong"), "GET", "/v1/rules", None)
        .await?;
    assert_eq!(s, 401);
    let (s, _) = admin
        .call_as(Some(READ_TOKEN), "GET", "/v1/rules", None)
        .await?;
    assert_eq!(s, 200);
    let (s, e) = admin
        .call_as(
            Some(READ_TOKEN),
            "PUT",
            "/v1/rules/login?domain=api",
            Some(login(5)),
        )
        .await?;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (403, Some("PERMISSION_DENIED"))
    );
    let addr = admin.addr;
    let health =
        tokio::task::spawn_blocking(move || sluice_testkit::http_get(addr, "/healthz")).await??;
    assert_eq!(health.status, 200, "health needs no token");
    // Nothing was written by the refused calls.
    let (_, st) = admin.call("GET", "/v1/rules:status", None).await?;
    assert_eq!(st["version"], 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_admin_api_only_listens_on_loopback() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let store = Arc::new(Store::new(&pg.url())?);
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await?;
    let err = serve_admin(
        listener,
        AdminState::postgres(store, AdminConfig::default()),
        async {},
    )
    .await
    .err()
    .context("must refuse")?;
    assert!(err.to_string().contains("SLUICE_ADMIN_TOKEN"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_shows_the_diff_then_applies_as_one_version() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let admin = Admin::start(&pg.url()).await?;
    let mut doc = json!({"domain": "api", "rules": [
        {"id": "a", "key": ["ip"], "algorithm": "fixed_window", "limit": 10, "window": "1s"},
        {"id": "b", "key": ["ip"], "algorithm": "fixed_window", "limit": 20, "window": "1s"},
    ], "overrides": [{"identity": {"ip": "10.0.0.1"}, "exempt": true}]});
    let v = admin
        .write("POST", "/v1/rules:apply", Some(json!({"domains": [doc]})))
        .await?;
    assert_eq!(v, 1);
    doc["rules"][1]["limit"] = json!(30);
    doc["rules"].as_array_mut().context("rules")?.remove(0);
    let (s, dry) = admin
        .call(
            "POST",
            "/v1/rules:apply",
            Some(json!({"domains": [doc], "dry_run": true})),
        )
        .await?;
    assert_eq!(s, 200, "{dry}");
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["version"], 1, "a dry run writes nothing");
    let ops: Vec<(String, String)> = dry["changes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["op"].as_str().unwrap_or("").to_string(),
                c["key"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        ops,
        vec![("delete".into(), "a".into()), ("change".into(), "b".into())]
    );
    // A stale expect_version is refused.
    let (s, e) = admin
        .call(
            "POST",
            "/v1/rules:apply",
            Some(json!({"domains": [doc], "expect_version": 0})),
        )
        .await?;
    assert_eq!((s, e["error"]["code"].as_str()), (409, Some("CONFLICT")));
    let v = admin
        .write(
            "POST",
            "/v1/rules:apply",
            Some(json!({"domains": [doc], "expect_version": 1})),
        )
        .await?;
    assert_eq!(v, 2, "the whole apply is one version");
    let (_, exp) = admin.call("GET", "/v1/rules:export", None).await?;
    assert_eq!(exp["domains"][0]["rules"].as_array().map(Vec::len), Some(1));
    // An invalid document is refused as a whole with every problem.
    let bad = json!({"domain": "api", "rules": [
        {"id": "x", "key": ["ip"], "algorithm": "fixed_window", "limit": 0, "window": "1s"},
        {"id": "y", "key": ["ip"], "algorithm": "nope"},
    ]});
    let (s, e) = admin
        .call("POST", "/v1/rules:apply", Some(json!({"domains": [bad]})))
        .await?;
    assert_eq!(s, 422, "{e}");
    assert_eq!(
        e["error"]["problems"].as_array().map(Vec::len),
        Some(2),
        "{e}"
    );
    let (_, st) = admin.call("GET", "/v1/rules:status", None).await?;
    assert_eq!(st["version"], 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_get_distinct_gapless_versions() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let admin = Arc::new(Admin::start(&pg.url()).await?);
    admin
        .write("PUT", "/v1/rules/r0?domain=api", Some(login(100)))
        .await?;
    let mut tasks = Vec::new();
    for i in 1..=12 {
        let admin = admin.clone();
        tasks.push(tokio::spawn(async move {
            admin
                .write("PUT", &format!("/v1/rules/r{i}"), Some(login(100 + i)))
                .await
        }));
    }
    let mut versions = Vec::new();
    for t in tasks {
        versions.push(t.await??);
    }
    versions.sort_unstable();
    assert_eq!(versions, (2..=13).collect::<Vec<u64>>());
    assert_eq!(pg.psql("SELECT count(*) FROM sluice_history")?, "13");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_listen_cut_a_change_arrives_within_one_poll() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let admin = Admin::start(&pg.url()).await?;
    admin
        .write("PUT", "/v1/rules/login?domain=api", Some(login(100)))
        .await?;
    let proxy = TcpProxy::start(Postgres::server_addr())?;
    let mut cfg = source_config(&pg.url(), "d-pull");
    cfg.listen_url = Some(pg.url_via(proxy.port()));
    cfg.poll = Duration::from_secs(2);
    let source = PgSource::start(cfg).await?;
    let published = source.published();
    let (stop, rx) = watch::channel(false);
    let task = source.spawn(rx);
    // Wait for the LISTEN link, then cut it and keep it cut.
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.open_connections() == 0 {
        ensure!(Instant::now() < deadline, "the listener never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.cut();
    let v = admin
        .write("PUT", "/v1/rules/login", Some(login(50)))
        .await?;
    let took = wait_version(
        &published,
        v,
        Duration::from_secs(2) + Duration::from_millis(1500),
    )
    .await?;
    eprintln!("pull with LISTEN cut: live in {took:?} (poll 2s)");
    assert_eq!(limit_of(&published, "api", "login"), Some(50));
    assert!(
        proxy.accepted_connections() > 1,
        "the listener tried to reconnect"
    );
    // Restored: push works again.
    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.open_connections() == 0 {
        ensure!(Instant::now() < deadline, "the listener never reconnected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let v = admin
        .write("PUT", "/v1/rules/login", Some(login(60)))
        .await?;
    let took = wait_version(&published, v, Duration::from_secs(1)).await?;
    eprintln!("push after the listener reconnected: live in {took:?}");
    let _ = stop.send(true);
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_down_serves_the_cache_and_catches_up_when_back() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let admin = Admin::start(&pg.url()).await?;
    let v1 = admin
        .write("PUT", "/v1/rules/login?domain=api", Some(login(100)))
        .await?;
    let proxy = TcpProxy::start(Postgres::server_addr())?;
    let dir = std::env::temp_dir().join(format!("sluice-cache-down-{}", std::process::id()));
    let cache = dir.join("rules.json");
    let mut cfg = source_config(&pg.url_via(proxy.port()), "d-cache");
    cfg.cache = Some(cache.clone());
    cfg.poll = Duration::from_millis(500);

    // First run: loads from PostgreSQL and writes the cache.
    let first = PgSource::start(cfg.clone()).await?;
    assert!(!first.from_cache());
    assert_eq!(first.version(), v1);
    let published = first.published();
    let (stop, rx) = watch::channel(false);
    let task = first.spawn(rx);

    // PostgreSQL becomes unreachable: the running daemon keeps serving.
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(limit_of(&published, "api", "login"), Some(100));
    let _ = stop.send(true);
    task.await?;

    // A restart while it is down serves the cache.
    let restarted = PgSource::start(cfg.clone()).await?;
    assert!(restarted.from_cache());
    assert_eq!(restarted.version(), v1);
    let published = restarted.published();
    assert_eq!(limit_of(&published, "api", "login"), Some(100));

    // Without a cache, a restart while it is down fails with a clear error.
    let mut no_cache = cfg.clone();
    no_cache.cache = None;
    let err = PgSource::start(no_cache).await.err().context("must fail")?;
    assert!(err.to_string().contains("no rules to serve"), "{err}");

    // Meanwhile an operator changes a rule (the admin API reaches PostgreSQL directly).
    let v2 = admin
        .write("PUT", "/v1/rules/login", Some(login(20)))
        .await?;
    let (stop, rx) = watch::channel(false);
    let task = restarted.spawn(rx);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(published.version(), v1, "still cut: still the cache");

    // PostgreSQL is back: the daemon catches up and reports it.
    proxy.restore();
    wait_version(&published, v2, Duration::from_secs(10)).await?;
    assert_eq!(limit_of(&published, "api", "login"), Some(20));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, st) = admin.call("GET", "/v1/rules:status", None).await?;
        let d = &st["daemons"][0];
        if d["version"].as_u64() == Some(v2) && d["source"] == "postgres" {
            break;
        }
        ensure!(Instant::now() < deadline, "status never caught up: {st}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    task.await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_the_daemon_refuses_is_not_applied_and_is_reported() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let admin = Admin::start(&pg.url()).await?;
    let v1 = admin
        .write("PUT", "/v1/rules/login?domain=api", Some(login(100)))
        .await?;
    let source = PgSource::start(source_config(&pg.url(), "d-refuse")).await?;
    let published = source.published();
    let (stop, rx) = watch::channel(false);
    let task = source.spawn(rx);
    // Someone bypasses the admin API and writes a two-entry change, one of them invalid.
    pg.psql(
        "BEGIN;
         UPDATE sluice_version SET version = 2;
         INSERT INTO sluice_changes (version, actor, action) VALUES (2, 'psql', 'manual');
         INSERT INTO sluice_history (version, kind, domain, key, position, body) VALUES
           (2, 'rule', 'api', 'ok', 1, '{\"id\":\"ok\",\"key\":[],\"algorithm\":\"concurrency\",\"limit\":3}'),
           (2, 'rule', 'api', 'broken', 2, '{\"id\":\"broken\",\"key\":[],\"algorithm\":\"warp\"}');
         SELECT pg_notify('sluice_rules', '2');
         COMMIT;",
    )?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, st) = admin.call("GET", "/v1/rules:status", None).await?;
        let err = st["daemons"][0]["last_error"].as_str().unwrap_or("");
        if err.contains("broken") {
            assert!(err.contains("algorithm"), "{err}");
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the refusal was never reported: {st}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(published.version(), v1, "nothing of the change was applied");
    assert!(
        limit_of(&published, "api", "ok").is_none(),
        "not even its valid half"
    );
    let _ = stop.send(true);
    task.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_rollout_moves_identities_in_never_out() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let admin = Admin::start(&pg.url()).await?;
    let source = PgSource::start(source_config(&pg.url(), "d-rollout")).await?;
    let published = source.published();
    let (stop, rx) = watch::channel(false);
    let task = source.spawn(rx);
    let rule = |pct: u64| {
        json!({"key": ["api_key"], "algorithm": "fixed_window", "limit": 5, "window": "1s",
               "rollout_pct": pct})
    };
    let covered = |p: &Published| -> Result<Vec<bool>> {
        let set = p.load();
        let d = set.domain("api").context("domain")?;
        (0..2000)
            .map(|i| {
                let desc = Descriptors::new(vec![("api_key".into(), format!("k{i}"))])?;
                Ok(!applicable(d, &desc).is_empty())
            })
            .collect()
    };
    let mut prev: Option<Vec<bool>> = None;
    for (i, pct) in [10u64, 25, 50, 90, 100].into_iter().enumerate() {
        let path = if i == 0 {
            "/v1/rules/dark?domain=api"
        } else {
            "/v1/rules/dark"
        };
        let v = admin.write("PUT", path, Some(rule(pct))).await?;
        wait_version(&published, v, Duration::from_secs(1)).await?;
        let now = covered(&published)?;
        let n = now.iter().filter(|x| **x).count();
        let expected = 2000 * pct as usize / 100;
        assert!(n.abs_diff(expected) <= 100, "{pct}%: {n} of 2000 covered");
        if let Some(prev) = &prev {
            for (k, (was, is)) in prev.iter().zip(&now).enumerate() {
                assert!(
                    !was || *is,
                    "identity k{k} moved out when rollout rose to {pct}%"
                );
            }
        }
        prev = Some(now);
    }
    let _ = stop.send(true);
    task.await?;
    Ok(())
}
