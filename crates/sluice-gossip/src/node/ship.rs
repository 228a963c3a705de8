//! The shipper's side of a node: electing this region's sender, and every
//! `ship_interval` selecting, packing and sending figures to the other regions (or to this
//! region's sender), with beacons and announcements so that silence is never taken for death.

use super::{Inner, Member, Shippers, members};
use crate::metrics::Scope;
use crate::pack::{self, Header};
use crate::relay;
use crate::wire::Kind;
use sluice_core::Micros;
use sluice_core::forward::Forwarder;
use sluice_core::liveness;
use sluice_core::relay as relay_core;
use sluice_core::relay::{Hop, shipment};
use sluice_core::ship::{Budget, ShipEntry};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::watch;

/// The live members as the sender election sees them: a sender silent past the bound, or
/// a remote member another daemon of its region relays for, is not electable (still a
/// destination otherwise; see [`liveness`]). `mono` is the monotonic clock's reading: a
/// silence is an interval on this daemon, which a stepped wall clock must not fake or hide.
fn electable(inner: &Inner, mono: Micros) -> Vec<Member> {
    let ship = inner.cfg.ship_interval.as_micros() as Micros;
    let stale = match inner.cfg.sender_stale_after {
        Some(d) => d.as_micros() as Micros,
        None => liveness::stale_after(ship),
    };
    let mut live = members(&inner.live.borrow());
    let mut watch = inner.watch.lock().unwrap_or_else(|p| p.into_inner());
    keep_sender(inner, &watch, &mut live, mono, stale);
    let mut ms = relay::core_members(&live);
    let passed = watch.electable(
        &mut ms,
        &inner.cfg.node_id,
        &inner.cfg.region,
        mono,
        stale,
        liveness::relayer_kept(ship),
    );
    drop(watch);
    if let Some(p) = passed {
        inner.metrics.sender_passed_over();
        tracing::info!(
            node = %inner.cfg.node_id,
            sender = %p.node_id,
            silent_ms = p.silent_for / 1000,
            "the region's sender went silent: passed over until it is heard again"
        );
    }
    let flags: Vec<bool> = ms.iter().map(|m| m.relays).collect();
    for (m, relays) in live.iter_mut().zip(flags) {
        m.relays = relays;
    }
    live
}

/// Puts the sender this daemon counts on back into `live` when the membership dropped it but
/// the watch has not passed it over ([`SenderWatch::kept`]), from this region's members as
/// last listed. Says so once per episode: each one is a second sender avoided, and a
/// membership that drops live daemons (stalls of this host, lost gossip) is worth knowing.
///
/// [`SenderWatch::kept`]: sluice_core::liveness::SenderWatch::kept
fn keep_sender(
    inner: &Inner,
    watch: &sluice_core::liveness::SenderWatch,
    live: &mut Vec<Member>,
    mono: Micros,
    stale: Micros,
) {
    let mut seen = inner.region_seen.lock().unwrap_or_else(|p| p.into_inner());
    let kept = watch
        .kept(&relay::core_members(live), mono, stale)
        .map(str::to_string);
    seen.listed
        .retain(|id, _| Some(id) == kept.as_ref() || live.iter().any(|m| &m.node_id == id));
    for m in live.iter().filter(|m| m.region == inner.cfg.region) {
        seen.listed.insert(m.node_id.clone(), m.clone());
    }
    let back = kept.as_ref().and_then(|id| seen.listed.get(id)).cloned();
    if let Some(m) = &back
        && seen.keeping.as_ref() != Some(&m.node_id)
    {
        inner.metrics.sender_kept();
        tracing::info!(
            node = %inner.cfg.node_id,
            sender = %m.node_id,
            "the membership dropped the region's sender, still heard: kept, not replaced"
        );
    }
    seen.keeping = back.as_ref().map(|m| m.node_id.clone());
    live.extend(back);
}

/// Whether the membership lists a relaying daemon of this region with a lower id than this
/// one's: this daemon sends in its place (it went silent), and other regions would not
/// elect this one without hearing from it.
fn successor(inner: &Inner) -> bool {
    members(&inner.live.borrow())
        .iter()
        .any(|m| m.relays && m.region == inner.cfg.region && m.node_id < inner.cfg.node_id)
}

/// Makes this region's sender heard by its other daemons when it sent them nothing for a
/// beacon period: an empty packet, so that they do not take its silence for death. The period
/// is measured on the monotonic clock (`mono`); `now`, the wall clock, stamps the packet.
async fn beacon(inner: &Inner, live: &[Member], now: Micros, mono: Micros) {
    let every = liveness::beacon_every(inner.cfg.ship_interval.as_micros() as Micros);
    if mono.saturating_sub(inner.in_region_at.load(Ordering::Relaxed)) < every {
        return;
    }
    let to = relay::fan_out(&inner.cfg.node_id, &inner.cfg.region, live);
    if to.is_empty() {
        return;
    }
    let payload = pack::announce(&header(inner, now), Hop::FanOut);
    let mut frame = Vec::new();
    inner.codec.seal(Kind::Counts, &payload, &mut frame);
    for addr in to {
        send_one(inner, &frame, addr, Scope::InRegion).await;
    }
}

