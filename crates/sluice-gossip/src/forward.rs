//! Forwarding between region senders (`gossip.fanout`): the daemon's shell around
//! [`sluice_core::forward`], which decides everything (peers, what is due to whom, along
//! which origin's tree).
//!
//! A region's receiver hears another region's figures (relayed by their sender, or
//! forwarded by a peer) and passes them on at once, as [`Hop::Forward`] packets that keep
//! the origin as their `region`, to the peers below it in that origin's tree. What the budget
//! held back, and resends heard again, go at the next receipt or at this daemon's interval.

use crate::pack::{self, Header};
use crate::relay::Routes;
use sluice_core::Micros;
use sluice_core::forward::Forwarder;
use sluice_core::relay::Hop;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The forwarding state of one daemon: the core's table, and the routes and membership of
/// its last interval (where peers are, which region each node id is in).
#[derive(Default)]
pub(crate) struct Forwarding {
    table: Mutex<Forwarder>,
    at: Mutex<(Routes, HashMap<String, String>)>,
}

impl Forwarding {
    /// The routes of this interval and the region of every live node id (what a forwarded
    /// packet's sender is resolved to); forgets figures nobody shipped for `keep`.
    pub(crate) fn set_routes(
        &self,
        routes: Routes,
        regions: HashMap<String, String>,
        now: Micros,
        keep: Micros,
    ) {
        let peers: Vec<&str> = routes.forward_to.iter().map(|(_, r)| r.as_str()).collect();
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sweep(now, keep, &peers);
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = (routes, regions);
    }

    /// Regions in the ring of the last interval's routes (0 when it does not forward).
    pub(crate) fn ring(&self) -> usize {
        self.at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .ring
            .len()
    }

    /// Whether this daemon forwards at all this interval.
    pub(crate) fn active(&self) -> bool {
        !self
            .at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .forward_to
            .is_empty()
    }

    /// Figures of `origin` a packet from node `sender` brought (`relayed`: by the origin's
    /// own sender), as (store key, window start, count).
    pub(crate) fn heard<'a>(
        &self,
        origin: &str,
        sender: &str,
        relayed: bool,
        figures: impl Iterator<Item = (&'a str, Micros, u64)>,
        now: Micros,
        max: usize,
    ) {
        let via = match relayed {
            true => Some(origin.to_string()),
            false => self
                .at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .1
                .get(sender)
                .cloned(),
        };
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        for (key, start, count) in figures {
            t.heard(origin, via.as_deref(), key, start, count, now, max);
        }
    }

    /// The payloads due now, each with its peer's address: per peer and origin, what
    /// [`Forwarder::take`] gives along the origin's tree within `max_bytes`, packed as
    /// [`Hop::Forward`] packets of the origin. Returns them with the figures they carry.
    pub(crate) fn due(
        &self,
        me: (&str, &str),
        now: Micros,
        resend_after: Micros,
        max_bytes: usize,
        max_payload: usize,
        seq: &AtomicU64,
    ) -> (Vec<(SocketAddr, Vec<u8>)>, usize) {
        let (region, node) = me;
        let at = self.at.lock().unwrap_or_else(|p| p.into_inner());
        let routes = &at.0;
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        let mut figures = 0;
        for (addr, peer) in &routes.forward_to {
            let due = t.take(peer, now, resend_after, max_bytes, |origin| {
                routes.passes_on(region, origin, peer)
            });
            for (origin, entries) in due {
                let first_seq = seq.load(Ordering::Relaxed);
                let header = Header {
                    region: &origin,
                    sender: node,
                    first_seq,
                    sent_ms: now / 1000,
                };
                let packed = pack::pack_hop(&entries, &header, Hop::Forward, max_payload);
                seq.fetch_add(packed.payloads.len() as u64, Ordering::Relaxed);
                figures += packed.figures;
                out.extend(packed.payloads.into_iter().map(|p| (*addr, p)));
            }
        }
        (out, figures)
    }
}
