//! Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! on the gRPC port, so an Envoy fleet moves to Sluice by changing the address of its
//! `rate_limit_service` cluster (docs/envoy.md).
//!
//! # Mapping
//!
//! - Each Envoy descriptor (a list of entries) is one check through [`Engine::check`]: its
//!   entries become Sluice descriptors (a key that repeats within one descriptor becomes
//!   `key.2`, `key.3`, …), plus [`KEYS_DESCRIPTOR`] = the entry keys joined by `/`, which lets
//!   rules imported from an envoyproxy/ratelimit config apply only at their own depth, as they
//!   do there. Rules that do not name it ignore it.
//! - `hits_addend` is the cost; 0 (unset) means 1, as in Envoy. A descriptor's own
//!   `hits_addend` (newer Envoys) wins over the request's; 0 there is a peek that takes
//!   nothing. A descriptor with `is_negative_hits` asks for a refund, which Sluice's
//!   algorithms do not have: it is answered OK without counting (docs/envoy.md).
//! - One [`DescriptorStatus`] per descriptor, in order: `OVER_LIMIT` when that check refused;
//!   `current_limit`, `limit_remaining` and `duration_until_reset` from the refusing policy,
//!   or else from the most restrictive one; `overall_code` is `OVER_LIMIT` if any descriptor
//!   is. A policy with `headers: retry_only` never shows its numbers here either.
//! - A descriptor's `limit` override replaces the rules for that descriptor, as Envoy's own
//!   service does: the request is counted in a fixed window of one `unit` holding
//!   `requests_per_unit`, keyed by the domain and every entry (rule id `envoy-override-<unit>`).
//! - An unknown domain is allowed with no limit (envoyproxy/ratelimit does the same); an empty
//!   domain, no descriptors, or bad entries are `INVALID_ARGUMENT`.
//! - Envoy has no code for "could not decide". A fail-closed rule whose store failed answers,
//!   by default, `OVER_LIMIT` with `Retry-After: 1` and a 503 problem body, so the request is
//!   refused whatever Envoy's `failure_mode_deny` says; [`UnavailableAs::Error`] answers gRPC
//!   `UNAVAILABLE` instead and leaves the choice to `failure_mode_deny`.
//! - `response_headers_to_add` carries the core's headers ([`headers`]) for the whole request,
//!   and `raw_body` the problem body of a refusal; both can be switched off.
//!
//! # Layout
//!
//! - `service`: [`RateLimitService`], the gRPC method: one engine check per descriptor, a
//!   descriptor's `limit` override counted in its own window.
//! - `translate`: an Envoy descriptor's entries as Sluice descriptors; override units.
//! - `response`: the decisions as Envoy's answer ([`Outcome`]): statuses, overall code,
//!   headers and body.
//! - `wire`: that answer written straight to its protobuf bytes ([`Outcome::encode`]), as
//!   the gRPC port sends it.
//!
//! [`Engine::check`]: crate::engine::Engine::check
//! [`DescriptorStatus`]: sluice_proto::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus

mod response;
mod service;
mod translate;
mod wire;

pub use response::{Outcome, descriptor_status, rate_limit};
pub use service::RateLimitService;
pub use translate::{descriptors, override_unit};

use crate::engine::CheckError;
use serde::Deserialize;
use sluice_core::decision::HeaderSet;

/// The synthetic descriptor naming an Envoy descriptor's entry keys, in order, joined by `/`.
pub const KEYS_DESCRIPTOR: &str = "envoy.keys";

/// Most descriptors one Envoy request may carry (Envoy sends a handful per route).
pub const MAX_ENVOY_DESCRIPTORS: usize = 64;

/// How a decision the store could not make (a fail-closed rule, `UNAVAILABLE`) reaches Envoy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnavailableAs {
    /// `OVER_LIMIT` with `Retry-After: 1` and a 503 problem body: refused whatever Envoy's
    /// `failure_mode_deny` says, which is what a fail-closed rule asks for.
    #[default]
    OverLimit,
    /// gRPC status `UNAVAILABLE`: Envoy then applies its `failure_mode_deny` (default: allow).
    Error,
}

/// The `envoy:` section of the daemon config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvoyConfig {
    /// Send the core's rate limit headers in `response_headers_to_add`.
    pub response_headers: bool,
    /// Which of them: `all` (default), `ratelimit` (the IETF draft's pair) or `x_ratelimit`
    /// (the `X-RateLimit-*` trio that envoyproxy/ratelimit and Limitador send).
    pub header_set: HeaderSet,
    /// Send the problem body of a refusal in `raw_body`.
    pub raw_body: bool,
    /// How `UNAVAILABLE` decisions are answered.
    pub unavailable_as: UnavailableAs,
}

impl Default for EnvoyConfig {
    fn default() -> Self {
        EnvoyConfig {
            response_headers: true,
            header_set: HeaderSet::All,
            raw_body: true,
            unavailable_as: UnavailableAs::OverLimit,
        }
    }
}

/// Why a request was refused as input.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    /// The engine refused the descriptors.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// No descriptors.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// Too many descriptors.
    #[error("too many descriptors: {0} (at most {MAX_ENVOY_DESCRIPTORS})")]
    TooManyDescriptors(usize),
    /// A descriptor without entries.
    #[error("descriptor {0} has no entries")]
    NoEntries(usize),
    /// A `limit` override with an unknown unit.
    #[error("descriptor {index}: limit override has unknown unit {unit}")]
    BadUnit {
        /// Descriptor position.
        index: usize,
        /// The unit as sent.
        unit: i32,
    },
}
