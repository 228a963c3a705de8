//! Scenario files: the TOML format (documented field by field in simulations/README.md), its
//! validation, and `--param` overrides.
//!
//! A file is first read into [`File`] (serde refuses unknown fields and wrong types, naming
//! them), then checked into a [`Scenario`] whose values are in the units the engine uses
//! (microseconds, region indices). Every semantic check names the field by its dotted path
//! (`gossip.delay_ms.min`, `traffic[1].rate_per_s`), and nonsense (a negative delay, zero
//! regions, a loss above 1) is refused rather than simulated. The rules go through
//! sluice-core's own validator, so a scenario holds exactly the rules a daemon would accept.

use serde::Deserialize;
use sluice_core::Micros;
use sluice_core::algo::Kind;
use sluice_core::breaker::BreakerConfig;
use sluice_core::matching::Descriptors;
use sluice_core::rules::{Domain, from_values};
use sluice_core::ship::Budget;
use sluice_core::time::{MILLI, SECOND};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why a scenario was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error (in the message, so not also a `source`).
        reason: std::io::Error,
    },
    /// Not valid TOML, an unknown field, a missing field or a wrong type (the message names
    /// the field and shows the line).
    #[error("{0}")]
    Syntax(String),
    /// A value that parses but makes no sense.
    #[error("scenario field `{field}`: {message}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A `--param` that cannot be applied.
    #[error("--param {0}")]
    Param(String),
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

// ---------------------------------------------------------------------------------------
// The file as written.
// ---------------------------------------------------------------------------------------

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
    /// The delta shipper and the network between regions.
    #[serde(default)]
    pub gossip: GossipFile,
    /// What is measured.
    #[serde(default)]
    pub measure: MeasureFile,
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
    /// `every_daemon` or `one_per_region`.
    #[serde(default = "default_shippers")]
    pub shippers: Shippers,
    /// `region_count` or `seen_count`.
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
    60_000
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
    BusyOn::RegionCount
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

// ---------------------------------------------------------------------------------------
// The checked scenario.
// ---------------------------------------------------------------------------------------

/// A distribution of durations, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dist {
    /// Always this.
    Fixed(f64),
    /// Uniform in `[min, max]`.
    Uniform(f64, f64),
    /// Normal `(mean, sd)`, truncated at 0.
    Normal(f64, f64),
    /// `min + Exp(mean)`.
    Exponential(f64, f64),
}

impl Dist {
    /// A draw, in whole microseconds.
    pub fn sample(&self, rng: &mut crate::rng::Rng) -> Micros {
        let v = match *self {
            Dist::Fixed(v) => v,
            Dist::Uniform(a, b) => a + (b - a) * rng.unit(),
            Dist::Normal(m, sd) => m + sd * rng.normal(),
            Dist::Exponential(mean, min) => min + mean * rng.exp1(),
        };
        v.max(0.0) as Micros
    }

    /// The smallest value [`Dist::sample`] can give, µs.
    pub fn low(&self) -> Micros {
        let v = match *self {
            Dist::Fixed(v) => v,
            Dist::Uniform(a, b) => a.min(b),
            Dist::Normal(..) => 0.0,
            Dist::Exponential(_, min) => min,
        };
        v.max(0.0) as Micros
    }

    /// The largest value it usually gives (mean + 3 sd for the unbounded ones), µs.
    pub fn high(&self) -> f64 {
        match *self {
            Dist::Fixed(v) => v,
            Dist::Uniform(_, b) => b,
            Dist::Normal(m, sd) => m + 3.0 * sd,
            Dist::Exponential(mean, min) => min + 3.0 * mean,
        }
    }
}

/// One directed link's behaviour.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Delay.
    pub delay: Dist,
    /// Loss probability per message per receiving daemon.
    pub loss: f64,
}

/// `[store]`, checked.
#[derive(Clone, Debug)]
pub struct StoreCfg {
    /// Latency of a store call.
    pub latency: Dist,
    /// Local buckets' share of the numbers, per mille.
    pub local_permille: u64,
    /// Key bound.
    pub max_keys: usize,
    /// Each daemon's store breaker, as the daemon's config gives it.
    pub breaker: BreakerConfig,
}

/// `[gossip]`, checked.
#[derive(Clone, Debug)]
pub struct GossipCfg {
    /// Ship interval.
    pub interval: Micros,
    /// Threshold override in percent.
    pub threshold_pct: Option<u8>,
    /// What one interval may carry.
    pub budget: Budget,
    /// Re-ship everything busy when a peer region comes back.
    pub resend_on_rejoin: bool,
    /// Fixed ship phase per region (taken modulo the interval), or random phases.
    pub phases: Option<Vec<Micros>>,
    /// Who ships.
    pub shippers: Shippers,
    /// What the threshold is judged on.
    pub busy_on: BusyOn,
    /// How shipments reach a region's daemons.
    pub delivery: Delivery,
    /// `links[a][b]`: from region a to region b.
    pub links: Vec<Vec<Link>>,
    /// Key bound of remote tables.
    pub max_keys: usize,
}

