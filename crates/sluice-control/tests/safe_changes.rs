//! Safe rule changes, against a real PostgreSQL. A second approver: a forced change more
//! than 10× tighter is held, not applied; its proposer cannot approve it; another principal
//! can, and it goes live in a `PgSource`'s published set, recorded with both principals; an
//! expired one cannot be approved; a rejected one is gone. A default rule: a domain with
//! `require_default` refuses a set without a catch-all, and a daemon keeps its last good set.

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use sluice_control::admin::{AdminConfig, AdminState, Token, serve_admin};
use sluice_control::postgres::{PgConfig, PgSource};
use sluice_control::store::Store;
use sluice_testkit::{Postgres, http_request};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

const ALICE: &str = "alice-secret";
const BOB: &str = "bob-secret";

/// Calls the admin API at `addr` with `token`; returns status and JSON body.
async fn call(
    addr: SocketAddr,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value)> {
    let (method, path, auth) = (
        method.to_string(),
        path.to_string(),
        format!("Bearer {token}"),
    );
    tokio::task::spawn_blocking(move || {
        let headers = [
            ("Content-Type", "application/json"),
            ("Authorization", auth.as_str()),
        ];
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let resp = http_request(addr, &method, &path, &headers, body.as_bytes())?;
        let v = serde_json::from_slice(&resp.body)
            .with_context(|| format!("{method} {path}: not JSON: {}", resp.text()))?;
        Ok((resp.status, v))
    })
    .await?
}

async fn start_admin(url: &str) -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let store = Arc::new(Store::new(url)?);
    store.migrate().await?;
    let auth = AdminConfig {
        admin: vec![Token::new("alice", ALICE), Token::new("bob", BOB)],
        read: vec![],
    };
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
    Ok((addr, tx))
}

fn login(limit: u64) -> Value {
    json!({"match": {"route": "POST /v1/login"}, "key": ["ip"], "algorithm": "sliding_window",
           "limit": limit, "window": "1m"})
}

