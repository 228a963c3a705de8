//! Gossip: a daemon's ship timer asks the observer what to send, the shipment fans out over
//! the links (delay, loss, partitions), and a delivery merges into the receivers' view.
//!
//! With `shippers = "region_sender"` a shipment takes the daemon's hops: the routes are
//! `sluice_core::relay::plan` on the run's membership ([`Sim::routes`]), the split between
//! the collect and the shipment across is `relay::shipment`, the sender's table is the
//! daemon's `relay::Collected`; a relayed delivery is fanned out by its receiver.

use super::events::{Ev, Queued};
use super::{IN_REGION_DELAY, Sim, view};
use crate::scenario::{Delivery, Shippers};
use sluice_core::Micros;
use sluice_core::forward::Forwarder;
use sluice_core::relay::{self, Hop};
use sluice_core::ship::{Batch, ShipEntry, message_bytes};
use std::rc::Rc;

pub(super) struct Msg {
    /// The region whose store counted the figures (kept on every hop).
    pub(super) from: usize,
    /// The region that sent it over the link: `from`, but for a forward.
    pub(super) via: usize,
    pub(super) entries: Vec<ShipEntry>,
    /// Its estimated bytes on the wire, per copy (what a fan out counts again).
    pub(super) bytes: u64,
}

/// Traffic of one hop kind (`region_sender`), counted as the cross-region traffic is: per
/// message per receiving daemon, estimated protobuf.
#[derive(Clone, Debug, Default)]
pub struct HopCounters {
    /// Bytes, by sending region.
    pub bytes_by_region: Vec<u64>,
    /// Messages.
    pub messages: u64,
}

impl HopCounters {
    fn count(&mut self, region: usize, bytes: u64, copies: u64) {
        if self.bytes_by_region.len() <= region {
            self.bytes_by_region.resize(region + 1, 0);
        }
        self.bytes_by_region[region] += bytes * copies;
        self.messages += copies;
    }
}

/// Where one daemon's datagrams go (`region_sender`): the core's [`relay::Plan`] as the
/// run's (region, daemon) indices.
#[derive(Clone, Debug, Default)]
pub(super) struct Routes {
    /// The region's sender (a daemon of the same region), when this daemon is not it.
    pub(super) collect_to: Option<usize>,
    /// Across: (region, daemon, hop).
    pub(super) cross: Vec<(usize, usize, Hop)>,
    /// The other live daemons of its region: where a relayed packet is passed on.
    pub(super) fan_out: Vec<usize>,
    /// The peer regions' receivers (region, daemon), when the ring forwards.
    pub(super) forward_to: Vec<(usize, usize)>,
    /// The ring's regions in ring order, when it forwards (for
    /// [`sluice_core::forward::passes_on`]).
    pub(super) ring: Vec<usize>,
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
    /// Reports dropped at a daemon's key bound (its remote table, or with `region_sender`
    /// what is collected to it).
    pub remote_full: u64,
    /// `region_sender`, per hop kind; the cross-region ones (relay, direct) are also in
    /// `bytes`, `bytes_by_region` and `messages`, the in-region ones (collect, fan out) only
    /// here.
    pub collect: HopCounters,
    /// See `collect`.
    pub relay: HopCounters,
    /// See `collect`.
    pub fan_out: HopCounters,
    /// See `collect`.
    pub direct: HopCounters,
    /// See `collect`: other origins' figures forwarded to a peer region (`fanout`), counted
    /// by the forwarding region.
    pub forward: HopCounters,
}

