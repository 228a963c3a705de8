//! Daemon configuration: a YAML file (`--config`) with flags for the common fields on top.
//! Unknown fields are refused so a typo is an error at start, not a silently ignored setting.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Which counter store to use.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum StoreConfig {
    /// In-process counters: the embedded default (one daemon, or tests).
    Memory {
        /// Key bound.
        #[serde(default = "default_max_keys")]
        max_keys: usize,
    },
    /// One Redis (or a primary behind a stable address). AUTH through the URL.
    Redis {
        /// `redis://[user:pass@]host:port/db`.
        url: String,
    },
    /// A Redis Cluster, by seed nodes.
    RedisCluster {
        /// Seed node URLs.
        urls: Vec<String>,
    },
}

fn default_max_keys() -> usize {
    1_000_000
}

/// A named store (`stores: {<name>: ...}`): the shape of `store` (`kind` and its fields)
/// and, optionally, its own deadline and breaker tuning; what it leaves out is the main
/// store's. Its own Redis, so one tenant's load and outages stay on its own shards.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamedStoreConfig {
    /// `memory`, `redis` or `redis_cluster`, as in `store`.
    pub kind: String,
    /// With `memory`: key bound.
    pub max_keys: Option<usize>,
    /// With `redis`: its URL.
    pub url: Option<String>,
    /// With `redis_cluster`: seed node URLs.
    pub urls: Option<Vec<String>>,
    /// Deadline of one call, ms (default: `store_timeout_ms`).
    pub store_timeout_ms: Option<u64>,
    /// As `store_stale_after_ms` (default: the main store's).
    pub store_stale_after_ms: Option<u64>,
    /// Deadline of connecting, ms (default: `store_connect_timeout_ms`).
    pub store_connect_timeout_ms: Option<u64>,
    /// Breaker tuning (each defaults to the main store's).
    pub breaker_failure_pct: Option<u64>,
    /// See `breaker_window_ms`.
    pub breaker_window_ms: Option<u64>,
    /// See `breaker_min_calls`.
    pub breaker_min_calls: Option<u64>,
    /// See `breaker_cool_off_ms`.
    pub breaker_cool_off_ms: Option<u64>,
}

/// A named store with every setting resolved: what the daemon builds it from.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedStore {
    /// Its name.
    pub name: String,
    /// What it is.
    pub store: StoreConfig,
    /// Deadline of one call, ms.
    pub timeout_ms: u64,
    /// How long after a check's `now` the store may still run its call, ms.
    pub stale_after_ms: Option<u64>,
    /// Deadline of connecting, ms.
    pub connect_timeout_ms: u64,
    /// Its breakers' tuning.
    pub breaker: sluice_core::breaker::BreakerConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig::Memory {
            max_keys: default_max_keys(),
        }
    }
}

