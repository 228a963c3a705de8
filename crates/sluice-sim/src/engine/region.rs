//! Regions and their daemons: what each holds (stores and replicas, views, a guard and
//! local buckets per store, the hot-key layer), their (re)starts and stops, and the
//! scenario's events that change them.

use super::events::Ev;
use super::observer::Rec;
use super::{DENY_ENTRIES, LEASES, Sim, ships, store_seed};
use crate::rng::Rng;
use crate::scenario::Event;
use sluice_core::Micros;
use sluice_core::batch::{Call, GiveBack};
use sluice_core::forward::Forwarder;
use sluice_core::guard::StoreGuard;
use sluice_core::hotkeys::{Layer, lease};
use sluice_core::merge::RemoteCounts;
use sluice_core::relay::Collected;
use sluice_store::MemoryStore;
use std::collections::VecDeque;

/// What a daemon keeps per store (the daemon's engine keeps these per store too: the main
/// store's in the engine, a named store's in its `stores::Backend`).
pub(super) struct DaemonStore {
    /// Its store guard, as the daemon's engine keeps one per store shard (a simulated store
    /// is one shard): the breaker, what a call's ending counts as, when `local` goes.
    pub(super) guard: StoreGuard,
    /// The local buckets that answer this store's `on_store_failure: local` rules while its
    /// calls fail.
    pub(super) local: MemoryStore,
}

pub(super) struct Daemon {
    pub(super) remote: RemoteCounts,
    /// Per store slot (0: the main store, then the scenario's named stores).
    pub(super) stores: Vec<DaemonStore>,
    /// The hot-key layer every store call of the daemon goes through.
    pub(super) hot: Layer,
    /// Incarnation: bumped when the daemon restarts (messages to an older one are dropped).
    pub(super) epoch: u32,
    /// Ship timer generation: bumped when the timer restarts (older ticks lapse).
    pub(super) timer: u32,
    /// Stopped by a `daemon_down` (its region's other daemons take its traffic).
    pub(super) up: bool,
    /// What its region's daemons collected to it to ship across (`region_sender`), the
    /// daemon's own table.
    pub(super) collected: Collected,
    /// Other origins' figures it heard as its region's receiver, and what went to each peer
    /// region (`region_sender` with a fan-out), the daemon's own table.
    pub(super) forwarder: Forwarder,
}

pub(super) struct Replica {
    pub(super) store: MemoryStore,
    pub(super) lag: Micros,
    pub(super) queue: VecDeque<(Micros, Write)>,
}

/// A write the primary executed, for the replica to replay.
pub(super) enum Write {
    /// A store call (as sent: a lease call carries its batch as cost).
    Check(Call),
    /// A lease's give-back.
    GiveBack(GiveBack),
}

/// One of a region's stores (its main one, or a named one): shared by its daemons.
pub(super) struct RegionStore {
    pub(super) store: MemoryStore,
    pub(super) replica: Option<Replica>,
    /// It answers nothing before this (a failover's outage).
    pub(super) down_until: Micros,
    /// When its last call executes: it serialises its calls.
    pub(super) last_exec: Micros,
    pub(super) latency_rng: Rng,
}

pub(super) struct Region {
    pub(super) up: bool,
    /// Per store slot (0: the main store, then the scenario's named stores).
    pub(super) stores: Vec<RegionStore>,
    pub(super) daemons: Vec<Daemon>,
    pub(super) phase_rng: Rng,
}

