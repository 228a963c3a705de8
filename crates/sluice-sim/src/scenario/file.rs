//! The scenario file as written: serde types for the TOML format (every field is described
//! in simulations/README.md), with its defaults. Unknown fields and wrong types are refused
//! by serde, naming them.

use serde::Deserialize;
use std::collections::BTreeMap;

/// A scenario file as written (see simulations/README.md for every field).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// Short name, printed in the report.
    pub name: String,
    /// What question the scenario answers.
    #[serde(default)]
    pub description: String,
    /// Simulated seconds.
    pub duration_s: f64,
    /// Default seed (`--seed` overrides it).
    #[serde(default = "one")]
    pub seed: u64,
    /// Region names.
    pub regions: Vec<String>,
    /// Daemons in every region.
    #[serde(default = "one")]
    pub daemons_per_region: u64,
    /// The counter store of each region.
    #[serde(default)]
    pub store: StoreFile,
    /// Named stores beside each region's main one (`[stores.NAME]`, the daemon's `stores:`),
    /// which rules and overrides name with `store:`: a tenant's counts, load and outages on
    /// a store of its own.
    #[serde(default)]
    pub stores: BTreeMap<String, NamedStoreFile>,
    /// The delta shipper and the network between regions.
    #[serde(default)]
    pub gossip: GossipFile,
    /// What is measured.
    #[serde(default)]
    pub measure: MeasureFile,
    /// The regions' clocks against the reference clock the ground truth counts on.
    #[serde(default)]
    pub clock: ClockFile,
    /// Domain name the rules and requests use.
    #[serde(default = "default_domain")]
    pub domain: String,
    /// Rules in the rule format (docs/rules.md), as TOML tables.
    pub rules: Vec<serde_json::Value>,
    /// Overrides in the rule format.
    #[serde(default)]
    pub overrides: Vec<serde_json::Value>,
    /// Traffic generators.
    pub traffic: Vec<TrafficFile>,
    /// Things that happen during the run.
    #[serde(default)]
    pub events: Vec<EventFile>,
}

fn one() -> u64 {
    1
}

fn default_domain() -> String {
    "sim".into()
}

/// A distribution of durations in milliseconds.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum DistFile {
    /// Always `value`.
    Fixed {
        /// The value.
        value: f64,
    },
    /// Uniform in `[min, max]`.
    Uniform {
        /// Lower end.
        min: f64,
        /// Upper end.
        max: f64,
    },
    /// Normal, truncated at 0.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        sd: f64,
    },
    /// `min` plus an exponential with mean `mean` (a long tail).
    Exponential {
        /// Mean of the exponential part.
        mean: f64,
        /// Offset.
        #[serde(default)]
        min: f64,
    },
}

/// `[store]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreFile {
    /// One store call's latency (ms), request to execution.
    #[serde(default = "default_store_latency")]
    pub latency_ms: DistFile,
    /// Local buckets' share of a rule's numbers when the store fails (per mille).
    #[serde(default)]
    pub local_permille: Option<u64>,
    /// Key bound of each region's store.
    #[serde(default = "default_store_keys")]
    pub max_keys: u64,
    /// Each daemon's store breaker opens above this percentage of failed calls (the
    /// daemon's `breaker_failure_pct`).
    #[serde(default)]
    pub breaker_failure_pct: Option<u64>,
    /// The breaker's window (the daemon's `breaker_window_ms`).
    #[serde(default)]
    pub breaker_window_ms: Option<u64>,
    /// Fewer calls in the window never open it (the daemon's `breaker_min_calls`).
    #[serde(default)]
    pub breaker_min_calls: Option<u64>,
    /// Time open before probing (the daemon's `breaker_cool_off_ms`).
    #[serde(default)]
    pub breaker_cool_off_ms: Option<u64>,
}

impl Default for StoreFile {
    fn default() -> Self {
        StoreFile {
            latency_ms: default_store_latency(),
            local_permille: None,
            max_keys: default_store_keys(),
            breaker_failure_pct: None,
            breaker_window_ms: None,
            breaker_min_calls: None,
            breaker_cool_off_ms: None,
        }
    }
}

