//! Exercises the kit against the real servers it controls: `redis-server`, a Redis Cluster
//! built with `redis-cli`, the TCP proxy, and the machine's shared PostgreSQL.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use sluice_testkit::{Postgres, RedisCluster, RedisServer, Reply, RespConn, TcpProxy};

#[test]
fn redis_server_set_get_pause_resume_restart_kill() -> Result<()> {
    let mut redis = RedisServer::start()?;
    assert_ne!(redis.port(), 6379, "must never use the shared Redis");
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}/", redis.port()));

    assert_eq!(redis.cmd(&["SET", "k", "v"])?, "OK");
    assert_eq!(redis.cmd(&["GET", "k"])?, "v");
    assert_eq!(redis.cmd(&["GET", "missing"])?, "(nil)");
    assert_eq!(redis.cmd(&["INCRBY", "n", "5"])?, "5");
    redis.cmd(&["RPUSH", "l", "a", "b", "c"])?;
    assert_eq!(redis.cmd(&["LRANGE", "l", "0", "-1"])?, "a\nb\nc");
    let err = redis
        .cmd(&["INCR", "k"])
        .err()
        .ok_or_else(|| anyhow!("INCR on a string must fail"))?;
    assert!(format!("{err:#}").contains("not an integer"), "{err:#}");
    assert!(matches!(redis.cmd_reply(&["INCR", "k"])?, Reply::Error(_)));

    redis.pause()?;
    assert!(redis.is_paused());
    let stalled = redis.cmd_timeout(&["PING"], Duration::from_millis(200));
    assert!(
        stalled.is_err(),
        "a paused server must not answer: {stalled:?}"
    );
    redis.resume()?;
    assert_eq!(
        redis.cmd_timeout(&["PING"], Duration::from_millis(2000))?,
        "PONG"
    );

    let port = redis.port();
    redis.restart()?;
    assert_eq!(redis.port(), port);
    assert_eq!(
        redis.cmd(&["GET", "k"])?,
        "(nil)",
        "restart must start empty"
    );
    assert_eq!(redis.cmd(&["SET", "k", "again"])?, "OK");

    // Paused then killed: kill must still work.
    redis.pause()?;
    redis.kill()?;
    assert!(redis.pid().is_none());
    assert!(
        redis
            .cmd_timeout(&["PING"], Duration::from_millis(500))
            .is_err()
    );
    Ok(())
}

#[test]
fn redis_server_drop_while_paused_cleans_up() -> Result<()> {
    let redis = RedisServer::start_with_args(&["--maxmemory", "10mb"])?;
    assert!(
        redis
            .cmd(&["CONFIG", "GET", "maxmemory"])?
            .ends_with("10485760")
    );
    let dir = redis.dir().to_path_buf();
    let port = redis.port();
    redis.pause()?;
    drop(redis);
    assert!(!dir.exists(), "temp dir {} must be removed", dir.display());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert!(std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err());
    Ok(())
}

#[test]
fn redis_cluster_slots_and_live_migration() -> Result<()> {
    let cluster = RedisCluster::start(3, 1)?;
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.urls().len(), 6);
    let primaries = cluster.primaries()?;
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    let ids = cluster.primary_ids()?;
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| id.len() == 40), "{ids:?}");

    // The slot as the server computes it: the specification's value, one slot per hash tag.
    assert_eq!(cluster.slot_of("foo")?, 12182);
    assert_eq!(
        cluster.slot_of("{user1000}.following")?,
        cluster.slot_of("{user1000}.followers")?
    );
    let tagged = cluster.slot_of("sluice:{api_key=k_bigcorp}:pay-burst")?;
    assert_eq!(tagged, cluster.slot_of("api_key=k_bigcorp")?);
    assert_eq!(
        cluster.node_for_key("api_key=k_bigcorp")?,
        cluster.node_for_slot(tagged)?
    );

    // Fill one slot with more keys than one MIGRATE batch, then move it live.
    let slot = cluster.slot_of("{migrate-me}")?;
    let from = cluster.node_for_slot(slot)?;
    assert!(primaries.contains(&from));
    let to = primaries
        .iter()
        .copied()
        .find(|&p| p != from)
        .ok_or_else(|| anyhow!("need a second primary"))?;
    let keys = 150;
    let mut conn = cluster.node(from).connect()?;
    for i in 0..keys {
        conn.cmd(&["SET", &format!("{{migrate-me}}:{i}"), &i.to_string()])?;
    }
    let slot_s = slot.to_string();
    assert_eq!(
        cluster
            .node(from)
            .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot_s])?,
        keys.to_string()
    );

    let moved = cluster.migrate_slot(slot, from, to)?;
    assert_eq!(moved, keys);
    assert_eq!(
        cluster
            .node(to)
            .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot_s])?,
        keys.to_string()
    );
    assert_eq!(
        cluster
            .node(from)
            .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot_s])?,
        "0"
    );
    assert_eq!(cluster.node_for_slot(slot)?, to);
    assert_eq!(cluster.node(to).cmd(&["GET", "{migrate-me}:42"])?, "42");
    match cluster.node(from).cmd_reply(&["GET", "{migrate-me}:42"])? {
        Reply::Error(e) => assert!(e.starts_with("MOVED"), "{e}"),
        other => panic!("expected MOVED from the old owner, got {other:?}"),
    }
    Ok(())
}