impl<'a> Sim<'a> {
    /// (Re)starts a region's daemons: empty tables, a fresh epoch (older timers and messages
    /// addressed to the previous incarnation are ignored), ship timers at random phases.
    pub(super) fn start_daemons(&mut self, r: usize) {
        let sc = self.sc;
        let name = &sc.regions[r];
        // The largest: a daemon stopped alone had its epoch bumped past the others'.
        let old_epoch = self.regions[r]
            .daemons
            .iter()
            .map(|d| d.epoch)
            .max()
            .unwrap_or(0);
        self.pipe.send(Rec::StartDaemons { region: r });
        // The daemons that stopped keep their counters in the run's totals; their leases and
        // cached refusals went with them (a crash: nothing was given back).
        for d in &self.regions[r].daemons {
            self.metrics.layer += &d.hot.stats();
            self.metrics.gate_lost_units += d.hot.gate_lost();
        }
        self.regions[r].daemons = (0..sc.daemons)
            .map(|_| Daemon {
                remote: RemoteCounts::new(name, sc.gossip.max_keys, store_seed(self.seed)),
                stores: (0..sc.store_slots())
                    .map(|s| DaemonStore {
                        guard: StoreGuard::for_store(sc.store_cfg(s).breaker, true),
                        local: MemoryStore::with_seed(100_000, store_seed(self.seed)),
                    })
                    .collect(),
                hot: Layer::new(DENY_ENTRIES, LEASES),
                epoch: old_epoch + 1,
                timer: 0,
                up: true,
                collected: Collected::default(),
                forwarder: Forwarder::default(),
            })
            .collect();
        self.live[r] = vec![true; sc.daemons];
        for d in &mut self.regions[r].daemons {
            d.hot.set_daemons(sc.daemons as u64);
        }
        for d in 0..sc.daemons {
            // Sweeps spread over the period, in daemon order (no random draw: the other
            // streams stay as they were).
            let at = self.now + lease::SWEEP * (d as Micros + 1) / sc.daemons as Micros;
            if at < sc.duration {
                self.push(
                    at,
                    Ev::Sweep {
                        region: r,
                        daemon: d,
                        epoch: old_epoch + 1,
                    },
                );
            }
        }
        for d in 0..sc.daemons {
            if !ships(self.sc, d) {
                continue;
            }
            let phase = self.phase(r);
            let at = self.now + phase.max(1);
            if at < sc.duration {
                self.push(
                    at,
                    Ev::Ship {
                        region: r,
                        daemon: d,
                        epoch: old_epoch + 1,
                        timer: 0,
                    },
                );
            }
        }
    }

    /// New epochs for a region's daemons (their pending timers lapse) and fresh timers at
    /// random phases of the current interval; tables are kept.
    pub(super) fn restart_ship_timers(&mut self, r: usize) {
        for d in 0..self.sc.daemons {
            let daemon = &mut self.regions[r].daemons[d];
            daemon.timer += 1;
            let (epoch, timer) = (daemon.epoch, daemon.timer);
            if !ships(self.sc, d) {
                continue;
            }
            let phase = self.phase(r);
            let at = self.now + phase.max(1);
            if at < self.sc.duration {
                self.push(
                    at,
                    Ev::Ship {
                        region: r,
                        daemon: d,
                        epoch,
                        timer,
                    },
                );
            }
        }
    }

    /// When, within the next interval, a daemon of region `r` first ships: the scenario's
    /// fixed phase for the region, or a random one.
    pub(super) fn phase(&mut self, r: usize) -> Micros {
        match &self.sc.gossip.phases {
            Some(p) => p[r] % self.interval,
            None => (self.regions[r].phase_rng.unit() * self.interval as f64) as Micros,
        }
    }

    /// A daemon that stops: gracefully, its leases are given back and its pending units
    /// synced, as the daemon's shutdown does; a crash loses both (the units a gate admitted
    /// and had not synced are counted, per rule, as lost).
    pub(super) fn stop_daemon(&mut self, r: usize, d: usize, graceful: bool, now: Micros) {
        let local = self.clock(r, now);
        let hot = &mut self.regions[r].daemons[d].hot;
        if graceful {
            let backs = hot.drain(local);
            let syncs = hot.drain_syncs(local);
            self.give_back(r, backs, now);
            self.sync(r, d, syncs, now);
        } else {
            for s in hot.drain_syncs(local) {
                for ri in self.rules_of(&s.call) {
                    self.metrics.hot[ri].gate_lost_units += s.call.cost;
                }
            }
        }
    }

