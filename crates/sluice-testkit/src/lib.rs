//! Real external servers for Sluice's integration and end-to-end tests.
//!
//! Sluice's promises (atomic multi-bucket checks in Redis, Cluster hash tags, surviving a cut
//! PostgreSQL `LISTEN` link, graceful shutdown of `sluiced`) can only be checked against the
//! real thing, so this crate starts and controls real processes on free loopback ports instead
//! of mocking them. It is a dev-dependency only and, apart from [`grpc_wire`], uses little
//! beyond `std` and `anyhow`, so it can be called from sync tests and from async tests alike
//! (the calls block briefly).
//!
//! Tests never skip: when a tool is missing (`redis-server`, `redis-cli`, `psql`) or the shared
//! PostgreSQL is down, the call returns an error saying how to install or start it, and the test
//! fails loudly.
//!
//! # Layout
//!
//! - [`ports`]: [`free_port`] / [`free_ports`], distinct free loopback ports.
//! - [`resp`]: a tiny blocking RESP2 client ([`RespConn`], [`Reply`]) for test assertions.
//! - [`redis`]: [`RedisServer`], one throwaway `redis-server` (pause, resume, kill, restart).
//! - [`monitor`]: [`Monitor`], Sluice's script calls per key as Redis's `MONITOR` shows them.
//! - [`cluster`]: [`RedisCluster`] (N primaries × r replicas, live slot migration, a key's
//!   slot as the server computes it).
//! - [`proxy`]: [`TcpProxy`], a loopback forwarder whose links can be cut and restored.
//! - [`postgres`]: [`Postgres`], a throwaway database on the machine's shared server.
//! - [`daemon`]: [`Daemon`], a spawned project binary with captured logs, and [`cargo_bin`].
//! - [`sluiced`]: [`SluicedOnRules`], a healthy `sluiced` started from a rules file alone.
//! - [`tempdir`]: [`TempDir`], a scratch directory for a test's config files.
//! - [`http`]: [`http_request`], blocking HTTP/1.1 calls to the daemons' JSON APIs, on the
//!   workspace's one client (`sluice-http1`).
//! - [`metrics`]: [`Metrics`], a daemon's `/metrics` as one value per series.
//! - [`grpc_wire`]: raw HTTP/2 gRPC calls (async, on h2): a framed message, a call opened
//!   with any headers and its body left open, the answer's `grpc-status`.
//! - [`tls`]: [`TestPki`], a CA with server and client certificates made at test time.
//!
//! Everything started here is torn down on `Drop` (processes killed, temp dirs removed,
//! databases dropped), and nothing here ever stops the machine's shared Redis (6379) or
//! PostgreSQL (5432).

pub mod cluster;
pub mod daemon;
pub mod grpc_wire;
pub mod http;
pub mod metrics;
pub mod monitor;
pub mod ports;
pub mod postgres;
pub mod proxy;
pub mod redis;
pub mod resp;
pub mod sluiced;
pub mod tempdir;
pub mod tls;

mod process;

pub use cluster::{ClusterOptions, RedisCluster, RedisTls};
pub use daemon::{Daemon, cargo_bin};
pub use http::{HttpResponse, http_get, http_request};
pub use metrics::Metrics;
pub use monitor::{KeyCalls, Monitor};
pub use ports::{free_port, free_ports};
pub use postgres::{PgServer, Postgres};
pub use proxy::TcpProxy;
pub use redis::RedisServer;
pub use resp::{Reply, RespConn};
pub use sluiced::SluicedOnRules;
pub use tempdir::TempDir;
pub use tls::TestPki;
