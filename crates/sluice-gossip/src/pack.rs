//! One interval's selection ([`sluice_core::ship::Batch`]) to datagram-sized
//! [`CountsPacket`]s, and back.
//!
//! Figures are grouped by `(rule, window)` and sorted by identity, and each identity is
//! front-coded against the previous one: the identities of one rule share long prefixes (the
//! domain, the key field names, often the start of the values), so a figure costs its distinct
//! tail and its count, typically 8–12 bytes instead of the 45–60 the full store key takes.
//! Every packet is self-contained (front coding restarts in each group of each packet), so a
//! lost datagram loses only its own figures.
//!
//! Sizes are computed exactly as prost encodes them, so a packet never exceeds its bound.
//! Decoding checks everything a sender could get wrong or forge (front-coding offsets, char
//! boundaries, lengths, window arithmetic, braces in identities) and refuses the whole packet on the first problem:
//! a packet is merged entirely or not at all.

use crate::wire::{
    CountsPacket, FORMAT_VERSION, Figure, Reject, RuleFigures, route_code, route_of,
};
use prost::Message;
use prost::encoding::encoded_len_varint;
use sluice_core::Micros;
use sluice_core::algo::Kind;
use sluice_core::keys;
use sluice_core::relay::Hop;
use sluice_core::ship::ShipEntry;

/// Longest identity accepted from the wire (descriptor values are bounded well below it).
pub const MAX_IDENTITY: usize = 4096;
/// Longest region name, sender id or rule id accepted from the wire.
pub const MAX_NAME: usize = 255;

/// The header every packet of one shipment carries.
#[derive(Clone, Debug)]
pub struct Header<'a> {
    /// Sender's region.
    pub region: &'a str,
    /// Sender's node id.
    pub sender: &'a str,
    /// Sequence number of the first packet; the next ones count up.
    pub first_seq: u64,
    /// Sending time, epoch ms.
    pub sent_ms: u64,
}

/// The encoded payloads of one shipment.
#[derive(Clone, Debug, Default)]
pub struct Packed {
    /// Protobuf payloads, each at most the requested size.
    pub payloads: Vec<Vec<u8>>,
    /// Figures packed.
    pub figures: usize,
    /// Entries left out: a key that is not a store key, or a figure too large for an empty
    /// packet (neither happens with keys the daemon makes).
    pub skipped: usize,
}

fn field_len(tag_and_len: usize) -> usize {
    1 + encoded_len_varint(tag_and_len as u64) + tag_and_len
}

fn varint_field(v: u64) -> usize {
    if v == 0 { 0 } else { 1 + encoded_len_varint(v) }
}

/// Bytes two strings share at the start, cut back to a char boundary.
fn shared_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}

struct Open {
    packet: CountsPacket,
    /// Encoded size of the packet without the open (last) group.
    closed: usize,
    /// Encoded size of the open group's contents (without its own tag and length).
    group_inner: usize,
    figures: usize,
}

impl Open {
    fn new(header: &Header<'_>, hop: Hop, seq: u64) -> Open {
        let packet = CountsPacket {
            version: FORMAT_VERSION,
            region: header.region.to_string(),
            sender: header.sender.to_string(),
            seq,
            sent_ms: header.sent_ms,
            rules: Vec::new(),
            route: route_code(hop),
        };
        let closed = packet.encoded_len();
        Open {
            packet,
            closed,
            group_inner: 0,
            figures: 0,
        }
    }

    /// Adds one figure if the packet stays within `max` bytes.
    fn try_add(
        &mut self,
        (rule, kind): (&str, Kind),
        start_ms: u64,
        identity: &str,
        prev: &str,
        (generation_ms, count): (u64, u64),
        max: usize,
    ) -> bool {
        let code = keys::code(kind);
        let same_group = self.packet.rules.last().is_some_and(|g| {
            g.rule == rule && g.window_start_ms == start_ms && g.kind.starts_with(code)
        });
        let shared = if same_group {
            shared_prefix(prev, identity)
        } else {
            0
        };
        let fig = Figure {
            suffix: identity[shared..].to_string(),
            count,
            shared: shared as u32,
            generation_ms,
        };
        let fig_field = field_len(fig.encoded_len());
        let (closed, inner) = if same_group {
            (self.closed, self.group_inner + fig_field)
        } else {
            let closed = match self.packet.rules.is_empty() {
                true => self.closed,
                false => self.closed + field_len(self.group_inner),
            };
            (
                closed,
                field_len(rule.len()) + field_len(1) + varint_field(start_ms) + fig_field,
            )
        };
        if closed + field_len(inner) > max {
            return false;
        }
        if !same_group {
            self.packet.rules.push(RuleFigures {
                rule: rule.to_string(),
                window_start_ms: start_ms,
                figures: Vec::new(),
                kind: code.to_string(),
            });
        }
        if let Some(g) = self.packet.rules.last_mut() {
            g.figures.push(fig);
        }
        self.closed = closed;
        self.group_inner = inner;
        self.figures += 1;
        true
    }
}

