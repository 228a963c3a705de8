//! The discrete-event engine: virtual time, regions, daemons, stores and gossip, driving the
//! same core code the daemon runs.
//!
//! Per request: `sluice_core::decision::plan` (matching, one call per identity, the remote
//! figure from this daemon's `sluice_core::merge::RemoteCounts`), each call through the
//! daemon's `sluice_core::hotkeys::Layer::call_sync` (answered by the layer, or sent through
//! the daemon's `sluice_core::guard::StoreGuard` to the region's
//! `sluice_store::MemoryStore::check_sync`; a failed or refused call is answered by
//! `guard::answer` on the daemon's local buckets), then `Plan::decide` and
//! `guard::journaled`. Every `lease::SWEEP` a
//! daemon's layer sweeps, and its give-backs go to the store (`give_back_sync`). The decision's outcomes feed the
//! daemon's `sluice_core::ship::LocalUsage`, which every ship interval selects what to send;
//! receivers merge it into their `RemoteCounts`. Nothing here decides anything itself: it
//! only moves time, messages and calls around, and counts.
//!
//! Two threads, one order: the ground truth (every counter's windows and exact limiter) and
//! the shippers' usage tables only consume what decisions did, so an observer thread keeps
//! them, fed compact records in decision order. The engine waits for it only where it needs
//! an answer back (what a daemon ships, what must be learnt after a heal), so the output is
//! the same as on one thread, byte for byte.
//!
//! Time is virtual, in microseconds, passed as `now`: each region's daemons pass their own
//! clock's, [`Sim::clock`] (the reference plus the scenario's `[clock]` offset), while the
//! event loop, the network and the ground truth run on the reference clock. Events at the same instant run in the
//! order they were scheduled (a sequence number breaks ties), every random draw comes from a
//! seeded stream, and no map is iterated in an order that depends on anything but its
//! insertions: the same scenario and seed give the same run, bit for bit.
//!
//! Model choices (see simulations/README.md):
//! - a store call is made at arrival with the daemon's `now`, and executes `latency` later,
//!   in arrival order per region (a region's store serialises calls, as Redis does);
//! - a region's figure for a global bucket rule is the store's cumulative `used`, kept in the
//!   bucket's state as Redis keeps it (the remote figure from `RemoteCounts::remote_for`
//!   marks the call shared, for the daemon and here alike), and what a daemon's shipper
//!   records comes from `sluice_core::ship::observations`, as in the daemon;
//! - a store failover replays the calls the replica had received `lost_ms` before: writes
//!   more recent than that are lost;
//! - named stores (`[stores.NAME]`): each call goes to `Plan::store_of`'s store, through the
//!   daemon's guard and local buckets of that store; each store draws its own latency and
//!   serialises its own calls, and a request whose calls reach several executes when the
//!   last of them would have run its call (in that store's FIFO);
//! - gossip messages go from each shipping daemon to every daemon of every other region that
//!   is up, each with its own delay draw and loss; a partition drops them, in flight too.
//!   With `shippers = "region_sender"` they take the daemon's hops instead: to the region's
//!   sender ([`IN_REGION_DELAY`]), once per region pair across, and fanned out by the
//!   receiver; who sends where is `sluice_core::relay`'s election on the run's membership
//!   (regions and daemons up), what the sender gathers and ships its `Collected`, `shipment`;
//!   With `delivery = "per_region"` a region's daemons get a message at one moment (one draw
//!   per region), hold the same view, and share one `RemoteCounts`: the first daemon's.
//!
//! # Layout
//!
//! - this file: the run's state ([`Sim`]), its setup and [`run`];
//! - `events`: the event loop and the calls that drive a run by hand;
//! - `request`: a request from arrival to decision;
//! - `store`: store calls through a daemon's guard, the replica, sweeps, syncs, give-backs;
//! - `region`: regions and daemons, their lifecycle and the scenario's events;
//! - `gossip`: shipments, links and deliveries;
//! - `heal`: convergence after a heal;
//! - `observer`: the observer thread.

