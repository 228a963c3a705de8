//! The observer thread: the ground truth and the shippers' usage tables, fed compact records
//! in decision order. The engine asks back only what a shipment carries and what a heal
//! must teach; everything else flows one way, so the run is the same as on one thread.

use super::store_seed;
use crate::metrics::{HealCount, Measured, Metrics, NewTruth};
use crate::scenario::Scenario;
use sluice_core::Micros;
use sluice_core::hash::InlineKey;
use sluice_core::rules::Domain;
use sluice_core::ship::{Batch, Budget, LocalUsage, Observed};
use std::sync::mpsc;

/// What the engine hands the observer thread, in order.
pub(super) enum Rec {
    /// A counter met for the first time.
    Truth(NewTruth),
    /// A decided request, for the ground truth.
    Request(Measured),
    /// What the store answered a shipping daemon for global rules.
    Observe {
        region: usize,
        daemon: usize,
        now: Micros,
        obs: Obs,
    },
    /// A daemon ships: answer with its [`Batch`]. `prune`: it has nobody to tell (no other
    /// region), so, as the daemon does, it selects with no room, which keeps its figures dirty
    /// and only drops those whose windows ended.
    Select {
        region: usize,
        daemon: usize,
        now: Micros,
        prune: bool,
    },
    /// A region's daemons (re)start with empty usage tables.
    StartDaemons { region: usize },
    /// These regions' shippers send everything busy at their next shipment.
    ResendAll { regions: Vec<usize> },
    /// A heal at `now`: answer with [`Metrics::heal_counts`].
    Heal {
        now: Micros,
        up: Vec<bool>,
        th: Vec<u64>,
    },
}

/// One global rule's answer, for a shipper: what `ship::observations` said it records.
pub(super) struct Obs {
    /// Inline: memory allocated on one thread and freed on the other costs more than the copy.
    pub(super) key: InlineKey,
    pub(super) params: sluice_core::Params,
    /// The figure, busy value and threshold.
    pub(super) observed: Observed,
}

/// What the observer answers.
pub(super) enum Reply {
    Batch(Batch),
    Heal(Vec<HealCount>),
}

/// Records sent per batch: large enough that the channel costs nothing per request, small
/// enough that the observer starts early and a shipment waits little.
pub(super) const BATCH: usize = 1024;

/// The engine's end of the observer thread.
pub(super) struct Pipe {
    pub(super) buf: Vec<Rec>,
    pub(super) tx: Option<mpsc::SyncSender<Vec<Rec>>>,
    pub(super) replies: Option<mpsc::Receiver<Reply>>,
    /// Batches the observer emptied, back for reuse: a fresh batch is a large allocation
    /// freed on the other thread, and the allocator handed its pages back to the OS and
    /// faulted new ones in (zeroing them) over and over.
    pub(super) spare: Option<mpsc::Receiver<Vec<Rec>>>,
}

impl Pipe {
    pub(super) fn send(&mut self, r: Rec) {
        self.buf.push(r);
        if self.buf.len() >= BATCH {
            self.flush();
        }
    }

    /// Sends what is buffered (kept until the observer runs).
    pub(super) fn flush(&mut self) {
        let Some(tx) = &self.tx else { return };
        if self.buf.is_empty() {
            return;
        }
        let next = self
            .spare
            .as_ref()
            .and_then(|rx| rx.try_recv().ok())
            .unwrap_or_else(|| Vec::with_capacity(BATCH));
        let batch = std::mem::replace(&mut self.buf, next);
        // A closed channel means the observer panicked; `run` reports that at join.
        let _ = tx.send(batch);
    }

    pub(super) fn ask(&mut self, r: Rec) -> Option<Reply> {
        self.send(r);
        self.flush();
        self.replies.as_ref().and_then(|rx| rx.recv().ok())
    }

    /// Asks what daemon `d` of region `r` ships at `now` (`prune`: see [`Rec::Select`]),
    /// without waiting: the observer answers once everything before is observed, and
    /// [`Pipe::selected`] takes the answers in the order they were asked.
    pub(super) fn select(&mut self, region: usize, daemon: usize, now: Micros, prune: bool) {
        self.send(Rec::Select {
            region,
            daemon,
            now,
            prune,
        });
        self.flush();
    }