/// One entry to pack, in packing order: (rule, algorithm), the group's window (ms), the
/// identity, then (generation label in ms, figure).
type Item<'a> = ((&'a str, Kind), u64, &'a str, (u64, u64));

/// Packs `entries` into direct payloads of at most `max_payload` bytes each.
pub fn pack(entries: &[ShipEntry], header: &Header<'_>, max_payload: usize) -> Packed {
    pack_hop(entries, header, Hop::Direct, max_payload)
}

/// Packs `entries` into payloads of at most `max_payload` bytes each, marked with the hop
/// they travel ([`Hop`]: what their receiver does with them).
pub fn pack_hop(
    entries: &[ShipEntry],
    header: &Header<'_>,
    hop: Hop,
    max_payload: usize,
) -> Packed {
    let mut out = Packed::default();
    let mut items: Vec<Item<'_>> = Vec::with_capacity(entries.len());
    for e in entries {
        let Some(k) = keys::parse(&e.key) else {
            out.skipped += 1;
            continue;
        };
        // A bucket's label is its generation, one per key: it travels in the figure, so a
        // rule's bucket figures share one group (and a receiver before labels, which skips
        // the field, merges them as the unlabelled figures it knows).
        let ms = e.window_start / 1000;
        let (group_ms, generation_ms) = match k.kind {
            Kind::TokenBucket | Kind::Gcra => (0, ms),
            _ => (ms, 0),
        };
        items.push((
            (k.rule, k.kind),
            group_ms,
            k.identity,
            (generation_ms, e.count),
        ));
    }
    items.sort_unstable();
    let mut seq = header.first_seq;
    let mut cur = Open::new(header, hop, seq);
    let mut prev: &str = "";
    for (rule, start_ms, identity, count) in items {
        if !cur.try_add(rule, start_ms, identity, prev, count, max_payload) {
            if cur.figures == 0 {
                // Does not fit even an empty packet.
                out.skipped += 1;
                continue;
            }
            seq += 1;
            let full = std::mem::replace(&mut cur, Open::new(header, hop, seq));
            out.payloads.push(full.packet.encode_to_vec());
            if !cur.try_add(rule, start_ms, identity, "", count, max_payload) {
                out.skipped += 1;
                continue;
            }
        }
        out.figures += 1;
        prev = identity;
    }
    if cur.figures > 0 {
        out.payloads.push(cur.packet.encode_to_vec());
    }
    out
}

/// A packet without figures: a region's sender makes itself heard with it (in its region
/// when it had nothing to pass on, across when it had nothing to ship; see
/// `sluice_core::liveness`). Receivers merge nothing and pass nothing on.
pub fn announce(header: &Header<'_>, hop: Hop) -> Vec<u8> {
    Open::new(header, hop, header.first_seq)
        .packet
        .encode_to_vec()
}

/// One figure as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// Rule id.
    pub rule: String,
    /// The rule's algorithm at the sender (`None` from a sender that does not say).
    pub kind: Option<Kind>,
    /// The identity (the store key's hash tag).
    pub identity: String,
    /// Window start, epoch µs; for a cumulative figure its generation's label (0: none).
    pub window_start: Micros,
    /// The figure.
    pub count: u64,
}

/// A decoded, checked packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpacked {
    /// Sender's region.
    pub region: String,
    /// Sender's node id.
    pub sender: String,
    /// Sender's sequence number.
    pub seq: u64,
    /// Sending time, epoch ms.
    pub sent_ms: u64,
    /// How it travels.
    pub hop: Hop,
    /// The figures.
    pub figures: Vec<Received>,
}

fn name_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME
}

