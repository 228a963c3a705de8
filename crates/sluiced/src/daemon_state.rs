//! `GET /v1/daemon`: this daemon's own state in one JSON answer, for the operator console
//! (docs/console.md): its id, region, store and rules version, the store breaker of each
//! shard (what `sluice_breaker_*` exports), and gossip (membership by region, the figures
//! each other region shipped here and its busiest keys, the lag's quantiles by origin region
//! and over all, the shipping counters). On the admin listener behind the read token, beside the decision log.

use crate::engine::Engine;
use crate::regions::Regions;
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use sluice_core::breaker::BreakerState;
use sluice_gossip::metrics::Lag;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Busiest keys listed per region.
const BUSY_KEYS: usize = 5;

/// What the route reads.
#[derive(Clone)]
struct DaemonState {
    engine: Arc<Engine>,
    regions: Option<Arc<Regions>>,
    daemon_id: String,
    region: String,
}

/// The route, for the admin listener (behind its tokens: see `control::spawn_admin`).
pub fn router(
    engine: Arc<Engine>,
    regions: Option<Arc<Regions>>,
    daemon_id: String,
    region: String,
) -> Router {
    let st = DaemonState {
        engine,
        regions,
        daemon_id,
        region,
    };
    Router::new()
        .route("/v1/daemon", get(daemon))
        .with_state(st)
}

/// A breaker state as the console names it (the metric's 0, 1, 2).
pub fn state_name(s: &BreakerState) -> &'static str {
    match s {
        BreakerState::Closed => "closed",
        BreakerState::HalfOpen { .. } => "half-open",
        BreakerState::Open { .. } => "open",
    }
}

async fn daemon(State(st): State<DaemonState>) -> Response {
    let breakers: Vec<Value> = st
        .engine
        .store_breakers()
        .iter()
        .map(|(store, shard, state, opened)| {
            json!({"store": store, "shard": shard, "state": state_name(state), "opened_total": opened})
        })
        .collect();
    let gossip = st.regions.as_ref().map(|r| gossip_json(r, &st.region));
    axum::Json(json!({
        "daemon_id": st.daemon_id,
        "region": st.region,
        "store": st.engine.store.kind(),
        "rules_version": st.engine.rules.version(),
        "breakers": breakers,
        "gossip": gossip,
    }))
    .into_response()
}

/// What this daemon holds of one region: its live daemons, the remote slots and each key's
/// highest figure.
#[derive(Default)]
struct RegionView {
    daemons: Vec<String>,
    slots: u64,
    keys: BTreeMap<String, u64>,
}

fn gossip_json(r: &Regions, own: &str) -> Value {
    let node = r.node();
    let g = node.gauges();
    let m = node.metrics();
    let mut by_region: BTreeMap<String, RegionView> = BTreeMap::new();
    for member in node.members() {
        by_region
            .entry(member.region)
            .or_default()
            .daemons
            .push(member.node_id);
    }
    by_region.entry(own.to_string()).or_default();
    let lags: BTreeMap<String, Lag> = m.lag_by_region().into_iter().collect();
    for (key, region, _window, figure) in node.remote_snapshot() {
        let e = by_region.entry(region).or_default();
        e.slots += 1;
        let f = e.keys.entry(key).or_default();
        *f = (*f).max(figure);
    }
    let regions: Vec<Value> = by_region
        .into_iter()
        .map(|(region, v)| {
            let RegionView {
                mut daemons,
                slots,
                keys,
            } = v;
            daemons.sort();
            let mut busy: Vec<(String, u64)> = keys.iter().map(|(k, f)| (k.clone(), *f)).collect();
            busy.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            busy.truncate(BUSY_KEYS);
            let lag = lags.get(&region).copied().unwrap_or_default();
            json!({
                "region": region,
                "this_region": region == own,
                "lag": lag_json(&lag),
                "daemons": daemons,
                "remote_slots": slots,
                "remote_keys": keys.len(),
                "busy_keys": busy.into_iter().map(|(key, figure)| json!({"key": key, "figure": figure})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "live_nodes": g.live_nodes,
        "live_regions": g.live_regions,
        "shipping": g.shipping,
        "region_sender": g.region_sender,
        "local_figures": g.local_figures,
        "shipped_total": m.shipped(),
        "deferred_total": m.deferred(),
        "merged_total": m.merged(),
        "lag": lag_json(&m.lag_all()),
        "regions": regions,
    })
}

/// A lag histogram as a count and the bucket bounds its median and 99th percentile fall
/// under, in ms (`null` with no packet or past the last bound).
fn lag_json(l: &Lag) -> Value {
    json!({"count": l.count(), "p50_ms": l.quantile_ms(0.5), "p99_ms": l.quantile_ms(0.99)})
}
