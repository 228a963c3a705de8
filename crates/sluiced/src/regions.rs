//! Regions: the daemon's side of the delta shipper (docs/regions.md).
//!
//! With a gossip address configured, the daemon joins its cluster ([`sluice_gossip::Node`])
//! and connects it to the engine at two points, both outside the store call:
//!
//! - before a decision, [`RemoteSource`]: the other regions' figures for each `scope: global`
//!   rule's key are added to the store call (the core passes them into the algorithm, so the
//!   decision on local count + remote sum is taken inside the same atomic call);
//! - after a decision, [`UsageSink`]: for each global rule the store answered, the region's
//!   figure (the outcome's `usage`: for windows the region's count in the shared store, for
//!   token bucket and GCRA the region's cumulative consumption `used`, also kept in the
//!   shared store so every daemon of a region reports the same figure) is recorded for the
//!   next shipment.
//!
//! Fixed and sliding windows, token buckets and GCRA are shared; sliding logs and
//! concurrency are not (docs/regions.md). A bucket counts `used` only when the store call
//! says the rule is shared ([`Remote::shared_bucket`]), which the core's remote figure does
//! for every global bucket rule: region-scope buckets keep their smaller state. What the
//! figure is and what gets recorded are the core's (`merge`, `ship`): the simulator runs the
//! same two functions.

use crate::engine::{RemoteSource, UsageSink};
use crate::metrics::{Exporter, Metrics};
use serde::Deserialize;
use sluice_control::Published;
use sluice_core::algo::Kind;
use sluice_core::decision::{Answer, Plan};
use sluice_core::rules::{Mode, Scope};
use sluice_core::ship::{Budget, BusyRule, observations};
use sluice_core::{Micros, Params, Remote};
use sluice_gossip::{Node, RuleLookup, Shippers};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Which daemons of a region ship its figures (see [`Shippers`]).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ShippersConfig {
    /// Every daemon sends what it decided to its region's elected sender, which ships the
    /// region's figures once per remote region, to that region's receiver, which passes them
    /// on (correct under any load balancing; cross-region traffic grows with regions, not
    /// daemons²).
    #[default]
    RegionSender,
    /// Every daemon ships what it decided to every daemon elsewhere (correct under any load
    /// balancing; traffic grows with daemons here × daemons elsewhere).
    EveryDaemon,
    /// The live daemon with the lowest id ships (fewer packets; needs an even spread).
    OnePerRegion,
}

/// What a key's share threshold is judged on (`gossip.busy_on`; the simulator's is the same
/// type).
pub use sluice_core::ship::BusyOn;

