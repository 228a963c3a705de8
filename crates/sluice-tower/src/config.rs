//! What the layer is told: the domain, how to name a request, and what to do without an answer.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use http::{Extensions, HeaderName};
use sluice_proto::sluice::v1::CheckResponse;

use crate::edge::EdgeOptions;
use crate::ip::Cidr;
use crate::route::Routes;

/// What the layer does when the limiter cannot answer (unreachable, past its deadline, or an
/// error status).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailureMode {
    /// Forward the request as if allowed, and count it: an outage of the limiter is not an
    /// outage of the API.
    #[default]
    Open,
    /// Answer 503 with `Retry-After: 1`: for APIs where an unchecked request costs more than a
    /// refused one.
    Closed,
}

/// Which allowed requests the layer sends a `Release` for when their response is done.
///
/// The daemon stamps every check with a `request_id`, concurrency rule or not, and says in
/// the answer's `release` whether the check took a slot (a shadow rule's too, which the
/// answer's `policies` leave out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReleaseFor {
    /// Those whose answer says a slot was taken (`release`): one call per request where no
    /// concurrency rule took a slot. A daemon older than the field never says so, and its
    /// slots are held to their `timeout`: use [`ReleaseFor::AnyRequestId`] with one.
    #[default]
    SlotTaken,
    /// Every allowed request with a `request_id`: never leaks a slot, whatever the rules or
    /// the daemon's version, at a second call per request.
    AnyRequestId,
    /// Only when the decision names one of these rules (the domain's concurrency rules): one
    /// call per request elsewhere. A concurrency rule missing from the set holds its slots to
    /// their `timeout`.
    Rules(HashSet<String>),
}

impl ReleaseFor {
    /// Whether an allowed answer with a `request_id` is released.
    pub fn wants(&self, answer: &CheckResponse) -> bool {
        match self {
            ReleaseFor::SlotTaken => answer.release,
            ReleaseFor::AnyRequestId => true,
            ReleaseFor::Rules(ids) => answer.policies.iter().any(|p| ids.contains(&p.id)),
        }
    }
}

/// Reads the connection's peer address from a request's extensions.
pub type PeerFn = fn(&Extensions) -> Option<IpAddr>;

/// The default [`PeerFn`]: a [`SocketAddr`] extension, as a server's accept loop inserts it.
/// axum's `ConnectInfo<SocketAddr>` needs its own function:
/// `|e| e.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())`.
pub fn socket_addr_extension(ext: &Extensions) -> Option<IpAddr> {
    ext.get::<SocketAddr>().map(|a| a.ip())
}

/// The layer's configuration: [`Config::new`] with the defaults, then the public fields.
#[derive(Debug, Clone)]
pub struct Config {
    /// The rules' domain every check names.
    pub domain: String,
    /// Path templates for the `route` descriptor (fallback `*` by default).
    pub routes: Routes,
    /// A header carrying the API key (`x-api-key`); read before `Authorization`.
    pub api_key_header: Option<HeaderName>,
    /// Whether `Authorization: Bearer <token>` gives the API key when the header above does
    /// not (default true).
    pub bearer_api_key: bool,
    /// A header carrying the client's tier. Set it only from a header the gateway itself
    /// writes after authentication: a client can send any tier it likes.
    pub tier_header: Option<HeaderName>,
    /// Proxies whose `X-Forwarded-For` is believed (empty: the peer is always the client).
    pub trusted_proxies: Vec<Cidr>,
    /// Where the peer address comes from (default [`socket_addr_extension`]).
    pub peer: PeerFn,
    /// What to do when the limiter cannot answer.
    pub failure: FailureMode,
    /// Which allowed requests are released when their response is done.
    pub release: ReleaseFor,
    /// The edge guard before each daemon call: refusals remembered until their retry time
    /// (on), a coarse flood bucket per client (off unless set).
    pub edge: EdgeOptions,
    /// The longest the layer holds a request a shaping rule (`leaky_queue`) admitted with a
    /// delay before forwarding it (default 5 s). Past it the layer answers 429 instead, with
    /// `Retry-After` the wait beyond the ceiling: a gateway's clients and timeouts are its
    /// own to protect, whatever a rule's `max_delay` says. The departure the daemon gave the
    /// request is spent unused either way.
    pub max_wait: std::time::Duration,
}

impl Config {
    /// A configuration for `domain`: no templates (every route `METHOD *`), API key from
    /// `Authorization: Bearer`, no tier, no trusted proxies, failing open, releasing the
    /// checks that took a slot, remembering refusals, no flood bucket, holding a shaped
    /// request at most 5 s.
    pub fn new(domain: impl Into<String>) -> Self {
        Config {
            domain: domain.into(),
            routes: Routes::fallback_only("*"),
            api_key_header: None,
            bearer_api_key: true,
            tier_header: None,
            trusted_proxies: Vec::new(),
            peer: socket_addr_extension,
            failure: FailureMode::Open,
            release: ReleaseFor::SlotTaken,
            edge: EdgeOptions::default(),
            max_wait: std::time::Duration::from_secs(5),
        }
    }
}
