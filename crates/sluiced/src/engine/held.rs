//! The engine's guards held across a store call's await, each undoing its part when a
//! check is cancelled mid-call (a dropped future runs no code after its await): the lease
//! call in flight, the breaker's ticket, and the view of the store a call goes to.

use sluice_core::guard::{StoreGuard, Ticket};
use sluice_store::{MemoryStore, Store};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::BREAKERS;

/// A lease call in flight: dropped before [`LeaseInFlight::done`] (the call failed, or the
/// check was cancelled), it tells the layer so the key's other requests stop waiting, and
/// wakes them either way.
pub(super) struct LeaseInFlight<'a> {
    hot: &'a crate::hot::HotKeys,
    shard: usize,
    pc: &'a sluice_core::decision::PlannedCall,
    armed: bool,
}

impl<'a> LeaseInFlight<'a> {
    pub(super) fn new(
        hot: &'a crate::hot::HotKeys,
        shard: usize,
        pc: &'a sluice_core::decision::PlannedCall,
        sent: sluice_core::hotkeys::Sent,
    ) -> LeaseInFlight<'a> {
        LeaseInFlight {
            hot,
            shard,
            pc,
            armed: matches!(sent, sluice_core::hotkeys::Sent::Lease { .. }),
        }
    }

    /// The layer has the answer: just wake the waiters.
    pub(super) fn done(mut self) {
        if self.armed {
            self.armed = false;
            self.hot.wake(self.shard).notify_waiters();
        }
    }
}

impl Drop for LeaseInFlight<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.hot.lock(self.shard).lease_failed(self.pc);
            self.hot.wake(self.shard).notify_waiters();
        }
    }
}

/// What a call to one store goes through: the main store's parts of the engine, or a named
/// store's ([`crate::stores::Backend`]).
pub(super) struct Target<'a> {
    pub(super) name: &'a str,
    pub(super) store: &'a dyn Store,
    pub(super) timeout: Duration,
    pub(super) guards: &'a [Mutex<StoreGuard>],
    pub(super) local: &'a MemoryStore,
    pub(super) latency: &'a crate::metrics::Histogram,
    pub(super) failures: &'a crate::stores::FailureAnswers,
    pub(super) journal: Option<&'a Arc<crate::journal::Journal>>,
}

impl Target<'_> {
    pub(super) fn shard(&self, key: &str) -> usize {
        self.store.shard_of(key) % BREAKERS
    }
}

/// A guard's ticket held across a store call's await. Dropped without [`HeldTicket::done`]
/// (the check was cancelled mid-call), it abandons the ticket, so a half-open probe frees its
/// place instead of leaking it.
pub(super) struct HeldTicket<'a> {
    guards: &'a [Mutex<StoreGuard>],
    shard: usize,
    ticket: Option<Ticket>,
}

impl<'a> HeldTicket<'a> {
    pub(super) fn new(
        guards: &'a [Mutex<StoreGuard>],
        shard: usize,
        ticket: Option<Ticket>,
    ) -> HeldTicket<'a> {
        HeldTicket {
            guards,
            shard,
            ticket,
        }
    }

    /// The ticket, for telling the guard how the call ended.
    pub(super) fn done(mut self) -> Option<Ticket> {
        self.ticket.take()
    }
}

impl Drop for HeldTicket<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take()
            && let Some(mut g) = crate::stores::lock(self.guards, self.shard)
        {
            g.abandon(t);
        }
    }
}