/// Key popularity, checked.
#[derive(Clone, Debug)]
pub enum Keys {
    /// One key value.
    One(String),
    /// `n` equally likely `{prefix}{i}`.
    Uniform(usize, String),
    /// `n` Zipf-popular `{prefix}{i}` with exponent s.
    Zipf(usize, f64, String),
}

impl Keys {
    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        match self {
            Keys::One(_) => 1,
            Keys::Uniform(n, _) | Keys::Zipf(n, _, _) => *n,
        }
    }

    /// Whether there is no key (never: checked at load).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of key `i`.
    pub fn value(&self, i: usize) -> String {
        match self {
            Keys::One(name) => name.clone(),
            Keys::Uniform(_, p) | Keys::Zipf(_, _, p) => format!("{p}{i}"),
        }
    }
}

/// A periodic spike, checked.
#[derive(Clone, Copy, Debug)]
pub struct Spike {
    /// Multiplier.
    pub factor: f64,
    /// Length after each period start.
    pub first: Micros,
    /// Period.
    pub period: Micros,
}

/// `[[traffic]]`, checked.
#[derive(Clone, Debug)]
pub struct Traffic {
    /// Label.
    pub name: String,
    /// Regions (indices) at the start.
    pub regions: Vec<usize>,
    /// Requests per second (before steps).
    pub rate: f64,
    /// Spacing.
    pub arrivals: Arrivals,
    /// Popularity.
    pub keys: Keys,
    /// Descriptor carrying the key.
    pub key_field: String,
    /// Fixed descriptors.
    pub descriptors: Vec<(String, String)>,
    /// Units per request.
    pub cost: u64,
    /// Start.
    pub start: Micros,
    /// End.
    pub end: Micros,
    /// Spike.
    pub spike: Option<Spike>,
    /// Rate changes, in time order.
    pub steps: Vec<(Micros, f64)>,
    /// Region changes, in time order.
    pub moves: Vec<(Micros, Vec<usize>)>,
    /// The daemon every request goes to, if pinned.
    pub daemon: Option<usize>,
}

/// An event, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Region index goes down.
    RegionDown(usize),
    /// Region index comes back (wipe its store?).
    RegionUp(usize, bool),
    /// Group of each region; links between groups are cut.
    Partition(Vec<usize>),
    /// All links restored.
    Heal,
    /// Failover of a region's store: (region, outage).
    StoreFailover(usize, Micros),
    /// A daemon stops: (region, daemon, graceful).
    DaemonDown(usize, usize, bool),
    /// New interval and/or threshold (percent).
    SetShip(Option<Micros>, Option<u8>),
}

/// A checked scenario, ready to run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Seed.
    pub seed: u64,
    /// Simulated time.
    pub duration: Micros,
    /// Region names.
    pub regions: Vec<String>,
    /// Daemons per region.
    pub daemons: usize,
    /// Stores.
    pub store: StoreCfg,
    /// Gossip.
    pub gossip: GossipCfg,
    /// Windows before this are not measured.
    pub warmup: Micros,
    /// Busiest keys per rule plotted.
    pub plot_keys: usize,
    /// The domain's rules, validated by sluice-core.
    pub rules: Arc<Domain>,
    /// Domain name.
    pub domain: String,
    /// Traffic.
    pub traffic: Vec<Traffic>,
    /// Events in time order.
    pub events: Vec<(Micros, Event)>,
    /// Replication lag of regions that fail over (writes this recent are lost).
    pub replica_lag: Vec<Option<Micros>>,
}

impl Scenario {
    /// The domain the requests use.
    pub fn domain(&self) -> &Domain {
        &self.rules
    }
}

/// Most regions and daemons a scenario may have (region indices are small integers).
pub const MAX_REGIONS: usize = 64;
/// Most daemons per region.
pub const MAX_DAEMONS: usize = 1_000;
/// Longest simulated run: a week.
pub const MAX_DURATION_S: f64 = 7.0 * 86_400.0;
/// Most keys one generator may draw from.
pub const MAX_KEYS: u64 = 10_000_000;

/// Reads, overrides and checks a scenario file.
pub fn load(path: &str, params: &[(String, String)]) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|reason| ScenarioError::Read {
        path: path.to_string(),
        reason,
    })?;
    parse(&text, params)
}

/// Parses, overrides and checks scenario text.
pub fn parse(text: &str, params: &[(String, String)]) -> Result<Scenario, ScenarioError> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| syntax(&e))?;
    for (k, v) in params {
        set_param(&mut doc, k, v)?;
    }
    let file: File = File::deserialize(doc).map_err(|e| syntax(&e))?;
    check(file)
}

