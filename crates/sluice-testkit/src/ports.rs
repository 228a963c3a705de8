//! Free loopback ports.
//!
//! Tests run in parallel (threads in one test binary, and several binaries at once), so every
//! server gets its own port instead of a fixed one. A port is found by binding
//! `127.0.0.1:0` and reading what the kernel chose; within this process a port is never handed
//! out twice, so two servers started by concurrent tests cannot be given the same port.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, Result, bail};

/// How many times we ask the kernel before giving up (only reached when the machine is out of
/// ephemeral ports).
const ATTEMPTS: usize = 1000;

fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static SET: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    SET.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Records `port` as handed out; false if it already was.
fn claim(port: u16) -> bool {
    let mut set = handed_out()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    set.insert(port)
}

fn bind_any() -> Result<TcpListener> {
    TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .context("binding 127.0.0.1:0 to find a free port")
}

/// A free TCP port on 127.0.0.1, never returned before by this process.
///
/// Use it to give a server under test its own port. The port is free when returned; another
/// process could still take it before the server binds, which the starters in this crate
/// detect and retry where they can.
///
/// # Panics
///
/// Panics if the loopback interface cannot be bound at all (the machine is out of ports), which
/// makes the calling test fail loudly. Use [`try_free_port`] to get an error instead.
#[must_use]
pub fn free_port() -> u16 {
    match try_free_port() {
        Ok(port) => port,
        Err(e) => panic!("sluice-testkit: no free loopback port: {e:#}"),
    }
}

/// Like [`free_port`], returning an error instead of panicking.
///
/// For callers that propagate `anyhow::Result` anyway.
pub fn try_free_port() -> Result<u16> {
    Ok(try_free_ports(1)?[0])
}

/// `n` distinct free TCP ports on 127.0.0.1.
///
/// All `n` listeners are held open together before being dropped, so the ports are distinct
/// even without the process-wide bookkeeping; use it to lay out a multi-server topology.
///
/// # Panics
///
/// Panics like [`free_port`] when no port can be found.
#[must_use]
pub fn free_ports(n: usize) -> Vec<u16> {
    match try_free_ports(n) {
        Ok(ports) => ports,
        Err(e) => panic!("sluice-testkit: no {n} free loopback ports: {e:#}"),
    }
}

/// Like [`free_ports`], returning an error instead of panicking.
///
/// For callers that propagate `anyhow::Result` anyway.
pub fn try_free_ports(n: usize) -> Result<Vec<u16>> {
    pick(n, |_| true)
}

/// `n` distinct free ports `p` such that `p + 10000` (the Redis Cluster bus port) is free too.
pub(crate) fn free_cluster_ports(n: usize) -> Result<Vec<u16>> {
    pick(n, |port| {
        port <= u16::MAX - 10_000
            && TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port + 10_000))).is_ok()
            // Reserve the bus port too, so it is never handed out as a server port.
            && claim(port + 10_000)
    })
}

fn pick(n: usize, accept: impl Fn(u16) -> bool) -> Result<Vec<u16>> {
    let mut held = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    let mut attempts = 0;
    while ports.len() < n {
        attempts += 1;
        if attempts > ATTEMPTS * n.max(1) {
            bail!("gave up after {attempts} attempts to find {n} free loopback ports");
        }
        let listener = bind_any()?;
        let port = listener
            .local_addr()
            .context("reading the port of a 127.0.0.1:0 listener")?
            .port();
        if accept(port) && claim(port) {
            ports.push(port);
        }
        // Keep it bound until all are chosen so the kernel does not hand it out again.
        held.push(listener);
    }
    drop(held);
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_bindable() -> Result<()> {
        let ports = free_ports(20);
        let set: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(set.len(), 20);
        let again = free_port();
        assert!(!set.contains(&again), "a port was handed out twice");
        for port in ports {
            TcpListener::bind(("127.0.0.1", port))
                .with_context(|| format!("port {port} should be free"))?;
        }
        Ok(())
    }

    #[test]
    fn cluster_ports_leave_room_for_the_bus() -> Result<()> {
        for port in free_cluster_ports(6)? {
            assert!(port <= u16::MAX - 10_000);
        }
        Ok(())
    }
}