mod events;
mod gossip;
mod heal;
mod observer;
mod region;
mod request;
mod store;

pub use gossip::{GossipCounters, HopCounters};
pub use heal::HealTrack;

use crate::metrics::{Metrics, TruthIndex};
use crate::per_store::StoreCounters;
use crate::report::{self, Report};
use crate::rng::Rng;
use crate::scenario::{Delivery, Scenario, Shippers};
use crate::traffic::Generator;
use events::{Ev, Queued};
use gossip::Shipping;
use observer::{BATCH, Observer, Pipe, observe_all};
use region::{Region, RegionStore, Replica};
use request::Exec;
use sluice_core::Micros;
use sluice_core::decision::{Answer, Decision, Plan};
use sluice_core::rules::Domain;
use sluice_store::MemoryStore;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::mpsc;

/// How far a run has got, for a progress line.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Virtual now.
    pub now: Micros,
    /// Virtual end.
    pub duration: Micros,
    /// Requests decided so far.
    pub requests: u64,
}

/// The rules' version the simulated daemons decide under (the rules never change in a run).
const RULES_VERSION: u64 = 1;

/// Bounds of each simulated daemon's hot-key layer: the daemon's defaults
/// (`hot_keys.deny_entries`, `hot_keys.leases`). The daemon splits them over shards of one
/// layer each; the simulator keeps one layer per daemon, which differs only at the bounds.
const DENY_ENTRIES: usize = 100_000;
const LEASES: usize = 10_000;

/// Whether daemon `d` of a region ships (with `region_sender` every daemon does: to its
/// region's sender, or across when it is the sender).
fn ships(sc: &Scenario, d: usize) -> bool {
    sc.gossip.shippers != Shippers::OnePerRegion || d == 0
}

/// One-way delay of a hop inside a region (`region_sender`'s collect and fan out): the
/// scenario's delays are between regions, and a region's daemons share a local network, so a
/// fixed half millisecond (a LAN round trip is well under one). No loss, and no partition cuts
/// it (partitions are between regions).
pub const IN_REGION_DELAY: Micros = 500;

/// The daemon whose remote table daemon `d` reads and merges into: its own, or with
/// per-region delivery the region's first, which they all share.
fn view(sc: &Scenario, d: usize) -> usize {
    match sc.gossip.delivery {
        Delivery::PerDaemon => d,
        Delivery::PerRegion => 0,
    }
}

/// One simulation run.
pub struct Sim<'a> {
    sc: &'a Scenario,
    seed: u64,
    domain: &'a Domain,
    /// Counter ids by store key.
    index: TruthIndex,
    /// Records for the observer thread.
    pipe: Pipe,
    regions: Vec<Region>,
    up: Vec<bool>,
    /// Per region: which of its daemons are up (the arrivals' daemon pick).
    live: Vec<Vec<bool>>,
    gens: Vec<Generator>,
    heap: BinaryHeap<Queued>,
    /// Per generator: its next arrival and its sequence number. Kept out of the heap (one
    /// push and pop per request, on a heap of every timer and delivery in flight); the loop
    /// merges them by `(at, seq)`, which is the order the heap would give.
    arrivals: Vec<Option<(Micros, u64)>>,
    /// Store calls in flight, per region and store slot (`r * slots + s`, the FIFO of the
    /// request's last store to execute its call), in execution order.
    execs: Vec<VecDeque<Exec<'a>>>,
    seq: u64,
    now: Micros,
    interval: Micros,
    threshold: Option<u8>,
    cut: Vec<Vec<bool>>,
    link_rng: Vec<Rng>,
    /// Counters the engine keeps itself; the observer's are added at the end.
    pub metrics: Metrics,
    /// Gossip counters.
    pub gossip: GossipCounters,
    /// Convergence after each heal.
    pub heals: Vec<HealTrack>,
    events: u64,
    /// Shipments asked of the observer and not yet sent, oldest first: the engine goes on
    /// with requests while the observer works out what they carry.
    shipping: VecDeque<Shipping>,
    /// The earliest time a delivery of `shipping` could arrive.
    shipping_due: Micros,
    /// Per region: the shortest delay any of its outgoing links can give.
    first_delivery: Vec<Micros>,
    /// The decision of the last request given by [`Sim::decide`], once executed.
    decided: Option<Decision>,
    /// The request id being planned, kept (no allocation per request).
    request_id: String,
    /// A request's answers while it executes, kept (no allocation per request).
    answers: Vec<Answer>,
    /// Plans of executed requests, for arrivals to plan into.
    #[expect(
        clippy::vec_box,
        reason = "a plan moves out of the pool into a request's FIFO entry and back: boxed, \
                  that moves a pointer instead of the plan"
    )]
    plans: Vec<Box<Plan<'a>>>,
    /// The decision being made, kept.
    decision: Decision,
    /// Per region, per daemon: its node id for the sender election (`{region}-{daemon:04}`,
    /// so the first daemon has the lowest id and is the sender while it is up).
    node_ids: Vec<Vec<String>>,
}