/// Decodes and checks a counts payload: the whole packet or nothing.
pub fn unpack(payload: &[u8]) -> Result<Unpacked, Reject> {
    let p = CountsPacket::decode(payload).map_err(|_| Reject::Malformed)?;
    if p.version != FORMAT_VERSION {
        return Err(Reject::Version);
    }
    if !name_ok(&p.region) || p.sender.len() > MAX_NAME {
        return Err(Reject::Malformed);
    }
    let mut figures = Vec::with_capacity(p.rules.iter().map(|g| g.figures.len()).sum());
    let mut identity = String::new();
    for g in p.rules {
        if !name_ok(&g.rule) {
            return Err(Reject::Malformed);
        }
        let kind = match g.kind.as_bytes() {
            [] => None,
            [c] => Some(keys::kind_of_code(*c).ok_or(Reject::Malformed)?),
            _ => return Err(Reject::Malformed),
        };
        let window_start = g
            .window_start_ms
            .checked_mul(1000)
            .ok_or(Reject::Malformed)?;
        identity.clear();
        for f in g.figures {
            let shared = f.shared as usize;
            if shared > identity.len() || !identity.is_char_boundary(shared) {
                return Err(Reject::Malformed);
            }
            // Identities are escaped and never hold a brace: one that does was forged, and
            // its store key would end the hash tag early and name another rule.
            if f.suffix.bytes().any(|b| b == b'{' || b == b'}') {
                return Err(Reject::Malformed);
            }
            identity.truncate(shared);
            identity.push_str(&f.suffix);
            if identity.len() > MAX_IDENTITY || identity.is_empty() {
                return Err(Reject::Malformed);
            }
            // A generation label belongs to a cumulative figure, whose group has no window.
            let window_start = match f.generation_ms {
                0 => window_start,
                _ if window_start != 0 => return Err(Reject::Malformed),
                ms => ms.checked_mul(1000).ok_or(Reject::Malformed)?,
            };
            figures.push(Received {
                rule: g.rule.clone(),
                kind,
                identity: identity.clone(),
                window_start,
                count: f.count,
            });
        }
    }
    Ok(Unpacked {
        region: p.region,
        sender: p.sender,
        seq: p.seq,
        sent_ms: p.sent_ms,
        hop: route_of(p.route),
        figures,
    })
}