    /// The answer to the oldest [`Pipe::select`] not yet taken.
    pub(super) fn selected(&mut self) -> Batch {
        match self.replies.as_ref().and_then(|rx| rx.recv().ok()) {
            Some(Reply::Batch(b)) => b,
            _ => Batch::default(),
        }
    }

    /// The heal counts, once everything before them is counted.
    pub(super) fn heal_counts(
        &mut self,
        now: Micros,
        up: Vec<bool>,
        th: Vec<u64>,
    ) -> Vec<HealCount> {
        match self.ask(Rec::Heal { now, up, th }) {
            Some(Reply::Heal(h)) => h,
            _ => Vec::new(),
        }
    }
}

/// The observer thread: handles every record, in order, then hands back the counts.
pub(super) fn observe_all(
    mut o: Observer<'_>,
    rx: mpsc::Receiver<Vec<Rec>>,
    replies: mpsc::Sender<Reply>,
    spare: mpsc::Sender<Vec<Rec>>,
) -> Metrics {
    for mut batch in rx {
        for rec in batch.drain(..) {
            o.handle(rec, &replies);
        }
        // The engine may have stopped taking them (its end is gone): nothing to do then.
        let _ = spare.send(batch);
    }
    o.metrics
}

/// The second core's share of a run: the ground truth, and the shippers' usage tables. Both
/// only consume what a decision did; the engine asks back only at a shipment (what to send)
/// and at a heal (what to learn), after everything before it was counted. Fed the same
/// records in the same order, the run stays deterministic.
pub(super) struct Observer<'a> {
    pub(super) sc: &'a Scenario,
    pub(super) seed: u64,
    pub(super) metrics: Metrics,
    /// Per region, per daemon: what it observed, for its shipments.
    pub(super) usage: Vec<Vec<LocalUsage>>,
}

impl<'a> Observer<'a> {
    pub(super) fn new(sc: &'a Scenario, domain: &Domain, seed: u64) -> Observer<'a> {
        let n = sc.regions.len();
        Observer {
            sc,
            seed,
            metrics: Metrics::new(domain.rules.len(), n, sc.warmup, sc.duration),
            usage: (0..n).map(|_| Vec::new()).collect(),
        }
    }

    pub(super) fn handle(&mut self, rec: Rec, replies: &mpsc::Sender<Reply>) {
        match rec {
            Rec::Truth(t) => self.metrics.push_truth(t),
            Rec::Request(m) => self.metrics.record(&m),
            Rec::Observe {
                region,
                daemon,
                now,
                obs,
            } => self.observe(region, daemon, now, obs),
            Rec::Select {
                region,
                daemon,
                now,
                prune,
            } => {
                let budget = match prune {
                    true => Budget {
                        max_bytes: 0,
                        max_entries: 0,
                        ..self.sc.gossip.budget
                    },
                    false => self.sc.gossip.budget,
                };
                let batch = self.usage[region][daemon].select(now, &budget);
                let _ = replies.send(Reply::Batch(batch));
            }
            Rec::StartDaemons { region } => {
                self.usage[region] = (0..self.sc.daemons)
                    .map(|_| LocalUsage::new(store_seed(self.seed)))
                    .collect();
            }
            Rec::ResendAll { regions } => {
                for r in regions {
                    for u in &mut self.usage[r] {
                        u.resend_all();
                    }
                }
            }
            Rec::Heal { now, up, th } => {
                let _ = replies.send(Reply::Heal(self.metrics.heal_counts(now, &up, &th)));
            }
        }
    }

    /// Feeds a daemon's shipper with what the store answered for global rules.
    pub(super) fn observe(&mut self, r: usize, d: usize, now: Micros, o: Obs) {
        // Copied from a `String`: always UTF-8.
        let Ok(key) = std::str::from_utf8(&o.key) else {
            return;
        };
        self.usage[r][d].observe(key, &o.params, now, o.observed);
    }
}
