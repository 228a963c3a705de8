//! The answer to `ShouldRateLimit` written straight to its wire bytes, the same bytes prost
//! writes for [`Outcome::response`] (a test holds every kind of answer to them).
//!
//! Building the message first cost a string per status (the policy's name), two per header
//! and a vector per list, all dropped again once encoded; with prost's own length passes over
//! the nested messages that was about 4,000 instructions of a memory-store decision's
//! 50,000 (callgrind, docs/benchmark.md). Here the statuses are read from the decisions and
//! each length is counted from the numbers it holds.

use super::EnvoyConfig;
use super::response::{Outcome, Shown, code, quota, seconds, shown};
use bytes::BufMut;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use sluice_core::decision::Decision;
use tonic::Status;

impl Outcome {
    /// Appends the encoded `RateLimitResponse` to `out`, or returns the gRPC status Envoy
    /// should see instead (as [`Outcome::response`] does).
    pub fn encode(&self, cfg: &EnvoyConfig, out: &mut impl BufMut) -> Result<(), Status> {
        let parts = self.parts(cfg)?;
        // Fields in tag order, defaults left out, as prost writes them.
        varint_field(1, parts.overall as i32 as u64, out);
        for d in &self.decisions {
            let s = StatusWire::of(d);
            message_key(2, s.len(), out);
            s.write(out);
        }
        for (k, v) in &parts.headers {
            message_key(3, bytes_len(1, k.len()) + bytes_len(2, v.len()), out);
            bytes_field(1, k.as_bytes(), out);
            bytes_field(2, v.as_bytes(), out);
        }
        bytes_field(5, parts.raw_body.as_bytes(), out);
        Ok(())
    }
}

/// A `DescriptorStatus`'s fields, as numbers and the policy's name.
struct StatusWire<'a> {
    code: u64,
    /// `current_limit`: requests per unit, the unit, the name.
    limit: Option<(u32, i32, &'a str)>,
    remaining: u32,
    /// `duration_until_reset.seconds`, when the status has one.
    reset: Option<i64>,
}

impl StatusWire<'_> {
    fn of(d: &Decision) -> StatusWire<'_> {
        let code = code(d) as i32 as u64;
        match shown(d) {
            Shown::Nothing => StatusWire {
                code,
                limit: None,
                remaining: 0,
                reset: None,
            },
            Shown::RetryOnly(p) => StatusWire {
                code,
                limit: None,
                remaining: 0,
                reset: Some(seconds(p.reset_s)),
            },
            Shown::Full(p) => {
                let (per_unit, unit) = quota(p);
                StatusWire {
                    code,
                    limit: Some((per_unit, unit as i32, &p.id)),
                    remaining: u32::try_from(p.remaining).unwrap_or(u32::MAX),
                    reset: Some(seconds(p.reset_s)),
                }
            }
        }
    }

    /// `RateLimit`'s length: requests_per_unit (1), unit (2), name (3).
    fn limit_len((per_unit, unit, name): (u32, i32, &str)) -> usize {
        varint_len(1, u64::from(per_unit)) + varint_len(2, unit as u64) + bytes_len(3, name.len())
    }

    /// `Duration`'s length: seconds (1); nanos are 0.
    fn reset_len(seconds: i64) -> usize {
        varint_len(1, seconds as u64)
    }

    fn len(&self) -> usize {
        varint_len(1, self.code)
            + self.limit.map_or(0, |l| message_len(2, Self::limit_len(l)))
            + varint_len(3, u64::from(self.remaining))
            + self.reset.map_or(0, |r| message_len(4, Self::reset_len(r)))
    }

    fn write(&self, out: &mut impl BufMut) {
        varint_field(1, self.code, out);
        if let Some(l @ (per_unit, unit, name)) = self.limit {
            message_key(2, Self::limit_len(l), out);
            varint_field(1, u64::from(per_unit), out);
            varint_field(2, unit as u64, out);
            bytes_field(3, name.as_bytes(), out);
        }
        varint_field(3, u64::from(self.remaining), out);
        if let Some(r) = self.reset {
            message_key(4, Self::reset_len(r), out);
            varint_field(1, r as u64, out);
        }
    }
}

/// A varint field's length; 0 for the default, which is not written.
fn varint_len(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(v)
    }
}

/// A string or bytes field's length; 0 when empty, which is not written.
fn bytes_len(tag: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(len as u64) + len
    }
}

/// A message field's length (written even when empty: it is present).
fn message_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn varint_field(tag: u32, v: u64, out: &mut impl BufMut) {
    if v != 0 {
        encode_key(tag, WireType::Varint, out);
        encode_varint(v, out);
    }
}