fn syntax(e: &toml::de::Error) -> ScenarioError {
    ScenarioError::Syntax(format!("scenario: {}", e.to_string().trim_end()))
}

/// Short names `--param` accepts, and the field each stands for.
pub const PARAM_ALIASES: &[(&str, &str)] = &[
    ("ship_interval_ms", "gossip.ship_interval_ms"),
    ("share_threshold", "gossip.share_threshold"),
    ("budget_bytes", "gossip.budget_bytes"),
    ("loss", "gossip.loss"),
    ("shippers", "gossip.shippers"),
    ("busy_on", "gossip.busy_on"),
    ("delivery", "gossip.delivery"),
    ("resend_on_rejoin", "gossip.resend_on_rejoin"),
    ("daemons", "daemons_per_region"),
];

/// Sets one field of the document: `name` is an alias from [`PARAM_ALIASES`] or a dotted
/// path (`gossip.delay_ms.max`, `traffic.0.rate_per_s`, `rules.hot.hot_keys.deny_cache`: a
/// list item by index, or by its `id`); `value` is a TOML value (`250`,
/// `0.05`, `"one_per_region"`; a bare word is taken as a string).
pub fn set_param(doc: &mut toml::Table, name: &str, value: &str) -> Result<(), ScenarioError> {
    let path = PARAM_ALIASES
        .iter()
        .find(|(a, _)| *a == name)
        .map_or(name, |(_, p)| *p);
    let parsed: toml::Value = match toml::from_str::<toml::Table>(&format!("v = {value}")) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(value.into())),
        Err(_) => toml::Value::String(value.to_string()),
    };
    let parts: Vec<&str> = path.split('.').collect();
    let mut root = toml::Value::Table(std::mem::take(doc));
    let result = set_path(&mut root, &parts, parsed, name);
    if let toml::Value::Table(t) = root {
        *doc = t;
    }
    result
}

/// Sets `path` below `v`: table segments by name, list segments by index.
fn set_path(
    v: &mut toml::Value,
    path: &[&str],
    value: toml::Value,
    name: &str,
) -> Result<(), ScenarioError> {
    let Some((first, rest)) = path.split_first() else {
        *v = value;
        return Ok(());
    };
    let child = match v {
        toml::Value::Table(t) => {
            if rest.is_empty() {
                t.insert(first.to_string(), value);
                return Ok(());
            }
            t.entry(first.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        }
        toml::Value::Array(a) => {
            let n = a.len();
            match first.parse::<usize>() {
                Ok(i) => a.get_mut(i).ok_or_else(|| {
                    ScenarioError::Param(format!("{name}: index {i} is past the {n} items"))
                })?,
                // A list of tables with ids (the rules) is also addressed by id:
                // `rules.hot.hot_keys.deny_cache`.
                Err(_) => a
                    .iter_mut()
                    .find(|item| item.get("id").and_then(toml::Value::as_str) == Some(*first))
                    .ok_or_else(|| {
                        ScenarioError::Param(format!(
                            "{name}: {first:?} is neither an index into the list nor the id of one of its items"
                        ))
                    })?,
            }
        }
        _ => {
            return Err(ScenarioError::Param(format!(
                "{name}: cannot go into {first:?}: its parent is a plain value"
            )));
        }
    };
    set_path(child, rest, value, name)
}

fn check_f(field: &str, v: f64) -> Result<f64, ScenarioError> {
    if !v.is_finite() {
        return Err(invalid(field, format!("must be a finite number, got {v}")));
    }
    Ok(v)
}

fn non_negative(field: &str, v: f64) -> Result<f64, ScenarioError> {
    let v = check_f(field, v)?;
    if v < 0.0 {
        return Err(invalid(field, format!("must not be negative, got {v}")));
    }
    Ok(v)
}

fn positive(field: &str, v: f64) -> Result<f64, ScenarioError> {
    let v = check_f(field, v)?;
    if v <= 0.0 {
        return Err(invalid(
            field,
            format!("must be greater than zero, got {v}"),
        ));
    }
    Ok(v)
}

fn fraction(field: &str, v: f64) -> Result<f64, ScenarioError> {
    let v = check_f(field, v)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(field, format!("must be from 0 to 1, got {v}")));
    }
    Ok(v)
}

fn ms(v: f64) -> Micros {
    (v * MILLI as f64).round() as Micros
}

fn secs(v: f64) -> Micros {
    (v * SECOND as f64).round() as Micros
}