/// The `gossip:` section of the config file. Regions are off unless `addr` is set.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct GossipConfig {
    /// UDP address for membership and counts (`--gossip-addr`).
    pub addr: Option<SocketAddr>,
    /// Address other daemons reach this one at, when `addr` is a wildcard or behind NAT.
    pub advertise_addr: Option<SocketAddr>,
    /// Gossip addresses of seed daemons, `host:port` (`--gossip-seed`, repeatable).
    pub seeds: Vec<String>,
    /// Daemons of other clusters are ignored (`--cluster-id`).
    pub cluster_id: String,
    /// Shared key authenticating every datagram (HMAC-SHA256), at least 16 bytes. Prefer
    /// `key_file` or `SLUICE_GOSSIP_KEY` over writing it here.
    pub key: Option<String>,
    /// A file holding the key: one per line (blank lines and a trailing newline ignored),
    /// or two during a rotation, the first sealing and both accepted. Re-read every
    /// `key_reload_ms`, so a rotation needs no restart (docs/regions.md, "Key rotation").
    pub key_file: Option<PathBuf>,
    /// How often `key_file` is re-read, ms (0: only at start).
    pub key_reload_ms: u64,
    /// How often busy figures are shipped, ms.
    pub ship_interval_ms: u64,
    /// chitchat's gossip round, ms.
    pub gossip_interval_ms: u64,
    /// How long this region's sender may stay silent (it sends every daemon of the region
    /// something at least every quarter interval) before the election passes it over, ms
    /// (0: three quarters of the ship interval, so a dead sender is replaced within one
    /// interval). A sender only slow costs a duplicate shipment, never a wrong count.
    pub sender_stale_ms: u64,
    /// What one interval may ship, in estimated entry bytes (`sluice_core::ship`); busy
    /// figures beyond it are deferred, nearest their limit first, and counted.
    pub max_bytes_per_interval: usize,
    /// Largest datagram, bytes (1,400 avoids IP fragmentation on the WAN).
    pub max_datagram: usize,
    /// Re-ship an unchanged busy figure after this long, ms (repairs lost datagrams and
    /// brings a returning region up to date).
    pub resend_after_ms: u64,
    /// Keys the table of remote figures may hold.
    pub max_remote_keys: usize,
    /// Which daemons ship.
    pub shippers: ShippersConfig,
    /// `region_sender`: how many peer regions a region's sender ships to; each receiver
    /// forwards the other regions' figures on along the origin's tree (docs/regions.md,
    /// "Dozens of regions"). 0: to every other region (point-to-point), as is any fan-out
    /// while the forwarding regions are at most `fanout + 1`.
    pub fanout: usize,
    /// What the share threshold is judged on (`seen_share` by default: the count a decision
    /// saw against `share_threshold / regions`; docs/regions.md, "The busy rule").
    pub busy_on: BusyOn,
    /// Regions the threshold is split between (`seen_share`, `region_share`), at least: the
    /// regions the membership lists count when more (0: the membership alone). Set it to the
    /// regions deployed, so a region that has not joined yet does not enlarge the shares.
    pub regions: usize,
    /// Whether a global bucket's key carries its generation's birth stamp, so a restarted key
    /// is drained elsewhere from its first unit (docs/regions.md). Set it to `false` while a
    /// region's daemons are being rolled onto this release from one without labels: an
    /// older daemon's script refuses a labelled state, and with labels off this one writes
    /// (and rewrites) the older form (docs/upgrading.md).
    pub bucket_generations: bool,
}

impl Default for GossipConfig {
    fn default() -> Self {
        GossipConfig {
            addr: None,
            advertise_addr: None,
            seeds: Vec::new(),
            cluster_id: "sluice".into(),
            key: None,
            key_file: None,
            key_reload_ms: 5_000,
            ship_interval_ms: 1_000,
            gossip_interval_ms: 500,
            sender_stale_ms: 0,
            max_bytes_per_interval: Budget::default().max_bytes,
            max_datagram: 1_400,
            resend_after_ms: 5_000,
            max_remote_keys: 1_000_000,
            shippers: ShippersConfig::RegionSender,
            fanout: 0,
            busy_on: BusyOn::default(),
            regions: 0,
            bucket_generations: true,
        }
    }
}

impl GossipConfig {
    /// Refuses nonsense values (the node checks the rest when it starts).
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.cluster_id.is_empty() && self.cluster_id.len() <= 255,
            "gossip.cluster_id must be 1 to 255 bytes"
        );
        anyhow::ensure!(
            self.ship_interval_ms >= 10 && self.gossip_interval_ms >= 10,
            "gossip.ship_interval_ms and gossip.gossip_interval_ms must be at least 10"
        );
        anyhow::ensure!(
            (512..=65_507).contains(&self.max_datagram),
            "gossip.max_datagram must be 512 to 65507"
        );
        anyhow::ensure!(
            !(self.key.is_some() && self.key_file.is_some()),
            "gossip.key and gossip.key_file are exclusive"
        );
        Ok(())
    }

    /// The shared keys, the sealing one first: `key`, or the lines of `key_file` (with the
    /// text they were read from, which a reload compares against).
    fn keys(&self) -> anyhow::Result<(Vec<Vec<u8>>, Option<String>)> {
        if let Some(k) = &self.key {
            return Ok((vec![k.as_bytes().to_vec()], None));
        }
        match &self.key_file {
            None => Ok((Vec::new(), None)),
            Some(path) => {
                let text = read_key_file(path)?;
                Ok((key_lines(&text, path)?, Some(text)))
            }
        }
    }
}

fn read_key_file(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read gossip key file {}: {e}", path.display()))
}

/// The keys of a key file's text: its non-blank lines, one key or two.
fn key_lines(text: &str, path: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let keys: Vec<Vec<u8>> = text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty())
        .map(|l| l.as_bytes().to_vec())
        .collect();
    anyhow::ensure!(
        !keys.is_empty(),
        "gossip key file {} holds no key",
        path.display()
    );
    Ok(keys)
}

