//! The decisions of one Envoy request as Envoy's answer: one status per descriptor (the
//! refusing or most restrictive policy's numbers, in Envoy's units), the overall code, the
//! core's rate limit headers and the problem body of a refusal, or gRPC `UNAVAILABLE`.

use super::{EnvoyConfig, UnavailableAs};
use sluice_core::decision::{Code, Decision, PolicyStatus, headers_of, problem_json};
use sluice_proto::envoy::config::core::v3::HeaderValue;
use sluice_proto::envoy::service::ratelimit::v3 as rls;
use sluice_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as RlsCode, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use tonic::Status;

/// The decisions of one Envoy request, one per descriptor in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// One per descriptor.
    pub decisions: Vec<Decision>,
}

impl Outcome {
    /// The decision for the whole request, as if one check had seen every policy: refused if
    /// any descriptor was (the longest wait wins), `UNAVAILABLE` if one could not be decided,
    /// and the policies of all descriptors, each rule id once (its most restrictive status).
    pub fn combined(&self) -> std::borrow::Cow<'_, Decision> {
        if let [one] = self.decisions.as_slice() {
            return std::borrow::Cow::Borrowed(one);
        }
        let version = self
            .decisions
            .iter()
            .map(|d| d.rules_version)
            .max()
            .unwrap_or(0);
        let mut out = Decision::unlimited(version);
        let mut refused: Option<&Decision> = None;
        let mut unavailable: Option<&Decision> = None;
        for d in &self.decisions {
            match d.code {
                Code::OverLimit if refused.is_none_or(|r| d.retry_after_ms > r.retry_after_ms) => {
                    refused = Some(d)
                }
                Code::Unavailable if unavailable.is_none() => unavailable = Some(d),
                _ => {}
            }
            for p in &d.policies {
                match out.policies.iter_mut().find(|q| q.id == p.id) {
                    Some(q) if p.remaining < q.remaining => *q = p.clone(),
                    Some(_) => {}
                    None => out.policies.push(p.clone()),
                }
            }
            for s in &d.shadow_denied {
                if !out.shadow_denied.contains(s) {
                    out.shadow_denied.push(s.clone());
                }
            }
        }
        if let Some(d) = refused.or(unavailable) {
            out.code = d.code;
            out.retry_after_ms = d.retry_after_ms;
            out.decided_by = d.decided_by.clone();
        }
        std::borrow::Cow::Owned(out)
    }

    /// The wire response, or the gRPC status Envoy should see.
    pub fn response(&self, cfg: &EnvoyConfig) -> Result<rls::RateLimitResponse, Status> {
        let parts = self.parts(cfg)?;
        Ok(rls::RateLimitResponse {
            overall_code: parts.overall as i32,
            statuses: self.decisions.iter().map(descriptor_status).collect(),
            response_headers_to_add: parts
                .headers
                .into_iter()
                .map(|(k, v)| header(k, v))
                .collect(),
            request_headers_to_add: Vec::new(),
            raw_body: parts.raw_body.into_bytes(),
            dynamic_metadata: None,
            quota: None,
        })
    }

    /// What the answer carries besides its statuses (the overall code, the headers in order,
    /// the body), or the gRPC status Envoy should see instead.
    pub(super) fn parts(&self, cfg: &EnvoyConfig) -> Result<Parts, Status> {
        let all = self.combined();
        if all.code == Code::Unavailable && cfg.unavailable_as == UnavailableAs::Error {
            return Err(Status::unavailable(format!(
                "rule {} could not be decided: its store is unavailable and it fails closed",
                all.decided_by.as_deref().unwrap_or("?")
            )));
        }
        let overall = if all.code == Code::Ok {
            RlsCode::Ok
        } else {
            RlsCode::OverLimit
        };
        let mut headers = Vec::new();
        if cfg.response_headers {
            headers = headers_of(&all, cfg.header_set);
        }
        let mut raw_body = String::new();
        if cfg.raw_body && all.code != Code::Ok {
            raw_body = problem_json(&all);
            headers.push(("Content-Type", "application/problem+json".into()));
        }
        Ok(Parts {
            overall,
            headers,
            raw_body,
        })
    }
}

/// An answer's parts other than its statuses, as [`Outcome::parts`] gives them.
pub(super) struct Parts {
    /// `overall_code`.
    pub overall: RlsCode,
    /// `response_headers_to_add`, names and values in order.
    pub headers: Vec<(&'static str, String)>,
    /// `raw_body` (empty: none).
    pub raw_body: String,
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value,
        raw_value: Vec::new(),
    }
}

const UNITS: [(Unit, u64); 7] = [
    (Unit::Second, 1),
    (Unit::Minute, 60),
    (Unit::Hour, 3_600),
    (Unit::Day, 86_400),
    (Unit::Week, 7 * 86_400),
    (Unit::Month, 30 * 86_400),
    (Unit::Year, 365 * 86_400),
];

