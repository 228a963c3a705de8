//! The shipper's counters, rendered in Prometheus text on the daemon's `/metrics`.
//!
//! Atomics, but for the lag per region: one short lock per received packet (never per
//! figure), beside the remote table's own write lock that packet takes anyway.

use crate::wire::Reject;
use sluice_core::merge::Merged;
use sluice_metrics::{self as prom, Counts, Kind};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (ms) of the lag histogram: from a packet's send time to its merge.
const LAG_BUCKETS_MS: [u64; 10] = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000];

/// Regions whose lag is kept apart; packets from further regions count only in the
/// all-regions histogram, so a flood of region names cannot grow the table.
const LAG_REGIONS: usize = 256;

/// A lag histogram: per-bucket counts over [`LAG_BUCKETS_MS`], so an operator (the console,
/// `/metrics`) reads how far behind each region's figures arrive, not only all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lag {
    per_bucket: [u64; LAG_BUCKETS_MS.len()],
    count: u64,
    sum_ms: u64,
}

impl Lag {
    fn observe(&mut self, ms: u64) {
        if let Some(i) = LAG_BUCKETS_MS.iter().position(|b| ms <= *b) {
            self.per_bucket[i] += 1;
        }
        self.count += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
    }

    /// Packets observed.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The bucket bound (ms) the `q`-quantile falls under: `None` with no packet, or when it
    /// lies past the last bound (5 s).
    pub fn quantile_ms(&self, q: f64) -> Option<u64> {
        let want = ((self.count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, n) in LAG_BUCKETS_MS.iter().zip(&self.per_bucket) {
            seen += n;
            if seen >= want {
                return Some(*b);
            }
        }
        None
    }
}

/// Outcomes of merging one received figure, as labels.
const RESULTS: [&str; 8] = [
    "new",
    "raised",
    "unchanged",
    "own_region",
    "expired",
    "rejected",
    "full",
    "unknown_rule",
];

fn merged_index(m: Merged) -> usize {
    match m {
        Merged::New => 0,
        Merged::Raised => 1,
        Merged::Unchanged => 2,
        Merged::OwnRegion => 3,
        Merged::Expired => 4,
        Merged::Rejected => 5,
        Merged::Full => 6,
    }
}

/// Where a counts datagram went: across regions (the WAN) or to a daemon of this region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// To a daemon of another region.
    CrossRegion,
    /// To a daemon of this region (collected to its sender, or fanned out by its receiver).
    InRegion,
}

impl Scope {
    const ALL: [Scope; 2] = [Scope::CrossRegion, Scope::InRegion];

    fn index(self) -> usize {
        self as usize
    }

    fn label(self) -> &'static str {
        match self {
            Scope::CrossRegion => "cross_region",
            Scope::InRegion => "in_region",
        }
    }
}

/// Counters of one gossip node.
#[derive(Debug, Default)]
pub struct GossipMetrics {
    frames_received: AtomicU64,
    bytes_received: AtomicU64,
    rejected: [AtomicU64; 6],
    packets_accepted: AtomicU64,
    figures_received: [AtomicU64; 8],
    figures_shipped: AtomicU64,
    figures_deferred: AtomicU64,
    figures_quiet: AtomicU64,
    figures_skipped: AtomicU64,
    packets_sent: AtomicU64,
    bytes_sent: AtomicU64,
    scope_packets: [AtomicU64; 2],
    scope_bytes: [AtomicU64; 2],
    figures_collected: AtomicU64,
    figures_forwarded: AtomicU64,
    packets_forwarded: AtomicU64,
    send_errors: AtomicU64,
    shipments: AtomicU64,
    membership_oversize: AtomicU64,
    relay_full: AtomicU64,
    key_changes: [AtomicU64; 2],
    sender_takeovers: AtomicU64,
    senders_passed_over: AtomicU64,
    senders_kept: AtomicU64,
    lag: [AtomicU64; LAG_BUCKETS_MS.len()],
    lag_count: AtomicU64,
    lag_sum_ms: AtomicU64,
    region_lag: Mutex<BTreeMap<String, Lag>>,
}

