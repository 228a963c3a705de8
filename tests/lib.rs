//! End-to-end tests of Sluice as an operator runs it: real `sluiced` processes over real
//! sockets, real Redis and PostgreSQL servers started on free ports. The binaries must be
//! built first (`cargo build --workspace --bins`, part of the README's test command).
//!
//! # Layout
//!
//! - `daemon.rs`: the daemon on its embedded default (memory store, YAML rules).
