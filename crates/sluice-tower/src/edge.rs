//! The edge guard in the layer: the core's [`EdgeGuard`] driven by tokio's clock, so a refused
//! identity and a flooding client are answered here, without a daemon call.
//!
//! The decisions are the core's (`sluice_core::edge`); this module names the keys (identity:
//! the domain and the sorted descriptors; client: the API key, else the IP), reads the clock
//! and turns a verdict into the 429 the client sees.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Response;
use sluice_core::Micros;
use sluice_core::edge::{EdgeGuard, EdgeVerdict};
use sluice_core::time::MILLI;
use sluice_proto::sluice::v1::{CheckResponse, Code, PolicyStatus, QuotaUnit};

pub use sluice_core::edge::{EdgeConfig, FloodLimit};

use crate::answer::{flood_refusal, too_many_requests};
use crate::config::ReleaseFor;

/// The edge guard's settings in a layer's [`Config`](crate::Config): refusal memory on, the
/// flood bucket off, by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeOptions {
    /// What the core guard holds (refusal memory, flood limit, capacity).
    pub guard: EdgeConfig,
    /// Rules whose refusals are never remembered besides concurrency rules (which the
    /// daemon's answer marks, `quota_unit`, and which are never remembered anyway: a release
    /// frees a slot before any retry time). The ids of [`ReleaseFor::Rules`] count too.
    pub never_remember: HashSet<String>,
}

impl EdgeOptions {
    /// Turns the flood bucket on at `factor` times a real client's figures (10 is a
    /// reasonable factor): `rate_per_s` and `burst` are those of the most generous rule.
    pub fn flood_above(&mut self, rate_per_s: u64, burst: u64, factor: u64) {
        self.guard.flood = Some(FloodLimit {
            rate_per_s: rate_per_s.saturating_mul(factor).max(1),
            burst: burst.saturating_mul(factor).max(1),
        });
    }
}

/// What the guard answered itself.
pub(crate) enum EdgeAnswer {
    /// A remembered refusal, repeated.
    Cached(Response<Bytes>),
    /// The client's flood bucket is empty.
    Flood(Response<Bytes>),
}

type Guard = EdgeGuard<String, String, Arc<CheckResponse>>;

/// The layer's guard: the core's state behind a lock, and the clock's origin.
pub(crate) struct Edge {
    guard: Mutex<Guard>,
    start: tokio::time::Instant,
    never_remember: HashSet<String>,
    flood: bool,
}

impl Edge {
    pub(crate) fn new(options: &EdgeOptions, release: &ReleaseFor) -> Edge {
        let mut never_remember = options.never_remember.clone();
        if let ReleaseFor::Rules(ids) = release {
            never_remember.extend(ids.iter().cloned());
        }
        Edge {
            guard: Mutex::new(EdgeGuard::new(options.guard.clone())),
            start: tokio::time::Instant::now(),
            never_remember,
            flood: options.guard.flood.is_some(),
        }
    }

    /// Micros since the layer was made, by tokio's clock (paused in tests).
    fn now(&self) -> Micros {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The request's identity: domain and descriptors, sorted, `\0`-separated (no descriptor
    /// holds a NUL: they come from header values and paths).
    pub(crate) fn identity(domain: &str, descriptors: &HashMap<String, String>) -> String {
        let mut sorted: Vec<(&str, &str)> = descriptors
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        sorted.sort_unstable();
        let len = domain.len()
            + sorted
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>();
        let mut id = String::with_capacity(len);
        id.push_str(domain);
        for (k, v) in sorted {
            id.push('\0');
            id.push_str(k);
            id.push('=');
            id.push_str(v);
        }
        id
    }

    /// The flood bucket's client: the API key, else the IP.
    fn client(descriptors: &HashMap<String, String>) -> Option<String> {
        if let Some(k) = descriptors.get("api_key") {
            Some(format!("k:{k}"))
        } else {
            descriptors.get("ip").map(|ip| format!("i:{ip}"))
        }
    }

    /// An answer of the guard's own, or `None` to ask the daemon.
    pub(crate) fn check(
        &self,
        identity: &String,
        descriptors: &HashMap<String, String>,
    ) -> Option<EdgeAnswer> {
        let now = self.now();
        // Named only when the flood bucket is on: it costs an allocation.
        let client = self.flood.then(|| Self::client(descriptors)).flatten();
        let verdict = match self.guard.lock() {
            Ok(mut g) => g.check(identity, client.as_ref(), now),
            Err(_) => return None,
        };
        match verdict {
            EdgeVerdict::Pass => None,
            EdgeVerdict::Refused { until, answer } => {
                // The daemon's refusal, its wait counted down to the remembered time.
                let mut resp = (*answer).clone();
                resp.retry_after_ms = (until - now).div_ceil(MILLI);
                Some(EdgeAnswer::Cached(too_many_requests(&resp)))
            }
            EdgeVerdict::Flood { retry_after } => Some(EdgeAnswer::Flood(flood_refusal(
                retry_after.div_ceil(MILLI),
            ))),
        }
    }

    /// Remembers the daemon's refusal of `identity`, unless it may end early: not a refusal
    /// (`UNAVAILABLE`), no wait, a concurrency rule among its violated policies (the answer
    /// says so: a slot frees when a request ends, not at the retry time), or a rule in
    /// `never_remember` among them.
    pub(crate) fn remember(&self, identity: String, resp: &CheckResponse) {
        if resp.allowed || resp.code != Code::OverLimit as i32 || resp.retry_after_ms == 0 {
            return;
        }
        let violated = |p: &&PolicyStatus| p.id == resp.decided_by || p.remaining == 0;
        if resp
            .policies
            .iter()
            .filter(violated)
            .any(|p| p.quota_unit == QuotaUnit::ConcurrentRequests as i32)
        {
            return;
        }
        let named = std::iter::once(resp.decided_by.as_str()).chain(
            resp.policies
                .iter()
                .filter(|p| p.remaining == 0)
                .map(|p| p.id.as_str()),
        );
        if named.clone().any(|id| self.never_remember.contains(id)) {
            return;
        }
        let now = self.now();
        let until = now.saturating_add(resp.retry_after_ms.saturating_mul(MILLI));
        if let Ok(mut g) = self.guard.lock() {
            g.remember_refusal(identity, until, now, Arc::new(resp.clone()));
        }
    }

    /// Whether anything is on: refusal memory or the flood bucket.
    pub(crate) fn enabled(options: &EdgeOptions) -> bool {
        options.guard.remember_refusals || options.guard.flood.is_some()
    }
}