/// Figures a node holds and sees, sampled when rendering.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gauges {
    /// Keys in the remote table.
    pub remote_keys: u64,
    /// (region, key, window) slots in the remote table.
    pub remote_slots: u64,
    /// (key, window) figures this daemon tracks for shipping.
    pub local_figures: u64,
    /// Live members, this daemon included.
    pub live_nodes: u64,
    /// Regions with a live member, this one included.
    pub live_regions: u64,
    /// Whether this daemon ships its region's figures.
    pub shipping: bool,
    /// Whether this daemon is its region's sender and receiver (`region_sender`).
    pub region_sender: bool,
    /// Regions in the forwarding ring this daemon last planned with (0: point-to-point).
    pub forward_ring: u64,
    /// Shared keys held (0 without authentication, 2 during a rotation).
    pub keys: u64,
    /// Frames opened with a key other than the sealing one (a peer still seals with it).
    pub older_key_frames: u64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl GossipMetrics {
    pub(crate) fn key_change(&self, applied: bool) {
        add(&self.key_changes[usize::from(!applied)], 1);
    }

    pub(crate) fn sender_takeover(&self) {
        add(&self.sender_takeovers, 1);
    }

    pub(crate) fn sender_kept(&self) {
        add(&self.senders_kept, 1);
    }

    /// Times the election kept its region's sender after the membership dropped it.
    pub fn senders_kept(&self) -> u64 {
        self.senders_kept.load(Ordering::Relaxed)
    }

    pub(crate) fn sender_passed_over(&self) {
        add(&self.senders_passed_over, 1);
    }

    /// Times this daemon stopped counting on its region's sender because it heard nothing
    /// from it for the bound (it sends itself or collects to the next one).
    pub fn senders_passed_over(&self) -> u64 {
        self.senders_passed_over.load(Ordering::Relaxed)
    }

    /// Times this daemon became its region's sender while the membership still listed the
    /// one before it (which went silent).
    pub fn sender_takeovers(&self) -> u64 {
        self.sender_takeovers.load(Ordering::Relaxed)
    }

    pub(crate) fn frame_received(&self, bytes: usize) {
        add(&self.frames_received, 1);
        add(&self.bytes_received, bytes as u64);
    }

    /// Counts a dropped frame or packet.
    pub fn reject(&self, r: Reject) {
        add(&self.rejected[r.index()], 1);
    }

    pub(crate) fn packet_accepted(&self) {
        add(&self.packets_accepted, 1);
    }

    pub(crate) fn figure(&self, m: Merged) {
        add(&self.figures_received[merged_index(m)], 1);
    }

    pub(crate) fn unknown_rule(&self) {
        add(&self.figures_received[7], 1);
    }

    pub(crate) fn shipment(&self, shipped: usize, deferred: usize, quiet: usize, skipped: usize) {
        add(&self.shipments, 1);
        add(&self.figures_shipped, shipped as u64);
        add(&self.figures_deferred, deferred as u64);
        add(&self.figures_quiet, quiet as u64);
        add(&self.figures_skipped, skipped as u64);
    }

    pub(crate) fn sent(&self, bytes: usize, scope: Scope) {
        add(&self.packets_sent, 1);
        add(&self.bytes_sent, bytes as u64);
        add(&self.scope_packets[scope.index()], 1);
        add(&self.scope_bytes[scope.index()], bytes as u64);
    }

    pub(crate) fn collected(&self, figures: usize) {
        add(&self.figures_collected, figures as u64);
    }

    pub(crate) fn forwarded(&self, figures: usize, packets: usize) {
        add(&self.figures_forwarded, figures as u64);
        add(&self.packets_forwarded, packets as u64);
    }

    /// Other regions' figures this daemon forwarded to its peer regions (`gossip.fanout`),
    /// once per figure per peer, and the datagrams that carried them.
    pub fn forwarded_total(&self) -> (u64, u64) {
        (
            self.figures_forwarded.load(Ordering::Relaxed),
            self.packets_forwarded.load(Ordering::Relaxed),
        )
    }

    /// Key changes applied and refused so far.
    pub fn key_changes(&self) -> (u64, u64) {
        let [a, r] = &self.key_changes;
        (a.load(Ordering::Relaxed), r.load(Ordering::Relaxed))
    }

    /// Counts datagrams sent to `scope` so far.
    pub fn packets_sent(&self, scope: Scope) -> u64 {
        self.scope_packets[scope.index()].load(Ordering::Relaxed)
    }

    /// Bytes of counts datagrams sent to `scope` so far.
    pub fn bytes_sent(&self, scope: Scope) -> u64 {
        self.scope_bytes[scope.index()].load(Ordering::Relaxed)
    }

    /// Figures received from this region's daemons to ship across, so far.
    pub fn figures_collected(&self) -> u64 {
        self.figures_collected.load(Ordering::Relaxed)
    }

    pub(crate) fn send_error(&self) {
        add(&self.send_errors, 1);
    }

    pub(crate) fn membership_oversize(&self) {
        add(&self.membership_oversize, 1);
    }

    pub(crate) fn relay_full(&self) {
        add(&self.relay_full, 1);
    }

    /// One packet from `region` (its origin) merged `ms` after its last hop sent it.
    pub(crate) fn lag(&self, region: &str, ms: u64) {
        for (b, c) in LAG_BUCKETS_MS.iter().zip(&self.lag) {
            if ms <= *b {
                add(c, 1);
            }
        }
        add(&self.lag_count, 1);
        add(&self.lag_sum_ms, ms);
        let mut t = self.region_lag.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = t.get_mut(region) {
            l.observe(ms);
        } else if t.len() < LAG_REGIONS {
            t.entry(region.to_string()).or_default().observe(ms);
        }
    }

    /// The lag of packets from every region together.
    pub fn lag_all(&self) -> Lag {
        let cumulative = self.lag.each_ref().map(|c| c.load(Ordering::Relaxed));
        let mut l = Lag {
            count: self.lag_count.load(Ordering::Relaxed),
            sum_ms: self.lag_sum_ms.load(Ordering::Relaxed),
            ..Lag::default()
        };
        let mut below = 0;
        for (i, c) in cumulative.iter().enumerate() {
            l.per_bucket[i] = c.saturating_sub(below);
            below = below.max(*c);
        }
        l
    }

    /// The lag of packets by origin region (this one's own: its daemons' in-region hops).
    pub fn lag_by_region(&self) -> Vec<(String, Lag)> {
        let t = self.region_lag.lock().unwrap_or_else(|p| p.into_inner());
        t.iter().map(|(r, l)| (r.clone(), *l)).collect()
    }

    /// Frames dropped for `r` so far.
    pub fn rejected(&self, r: Reject) -> u64 {
        self.rejected[r.index()].load(Ordering::Relaxed)
    }

    /// Figures shipped so far (each counted once, whatever the number of receivers).
    pub fn shipped(&self) -> u64 {
        self.figures_shipped.load(Ordering::Relaxed)
    }

    /// Busy figures deferred so far.
    pub fn deferred(&self) -> u64 {
        self.figures_deferred.load(Ordering::Relaxed)
    }

    /// Received figures merged as new or raised slots.
    pub fn merged(&self) -> u64 {
        self.figures_received[0].load(Ordering::Relaxed)
            + self.figures_received[1].load(Ordering::Relaxed)
    }

    /// Prometheus text for every counter plus `g`.
    pub fn render(&self, out: &mut String, g: &Gauges) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        prom::counter(
            out,
            "sluice_gossip_figures_shipped_total",
            "Busy global figures this daemon shipped (once per figure, whatever the receivers).",
            load(&self.figures_shipped),
        );
        prom::counter(
            out,
            "sluice_gossip_figures_deferred_total",
            "Busy changed figures left for a later interval by the per-interval budget.",
            load(&self.figures_deferred),
        );
        prom::counter(
            out,
            "sluice_gossip_figures_quiet_total",
            "Changed figures not shipped because they are under the share threshold.",
            load(&self.figures_quiet),
        );
        prom::counter(
            out,
            "sluice_gossip_figures_skipped_total",
            "Figures that could not be packed (not a store key, or larger than a datagram).",
            load(&self.figures_skipped),
        );
        prom::counter(
            out,
            "sluice_gossip_shipments_total",
            "Intervals in which this daemon shipped figures.",
            load(&self.shipments),
        );
        prom::counter(
            out,
            "sluice_gossip_packets_sent_total",
            "Counts datagrams sent (one per packet per receiver).",
            load(&self.packets_sent),
        );
        prom::counter(
            out,
            "sluice_gossip_bytes_sent_total",
            "Bytes of counts datagrams sent.",
            load(&self.bytes_sent),
        );
        prom::counter(
            out,
            "sluice_gossip_send_errors_total",
            "Counts datagrams the socket refused.",
            load(&self.send_errors),
        );
        prom::counter(
            out,
            "sluice_gossip_frames_received_total",
            "Datagrams received on the gossip port (membership and counts, good or not).",
            load(&self.frames_received),
        );
        prom::counter(
            out,
            "sluice_gossip_bytes_received_total",
            "Bytes received on the gossip port.",
            load(&self.bytes_received),
        );
        prom::counter(
            out,
            "sluice_gossip_packets_accepted_total",
            "Counts packets authenticated, decoded and merged.",
            load(&self.packets_accepted),
        );
        prom::counter(
            out,
            "sluice_gossip_membership_oversize_total",
            "Membership messages too large to frame (hundreds of daemons).",
            load(&self.membership_oversize),
        );
        prom::counter(
            out,
            "sluice_gossip_relay_full_total",
            "Membership messages dropped because the relay table is at its bound.",
            load(&self.relay_full),
        );
        prom::counter(
            out,
            "sluice_gossip_sender_takeovers_total",
            "Times this daemon became its region's sender at once because the sender before it went silent (nothing heard from it for gossip.sender_stale_ms). Rising often: the sender flaps between daemons (raise gossip.sender_stale_ms).",
            load(&self.sender_takeovers),
        );
        prom::counter(
            out,
            "sluice_gossip_senders_passed_over_total",
            "Times this daemon stopped counting on its region's sender because it heard nothing from it for gossip.sender_stale_ms; until it is heard again the next daemon sends. Rising while the sender is up: its beacons arrive late (an overloaded host or a lossy network), and each time costs a duplicate shipment.",
            load(&self.senders_passed_over),
        );
        prom::counter(
            out,
            "sluice_gossip_senders_kept_total",
            "Times the membership dropped this region's sender while this daemon still heard it (or had just resumed from a stall of its own), and the election kept it rather than elect a second sender. Rising: the membership's failure detector drops live daemons (this host stalls, or gossip is lost).",
            load(&self.senders_kept),
        );
        let changes = "sluice_gossip_key_changes_total";
        prom::header(
            out,
            changes,
            "Replacements of the shared keys without a restart (key rotation steps), applied or refused.",
            Kind::Counter,
        );
        for (result, c) in ["applied", "refused"].iter().zip(&self.key_changes) {
            prom::sample(out, changes, &[("result", result)], load(c));
        }
        prom::counter(
            out,
            "sluice_gossip_frames_older_key_total",
            "Frames opened with a key other than the sealing one: while it rises, a peer still seals with the older key.",
            g.older_key_frames,
        );
        prom::gauge(
            out,
            "sluice_gossip_keys",
            "Shared keys held: 0 without authentication, 1, or 2 during a rotation.",
            g.keys,
        );
        let rejected = "sluice_gossip_frames_rejected_total";
        prom::header(
            out,
            rejected,
            "Frames and packets dropped, by reason.",
            Kind::Counter,
        );
        for r in Reject::ALL {
            let v = load(&self.rejected[r.index()]);
            prom::sample(out, rejected, &[("reason", r.label())], v);
        }
        let received = "sluice_gossip_figures_received_total";
        prom::header(
            out,
            received,
            "Received figures, by what merging them did.",
            Kind::Counter,
        );
        for (label, c) in RESULTS.iter().zip(&self.figures_received) {
            prom::sample(out, received, &[("result", label)], load(c));
        }
        let lag = "sluice_gossip_lag_seconds";
        prom::header(
            out,
            lag,
            "From a counts packet's send time (sender's clock) to its merge.",
            Kind::Histogram,
        );
        // `lag` counts each observation in every bucket at or above it.
        prom::Histogram {
            bounds: &LAG_BUCKETS_MS.map(|b| b as f64 / 1000.0),
            counts: Counts::Cumulative(&self.lag.each_ref().map(load)),
            count: load(&self.lag_count),
            sum: load(&self.lag_sum_ms) as f64 / 1000.0,
        }
        .write(out, lag, &[]);
        let by_region = "sluice_gossip_region_lag_seconds";
        prom::header(
            out,
            by_region,
            "sluice_gossip_lag_seconds by the packet's origin region.",
            Kind::Histogram,
        );
        for (region, l) in self.lag_by_region() {
            prom::Histogram {
                bounds: &LAG_BUCKETS_MS.map(|b| b as f64 / 1000.0),
                counts: Counts::PerBucket(&l.per_bucket),
                count: l.count,
                sum: l.sum_ms as f64 / 1000.0,
            }
            .write(out, by_region, &[("region", &region)]);
        }
        prom::gauge(
            out,
            "sluice_gossip_remote_keys",
            "Global keys with figures from other regions held by this daemon.",
            g.remote_keys,
        );
        prom::gauge(
            out,
            "sluice_gossip_remote_slots",
            "(region, key, window) figures held from other regions.",
            g.remote_slots,
        );
        prom::gauge(
            out,
            "sluice_gossip_local_figures",
            "(key, window) figures of this region tracked for shipping.",
            g.local_figures,
        );
        prom::gauge(
            out,
            "sluice_gossip_live_nodes",
            "Live gossip members, this daemon included.",
            g.live_nodes,
        );
        prom::gauge(
            out,
            "sluice_gossip_live_regions",
            "Regions with a live member, this one included.",
            g.live_regions,
        );
        prom::gauge(
            out,
            "sluice_gossip_shipping",
            "1 when this daemon ships its region's figures.",
            u64::from(g.shipping),
        );
        prom::gauge(
            out,
            "sluice_gossip_region_sender",
            "1 when this daemon is its region's sender and receiver (shippers: region_sender).",
            u64::from(g.region_sender),
        );
        prom::gauge(
            out,
            "sluice_gossip_forward_ring",
            "Regions in the forwarding ring this daemon plans with (gossip.fanout; 0: point-to-point).",
            g.forward_ring,
        );
        prom::counter(
            out,
            "sluice_gossip_figures_collected_total",
            "Figures received from this region's daemons to ship across (as its sender).",
            load(&self.figures_collected),
        );
        prom::counter(
            out,
            "sluice_gossip_figures_forwarded_total",
            "Other regions' figures forwarded to a peer region (gossip.fanout), per peer.",
            load(&self.figures_forwarded),
        );
        prom::counter(
            out,
            "sluice_gossip_packets_forwarded_total",
            "Datagrams that carried forwarded figures to peer regions.",
            load(&self.packets_forwarded),
        );
        for (name, help, c) in [
            (
                "sluice_gossip_scope_packets_sent_total",
                "Counts datagrams sent, across regions or inside this one.",
                &self.scope_packets,
            ),
            (
                "sluice_gossip_scope_bytes_sent_total",
                "Bytes of counts datagrams sent, across regions or inside this one.",
                &self.scope_bytes,
            ),
        ] {
            prom::header(out, name, help, Kind::Counter);
            for sc in Scope::ALL {
                prom::sample(out, name, &[("scope", sc.label())], load(&c[sc.index()]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series() {
        let m = GossipMetrics::default();
        m.reject(Reject::BadTag);
        m.figure(Merged::New);
        m.unknown_rule();
        m.lag("us", 30);
        m.shipment(5, 2, 1, 0);
        let mut out = String::new();
        m.render(
            &mut out,
            &Gauges {
                remote_keys: 3,
                shipping: true,
                ..Gauges::default()
            },
        );
        assert!(out.contains("sluice_gossip_frames_rejected_total{reason=\"bad_tag\"} 1"));
        assert!(out.contains("sluice_gossip_frames_rejected_total{reason=\"wrong_cluster\"} 0"));
        assert!(out.contains("sluice_gossip_figures_received_total{result=\"unknown_rule\"} 1"));
        assert!(out.contains("sluice_gossip_lag_seconds_bucket{le=\"0.025\"} 0"));
        assert!(out.contains("sluice_gossip_lag_seconds_bucket{le=\"0.05\"} 1"));
        assert!(
            out.contains("sluice_gossip_region_lag_seconds_bucket{region=\"us\",le=\"0.05\"} 1")
        );
        assert!(out.contains("sluice_gossip_figures_shipped_total 5"));
        assert!(out.contains("sluice_gossip_figures_deferred_total 2"));
        assert!(out.contains("sluice_gossip_remote_keys 3"));
        assert!(out.contains("sluice_gossip_shipping 1"));
        assert_eq!(m.merged(), 1);
    }

    /// The whole exposition, byte for byte (`testdata/metrics.prom`): what scrapers and
    /// dashboards were built on.
    #[test]
    fn renders_the_same_text() {
        let m = GossipMetrics::default();
        m.reject(Reject::BadTag);
        m.figure(Merged::New);
        m.unknown_rule();
        m.lag("us", 30);
        m.lag("us", 3);
        m.lag("ap", 7000);
        m.shipment(5, 2, 1, 0);
        m.sent(100, Scope::CrossRegion);
        let mut out = String::new();
        let g = Gauges {
            remote_keys: 3,
            shipping: true,
            live_nodes: 2,
            ..Gauges::default()
        };
        m.render(&mut out, &g);
        assert_eq!(out, include_str!("../testdata/metrics.prom"));
    }

    #[test]
    fn lag_is_kept_per_region_and_read_as_bucket_bounds() {
        let m = GossipMetrics::default();
        for _ in 0..60 {
            m.lag("us", 4);
        }
        for _ in 0..39 {
            m.lag("ap", 200);
        }
        m.lag("ap", 9000);
        let all = m.lag_all();
        assert_eq!(all.count(), 100);
        assert_eq!(all.quantile_ms(0.5), Some(5));
        assert_eq!(all.quantile_ms(0.99), Some(250));
        assert_eq!(all.quantile_ms(1.0), None, "past the last bound");
        let by: BTreeMap<String, Lag> = m.lag_by_region().into_iter().collect();
        assert_eq!(by["us"].count(), 60);
        assert_eq!(by["us"].quantile_ms(0.99), Some(5));
        assert_eq!(by["ap"].quantile_ms(0.5), Some(250));
        assert_eq!(by["ap"].quantile_ms(1.0), None);
        assert_eq!(Lag::default().quantile_ms(0.5), None, "no packet");
    }

    #[test]
    fn the_region_table_is_bounded() {
        let m = GossipMetrics::default();
        for i in 0..LAG_REGIONS + 10 {
            m.lag(&format!("r{i}"), 1);
        }
        assert_eq!(m.lag_by_region().len(), LAG_REGIONS);
        assert_eq!(m.lag_all().count(), (LAG_REGIONS + 10) as u64);
    }
}
