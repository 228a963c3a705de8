//! The simulator's daemons decide as the daemon does: one request sequence, through the
//! daemon's real engine (`sluiced::engine::Engine` on a memory store, in virtual time) and
//! through the simulator's daemon path ([`Sim::decide`]), must get identical decisions,
//! request by request.
//!
//! The sequence has two regions of one daemon each, a global token bucket (with an override),
//! a global fixed window, a sliding window, a GCRA and an hourly quota, costs of 1 to 3,
//! shipments between the regions delivered 70 ms after they are made (the same entries to
//! both sides: what the daemons' shippers selected), and an outage of each region's store,
//! through which its breaker opens, probes and closes. A named store, `bigcorp`, counts
//! the GCRA rule (but vip's, kept on the main store by `store: default`) and bob's fixed
//! window and quota (overrides); it fails in `us` on its own, so both sides must route each
//! call to its store and keep a guard, local buckets and a journal selection per store.
//! Concurrency rules are left out: the simulator does not model requests that hold a slot.

use sluice_control::Published;
use sluice_core::Micros;
use sluice_core::batch::{Call, CallResult, GiveBack};
use sluice_core::breaker::BreakerConfig;
use sluice_core::decision::{Answer, Code, Decision, Plan, Via};
use sluice_core::hotkeys::lease::SWEEP;
use sluice_core::matching::Descriptors;
use sluice_core::merge::RemoteCounts;
use sluice_core::rules::RuleSet;
use sluice_core::ship::{Budget, BusyOn, BusyRule, LocalUsage, ShipEntry, observations};
use sluice_core::time::{MILLI, SECOND};
use sluice_core::{Params, Remote};
use sluice_sim::engine::Sim;
use sluice_store::{BoxFuture, MemoryStore, Store, StoreError};
use sluiced::clock::{Clock as _, ManualClock};
use sluiced::engine::{Engine, RemoteSource, UsageSink};
use sluiced::metrics::Metrics;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SCENARIO: &str = r#"
name = "differential"
duration_s = 90
seed = 7
regions = ["us", "eu"]
daemons_per_region = 1
domain = "d"

[store]
latency_ms = { dist = "fixed", value = 0 }
local_permille = 500
breaker_failure_pct = 50
breaker_window_ms = 5000
breaker_min_calls = 4
breaker_cool_off_ms = 2000

# Each region's daemon ships (and sweeps its view) at these phases; the test's shippers for
# the daemon's side tick at the same moments (`sequence`).
[gossip]
ship_interval_ms = 1000
phase_ms = [0, 500]

[[rules]]
id = "bucket"
key = ["user"]
algorithm = "token_bucket"
rate_per_s = 2
burst = 6
scope = "global"
share_threshold = 0
on_store_failure = "local"

[[rules]]
id = "window"
match = { route = "a" }
key = ["user"]
algorithm = "fixed_window"
limit = 12
window = "10s"
scope = "global"
share_threshold = 0
on_store_failure = "local"

[[rules]]
id = "sliding"
match = { route = "b" }
key = ["user"]
algorithm = "sliding_window"
limit = 6
window = "5s"
on_store_failure = "closed"

[[rules]]
id = "gcra"
match = { route = "c" }
key = ["user"]
algorithm = "gcra"
rate_per_s = 1
burst = 3
on_store_failure = "open"
store = "bigcorp"

[[rules]]
id = "quota"
key = ["user"]
algorithm = "fixed_window"
limit = 120
window = "1h"
on_store_failure = "local"

[[overrides]]
identity = { user = "vip" }
rule = "bucket"
rate_per_s = 6
burst = 12

[[overrides]]
identity = { user = "bob" }
rule = "window"
store = "bigcorp"

[[overrides]]
identity = { user = "bob" }
rule = "quota"
store = "bigcorp"

[[overrides]]
identity = { user = "vip" }
rule = "gcra"
store = "default"

# Its breaker and latency are the main store's, as the daemon's side gives it.
[stores.bigcorp]

# The daemon's side is given the same outages by hand (`OUTAGES`).
[[events]]
kind = "store_failover"
at_s = 20
region = "us"
lost_ms = 0
outage_ms = 6000

[[events]]
kind = "store_failover"
at_s = 45
region = "eu"
lost_ms = 0
outage_ms = 3000