/// Re-reads the key file every `every` and hands changed keys to the node; a file that
/// cannot be read or holds bad keys is logged and the keys in use are kept. Ends with the
/// node.
async fn reload_keys(
    path: PathBuf,
    mut last: Option<String>,
    every: Duration,
    regions: std::sync::Weak<Regions>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(regions) = regions.upgrade() else {
            return;
        };
        let text = match read_key_file(&path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "gossip keys kept");
                continue;
            }
        };
        if last.as_deref() == Some(text.as_str()) {
            continue;
        }
        let result = key_lines(&text, &path).and_then(|keys| {
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            regions.node.set_keys(&refs)?;
            Ok(keys.len())
        });
        match result {
            Ok(n) => tracing::info!(keys = n, file = %path.display(), "gossip keys replaced"),
            Err(e) => {
                tracing::warn!(error = %e, "gossip key file refused; the keys in use are kept")
            }
        }
        last = Some(text);
    }
}

/// Finds a received figure's rule in the live rule set.
struct Lookup {
    rules: Arc<Published>,
}

impl RuleLookup for Lookup {
    fn global_params(&self, identity: &str, rule: &str) -> Option<Params> {
        let domain = sluice_core::keys::domain(identity);
        let set = self.rules.load();
        let r = set.domain(&domain)?.rule(rule)?;
        if r.scope != Scope::Global || r.mode == Mode::Off {
            return None;
        }
        // A split rule's sub-count has its share of the numbers, not the rule's.
        Some(match sluice_core::keys::split_identity(identity).1 {
            Some(part) if r.hot_keys.split > 1 && part < r.hot_keys.split => {
                sluice_core::hotkeys::split::sub_params(&r.params, part, r.hot_keys.split)
            }
            Some(_) if r.hot_keys.split > 1 => return None,
            _ => r.params.clone(),
        })
    }
}

/// The daemon's gossip node, wired to the engine and `/metrics`.
pub struct Regions {
    node: Node,
    busy_on: BusyOn,
    regions: usize,
    bucket_generations: bool,
}

impl std::fmt::Debug for Regions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Regions")
            .field("gossip_addr", &self.node.local_addr())
            .finish()
    }
}

impl Regions {
    /// The bound gossip address.
    pub fn local_addr(&self) -> SocketAddr {
        self.node.local_addr()
    }

    /// The gossip node, for the console's state (`GET /v1/daemon`).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Live daemons of this region as the membership reports them now (itself included).
    pub fn region_daemons(&self) -> u64 {
        self.node.region_daemons()
    }

    /// Leaves the cluster.
    pub async fn shutdown(&self) {
        self.node.shutdown().await;
    }
}

impl RemoteSource for Regions {
    /// Called for global rules only: the core's one figure for a decision
    /// ([`sluice_core::merge::RemoteCounts::remote_for`], buckets marked shared, so the store
    /// counts the region's cumulative `used` in the key and returns it as the outcome's
    /// `usage`). The simulator plans with the same function. A bucket is shared by the
    /// regions the busy rule counts (the membership's, or `gossip.regions` when more): a key
    /// new to this region starts with that share of the burst; with `bucket_generations`
    /// off its key keeps the form a release before labels reads ([`Remote::without_labels`]).
    fn remote(&self, key: &str, params: &Params, now: Micros) -> Remote {
        let regions = self.regions.max(self.node.regions());
        let remote = self.node.remote_among(key, params, now, regions);
        if self.bucket_generations {
            remote
        } else {
            remote.without_labels()
        }
    }
}

impl UsageSink for Regions {
    /// Records, for each global rule the shared store answered, what the core says its
    /// shipper records ([`sluice_core::ship::observations`], as the simulator does).
    fn observe(&self, plan: &Plan<'_>, answers: &[Answer], now: Micros) {
        let rule = BusyRule {
            on: self.busy_on,
            regions: self.regions.max(self.node.regions()),
        };
        for (a, o) in observations(plan, answers, rule, None) {
            self.node.observe(&a.key, &a.params, now, o);
        }
    }
}

impl Exporter for Regions {
    fn render(&self, out: &mut String) {
        self.node.render_metrics(out);
    }
}

