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
//! Time is virtual, in microseconds, passed as `now`. Events at the same instant run in the
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
//! - gossip messages go from each shipping daemon to every daemon of every other region that
//!   is up, each with its own delay draw and loss; a partition drops them, in flight too.
//!   With `delivery = "per_region"` a region's daemons get a message at one moment (one draw
//!   per region), hold the same view, and share one `RemoteCounts`: the first daemon's.

use crate::metrics::{Counter, HealCount, Measured, Metrics, NewTruth, TruthIndex};
use crate::report::{self, Report};
use crate::rng::Rng;
use crate::scenario::{Delivery, Event, Scenario, Shippers};
use crate::traffic::Generator;
use sluice_core::Micros;
use sluice_core::batch::{Call, CallResult, GiveBack};
use sluice_core::decision::{Answer, Code, Decision, Plan, Via, plan};
use sluice_core::guard::{Admit, Ended, StoreGuard, Transition};
use sluice_core::hash::InlineKey;
use sluice_core::hotkeys::gate::SyncCall;
use sluice_core::hotkeys::{CallPolicy, Layer, lease};
use sluice_core::matching::Descriptors;
use sluice_core::merge::RemoteCounts;
use sluice_core::rules::{Domain, Mode, Rule, Scope};
use sluice_core::ship::{Batch, LocalUsage, Observed, ShipEntry, message_bytes, observations};
use sluice_core::time::SECOND;
use sluice_store::MemoryStore;
use smallvec::SmallVec;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::rc::Rc;
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

struct Daemon {
    remote: RemoteCounts,
    local: MemoryStore,
    /// Its store guard, as the daemon's engine keeps one per store shard (a region's store
    /// is one shard): the breaker, what a call's ending counts as, when `local` goes.
    guard: StoreGuard,
    /// The hot-key layer every store call of the daemon goes through.
    hot: Layer,
    /// Incarnation: bumped when the daemon restarts (messages to an older one are dropped).
    epoch: u32,
    /// Ship timer generation: bumped when the timer restarts (older ticks lapse).
    timer: u32,
    /// Stopped by a `daemon_down` (its region's other daemons take its traffic).
    up: bool,
}

struct Replica {
    store: MemoryStore,
    lag: Micros,
    queue: VecDeque<(Micros, Write)>,
}

/// A write the primary executed, for the replica to replay.
enum Write {
    /// A store call (as sent: a lease call carries its batch as cost).
    Check(Call),
    /// A lease's give-back.
    GiveBack(GiveBack),
}

/// The rules' version the simulated daemons decide under (the rules never change in a run).
const RULES_VERSION: u64 = 1;

/// Bounds of each simulated daemon's hot-key layer: the daemon's defaults
/// (`hot_keys.deny_entries`, `hot_keys.leases`). The daemon splits them over shards of one
/// layer each; the simulator keeps one layer per daemon, which differs only at the bounds.
const DENY_ENTRIES: usize = 100_000;
const LEASES: usize = 10_000;

struct Region {
    up: bool,
    store: MemoryStore,
    replica: Option<Replica>,
    store_down_until: Micros,
    last_exec: Micros,
    daemons: Vec<Daemon>,
    latency_rng: Rng,
    phase_rng: Rng,
}

struct Msg {
    from: usize,
    entries: Vec<ShipEntry>,
}

struct Pending<'a> {
    region: usize,
    daemon: usize,
    /// The generator and key it came from; `None` for a request given by [`Sim::decide`].
    src: Option<(u32, u32)>,
    now: Micros,
    cost: u64,
    plan: Plan<'a>,
}

/// A store call waiting to execute. A region's store serialises its calls (their times never
/// decrease), so they wait in a FIFO per region rather than in the event heap; the loop merges
/// the FIFO fronts with the heap by `(at, seq)`, which is the order the heap would give.
struct Exec<'a> {
    at: Micros,
    seq: u64,
    p: Pending<'a>,
}