[[events]]
kind = "store_failover"
at_s = 32
region = "us"
store = "bigcorp"
lost_ms = 0
outage_ms = 7000

# No traffic of its own: the test gives every request.
[[traffic]]
rate_per_s = 0
keys = { kind = "one", name = "unused" }
"#;

/// `(region, named, from, to)` of each store outage, as in `SCENARIO`'s events (`named`:
/// bigcorp's, else the main store's).
const OUTAGES: [(usize, bool, Micros, Micros); 3] = [
    (0, false, 20 * SECOND, 26 * SECOND),
    (1, false, 45 * SECOND, 48 * SECOND),
    (0, true, 32 * SECOND, 39 * SECOND),
];

/// The breaker `SCENARIO` configures, as the daemon's config gives it.
fn breaker() -> BreakerConfig {
    BreakerConfig {
        failure_pct: 50,
        window: 5 * SECOND,
        min_calls: 4,
        cool_off: 2 * SECOND,
        probes: BreakerConfig::default().probes,
    }
}

/// A memory store that can be taken down: while down every call fails as an outage.
struct Flaky {
    inner: MemoryStore,
    down: AtomicBool,
}

impl Store for Flaky {
    fn check<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<CallResult, StoreError>> {
        let r = if self.down.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable("connection refused".into()))
        } else {
            self.inner.check_sync(call)
        };
        Box::pin(std::future::ready(r))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        request_id: &'a str,
        now: Micros,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(self
            .inner
            .release_sync(key, request_id, now))))
    }

    fn give_back<'a>(&'a self, g: &'a GiveBack) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(self.inner.give_back_sync(g)))
    }

    fn kind(&self) -> &'static str {
        "flaky"
    }
}

/// The daemon's merge layer without the network: shipments are merged as the gossip node
/// merges them (the rule's numbers from the key), and the engine reads `remote_for`.
struct View {
    remote: Mutex<RemoteCounts>,
    rules: Arc<Published>,
}

impl View {
    fn merge(&self, from: &str, entries: &[ShipEntry], now: Micros) {
        let set = self.rules.load();
        let mut remote = self.remote.lock().expect("lock");
        for e in entries {
            let Some(params) = sluice_core::keys::parse(&e.key).and_then(|k| {
                let dom = set.domain(&sluice_core::keys::domain(k.identity))?;
                Some(dom.rule(k.rule)?.params.clone())
            }) else {
                panic!("a shipped key of no rule: {}", e.key);
            };
            remote.merge(from, &e.key, &params, e.window_start, e.count, now);
        }
    }
}

impl RemoteSource for View {
    fn remote(&self, key: &str, params: &Params, now: Micros) -> Remote {
        self.remote
            .lock()
            .expect("lock")
            // The sequence's two regions, as the engine counts them.
            .remote_for(key, params, now, 2)
    }
}

/// The daemon's shipper without the network: what the store answered for global rules,
/// recorded as the daemon's `Regions` records it, selected every interval.
struct Shipper {
    usage: Mutex<LocalUsage>,
    /// The scenario's default busy rule over its two regions.
    rule: BusyRule,
}

impl UsageSink for Shipper {
    fn observe(&self, plan: &Plan<'_>, answers: &[Answer], now: Micros) {
        let mut u = self.usage.lock().expect("lock");
        for (a, o) in observations(plan, answers, self.rule, None) {
            u.observe(&a.key, &a.params, now, o);
        }
    }
}

/// One region of the daemon's side.
struct Region {
    name: String,
    engine: Engine,
    store: Arc<Flaky>,
    /// Its named store `bigcorp`.
    big: Arc<Flaky>,
    view: Arc<View>,
    shipper: Arc<Shipper>,
}

fn flaky() -> Arc<Flaky> {
    Arc::new(Flaky {
        inner: MemoryStore::default(),
        down: AtomicBool::new(false),
    })
}