#[test]
fn small_cluster_is_joined_by_hand_and_survives_a_killed_replica() -> Result<()> {
    // redis-cli refuses fewer than 3 primaries; the kit joins these itself.
    let mut cluster = RedisCluster::start(1, 1)?;
    assert_eq!(cluster.primaries()?, vec![0]);
    assert_eq!(cluster.node_for_slot(0)?, 0);
    assert_eq!(cluster.node_for_slot(16383)?, 0);
    assert_eq!(cluster.node(0).cmd(&["SET", "{t}a", "1"])?, "OK");
    cluster.kill_node(1)?;
    cluster.wait_state_ok(Duration::from_secs(10))?;
    assert_eq!(cluster.node(0).cmd(&["GET", "{t}a"])?, "1");
    Ok(())
}

#[test]
fn tcp_proxy_forwards_and_cut_breaks_links() -> Result<()> {
    let redis = RedisServer::start()?;
    let proxy = TcpProxy::start(redis.addr())?;
    assert_ne!(proxy.port(), redis.port());

    let mut conn = RespConn::connect(proxy.addr(), Duration::from_secs(2))?;
    assert_eq!(conn.cmd(&["SET", "through", "proxy"])?, "OK");
    assert_eq!(redis.cmd(&["GET", "through"])?, "proxy");
    assert_eq!(proxy.open_connections(), 1);

    proxy.cut();
    assert!(proxy.is_cut());
    assert!(
        conn.cmd(&["PING"]).is_err(),
        "an existing link must break on cut"
    );
    let fresh = RespConn::connect(proxy.addr(), Duration::from_millis(500))
        .and_then(|mut c| c.cmd(&["PING"]));
    assert!(fresh.is_err(), "new links must fail while cut: {fresh:?}");
    // The server itself is untouched.
    assert_eq!(redis.cmd(&["PING"])?, "PONG");

    proxy.restore();
    let mut again = RespConn::connect(proxy.addr(), Duration::from_secs(2))?;
    assert_eq!(again.cmd(&["GET", "through"])?, "proxy");
    assert!(proxy.accepted_connections() >= 3);
    Ok(())
}

fn psql_url(url: &str, sql: &str) -> Result<String> {
    let out = Command::new("psql")
        .args(["-X", "-At", url, "-c", sql])
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .context("running psql")?;
    ensure!(
        out.status.success(),
        "psql {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn postgres_throwaway_database_lifecycle() -> Result<()> {
    let db = Postgres::throwaway()?;
    assert!(db.name().starts_with("sluice_test_"));
    assert_eq!(
        db.url(),
        format!("postgres://postgres@127.0.0.1:5432/{}", db.name())
    );
    assert_eq!(psql_url(&db.url(), "SELECT current_database()")?, db.name());
    db.psql("CREATE TABLE rules (id text primary key, n int)")?;
    db.psql("INSERT INTO rules VALUES ('a', 1), ('b', 2)")?;
    assert_eq!(db.psql("SELECT id, n FROM rules ORDER BY id")?, "a|1\nb|2");

    // Through a proxy, as the LISTEN-cut tests do.
    let proxy = TcpProxy::start(Postgres::server_addr())?;
    assert_eq!(
        psql_url(&db.url_via(proxy.port()), "SELECT count(*) FROM rules")?,
        "2"
    );
    proxy.cut();
    assert!(psql_url(&db.url_via(proxy.port()), "SELECT 1").is_err());
    proxy.restore();

    // Dropping removes the database, even with a session still open.
    let name = db.name().to_owned();
    let holder = sluice_testkit::Daemon::spawn(
        "psql",
        &["-X", &db.url(), "-c", "SELECT pg_sleep(30)"],
        &[],
    )?;
    std::thread::sleep(Duration::from_millis(300));
    drop(db);
    drop(holder);
    let other = Postgres::throwaway()?;
    let left = other.psql(&format!(
        "SELECT count(*) FROM pg_database WHERE datname = '{name}'"
    ))?;
    assert_eq!(left, "0");
    Ok(())
}
