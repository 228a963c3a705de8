//! The forwarding service under the layer: a request to the upstream and its response back,
//! bodies streamed both ways, hop-by-hop headers dropped, the peer appended to
//! `X-Forwarded-For`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::metrics::Metrics;

/// The body the proxy answers with: the upstream's, streamed, or its own 502.
pub type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Headers of one connection, never forwarded (RFC 9110 section 7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Drops the hop-by-hop headers, those the `Connection` header names first.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in &HOP_BY_HOP {
        headers.remove(n);
    }
    headers.remove(header::UPGRADE);
}

/// Appends `peer` to `X-Forwarded-For` (one header, comma-separated).
pub fn append_forwarded_for(headers: &mut HeaderMap, peer: SocketAddr) {
    let prior: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let ip = peer.ip().to_string();
    let value = if prior.is_empty() {
        ip
    } else {
        format!("{}, {ip}", prior.join(", "))
    };
    if let Ok(v) = HeaderValue::try_from(value) {
        headers.insert("x-forwarded-for", v);
    }
}

/// The upstream client and where it points; cloned per request.
#[derive(Clone)]
pub struct Proxy {
    client: Client<HttpConnector, Incoming>,
    upstream: http::uri::Authority,
    metrics: Arc<Metrics>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`, plain HTTP/1.1 with keep-alive).
    pub fn new(upstream: http::uri::Authority, metrics: Arc<Metrics>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Proxy {
            client: Client::builder(TokioExecutor::new()).build(connector),
            upstream,
            metrics,
        }
    }

    /// Forwards `req` (whose extensions hold the peer's [`SocketAddr`]); an upstream failure
    /// is a 502.
    pub async fn forward(
        self,
        mut req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let peer = req.extensions().get::<SocketAddr>().copied();
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        // An h2 request names its host in :authority; HTTP/1.1's upstream wants a Host.
        let authority = req.uri().authority().cloned();
        let uri = Uri::builder()
            .scheme("http")
            .authority(self.upstream.clone())
            .path_and_query(path)
            .build();
        let Ok(uri) = uri else {
            return Ok(plain_answer(StatusCode::BAD_REQUEST, "bad request target"));
        };
        *req.uri_mut() = uri;
        *req.version_mut() = http::Version::HTTP_11;
        let headers = req.headers_mut();
        remove_hop_by_hop(headers);
        if !headers.contains_key(header::HOST)
            && let Some(a) = authority
            && let Ok(v) = HeaderValue::try_from(a.as_str())
        {
            headers.insert(header::HOST, v);
        }
        if let Some(peer) = peer {
            append_forwarded_for(headers, peer);
        }
        match self.client.request(req).await {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                remove_hop_by_hop(&mut parts.headers);
                Ok(Response::from_parts(parts, body.boxed()))
            }
            Err(e) => {
                self.metrics.upstream_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "upstream call failed");
                Ok(plain_answer(
                    StatusCode::BAD_GATEWAY,
                    "the upstream did not answer",
                ))
            }
        }
    }
}

fn plain_answer(status: StatusCode, text: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp
}

impl tower_service::Service<Request<Incoming>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        // The pooled client takes any number of requests.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        Box::pin(self.clone().forward(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("x-kept", HeaderValue::from_static("1"));
        remove_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn the_peer_is_appended_to_forwarded_for() {
        let peer: SocketAddr = "10.0.0.9:5000".parse().expect("addr");
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, peer);
        assert_eq!(h["x-forwarded-for"], "10.0.0.9");
        h.append("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        append_forwarded_for(&mut h, peer);
        assert_eq!(h["x-forwarded-for"], "10.0.0.9, 1.2.3.4, 10.0.0.9");
    }
}