fn region(name: &str, rules: &Arc<Published>, clock: &Arc<ManualClock>) -> Region {
    let (store, big) = (flaky(), flaky());
    let view = Arc::new(View {
        remote: Mutex::new(RemoteCounts::new(name, 1_000_000, 0)),
        rules: rules.clone(),
    });
    let shipper = Arc::new(Shipper {
        usage: Mutex::new(LocalUsage::new(0)),
        rule: BusyRule {
            on: BusyOn::default(),
            regions: 2,
        },
    });
    let mut engine = Engine::new(
        rules.clone(),
        store.clone(),
        Arc::new(Metrics::default()),
        500,
        Duration::from_secs(30),
        name.into(),
        breaker(),
    )
    .with_clock(clock.clone());
    engine.add_store(sluiced::stores::Backend::new(
        "bigcorp",
        big.clone(),
        None,
        Duration::from_secs(30),
        breaker(),
    ));
    engine.remote = Some(view.clone());
    engine.usage = Some(shipper.clone());
    // The daemon's default hot-key layer (deny cache on), as each simulated daemon has.
    engine.hot = Some(Arc::new(sluiced::hot::HotKeys::new(100_000, 10_000)));
    Region {
        name: name.into(),
        engine,
        store,
        big,
        view,
        shipper,
    }
}

/// What happens at a moment of the sequence.
enum Step {
    Request {
        region: usize,
        user: &'static str,
        route: &'static str,
        cost: u64,
    },
    /// Region `from`'s gossip tick: its view is swept and its shipper selects what it sends.
    Ship { from: usize },
    /// A shipment reaches the other region.
    Deliver {
        from: usize,
        entries: Vec<ShipEntry>,
    },
    /// A region's store (`named`: bigcorp) goes down or comes back (the simulator's side
    /// has it as events).
    Store {
        region: usize,
        named: bool,
        down: bool,
    },
    /// Every daemon's hot-key sweep (the simulator's side runs its own at the same times).
    Sweep,
}

/// Steps at one moment run timers first, then requests, as the simulator orders them (its
/// timers were scheduled before any request given at that moment).
type Order = (Micros, u8, u64);

/// A small fixed PRNG (64-bit LCG): the sequence is the same on every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// The sequence: ~10 requests/s per region for 60 s, each region shipping every second
/// (half a second apart), the stores out as in [`OUTAGES`].
fn sequence() -> BTreeMap<Order, Step> {
    let mut steps = BTreeMap::new();
    let mut seq = 0;
    let mut at = |steps: &mut BTreeMap<_, _>, t: Micros, s: Step| {
        seq += 1;
        let prio = u8::from(matches!(s, Step::Request { .. }));
        steps.insert((t, prio, seq), s);
    };
    let mut rng = Lcg(42);
    let users = ["alice", "bob", "vip"];
    let routes = ["a", "b", "c"];
    let mut t = 0;
    while t < 60 * SECOND {
        t += (1 + rng.below(100)) * MILLI;
        let step = Step::Request {
            region: rng.below(2) as usize,
            user: users[rng.below(3) as usize],
            route: routes[rng.below(3) as usize],
            cost: [1, 1, 2, 3][rng.below(4) as usize],
        };
        at(&mut steps, t, step);
    }
    // The simulator's ship timers: phase 0 is taken as 1 µs.
    for s in 0..60 {
        at(&mut steps, s * SECOND + 1, Step::Ship { from: 0 });
        at(&mut steps, s * SECOND + 500 * MILLI, Step::Ship { from: 1 });
    }
    let mut t = SWEEP;
    while t < 61 * SECOND {
        at(&mut steps, t, Step::Sweep);
        t += SWEEP;
    }
    for (region, named, down, up) in OUTAGES {
        at(
            &mut steps,
            down,
            Step::Store {
                region,
                named,
                down: true,
            },
        );
        at(
            &mut steps,
            up,
            Step::Store {
                region,
                named,
                down: false,
            },
        );
    }
    steps
}

/// What the sequence did, to show it reached what it is meant to.
#[derive(Debug, Default)]
struct Seen {
    requests: u64,
    over_limit: u64,
    unavailable: u64,
    local: u64,
    failed_open: u64,
    shipped: u64,
}

