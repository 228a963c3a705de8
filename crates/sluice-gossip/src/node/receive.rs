//! The receiver's side of a node: check, decode and merge each counts datagram, pass a
//! relayed one on inside the region, and gather what this region's daemons sent here for
//! the next shipment across.

use super::ship::{forward_due, send_one};
use super::{Inner, members};
use crate::metrics::Scope;
use crate::pack;
use crate::relay;
use crate::transport::Inbound;
use crate::wire::Kind;
use sluice_core::relay::Hop;
use sluice_core::{Micros, Params};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

pub(super) async fn receive_loop(
    inner: Arc<Inner>,
    mut rx: mpsc::Receiver<Inbound>,
    mut stop: watch::Receiver<bool>,
) {
    // Where a relayed packet is passed on: this region's other daemons, recomputed when the
    // membership changes (not at the next interval: a daemon that just joined hears at once).
    let mut live = inner.live.clone();
    let mut fan_out: Vec<SocketAddr> = Vec::new();
    // This region's daemons by address: a datagram from one is a sign of life of it. One the
    // membership dropped stays while the election still remembers it (it may keep it as the
    // sender, `SenderWatch::kept`, and must hear it).
    let mut own: HashMap<SocketAddr, String> = HashMap::new();
    let mut frame = Vec::new();
    loop {
        let (from, payload) = tokio::select! {
            m = rx.recv() => match m {
                Some(m) => m,
                None => return,
            },
            _ = stop.changed() => return,
        };
        if live.has_changed().unwrap_or(false) || own.is_empty() {
            let ms = members(&live.borrow_and_update());
            fan_out = relay::fan_out(&inner.cfg.node_id, &inner.cfg.region, &ms);
            {
                let seen = inner.region_seen.lock().unwrap_or_else(|p| p.into_inner());
                own.retain(|_, id| seen.listed.contains_key(id));
            }
            own.extend(
                ms.into_iter()
                    .filter(|m| m.region == inner.cfg.region)
                    .map(|m| (m.addr, m.node_id)),
            );
        }
        // Wall time for what other daemons compare; signs of life on the monotonic clock.
        let (now, mono) = (inner.cfg.clock.now(), inner.cfg.clock.monotonic());
        if let Some(id) = own.get(&from) {
            inner
                .watch
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .heard(id, mono);
        }
        let Some(on) = merge_packet(&inner, from, &payload, now, mono) else {
            continue;
        };
        inner.codec.seal(Kind::Counts, &on, &mut frame);
        for addr in &fan_out {
            send_one(&inner, &frame, *addr, Scope::InRegion).await;
        }
        // Passed on to the peer regions at once: a hop costs its link delay, not an interval.
        forward_due(&inner, now).await;
    }
}

/// Checks, decodes and merges one counts payload (already authenticated by its frame), or
/// gathers it to ship across when a daemon of this region collected it here. Returns the
/// payload to pass on in this region when it was relayed here from another region. `now` is
/// the wall clock (windows, lag), `mono` the monotonic one (who relayed lately).
fn merge_packet(
    inner: &Inner,
    from: SocketAddr,
    payload: &[u8],
    now: Micros,
    mono: Micros,
) -> Option<Vec<u8>> {
    let m = &inner.metrics;
    let u = match pack::unpack(payload) {
        Ok(u) => u,
        Err(r) => {
            m.reject(r);
            tracing::debug!(%from, reason = r.label(), "counts packet dropped");
            return None;
        }
    };
    m.packet_accepted();
    if u.region == inner.cfg.region {
        if u.hop == Hop::Collect {
            collect(inner, u.figures);
            return None;
        }
        for _ in &u.figures {
            m.figure(sluice_core::merge::Merged::OwnRegion);
        }
        return None;
    }
    // Resolve rules once per (domain, rule, sub-count) in the packet, outside the table's
    // lock: a split rule's sub-counts each have their share of the numbers.
    let mut params: Vec<Params> = Vec::new();
    let mut cache: HashMap<(&str, &str, Option<u32>), Option<usize>> = HashMap::new();
    let mut resolved: Vec<(String, usize, Micros, u64)> = Vec::with_capacity(u.figures.len());
    for f in &u.figures {
        let domain = sluice_core::keys::escaped_domain(&f.identity);
        let part = sluice_core::keys::split_identity(&f.identity).1;
        let slot = *cache.entry((domain, &f.rule, part)).or_insert_with(|| {
            inner.lookup.global_params(&f.identity, &f.rule).map(|p| {
                params.push(p);
                params.len() - 1
            })
        });
        // A figure of another algorithm than this daemon's rule (an edit not yet live
        // everywhere) is never merged into it.
        let slot = slot.filter(|&i| f.kind.is_none_or(|k| k == params[i].kind()));
        match slot {
            Some(i) => resolved.push((
                sluice_core::matching::store_key(&f.identity, &f.rule, params[i].kind()),
                i,
                f.window_start,
                f.count,
            )),
            None => m.unknown_rule(),
        }
    }
    {
        let mut table = inner.remote.write().unwrap_or_else(|p| p.into_inner());
        for (key, i, start, count) in &resolved {
            let r = table.merge(&u.region, key, &params[*i], *start, *count, now);
            m.figure(r);
        }
    }
    m.lag(&u.region, (now / 1000).saturating_sub(u.sent_ms));
    let across = matches!(u.hop, Hop::Relay | Hop::Forward);
    if across && inner.cfg.fanout > 0 {
        let figures = resolved.iter().map(|(k, _, s, c)| (k.as_str(), *s, *c));
        let relayed = u.hop == Hop::Relay;
        let max = inner.cfg.max_remote_keys;
        inner
            .forwarding
            .heard(&u.region, &u.sender, relayed, figures, now, max);
    }
    if u.hop == Hop::Relay {
        inner
            .watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .relayed(&u.region, &u.sender, mono);
    }
    // Only the origin region's figures travel on (`region` is kept by the relabel), and only
    // once: a fanned-out packet is never passed on again, nor an empty one (a sender's
    // announcement).
    (across && !u.figures.is_empty())
        .then(|| pack::relabel(payload, Hop::FanOut))
        .flatten()
}

/// Keeps figures this region's daemons sent here for the next shipment across.
fn collect(inner: &Inner, figures: Vec<pack::Received>) {
    let m = &inner.metrics;
    let mut c = inner.collected.lock().unwrap_or_else(|p| p.into_inner());
    let mut kept = 0;
    for f in figures {
        // Daemons that collect always say the algorithm (older ones never collect).
        let Some(kind) = f.kind else {
            m.unknown_rule();
            continue;
        };
        let key = sluice_core::matching::store_key(&f.identity, &f.rule, kind);
        if c.add(key, f.window_start, f.count, inner.cfg.max_remote_keys) {
            kept += 1;
        } else {
            m.figure(sluice_core::merge::Merged::Full);
        }
    }
    m.collected(kept);
}