async fn wait_limit(source: &sluice_control::Published, want: u64) -> Result<()> {
    let start = Instant::now();
    let mut rx = source.subscribe();
    loop {
        let set = source.load();
        let now = set
            .domain("api")
            .and_then(|d| d.rule("login"))
            .map(|r| r.params.limit());
        if now == Some(want) {
            return Ok(());
        }
        let left = Duration::from_secs(2).saturating_sub(start.elapsed());
        ensure!(!left.is_zero(), "limit {want} not live (serving {now:?})");
        let _ = tokio::time::timeout(left, rx.changed()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tightening_waits_for_a_second_principal() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let (admin, _stop_admin) = start_admin(&pg.url()).await?;
    let mut cfg = PgConfig::new(pg.url(), "d1", "test-region");
    cfg.connect_timeout = Duration::from_secs(1);
    let source = PgSource::start(cfg).await?;
    let published = source.published();
    let (_stop, stop_rx) = watch::channel(false);
    let _task = source.spawn(stop_rx);

    let (s, v) = call(
        admin,
        ALICE,
        "PUT",
        "/v1/rules/login?domain=api",
        Some(login(100)),
    )
    .await?;
    assert_eq!((s, v["version"].as_u64()), (200, Some(1)), "{v}");
    wait_limit(&published, 100).await?;

    // Without force: refused as before, saying what force does now.
    let (s, v) = call(admin, ALICE, "PUT", "/v1/rules/login", Some(login(1))).await?;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (422, Some("TIGHTENING_REFUSED")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("another principal"),
        "{v}"
    );

    // A dry run says it would be held; with force, it is held (202), not applied.
    let (s, v) = call(
        admin,
        ALICE,
        "PUT",
        "/v1/rules/login?force=true&dry_run=true",
        Some(login(1)),
    )
    .await?;
    assert_eq!((s, v["needs_approval"].as_bool()), (200, Some(true)), "{v}");
    let (s, held) = call(
        admin,
        ALICE,
        "PUT",
        "/v1/rules/login?force=true",
        Some(login(1)),
    )
    .await?;
    assert_eq!(s, 202, "{held}");
    assert_eq!(
        (held["changed"].as_bool(), held["version"].as_u64()),
        (Some(false), Some(1))
    );
    let id = held["pending"]["id"].as_i64().context("pending id")?;
    assert_eq!(held["pending"]["principal"], "alice");
    assert_eq!(held["pending"]["state"], "pending");
    assert!(
        held["pending"]["reasons"][0]
            .as_str()
            .unwrap_or("")
            .contains("100×"),
        "{held}"
    );
    let (_, list) = call(admin, BOB, "GET", "/v1/pending", None).await?;
    assert_eq!(list["pending"].as_array().map(Vec::len), Some(1), "{list}");
    let (_, cur) = call(admin, BOB, "GET", "/v1/rules/login", None).await?;
    assert_eq!(
        (cur["version"].as_u64(), cur["rule"]["limit"].as_u64()),
        (Some(1), Some(100))
    );

    // The proposer cannot approve it.
    let (s, v) = call(
        admin,
        ALICE,
        "POST",
        &format!("/v1/pending/{id}:approve"),
        None,
    )
    .await?;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("PERMISSION_DENIED")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("a different principal"),
        "{v}"
    );

    // Another principal can: a new version, live, recorded with both principals.
    let (s, v) = call(
        admin,
        BOB,
        "POST",
        &format!("/v1/pending/{id}:approve"),
        None,
    )
    .await?;
    assert_eq!(
        (s, v["version"].as_u64(), v["changed"].as_bool()),
        (200, Some(2), Some(true)),
        "{v}"
    );
    assert_eq!(
        (
            v["approved"]["state"].as_str(),
            v["approved"]["decided_by"].as_str()
        ),
        (Some("approved"), Some("bob"))
    );
    wait_limit(&published, 1).await?;
    let (_, log) = call(admin, BOB, "GET", "/v1/rules:history?limit=1", None).await?;
    let top = &log["changes"][0];
    assert_eq!(
        (top["principal"].as_str(), top["approved_by"].as_str()),
        (Some("alice"), Some("bob")),
        "{log}"
    );
    assert_eq!(top["detail"]["pending"].as_i64(), Some(id));
    let (_, hist) = call(admin, BOB, "GET", "/v1/rules/login/history", None).await?;
    assert_eq!(
        hist["history"][1]["principal"], "alice",
        "version 1: {hist}"
    );
    // Once decided it cannot be approved again.
    let (s, _) = call(
        admin,
        BOB,
        "POST",
        &format!("/v1/pending/{id}:approve"),
        None,
    )
    .await?;
    assert_eq!(s, 409);

    // An expired one cannot be approved (expiry by the database's clock, moved back here).
    let (s, held) = call(
        admin,
        BOB,
        "PUT",
        "/v1/rules/login?force=true",
        Some(login(1000)),
    )
    .await?;
    assert_eq!(s, 200, "a loosening is never held: {held}");
    wait_limit(&published, 1000).await?;
    let (s, held) = call(
        admin,
        BOB,
        "PUT",
        "/v1/rules/login?force=true",
        Some(login(2)),
    )
    .await?;
    assert_eq!(s, 202, "{held}");
    let late = held["pending"]["id"].as_i64().context("id")?;
    pg.psql(&format!(
        "UPDATE sluice_pending SET expires = now() - interval '1 second' WHERE id = {late}"
    ))?;
    let (s, v) = call(
        admin,
        ALICE,
        "POST",
        &format!("/v1/pending/{late}:approve"),
        None,
    )
    .await?;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (410, Some("EXPIRED")),
        "{v}"
    );
    let (_, list) = call(admin, ALICE, "GET", "/v1/pending", None).await?;
    assert_eq!(list["pending"].as_array().map(Vec::len), Some(0), "{list}");
    let (_, all) = call(admin, ALICE, "GET", "/v1/pending?all=true", None).await?;
    assert_eq!(all["pending"][0]["state"], "expired", "{all}");

    // A rejected one is gone; the rules never changed.
    let (s, held) = call(
        admin,
        BOB,
        "PUT",
        "/v1/rules/login?force=true",
        Some(login(3)),
    )
    .await?;
    assert_eq!(s, 202, "{held}");
    let dropped = held["pending"]["id"].as_i64().context("id")?;
    let (s, v) = call(
        admin,
        BOB,
        "POST",
        &format!("/v1/pending/{dropped}:reject"),
        None,
    )
    .await?;
    assert_eq!(
        (s, v["rejected"]["state"].as_str()),
        (200, Some("rejected")),
        "{v}"
    );
    let (s, _) = call(
        admin,
        ALICE,
        "POST",
        &format!("/v1/pending/{dropped}:approve"),
        None,
    )
    .await?;
    assert_eq!(s, 409);
    let (_, cur) = call(admin, ALICE, "GET", "/v1/rules/login", None).await?;
    assert_eq!(
        (cur["version"].as_u64(), cur["rule"]["limit"].as_u64()),
        (Some(3), Some(1000))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_apply_keeps_its_expect_version() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let (admin, _stop) = start_admin(&pg.url()).await?;
    let doc = |limit: u64| {
        json!({"domain": "api", "rules": [{"id": "login", "match": {"route": "POST /v1/login"},
        "key": ["ip"], "algorithm": "sliding_window", "limit": limit, "window": "1m"}]})
    };
    let (s, _) = call(
        admin,
        ALICE,
        "POST",
        "/v1/rules:apply",
        Some(json!({"domains": [doc(100)]})),
    )
    .await?;
    assert_eq!(s, 200);
    let (s, held) = call(
        admin,
        ALICE,
        "POST",
        "/v1/rules:apply",
        Some(json!({"domains": [doc(1)], "force": true, "expect_version": 1})),
    )
    .await?;
    assert_eq!(s, 202, "{held}");
    let id = held["pending"]["id"].as_i64().context("id")?;
    // Someone changes the rules meanwhile: the approval is a conflict, as the apply would be.
    let (s, _) = call(admin, BOB, "POST", "/v1/rules/login:shadow", None).await?;
    assert_eq!(s, 200);
    let (s, v) = call(
        admin,
        BOB,
        "POST",
        &format!("/v1/pending/{id}:approve"),
        None,
    )
    .await?;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("CONFLICT")),
        "{v}"
    );
    let (_, list) = call(admin, BOB, "GET", "/v1/pending", None).await?;
    assert_eq!(
        list["pending"][0]["id"].as_i64(),
        Some(id),
        "still pending: {list}"
    );
    Ok(())
}

