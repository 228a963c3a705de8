//! The event loop: timers, deliveries and scenario events in a heap, merged by `(at, seq)`
//! with the generators' next arrivals and the regions' store FIFOs; and the calls that drive
//! a run by hand ([`Sim::advance`], [`Sim::decide`], [`Sim::deliver`]).

use super::gossip::Msg;
use super::{Progress, RULES_VERSION, Sim, view};
use sluice_core::Micros;
use sluice_core::decision::{Decision, plan};
use sluice_core::matching::Descriptors;
use sluice_core::relay::Hop;
use sluice_core::ship::ShipEntry;
use std::cmp::Ordering;
use std::rc::Rc;

pub(super) enum Ev {
    Ship {
        region: usize,
        daemon: usize,
        epoch: u32,
        timer: u32,
    },
    Deliver {
        region: usize,
        daemon: usize,
        epoch: u32,
        /// How it travels (`Direct` but with `region_sender`), which says what the receiver
        /// does with it.
        hop: Hop,
        msg: Rc<Msg>,
    },
    Scenario(usize),
    /// A daemon's hot-key sweep (every `lease::SWEEP`).
    Sweep {
        region: usize,
        daemon: usize,
        epoch: u32,
    },
}

/// Where the loop's next event comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The event heap.
    Heap,
    /// A region's store queue.
    Exec(usize),
    /// A traffic generator's next arrival.
    Arrival(usize),
}

pub(super) struct Queued {
    pub(super) at: Micros,
    pub(super) seq: u64,
    pub(super) ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Queued {
    /// Reversed: the heap pops the earliest, then the first scheduled.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

impl<'a> Sim<'a> {
    /// The event loop, through every event due at or before `until` (`Micros::MAX`: to the
    /// end of the run).
    pub(super) fn events_loop(&mut self, until: Micros, progress: &mut dyn FnMut(&Progress)) {
        loop {
            // The earliest of the heap's top, the next arrivals and the store FIFOs' fronts,
            // ties by sequence.
            let mut best = self.heap.peek().map(|q| (q.at, q.seq, Source::Heap));
            for (g, a) in self.arrivals.iter().enumerate() {
                if let Some((at, seq)) = *a
                    && best.is_none_or(|(b_at, b_seq, _)| (at, seq) < (b_at, b_seq))
                {
                    best = Some((at, seq, Source::Arrival(g)));
                }
            }
            for (r, q) in self.execs.iter().enumerate() {
                if let Some(e) = q.front()
                    && best.is_none_or(|(at, seq, _)| (e.at, e.seq) < (at, seq))
                {
                    best = Some((e.at, e.seq, Source::Exec(r)));
                }
            }
            let Some((at, _, from)) = best.filter(|(at, _, _)| *at <= until) else {
                // Nothing more is due: shipments whose deliveries could be are sent first.
                if self.shipping.is_empty() || (best.is_some() && self.shipping_due > until) {
                    break;
                }
                self.send_shipments();
                continue;
            };
            // Shipments asked for are sent before the first event they could affect: one at
            // or after their earliest delivery, or anything but a request or a ship timer (a
            // delivery, or a scenario event that could cut a link or stop a region).
            if !self.shipping.is_empty()
                && (at >= self.shipping_due
                    || (from == Source::Heap
                        && !matches!(self.heap.peek().map(|q| &q.ev), Some(Ev::Ship { .. }))))
            {
                self.send_shipments();
                continue;
            }
            self.now = at;
            self.events += 1;
            if self.events & 0xffff == 0 {
                progress(&Progress {
                    now: self.now,
                    duration: self.sc.duration,
                    requests: self.metrics.requests,
                });
            }
            match from {
                Source::Exec(r) => {
                    if let Some(e) = self.execs[r].pop_front() {
                        let given = e.p.src.is_none();
                        let decision = self.exec(e.p);
                        if given {
                            self.decided = decision;
                        }
                    }
                    continue;
                }
                Source::Arrival(g) => {
                    self.arrivals[g] = None;
                    self.arrival(g);
                    continue;
                }
                Source::Heap => {}
            }
            let Some(q) = self.heap.pop() else { break };
            match q.ev {
                Ev::Ship {
                    region,
                    daemon,
                    epoch,
                    timer,
                } => self.ship(region, daemon, epoch, timer),
                Ev::Deliver {
                    region,
                    daemon,
                    epoch,
                    hop,
                    msg,
                } => self.deliver_to(region, daemon, epoch, hop, &msg),
                Ev::Scenario(i) => self.scenario_event(i),
                Ev::Sweep {
                    region,
                    daemon,
                    epoch,
                } => self.sweep(region, daemon, epoch),
            }
        }
    }

    /// Runs every event due at or before `until` (timers, deliveries, scenario events, store
    /// calls, the generators' arrivals), and moves the clock to `until`.
    ///
    /// With [`Sim::decide`] and [`Sim::deliver`], a caller drives the daemons' path with a
    /// sequence of its own (a differential test holds it to the daemon's engine this way).
    /// Driven by hand, a run has no observer thread: the shippers' tables stay empty, so the
    /// daemons' own shipments carry nothing and remote figures come only from
    /// [`Sim::deliver`]; the report is not built.
    pub fn advance(&mut self, until: Micros) {
        self.events_loop(until, &mut |_| {});
        self.now = self.now.max(until);
    }

    /// Decides one request on daemon `d` of region `r` at `at`, as an arrival there is:
    /// planned on the daemon's view of the other regions, its store calls through the
    /// daemon's hot-key layer and store guard to the region's store after the scenario's
    /// latency (the events due meanwhile run first), then decided by the core. `None` when
    /// the request was lost (the region or the daemon is down).
    pub fn decide(
        &mut self,
        r: usize,
        d: usize,
        at: Micros,
        descriptors: &Descriptors,
        cost: u64,
    ) -> Option<Decision> {
        self.advance(at);
        if !self.regions[r].up || !self.live[r][d] {
            return None;
        }
        let request_id = (self.seq + 1).to_string();
        let lt = self.clock(r, at);
        let remote = &self.regions[r].daemons[view(self.sc, d)].remote;
        let regions = self.sc.regions.len();
        let p = plan(self.domain, descriptors, lt, cost, &request_id, |a| {
            remote.remote_for(&a.key, &a.params, lt, regions)
        });
        let unlimited = p.calls.is_empty().then(|| p.decide(RULES_VERSION, &[]));
        let exec_at = match self.queue(r, d, None, at, cost, Box::new(p)) {
            Some(exec_at) => exec_at,
            None => return unlimited,
        };
        self.decided = None;
        self.advance(exec_at);
        self.decided.take()
    }

    /// Delivers a shipment of region `from` to region `r`'s daemons at `at`, as a gossip
    /// message arriving then (the events due before it run first): merged into each
    /// daemon's view unless the link is cut or the region down.
    pub fn deliver(&mut self, r: usize, from: usize, at: Micros, entries: Vec<ShipEntry>) {
        self.advance(at);
        let msg = Rc::new(Msg {
            from,
            via: from,
            entries,
            bytes: 0,
        });
        for d in 0..self.sc.daemons {
            if view(self.sc, d) == d {
                let epoch = self.regions[r].daemons[d].epoch;
                self.deliver_to(r, d, epoch, Hop::Direct, &msg);
            }
        }
    }
}