enum Ev {
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
enum Source {
    /// The event heap.
    Heap,
    /// A region's store queue.
    Exec(usize),
    /// A traffic generator's next arrival.
    Arrival(usize),
}

struct Queued {
    at: Micros,
    seq: u64,
    ev: Ev,
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

/// What the engine hands the observer thread, in order.
enum Rec {
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
    /// A daemon ships: answer with its [`Batch`].
    Select {
        region: usize,
        daemon: usize,
        now: Micros,
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
struct Obs {
    /// Inline: memory allocated on one thread and freed on the other costs more than the copy.
    key: InlineKey,
    params: sluice_core::Params,
    /// Share threshold, percent.
    th: u8,
    /// The figure and busy value.
    observed: Observed,
}

/// What the observer answers.
enum Reply {
    Batch(Batch),
    Heal(Vec<HealCount>),
}

/// Records sent per batch: large enough that the channel costs nothing per request, small
/// enough that the observer starts early and a shipment waits little.
const BATCH: usize = 1024;

/// The engine's end of the observer thread.
struct Pipe {
    buf: Vec<Rec>,
    tx: Option<mpsc::SyncSender<Vec<Rec>>>,
    replies: Option<mpsc::Receiver<Reply>>,
}

impl Pipe {
    fn send(&mut self, r: Rec) {
        self.buf.push(r);
        if self.buf.len() >= BATCH {
            self.flush();
        }
    }

    /// Sends what is buffered (kept until the observer runs).
    fn flush(&mut self) {
        let Some(tx) = &self.tx else { return };
        if self.buf.is_empty() {
            return;
        }
        let batch = std::mem::replace(&mut self.buf, Vec::with_capacity(BATCH));
        // A closed channel means the observer panicked; `run` reports that at join.
        let _ = tx.send(batch);
    }

    fn ask(&mut self, r: Rec) -> Option<Reply> {
        self.send(r);
        self.flush();
        self.replies.as_ref().and_then(|rx| rx.recv().ok())
    }

    /// Asks what daemon `d` of region `r` ships at `now`, without waiting: the observer
    /// answers once everything before is observed, and [`Pipe::selected`] takes the answers in
    /// the order they were asked.
    fn select(&mut self, region: usize, daemon: usize, now: Micros) {
        self.send(Rec::Select {
            region,
            daemon,
            now,
        });
        self.flush();
    }

    /// The answer to the oldest [`Pipe::select`] not yet taken.
    fn selected(&mut self) -> Batch {
        match self.replies.as_ref().and_then(|rx| rx.recv().ok()) {
            Some(Reply::Batch(b)) => b,
            _ => Batch::default(),
        }
    }

    /// The heal counts, once everything before them is counted.
    fn heal_counts(&mut self, now: Micros, up: Vec<bool>, th: Vec<u64>) -> Vec<HealCount> {
        match self.ask(Rec::Heal { now, up, th }) {
            Some(Reply::Heal(h)) => h,
            _ => Vec::new(),
        }
    }
}

/// The observer thread: handles every record, in order, then hands back the counts.
fn observe_all(
    mut o: Observer<'_>,
    rx: mpsc::Receiver<Vec<Rec>>,
    replies: mpsc::Sender<Reply>,
) -> Metrics {
    for batch in rx {
        for rec in batch {
            o.handle(rec, &replies);
        }
    }
    o.metrics
}

/// The second core's share of a run: the ground truth, and the shippers' usage tables. Both
/// only consume what a decision did; the engine asks back only at a shipment (what to send)
/// and at a heal (what to learn), after everything before it was counted. Fed the same
/// records in the same order, the run stays deterministic.
struct Observer<'a> {
    sc: &'a Scenario,
    seed: u64,
    metrics: Metrics,
    /// Per region, per daemon: what it observed, for its shipments.
    usage: Vec<Vec<LocalUsage>>,
}

/// Whether daemon `d` of a region ships.
fn ships(sc: &Scenario, d: usize) -> bool {
    sc.gossip.shippers == Shippers::EveryDaemon || d == 0
}

/// The daemon whose remote table daemon `d` reads and merges into: its own, or with
/// per-region delivery the region's first, which they all share.
fn view(sc: &Scenario, d: usize) -> usize {
    match sc.gossip.delivery {
        Delivery::PerDaemon => d,
        Delivery::PerRegion => 0,
    }
}

impl<'a> Observer<'a> {
    fn new(sc: &'a Scenario, domain: &Domain, seed: u64) -> Observer<'a> {
        let n = sc.regions.len();
        Observer {
            sc,
            seed,
            metrics: Metrics::new(domain.rules.len(), n, sc.warmup, sc.duration),
            usage: (0..n).map(|_| Vec::new()).collect(),
        }
    }

    fn handle(&mut self, rec: Rec, replies: &mpsc::Sender<Reply>) {
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
            } => {
                let batch = self.usage[region][daemon].select(now, &self.sc.gossip.budget);
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
    fn observe(&mut self, r: usize, d: usize, now: Micros, o: Obs) {
        // Copied from a `String`: always UTF-8.
        let Ok(key) = std::str::from_utf8(&o.key) else {
            return;
        };
        self.usage[r][d].observe(
            key,
            &o.params,
            o.th,
            now,
            o.observed.figure,
            o.observed.busy,
        );
    }
}

/// What one daemon still has to learn after a heal.
struct Need {
    key: String,
    rule: usize,
    expected: u64,
    expires: Micros,
}

/// Convergence after one heal.
pub struct HealTrack {
    /// When the partition healed.
    pub at: Micros,
    needs: Vec<Vec<Need>>,
    /// Needs still open.
    pub left: usize,
    /// Needs that ended with their window before being met.
    pub moot: usize,
    /// Keys that had something to learn.
    pub keys: usize,
    /// When the last need was met.
    pub done: Option<Micros>,
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
    /// Store calls in flight, per region, in execution order.
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
}

/// A shipment waiting for the observer's answer.
struct Shipping {
    region: usize,
    /// When it was shipped.
    now: Micros,
    /// The sequence number before its deliveries' (reserved at the ship).
    seq: u64,
}

/// Streams of randomness, so each consumer's draws are independent of the others.
const STREAM_TRAFFIC: u64 = 1 << 32;
const STREAM_LATENCY: u64 = 2 << 32;
const STREAM_PHASE: u64 = 3 << 32;
const STREAM_LINK: u64 = 4 << 32;

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
        let regions = (0..n)
            .map(|r| Region {
                up: true,
                store: MemoryStore::with_seed(sc.store.max_keys, store_seed(seed)),
                replica: sc.replica_lag[r].map(|lag| Replica {
                    store: MemoryStore::with_seed(sc.store.max_keys, store_seed(seed)),
                    lag,
                    queue: VecDeque::new(),
                }),
                store_down_until: 0,
                last_exec: 0,
                daemons: Vec::new(),
                latency_rng: Rng::stream(seed, STREAM_LATENCY + r as u64),
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
            },
            regions,
            up: vec![true; n],
            live: vec![vec![true; sc.daemons]; n],
            gens,
            heap: BinaryHeap::new(),
            arrivals: Vec::new(),
            execs: (0..n).map(|_| VecDeque::new()).collect(),
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
        };
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

    fn push(&mut self, at: Micros, ev: Ev) {
        self.seq += 1;
        self.heap.push(Queued {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// (Re)starts a region's daemons: empty tables, a fresh epoch (older timers and messages
    /// addressed to the previous incarnation are ignored), ship timers at random phases.
    fn start_daemons(&mut self, r: usize) {
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
                local: MemoryStore::with_seed(100_000, store_seed(self.seed)),
                guard: StoreGuard::for_store(sc.store.breaker, true),
                hot: Layer::new(DENY_ENTRIES, LEASES),
                epoch: old_epoch + 1,
                timer: 0,
                up: true,
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
    fn restart_ship_timers(&mut self, r: usize) {
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
    fn phase(&mut self, r: usize) -> Micros {
        match &self.sc.gossip.phases {
            Some(p) => p[r] % self.interval,
            None => (self.regions[r].phase_rng.unit() * self.interval as f64) as Micros,
        }
    }

    /// Runs to the end, calling `progress` now and then.
    pub fn run(mut self, progress: &mut dyn FnMut(&Progress)) -> Report {
        let observer = Observer::new(self.sc, self.domain, self.seed);
        let (tx, rx) = mpsc::sync_channel(16);
        let (reply_tx, reply_rx) = mpsc::channel();
        self.pipe.tx = Some(tx);
        self.pipe.replies = Some(reply_rx);
        let mut m = std::thread::scope(|s| {
            let worker = s.spawn(move || observe_all(observer, rx, reply_tx));
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

    /// The event loop, through every event due at or before `until` (`Micros::MAX`: to the
    /// end of the run).
    fn events_loop(&mut self, until: Micros, progress: &mut dyn FnMut(&Progress)) {
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
                    msg,
                } => self.deliver_to(region, daemon, epoch, &msg),
                Ev::Scenario(i) => self.scenario_event(i),
                Ev::Sweep {
                    region,
                    daemon,
                    epoch,
                } => self.sweep(region, daemon, epoch),
            }
        }
    }

    fn arrival(&mut self, g: usize) {
        let t = self.now;
        let sc = self.sc;
        let domain = self.domain;
        // Unique per request, as a daemon's are: a split rule picks its sub-count from it.
        let request_id = (self.seq + 1).to_string();
        let tg = &mut self.gens[g];
        let pick = tg
            .arrive(&self.up)
            .and_then(|(r, d, k)| Some((r, d.pick(&self.live[r])?, k)));
        match pick {
            None => self.metrics.no_region += 1,
            Some((r, d, k)) => {
                let cost = tg.cfg.cost;
                let remote = &self.regions[r].daemons[view(sc, d)].remote;
                let p = plan(domain, tg.descriptors(k), t, cost, &request_id, |a| {
                    remote.remote_for(&a.key, &a.params, t)
                });
                self.queue(r, d, Some((g as u32, k as u32)), t, cost, p);
            }
        }
        if let Some(next) = self.gens[g].next_at()
            && next < sc.duration
        {
            self.seq += 1;
            self.arrivals[g] = Some((next, self.seq));
        }
    }

    /// Queues a request planned at `t` on daemon `d` of region `r`: its store calls execute
    /// `latency` later, in arrival order per region. `None` when no rule applies: allowed
    /// without a store call.
    fn queue(
        &mut self,
        r: usize,
        d: usize,
        src: Option<(u32, u32)>,
        t: Micros,
        cost: u64,
        p: Plan<'a>,
    ) -> Option<Micros> {
        if p.calls.is_empty() {
            self.metrics.requests += 1;
            self.metrics.admitted += 1;
            return None;
        }
        let region = &mut self.regions[r];
        let lat = self.sc.store.latency.sample(&mut region.latency_rng);
        let at = (t + lat).max(region.last_exec);
        region.last_exec = at;
        self.seq += 1;
        self.execs[r].push_back(Exec {
            at,
            seq: self.seq,
            p: Pending {
                region: r,
                daemon: d,
                src,
                now: t,
                cost,
                plan: p,
            },
        });
        Some(at)
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
        let remote = &self.regions[r].daemons[view(self.sc, d)].remote;
        let p = plan(self.domain, descriptors, at, cost, &request_id, |a| {
            remote.remote_for(&a.key, &a.params, at)
        });
        let unlimited = p.calls.is_empty().then(|| p.decide(RULES_VERSION, &[]));
        let exec_at = match self.queue(r, d, None, at, cost, p) {
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
        let msg = Msg { from, entries };
        for d in 0..self.sc.daemons {
            if view(self.sc, d) == d {
                let epoch = self.regions[r].daemons[d].epoch;
                self.deliver_to(r, d, epoch, &msg);
            }
        }
    }

    /// Applies to the replica what it had received by `now`.
    fn replicate(&mut self, r: usize, now: Micros) {
        if let Some(rep) = &mut self.regions[r].replica {
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

    /// Executes a request's store calls and decides it; `None` when it was lost in flight.
    fn exec(&mut self, p: Pending<'a>) -> Option<Decision> {
        let Pending {
            region: r,
            daemon: d,
            src,
            now,
            cost,
            plan,
        } = p;
        let sim_now = self.now;
        if !self.regions[r].up || !self.regions[r].daemons[d].up {
            self.metrics.failed_in_flight += 1;
            return None;
        }
        self.metrics.requests += 1;
        self.replicate(r, sim_now);
        let store_ok = sim_now >= self.regions[r].store_down_until;
        let permille = self.sc.store.local_permille;
        let mut answers = Vec::with_capacity(plan.calls.len());
        for (i, pc) in plan.calls.iter().enumerate() {
            let rules: SmallVec<[usize; 4]> = pc
                .rules
                .iter()
                .map(|&ai| self.rule_index(plan.applied[ai].rule))
                .collect();
            let Region {
                store,
                replica,
                daemons,
                ..
            } = &mut self.regions[r];
            let Daemon {
                hot, guard, local, ..
            } = &mut daemons[d];
            let before = hot.stats();
            let (mut calls, mut g) = (0, GuardCounts::default());
            // Through the hot-key layer, as the daemon does: it answers the call itself, or
            // sends it as planned or as a lease call, each one through the daemon's store
            // guard to the store here.
            let res = hot.call_sync(pc, CallPolicy::of(&plan, i), RULES_VERSION, |call| {
                let sent = guarded(guard, local, sim_now, store_ok.then_some(&*store), call);
                calls += u64::from(g.count(&sent));
                let res = sent.res.flatten();
                if let (Some(rep), Some(_)) = (replica.as_mut(), &res) {
                    rep.queue
                        .push_back((sim_now + rep.lag, Write::Check(call.clone())));
                }
                res
            });
            let after = hot.stats();
            self.metrics.store_calls += calls;
            g.add_to(&mut self.metrics);
            let sec = (now / SECOND) as usize;
            for ri in rules {
                let per_s = &mut self.metrics.calls_per_s[ri];
                if per_s.len() <= sec {
                    per_s.resize(sec + 1, (0, 0));
                }
                per_s[sec].0 += 1;
                per_s[sec].1 += calls;
                let h = &mut self.metrics.hot[ri];
                h.requests += 1;
                h.store_calls += calls;
                h.deny_hits += after.deny_hits - before.deny_hits;
                h.lease_spent += after.lease_spent - before.lease_spent;
                h.lease_blocked += after.lease_blocked - before.lease_blocked;
                h.lease_calls += after.lease_calls - before.lease_calls;
                h.leased_units += after.leased_units - before.leased_units;
                h.samples += after.samples - before.samples;
                h.sample_skipped += after.sample_skipped - before.sample_skipped;
                h.sample_blocked += after.sample_blocked - before.sample_blocked;
                let gated = after.gate_admitted - before.gate_admitted;
                h.gate_admitted += gated;
                h.gate_admitted_units += gated * pc.call.cost;
                h.gate_refused += after.gate_refused - before.gate_refused;
                h.gate_to_store += after.gate_to_store - before.gate_to_store;
            }
            self.metrics.store_failures += u64::from(res.is_none());
            answers.push(sluice_core::guard::answer(&plan, i, res, permille, |c| {
                local.check_sync(c).ok()
            }));
        }
        let decision = plan.decide(RULES_VERSION, &answers);
        // The daemon journals these and replays them into the store once it answers again;
        // the simulator counts them.
        self.metrics.journaled +=
            sluice_core::guard::journaled(&plan, &answers, &decision, cost).count() as u64;
        self.measure(r, src, now, cost, &plan, &decision);
        self.observe(r, d, now, &plan, &answers);
        Some(decision)
    }

    /// The index of a rule of the domain, from its address (the plan borrows the domain's
    /// rules), checked.
    fn rule_index(&self, rule: &Rule) -> usize {
        let rules = &self.domain.rules;
        let size = std::mem::size_of::<Rule>().max(1);
        let off = (rule as *const Rule as usize).wrapping_sub(rules.as_ptr() as usize) / size;
        match rules.get(off) {
            Some(r) if std::ptr::eq(r, rule) => off,
            _ => rules
                .iter()
                .position(|r| std::ptr::eq(r, rule))
                .unwrap_or(0),
        }
    }

    /// What one decided request did to the ground truth, for the observer: the counters it
    /// reached (numbered here, where the keys are), and whether each refused.
    fn measure(
        &mut self,
        r: usize,
        src: Option<(u32, u32)>,
        now: Micros,
        cost: u64,
        plan: &Plan<'a>,
        decision: &Decision,
    ) {
        let mut m = Measured {
            region: r as u8,
            now,
            cost,
            code: decision.code,
            local: decision
                .policies
                .iter()
                .filter(|p| p.via == Via::Local)
                .count() as u32,
            decided_by: None,
            counters: SmallVec::new(),
        };
        for a in &plan.applied {
            if a.rule.mode != Mode::Enforce {
                continue;
            }
            let ri = self.rule_index(a.rule);
            let region = match a.rule.scope {
                Scope::Global => None,
                Scope::Region => Some(r),
            };
            // The counter a (traffic, key, rule, region) reaches never changes: look it up
            // by numbers instead of hashing the store key.
            let tag = (ri * 65 + region.map_or(0, |r| r + 1)) as u32;
            let mut uncached = SmallVec::new();
            let cached = match src {
                Some((traffic, key)) => self.gens[traffic as usize].truth(key as usize),
                None => &mut uncached,
            };
            let id = match cached.iter().find(|(t, _)| *t == tag) {
                Some(&(_, id)) => id,
                None => {
                    // A split rule's truth is the whole key's: its sub-counts add up to it.
                    let (id, new) = match &a.split {
                        Some(sp) => {
                            let (whole, _) = sluice_core::keys::split_identity(&a.identity);
                            let key =
                                sluice_core::keys::store_key(whole, &a.rule.id, sp.whole.kind());
                            self.index.id(ri, region, &key, &sp.whole)
                        }
                        None => self.index.id(ri, region, &a.key, &a.params),
                    };
                    if let Some(new) = new {
                        self.pipe.send(Rec::Truth(new));
                    }
                    cached.push((tag, id));
                    id
                }
            };
            let refusing = decision.code == Code::OverLimit
                && decision
                    .policies
                    .iter()
                    .any(|p| !p.allowed && p.via != Via::FailedClosed && p.id == a.rule.id);
            if decision.decided_by.as_deref() == Some(&*a.rule.id) {
                m.decided_by = Some(m.counters.len() as u32);
            }
            m.counters.push(Counter {
                id,
                rule: ri as u32,
                charge_rejected: a.rule.charge_rejected,
                refusing,
            });
        }
        self.pipe.send(Rec::Request(m));
    }

    /// Hands the observer what the store answered for global rules, for the daemon's
    /// shipper: the core's [`observations`], as the daemon records them.
    fn observe(&mut self, r: usize, d: usize, now: Micros, plan: &Plan<'a>, answers: &[Answer]) {
        if !ships(self.sc, d) {
            return;
        }
        for (a, observed) in observations(plan, answers, self.sc.gossip.busy_on) {
            let obs = Obs {
                key: InlineKey::from_slice(a.key.as_bytes()),
                params: a.params.as_ref().clone(),
                th: self.threshold.unwrap_or(a.rule.share_threshold_pct),
                observed,
            };
            self.pipe.send(Rec::Observe {
                region: r,
                daemon: d,
                now,
                obs,
            });
        }
    }

    /// A daemon's hot-key sweep: cached refusals expire, and the give-backs of leases gone
    /// quiet, ended or retired go to the region's store.
    fn sweep(&mut self, r: usize, d: usize, epoch: u32) {
        let now = self.now;
        let region = &mut self.regions[r];
        if !region.up || region.daemons[d].epoch != epoch {
            return;
        }
        let live = self.live[r].iter().filter(|u| **u).count() as u64;
        let hot = &mut region.daemons[d].hot;
        // The membership as it is now: a local share is the rule's numbers ÷ this.
        hot.set_daemons(live);
        let backs = hot.sweep(now);
        let syncs = hot.syncs(now);
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
    fn sync(&mut self, r: usize, d: usize, syncs: Vec<SyncCall>, now: Micros) {
        if syncs.is_empty() {
            return;
        }
        self.replicate(r, now);
        let store_ok = self.regions[r].up && now >= self.regions[r].store_down_until;
        let sec = (now / SECOND) as usize;
        for s in syncs {
            let region = &mut self.regions[r];
            let daemon = &mut region.daemons[d];
            // A sync is a store call of the daemon's like any other: through its guard.
            let guarded = guarded(
                &mut daemon.guard,
                &daemon.local,
                now,
                store_ok.then_some(&region.store),
                &s.call,
            );
            let mut g = GuardCounts::default();
            let sent = u64::from(g.count(&guarded));
            g.add_to(&mut self.metrics);
            let res = guarded.res.flatten();
            if res.is_some()
                && let Some(rep) = &mut region.replica
            {
                rep.queue
                    .push_back((now + rep.lag, Write::Check(s.call.clone())));
            }
            self.metrics.store_calls += sent;
            let answered = res.is_some();
            let took = self.regions[r].daemons[d].hot.synced(&s, res, now);
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
    fn rules_of(&self, call: &Call) -> SmallVec<[usize; 4]> {
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

    /// A daemon that stops: gracefully, its leases are given back and its pending units
    /// synced, as the daemon's shutdown does; a crash loses both (the units a gate admitted
    /// and had not synced are counted, per rule, as lost).
    fn stop_daemon(&mut self, r: usize, d: usize, graceful: bool, now: Micros) {
        let hot = &mut self.regions[r].daemons[d].hot;
        if graceful {
            let backs = hot.drain(now);
            let syncs = hot.drain_syncs(now);
            self.give_back(r, backs, now);
            self.sync(r, d, syncs, now);
        } else {
            for s in hot.drain_syncs(now) {
                for ri in self.rules_of(&s.call) {
                    self.metrics.hot[ri].gate_lost_units += s.call.cost;
                }
            }
        }
    }

    /// Hands give-backs to region `r`'s store, as the daemon's sweep does: each once, lost
    /// when the store is out (the daemon never resends one: it is not idempotent).
    fn give_back(&mut self, r: usize, backs: Vec<GiveBack>, now: Micros) {
        if backs.is_empty() {
            return;
        }
        // In the layer's order: its maps are keyed by a fixed seed (`Layer::new`), so the
        // order, and the store's writes at its key bound, are the same on every rerun.
        self.replicate(r, now);
        let store_ok = now >= self.regions[r].store_down_until;
        for g in backs {
            if let Some(ri) = sluice_core::keys::parse(&g.key)
                .and_then(|k| self.domain.rules.iter().position(|x| &*x.id == k.rule))
            {
                self.metrics.hot[ri].returned_units += g.units;
            }
            let region = &mut self.regions[r];
            let res = if store_ok {
                region.store.give_back_sync(&g).ok()
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
                    if let Some(rep) = &mut region.replica {
                        rep.queue.push_back((now + rep.lag, Write::GiveBack(g)));
                    }
                }
                None => self.metrics.give_backs_failed += 1,
            }
        }
    }

    /// The end of the run: every daemon that is up drains its leases and pending sync units
    /// into its store, and the layers' counters join the run's.
    fn drain_layers(&mut self) {
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

    fn ship(&mut self, r: usize, d: usize, epoch: u32, timer: u32) {
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
        self.pipe.select(r, d, now);
        let daemon = &mut self.regions[r].daemons[d];
        if view(sc, d) == d {
            daemon.remote.sweep(now);
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
    fn send_shipments(&mut self) {
        while let Some(s) = self.shipping.pop_front() {
            let batch = self.pipe.selected();
            self.send_shipment(s, batch);
        }
        self.shipping_due = Micros::MAX;
    }

    fn send_shipment(&mut self, s: Shipping, batch: Batch) {
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

    fn deliver_to(&mut self, r: usize, d: usize, epoch: u32, msg: &Msg) {
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
                .merge(from, &e.key, &rule.params, e.window_start, e.count, now)
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

    fn check_heals(&mut self, r: usize, d: usize) {
        let now = self.now;
        let gi = r * self.sc.daemons + d;
        let domain = self.domain;
        let remote = &self.regions[r].daemons[view(self.sc, d)].remote;
        for h in self.heals.iter_mut().filter(|h| h.done.is_none()) {
            let (mut met, mut moot) = (0, 0);
            h.needs[gi].retain(|n| {
                if now >= n.expires {
                    moot += 1;
                    return false;
                }
                let params = &domain.rules[n.rule].params;
                if remote.remote_for(&n.key, params, now).cur >= n.expected {
                    met += 1;
                    return false;
                }
                true
            });
            h.left -= met + moot;
            h.moot += moot;
            if h.left == 0 {
                h.done = Some(now);
            }
        }
    }

    /// After a heal: what each daemon must learn for the views to agree again with the
    /// regions' counts at the heal (busy keys of global window rules).
    fn track_heal(&mut self) {
        let now = self.now;
        let sc = self.sc;
        let n = sc.regions.len();
        let mut needs: Vec<Vec<Need>> = (0..n * sc.daemons).map(|_| Vec::new()).collect();
        let th: Vec<u64> = self
            .domain
            .rules
            .iter()
            .map(|rule| u64::from(self.threshold.unwrap_or(rule.share_threshold_pct)))
            .collect();
        let mut keys = 0;
        for t in self.pipe.heal_counts(now, self.up.clone(), th) {
            let mut any = false;
            for q in (0..n).filter(|q| self.up[*q]) {
                let expected: u64 = (0..n).filter(|r| *r != q).map(|r| t.counts[r]).sum();
                if expected == 0 {
                    continue;
                }
                any = true;
                for d in 0..sc.daemons {
                    needs[q * sc.daemons + d].push(Need {
                        key: t.key.clone(),
                        rule: t.rule,
                        expected,
                        expires: t.end,
                    });
                }
            }
            keys += usize::from(any);
        }
        let left = needs.iter().map(Vec::len).sum();
        self.heals.push(HealTrack {
            at: now,
            needs,
            left,
            moot: 0,
            keys,
            done: (left == 0).then_some(now),
        });
        // Views may already agree (counts that crossed before the partition).
        for r in 0..n {
            if self.up[r] {
                for d in 0..sc.daemons {
                    self.check_heals(r, d);
                }
            }
        }
    }

    /// A peer region is back: every shipping daemon of the other regions that are up sends
    /// all its busy figures at its next shipment (when the scenario says so).
    fn resend_all(&mut self, except: Option<usize>) {
        if !self.sc.gossip.resend_on_rejoin {
            return;
        }
        let regions = (0..self.regions.len())
            .filter(|i| self.regions[*i].up && Some(*i) != except)
            .collect();
        self.pipe.send(Rec::ResendAll { regions });
    }

    fn scenario_event(&mut self, i: usize) {
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
                    let region = &mut self.regions[*r];
                    region.store = MemoryStore::with_seed(sc.store.max_keys, store_seed(self.seed));
                    if let Some(rep) = &mut region.replica {
                        rep.store =
                            MemoryStore::with_seed(sc.store.max_keys, store_seed(self.seed));
                        rep.queue.clear();
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
            Event::StoreFailover(r, outage) => {
                self.replicate(*r, now);
                let region = &mut self.regions[*r];
                if let Some(rep) = region.replica.take() {
                    self.metrics.lost_writes += rep.queue.len() as u64;
                    region.store = rep.store;
                }
                region.store_down_until = now + outage;
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

/// What one store call through a daemon's guard came to.
struct Guarded {
    /// `None`: the breaker refused it, nothing reached the store; else the store's answer
    /// (`None`: it failed).
    res: Option<Option<CallResult>>,
    /// The breaker opened on its ending.
    opened: bool,
}

/// The guards' counters of some calls, for the run's totals.
#[derive(Default)]
struct GuardCounts {
    refused: u64,
    opened: u64,
}

impl GuardCounts {
    /// Counts one call; whether it reached the store.
    fn count(&mut self, g: &Guarded) -> bool {
        self.refused += u64::from(g.res.is_none());
        self.opened += u64::from(g.opened);
        g.res.is_some()
    }

    fn add_to(&self, m: &mut Metrics) {
        m.breaker_refused += self.refused;
        m.breaker_opened += self.opened;
    }
}

/// One store call of a daemon through its guard, as the daemon's engine makes it
/// (`sluiced`'s `call_store`): refused while the breaker is open (nothing reaches the
/// store); otherwise sent to `store` (`None` while the store is out: the call fails as an
/// outage), its ending told to the guard, and the daemon's local buckets dropped when the
/// breaker closes (the region's store is one shard: they are all its).
fn guarded(
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

/// Runs a scenario under `seed`.
pub fn run(sc: &Scenario, seed: u64, progress: &mut dyn FnMut(&Progress)) -> Report {
    Sim::new(sc, seed).run(progress)
}