/// The same packet marked for its next hop, for a receiver passing a relayed packet on in
/// its region: everything else, the origin region first, is kept. `None` if it does not
/// decode (it was checked by [`unpack`] before, so this does not happen).
pub fn relabel(payload: &[u8], hop: Hop) -> Option<Vec<u8>> {
    let mut p = CountsPacket::decode(payload).ok()?;
    p.route = route_code(hop);
    Some(p.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn entry(identity: &str, rule: &str, start_ms: u64, count: u64) -> ShipEntry {
        ShipEntry {
            key: sluice_core::matching::store_key(identity, rule, Kind::FixedWindow),
            window_start: start_ms * 1000,
            count,
        }
    }

    fn header() -> Header<'static> {
        Header {
            region: "eu-west",
            sender: "eu-west-1",
            first_seq: 7,
            sent_ms: 1_700_000_000_000,
        }
    }

    fn received(pk: &Packed) -> Vec<Received> {
        let mut all = Vec::new();
        for p in &pk.payloads {
            all.extend(unpack(p).expect("valid packet").figures);
        }
        all.sort_by(|a, b| {
            (&a.rule, &a.identity, a.window_start).cmp(&(&b.rule, &b.identity, b.window_start))
        });
        all
    }

    #[test]
    fn front_coding_makes_figures_small() {
        let entries: Vec<ShipEntry> = (0..1000)
            .map(|i| {
                entry(
                    &format!("public-api|api_key=k_{i:06}"),
                    "global-min",
                    1_700_000_040_000,
                    150 + i,
                )
            })
            .collect();
        let pk = pack(&entries, &header(), 1400);
        assert_eq!(pk.figures, 1000);
        assert_eq!(pk.skipped, 0);
        let bytes: usize = pk.payloads.iter().map(Vec::len).sum();
        assert!(bytes < 1000 * 12, "{bytes} bytes for 1000 figures");
        assert!(pk.payloads.iter().all(|p| p.len() <= 1400));
        let got = received(&pk);
        assert_eq!(got.len(), 1000);
        assert_eq!(got[0].identity, "public-api|api_key=k_000000");
        assert_eq!(got[999].count, 1149);
        assert_eq!(got[5].window_start, 1_700_000_040_000_000);
        // Sequence numbers count up from the first.
        let seqs: Vec<u64> = pk
            .payloads
            .iter()
            .map(|p| unpack(p).expect("valid").seq)
            .collect();
        assert_eq!(seqs, (7..7 + pk.payloads.len() as u64).collect::<Vec<_>>());
    }

    #[test]
    fn forged_front_coding_is_refused() {
        let mk = |figures: Vec<Figure>| {
            CountsPacket {
                version: FORMAT_VERSION,
                region: "r".into(),
                sender: "s".into(),
                seq: 1,
                sent_ms: 1,
                rules: vec![RuleFigures {
                    rule: "x".into(),
                    window_start_ms: 0,
                    figures,
                    kind: String::new(),
                }],
                route: 0,
            }
            .encode_to_vec()
        };
        let f = |s: &str, shared: u32| Figure {
            suffix: s.into(),
            count: 1,
            shared,
            generation_ms: 0,
        };
        assert!(unpack(&mk(vec![f("ab", 0), f("c", 1)])).is_ok());
        // Shares more than the previous identity has.
        assert_eq!(
            unpack(&mk(vec![f("ab", 0), f("c", 3)])),
            Err(Reject::Malformed)
        );
        // Splits a multi-byte char.
        assert_eq!(
            unpack(&mk(vec![f("é", 0), f("x", 1)])),
            Err(Reject::Malformed)
        );
        // An empty identity.
        assert_eq!(unpack(&mk(vec![f("", 0)])), Err(Reject::Malformed));
        // Window start overflowing microseconds.
        let mut p = CountsPacket::decode(&mk(vec![f("a", 0)])[..]).expect("decodes");
        p.rules[0].window_start_ms = u64::MAX;
        assert_eq!(unpack(&p.encode_to_vec()), Err(Reject::Malformed));
        // Unknown version, empty region.
        let mut p = CountsPacket::decode(&mk(vec![f("a", 0)])[..]).expect("decodes");
        p.version = 2;
        assert_eq!(unpack(&p.encode_to_vec()), Err(Reject::Version));
        p.version = 1;
        p.region.clear();
        assert_eq!(unpack(&p.encode_to_vec()), Err(Reject::Malformed));
        assert_eq!(unpack(b"\xff\xff\xff"), Err(Reject::Malformed));
        // An algorithm letter that names none, or more than one letter.
        for kind in ["x", "tt"] {
            let mut p = CountsPacket::decode(&mk(vec![f("a", 0)])[..]).expect("decodes");
            p.rules[0].kind = kind.into();
            assert_eq!(unpack(&p.encode_to_vec()), Err(Reject::Malformed), "{kind}");
        }
    }

    #[test]
    fn the_hop_travels_and_a_relabel_keeps_the_origin_and_the_size() {
        let entries: Vec<ShipEntry> = (0..300)
            .map(|i| entry(&format!("api|k={i}"), "g", 60_000, i))
            .collect();
        let pk = pack_hop(&entries, &header(), Hop::Relay, 1200);
        assert!(pk.payloads.len() > 1);
        for p in &pk.payloads {
            let u = unpack(p).expect("valid");
            assert_eq!(u.hop, Hop::Relay);
            let again = relabel(p, Hop::FanOut).expect("decodes");
            // Passed on inside the receiving region: still the sender's region and figures,
            // and no larger, so it fits the datagram it came in.
            assert_eq!(again.len(), p.len());
            let v = unpack(&again).expect("valid");
            assert_eq!(v.hop, Hop::FanOut);
            assert_eq!((v.region.as_str(), v.figures), ("eu-west", u.figures));
        }
        // What senders before the route field sent is direct.
        assert_eq!(
            unpack(&pack(&entries, &header(), 1200).payloads[0])
                .expect("valid")
                .hop,
            Hop::Direct
        );
        assert_eq!(route_of(99), Hop::Direct);
    }

    #[test]
    fn figures_carry_their_algorithm_and_group_by_it() {
        // One rule id under two algorithms (an edit shipping from two daemons): two groups.
        let entries = [
            ShipEntry {
                key: sluice_core::matching::store_key("a", "r", Kind::FixedWindow),
                window_start: 0,
                count: 3,
            },
            ShipEntry {
                key: sluice_core::matching::store_key("a", "r", Kind::TokenBucket),
                window_start: 0,
                count: 4,
            },
        ];
        let got = received(&pack(&entries, &header(), 1200));
        let kinds: Vec<_> = got.iter().map(|r| (r.kind, r.count)).collect();
        assert_eq!(
            kinds,
            vec![(Some(Kind::TokenBucket), 4), (Some(Kind::FixedWindow), 3)]
        );
    }

    #[test]
    fn a_bucket_figure_carries_its_generation_in_one_group_per_rule() {
        let bucket = |id: &str, gen_ms: u64, count| ShipEntry {
            key: sluice_core::matching::store_key(id, "b", Kind::TokenBucket),
            window_start: gen_ms * 1000,
            count,
        };
        let entries = [
            bucket("a", 1_700_000_000_123, 5),
            bucket("b", 1_700_000_050_456, 6),
            bucket("c", 0, 7),
        ];
        let pk = pack(&entries, &header(), 1200);
        let p = CountsPacket::decode(pk.payloads[0].as_slice()).expect("decodes");
        assert_eq!(
            p.rules.len(),
            1,
            "one group: the labels travel in the figures"
        );
        assert_eq!(p.rules[0].window_start_ms, 0);
        let got: Vec<_> = received(&pk)
            .into_iter()
            .map(|r| (r.identity, r.window_start, r.count))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".to_string(), 1_700_000_000_123_000, 5),
                ("b".to_string(), 1_700_000_050_456_000, 6),
                ("c".to_string(), 0, 7),
            ]
        );
        // A label in a group that has a window is forged.
        let mut p = p;
        p.rules[0].window_start_ms = 60_000;
        assert_eq!(unpack(&p.encode_to_vec()), Err(Reject::Malformed));
    }

    #[test]
    fn a_figure_too_large_for_any_packet_is_skipped() {
        let big = "x".repeat(2000);
        let pk = pack(
            &[entry(&big, "r", 0, 1), entry("small", "r", 0, 2)],
            &header(),
            500,
        );
        assert_eq!(pk.skipped, 1);
        assert_eq!(pk.figures, 1);
        assert_eq!(received(&pk)[0].identity, "small");
    }

    proptest! {
        /// Whatever the entries and the packet bound, every figure comes back exactly once
        /// (or is counted as skipped), and no packet exceeds the bound.
        #[test]
        fn pack_then_unpack_is_lossless(
            raw in proptest::collection::btree_map(
                ("[a-c]{1,2}", "[a-zé|=]{1,12}", 0u64..3),
                0u64..100_000,
                0..200,
            ),
            max in 80usize..2000,
        ) {
            let entries: Vec<ShipEntry> = raw
                .iter()
                .map(|((rule, id, w), c)| entry(id, rule, *w * 60_000, *c))
                .collect();
            let pk = pack(&entries, &header(), max);
            prop_assert!(pk.payloads.iter().all(|p| p.len() <= max));
            prop_assert_eq!(pk.figures + pk.skipped, entries.len());
            let got: BTreeSet<(String, String, u64, u64)> = received(&pk)
                .into_iter()
                .map(|r| (r.rule, r.identity, r.window_start / 60_000_000, r.count))
                .collect();
            prop_assert_eq!(got.len(), pk.figures);
            for ((rule, id, w), c) in &raw {
                let k = (rule.clone(), id.clone(), *w, *c);
                prop_assert!(got.contains(&k) || pk.skipped > 0);
            }
        }

        /// Truncated or corrupted payloads never panic the decoder.
        #[test]
        fn corrupted_payloads_never_panic(cut in 0usize..400, flip in 0usize..4000) {
            let entries: Vec<ShipEntry> = (0..40)
                .map(|i| entry(&format!("d|k=v{i}é"), "r", 60_000, i))
                .collect();
            let pk = pack(&entries, &header(), 600);
            for p in &pk.payloads {
                let mut q = p.clone();
                q.truncate(cut.min(q.len()));
                let _ = unpack(&q);
                let mut q = p.clone();
                let bit = flip % (q.len() * 8);
                q[bit / 8] ^= 1 << (bit % 8);
                let _ = unpack(&q);
            }
        }
    }
}
