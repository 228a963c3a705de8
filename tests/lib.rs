//! End-to-end tests of Sluice as an operator runs it: real `sluiced` processes over real
//! sockets, real Redis and PostgreSQL servers started on free ports. The binaries must be
//! built first (`cargo build --workspace --bins`, part of the README's test command).
//!
//! # Layout
//!
//! - `daemon.rs`: the daemon on its embedded default (memory store, YAML rules).
//! - `deploy.rs`: the Grafana dashboard and alert rules in deploy/ query only what a running
//!   daemon exports.
//! - `fleet.rs`: three regions × three daemons, one sender per region, a global limit held
//!   while a sender is killed.
//! - `failures.rs`: Redis paused, killed and restarted under a daemon; the quota journal.
//! - `hot_keys.rs`, `sync_gate.rs`: the hot-key layer (deny cache, leases, the sync gate and
//!   the local share) on a real Redis.
//! - `limits.rs`: resource limits and self-protection on the wire.
//! - `redis.rs`: daemons sharing one Redis, exact counts under contention.
//! - `regions.rs`: three regions gossiping, a global limit across them.
//! - `startup.rs`: a daemon that says it is ready is ready.
//! - `tls.rs`: TLS and mTLS on every listener.
//! - `common/`: what several of them share, in this library: bounded waits, one test at a
//!   time, a `sluiced` on a Redis, paced gRPC load.

pub mod common;
