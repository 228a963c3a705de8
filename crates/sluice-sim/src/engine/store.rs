//! Store calls: one call through a daemon's guard, the replica's replay, and the calls a
//! daemon makes outside requests (its hot-key sweep's give-backs and syncs).

use super::Sim;
use super::events::Ev;
use super::region::Write;
use crate::metrics::Metrics;
use sluice_core::Micros;
use sluice_core::batch::{Call, CallResult, GiveBack};
use sluice_core::guard::{Admit, Ended, StoreGuard, Transition};
use sluice_core::hotkeys::gate::SyncCall;
use sluice_core::hotkeys::lease;
use sluice_core::time::SECOND;
use sluice_store::MemoryStore;
use smallvec::SmallVec;

/// What one store call through a daemon's guard came to.
pub(super) struct Guarded {
    /// `None`: the breaker refused it, nothing reached the store; else the store's answer
    /// (`None`: it failed).
    pub(super) res: Option<Option<CallResult>>,
    /// The breaker opened on its ending.
    pub(super) opened: bool,
}

/// The guards' counters of some calls, for the run's totals.
#[derive(Default)]
pub(super) struct GuardCounts {
    pub(super) refused: u64,
    pub(super) opened: u64,
}

impl GuardCounts {
    /// Counts one call; whether it reached the store.
    pub(super) fn count(&mut self, g: &Guarded) -> bool {
        self.refused += u64::from(g.res.is_none());
        self.opened += u64::from(g.opened);
        g.res.is_some()
    }

    /// Adds them to the run's totals and to store slot `slot`'s.
    pub(super) fn add_to(&self, m: &mut Metrics, slot: usize) {
        m.breaker_refused += self.refused;
        m.breaker_opened += self.opened;
        if let Some(s) = m.stores.get_mut(slot) {
            s.breaker_refused += self.refused;
            s.breaker_opened += self.opened;
        }
    }
}

/// One store call of a daemon through its guard, as the daemon's engine makes it
/// (`sluiced`'s `call_store`): refused while the breaker is open (nothing reaches the
/// store); otherwise sent to `store` (`None` while the store is out: the call fails as an
/// outage), its ending told to the guard, and the daemon's local buckets of that store
/// dropped when the breaker closes (a simulated store is one shard: they are all its).
pub(super) fn guarded(
    guard: &mut StoreGuard,
    local: &MemoryStore,
    now: Micros,
    store: Option<&MemoryStore>,
    call: &Call,
) -> Guarded {
    let Admit::Send(ticket) = guard.admit(now) else {
        return Guarded {
            res: None,
            opened: false,
        };
    };
    let (res, ended) = match store.map(|s| s.check_sync(call)) {
        Some(Ok(r)) => (Some(r), Ended::Answered),
        Some(Err(e)) => (
            None,
            Ended::Failed {
                outage: e.is_outage(),
            },
        ),
        None => (None, Ended::Failed { outage: true }),
    };
    let transition = guard.finish(now, ticket, ended);
    if transition == Some(Transition::Closed) {
        local.retain_keys(|_| false);
    }
    Guarded {
        res: Some(res),
        opened: transition == Some(Transition::Opened),
    }
}

impl<'a> Sim<'a> {
    /// Applies to each of region `r`'s replicas what it had received by `now`.
    pub(super) fn replicate(&mut self, r: usize, now: Micros) {
        for rs in &mut self.regions[r].stores {
            let Some(rep) = &mut rs.replica else {
                continue;
            };
            while rep.queue.front().is_some_and(|(at, _)| *at <= now) {
                // Same writes, same order, same states: the replica's answers are the
                // primary's; only its timing differs.
                match rep.queue.pop_front() {
                    Some((_, Write::Check(call))) => {
                        let _ = rep.store.check_sync(&call);
                    }
                    Some((_, Write::GiveBack(g))) => {
                        let _ = rep.store.give_back_sync(&g);
                    }
                    None => {}
                }
            }
        }
    }

    /// A daemon's hot-key sweep: cached refusals expire, and the give-backs of leases gone
    /// quiet, ended or retired go to the region's store.
    pub(super) fn sweep(&mut self, r: usize, d: usize, epoch: u32) {
        let now = self.now;
        let region = &mut self.regions[r];
        if !region.up || region.daemons[d].epoch != epoch {
            return;
        }
        let live = self.live[r].iter().filter(|u| **u).count() as u64;
        let local = now.saturating_add_signed(self.sc.clock_offset[r]);
        let hot = &mut region.daemons[d].hot;
        // The membership as it is now: a local share is the rule's numbers ÷ this.
        hot.set_daemons(live);
        let backs = hot.sweep(local);
        let syncs = hot.syncs(local);
        self.give_back(r, backs, now);
        self.sync(r, d, syncs, now);
        let next = now + lease::SWEEP;
        if next < self.sc.duration {
            self.push(
                next,
                Ev::Sweep {
                    region: r,
                    daemon: d,
                    epoch,
                },
            );
        }
    }