/// `[stores.NAME]`: a named store in every region, the shape of `[store]`. What it leaves
/// out is the main store's, as the daemon's `stores:` entries take the main store's settings
/// they leave out. (`local_permille` is the daemon's, not a store's: `[store]`'s.)
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedStoreFile {
    /// One call's latency (ms), request to execution; `[store]`'s when absent.
    #[serde(default)]
    pub latency_ms: Option<DistFile>,
    /// Key bound of each region's copy of this store; `[store]`'s when absent.
    #[serde(default)]
    pub max_keys: Option<u64>,
    /// Each daemon's breaker of this store opens above this percentage of failed calls.
    #[serde(default)]
    pub breaker_failure_pct: Option<u64>,
    /// The breaker's window.
    #[serde(default)]
    pub breaker_window_ms: Option<u64>,
    /// Fewer calls in the window never open it.
    #[serde(default)]
    pub breaker_min_calls: Option<u64>,
    /// Time open before probing.
    #[serde(default)]
    pub breaker_cool_off_ms: Option<u64>,
}

fn default_store_latency() -> DistFile {
    DistFile::Uniform { min: 0.2, max: 0.6 }
}

fn default_store_keys() -> u64 {
    1_000_000
}

/// Who ships a region's figures.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shippers {
    /// Every daemon ships what it observed; receivers keep the max per region.
    EveryDaemon,
    /// Only the first daemon of each region ships.
    OnePerRegion,
    /// The daemon's default: every daemon sends its selection to its region's sender (in the
    /// region), which ships the max per key once per remote region to that region's receiver,
    /// which passes it on to its region's other daemons. Who sends where is the core's
    /// election (`sluice_core::relay`) on the simulator's membership, so that the cross-region
    /// traffic and the extra hop's lag of the daemon's mode can be predicted.
    RegionSender,
}

/// How a shipment reaches the daemons of a receiving region.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Each receiving daemon gets its own copy, with its own delay and loss draw.
    PerDaemon,
    /// A region's daemons get a shipment at the same moment (one delay and loss draw per
    /// region), so they hold the same remote view and the simulator keeps one table per
    /// region instead of one per daemon: daemons× fewer merges, for large runs.
    PerRegion,
}

/// What the share threshold is judged on: the daemon's own setting, one type for both.
pub use sluice_core::ship::BusyOn;

/// When a receiver forwards the other origins' figures it heard (`fanout` above 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardAt {
    /// On receipt, as the daemon does: a hop costs its link delay.
    #[default]
    AtOnce,
    /// At the receiver's next shipment: a hop costs up to an interval more, in fewer
    /// messages. Only to compare (docs/accuracy.md); the daemon forwards at once.
    AtInterval,
}

/// `[gossip]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GossipFile {
    /// Interval between two shipments of a daemon.
    #[serde(default = "default_interval")]
    pub ship_interval_ms: f64,
    /// Overrides every rule's `share_threshold` (a fraction of the limit).
    #[serde(default)]
    pub share_threshold: Option<f64>,
    /// Entry bytes one shipment may carry.
    #[serde(default = "default_budget")]
    pub budget_bytes: u64,
    /// Entries one shipment may carry.
    #[serde(default)]
    pub max_entries: Option<u64>,
    /// Re-ship an unchanged busy figure after this long (0 = never).
    #[serde(default = "default_resend")]
    pub resend_after_ms: f64,
    /// Re-ship every busy figure when a peer region comes back (heal, region up).
    #[serde(default = "default_true")]
    pub resend_on_rejoin: bool,
    /// Fixed ship phase per region (ms into each interval); random when absent.
    #[serde(default)]
    pub phase_ms: Option<Vec<f64>>,
    /// `every_daemon`, `one_per_region` or `region_sender`.
    #[serde(default = "default_shippers")]
    pub shippers: Shippers,
    /// `region_sender`: peer regions each region's sender ships to and forwards to (the
    /// daemon's `gossip.fanout`; 0, the default, point-to-point).
    #[serde(default)]
    pub fanout: u64,
    /// When a receiver forwards what it heard: `at_once` (the daemon's), or `at_interval`
    /// (at its next shipment; for comparison only).
    #[serde(default)]
    pub forward: ForwardAt,
    /// `seen_share` (the default), `region_share`, `region_count`, `seen_count` or `heard`.
    #[serde(default = "default_busy_on")]
    pub busy_on: BusyOn,
    /// `per_daemon` or `per_region`.
    #[serde(default = "default_delivery")]
    pub delivery: Delivery,
    /// One-way delay of a message between two regions.
    #[serde(default = "default_delay")]
    pub delay_ms: DistFile,
    /// Probability that a message to one daemon is lost.
    #[serde(default)]
    pub loss: f64,
    /// Per region pair delays and losses.
    #[serde(default)]
    pub links: Vec<LinkFile>,
    /// Key bound of each daemon's table of remote counts.
    #[serde(default = "default_store_keys")]
    pub max_keys: u64,
}