/// Everything `sluiced` needs to start.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// HTTP JSON API, `/healthz`, `/metrics`.
    pub http_addr: SocketAddr,
    /// gRPC (`sluice.v1.Limiter`).
    pub grpc_addr: SocketAddr,
    /// This daemon's region.
    pub region: String,
    /// Unique id of this daemon (defaults to region + pid).
    pub daemon_id: Option<String>,
    /// YAML rules file (the embedded default source).
    pub rules: PathBuf,
    /// How often the rules file is checked for changes.
    pub rules_poll_ms: u64,
    /// PostgreSQL URL: rules come from the control plane instead of `rules`
    /// (docs/control-plane.md).
    pub postgres: Option<String>,
    /// Separate URL for `LISTEN`, when `postgres` goes through a transaction pooler.
    pub postgres_listen: Option<String>,
    /// With `postgres`: pull interval, seconds; the bound on staleness when a notification
    /// is lost.
    pub poll_s: u64,
    /// With `postgres`: the last loaded rules on disk, served by a restart while PostgreSQL
    /// is down.
    pub rules_cache: Option<PathBuf>,
    /// Admin API address (default 127.0.0.1:8082 with `postgres`; not served otherwise
    /// unless set).
    pub admin_addr: Option<SocketAddr>,
    /// Admin token for changes (else `SLUICE_ADMIN_TOKEN`).
    pub admin_token: Option<crate::control::Secret>,
    /// Token for reads (else `SLUICE_READ_TOKEN`).
    pub read_token: Option<crate::control::Secret>,
    /// Admin tokens, each naming its principal (`[{principal: alice, token_file: FILE}]`):
    /// a forced tightening of more than 10x waits for a second principal's approval.
    pub admin_tokens: Vec<sluice_control::admin::TokenSpec>,
    /// Read tokens, likewise.
    pub read_tokens: Vec<sluice_control::admin::TokenSpec>,
    /// How long a held change waits for its approval, seconds.
    pub pending_ttl_s: u64,
    /// Counter store.
    pub store: StoreConfig,
    /// Named stores beside the main one, which rules and overrides name with `store:`
    /// (docs/redis.md, "Named stores"); `default` is the main one's name.
    pub stores: std::collections::BTreeMap<String, NamedStoreConfig>,
    /// Deadline of one store call, ms (the hot path's budget; no retries).
    pub store_timeout_ms: u64,
    /// How long after a check's `now` Redis may still run its call, ms: a call past it
    /// (its caller gave up; Redis was paused or backlogged) changes nothing. Unset: the
    /// store deadline; 0: no bound. Keep it above the clock skew to Redis (docs/failure.md).
    pub store_stale_after_ms: Option<u64>,
    /// Deadline of connecting to a store node, ms.
    pub store_connect_timeout_ms: u64,
    /// CA and client certificate for a `rediss://` store (docs/tls.md).
    pub redis_tls: crate::tls::RedisTlsFiles,
    /// TLS on the HTTP, gRPC and admin listeners (docs/tls.md); plain text without it.
    pub tls: crate::tls::TlsConfig,
    /// Circuit breaker per store shard: open above this failure percentage...
    pub breaker_failure_pct: u64,
    /// ...over this window (ms)...
    pub breaker_window_ms: u64,
    /// ...once at least this many calls were made in the window.
    pub breaker_min_calls: u64,
    /// Cool-off before half-open probes, ms.
    pub breaker_cool_off_ms: u64,
    /// Local fallback buckets hold this fraction of a rule's numbers (see docs/failure.md).
    pub local_factor: f64,
    /// Quota journal file: admissions to windows of an hour or more decided while the store
    /// failed, replayed once it answers (none = totals of an outage are not carried over).
    pub journal: Option<PathBuf>,
    /// How long a stopping daemon waits for in-flight requests and open connections.
    pub drain_timeout_ms: u64,
    /// Log filter (`info`, `sluiced=debug`, …); `RUST_LOG` wins.
    pub log: String,
    /// Envoy rate limit service options (docs/envoy.md).
    pub envoy: crate::envoy::EnvoyConfig,
    /// Regions: gossip with the other regions' daemons (docs/regions.md); off without an
    /// address.
    pub gossip: crate::regions::GossipConfig,
    /// Resource limits and self-protection: message size, connections, deadlines, checks in
    /// flight (docs/failure.md).
    pub limits: crate::limits::LimitsConfig,
    /// The hot-key layer's memory (docs/hot-keys.md); each rule's `hot_keys` block says what
    /// it may do.
    pub hot_keys: HotKeysConfig,
    /// The decision log: a sampled record of recent checks on local disk, on by default
    /// (docs/decision-log.md).
    pub decision_log: crate::decisions::DecisionLogConfig,
    /// Threads: 0 = one per CPU the process may use; 1 = the whole daemon on one
    /// single-threaded runtime (what a daemon pinned to one CPU gets with 0); more: the gRPC
    /// and HTTP connections on that many connection threads ([`crate::workers`]), the rest
    /// on a work-stealing runtime of as many workers.
    pub worker_threads: usize,
}

/// Bounds of the hot-key layer: what it may hold, at most, however many keys arrive.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HotKeysConfig {
    /// Cached refusals (about 200 bytes each plus the keys); 0 with `leases: 0` turns the
    /// layer off.
    pub deny_entries: usize,
    /// Leases held at once.
    pub leases: usize,
}

