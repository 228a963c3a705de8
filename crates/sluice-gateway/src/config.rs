//! What the gateway is told: the command line's addresses and the config file's policy.
//!
//! The file (YAML, like `sluiced`'s) holds what an operator tunes per API; the command line
//! what differs per deployment (where to listen, the upstream, the daemon).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::HeaderName;
use serde::Deserialize;
use sluice_tower::{Cidr, FailureMode, FloodLimit, ReleaseFor, Routes};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not the YAML this expects.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// The YAML error.
        source: serde_norway::Error,
    },
    /// A field holds a value the gateway cannot use.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// How the limiter's silence is met, as the file spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// Forward unchecked (counted).
    #[default]
    Open,
    /// Answer 503.
    Closed,
}

/// Which allowed requests are released, as the file spells it (`release:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Release {
    /// Those whose answer says a concurrency slot was taken: one daemon call per request
    /// elsewhere.
    #[default]
    SlotTaken,
    /// Every request with a request id: for a `sluiced` older than the answer's `release`
    /// field, whose slots would otherwise be held to their timeout.
    AnyRequestId,
}

/// The edge guard as the file spells it (`edge:`): what the gateway answers itself before a
/// daemon call (`sluice_core::edge`). Refusal memory on, flood bucket off, by default.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeFile {
    /// Repeat a daemon refusal until its retry time without asking again (default true).
    pub remember_refusals: bool,
    /// The longest a refusal is repeated, ms (default 60,000): bounds how long a raised limit
    /// goes unseen by a refused key.
    pub max_hold_ms: u64,
    /// A coarse token bucket per client (API key, else IP), far above any real client's
    /// rate; off unless set.
    pub flood: Option<FloodFile>,
}

impl Default for EdgeFile {
    fn default() -> Self {
        EdgeFile {
            remember_refusals: true,
            max_hold_ms: 60_000,
            flood: None,
        }
    }
}

/// The flood bucket's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloodFile {
    /// Requests per second refilled (> 0).
    pub rate_per_s: u64,
    /// Capacity (> 0).
    pub burst: u64,
}

/// The config file: every field optional, defaults as in [`FileConfig::default`].
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// The rules' domain (default `default`).
    pub domain: String,
    /// Path templates (`/v1/users/{id}`) for the `route` descriptor.
    pub templates: Vec<String>,
    /// The path of a request no template matches (default `*`).
    pub fallback: String,
    /// A header carrying the API key, read before `Authorization: Bearer`.
    pub api_key_header: Option<String>,
    /// Whether `Authorization: Bearer` gives the API key (default true).
    pub bearer_api_key: bool,
    /// A header carrying the tier (only one an authenticating hop in front writes).
    pub tier_header: Option<String>,
    /// CIDRs whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<String>,
    /// Deadline of one check, ms (default 3).
    pub deadline_ms: u64,
    /// What an unanswered check means (default open).
    pub failure: Failure,
    /// Which allowed requests are released (default those that took a slot).
    pub release: Release,
    /// Where `/metrics` listens (default none).
    pub metrics_addr: Option<SocketAddr>,
    /// How long in-flight requests may take after a shutdown signal, s (default 10).
    pub shutdown_timeout_s: u64,
    /// The edge guard (refusal memory on, flood bucket off by default).
    pub edge: EdgeFile,
    /// The longest the gateway holds a request a shaping rule admitted with a delay, ms
    /// (default 5000); past it the request is answered 429 (`sluice_tower::Config::max_wait`).
    pub max_wait_ms: u64,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            domain: "default".into(),
            templates: Vec::new(),
            fallback: "*".into(),
            api_key_header: None,
            bearer_api_key: true,
            tier_header: None,
            trusted_proxies: Vec::new(),
            deadline_ms: 3,
            failure: Failure::Open,
            release: Release::SlotTaken,
            metrics_addr: None,
            shutdown_timeout_s: 10,
            edge: EdgeFile::default(),
            max_wait_ms: 5_000,
        }
    }
}

impl FileConfig {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|source| ConfigError::Parse {
            path: shown,
            source,
        })
    }

    /// Parses a config file's text.
    pub fn parse(text: &str) -> Result<Self, serde_norway::Error> {
        serde_norway::from_str(text)
    }
}

/// Everything [`crate::run`] needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The upstream, `http://host:port` (a path prefix is not supported).
    pub upstream: http::uri::Authority,
    /// The daemon's gRPC address, `http://host:port`.
    pub sluiced: String,
    /// The file's fields.
    pub file: FileConfig,
}