impl Default for GossipFile {
    fn default() -> Self {
        GossipFile {
            ship_interval_ms: default_interval(),
            share_threshold: None,
            budget_bytes: default_budget(),
            max_entries: None,
            resend_after_ms: default_resend(),
            resend_on_rejoin: true,
            phase_ms: None,
            shippers: default_shippers(),
            fanout: 0,
            forward: ForwardAt::default(),
            busy_on: default_busy_on(),
            delivery: default_delivery(),
            delay_ms: default_delay(),
            loss: 0.0,
            links: Vec::new(),
            max_keys: default_store_keys(),
        }
    }
}

fn default_interval() -> f64 {
    1000.0
}
fn default_budget() -> u64 {
    sluice_core::ship::Budget::default().max_bytes as u64
}
fn default_true() -> bool {
    true
}
fn default_resend() -> f64 {
    5000.0
}
fn default_shippers() -> Shippers {
    Shippers::EveryDaemon
}
fn default_delivery() -> Delivery {
    Delivery::PerDaemon
}
fn default_busy_on() -> BusyOn {
    BusyOn::default()
}
fn default_delay() -> DistFile {
    DistFile::Uniform {
        min: 30.0,
        max: 80.0,
    }
}

/// `[[gossip.links]]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFile {
    /// The two regions (the link is symmetric).
    pub between: Vec<String>,
    /// Delay on this link.
    #[serde(default)]
    pub delay_ms: Option<DistFile>,
    /// Loss on this link.
    #[serde(default)]
    pub loss: Option<f64>,
}

/// `[clock]`: how far each region's clock is off. A region's daemons (and so its store, which
/// takes their `now`) label windows, expire figures and refuse early ones by their own clock,
/// as real daemons on unsynchronised hosts do; the ground truth counts on the reference clock.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockFile {
    /// The largest difference between two regions' clocks (ms): the regions' offsets spread
    /// evenly from −skew/2 (the first region) to +skew/2 (the last).
    #[serde(default)]
    pub skew_ms: f64,
    /// Each region's offset (ms, signed, one per region), instead of the spread.
    #[serde(default)]
    pub offset_ms: Option<Vec<f64>>,
}

/// `[measure]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasureFile {
    /// Windows starting before this are left out of the figures.
    #[serde(default)]
    pub warmup_s: f64,
    /// Busiest keys per rule written to windows.csv and plotted.
    #[serde(default)]
    pub plot_keys: Option<u64>,
}

/// How arrivals are spaced.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Arrivals {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Even gaps.
    Constant,
}

/// Which keys a generator's requests carry.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum KeysFile {
    /// One key.
    One {
        /// Its value.
        name: String,
    },
    /// `n` keys, equally likely.
    Uniform {
        /// How many.
        n: u64,
        /// Values are `{prefix}{i}`.
        #[serde(default = "default_prefix")]
        prefix: String,
    },
    /// `n` keys with Zipf popularity.
    Zipf {
        /// How many.
        n: u64,
        /// Exponent.
        #[serde(default = "default_zipf_s")]
        s: f64,
        /// Values are `{prefix}{i}`.
        #[serde(default = "default_prefix")]
        prefix: String,
    },
}

fn default_prefix() -> String {
    "k".into()
}
fn default_zipf_s() -> f64 {
    1.0
}