impl Default for HotKeysConfig {
    fn default() -> HotKeysConfig {
        HotKeysConfig {
            deny_entries: 100_000,
            leases: 10_000,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 8081)),
            region: "local".into(),
            daemon_id: None,
            rules: PathBuf::from("deploy/rules.yaml"),
            rules_poll_ms: 1000,
            postgres: None,
            postgres_listen: None,
            poll_s: 30,
            rules_cache: None,
            admin_addr: None,
            admin_token: None,
            read_token: None,
            admin_tokens: Vec::new(),
            read_tokens: Vec::new(),
            pending_ttl_s: 24 * 3600,
            store: StoreConfig::default(),
            stores: std::collections::BTreeMap::new(),
            store_timeout_ms: 3,
            store_stale_after_ms: None,
            store_connect_timeout_ms: 100,
            redis_tls: crate::tls::RedisTlsFiles::default(),
            tls: crate::tls::TlsConfig::default(),
            breaker_failure_pct: 50,
            breaker_window_ms: 5_000,
            breaker_min_calls: 20,
            breaker_cool_off_ms: 10_000,
            local_factor: 0.5,
            drain_timeout_ms: 5_000,
            journal: None,
            log: "info".into(),
            envoy: crate::envoy::EnvoyConfig::default(),
            gossip: crate::regions::GossipConfig::default(),
            limits: crate::limits::LimitsConfig::default(),
            hot_keys: HotKeysConfig::default(),
            decision_log: crate::decisions::DecisionLogConfig::default(),
            worker_threads: 0,
        }
    }
}

impl Config {
    /// Parses a config file's text.
    pub fn from_yaml(text: &str) -> anyhow::Result<Config> {
        let c: Config = serde_norway::from_str(text)?;
        c.validate()?;
        Ok(c)
    }