    /// The end of the run: every daemon that is up drains its leases and pending sync units
    /// into its store, and the layers' counters join the run's.
    pub(super) fn drain_layers(&mut self) {
        let now = self.sc.duration;
        for r in 0..self.regions.len() {
            for d in 0..self.regions[r].daemons.len() {
                if self.regions[r].up && self.regions[r].daemons[d].up {
                    self.stop_daemon(r, d, true, now);
                }
                let hot = &self.regions[r].daemons[d].hot;
                let st = hot.stats();
                self.metrics.layer += &st;
                self.metrics.gate_lost_units += hot.gate_lost();
            }
        }
    }

    pub(super) fn scenario_event(&mut self, i: usize) {
        let now = self.now;
        let sc = self.sc;
        match &sc.events[i].1 {
            Event::RegionDown(r) => {
                // A crash: what the daemons' gates had not synced is lost.
                for d in 0..self.regions[*r].daemons.len() {
                    if self.regions[*r].daemons[d].up {
                        self.stop_daemon(*r, d, false, now);
                    }
                }
                self.up[*r] = false;
                let region = &mut self.regions[*r];
                region.up = false;
                for d in &mut region.daemons {
                    d.epoch += 1;
                }
            }
            Event::DaemonDown(r, d, graceful) => {
                let (r, d) = (*r, *d);
                if !self.regions[r].up || !self.regions[r].daemons[d].up {
                    return;
                }
                self.stop_daemon(r, d, *graceful, now);
                let daemon = &mut self.regions[r].daemons[d];
                daemon.up = false;
                // Its timers and the messages addressed to it lapse.
                daemon.epoch += 1;
                self.live[r][d] = false;
                // The others follow the membership at once (and at every sweep).
                let live = self.live[r].iter().filter(|u| **u).count() as u64;
                for x in self.regions[r].daemons.iter_mut().filter(|x| x.up) {
                    x.hot.set_daemons(live);
                }
            }
            Event::RegionUp(r, wipe) => {
                if self.regions[*r].up {
                    return;
                }
                self.up[*r] = true;
                self.regions[*r].up = true;
                if *wipe {
                    // Every store of the region comes back empty.
                    for (slot, rs) in self.regions[*r].stores.iter_mut().enumerate() {
                        let keys = sc.store_cfg(slot).max_keys;
                        rs.store = MemoryStore::with_seed(keys, store_seed(self.seed));
                        if let Some(rep) = &mut rs.replica {
                            rep.store = MemoryStore::with_seed(keys, store_seed(self.seed));
                            rep.queue.clear();
                        }
                    }
                }
                self.start_daemons(*r);
                self.resend_all(Some(*r));
            }
            Event::Partition(groups) => {
                let n = groups.len();
                for a in 0..n {
                    for b in 0..n {
                        self.cut[a][b] = groups[a] != groups[b];
                    }
                }
            }
            Event::Heal => {
                for row in &mut self.cut {
                    row.fill(false);
                }
                self.resend_all(None);
                self.track_heal();
            }
            Event::StoreFailover(r, slot, outage) => {
                self.replicate(*r, now);
                let rs = &mut self.regions[*r].stores[*slot];
                if let Some(rep) = rs.replica.take() {
                    let lost = rep.queue.len() as u64;
                    self.metrics.lost_writes += lost;
                    self.metrics.stores[*slot].lost_writes += lost;
                    rs.store = rep.store;
                }
                rs.down_until = now + outage;
            }
            Event::SetShip(iv, th) => {
                if let Some(iv) = iv {
                    self.interval = *iv;
                    // Daemons pick the new interval up at different moments: each restarts
                    // its timer at its own random phase of the new interval.
                    for r in 0..sc.regions.len() {
                        if self.regions[r].up {
                            self.restart_ship_timers(r);
                        }
                    }
                }
                if let Some(th) = th {
                    self.threshold = Some(*th);
                }
            }
        }
    }
}