/// Starts gossip when `cfg.gossip.addr` is set; says what global rules will do either way.
pub async fn start(
    cfg: &crate::config::Config,
    rules: Arc<Published>,
    metrics: &Metrics,
    clock: Arc<dyn crate::clock::Clock>,
) -> anyhow::Result<Option<Arc<Regions>>> {
    let g = &cfg.gossip;
    let set = rules.load();
    let global: Vec<(String, Kind)> = set
        .domains
        .values()
        .flat_map(|d| d.rules.iter())
        .filter(|r| r.scope == Scope::Global)
        .map(|r| (r.id.to_string(), r.params.kind()))
        .collect();
    let Some(addr) = g.addr else {
        if !global.is_empty() {
            tracing::warn!(
                rules = global.len(),
                "rules with scope: global but no gossip address: they are decided in this region only"
            );
        }
        return Ok(None);
    };
    let mut nc = sluice_gossip::Config::new(&cfg.region, &cfg.daemon_id(), addr);
    nc.advertise_addr = g.advertise_addr;
    nc.seeds = g.seeds.clone();
    nc.cluster_id = g.cluster_id.clone();
    let (keys, key_text) = g.keys()?;
    nc.key = keys.first().cloned();
    nc.ship_interval = Duration::from_millis(g.ship_interval_ms);
    nc.gossip_interval = Duration::from_millis(g.gossip_interval_ms);
    nc.sender_stale_after =
        (g.sender_stale_ms > 0).then(|| Duration::from_millis(g.sender_stale_ms));
    nc.budget = Budget {
        max_bytes: g.max_bytes_per_interval,
        max_entries: usize::MAX,
        resend_after: g.resend_after_ms * 1000,
    };
    nc.max_datagram = g.max_datagram;
    nc.max_remote_keys = g.max_remote_keys;
    nc.fanout = g.fanout;
    nc.clock = clock;
    nc.shippers = match g.shippers {
        ShippersConfig::RegionSender => Shippers::RegionSender,
        ShippersConfig::EveryDaemon => Shippers::EveryDaemon,
        ShippersConfig::OnePerRegion => Shippers::OnePerRegion,
    };
    if nc.key.is_none() {
        tracing::warn!(
            "gossip has no shared key: anyone who can reach the gossip port can inject counts (set --gossip-key or SLUICE_GOSSIP_KEY)"
        );
    }
    let node = Node::start(nc, Arc::new(Lookup { rules })).await?;
    let regions = Arc::new(Regions {
        node,
        busy_on: g.busy_on,
        regions: g.regions,
        bucket_generations: g.bucket_generations,
    });
    if keys.len() > 1 {
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        regions.node.set_keys(&refs)?;
    }
    if let Some(path) = &g.key_file
        && g.key_reload_ms > 0
    {
        tokio::spawn(reload_keys(
            path.clone(),
            key_text,
            Duration::from_millis(g.key_reload_ms),
            Arc::downgrade(&regions),
        ));
    }
    metrics.add_exporter(regions.clone());
    Ok(Some(regions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Rate;

    #[test]
    fn config_validates() {
        assert!(GossipConfig::default().validate().is_ok());
        let bad = GossipConfig {
            max_datagram: 100,
            ..GossipConfig::default()
        };
        assert!(bad.validate().is_err());
        let both = GossipConfig {
            key: Some("k".repeat(16)),
            key_file: Some("/k".into()),
            ..GossipConfig::default()
        };
        assert!(both.validate().is_err());
    }

    #[test]
    fn shippers_default_to_one_sender_per_region_and_keep_the_old_modes() {
        assert_eq!(
            GossipConfig::default().shippers,
            ShippersConfig::RegionSender
        );
        for (text, want) in [
            ("shippers: region_sender", ShippersConfig::RegionSender),
            ("shippers: every_daemon", ShippersConfig::EveryDaemon),
            ("shippers: one_per_region", ShippersConfig::OnePerRegion),
        ] {
            let g: GossipConfig = serde_norway::from_str(text).expect("parses");
            assert_eq!(g.shippers, want, "{text}");
        }
        assert!(serde_norway::from_str::<GossipConfig>("shippers: some_daemons").is_err());
        // Point-to-point unless a fan-out is set, which reaches the node.
        assert_eq!(GossipConfig::default().fanout, 0);
        assert!(GossipConfig::default().bucket_generations);
        let g: GossipConfig = serde_norway::from_str("bucket_generations: false").expect("parses");
        assert!(!g.bucket_generations);
        let g: GossipConfig = serde_norway::from_str("fanout: 4").expect("parses");
        assert_eq!(g.fanout, 4);
    }

    #[test]
    fn a_key_file_holds_one_key_or_two() {
        let p = Path::new("k");
        assert_eq!(
            key_lines("first key\r\n\nsecond key\n", p).expect("two"),
            [b"first key".to_vec(), b"second key".to_vec()]
        );
        assert_eq!(key_lines("only\n", p).expect("one"), [b"only".to_vec()]);
        assert!(key_lines("\n\n", p).is_err());
    }

    #[tokio::test]
    async fn the_key_file_is_reread_and_a_bad_one_leaves_the_keys_in_use() {
        const OLD: &str = "the old gossip key, long enough";
        const NEW: &str = "the new gossip key, long enough";
        let dir = std::env::temp_dir().join(format!("sluiced-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("gossip.key");
        std::fs::write(&path, format!("{OLD}\n")).expect("write");
        let mut cfg = crate::config::Config::default();
        cfg.gossip.addr = Some(([127, 0, 0, 1], 0).into());
        cfg.gossip.key_file = Some(path.clone());
        cfg.gossip.key_reload_ms = 10;
        let rules = Published::new(
            sluice_core::rules::parse_yaml("domain: d\nrules: []\n").expect("rules"),
        );
        let metrics = Metrics::default();
        let r = start(
            &cfg,
            rules,
            &metrics,
            Arc::new(crate::clock::SystemClock::new()),
        )
        .await
        .expect("start")
        .expect("gossip on");
        assert_eq!(r.node.gauges().keys, 1);
        let wait = |want: (u64, u64)| {
            let r = r.clone();
            async move {
                for _ in 0..500 {
                    if r.node.metrics().key_changes() == want {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!(
                    "key changes {:?}, wanted {want:?}",
                    r.node.metrics().key_changes()
                );
            }
        };
        std::fs::write(&path, format!("{OLD}\n{NEW}\n")).expect("write");
        wait((1, 0)).await;
        assert_eq!(r.node.gauges().keys, 2);
        std::fs::write(&path, "short\n").expect("write");
        wait((1, 1)).await;
        assert_eq!(
            r.node.gauges().keys,
            2,
            "a refused file keeps the keys in use"
        );
        std::fs::write(&path, format!("{NEW}\n")).expect("write");
        wait((2, 1)).await;
        assert_eq!(r.node.gauges().keys, 1);
        r.node.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn lookup_finds_only_global_rules() {
        let set = sluice_core::rules::parse_yaml(
            r#"
domain: "a|b"
rules:
  - { id: g, key: [k], algorithm: fixed_window, limit: 10, window: 1m, scope: global }
  - { id: r, key: [k], algorithm: fixed_window, limit: 10, window: 1m }
"#,
        )
        .expect("valid");
        let l = Lookup {
            rules: Published::new(set),
        };
        assert!(l.global_params("a%7Cb|k=v", "g").is_some());
        assert!(l.global_params("a%7Cb|k=v", "r").is_none());
        assert!(l.global_params("other|k=v", "g").is_none());
    }

    #[test]
    fn a_sub_count_is_looked_up_with_its_share_of_the_numbers() {
        let set = sluice_core::rules::parse_yaml(
            r#"
domain: d
rules:
  - { id: s, key: [k], algorithm: token_bucket, rate_per_s: 10, burst: 100, scope: global, hot_keys: { split: 4 } }
"#,
        )
        .expect("valid");
        let l = Lookup {
            rules: Published::new(set),
        };
        let whole = Params::TokenBucket {
            rate: Rate::per_second(10),
            burst: 100,
        };
        for part in 0..4 {
            assert_eq!(
                l.global_params(&format!("d|k=v|#{part}"), "s"),
                Some(sluice_core::hotkeys::split::sub_params(&whole, part, 4))
            );
        }
        assert_eq!(
            l.global_params("d|k=v|#1", "s"),
            Some(Params::TokenBucket {
                rate: Rate::per_second(3),
                burst: 25
            })
        );
        assert_eq!(l.global_params("d|k=v|#4", "s"), None, "no such part");
    }
}