    /// Sends daemon `d`'s sync calls to region `r`'s store, in the layer's order, and reports
    /// each answer to its layer: failed while the store is out (the layer keeps the units
    /// pending for the next one). Each is a store call of the rules of its keys.
    pub(super) fn sync(&mut self, r: usize, d: usize, syncs: Vec<SyncCall>, now: Micros) {
        if syncs.is_empty() {
            return;
        }
        self.replicate(r, now);
        // Background calls reach only the main store (slot 0): a rule counting in a named
        // store cannot have a sync gate (`sluice_core::stores`).
        let store_ok = self.regions[r].up && now >= self.regions[r].stores[0].down_until;
        // The daemon's guard and layer run on its region's clock; the replica on the reference.
        let local = self.clock(r, now);
        let sec = (now / SECOND) as usize;
        for s in syncs {
            let region = &mut self.regions[r];
            let main = &mut region.stores[0];
            let ds = &mut region.daemons[d].stores[0];
            // A sync is a store call of the daemon's like any other: through its guard.
            let guarded = guarded(
                &mut ds.guard,
                &ds.local,
                local,
                store_ok.then_some(&main.store),
                &s.call,
            );
            let mut g = GuardCounts::default();
            let sent = u64::from(g.count(&guarded));
            g.add_to(&mut self.metrics, 0);
            let res = guarded.res.flatten();
            if res.is_some()
                && let Some(rep) = &mut main.replica
            {
                rep.queue
                    .push_back((now + rep.lag, Write::Check(s.call.clone())));
            }
            self.metrics.store_calls += sent;
            self.metrics.stores[0].calls += sent;
            let answered = res.is_some();
            let took = self.regions[r].daemons[d].hot.synced(&s, res, local);
            for ri in self.rules_of(&s.call) {
                let h = &mut self.metrics.hot[ri];
                h.store_calls += sent;
                if answered {
                    h.sync_calls += 1;
                    h.synced_units += took;
                } else {
                    h.sync_failures += 1;
                }
                let per_s = &mut self.metrics.calls_per_s[ri];
                if per_s.len() <= sec {
                    per_s.resize(sec + 1, (0, 0));
                }
                per_s[sec].1 += sent;
            }
        }
    }

    /// The rules (indices, each once, in call order) of a call's keys.
    pub(super) fn rules_of(&self, call: &Call) -> SmallVec<[usize; 4]> {
        let mut out = SmallVec::new();
        for it in &call.items {
            if let Some(ri) = sluice_core::keys::parse(&it.key)
                .and_then(|k| self.domain.rules.iter().position(|x| &*x.id == k.rule))
                && !out.contains(&ri)
            {
                out.push(ri);
            }
        }
        out
    }

    /// Hands give-backs to region `r`'s store, as the daemon's sweep does: each once, lost
    /// when the store is out (the daemon never resends one: it is not idempotent).
    pub(super) fn give_back(&mut self, r: usize, backs: Vec<GiveBack>, now: Micros) {
        if backs.is_empty() {
            return;
        }
        // In the layer's order: its maps are keyed by a fixed seed (`Layer::new`), so the
        // order, and the store's writes at its key bound, are the same on every rerun.
        self.replicate(r, now);
        // The main store's (slot 0): leases cannot count in a named store.
        let store_ok = now >= self.regions[r].stores[0].down_until;
        for g in backs {
            if let Some(ri) = sluice_core::keys::parse(&g.key)
                .and_then(|k| self.domain.rules.iter().position(|x| &*x.id == k.rule))
            {
                self.metrics.hot[ri].returned_units += g.units;
            }
            let main = &mut self.regions[r].stores[0];
            let res = if store_ok {
                main.store.give_back_sync(&g).ok()
            } else {
                None
            };
            match res {
                Some(written) => {
                    if written {
                        self.metrics.give_backs += 1;
                    } else {
                        self.metrics.give_backs_moot += 1;
                    }
                    if let Some(rep) = &mut main.replica {
                        rep.queue.push_back((now + rep.lag, Write::GiveBack(g)));
                    }
                }
                None => self.metrics.give_backs_failed += 1,
            }
        }
    }
}