fn bytes_field(tag: u32, b: &[u8], out: &mut impl BufMut) {
    if !b.is_empty() {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(b.len() as u64, out);
        out.put_slice(b);
    }
}

fn message_key(tag: u32, len: usize, out: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::UnavailableAs;
    use prost::Message as _;
    use sluice_core::decision::{Code, HeaderSet, PolicyStatus, QuotaUnit, Via};
    use sluice_core::rules::HeaderMode;
    use std::sync::Arc;

    fn policy(id: &str, limit: u64, window_s: u64, remaining: u64, reset_s: u64) -> PolicyStatus {
        PolicyStatus {
            id: Arc::from(id),
            limit,
            window_s,
            remaining,
            reset_s,
            allowed: true,
            retry_after_ms: 0,
            headers: HeaderMode::Full,
            via: Via::Store,
            unit: QuotaUnit::Requests,
            title: None,
        }
    }

    fn decision(code: Code, policies: Vec<PolicyStatus>) -> Decision {
        let mut d = Decision::unlimited(7);
        d.code = code;
        d.policies = policies;
        d
    }

    /// Answers of every shape: no policy, one, several (the most restrictive shown), refused
    /// (the refusing one shown, `Retry-After`, a body), `retry_only`, undecidable, numbers
    /// at and past the wire's bounds, several descriptors.
    fn outcomes() -> Vec<Outcome> {
        let ok = decision(Code::Ok, vec![policy("per-user", 1000, 60, 999, 42)]);
        let two = decision(
            Code::Ok,
            vec![policy("a", 10, 1, 3, 1), policy("b", 100, 3600, 2, 1800)],
        );
        let mut refused = decision(
            Code::OverLimit,
            vec![policy("a", 10, 1, 3, 1), policy("b", 5, 60, 0, 30)],
        );
        refused.decided_by = Some(Arc::from("b"));
        refused.retry_after_ms = 2_500;
        refused.policies[1].allowed = false;
        let mut retry_only = decision(Code::OverLimit, vec![policy("otp", 1, 3600, 0, 900)]);
        retry_only.policies[0].headers = HeaderMode::RetryOnly;
        retry_only.policies[0].allowed = false;
        retry_only.decided_by = Some(Arc::from("otp"));
        retry_only.retry_after_ms = 900_000;
        let mut unavailable = decision(Code::Unavailable, vec![policy("strict", 5, 60, 5, 60)]);
        unavailable.decided_by = Some(Arc::from("strict"));
        unavailable.retry_after_ms = 1_000;
        let huge = decision(
            Code::Ok,
            vec![policy("big", u64::MAX, u64::MAX, u64::MAX, u64::MAX)],
        );
        let zero = decision(Code::Ok, vec![policy("", 0, 0, 0, 0)]);
        let none = decision(Code::Ok, vec![]);
        let one = |d: &Decision| Outcome {
            decisions: vec![d.clone()],
        };
        vec![
            one(&ok),
            one(&two),
            one(&refused),
            one(&retry_only),
            one(&unavailable),
            one(&huge),
            one(&zero),
            one(&none),
            Outcome {
                decisions: vec![ok.clone(), refused.clone(), retry_only.clone(), none],
            },
            Outcome { decisions: vec![] },
        ]
    }

    fn configs() -> Vec<EnvoyConfig> {
        let mut out = Vec::new();
        for header_set in [HeaderSet::All, HeaderSet::Ratelimit, HeaderSet::XRatelimit] {
            for response_headers in [true, false] {
                for raw_body in [true, false] {
                    for unavailable_as in [UnavailableAs::OverLimit, UnavailableAs::Error] {
                        out.push(EnvoyConfig {
                            response_headers,
                            header_set,
                            raw_body,
                            unavailable_as,
                        });
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_answer_is_the_bytes_prost_writes_for_the_message() {
        let mut compared = 0;
        for o in outcomes() {
            for cfg in configs() {
                let mut wire = Vec::new();
                match (o.response(&cfg), o.encode(&cfg, &mut wire)) {
                    (Ok(msg), Ok(())) => {
                        assert_eq!(wire, msg.encode_to_vec(), "{o:?} with {cfg:?}");
                        compared += 1;
                    }
                    (Err(a), Err(b)) => {
                        assert_eq!((a.code(), a.message()), (b.code(), b.message()));
                        assert!(wire.is_empty(), "nothing written for an error");
                    }
                    (a, b) => panic!("{o:?} with {cfg:?}: {a:?} against {b:?}"),
                }
            }
        }
        assert!(compared > 100, "{compared} answers compared");
    }
}
