//! The ways to ask a limiter: Sluice's own gRPC `Check`, Envoy's `ShouldRateLimit` (which
//! Limitador serves too, so one client measures both), and the HTTP JSON API; and a plain
//! HTTP `GET`, to measure what a gateway in front of an upstream adds (the same request to
//! the gateway and to the upstream directly).

use crate::h2grpc;
use crate::http1::Http1;
use anyhow::{Context as _, bail};
use sluice_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice_proto::envoy::service::ratelimit::v3 as rls;
use sluice_proto::sluice::v1 as pb;
use sluice_proto::sluice::v1::limiter_client::LimiterClient;
use std::net::SocketAddr;
use tonic::transport::{Channel, Endpoint};

/// Which API to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// `sluice.v1.Limiter/Check`.
    Grpc,
    /// `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
    Envoy,
    /// `POST /v1/limits:check`.
    Http,
    /// A plain `GET` of `--path` (a gateway or an upstream): 2xx allowed, 429 refused.
    Get,
}

impl Api {
    /// The name, for reports.
    pub fn name(self) -> &'static str {
        match self {
            Api::Grpc => "grpc",
            Api::Envoy => "envoy",
            Api::Http => "http",
            Api::Get => "get",
        }
    }
}

/// What every request carries besides its key.
#[derive(Clone, Debug)]
pub struct Shape {
    /// The API.
    pub api: Api,
    /// Server address.
    pub addr: SocketAddr,
    /// Domain (Envoy: domain; Limitador: namespace).
    pub domain: String,
    /// Descriptor holding the drawn key.
    pub key_name: String,
    /// Key values are this prefix and the key's index.
    pub key_prefix: String,
    /// Fixed descriptors sent with every request, after the key.
    pub extra: Vec<(String, String)>,
    /// Cost (Envoy: `hits_addend`).
    pub cost: u32,
    /// `get`: the request path.
    pub path: String,
    /// `get`: the header that carries the drawn key (none: no key is sent).
    pub key_header: Option<String>,
}

/// A limiter's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed.
    Allowed,
    /// Refused (over limit, or unavailable).
    Denied,
}

/// One worker's client.
pub enum Client {
    /// Sluice gRPC.
    Grpc(LimiterClient<Channel>),
    /// Envoy RLS, on the lean HTTP/2 client (`h2grpc`).
    Envoy(h2grpc::Conn),
    /// HTTP JSON, one keep-alive connection.
    Http(Box<Http1>),
    /// Plain `GET`, one keep-alive connection.
    Get(Box<Http1>),
}

/// One HTTP/2 connection of a gRPC API, shared by the workers given it.
#[derive(Clone)]
pub enum Link {
    /// tonic's channel (`sluice.v1`).
    Tonic(Channel),
    /// The lean client's connection (Envoy RLS).
    H2(h2grpc::Conn),
}

/// Opens `n` HTTP/2 connections for the gRPC APIs (workers share them round-robin).
pub async fn channels(api: Api, addr: SocketAddr, n: usize) -> anyhow::Result<Vec<Link>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(match api {
            Api::Envoy => Link::H2(h2grpc::Conn::connect(addr, SHOULD_RATE_LIMIT).await?),
            _ => Link::Tonic(
                Endpoint::from_shared(format!("http://{addr}"))?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .with_context(|| format!("connecting to {addr}"))?,
            ),
        });
    }
    Ok(out)
}

/// The one field of `RateLimitResponse` the generator reads. The others (statuses, headers)
/// are skipped on the wire rather than built and dropped: decoding the whole answer was an
/// eighth of the generator's CPU, which shares its core with Redis in the default layout.
#[derive(Clone, PartialEq, prost::Message)]
struct OverallCode {
    /// `RateLimitResponse.overall_code` (field 1).
    #[prost(int32, tag = "1")]
    overall_code: i32,
}

/// The Envoy RLS method.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

impl Client {
    /// A client for one worker; `link` is used by the gRPC APIs.
    pub fn new(shape: &Shape, link: Option<Link>) -> anyhow::Result<Client> {
        Ok(match (shape.api, link) {
            (Api::Grpc, Some(Link::Tonic(ch))) => Client::Grpc(LimiterClient::new(ch)),
            (Api::Envoy, Some(Link::H2(c))) => Client::Envoy(c),
            (Api::Http, _) => Client::Http(Box::new(Http1::new(shape.addr))),
            (Api::Get, _) => Client::Get(Box::new(Http1::new(shape.addr))),
            (api, _) => bail!("no connection of the right kind for {}", api.name()),
        })
    }