pub(super) async fn ship_loop(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(inner.cfg.ship_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Between shipments, every eighth of an interval: the sender's beacon, and the check
    // that lets a successor ship at once when the sender went silent.
    let relaying = inner.cfg.shippers == Shippers::RegionSender;
    let mut watch = tokio::time::interval(if relaying {
        (inner.cfg.ship_interval / 8).max(Duration::from_millis(1))
    } else {
        Duration::from_secs(3600)
    });
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let early = tokio::select! {
            _ = tick.tick() => false,
            _ = watch.tick() => true,
            _ = stop.changed() => return,
        };
        let (now, mono) = (inner.cfg.clock.now(), inner.cfg.clock.monotonic());
        let (me, region) = (&inner.cfg.node_id, &inner.cfg.region);
        let live = match relaying {
            true => electable(&inner, mono),
            false => members(&inner.live.borrow()),
        };
        let routes = relaying.then(|| relay::routes(me, region, &live, inner.cfg.fanout));
        if early {
            let Some(r) = &routes else { continue };
            let was = inner.region_sender.load(Ordering::Relaxed);
            if r.sender && was {
                beacon(&inner, &live, now, mono).await;
            }
            // Between ticks only a takeover ships: this daemon was not the sender at the
            // last interval and now is (the sender before it went silent).
            if !r.sender || was {
                continue;
            }
            tick.reset();
        }
        inner
            .remote
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .sweep(now);
        let regions: BTreeSet<&str> = live.iter().map(|m| m.region.as_str()).collect();
        inner.regions.store(regions.len(), Ordering::Relaxed);
        if inner.cfg.fanout > 0
            && let Some(r) = &routes
        {
            let regions = live
                .iter()
                .map(|m| (m.node_id.clone(), m.region.clone()))
                .collect();
            let keep = Forwarder::keep_for(
                inner.cfg.budget.resend_after,
                inner.cfg.ship_interval.as_micros() as Micros,
            );
            inner.forwarding.set_routes(r.clone(), regions, now, keep);
        }
        let (ships, cross, collect_to) = match routes {
            Some(r) => {
                let was = inner.region_sender.swap(r.sender, Ordering::Relaxed);
                if r.sender && !was && successor(&inner) {
                    // Elected while the membership still lists a lower id: a takeover (at
                    // once between ticks, or at a tick that came first), not a start.
                    inner.metrics.sender_takeover();
                    tracing::info!(node = %me, %region, "the region's sender went silent: this daemon sends");
                }
                (true, r.cross, r.collect_to)
            }
            _ => {
                let (ships, to) = relay::targets(&inner.cfg, &live);
                (
                    ships,
                    to.into_iter().map(|a| (a, Hop::Direct)).collect(),
                    None,
                )
            }
        };
        inner.shipping.store(ships, Ordering::Relaxed);
        // What was gathered, within what the budget leaves beside `own` (the rest waits).
        let gather = |own: &[ShipEntry]| {
            let mut c = inner.collected.lock().unwrap_or_else(|p| p.into_inner());
            if c.is_empty() {
                return Vec::new();
            }
            let room =
                relay_core::gather_budget(collect_to.is_none(), own, inner.cfg.budget.max_bytes);
            c.take(now, inner.cfg.budget.resend_after, room)
        };
        if !ships || cross.is_empty() {
            // What was gathered goes: there is nobody to ship it to.
            let _ = inner
                .collected
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(now, inner.cfg.budget.resend_after, usize::MAX);
            // Nobody to tell: keep the figures dirty rather than mark them shipped, but drop
            // those whose windows ended (a selection with no room defers everything).
            let prune = Budget {
                max_bytes: 0,
                max_entries: 0,
                ..inner.cfg.budget
            };
            let _ = inner
                .usage
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .select(now, &prune);
            continue;
        }
        let batch = inner
            .usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .select(now, &inner.cfg.budget);
        let gathered = gather(&batch.entries);
        // Not the sender: this daemon's selection goes to the region's sender; figures
        // gathered here anyway (another daemon's view elected this one) are shipped across as
        // the sender would, never dropped. The split is the core's, the simulator's too.
        let peers = inner.cfg.shippers == Shippers::RegionSender
            && live.iter().any(|m| &m.region == region && &m.node_id != me);
        let s = shipment(collect_to.is_none(), peers, batch.entries, gathered);
        let own = match collect_to {
            Some(to) => send(&inner, &s.collect, &[(to, Hop::Collect)], now).await,
            None => (0, 0),
        };
        let across = send(&inner, &s.across, &cross, now).await;
        if relaying && collect_to.is_none() && s.across.is_empty() && successor(&inner) {
            // A sender that took over makes itself known across every interval, busy or
            // not: the other regions' membership still elects the one it replaced, and they
            // reach a region through the daemon that relays for it.
            announce_across(&inner, &cross, now).await;
        }
        forward_due(&inner, now).await;
        if s.record {
            inner
                .collected
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .shipped(&s.across, now);
        }
        let (figures, skipped) = (own.0 + across.0, own.1 + across.1);
        if figures > 0 || batch.deferred > 0 || batch.quiet > 0 {
            inner
                .metrics
                .shipment(figures, batch.deferred, batch.quiet, skipped);
        }
    }
}