/// Streams of randomness, so each consumer's draws are independent of the others.
const STREAM_TRAFFIC: u64 = 1 << 32;
const STREAM_LATENCY: u64 = 2 << 32;
const STREAM_PHASE: u64 = 3 << 32;
const STREAM_LINK: u64 = 4 << 32;
const STREAM_NAMED_LATENCY: u64 = 6 << 32;

/// The latency stream of store slot `s` of region `r`: the main store's is the one it always
/// was (runs without named stores draw as before); a named store's is its own, so adding one
/// moves no other draw.
fn latency_rng(seed: u64, r: usize, s: usize) -> Rng {
    match s {
        0 => Rng::stream(seed, STREAM_LATENCY + r as u64),
        s => Rng::stream(
            seed,
            STREAM_NAMED_LATENCY + (r * (crate::scenario::MAX_NAMED_STORES + 1) + s) as u64,
        ),
    }
}

/// The hasher seed of a store's or a daemon's maps, drawn from the run's seed: which keys a
/// full store evicts depends on the map's order, so it must be the same on every rerun.
fn store_seed(seed: u64) -> u64 {
    Rng::stream(seed, 5 << 32).next_u64()
}

impl<'a> Sim<'a> {
    /// Sets up a run of `sc` under `seed`.
    pub fn new(sc: &'a Scenario, seed: u64) -> Sim<'a> {
        let domain = sc.domain();
        let n = sc.regions.len();
        let slots = sc.store_slots();
        let regions = (0..n)
            .map(|r| Region {
                up: true,
                stores: (0..slots)
                    .map(|s| {
                        let keys = sc.store_cfg(s).max_keys;
                        RegionStore {
                            store: MemoryStore::with_seed(keys, store_seed(seed)),
                            replica: sc.replica_lag[r][s].map(|lag| Replica {
                                store: MemoryStore::with_seed(keys, store_seed(seed)),
                                lag,
                                queue: VecDeque::new(),
                            }),
                            down_until: 0,
                            last_exec: 0,
                            latency_rng: latency_rng(seed, r, s),
                        }
                    })
                    .collect(),
                daemons: Vec::new(),
                phase_rng: Rng::stream(seed, STREAM_PHASE + r as u64),
            })
            .collect();
        let gens = sc
            .traffic
            .iter()
            .enumerate()
            .map(|(i, t)| {
                Generator::new(
                    t.clone(),
                    Rng::stream(seed, STREAM_TRAFFIC + i as u64),
                    sc.daemons,
                )
            })
            .collect();
        let link_rng = (0..n * n)
            .map(|i| Rng::stream(seed, STREAM_LINK + i as u64))
            .collect();
        let mut sim = Sim {
            sc,
            seed,
            domain,
            index: TruthIndex::new(n),
            pipe: Pipe {
                buf: Vec::with_capacity(BATCH),
                tx: None,
                replies: None,
                spare: None,
            },
            regions,
            up: vec![true; n],
            live: vec![vec![true; sc.daemons]; n],
            gens,
            heap: BinaryHeap::new(),
            arrivals: Vec::new(),
            execs: (0..n * slots).map(|_| VecDeque::new()).collect(),
            seq: 0,
            now: 0,
            interval: sc.gossip.interval,
            threshold: sc.gossip.threshold_pct,
            cut: vec![vec![false; n]; n],
            link_rng,
            metrics: Metrics::new(domain.rules.len(), n, sc.warmup, sc.duration),
            gossip: GossipCounters {
                bytes_by_region: vec![0; n],
                ..GossipCounters::default()
            },
            heals: Vec::new(),
            events: 0,
            shipping: VecDeque::new(),
            shipping_due: Micros::MAX,
            first_delivery: (0..n)
                .map(|r| {
                    (0..n)
                        .filter(|&r2| r2 != r)
                        .map(|r2| sc.gossip.links[r][r2].delay.low())
                        .min()
                        .unwrap_or(0)
                })
                .collect(),
            decided: None,
            request_id: String::with_capacity(20),
            answers: Vec::new(),
            plans: Vec::new(),
            decision: Decision::unlimited(RULES_VERSION),
            node_ids: sc
                .regions
                .iter()
                .map(|name| (0..sc.daemons).map(|d| format!("{name}-{d:04}")).collect())
                .collect(),
        };
        sim.metrics.stores = vec![StoreCounters::default(); slots];
        for r in 0..n {
            sim.start_daemons(r);
        }
        for g in 0..sim.gens.len() {
            let next = sim.gens[g].next_at().map(|t| {
                sim.seq += 1;
                (t, sim.seq)
            });
            sim.arrivals.push(next);
        }
        for i in 0..sc.events.len() {
            sim.push(sc.events[i].0, Ev::Scenario(i));
        }
        sim
    }

    /// Region `r`'s clock when the reference clock reads `t`: the `now` its daemons pass the
    /// core (window labels, expiries, the store's time). Off by the scenario's `[clock]`
    /// offset; a clock behind reads 0 until the reference passes its offset.
    pub(super) fn clock(&self, r: usize, t: Micros) -> Micros {
        t.saturating_add_signed(self.sc.clock_offset[r])
    }

    fn push(&mut self, at: Micros, ev: Ev) {
        self.seq += 1;
        self.heap.push(Queued {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// Runs to the end, calling `progress` now and then.
    pub fn run(mut self, progress: &mut dyn FnMut(&Progress)) -> Report {
        let observer = Observer::new(self.sc, self.domain, self.seed);
        let (tx, rx) = mpsc::sync_channel(16);
        let (reply_tx, reply_rx) = mpsc::channel();
        self.pipe.tx = Some(tx);
        self.pipe.replies = Some(reply_rx);
        let (spare_tx, spare_rx) = mpsc::channel();
        self.pipe.spare = Some(spare_rx);
        let mut m = std::thread::scope(|s| {
            let worker = s.spawn(move || observe_all(observer, rx, reply_tx, spare_tx));
            // Close the channel even if the loop panics, or the scope would wait forever
            // for the observer.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.events_loop(Micros::MAX, progress);
                progress(&Progress {
                    now: self.sc.duration,
                    duration: self.sc.duration,
                    requests: self.metrics.requests,
                });
                self.drain_layers();
            }));
            self.pipe.flush();
            self.pipe.tx = None;
            let observed = worker.join();
            if let Err(panic) = ran {
                std::panic::resume_unwind(panic);
            }
            match observed {
                Ok(m) => m,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        });
        m.add_counts(&self.metrics);
        m.finish();
        report::build(self.sc, self.seed, &m, &self.gossip, &self.heals)
    }
}

/// Runs a scenario under `seed`.
pub fn run(sc: &Scenario, seed: u64, progress: &mut dyn FnMut(&Progress)) -> Report {
    Sim::new(sc, seed).run(progress)
}