    /// Refuses nonsense values.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.region.is_empty(), "region must not be empty");
        anyhow::ensure!(
            self.rules_poll_ms > 0,
            "rules_poll_ms must be greater than zero"
        );
        anyhow::ensure!(
            (1..=3600).contains(&self.poll_s),
            "poll_s must be 1 to 3600"
        );
        anyhow::ensure!(
            (60..=30 * 24 * 3600).contains(&self.pending_ttl_s),
            "pending_ttl_s must be 60 (a minute) to 2592000 (30 days)"
        );
        anyhow::ensure!(
            self.hot_keys.deny_entries <= 10_000_000 && self.hot_keys.leases <= 1_000_000,
            "hot_keys: deny_entries must be at most 10000000 and leases at most 1000000"
        );
        anyhow::ensure!(
            (1..=60_000).contains(&self.store_timeout_ms),
            "store_timeout_ms must be 1 to 60000"
        );
        anyhow::ensure!(
            self.store_stale_after_ms.is_none_or(|s| s <= 3_600_000),
            "store_stale_after_ms must be 0 (no bound) to 3600000"
        );
        anyhow::ensure!(
            (1..=100).contains(&self.breaker_failure_pct)
                && self.breaker_window_ms > 0
                && self.breaker_cool_off_ms > 0,
            "breaker_failure_pct must be 1 to 100 and breaker windows greater than zero"
        );
        anyhow::ensure!(
            self.local_factor > 0.0 && self.local_factor <= 1.0,
            "local_factor must be in (0, 1]"
        );
        anyhow::ensure!(
            self.worker_threads <= 1024,
            "worker_threads must be 0 (one per CPU) to 1024"
        );
        self.named_stores()?;
        self.gossip.validate()?;
        self.limits.validate()?;
        self.tls.validate()?;
        self.decision_log.resolve()?;
        Ok(())
    }

    /// The named stores, every setting resolved; an error naming the store and the field for
    /// a bad one.
    pub fn named_stores(&self) -> anyhow::Result<Vec<NamedStore>> {
        let mut out = Vec::with_capacity(self.stores.len());
        for (name, c) in &self.stores {
            let at = |m: &str| anyhow::anyhow!("stores.{name}: {m}");
            if !sluice_core::stores::valid_name(name) {
                return Err(at("a store name is 1 to 64 characters of a-z 0-9 _ -"));
            }
            if name == sluice_core::stores::DEFAULT {
                return Err(at(
                    "default is the main store's name (configure it as store:)",
                ));
            }
            let fields = [
                ("max_keys", c.max_keys.is_some()),
                ("url", c.url.is_some()),
                ("urls", c.urls.is_some()),
            ];
            let (store, takes) = match c.kind.as_str() {
                "memory" => (
                    StoreConfig::Memory {
                        max_keys: c.max_keys.unwrap_or_else(default_max_keys),
                    },
                    "max_keys",
                ),
                "redis" => (
                    StoreConfig::Redis {
                        url: c.url.clone().ok_or_else(|| at("kind redis needs url"))?,
                    },
                    "url",
                ),
                "redis_cluster" => {
                    let urls = c.urls.clone().unwrap_or_default();
                    if urls.is_empty() {
                        return Err(at("kind redis_cluster needs urls (seed nodes)"));
                    }
                    (StoreConfig::RedisCluster { urls }, "urls")
                }
                other => {
                    return Err(at(&format!(
                        "unknown kind {other:?}; expected memory | redis | redis_cluster"
                    )));
                }
            };
            if let Some((f, _)) = fields.iter().find(|(f, given)| *given && *f != takes) {
                return Err(at(&format!("{f} does not apply to kind {}", c.kind)));
            }
            let timeout_ms = c.store_timeout_ms.unwrap_or(self.store_timeout_ms);
            if !(1..=60_000).contains(&timeout_ms) {
                return Err(at("store_timeout_ms must be 1 to 60000"));
            }
            let stale_after_ms = c.store_stale_after_ms.or(self.store_stale_after_ms);
            if stale_after_ms.is_some_and(|s| s > 3_600_000) {
                return Err(at("store_stale_after_ms must be 0 (no bound) to 3600000"));
            }
            let main = self.breaker();
            let breaker = sluice_core::breaker::BreakerConfig {
                failure_pct: c.breaker_failure_pct.unwrap_or(main.failure_pct),
                window: c
                    .breaker_window_ms
                    .map_or(main.window, |ms| ms.saturating_mul(1000)),
                min_calls: c.breaker_min_calls.unwrap_or(main.min_calls),
                cool_off: c
                    .breaker_cool_off_ms
                    .map_or(main.cool_off, |ms| ms.saturating_mul(1000)),
                probes: main.probes,
            };
            if !(1..=100).contains(&breaker.failure_pct)
                || breaker.window == 0
                || breaker.cool_off == 0
            {
                return Err(at(
                    "breaker_failure_pct must be 1 to 100 and breaker windows greater than zero",
                ));
            }
            out.push(NamedStore {
                name: name.clone(),
                store,
                timeout_ms,
                stale_after_ms,
                connect_timeout_ms: c
                    .store_connect_timeout_ms
                    .unwrap_or(self.store_connect_timeout_ms),
                breaker,
            });
        }
        Ok(out)
    }

    /// The breaker tuning as the core takes it.
    pub fn breaker(&self) -> sluice_core::breaker::BreakerConfig {
        sluice_core::breaker::BreakerConfig {
            failure_pct: self.breaker_failure_pct,
            window: self.breaker_window_ms * 1000,
            min_calls: self.breaker_min_calls,
            cool_off: self.breaker_cool_off_ms * 1000,
            probes: 3,
        }
    }

    /// How many threads `worker_threads` means here: 0 is the CPUs this process may run on
    /// (its affinity mask: a daemon pinned to one CPU gets 1).
    pub fn threads(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        }
    }

    /// The daemon id, defaulted.
    pub fn daemon_id(&self) -> String {
        self.daemon_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", self.region, std::process::id()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_example_config_is_valid() {
        let text = include_str!("../../../deploy/sluiced.example.yaml");
        let c = Config::from_yaml(text).expect("deploy/sluiced.example.yaml is valid");
        assert_eq!(
            c.store,
            StoreConfig::Redis {
                url: "redis://127.0.0.1:6379/".into()
            }
        );
    }

    #[test]
    fn parses_and_refuses() {
        let c = Config::from_yaml("region: eu\nstore: { kind: memory, max_keys: 10 }\n")
            .expect("valid");
        assert_eq!(c.region, "eu");
        assert_eq!(c.store, StoreConfig::Memory { max_keys: 10 });
        assert!(Config::from_yaml("regoin: eu\n").is_err());
        assert!(Config::from_yaml("local_factor: 3\n").is_err());
        assert!(Config::from_yaml("store: { kind: floppy }\n").is_err());
        let c = Config::from_yaml("envoy: { header_set: x_ratelimit }\n").expect("valid");
        assert_eq!(
            c.envoy.header_set,
            sluice_core::decision::HeaderSet::XRatelimit
        );
        assert!(
            c.envoy.response_headers,
            "the other fields keep their defaults"
        );
        let err = Config::from_yaml("envoy: { header_set: x-ratelimit }\n")
            .expect_err("an unknown header set");
        assert!(format!("{err:#}").contains("header_set"), "{err:#}");
    }
}