/// A policy as Envoy's `RateLimit`: the unit closest to its window (by ratio), and the
/// quota scaled to that unit (exact when the window is one unit; rounded, at least 1, else).
pub fn rate_limit(p: &PolicyStatus) -> RateLimit {
    let (requests_per_unit, unit) = quota(p);
    RateLimit {
        name: p.id.to_string(),
        requests_per_unit,
        unit: unit as i32,
    }
}

/// [`rate_limit`]'s numbers: the quota per unit, and the unit.
pub(super) fn quota(p: &PolicyStatus) -> (u32, Unit) {
    let w = p.window_s.max(1);
    let ratio = |u: u64| {
        let (a, b) = (w.max(u) as f64, w.min(u) as f64);
        a / b
    };
    let (unit, unit_s) = UNITS
        .iter()
        .copied()
        .min_by(|a, b| ratio(a.1).total_cmp(&ratio(b.1)))
        .unwrap_or((Unit::Second, 1));
    let scaled = if unit_s == w {
        p.limit
    } else {
        let v = (u128::from(p.limit) * u128::from(unit_s) + u128::from(w) / 2) / u128::from(w);
        (v as u64).max(u64::from(p.limit > 0))
    };
    (u32::try_from(scaled).unwrap_or(u32::MAX), unit)
}

/// Which policy's numbers a descriptor's status shows, and how much of them.
pub(super) enum Shown<'a> {
    /// None: the code alone.
    Nothing,
    /// `headers: retry_only`: the time to reset alone.
    RetryOnly(&'a PolicyStatus),
    /// Its limit, remaining and time to reset.
    Full(&'a PolicyStatus),
}

/// A descriptor's code in Envoy's terms.
pub(super) fn code(d: &Decision) -> RlsCode {
    if d.code == Code::Ok {
        RlsCode::Ok
    } else {
        RlsCode::OverLimit
    }
}

/// The refusing policy, or else the most restrictive one the client may see.
pub(super) fn shown(d: &Decision) -> Shown<'_> {
    let deciding = d
        .decided_by
        .as_ref()
        .and_then(|id| d.policies.iter().find(|p| p.id == *id));
    let shown = match deciding {
        Some(p) => Some(p),
        None => d
            .policies
            .iter()
            .filter(|p| p.figures_visible())
            .min_by(|a, b| {
                a.remaining.cmp(&b.remaining).then(
                    (u128::from(a.remaining) * u128::from(b.limit))
                        .cmp(&(u128::from(b.remaining) * u128::from(a.limit))),
                )
            }),
    };
    match shown {
        None => Shown::Nothing,
        Some(p) if !p.figures_visible() => Shown::RetryOnly(p),
        Some(p) => Shown::Full(p),
    }
}

/// The status of one descriptor: its code, and the numbers of the refusing policy or else
/// the most restrictive one the client may see.
pub fn descriptor_status(d: &Decision) -> DescriptorStatus {
    let code = code(d);
    match shown(d) {
        Shown::Nothing => DescriptorStatus {
            code: code as i32,
            ..Default::default()
        },
        Shown::RetryOnly(p) => DescriptorStatus {
            code: code as i32,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: Some(duration(p.reset_s)),
            quota: None,
        },
        Shown::Full(p) => DescriptorStatus {
            code: code as i32,
            current_limit: Some(rate_limit(p)),
            limit_remaining: u32::try_from(p.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(duration(p.reset_s)),
            quota: None,
        },
    }
}

fn duration(secs: u64) -> sluice_proto::prost_types::Duration {
    sluice_proto::prost_types::Duration {
        seconds: seconds(secs),
        nanos: 0,
    }
}

/// A time to reset as `Duration.seconds`.
pub(super) fn seconds(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::decision::{QuotaUnit, Via};
    use sluice_core::rules::HeaderMode;
    use std::sync::Arc;

    #[test]
    fn limits_are_reported_in_the_closest_unit() {
        let p = |limit, window_s| PolicyStatus {
            id: Arc::from("r"),
            limit,
            window_s,
            remaining: 0,
            reset_s: 0,
            allowed: true,
            retry_after_ms: 0,
            headers: HeaderMode::Full,
            via: Via::Store,
            unit: QuotaUnit::Requests,
            title: None,
        };
        let rl = |limit, w| {
            let r = rate_limit(&p(limit, w));
            (r.requests_per_unit, Unit::try_from(r.unit).expect("unit"))
        };
        assert_eq!(rl(10, 1), (10, Unit::Second));
        assert_eq!(rl(40, 2), (20, Unit::Second));
        assert_eq!(rl(1000, 3_600), (1000, Unit::Hour));
        assert_eq!(rl(10_000, 86_400), (10_000, Unit::Day));
        assert_eq!(rl(7, 7 * 86_400), (7, Unit::Week));
        assert_eq!(
            rl(1, 3_000),
            (1, Unit::Hour),
            "a small quota never rounds to 0"
        );
        assert_eq!(rl(u64::from(u32::MAX) * 2, 1), (u32::MAX, Unit::Second));
    }
}
