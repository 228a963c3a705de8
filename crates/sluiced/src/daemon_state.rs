//! `GET /v1/daemon`: this daemon's own state in one JSON answer, for the operator console
//! (docs/console.md): its id, region, store and rules version, the store breaker of each
//! shard (what `sluice_breaker_*` exports), and gossip (membership by region, the figures
//! each other region shipped here and its busiest keys, the lag histogram's quantiles, the
//! shipping counters). On the admin listener behind the read token, beside the decision log.

use crate::engine::Engine;
use crate::regions::Regions;
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use sluice_core::breaker::BreakerState;
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
        .breaker_states()
        .iter()
        .map(|(shard, state, opened)| {
            json!({"shard": shard, "state": state_name(state), "opened_total": opened})
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
            json!({
                "region": region,
                "this_region": region == own,
                "daemons": daemons,
                "remote_slots": slots,
                "remote_keys": keys.len(),
                "busy_keys": busy.into_iter().map(|(key, figure)| json!({"key": key, "figure": figure})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut text = String::new();
    node.render_metrics(&mut text);
    json!({
        "live_nodes": g.live_nodes,
        "live_regions": g.live_regions,
        "shipping": g.shipping,
        "region_sender": g.region_sender,
        "local_figures": g.local_figures,
        "shipped_total": m.shipped(),
        "deferred_total": m.deferred(),
        "merged_total": m.merged(),
        "lag": lag_json(&text),
        "regions": regions,
    })
}

/// The lag histogram (`sluice_gossip_lag_seconds`, as the node renders it) as a count and
/// the bucket bounds its median and 99th percentile fall under, in ms (`null` past the last
/// bound).
fn lag_json(metrics: &str) -> Value {
    let mut buckets: Vec<(Option<f64>, u64)> = Vec::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("sluice_gossip_lag_seconds_bucket{le=\"") else {
            continue;
        };
        let Some((le, n)) = rest.split_once("\"} ") else {
            continue;
        };
        let Ok(n) = n.trim().parse::<u64>() else {
            continue;
        };
        buckets.push((le.parse::<f64>().ok().filter(|v| v.is_finite()), n));
    }
    let count = buckets.last().map_or(0, |b| b.1);
    let at = |q: f64| -> Value {
        let want = ((count as f64) * q).ceil() as u64;
        buckets
            .iter()
            .find(|(_, n)| *n >= want.max(1))
            .and_then(|(le, _)| *le)
            .map_or(Value::Null, |s| json!((s * 1000.0).round() as u64))
    };
    json!({"count": count, "p50_ms": at(0.5), "p99_ms": at(0.99)})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_quantiles_are_bucket_bounds() {
        let text = "sluice_gossip_lag_seconds_bucket{le=\"0.001\"} 0\n\
                    sluice_gossip_lag_seconds_bucket{le=\"0.005\"} 60\n\
                    sluice_gossip_lag_seconds_bucket{le=\"0.25\"} 99\n\
                    sluice_gossip_lag_seconds_bucket{le=\"5\"} 99\n\
                    sluice_gossip_lag_seconds_bucket{le=\"+Inf\"} 100\n\
                    sluice_gossip_lag_seconds_count 100\n";
        assert_eq!(
            lag_json(text),
            json!({"count": 100, "p50_ms": 5, "p99_ms": 250})
        );
        let none = "sluice_gossip_lag_seconds_bucket{le=\"0.001\"} 0\nsluice_gossip_lag_seconds_bucket{le=\"+Inf\"} 0\n";
        assert_eq!(
            lag_json(none),
            json!({"count": 0, "p50_ms": Value::Null, "p99_ms": Value::Null})
        );
        let slow = "sluice_gossip_lag_seconds_bucket{le=\"5\"} 0\nsluice_gossip_lag_seconds_bucket{le=\"+Inf\"} 2\n";
        assert_eq!(lag_json(slow)["p99_ms"], Value::Null, "past the last bound");
    }
}
