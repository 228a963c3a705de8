//! `sluiced` started from a rules file and command-line flags alone, for tests of its clients.
//!
//! Tests of what talks to the daemon (the load generator, a client generated from Envoy's
//! protos) need a healthy `sluiced` on the memory store with their rules and nothing else: no
//! config file, no admin port. [`SluicedOnRules`] writes the rules to a [`TempDir`], starts
//! the built binary on free loopback ports and waits for `/healthz`, so those tests hold only
//! their rules and their assertions.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::daemon::{Daemon, cargo_bin};
use crate::ports::free_ports;
use crate::tempdir::TempDir;

/// How long a start may take before it is a failure (a debug build on a busy machine).
const READY: Duration = Duration::from_secs(20);

/// A healthy `sluiced` (`--rules`, `--http-addr`, `--grpc-addr`), on the memory store unless
/// its flags say otherwise.
///
/// Dropping it kills the daemon (its logs printed if the test is panicking), then removes the
/// rules file's directory.
#[derive(Debug)]
pub struct SluicedOnRules {
    /// The process, for its logs.
    pub daemon: Daemon,
    /// The HTTP/JSON API and `/metrics` (127.0.0.1).
    pub http: SocketAddr,
    /// The gRPC port: `sluice.v1` and Envoy's rate limit service (127.0.0.1).
    pub grpc: SocketAddr,
    // Declared after `daemon`: removed once the process that reads it is gone.
    _dir: TempDir,
}

impl SluicedOnRules {
    /// Starts `sluiced` on `rules` (a rules file's YAML) and waits until it is healthy.
    ///
    /// It logs at `warn`, so a load test's requests do not fill the captured logs. Errors
    /// when the binary is not built (`cargo build -p sluiced --bins`), cannot start, or is
    /// not healthy within 20 s.
    pub fn start(rules: &str) -> Result<Self> {
        Self::start_with_args(rules, &[])
    }

    /// [`SluicedOnRules::start`] with more flags after the defaults (`--redis <url>`, a store
    /// deadline), for tests of a client against a daemon on another store.
    pub fn start_with_args(rules: &str, extra_args: &[&str]) -> Result<Self> {
        let ports = free_ports(2);
        let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
        let grpc: SocketAddr = ([127, 0, 0, 1], ports[1]).into();
        let dir = TempDir::new(&format!("sluiced-rules-{}", ports[0]))?;
        let file = dir.path().join("rules.yaml");
        std::fs::write(&file, rules).with_context(|| format!("writing {}", file.display()))?;
        let file = file
            .to_str()
            .with_context(|| format!("a UTF-8 path: {}", file.display()))?;
        let (http_arg, grpc_arg) = (http.to_string(), grpc.to_string());
        let mut args = vec![
            "--rules",
            file,
            "--http-addr",
            &http_arg,
            "--grpc-addr",
            &grpc_arg,
        ];
        args.extend_from_slice(extra_args);
        let mut daemon = Daemon::spawn(cargo_bin("sluiced")?, &args, &[("RUST_LOG", "warn")])?;
        daemon.wait_http_ok(http, "/healthz", READY)?;
        Ok(Self {
            daemon,
            http,
            grpc,
            _dir: dir,
        })
    }
}