impl Seen {
    fn count(&mut self, d: &Decision) {
        self.requests += 1;
        self.over_limit += u64::from(d.code == Code::OverLimit);
        self.unavailable += u64::from(d.code == Code::Unavailable);
        for p in &d.policies {
            self.local += u64::from(p.via == Via::Local);
            self.failed_open += u64::from(p.via == Via::FailedOpen);
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_simulators_daemons_decide_as_the_daemons_engine_does() {
    let sc = sluice_sim::parse(SCENARIO, &[]).unwrap_or_else(|e| panic!("{e}"));
    let mut sim = Sim::new(&sc, sc.seed);
    let rules = Published::new(RuleSet {
        version: 1,
        domains: [(sc.domain.clone(), sc.rules.clone())].into(),
    });
    let clock = Arc::new(ManualClock::new(0));
    let regions = [region("us", &rules, &clock), region("eu", &rules, &clock)];
    let mut steps = sequence();
    let mut seen = Seen::default();
    let budget = Budget::default();
    let mut deliveries = u64::MAX / 2;
    while let Some(((t, _, _), step)) = steps.pop_first() {
        clock.advance(t - clock.now());
        match step {
            Step::Request {
                region,
                user,
                route,
                cost,
            } => {
                let pairs = vec![
                    ("route".to_string(), route.to_string()),
                    ("user".to_string(), user.to_string()),
                ];
                let daemon = regions[region]
                    .engine
                    .check(&sc.domain, pairs.clone(), cost)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .decision;
                let d = Descriptors::new(pairs).unwrap_or_else(|e| panic!("{e}"));
                let simulated = sim.decide(region, 0, t, &d, cost);
                assert_eq!(
                    simulated.as_ref(),
                    Some(&daemon),
                    "request {} at {} ms in {}: {user} {route} cost {cost}",
                    seen.requests,
                    t / MILLI,
                    regions[region].name,
                );
                seen.count(&daemon);
            }
            Step::Ship { from } => {
                regions[from].view.remote.lock().expect("lock").sweep(t);
                let batch = regions[from]
                    .shipper
                    .usage
                    .lock()
                    .expect("lock")
                    .select(t, &budget);
                seen.shipped += batch.entries.len() as u64;
                if !batch.entries.is_empty() {
                    let step = Step::Deliver {
                        from,
                        entries: batch.entries,
                    };
                    deliveries += 1;
                    steps.insert((t + 70 * MILLI, 0, deliveries), step);
                }
            }
            Step::Deliver { from, entries } => {
                let to = 1 - from;
                regions[to].view.merge(&regions[from].name, &entries, t);
                sim.deliver(to, from, t, entries);
            }
            Step::Store {
                region,
                named,
                down,
            } => {
                let r = &regions[region];
                let store = if named { &r.big } else { &r.store };
                store.down.store(down, Ordering::SeqCst);
            }
            Step::Sweep => {
                for r in &regions {
                    if let Some(hot) = &r.engine.hot {
                        hot.sweep(&r.engine, t, Duration::from_secs(30), false)
                            .await;
                    }
                }
            }
        }
    }
    // The sequence reached every path it is meant to.
    assert!(seen.requests > 1_000, "{seen:?}");
    assert!(seen.over_limit > 100, "{seen:?}");
    assert!(seen.unavailable > 0, "{seen:?}");
    assert!(seen.local > 50, "{seen:?}");
    assert!(seen.failed_open > 0, "{seen:?}");
    assert!(seen.shipped > 50, "{seen:?}");
    // Both stores' outages opened their daemon's breaker, which refused calls, and quota
    // admissions decided on local buckets were selected for the journal.
    let m = &sim.metrics;
    assert!(m.breaker_opened >= 2, "opened {} times", m.breaker_opened);
    assert!(m.breaker_refused > 0 && m.journaled > 0, "{seen:?}");
    // Bigcorp's outage reached it alone: its own failures, breaker openings and journal
    // selection, and the daemon's side counted the same failure answers per store.
    let big = &m.stores[1];
    assert!(
        big.failures > 0 && big.breaker_opened >= 1 && big.journaled > 0,
        "{big:?}"
    );
    let mut daemon = [0u64; 2];
    for r in &regions {
        for (i, (_, f)) in r.engine.store_failures().iter().enumerate() {
            daemon[i] += f.all().iter().map(|(_, n)| n).sum::<u64>();
        }
    }
    let sim_answers = |s: &sluice_sim::per_store::StoreCounters| {
        s.answered_open + s.answered_closed + s.answered_local
    };
    assert_eq!(
        daemon,
        [sim_answers(&m.stores[0]), sim_answers(big)],
        "failure answers per store"
    );
}