/// `[[traffic]]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficFile {
    /// Label.
    #[serde(default)]
    pub name: Option<String>,
    /// Regions the requests enter (all when absent), shared evenly.
    #[serde(default)]
    pub regions: Option<Vec<String>>,
    /// Requests per second over all its regions.
    pub rate_per_s: f64,
    /// `poisson` or `constant`.
    #[serde(default = "default_arrivals")]
    pub arrivals: Arrivals,
    /// Key popularity.
    #[serde(default = "default_keys")]
    pub keys: KeysFile,
    /// The descriptor carrying the key.
    #[serde(default = "default_key_field")]
    pub key_field: String,
    /// Other descriptors every request carries.
    #[serde(default)]
    pub descriptors: BTreeMap<String, String>,
    /// Units per request.
    #[serde(default = "one")]
    pub cost: u64,
    /// First second with traffic.
    #[serde(default)]
    pub start_s: f64,
    /// Second the traffic stops.
    #[serde(default)]
    pub end_s: Option<f64>,
    /// Periodic spike.
    #[serde(default)]
    pub spike: Option<SpikeFile>,
    /// Rate changes.
    #[serde(default)]
    pub steps: Vec<StepFile>,
    /// Region changes (a client that moves).
    #[serde(default)]
    pub moves: Vec<MoveFile>,
    /// Every request goes to this daemon of its region (a sticky client: unbalanced load)
    /// instead of a daemon drawn at random; while it is down, the region's first daemon up.
    #[serde(default)]
    pub daemon: Option<u64>,
}

fn default_arrivals() -> Arrivals {
    Arrivals::Poisson
}
fn default_keys() -> KeysFile {
    KeysFile::One { name: "k1".into() }
}
fn default_key_field() -> String {
    "api_key".into()
}

/// `spike = { ... }`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpikeFile {
    /// Rate multiplier during the spike.
    pub factor: f64,
    /// Seconds the spike lasts after each period starts.
    pub first_s: f64,
    /// Period (usually the rule's window), aligned on the epoch like windows are.
    pub period_s: f64,
}

/// `[[traffic.steps]]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepFile {
    /// When.
    pub at_s: f64,
    /// The new rate.
    pub rate_per_s: f64,
}

/// `[[traffic.moves]]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveFile {
    /// When.
    pub at_s: f64,
    /// The regions the traffic enters from then on.
    pub regions: Vec<String>,
}

/// `[[events]]`
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EventFile {
    /// A region's daemons and store go down; its traffic moves to the others.
    RegionDown {
        /// When.
        at_s: f64,
        /// Which.
        region: String,
    },
    /// A region comes back with fresh daemons.
    RegionUp {
        /// When.
        at_s: f64,
        /// Which.
        region: String,
        /// The store comes back empty.
        #[serde(default)]
        wipe_store: bool,
    },
    /// Links between groups are cut.
    Partition {
        /// When.
        at_s: f64,
        /// Every region in exactly one group.
        groups: Vec<Vec<String>>,
    },
    /// Every cut link is restored.
    Heal {
        /// When.
        at_s: f64,
    },
    /// The region's store fails over to its replica, losing the writes of the last
    /// `lost_ms`, and answers nothing for `outage_ms`.
    StoreFailover {
        /// When.
        at_s: f64,
        /// Which region.
        region: String,
        /// Which of its stores: a name of `[stores]`; the main one when absent (or
        /// `"default"`).
        #[serde(default)]
        store: Option<String>,
        /// Replication lag: writes this recent are lost.
        lost_ms: f64,
        /// Time without a store.
        #[serde(default)]
        outage_ms: f64,
    },
    /// One daemon stops (its region's other daemons take its traffic; the membership, and
    /// so a local share, counts one fewer).
    DaemonDown {
        /// When.
        at_s: f64,
        /// Which region.
        region: String,
        /// Which daemon of it (0-based).
        daemon: u64,
        /// A graceful stop: its leases are given back and its pending sync units sent
        /// first. Otherwise a crash: both are lost.
        #[serde(default)]
        graceful: bool,
    },
    /// The shipper's interval and/or threshold change.
    SetShip {
        /// When.
        at_s: f64,
        /// New interval.
        #[serde(default)]
        ship_interval_ms: Option<f64>,
        /// New threshold (fraction of the limit) for every rule.
        #[serde(default)]
        share_threshold: Option<f64>,
    },
}