fn dist(field: &str, d: &DistFile) -> Result<Dist, ScenarioError> {
    let us = MILLI as f64;
    Ok(match *d {
        DistFile::Fixed { value } => {
            Dist::Fixed(non_negative(&format!("{field}.value"), value)? * us)
        }
        DistFile::Uniform { min, max } => {
            let a = non_negative(&format!("{field}.min"), min)?;
            let b = non_negative(&format!("{field}.max"), max)?;
            if b < a {
                return Err(invalid(
                    format!("{field}.max"),
                    format!("must be at least min ({a}), got {b}"),
                ));
            }
            Dist::Uniform(a * us, b * us)
        }
        DistFile::Normal { mean, sd } => Dist::Normal(
            non_negative(&format!("{field}.mean"), mean)? * us,
            non_negative(&format!("{field}.sd"), sd)? * us,
        ),
        DistFile::Exponential { mean, min } => Dist::Exponential(
            non_negative(&format!("{field}.mean"), mean)? * us,
            non_negative(&format!("{field}.min"), min)? * us,
        ),
    })
}

fn region_index(regions: &[String], field: &str, name: &str) -> Result<usize, ScenarioError> {
    regions.iter().position(|r| r == name).ok_or_else(|| {
        invalid(
            field,
            format!(
                "unknown region {name:?}; regions are {}",
                regions.join(", ")
            ),
        )
    })
}

fn threshold_pct(field: &str, v: f64) -> Result<u8, ScenarioError> {
    Ok((fraction(field, v)? * 100.0).round() as u8)
}

