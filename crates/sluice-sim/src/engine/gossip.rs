//! Gossip: a daemon's ship timer asks the observer what to send, the shipment fans out over
//! the links (delay, loss, partitions), and a delivery merges into the receivers' view.

use super::events::{Ev, Queued};
use super::{Sim, view};
use crate::scenario::Delivery;
use sluice_core::Micros;
use sluice_core::ship::{Batch, ShipEntry, message_bytes};
use std::rc::Rc;

pub(super) struct Msg {
    pub(super) from: usize,
    pub(super) entries: Vec<ShipEntry>,
}

/// Gossip counters.
#[derive(Clone, Debug, Default)]
pub struct GossipCounters {
    /// Bytes sent (estimated protobuf), per message per receiving daemon.
    pub bytes: u64,
    /// Bytes sent by each region.
    pub bytes_by_region: Vec<u64>,
    /// Messages sent (one per receiving daemon).
    pub messages: u64,
    /// Non-empty shipments.
    pub batches: u64,
    /// Entries shipped.
    pub entries: u64,
    /// Most entries in one shipment.
    pub max_batch: u64,
    /// Busy figures deferred by the budget (summed over intervals).
    pub deferred: u64,
    /// Messages lost at random.
    pub lost: u64,
    /// Messages dropped by a partition.
    pub cut: u64,
    /// Most remote slots one daemon held.
    pub max_remote_slots: usize,
    /// Reports dropped at a daemon's key bound.
    pub remote_full: u64,
}

/// A shipment waiting for the observer's answer.
pub(super) struct Shipping {
    pub(super) region: usize,
    /// When it was shipped.
    pub(super) now: Micros,
    /// The sequence number before its deliveries' (reserved at the ship).
    pub(super) seq: u64,
}

impl<'a> Sim<'a> {
    pub(super) fn ship(&mut self, r: usize, d: usize, epoch: u32, timer: u32) {
        let now = self.now;
        let sc = self.sc;
        let n = sc.regions.len();
        {
            let region = &self.regions[r];
            let daemon = &region.daemons[d];
            if !region.up || daemon.epoch != epoch || daemon.timer != timer {
                return;
            }
        }
        // What it selects and sweeps, it does on its region's clock.
        let local = self.clock(r, now);
        self.pipe.select(r, d, local);
        let daemon = &mut self.regions[r].daemons[d];
        if view(sc, d) == d {
            daemon.remote.sweep(local);
        }
        // The deliveries' sequence numbers are taken now, so they order against other events
        // exactly as if they were queued now.
        let receivers = match sc.gossip.delivery {
            Delivery::PerDaemon => sc.daemons,
            Delivery::PerRegion => 1,
        };
        let seq = self.seq;
        self.seq += (n * receivers) as u64;
        self.shipping_due = self.shipping_due.min(now + self.first_delivery[r]);
        self.shipping.push_back(Shipping {
            region: r,
            now,
            seq,
        });
        let next = now + self.interval;
        if next < sc.duration {
            self.push(
                next,
                Ev::Ship {
                    region: r,
                    daemon: d,
                    epoch,
                    timer,
                },
            );
        }
    }

    /// Sends the shipments asked for so far, oldest first: waits for the observer's answers
    /// and queues their deliveries. The loop calls it before anything a shipment could change
    /// or be delivered to.
    pub(super) fn send_shipments(&mut self) {
        while let Some(s) = self.shipping.pop_front() {
            let batch = self.pipe.selected();
            self.send_shipment(s, batch);
        }
        self.shipping_due = Micros::MAX;
    }

    pub(super) fn send_shipment(&mut self, s: Shipping, batch: Batch) {
        let Shipping {
            region: r,
            now,
            mut seq,
        } = s;
        let sc = self.sc;
        let n = sc.regions.len();
        let g = &mut self.gossip;
        g.deferred += batch.deferred as u64;
        if !batch.entries.is_empty() {
            g.batches += 1;
            g.entries += batch.entries.len() as u64;
            g.max_batch = g.max_batch.max(batch.entries.len() as u64);
            let bytes = message_bytes(&sc.regions[r], batch.bytes) as u64;
            let msg = Rc::new(Msg {
                from: r,
                entries: batch.entries,
            });
            for r2 in 0..n {
                if r2 == r || !self.regions[r2].up {
                    continue;
                }
                // Per region: one draw for all the region's daemons, delivered to the first
                // (whose table they share); the traffic is still one copy per daemon.
                let (receivers, copies) = match sc.gossip.delivery {
                    Delivery::PerDaemon => (sc.daemons, 1),
                    Delivery::PerRegion => (1, sc.daemons as u64),
                };
                for d2 in 0..receivers {
                    let g = &mut self.gossip;
                    g.messages += copies;
                    g.bytes += bytes * copies;
                    g.bytes_by_region[r] += bytes * copies;
                    if self.cut[r][r2] {
                        g.cut += copies;
                        continue;
                    }
                    let link = sc.gossip.links[r][r2];
                    let rng = &mut self.link_rng[r * n + r2];
                    if rng.chance(link.loss) {
                        g.lost += copies;
                        continue;
                    }
                    let delay = link.delay.sample(rng);
                    let epoch = self.regions[r2].daemons[d2].epoch;
                    seq += 1;
                    self.heap.push(Queued {
                        at: now + delay,
                        seq,
                        ev: Ev::Deliver {
                            region: r2,
                            daemon: d2,
                            epoch,
                            msg: msg.clone(),
                        },
                    });
                }
            }
        }
    }

    pub(super) fn deliver_to(&mut self, r: usize, d: usize, epoch: u32, msg: &Msg) {
        let now = self.now;
        let sc = self.sc;
        // Every daemon that reads the table this delivery merges into.
        let readers = (0..sc.daemons).filter(|x| view(sc, *x) == d);
        if self.cut[msg.from][r] {
            self.gossip.cut += readers.count() as u64;
            return;
        }
        let region = &mut self.regions[r];
        if !region.up || region.daemons[d].epoch != epoch {
            return;
        }
        let from = &self.sc.regions[msg.from];
        // The receiver judges a figure's window (expired, too far ahead) by its own clock.
        let local = now.saturating_add_signed(sc.clock_offset[r]);
        let daemon = &mut region.daemons[d];
        for e in &msg.entries {
            let Some(rule) = sluice_core::keys::parse(&e.key).and_then(|k| {
                self.domain
                    .rule(k.rule)
                    .filter(|r| r.params.kind() == k.kind)
            }) else {
                continue;
            };
            if daemon
                .remote
                .merge(from, &e.key, &rule.params, e.window_start, e.count, local)
                == sluice_core::merge::Merged::Full
            {
                self.gossip.remote_full += 1;
            }
        }
        self.gossip.max_remote_slots = self.gossip.max_remote_slots.max(daemon.remote.slots());
        for reader in readers {
            self.check_heals(r, reader);
        }
    }
}
