//! The operator console (`/ui`) end to end in headless Chromium: a throwaway PostgreSQL
//! database, a real Redis, two real `sluiced` daemons (regions eu and us, gossiping), and the
//! page driven through chromedriver's WebDriver API. Signed in through the form, the page
//! shows the rules, both daemons at the current version, a breaker opened by pausing Redis
//! (SIGSTOP), the decision log's refusals and would-refusals and a held change, which a
//! second admin approves from the page. Without a session `/ui` is the sign-in form and the
//! API answers 401; a read token's session cannot write, nor can a write skip the CSRF value.
//!
//! Every wait is for an event (a metric, a DOM condition), each with a bound that turns a
//! hang into a failure. `SLUICE_SCREENSHOTS=docs/img` writes a PNG of each view
//! (docs/img/console-*.png, 1280 × 800).
//!
//! Needs `cargo build -p sluiced --bin sluiced` and `apt-get install -y chromium
//! chromium-driver`.

#[path = "console/webdriver.rs"]
mod webdriver;

use serde_json::{Value, json};
use sluice_testkit::{
    Daemon, Metrics, Postgres, RedisServer, TempDir, cargo_bin, free_ports, http_get, http_request,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use webdriver::Browser;

/// Turns a hang into a failure; never an assertion on how long something took.
const HANG: Duration = Duration::from_secs(90);
const ALICE: &str = "console-alice-admin-token";
const BOB: &str = "console-bob-admin-token";
const GRAFANA: &str = "console-grafana-read-token";
const GOSSIP_KEY: &str = "console e2e gossip key, 32 bytes";

struct Node {
    _daemon: Daemon,
    http: SocketAddr,
    admin: SocketAddr,
}

fn start(
    dir: &Path,
    pg: &str,
    redis: &RedisServer,
    id: &str,
    region: &str,
    gossip: [SocketAddr; 2],
) -> Node {
    let ports = free_ports(3);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let grpc: SocketAddr = ([127, 0, 0, 1], ports[1]).into();
    let admin: SocketAddr = ([127, 0, 0, 1], ports[2]).into();
    let config = dir.join(format!("{id}.yaml"));
    std::fs::write(
        &config,
        format!(
            "daemon_id: {id}\nregion: {region}\nhttp_addr: {http}\ngrpc_addr: {grpc}\nadmin_addr: {admin}\n\
             postgres: \"{pg}\"\nrules_cache: {cache}\npoll_s: 1\n\
             store: {{ kind: redis, url: \"{redis}\" }}\nstore_timeout_ms: 200\n\
             breaker_min_calls: 5\nbreaker_cool_off_ms: 600000\n\
             admin_tokens: [{{principal: alice, token: {ALICE}}}, {{principal: bob, token: {BOB}}}]\n\
             read_tokens: [{{principal: grafana, token: {GRAFANA}}}]\n\
             decision_log: {{ dir: {decisions} }}\n\
             gossip: {{ addr: \"{me}\", seeds: [\"{seed}\"], cluster_id: console-e2e }}\n",
            cache = dir.join(format!("{id}.cache")).display(),
            redis = redis.url(),
            decisions = dir.join(format!("{id}-decisions")).display(),
            me = gossip[0],
            seed = gossip[1],
        ),
    )
    .expect("write config");
    let bin =
        cargo_bin("sluiced").expect("sluiced is built (cargo build -p sluiced --bin sluiced)");
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .env("SLUICE_GOSSIP_KEY", GOSSIP_KEY);
    let mut daemon = Daemon::from_command(cmd).expect("spawn sluiced");
    daemon
        .wait_http_ok(http, "/healthz", HANG)
        .expect("sluiced becomes healthy");
    Node {
        _daemon: daemon,
        http,
        admin,
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// An admin API call with `token`: status and JSON answer.
fn admin(n: &Node, token: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let auth = bearer(token);
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let r = http_request(
        n.admin,
        method,
        path,
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    )
    .expect("admin request");
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

fn check(n: &Node, descriptors: &Value) -> Value {
    let body = json!({"domain": "api", "descriptors": descriptors}).to_string();
    let r = http_request(n.http, "POST", "/v1/limits:check", &[], body.as_bytes()).expect("check");
    serde_json::from_slice(&r.body).unwrap_or(Value::Null)
}

/// Busy figures of the global rule in `n`'s region: 20 checks each of two users.
fn orders(n: &Node) {
    for user in ["acme", "globex"] {
        for _ in 0..20 {
            check(n, &json!({"route": "GET /orders", "user": user}));
        }
    }
}

fn wait_version(n: &Node, version: u64) {
    let deadline = Instant::now() + HANG;
    loop {
        let v: Value = http_get(n.http, "/healthz")
            .ok()
            .and_then(|r| serde_json::from_slice(&r.body).ok())
            .unwrap_or(Value::Null);
        if v["rules_version"].as_u64() >= Some(version) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "version {version} not served: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn rules() -> Value {
    json!({"domains": [{"domain": "api", "rules": [
        {"id": "login", "match": {"route": "POST /login"}, "key": ["ip"],
         "algorithm": "fixed_window", "limit": 2, "window": "1m"},
        {"id": "per-user", "key": ["user"], "algorithm": "fixed_window", "limit": 1,
         "window": "1m", "mode": "shadow"},
        {"id": "search", "match": {"route": "GET /search"}, "key": ["user"],
         "algorithm": "token_bucket", "rate_per_s": 50, "burst": 100, "rollout_pct": 50,
         "enforce_on": {"daemons": ["ui-1"]}},
        {"id": "export", "key": ["user"], "algorithm": "fixed_window", "limit": 1000,
         "window": "1h"},
        {"id": "orders", "match": {"route": "GET /orders"}, "key": ["user"],
         "algorithm": "fixed_window", "limit": 200, "window": "1h", "scope": "global"},
    ]}]})
}

/// Where screenshots go (`SLUICE_SCREENSHOTS`, relative to the workspace root), if asked.
fn screenshots() -> Option<PathBuf> {
    let dir = std::env::var_os("SLUICE_SCREENSHOTS")?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    Some(dir)
}

fn shoot(b: &Browser, dir: &Option<PathBuf>, name: &str) {
    if let Some(dir) = dir {
        let png = b.screenshot();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(dir.join(format!("console-{name}.png")), png).expect("write screenshot");
    }
}

/// Shows view `view` and waits for its section to be the one displayed.
fn view(b: &Browser, name: &str) {
    b.click(&format!("#tabs button[data-view=\"{name}\"]"));
    b.wait_for(
        name,
        &format!("return !document.getElementById('view-{name}').hidden;"),
        "return document.title;",
        HANG,
    );
}

fn text_of(css: &str) -> String {
    format!("const e = document.querySelector('{css}'); return e ? e.textContent : '(no {css})';")
}

fn sign_in(b: &Browser, ui: &str, token: &str) {
    b.go(ui);
    b.wait_for(
        "the sign-in form",
        "return !!document.getElementById('login');",
        "return document.body.innerText;",
        HANG,
    );
    b.type_into("#token", token);
    b.click("#sign-in");
    b.wait_for(
        "the console after signing in",
        "return !!document.getElementById('tabs') && document.body.hasAttribute('data-refreshed');",
        "return document.body.innerText;",
        HANG,
    );
}

/// A write from the page's own script: status and error code.
fn page_write(b: &Browser, path: &str, with_csrf: bool, body: &str) -> Value {
    let headers = if with_csrf {
        "{'X-Sluice-CSRF': document.querySelector('meta[name=\"sluice-csrf\"]').content, 'Content-Type': 'application/json'}"
    } else {
        "{'Content-Type': 'application/json'}"
    };
    b.eval_async(&format!(
        "fetch('{path}', {{method: 'POST', headers: {headers}, body: '{body}'}})
           .then(async r => done({{status: r.status, body: await r.json().catch(() => null)}}))
           .catch(e => done({{status: 0, body: String(e)}}));"
    ))
}

#[test]
fn the_console_signs_in_shows_the_fleet_and_keeps_reads_from_writing() {
    webdriver::require_browser();
    let dir = TempDir::new("console").expect("temp dir");
    let pg = Postgres::throwaway().expect("PostgreSQL on 127.0.0.1:5432 (user postgres, trust)");
    let redis = RedisServer::start().expect("redis-server");
    let g = free_ports(2);
    let gossip: [SocketAddr; 2] = [([127, 0, 0, 1], g[0]).into(), ([127, 0, 0, 1], g[1]).into()];
    let one = start(dir.path(), &pg.url(), &redis, "ui-1", "eu", gossip);
    let two = start(
        dir.path(),
        &pg.url(),
        &redis,
        "ui-2",
        "us",
        [gossip[1], gossip[0]],
    );

    let (status, v) = admin(&one, ALICE, "POST", "/v1/rules:apply", &rules());
    assert_eq!(status, 200, "{v}");
    let version = v["version"].as_u64().expect("a version");
    wait_version(&one, version);
    wait_version(&two, version);
    // Refusals and shadow would-refusals for the decision log.
    for _ in 0..4 {
        check(
            &one,
            &json!({"route": "POST /login", "ip": "10.0.0.7", "user": "mallory"}),
        );
    }
    // Busy global figures in us, shipped to eu once each knows the other.
    for n in [&one, &two] {
        let deadline = Instant::now() + HANG;
        while Metrics::scrape(n.http)
            .expect("metrics")
            .get("sluice_gossip_live_regions")
            < Some(2.0)
        {
            assert!(
                Instant::now() < deadline,
                "gossip did not join the two regions"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    orders(&two);
    // A 100x tightening, forced: held for a second principal.
    let export = json!({"id": "export", "key": ["user"], "algorithm": "fixed_window", "limit": 10, "window": "1h"});
    let (status, held) = admin(&one, ALICE, "PUT", "/v1/rules/export?force=true", &export);
    assert_eq!(status, 202, "{held}");

    // No session: the sign-in form, and the API says 401.
    let ui = format!("http://{}/ui", one.admin);
    let r = http_get(one.admin, "/ui").expect("GET /ui");
    assert_eq!(r.status, 200);
    assert!(r.text().contains("id=\"login\""), "{}", r.text());
    for path in ["/v1/rules", "/v1/daemon", "/v1/decisions", "/v1/pending"] {
        assert_eq!(http_get(one.admin, path).expect(path).status, 401, "{path}");
    }
    let bad = http_request(one.admin, "POST", "/ui/login", &[], b"token=wrong").expect("login");
    assert_eq!(bad.status, 401);
    assert!(bad.header("set-cookie").is_none());

    let b = Browser::start(1280, 800);
    let shots = screenshots();
    b.go(&ui);
    b.wait_for(
        "the sign-in form",
        "return !!document.getElementById('token');",
        "return document.body.innerText;",
        HANG,
    );
    shoot(&b, &shots, "signin");

    // Bob, the second admin, signs in through the form.
    sign_in(&b, &ui, BOB);
    let cookies = b.cookies();
    let session = cookies
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "sluice_session")
        .unwrap_or_else(|| panic!("a session cookie: {cookies}"));
    assert_eq!(session["httpOnly"], true, "{session}");
    assert_eq!(session["sameSite"], "Strict", "{session}");
    assert!(!session["value"].as_str().unwrap_or_default().contains(BOB));
    let href = b.eval("return window.location.href;");
    assert!(!href.as_str().unwrap_or_default().contains(BOB), "{href}");

    // The rules, with the set's version.
    b.wait_for(
        "every rule",
        "return ['login', 'per-user', 'search', 'export', 'orders'].every(id => document.querySelector(`#rules-table tr[data-rule=\"${id}\"]`));",
        &text_of("#rules-table"),
        HANG,
    );
    let mode = b.eval(
        "return document.querySelector('#rules-table tr[data-rule=\"per-user\"]').dataset.mode;",
    );
    assert_eq!(mode, "shadow");
    let canary = b.eval(&text_of("#rules-table tr[data-rule=\"search\"]"));
    assert!(
        canary.as_str().unwrap_or_default().contains("ui-1"),
        "{canary}"
    );

    // Both daemons, at the current version.
    b.wait_for(
        "both daemons at the current version",
        &format!(
            "return ['ui-1', 'ui-2'].every(id => {{ const r = document.querySelector(`#daemons-table tr[data-daemon=\"${{id}}\"]`); return r && r.dataset.version === '{version}'; }});"
        ),
        &text_of("#daemons-table"),
        HANG,
    );

    // us's busy keys reach eu's page. A figure lives as long as its window: should the hour
    // turn meanwhile, us's next checks fill the new one.
    view(&b, "gossip");
    let shipped = "const us = document.querySelector('#gossip-table tr[data-region=\"us\"]'); return !!document.querySelector('#gossip-table tr[data-region=\"eu\"]') && !!us && us.textContent.includes('user=acme');";
    let deadline = Instant::now() + HANG;
    while b.eval(shipped) != Value::Bool(true) {
        assert!(
            Instant::now() < deadline,
            "us's busy keys not shown in eu's gossip view: {}",
            b.eval(&text_of("#view-gossip"))
        );
        orders(&two);
        std::thread::sleep(Duration::from_millis(200));
    }
    // The lag of us's packets, by region: bounds, not the empty cell.
    let lag = "const c = document.querySelector('#gossip-table td[data-lag=\"us\"]'); return c ? c.textContent : null;";
    let cell = b.eval(lag);
    assert!(
        cell.as_str().is_some_and(|t| t.contains("ms")),
        "us's lag not shown in eu's gossip view: {cell}"
    );
    shoot(&b, &shots, "gossip");

    // Redis paused: checks time out until shard 0's breaker opens (the metric says so).
    redis.pause().expect("SIGSTOP redis");
    let deadline = Instant::now() + HANG;
    loop {
        check(&one, &json!({"user": "breaker"}));
        let state = Metrics::scrape(one.http)
            .expect("metrics")
            .get("sluice_breaker_state{store=\"default\",shard=\"0\"}");
        if state == Some(2.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the breaker did not open: {state:?}"
        );
    }
    view(&b, "breakers");
    b.wait_for(
        "shard 0's breaker open on the page",
        "return !!document.querySelector('#breakers-table tr[data-shard=\"0\"][data-state=\"open\"]');",
        &text_of("#breakers-table"),
        HANG,
    );
    shoot(&b, &shots, "breakers");

    view(&b, "rules");
    shoot(&b, &shots, "rules");
    view(&b, "daemons");
    shoot(&b, &shots, "daemons");
    view(&b, "decisions");
    b.wait_for(
        "the refused identity and the shadow rule's would-refusals",
        "return !!document.querySelector('#refused-table tr[data-rule=\"login\"]') && !!document.querySelector('#shadow-table tr[data-rule=\"per-user\"]');",
        &text_of("#view-decisions"),
        HANG,
    );
    shoot(&b, &shots, "decisions");
    view(&b, "pending");
    let id = held["pending"]["id"].as_i64().expect("a pending id");
    b.wait_for(
        "the held change",
        &format!("return !!document.querySelector('#pending-table tr[data-pending=\"{id}\"]');"),
        &text_of("#pending-table"),
        HANG,
    );
    shoot(&b, &shots, "pending");
    redis.resume().expect("SIGCONT redis");

    // A write without the session's CSRF value is refused, even from the page itself.
    let r = page_write(&b, "/v1/rules:shadow-all", false, "{}");
    assert_eq!(r["status"], 403, "{r}");
    // Bob approves alice's change from the page.
    b.click(&format!(
        "#pending-table tr[data-pending=\"{id}\"] button[data-action=\"approve\"]"
    ));
    b.accept_dialog();
    b.wait_for(
        "the approved change gone from the pending list",
        &format!("return !document.querySelector('#pending-table tr[data-pending=\"{id}\"]');"),
        "return document.getElementById('view-pending').textContent + ' | ' + document.getElementById('banner').textContent;",
        HANG,
    );
    wait_version(&one, version + 1);

    // Sign-out: the sign-in form again, and the old session is gone.
    b.click("#sign-out");
    b.wait_for(
        "the sign-in form after signing out",
        "return !!document.getElementById('login');",
        "return document.body.innerText;",
        HANG,
    );

    // A read token's session reads, and cannot write.
    sign_in(&b, &ui, GRAFANA);
    b.wait_for(
        "the read-only badge",
        "return !document.getElementById('read-only').hidden && document.getElementById('principal').textContent === 'grafana';",
        "return document.querySelector('header').innerText;",
        HANG,
    );
    let r = page_write(
        &b,
        "/v1/rules:rollback",
        true,
        &format!("{{\"to_version\": {version}}}"),
    );
    assert_eq!(r["status"], 403, "{r}");
    assert_eq!(r["body"]["error"]["code"], "PERMISSION_DENIED", "{r}");
    let disabled = b.eval("return [...document.querySelectorAll('#history-table button[data-action=\"rollback\"]')].every(x => x.disabled);");
    assert_eq!(disabled, true);

    // Cookies gone: the page is the sign-in form.
    b.clear_cookies();
    b.go(&ui);
    b.wait_for(
        "the sign-in form without a cookie",
        "return !!document.getElementById('login');",
        "return document.body.innerText;",
        HANG,
    );
    drop(b);
    drop(two);
    drop(one);
}