/// Checks a parsed file into a scenario.
pub fn check(f: File) -> Result<Scenario, ScenarioError> {
    if f.name.trim().is_empty() {
        return Err(invalid("name", "must not be empty"));
    }
    let duration_s = positive("duration_s", f.duration_s)?;
    if duration_s > MAX_DURATION_S {
        return Err(invalid(
            "duration_s",
            format!("must be at most {MAX_DURATION_S} (a week), got {duration_s}"),
        ));
    }
    let duration = secs(duration_s);
    if f.regions.is_empty() {
        return Err(invalid("regions", "at least one region is needed"));
    }
    if f.regions.len() > MAX_REGIONS {
        return Err(invalid("regions", format!("at most {MAX_REGIONS} regions")));
    }
    for (i, r) in f.regions.iter().enumerate() {
        if r.trim().is_empty() {
            return Err(invalid(format!("regions[{i}]"), "a region needs a name"));
        }
        if f.regions[..i].contains(r) {
            return Err(invalid(
                format!("regions[{i}]"),
                format!("{r:?} appears twice"),
            ));
        }
    }
    let daemons = f.daemons_per_region as usize;
    if daemons == 0 || daemons > MAX_DAEMONS {
        return Err(invalid(
            "daemons_per_region",
            format!(
                "must be from 1 to {MAX_DAEMONS}, got {}",
                f.daemons_per_region
            ),
        ));
    }
    let n = f.regions.len();

    // [store]
    let local_permille = match f.store.local_permille {
        None => (1000 / daemons as u64).max(1),
        Some(p) if (1..=1000).contains(&p) => p,
        Some(p) => {
            return Err(invalid(
                "store.local_permille",
                format!("must be from 1 to 1000, got {p}"),
            ));
        }
    };
    if f.store.max_keys == 0 {
        return Err(invalid("store.max_keys", "must be greater than zero"));
    }
    let d = BreakerConfig::default();
    let breaker = BreakerConfig {
        failure_pct: f.store.breaker_failure_pct.unwrap_or(d.failure_pct),
        window: f
            .store
            .breaker_window_ms
            .map_or(d.window, |v| v.saturating_mul(MILLI)),
        min_calls: f.store.breaker_min_calls.unwrap_or(d.min_calls),
        cool_off: f
            .store
            .breaker_cool_off_ms
            .map_or(d.cool_off, |v| v.saturating_mul(MILLI)),
        probes: d.probes,
    };
    if !(1..=100).contains(&breaker.failure_pct) {
        return Err(invalid(
            "store.breaker_failure_pct",
            format!("must be from 1 to 100, got {}", breaker.failure_pct),
        ));
    }
    for (field, v) in [
        ("store.breaker_window_ms", breaker.window),
        ("store.breaker_cool_off_ms", breaker.cool_off),
    ] {
        if v == 0 {
            return Err(invalid(field, "must be greater than zero"));
        }
    }
    let store = StoreCfg {
        latency: dist("store.latency_ms", &f.store.latency_ms)?,
        local_permille,
        max_keys: f.store.max_keys as usize,
        breaker,
    };

    // [gossip]
    let g = &f.gossip;
    let interval = ms(positive("gossip.ship_interval_ms", g.ship_interval_ms)?);
    if interval < MILLI {
        return Err(invalid("gossip.ship_interval_ms", "must be at least 1 ms"));
    }
    let threshold = g
        .share_threshold
        .map(|t| threshold_pct("gossip.share_threshold", t))
        .transpose()?;
    if g.budget_bytes == 0 {
        return Err(invalid("gossip.budget_bytes", "must be greater than zero"));
    }
    if g.max_entries == Some(0) {
        return Err(invalid("gossip.max_entries", "must be greater than zero"));
    }
    if g.max_keys == 0 {
        return Err(invalid("gossip.max_keys", "must be greater than zero"));
    }
    let budget = Budget {
        max_bytes: g.budget_bytes as usize,
        max_entries: g.max_entries.map_or(usize::MAX, |e| e as usize),
        resend_after: ms(non_negative("gossip.resend_after_ms", g.resend_after_ms)?),
    };
    let default_link = Link {
        delay: dist("gossip.delay_ms", &g.delay_ms)?,
        loss: fraction("gossip.loss", g.loss)?,
    };
    let mut links = vec![vec![default_link; n]; n];
    for (i, l) in g.links.iter().enumerate() {
        let at = format!("gossip.links[{i}]");
        if l.between.len() != 2 {
            return Err(invalid(
                format!("{at}.between"),
                "must name exactly two regions",
            ));
        }
        let a = region_index(&f.regions, &format!("{at}.between"), &l.between[0])?;
        let b = region_index(&f.regions, &format!("{at}.between"), &l.between[1])?;
        if a == b {
            return Err(invalid(
                format!("{at}.between"),
                "must name two different regions",
            ));
        }
        let mut link = links[a][b];
        if let Some(d) = &l.delay_ms {
            link.delay = dist(&format!("{at}.delay_ms"), d)?;
        }
        if let Some(loss) = l.loss {
            link.loss = fraction(&format!("{at}.loss"), loss)?;
        }
        links[a][b] = link;
        links[b][a] = link;
    }
    let phases = match &g.phase_ms {
        None => None,
        Some(p) if p.len() != n => {
            return Err(invalid(
                "gossip.phase_ms",
                format!("needs one phase per region ({n}), got {}", p.len()),
            ));
        }
        Some(p) => Some(
            p.iter()
                .enumerate()
                .map(|(i, v)| Ok(ms(non_negative(&format!("gossip.phase_ms[{i}]"), *v)?)))
                .collect::<Result<Vec<_>, ScenarioError>>()?,
        ),
    };
    let gossip = GossipCfg {
        phases,
        interval,
        threshold_pct: threshold,
        budget,
        resend_on_rejoin: g.resend_on_rejoin,
        shippers: g.shippers,
        busy_on: g.busy_on,
        delivery: g.delivery,
        links,
        max_keys: g.max_keys as usize,
    };

    // [measure]
    let warmup = secs(non_negative("measure.warmup_s", f.measure.warmup_s)?);
    if warmup >= duration {
        return Err(invalid(
            "measure.warmup_s",
            "must be shorter than duration_s",
        ));
    }
    let plot_keys = match f.measure.plot_keys {
        None => 1,
        Some(k) if (1..=100).contains(&k) => k as usize,
        Some(k) => {
            return Err(invalid(
                "measure.plot_keys",
                format!("must be from 1 to 100, got {k}"),
            ));
        }
    };

    // rules
    if f.rules.is_empty() {
        return Err(invalid("rules", "at least one rule is needed"));
    }
    let mut doc = serde_json::Map::new();
    doc.insert("domain".into(), serde_json::Value::String(f.domain.clone()));
    doc.insert("rules".into(), serde_json::Value::Array(f.rules.clone()));
    if !f.overrides.is_empty() {
        doc.insert(
            "overrides".into(),
            serde_json::Value::Array(f.overrides.clone()),
        );
    }
    let set = from_values(&[serde_json::Value::Object(doc)], 1).map_err(|e| {
        let first = e
            .problems
            .first()
            .map(|p| format!("rule {}: field `{}`: {}", p.at, p.field, p.message))
            .unwrap_or_default();
        let more = e.problems.len().saturating_sub(1);
        invalid(
            "rules",
            if more > 0 {
                format!("{first} (and {more} more: {e})")
            } else {
                first
            },
        )
    })?;
    let Some(domain) = set.domain(&f.domain).cloned() else {
        return Err(invalid("domain", "no rules for this domain"));
    };
    for r in &domain.rules {
        if r.params.kind() == Kind::Concurrency {
            return Err(invalid(
                "rules",
                format!(
                    "rule {}: concurrency rules are not simulated (requests have no duration here)",
                    r.id
                ),
            ));
        }
    }

    // traffic
    if f.traffic.is_empty() {
        return Err(invalid(
            "traffic",
            "at least one traffic generator is needed",
        ));
    }
    let mut traffic = Vec::with_capacity(f.traffic.len());
    for (i, t) in f.traffic.iter().enumerate() {
        traffic.push(check_traffic(
            &format!("traffic[{i}]"),
            i,
            t,
            &f.regions,
            duration,
            daemons,
        )?);
    }

    // events
    let mut events = Vec::with_capacity(f.events.len());
    let mut replica_lag = vec![None; n];
    for (i, e) in f.events.iter().enumerate() {
        let at = format!("events[{i}]");
        // An event after the end never happens (a run shortened with --set keeps its file's
        // events).
        let when = |v: f64| -> Result<Micros, ScenarioError> {
            Ok(secs(non_negative(&format!("{at}.at_s"), v)?))
        };
        let reg = |name: &str| region_index(&f.regions, &format!("{at}.region"), name);
        let ev = match e {
            EventFile::RegionDown { at_s, region } => {
                (when(*at_s)?, Event::RegionDown(reg(region)?))
            }
            EventFile::RegionUp {
                at_s,
                region,
                wipe_store,
            } => (when(*at_s)?, Event::RegionUp(reg(region)?, *wipe_store)),
            EventFile::Partition { at_s, groups } => {
                let mut group = vec![usize::MAX; n];
                for (gi, g) in groups.iter().enumerate() {
                    for name in g {
                        let r = region_index(&f.regions, &format!("{at}.groups"), name)?;
                        if group[r] != usize::MAX {
                            return Err(invalid(
                                format!("{at}.groups"),
                                format!("region {name:?} is in two groups"),
                            ));
                        }
                        group[r] = gi;
                    }
                }
                if let Some(r) = group.iter().position(|g| *g == usize::MAX) {
                    return Err(invalid(
                        format!("{at}.groups"),
                        format!(
                            "region {:?} is in no group; list every region once",
                            f.regions[r]
                        ),
                    ));
                }
                (when(*at_s)?, Event::Partition(group))
            }
            EventFile::Heal { at_s } => (when(*at_s)?, Event::Heal),
            EventFile::StoreFailover {
                at_s,
                region,
                lost_ms,
                outage_ms,
            } => {
                let r = reg(region)?;
                if replica_lag[r].is_some() {
                    return Err(invalid(
                        format!("{at}.region"),
                        format!(
                            "{region:?} already fails over once; the simulator models one store failover per region per run"
                        ),
                    ));
                }
                replica_lag[r] = Some(ms(non_negative(&format!("{at}.lost_ms"), *lost_ms)?));
                let outage = ms(non_negative(&format!("{at}.outage_ms"), *outage_ms)?);
                (when(*at_s)?, Event::StoreFailover(r, outage))
            }
            EventFile::DaemonDown {
                at_s,
                region,
                daemon,
                graceful,
            } => {
                let r = reg(region)?;
                if *daemon as usize >= daemons {
                    return Err(invalid(
                        format!("{at}.daemon"),
                        format!("must be below daemons_per_region ({daemons}), got {daemon}"),
                    ));
                }
                (
                    when(*at_s)?,
                    Event::DaemonDown(r, *daemon as usize, *graceful),
                )
            }
            EventFile::SetShip {
                at_s,
                ship_interval_ms,
                share_threshold,
            } => {
                if ship_interval_ms.is_none() && share_threshold.is_none() {
                    return Err(invalid(
                        at.as_str(),
                        "set_ship needs ship_interval_ms or share_threshold",
                    ));
                }
                let iv = ship_interval_ms
                    .map(|v| {
                        let v = ms(positive(&format!("{at}.ship_interval_ms"), v)?);
                        if v < MILLI {
                            return Err(invalid(
                                format!("{at}.ship_interval_ms"),
                                "must be at least 1 ms",
                            ));
                        }
                        Ok(v)
                    })
                    .transpose()?;
                let th = share_threshold
                    .map(|t| threshold_pct(&format!("{at}.share_threshold"), t))
                    .transpose()?;
                (when(*at_s)?, Event::SetShip(iv, th))
            }
        };
        events.push(ev);
    }
    // Stable: events at the same instant keep file order.
    events.sort_by_key(|(t, _)| *t);
    events.retain(|(t, _)| *t <= duration);

    Ok(Scenario {
        name: f.name.clone(),
        description: f.description.trim().to_string(),
        seed: f.seed,
        duration,
        regions: f.regions.clone(),
        daemons,
        store,
        gossip,
        warmup,
        plot_keys,
        rules: domain,
        domain: f.domain.clone(),
        traffic,
        events,
        replica_lag,
    })
}