/// A shipment waiting for the observer's answer.
pub(super) struct Shipping {
    pub(super) region: usize,
    pub(super) daemon: usize,
    /// Its routes at the ship (`region_sender`), or `None` for the other modes.
    pub(super) routes: Option<Routes>,
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
        let routes = (sc.gossip.shippers == Shippers::RegionSender).then(|| self.routes(r, d));
        // Nobody to tell: the daemon keeps its figures dirty (see `Rec::Select`).
        let prune = routes.as_ref().is_some_and(|t| t.cross.is_empty());
        self.pipe.select(r, d, local, prune);
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
        let first = match &routes {
            // A collect and at most one delivery per member elsewhere.
            Some(t) => {
                self.seq += (1 + n * sc.daemons) as u64;
                match t.collect_to {
                    Some(_) => IN_REGION_DELAY.min(self.first_delivery[r]),
                    None => self.first_delivery[r],
                }
            }
            None => {
                self.seq += (n * receivers) as u64;
                self.first_delivery[r]
            }
        };
        self.shipping_due = self.shipping_due.min(now + first);
        self.shipping.push_back(Shipping {
            region: r,
            daemon: d,
            routes,
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
            daemon: d,
            routes,
            now,
            mut seq,
        } = s;
        if let Some(routes) = routes {
            self.send_relayed(r, d, routes, now, seq, batch);
            return;
        }
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
                via: r,
                entries: batch.entries,
                bytes,
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
                            hop: Hop::Direct,
                            msg: msg.clone(),
                        },
                    });
                }
            }
        }
    }

    /// Daemon `d` of region `r`'s routes now: the core's election on the run's membership
    /// (every daemon up of every region up; the simulator's membership is exact and at once,
    /// where the daemon's follows chitchat's failure detector a few seconds late).
    pub(super) fn routes(&self, r: usize, d: usize) -> Routes {
        let sc = self.sc;
        let mut members = Vec::with_capacity(sc.regions.len() * sc.daemons);
        let mut at = Vec::with_capacity(members.capacity());
        for r2 in (0..sc.regions.len()).filter(|r2| self.up[*r2]) {
            for d2 in (0..sc.daemons).filter(|d2| self.live[r2][*d2]) {
                members.push(relay::Member {
                    node_id: &self.node_ids[r2][d2],
                    region: &sc.regions[r2],
                    relays: true,
                    forwards: sc.gossip.fanout > 0,
                });
                at.push((r2, d2));
            }
        }
        let Some(me) = at.iter().position(|x| *x == (r, d)) else {
            return Routes::default();
        };
        let p = relay::plan_with(&members, me, sc.gossip.fanout);
        Routes {
            forward_to: p.forward_to.iter().map(|&i| at[i]).collect(),
            ring: p.ring.iter().map(|&i| at[i].0).collect(),
            collect_to: p.collect_to.map(|i| at[i].1),
            cross: p
                .cross
                .iter()
                .map(|&(i, hop)| (at[i].0, at[i].1, hop))
                .collect(),
            fan_out: p.fan_out.iter().map(|&i| at[i].1).collect(),
        }
    }

    /// A `region_sender` shipment of daemon `d` of region `r`, as the daemon's ship loop
    /// sends it: what was collected to it is taken, the core splits it with the selection
    /// into the collect and what goes across, and a sender with peers records what it
    /// shipped.
    fn send_relayed(
        &mut self,
        r: usize,
        d: usize,
        routes: Routes,
        now: Micros,
        mut seq: u64,
        batch: Batch,
    ) {
        let sc = self.sc;
        let local = self.clock(r, now);
        let collected = &mut self.regions[r].daemons[d].collected;
        // Nobody to tell: everything gathered goes (below), as in the daemon.
        let room = match routes.cross.is_empty() {
            true => usize::MAX,
            false => relay::gather_budget(
                routes.collect_to.is_none(),
                &batch.entries,
                sc.gossip.budget.max_bytes,
            ),
        };
        let gathered = match collected.is_empty() {
            true => Vec::new(),
            false => collected.take(local, sc.gossip.budget.resend_after, room),
        };
        if routes.cross.is_empty() {
            // Nobody to tell: the selection was a prune, and what was gathered goes.
            return;
        }
        self.gossip.deferred += batch.deferred as u64;
        let s = relay::shipment(
            routes.collect_to.is_none(),
            !routes.fan_out.is_empty(),
            batch.entries,
            gathered,
        );
        if let Some(to) = routes.collect_to {
            self.send_hop(r, r, s.collect, &[(r, to, Hop::Collect)], now, &mut seq);
        }
        let across = self.send_hop(r, r, s.across, &routes.cross, now, &mut seq);
        if s.record {
            self.regions[r].daemons[d]
                .collected
                .shipped(&across.entries, local);
        }
        if sc.gossip.fanout > 0 && routes.collect_to.is_none() {
            // The receiver's interval: forget what nobody ships any more, and forward what
            // waited (the budget's rest; everything, forwarding at the interval).
            let peers: Vec<&str> = routes
                .forward_to
                .iter()
                .map(|&(r2, _)| sc.regions[r2].as_str())
                .collect();
            self.regions[r].daemons[d].forwarder.sweep(
                local,
                Forwarder::keep_for(sc.gossip.budget.resend_after, self.interval),
                &peers,
            );
            self.forward(r, d, now);
        }
    }

    /// Sends `entries` of region `r` to each of `to` (region, daemon, hop): a cross-region
    /// hop over the link (delay, loss, partitions), one inside the region after
    /// [`IN_REGION_DELAY`]. Returns the entries (for the sender's record).
    fn send_hop(
        &mut self,
        r: usize,
        origin: usize,
        entries: Vec<ShipEntry>,
        to: &[(usize, usize, Hop)],
        now: Micros,
        seq: &mut u64,
    ) -> Rc<Msg> {
        let sc = self.sc;
        let n = sc.regions.len();
        let entry: usize = entries.iter().map(ShipEntry::bytes).sum();
        let bytes = message_bytes(&sc.regions[origin], entry) as u64;
        let msg = Rc::new(Msg {
            from: origin,
            via: r,
            entries,
            bytes,
        });
        if msg.entries.is_empty() || to.is_empty() {
            return msg;
        }
        let g = &mut self.gossip;
        g.batches += 1;
        g.entries += msg.entries.len() as u64;
        g.max_batch = g.max_batch.max(msg.entries.len() as u64);
        for &(r2, d2, hop) in to {
            if !self.regions[r2].up {
                continue;
            }
            let g = &mut self.gossip;
            let delay = match hop {
                Hop::Collect | Hop::FanOut => {
                    let c = if hop == Hop::Collect {
                        &mut g.collect
                    } else {
                        &mut g.fan_out
                    };
                    c.count(r, bytes, 1);
                    IN_REGION_DELAY
                }
                Hop::Relay | Hop::Direct | Hop::Forward => {
                    let c = match hop {
                        Hop::Relay => &mut g.relay,
                        Hop::Forward => &mut g.forward,
                        _ => &mut g.direct,
                    };
                    c.count(r, bytes, 1);
                    g.messages += 1;
                    g.bytes += bytes;
                    g.bytes_by_region[r] += bytes;
                    if self.cut[r][r2] {
                        g.cut += 1;
                        continue;
                    }
                    let link = sc.gossip.links[r][r2];
                    let rng = &mut self.link_rng[r * n + r2];
                    if rng.chance(link.loss) {
                        g.lost += 1;
                        continue;
                    }
                    link.delay.sample(rng)
                }
            };
            let epoch = self.regions[r2].daemons[d2].epoch;
            *seq += 1;
            self.heap.push(Queued {
                at: now + delay,
                seq: *seq,
                ev: Ev::Deliver {
                    region: r2,
                    daemon: d2,
                    epoch,
                    hop,
                    msg: msg.clone(),
                },
            });
        }
        msg
    }

    pub(super) fn deliver_to(&mut self, r: usize, d: usize, epoch: u32, hop: Hop, msg: &Rc<Msg>) {
        let now = self.now;
        let sc = self.sc;
        if hop == Hop::Collect {
            self.collect(r, d, epoch, msg);
            return;
        }
        // The table this delivery merges into (the region's first daemon's with per-region
        // delivery), and every daemon that reads it.
        let table = view(sc, d);
        let readers = (0..sc.daemons).filter(|x| view(sc, *x) == table);
        if hop != Hop::FanOut && self.cut[msg.via][r] {
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
        let daemon = &mut region.daemons[table];
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
        if hop == Hop::Relay || hop == Hop::Forward {
            self.fan_out(r, d, msg);
            if sc.gossip.fanout > 0 {
                self.heard(r, d, local, msg);
                if sc.gossip.forward_at_once {
                    self.forward(r, d, now);
                }
            }
        }
    }

    /// A receiver keeps what another region's packet brought for forwarding (the daemon's
    /// [`sluice_core::forward::Forwarder::heard`], with the region it came from).
    fn heard(&mut self, r: usize, d: usize, local: Micros, msg: &Msg) {
        let sc = self.sc;
        let (origin, via) = (&sc.regions[msg.from], &sc.regions[msg.via]);
        let f = &mut self.regions[r].daemons[d].forwarder;
        for e in &msg.entries {
            f.heard(
                origin,
                Some(via),
                &e.key,
                e.window_start,
                e.count,
                local,
                sc.gossip.max_keys,
            );
        }
    }

    /// Daemon `d` of region `r` forwards what is due to each of its peer regions'
    /// receivers ([`sluice_core::forward::Forwarder::take`] within the interval's budget, one message per origin),
    /// as the daemon does on receipt (and at its shipment, for what the budget held back).
    fn forward(&mut self, r: usize, d: usize, now: Micros) {
        let sc = self.sc;
        let local = self.clock(r, now);
        let routes = self.routes(r, d);
        if routes.collect_to.is_some() {
            return;
        }
        let ring = &routes.ring;
        let at = |x: usize| ring.iter().position(|y| *y == x);
        for (r2, d2) in routes.forward_to {
            let due = self.regions[r].daemons[d].forwarder.take(
                &sc.regions[r2],
                local,
                sc.gossip.budget.resend_after,
                sc.gossip.budget.max_bytes,
                |origin| {
                    let o = sc.regions.iter().position(|x| x == origin);
                    match (at(r), o.and_then(at), at(r2)) {
                        (Some(m), Some(o), Some(p)) => {
                            sluice_core::forward::passes_on(ring.len(), m, o, p, sc.gossip.fanout)
                        }
                        _ => false,
                    }
                },
            );
            for (origin, entries) in due {
                let Some(o) = sc.regions.iter().position(|x| *x == origin) else {
                    continue;
                };
                let mut seq = self.seq;
                self.seq += 1;
                self.send_hop(r, o, entries, &[(r2, d2, Hop::Forward)], now, &mut seq);
            }
        }
    }

    /// The receiver of a relayed packet passes it on, once, to its region's other live
    /// daemons (the core's [`relay::Plan::fan_out`] on the membership now). With per-region
    /// delivery they read the table it was just merged into: the copies are counted, not
    /// delivered again.
    fn fan_out(&mut self, r: usize, d: usize, msg: &Rc<Msg>) {
        let sc = self.sc;
        let now = self.now;
        for d2 in self.routes(r, d).fan_out {
            self.gossip.fan_out.count(r, msg.bytes, 1);
            if view(sc, d2) == view(sc, d) {
                continue;
            }
            let epoch = self.regions[r].daemons[d2].epoch;
            self.push(
                now + IN_REGION_DELAY,
                Ev::Deliver {
                    region: r,
                    daemon: d2,
                    epoch,
                    hop: Hop::FanOut,
                    msg: msg.clone(),
                },
            );
        }
    }

    /// A daemon's selection collected to its region's sender: kept, max per (key, window),
    /// for its next shipment across ([`relay::Collected::add`], the daemon's bound).
    fn collect(&mut self, r: usize, d: usize, epoch: u32, msg: &Msg) {
        let max = self.sc.gossip.max_keys;
        let region = &mut self.regions[r];
        if !region.up || region.daemons[d].epoch != epoch {
            return;
        }
        let c = &mut region.daemons[d].collected;
        for e in &msg.entries {
            if !c.add(e.key.clone(), e.window_start, e.count, max) {
                self.gossip.remote_full += 1;
            }
        }
    }
}