    /// Asks once for `key`.
    pub async fn call(&mut self, shape: &Shape, key: &str) -> anyhow::Result<Verdict> {
        match self {
            Client::Grpc(c) => {
                let mut descriptors: std::collections::HashMap<String, String> =
                    shape.extra.iter().cloned().collect();
                descriptors.insert(shape.key_name.clone(), key.to_string());
                let r = c
                    .check(pb::CheckRequest {
                        domain: shape.domain.clone(),
                        descriptors,
                        cost: Some(u64::from(shape.cost)),
                    })
                    .await?
                    .into_inner();
                Ok(if r.allowed {
                    Verdict::Allowed
                } else {
                    Verdict::Denied
                })
            }
            Client::Envoy(c) => {
                let req = envoy_request(shape, key);
                let bytes = c.unary(&req).await?;
                let r = <OverallCode as prost::Message>::decode(bytes)
                    .context("decoding RateLimitResponse")?;
                match rls::rate_limit_response::Code::try_from(r.overall_code) {
                    Ok(rls::rate_limit_response::Code::Ok) => Ok(Verdict::Allowed),
                    Ok(rls::rate_limit_response::Code::OverLimit) => Ok(Verdict::Denied),
                    _ => bail!(
                        "overall_code {} is neither OK nor OVER_LIMIT",
                        r.overall_code
                    ),
                }
            }
            Client::Http(c) => {
                let body = http_body(shape, key);
                let (status, body) = c.post_json("/v1/limits:check", body.as_bytes()).await?;
                if status != 200 {
                    bail!(
                        "HTTP {status}: {}",
                        String::from_utf8_lossy(&body[..body.len().min(200)])
                    );
                }
                let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
                if has(b"\"allowed\":true") {
                    Ok(Verdict::Allowed)
                } else if has(b"\"allowed\":false") {
                    Ok(Verdict::Denied)
                } else {
                    bail!("no \"allowed\" in the response body")
                }
            }
            Client::Get(c) => {
                let (status, body) = match &shape.key_header {
                    Some(h) => c.get(&shape.path, &[(h.as_str(), key)]).await?,
                    None => c.get(&shape.path, &[]).await?,
                };
                match status {
                    200..=299 => Ok(Verdict::Allowed),
                    429 => Ok(Verdict::Denied),
                    _ => bail!(
                        "HTTP {status}: {}",
                        String::from_utf8_lossy(&body[..body.len().min(200)])
                    ),
                }
            }
        }
    }
}

/// The Envoy RLS request for `key`: the key's descriptor entry first, then the fixed ones.
pub fn envoy_request(shape: &Shape, key: &str) -> rls::RateLimitRequest {
    let mut entries = Vec::with_capacity(1 + shape.extra.len());
    entries.push(Entry {
        key: shape.key_name.clone(),
        value: key.to_string(),
    });
    entries.extend(shape.extra.iter().map(|(k, v)| Entry {
        key: k.clone(),
        value: v.clone(),
    }));
    rls::RateLimitRequest {
        domain: shape.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries,
            ..Default::default()
        }],
        hits_addend: shape.cost,
    }
}

/// The JSON body of an HTTP check.
pub fn http_body(shape: &Shape, key: &str) -> String {
    let mut d = serde_json::Map::new();
    for (k, v) in &shape.extra {
        d.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    d.insert(
        shape.key_name.clone(),
        serde_json::Value::String(key.to_string()),
    );
    serde_json::json!({"domain": shape.domain, "descriptors": d, "cost": shape.cost}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overall_code_is_read_past_statuses_and_headers() {
        use prost::Message as _;
        use rls::rate_limit_response::{Code, DescriptorStatus};
        use sluice_proto::envoy::config::core::v3::HeaderValue;
        let full = rls::RateLimitResponse {
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit as i32,
                limit_remaining: 7,
                ..Default::default()
            }],
            response_headers_to_add: vec![HeaderValue {
                key: "X-RateLimit-Limit".into(),
                value: "10".into(),
                ..Default::default()
            }],
            overall_code: Code::OverLimit as i32,
            raw_body: b"{}".to_vec(),
            ..Default::default()
        };
        let read = OverallCode::decode(full.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(read.overall_code, Code::OverLimit as i32);
        // A truncated answer is an error, not a silent default.
        let bytes = full.encode_to_vec();
        assert!(OverallCode::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn http_bodies_escape_and_carry_every_descriptor() {
        let shape = Shape {
            api: Api::Http,
            addr: SocketAddr::from(([127, 0, 0, 1], 1)),
            domain: "d\"x".into(),
            key_name: "user".into(),
            key_prefix: "u".into(),
            extra: vec![("route".into(), "GET /".into())],
            cost: 2,
            path: "/".into(),
            key_header: None,
        };
        let v: serde_json::Value =
            serde_json::from_str(&http_body(&shape, "u1")).expect("valid JSON");
        assert_eq!(
            v,
            serde_json::json!({"domain": "d\"x", "descriptors": {"user": "u1", "route": "GET /"}, "cost": 2})
        );
    }
}