fn check_traffic(
    at: &str,
    i: usize,
    t: &TrafficFile,
    regions: &[String],
    duration: Micros,
    daemons: usize,
) -> Result<Traffic, ScenarioError> {
    let names = |field: &str, list: &[String]| -> Result<Vec<usize>, ScenarioError> {
        if list.is_empty() {
            return Err(invalid(field, "must name at least one region"));
        }
        list.iter()
            .map(|r| region_index(regions, field, r))
            .collect()
    };
    let regs = match &t.regions {
        None => (0..regions.len()).collect(),
        Some(list) => names(&format!("{at}.regions"), list)?,
    };
    let rate = non_negative(&format!("{at}.rate_per_s"), t.rate_per_s)?;
    let keys = match &t.keys {
        KeysFile::One { name } => Keys::One(name.clone()),
        KeysFile::Uniform { n, prefix } | KeysFile::Zipf { n, prefix, .. } => {
            if *n == 0 || *n > MAX_KEYS {
                return Err(invalid(
                    format!("{at}.keys.n"),
                    format!("must be from 1 to {MAX_KEYS}, got {n}"),
                ));
            }
            match &t.keys {
                KeysFile::Zipf { s, .. } => Keys::Zipf(
                    *n as usize,
                    non_negative(&format!("{at}.keys.s"), *s)?,
                    prefix.clone(),
                ),
                _ => Keys::Uniform(*n as usize, prefix.clone()),
            }
        }
    };
    if t.descriptors.contains_key(&t.key_field) {
        return Err(invalid(
            format!("{at}.descriptors"),
            format!(
                "{:?} is the key_field; it cannot also be fixed",
                t.key_field
            ),
        ));
    }
    let descriptors: Vec<(String, String)> = t
        .descriptors
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut sample = descriptors.clone();
    sample.push((t.key_field.clone(), keys.value(keys.len() - 1)));
    Descriptors::new(sample).map_err(|e| invalid(format!("{at}.descriptors"), e.to_string()))?;
    if t.cost == 0 {
        return Err(invalid(format!("{at}.cost"), "must be at least 1"));
    }
    let start = secs(non_negative(&format!("{at}.start_s"), t.start_s)?);
    let end = match t.end_s {
        None => duration,
        Some(e) => secs(non_negative(&format!("{at}.end_s"), e)?).min(duration),
    };
    if end < start {
        return Err(invalid(format!("{at}.end_s"), "must not be before start_s"));
    }
    let spike = match &t.spike {
        None => None,
        Some(s) => {
            let factor = non_negative(&format!("{at}.spike.factor"), s.factor)?;
            let first = secs(positive(&format!("{at}.spike.first_s"), s.first_s)?);
            let period = secs(positive(&format!("{at}.spike.period_s"), s.period_s)?);
            if first > period {
                return Err(invalid(
                    format!("{at}.spike.first_s"),
                    "must not be longer than period_s",
                ));
            }
            Some(Spike {
                factor,
                first,
                period,
            })
        }
    };
    let mut steps = Vec::new();
    for (j, s) in t.steps.iter().enumerate() {
        let f = format!("{at}.steps[{j}]");
        steps.push((
            secs(non_negative(&format!("{f}.at_s"), s.at_s)?),
            non_negative(&format!("{f}.rate_per_s"), s.rate_per_s)?,
        ));
    }
    steps.sort_by_key(|s| s.0);
    let mut moves = Vec::new();
    for (j, m) in t.moves.iter().enumerate() {
        let f = format!("{at}.moves[{j}]");
        moves.push((
            secs(non_negative(&format!("{f}.at_s"), m.at_s)?),
            names(&format!("{f}.regions"), &m.regions)?,
        ));
    }
    moves.sort_by_key(|m| m.0);
    let daemon = match t.daemon {
        Some(d) if d as usize >= daemons => {
            return Err(invalid(
                format!("{at}.daemon"),
                format!("must be below daemons_per_region ({daemons}), got {d}"),
            ));
        }
        d => d.map(|d| d as usize),
    };
    Ok(Traffic {
        name: t.name.clone().unwrap_or_else(|| format!("traffic[{i}]")),
        regions: regs,
        rate,
        arrivals: t.arrivals,
        keys,
        key_field: t.key_field.clone(),
        descriptors,
        cost: t.cost,
        start,
        end,
        spike,
        steps,
        moves,
        daemon,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
name = "t"
duration_s = 60
regions = ["us", "eu"]
[[rules]]
id = "g"
key = ["api_key"]
algorithm = "fixed_window"
limit = 100
window = "1m"
scope = "global"
[[traffic]]
rate_per_s = 10
"#;

    fn err(text: &str) -> String {
        match parse(text, &[]) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn no_draw_is_below_low() {
        // The engine sends a shipment only before the earliest delivery `low` allows: a draw
        // below it would be delivered out of order.
        let mut rng = crate::rng::Rng::stream(3, 9);
        for d in [
            Dist::Fixed(30_000.0),
            Dist::Uniform(30_000.0, 80_000.0),
            Dist::Uniform(5.5, 5.5),
            Dist::Normal(40_000.0, 30_000.0),
            Dist::Exponential(10_000.0, 20_000.0),
            Dist::Fixed(-3.0),
        ] {
            let low = d.low();
            let min = (0..10_000).map(|_| d.sample(&mut rng)).min();
            assert!(
                min.is_some_and(|m| m >= low),
                "{d:?}: low {low}, drew {min:?}"
            );
        }
        assert_eq!(Dist::Uniform(30_000.0, 80_000.0).low(), 30_000);
        assert_eq!(Dist::Exponential(10_000.0, 20_000.0).low(), 20_000);
    }

    #[test]
    fn a_minimal_file_loads_with_defaults() {
        let s = parse(MINIMAL, &[]).expect("valid");
        assert_eq!(s.regions, ["us", "eu"]);
        assert_eq!(s.gossip.interval, SECOND);
        assert_eq!(s.traffic[0].regions, [0, 1]);
        assert_eq!(s.domain().rules.len(), 1);
    }

    #[test]
    fn bad_files_name_the_field() {
        let e = err(&MINIMAL.replace("regions = [\"us\", \"eu\"]", "regions = []"));
        assert!(e.contains("`regions`") && e.contains("at least one"), "{e}");
        let e = err(&format!(
            "{MINIMAL}[gossip]\ndelay_ms = {{ dist = \"uniform\", min = -5, max = 3 }}\n"
        ));
        assert!(
            e.contains("gossip.delay_ms.min") && e.contains("negative"),
            "{e}"
        );
        let e = err(&MINIMAL.replace("rate_per_s = 10", "rate_per_s = 10\nrat = 3"));
        assert!(e.contains("unknown field `rat`"), "{e}");
        let e = err(&MINIMAL.replace("limit = 100", "limit = 0"));
        assert!(e.contains("rule g") && e.contains("`limit`"), "{e}");
        let e = err(&MINIMAL.replace("duration_s = 60", "duration_s = \"long\""));
        assert!(e.contains("duration_s"), "{e}");
        let e = err(&format!(
            "{MINIMAL}[[events]]\nkind = \"region_down\"\nat_s = 5\nregion = \"mars\"\n"
        ));
        assert!(e.contains("events[0].region") && e.contains("mars"), "{e}");
        let e = err(&format!("{MINIMAL}[gossip]\nloss = 1.5\n"));
        assert!(e.contains("gossip.loss"), "{e}");
        let e = err(&format!(
            "{MINIMAL}[[events]]\nkind = \"partition\"\nat_s = 5\ngroups = [[\"us\"]]\n"
        ));
        assert!(
            e.contains("events[0].groups") && e.contains("\"eu\""),
            "{e}"
        );
        let e = err(&MINIMAL.replace("duration_s = 60", "duration_s = 0"));
        assert!(e.contains("`duration_s`"), "{e}");
        let e = err(&format!("{MINIMAL}[gossip]\nphase_ms = [0]\n"));
        assert!(
            e.contains("gossip.phase_ms") && e.contains("one phase per region"),
            "{e}"
        );
        let e = err(&format!("{MINIMAL}[gossip]\nphase_ms = [0, -1]\n"));
        assert!(e.contains("gossip.phase_ms[1]"), "{e}");
    }

    #[test]
    fn params_override_fields_by_alias_or_path() {
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        let s = parse(
            MINIMAL,
            &[
                p("ship_interval_ms", "250"),
                p("traffic.0.rate_per_s", "7.5"),
                p("shippers", "one_per_region"),
            ],
        )
        .expect("valid");
        assert_eq!(s.gossip.interval, 250 * MILLI);
        assert_eq!(s.traffic[0].rate, 7.5);
        assert_eq!(s.gossip.shippers, Shippers::OnePerRegion);
        let s = parse(
            MINIMAL,
            &[
                p("rules.g.hot_keys.deny_cache", "false"),
                p("rules.0.hot_keys.lease", "auto"),
            ],
        )
        .expect("valid");
        let hk = &s.domain().rules[0].hot_keys;
        assert!(!hk.deny_cache, "set by the rule's id");
        assert_eq!(
            hk.lease,
            sluice_core::hotkeys::LeaseMode::Auto,
            "by its index"
        );
        let e = parse(MINIMAL, &[p("rules.nope.limit", "1")]).expect_err("no such rule");
        assert!(e.to_string().contains("\"nope\""), "{e}");
        let e = parse(MINIMAL, &[p("traffic.3.rate_per_s", "1")]).expect_err("no such item");
        assert!(e.to_string().contains("index 3"), "{e}");
        let e = parse(MINIMAL, &[p("ship_interval_ms", "-1")]).expect_err("negative");
        assert!(e.to_string().contains("gossip.ship_interval_ms"), "{e}");
    }
}
