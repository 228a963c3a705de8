//! One `sluiced` on a Redis from a config file, with the hot-key layer sized for a test.

use sluice_testkit::{Daemon, Metrics, RedisServer, TempDir, cargo_bin, free_ports};
use std::net::SocketAddr;
use std::time::Duration;

/// A healthy `sluiced` on a Redis; dropping it kills the daemon, then removes its files.
pub struct Node {
    /// The process: its logs, and SIGTERM for a test of shutdown.
    pub daemon: Daemon,
    /// The HTTP/JSON API and `/metrics` (127.0.0.1).
    pub http: SocketAddr,
    /// The gRPC port (127.0.0.1).
    pub grpc: SocketAddr,
    // After the daemon: its files are removed once it is gone.
    _dir: TempDir,
}

impl Node {
    /// The daemon's `/metrics` now; a failed scrape is a test failure.
    pub fn metrics(&self) -> Metrics {
        Metrics::scrape(self.http).expect("metrics")
    }
}

/// A daemon on `redis` with `rules` (a rules file's YAML), `extra` appended to its config
/// file. The store deadline is a second: on a busy test machine a few-ms deadline turns slow
/// calls into failures, and a lease call that timed out may still have taken its units
/// (stranded, counted by no one), which assertions on give-backs would then see.
pub fn start(redis: &RedisServer, rules: &str, extra: &str) -> Node {
    let ports = free_ports(2);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let grpc: SocketAddr = ([127, 0, 0, 1], ports[1]).into();
    let dir = TempDir::new(&format!("node-{}", ports[0])).expect("temp dir");
    let rules_file = dir.path().join("rules.yaml");
    std::fs::write(&rules_file, rules).expect("write rules");
    let config = dir.path().join("sluiced.yaml");
    std::fs::write(
        &config,
        format!(
            "http_addr: {http}\ngrpc_addr: {grpc}\nrules: {}\nstore: {{ kind: redis, url: \"{}\" }}\nstore_timeout_ms: 1000\nhot_keys: {{ deny_entries: 10000, leases: 1000 }}\n{extra}",
            rules_file.display(),
            redis.url(),
        ),
    )
    .expect("write config");
    let bin = cargo_bin("sluiced").expect("sluiced is built (cargo build -p sluiced --bins)");
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--config").arg(&config).env("RUST_LOG", "warn");
    let mut daemon = Daemon::from_command(cmd).expect("spawn sluiced");
    daemon
        .wait_http_ok(http, "/healthz", Duration::from_secs(20))
        .expect("sluiced becomes healthy");
    Node {
        daemon,
        http,
        grpc,
        _dir: dir,
    }
}