/// `require_default: true` on the PostgreSQL source: a set without a catch-all is refused as
/// a whole through the admin API, and a daemon handed one anyway keeps its last good set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_requiring_a_default_refuses_a_set_without_one() -> Result<()> {
    let pg = Postgres::throwaway()?;
    let (admin, _stop_admin) = start_admin(&pg.url()).await?;
    let mut cfg = PgConfig::new(pg.url(), "d1", "test-region");
    cfg.connect_timeout = Duration::from_secs(1);
    let source = PgSource::start(cfg).await?;
    let published = source.published();
    let (_stop, stop_rx) = watch::channel(false);
    let _task = source.spawn(stop_rx);

    let all = json!({"id": "all", "key": ["ip"], "algorithm": "fixed_window", "limit": 1000, "window": "1m"});
    let mut login_rule = login(100);
    login_rule["id"] = json!("login");
    let doc = json!({"domain": "api", "require_default": true, "rules": [login_rule.clone(), all]});
    let (s, v) = call(
        admin,
        ALICE,
        "POST",
        "/v1/rules:apply",
        Some(json!({"domains": [doc]})),
    )
    .await?;
    assert_eq!(s, 200, "{v}");
    wait_limit(&published, 100).await?;
    let (_, export) = call(admin, ALICE, "GET", "/v1/rules:export", None).await?;
    assert_eq!(export["domains"][0]["require_default"], true, "{export}");

    // Without its catch-all the whole set is refused, naming why; nothing changes.
    let (s, v) = call(admin, ALICE, "DELETE", "/v1/rules/all", None).await?;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (422, Some("INVALID_RULES")),
        "{v}"
    );
    assert_eq!(v["error"]["problems"][0]["field"], "require_default", "{v}");
    let (s, v) = call(admin, ALICE, "POST", "/v1/rules/all:off", None).await?;
    assert_eq!(s, 422, "an off rule is no default: {v}");
    let bare = json!({"domain": "api", "require_default": true, "rules": [login_rule.clone()]});
    let (s, v) = call(
        admin,
        ALICE,
        "POST",
        "/v1/rules:apply",
        Some(json!({"domains": [bare]})),
    )
    .await?;
    assert_eq!(s, 422, "{v}");
    // The kill switch still works: a shadowed default is still a default.
    let (s, v) = call(admin, ALICE, "POST", "/v1/rules:shadow-all", None).await?;
    assert_eq!((s, v["version"].as_u64()), (200, Some(2)), "{v}");
    wait_version(&published, 2).await?;

    // A set written behind the admin API's back (the catch-all deleted by hand) is refused
    // by the daemon as a whole: it keeps serving version 2 and counts the refusal.
    pg.psql(
        "BEGIN;
         UPDATE sluice_version SET version = 3;
         INSERT INTO sluice_changes (version, actor, action) VALUES (3, 'psql', 'manual');
         DELETE FROM sluice_rules WHERE id = 'all';
         INSERT INTO sluice_history (version, kind, domain, key, position, body)
             VALUES (3, 'rule', 'api', 'all', 1, NULL);
         SELECT pg_notify('sluice_rules', '3');
         COMMIT;",
    )?;
    let start = Instant::now();
    while published.refusals() == 0 {
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "the daemon never refused version 3"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(published.version(), 2);
    assert!(
        published
            .load()
            .domain("api")
            .and_then(|d| d.rule("all"))
            .is_some()
    );
    // ...and reports why in its status row.
    let start = Instant::now();
    loop {
        let err = pg.psql("SELECT coalesce(last_error, '') FROM sluice_daemons")?;
        if err.contains("require_default") {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "status says {err:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn wait_version(p: &sluice_control::Published, v: u64) -> Result<()> {
    let start = Instant::now();
    let mut rx = p.subscribe();
    while p.version() < v {
        let left = Duration::from_secs(2).saturating_sub(start.elapsed());
        ensure!(
            !left.is_zero(),
            "version {v} not served (serving {})",
            p.version()
        );
        let _ = tokio::time::timeout(left, rx.changed()).await;
    }
    Ok(())
}
