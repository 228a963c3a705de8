//! The checked scenario: values in the units the engine uses (microseconds, region
//! indices), ready to run.

use super::{Arrivals, BusyOn, Delivery, Shippers};
use sluice_core::Micros;
use sluice_core::breaker::BreakerConfig;
use sluice_core::rules::Domain;
use sluice_core::ship::Budget;
use std::sync::Arc;

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

/// `[stores.NAME]`, checked: a named store every region has beside its main one.
#[derive(Clone, Debug)]
pub struct NamedStore {
    /// Its name, as rules and overrides give it with `store:`.
    pub name: String,
    /// Its settings, the main store's where the file leaves them out (`local_permille` is
    /// always the main store's: the daemon has one for all its stores).
    pub cfg: StoreCfg,
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
    /// `region_sender`: the fan-out of forwarding between regions (0: point-to-point).
    pub fanout: usize,
    /// Whether a receiver forwards on receipt (the daemon's way) or at its next shipment.
    pub forward_at_once: bool,
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
    /// Failover of one of a region's stores: (region, store slot, outage). Slot 0 is the
    /// main store, slot `i + 1` [`Scenario::stores`]`[i]`.
    StoreFailover(usize, usize, Micros),
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
    /// Each region's main store.
    pub store: StoreCfg,
    /// Named stores every region has beside its main one, in name order (slots 1, 2, ...).
    pub stores: Vec<NamedStore>,
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
    /// Per region, per store slot: the replication lag of a store that fails over (writes
    /// this recent are lost).
    pub replica_lag: Vec<Vec<Option<Micros>>>,
    /// Per region: its clock's offset from the reference clock, µs (all 0 unless `[clock]`
    /// says otherwise).
    pub clock_offset: Vec<i64>,
}

impl Scenario {
    /// The domain the requests use.
    pub fn domain(&self) -> &Domain {
        &self.rules
    }

    /// How many stores each region has: the main one and the named ones.
    pub fn store_slots(&self) -> usize {
        1 + self.stores.len()
    }

    /// The settings of store slot `slot` (0: the main store).
    pub fn store_cfg(&self, slot: usize) -> &StoreCfg {
        match slot.checked_sub(1).and_then(|i| self.stores.get(i)) {
            Some(n) => &n.cfg,
            None => &self.store,
        }
    }

    /// The name of store slot `slot`, as the daemon labels it (`default` for the main one).
    pub fn store_name(&self, slot: usize) -> &str {
        match slot.checked_sub(1).and_then(|i| self.stores.get(i)) {
            Some(n) => &n.name,
            None => sluice_core::stores::DEFAULT,
        }
    }

    /// The slot of the store a call goes to, from `Plan::store_of` (`None`: the main one).
    /// A name the scenario lacks never reaches here (the check refuses such rules); it
    /// would be the main store.
    pub fn slot_of(&self, store: Option<&str>) -> usize {
        store
            .and_then(|name| self.stores.iter().position(|n| n.name == name))
            .map_or(0, |i| i + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