impl Settings {
    /// Checks the upstream URL and the daemon address; `sluiced` may be `host:port` or a URL.
    pub fn new(upstream: &str, sluiced: &str, file: FileConfig) -> Result<Self, ConfigError> {
        let invalid = |field, reason: String| ConfigError::Invalid { field, reason };
        let uri: http::Uri = upstream
            .parse()
            .map_err(|e| invalid("upstream", format!("{upstream}: {e}")))?;
        if uri.scheme_str() != Some("http") {
            return Err(invalid(
                "upstream",
                format!("{upstream}: only http:// is supported"),
            ));
        }
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(invalid("upstream", format!("{upstream}: no path prefix")));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| invalid("upstream", format!("{upstream}: no host")))?;
        let sluiced = if sluiced.contains("://") {
            sluiced.to_string()
        } else {
            format!("http://{sluiced}")
        };
        let s = Settings {
            upstream: authority,
            sluiced,
            file,
        };
        s.layer_config()?;
        Ok(s)
    }

    /// The deadline of one check.
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.file.deadline_ms)
    }

    /// The layer's configuration from the file.
    pub fn layer_config(&self) -> Result<sluice_tower::Config, ConfigError> {
        let invalid = |field, reason: String| ConfigError::Invalid { field, reason };
        let f = &self.file;
        let mut c = sluice_tower::Config::new(f.domain.clone());
        c.routes = Routes::new(f.templates.iter(), &f.fallback)
            .map_err(|e| invalid("templates", e.to_string()))?;
        let header = |field, v: &Option<String>| -> Result<Option<HeaderName>, ConfigError> {
            v.as_deref()
                .map(|h| HeaderName::try_from(h).map_err(|e| invalid(field, format!("{h}: {e}"))))
                .transpose()
        };
        c.api_key_header = header("api_key_header", &f.api_key_header)?;
        c.tier_header = header("tier_header", &f.tier_header)?;
        c.bearer_api_key = f.bearer_api_key;
        c.trusted_proxies = f
            .trusted_proxies
            .iter()
            .map(|s| {
                s.parse::<Cidr>()
                    .map_err(|e| invalid("trusted_proxies", format!("{s}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        c.failure = match f.failure {
            Failure::Open => FailureMode::Open,
            Failure::Closed => FailureMode::Closed,
        };
        c.release = match f.release {
            Release::SlotTaken => ReleaseFor::SlotTaken,
            Release::AnyRequestId => ReleaseFor::AnyRequestId,
        };
        let guard = &mut c.edge.guard;
        guard.remember_refusals = f.edge.remember_refusals;
        guard.max_hold = f.edge.max_hold_ms.saturating_mul(1_000);
        guard.flood = match f.edge.flood {
            Some(FloodFile { rate_per_s, burst }) if rate_per_s == 0 || burst == 0 => {
                return Err(invalid(
                    "edge.flood",
                    format!("rate_per_s and burst must be above 0, got {rate_per_s} and {burst}"),
                ));
            }
            Some(FloodFile { rate_per_s, burst }) => Some(FloodLimit { rate_per_s, burst }),
            None => None,
        };
        c.max_wait = Duration::from_millis(f.max_wait_ms);
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_wait_bounds_how_long_a_shaped_request_is_held() {
        let layer = |text: &str| {
            let f = FileConfig::parse(text).expect("parses");
            let s = Settings::new("http://127.0.0.1:9000", "127.0.0.1:8081", f).expect("valid");
            s.layer_config().expect("valid")
        };
        assert_eq!(layer("domain: api\n").max_wait, Duration::from_secs(5));
        let c = layer("domain: api\nmax_wait_ms: 250\n");
        assert_eq!(c.max_wait, Duration::from_millis(250));
    }

    #[test]
    fn a_file_sets_the_layer() {
        let f = FileConfig::parse(
            "domain: api\ntemplates: [\"/v1/users/{id}\"]\napi_key_header: x-api-key\ntrusted_proxies: [10.0.0.0/8]\nfailure: closed\n",
        )
        .expect("parses");
        let s = Settings::new("http://127.0.0.1:9000", "127.0.0.1:8081", f).expect("valid");
        let c = s.layer_config().expect("valid");
        assert_eq!(c.domain, "api");
        assert_eq!(c.failure, FailureMode::Closed);
        assert_eq!(c.release, ReleaseFor::SlotTaken);
        assert_eq!(c.trusted_proxies.len(), 1);
        assert_eq!(s.sluiced, "http://127.0.0.1:8081");
        assert_eq!(s.upstream.as_str(), "127.0.0.1:9000");
    }

    #[test]
    fn the_edge_guard_is_on_by_default_and_set_by_the_file() {
        let s = |text: &str| {
            let f = FileConfig::parse(text).expect("parses");
            Settings::new("http://127.0.0.1:9000", "x:1", f).map(|s| s.layer_config())
        };
        let on = s("domain: api\n").expect("valid").expect("valid");
        assert!(on.edge.guard.remember_refusals);
        assert_eq!(on.edge.guard.flood, None);
        let set = s("edge: { remember_refusals: false, max_hold_ms: 2000, flood: { rate_per_s: 200, burst: 400 } }\n")
            .expect("valid")
            .expect("valid");
        assert!(!set.edge.guard.remember_refusals);
        assert_eq!(set.edge.guard.max_hold, 2_000_000);
        assert_eq!(
            set.edge.guard.flood,
            Some(FloodLimit {
                rate_per_s: 200,
                burst: 400
            })
        );
        assert!(s("edge: { flood: { rate_per_s: 0, burst: 1 } }\n").is_err());
        assert!(FileConfig::parse("edge: { remember: false }\n").is_err());
    }

    #[test]
    fn every_request_id_is_released_for_an_older_daemon() {
        let f = FileConfig::parse("release: any_request_id\n").expect("parses");
        let s = Settings::new("http://127.0.0.1:9000", "x:1", f).expect("valid");
        assert_eq!(
            s.layer_config().expect("valid").release,
            ReleaseFor::AnyRequestId
        );
        assert!(FileConfig::parse("release: rules\n").is_err());
    }

    #[test]
    fn unknown_fields_and_bad_upstreams_are_refused() {
        assert!(FileConfig::parse("domian: api\n").is_err());
        let f = FileConfig::default();
        assert!(Settings::new("https://up:443", "x:1", f.clone()).is_err());
        assert!(Settings::new("http://up:80/prefix", "x:1", f).is_err());
    }
}