/// This daemon's packet header at `now` (the sequence number is set per shipment).
fn header(inner: &Inner, now: Micros) -> Header<'_> {
    Header {
        region: &inner.cfg.region,
        sender: &inner.cfg.node_id,
        first_seq: inner.seq.fetch_add(1, Ordering::Relaxed),
        sent_ms: now / 1000,
    }
}

/// Sends what is due to the peer regions (`fanout` above 0): other origins' figures heard
/// here, along their trees ([`Forwarding::due`]).
pub(super) async fn forward_due(inner: &Inner, now: Micros) {
    if inner.cfg.fanout == 0 || !inner.forwarding.active() {
        return;
    }
    let max_payload = inner
        .cfg
        .max_datagram
        .saturating_sub(inner.codec.overhead());
    let me = (inner.cfg.region.as_str(), inner.cfg.node_id.as_str());
    let (due, figures) = inner.forwarding.due(
        me,
        now,
        inner.cfg.budget.resend_after,
        inner.cfg.budget.max_bytes,
        max_payload,
        &inner.seq,
    );
    if due.is_empty() {
        return;
    }
    inner.metrics.forwarded(figures, due.len());
    let mut frame = Vec::new();
    for (addr, payload) in due {
        inner.codec.seal(Kind::Counts, &payload, &mut frame);
        send_one(inner, &frame, addr, Scope::CrossRegion).await;
    }
}

/// An empty relayed packet to every other region's receiver.
async fn announce_across(inner: &Inner, cross: &[(SocketAddr, Hop)], now: Micros) {
    let payload = pack::announce(&header(inner, now), Hop::Relay);
    let mut frame = Vec::new();
    inner.codec.seal(Kind::Counts, &payload, &mut frame);
    for (addr, _) in cross.iter().filter(|(_, h)| *h == Hop::Relay) {
        send_one(inner, &frame, *addr, Scope::CrossRegion).await;
    }
}

/// Packs `entries` once per hop kind and sends each payload to every destination of that
/// kind. Returns (figures packed, figures skipped), counted once whatever the receivers.
async fn send(
    inner: &Inner,
    entries: &[ShipEntry],
    to: &[(SocketAddr, Hop)],
    now: Micros,
) -> (usize, usize) {
    if entries.is_empty() || to.is_empty() {
        return (0, 0);
    }
    let header = Header {
        region: &inner.cfg.region,
        sender: &inner.cfg.node_id,
        first_seq: 0,
        sent_ms: now / 1000,
    };
    let max_payload = inner
        .cfg
        .max_datagram
        .saturating_sub(inner.codec.overhead());
    let mut hops: Vec<Hop> = to.iter().map(|(_, h)| *h).collect();
    hops.sort_unstable_by_key(|h| *h as u8);
    hops.dedup();
    let (mut figures, mut skipped) = (0, 0);
    let mut frame = Vec::with_capacity(inner.cfg.max_datagram);
    let mut sent = 0usize;
    for (n, hop) in hops.into_iter().enumerate() {
        let first_seq = inner.seq.load(Ordering::Relaxed);
        let packed = pack::pack_hop(
            entries,
            &Header {
                first_seq,
                ..header.clone()
            },
            hop,
            max_payload,
        );
        inner
            .seq
            .fetch_add(packed.payloads.len() as u64, Ordering::Relaxed);
        if n == 0 {
            (figures, skipped) = (packed.figures, packed.skipped);
        }
        let scope = match hop {
            Hop::Collect | Hop::FanOut => Scope::InRegion,
            Hop::Direct | Hop::Relay | Hop::Forward => Scope::CrossRegion,
        };
        for payload in &packed.payloads {
            inner.codec.seal(Kind::Counts, payload, &mut frame);
            for (addr, _) in to.iter().filter(|(_, h)| *h == hop) {
                send_one(inner, &frame, *addr, scope).await;
                sent += 1;
                if sent.is_multiple_of(64) {
                    // Let receivers (and this daemon's other tasks) keep up with a burst.
                    tokio::task::yield_now().await;
                }
            }
        }
    }
    (figures, skipped)
}

pub(super) async fn send_one(inner: &Inner, frame: &[u8], addr: SocketAddr, scope: Scope) {
    match inner.socket.send_to(frame, addr).await {
        Ok(n) => {
            inner.metrics.sent(n, scope);
            if scope == Scope::InRegion {
                inner
                    .in_region_at
                    .store(inner.cfg.clock.monotonic(), Ordering::Relaxed);
            }
        }
        Err(e) => {
            inner.metrics.send_error();
            tracing::debug!(%addr, error = %e, "counts datagram not sent");
        }
    }
}
