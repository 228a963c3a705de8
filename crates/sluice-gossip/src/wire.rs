//! The bytes on the gossip port: frames, their authentication, and the counts payload.
//!
//! Every datagram a daemon sends or accepts on its gossip port is a *frame*
//! (`proto/sluice/v1/gossip.proto` documents the layout):
//!
//! ```text
//! "SLG"  kind:u8  flags:u8  cluster_len:u8  cluster_id  payload  [tag: 32 bytes]
//! ```
//!
//! The frame is the one place where untrusted bytes enter, so it checks, in this order and
//! before any payload is parsed: the magic and kind (else [`Reject::Malformed`]), the cluster
//! id ([`Reject::WrongCluster`]), and, when a shared key is configured, the presence
//! ([`Reject::Unauthenticated`]) and validity ([`Reject::BadTag`]) of an HMAC-SHA256 tag over
//! every byte before it. A host that does not hold the key can neither inject counts nor
//! forge membership. The tag is compared in constant time (`hmac`'s `verify_slice`).
//!
//! Without a key, frames are accepted untagged (and a tag, if present, is ignored): the
//! cluster id then only keeps two clusters on one network apart, it authenticates nothing.
//!
//! The payload of a counts frame is a [`CountsPacket`], hand-written here with prost's derive
//! so that no build step is needed; [`tests::field_numbers_match_the_proto`] holds it to the
//! `.proto` file.

use crate::keyring::KeyRing;
use sluice_core::relay::Hop;

/// The first bytes of every frame.
pub const MAGIC: &[u8; 3] = b"SLG";
/// Bytes of an HMAC-SHA256 tag.
pub const TAG_LEN: usize = 32;
/// The counts format this release writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The largest UDP payload over IPv4.
pub const MAX_DATAGRAM: usize = 65_507;
/// Shortest shared key accepted: 16 bytes (128 bits).
pub const MIN_KEY_LEN: usize = 16;

const FLAG_TAGGED: u8 = 1;
const HEADER_FIXED: usize = 6;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A chitchat message: membership and failure detection.
    Membership,
    /// A [`CountsPacket`].
    Counts,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Membership => b'M',
            Kind::Counts => b'C',
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        match c {
            b'M' => Some(Kind::Membership),
            b'C' => Some(Kind::Counts),
            _ => None,
        }
    }
}

/// Why a frame or packet was dropped. Every drop is counted by reason
/// (`sluice_gossip_frames_rejected_total{reason}`); none is an error to the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// Not a frame, a truncated one, or a payload that does not decode.
    #[error("malformed frame or payload")]
    Malformed,
    /// Sent by a member of another cluster.
    #[error("frame of another cluster")]
    WrongCluster,
    /// No tag, while this daemon requires one.
    #[error("untagged frame while a key is configured")]
    Unauthenticated,
    /// The tag does not verify under this daemon's key.
    #[error("tag does not verify")]
    BadTag,
    /// A counts format version this release does not read.
    #[error("unknown counts format version")]
    Version,
    /// The receive queue was full (the daemon is overloaded): dropped unread.
    #[error("receive queue full")]
    Overload,
}

impl Reject {
    /// Every reason, for rendering all metric series even at zero.
    pub const ALL: [Reject; 6] = [
        Reject::Malformed,
        Reject::WrongCluster,
        Reject::Unauthenticated,
        Reject::BadTag,
        Reject::Version,
        Reject::Overload,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reject::Malformed => "malformed",
            Reject::WrongCluster => "wrong_cluster",
            Reject::Unauthenticated => "unauthenticated",
            Reject::BadTag => "bad_tag",
            Reject::Version => "version",
            Reject::Overload => "overload",
        }
    }

    /// Index into per-reason counters.
    pub fn index(self) -> usize {
        match self {
            Reject::Malformed => 0,
            Reject::WrongCluster => 1,
            Reject::Unauthenticated => 2,
            Reject::BadTag => 3,
            Reject::Version => 4,
            Reject::Overload => 5,
        }
    }
}

/// Why a frame codec could not be built, or its keys not changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The cluster id must be 1 to 255 bytes.
    #[error("cluster id must be 1 to 255 bytes, got {0}")]
    ClusterId(usize),
    /// The key is too short to be a secret.
    #[error("gossip key must be at least {MIN_KEY_LEN} bytes, got {0}")]
    KeyTooShort(usize),
    /// A key ring holds one key, or two during a rotation.
    #[error("a gossip key file holds 1 or {MAX_KEYS} keys (one per line), got {0}", MAX_KEYS = crate::keyring::MAX_KEYS)]
    KeyCount(usize),
    /// Authentication is chosen at start: a running daemon cannot turn it on or off, since
    /// its peers would drop its frames (or it theirs) until they all restarted.
    #[error("gossip started without a key: a key can only be added with a restart")]
    Unkeyed,
}

/// Seals and opens frames for one cluster, with optional shared keys (several during a
/// rotation: [`FrameCodec::set_keys`]).
pub struct FrameCodec {
    cluster: Vec<u8>,
    key: Option<KeyRing>,
}

impl std::fmt::Debug for FrameCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("FrameCodec")
            .field("cluster", &String::from_utf8_lossy(&self.cluster))
            .field("keys", &self.key_count())
            .finish()
    }
}

impl FrameCodec {
    /// A codec for `cluster_id`, authenticating with `key` when given.
    pub fn new(cluster_id: &str, key: Option<&[u8]>) -> Result<FrameCodec, CodecError> {
        FrameCodec::with_keys(cluster_id, key.as_slice())
    }

    /// A codec for `cluster_id` with a key ring: the first key seals, every key opens. No
    /// keys: frames are not authenticated.
    pub fn with_keys(cluster_id: &str, keys: &[&[u8]]) -> Result<FrameCodec, CodecError> {
        if cluster_id.is_empty() || cluster_id.len() > 255 {
            return Err(CodecError::ClusterId(cluster_id.len()));
        }
        let key = match keys {
            [] => None,
            _ => Some(KeyRing::new(keys)?),
        };
        Ok(FrameCodec {
            cluster: cluster_id.as_bytes().to_vec(),
            key,
        })
    }

    /// Replaces the keys of a keyed codec, for a rotation without a restart; refused whole
    /// (the old keys stay) when a key is too short, there are none or too many, or the
    /// codec was built without a key.
    pub fn set_keys(&self, keys: &[&[u8]]) -> Result<(), CodecError> {
        match &self.key {
            None => Err(CodecError::Unkeyed),
            Some(ring) => ring.replace(keys),
        }
    }

    /// Frames opened with a key other than the sealing one so far: while it still rises,
    /// some peer seals with an older key, which must not be dropped yet.
    pub fn older_key_opens(&self) -> u64 {
        self.key.as_ref().map_or(0, KeyRing::older_key_opens)
    }

    /// Keys held: 0 without authentication, 2 during a rotation.
    pub fn key_count(&self) -> usize {
        self.key.as_ref().map_or(0, KeyRing::len)
    }

    /// Whether frames are authenticated.
    pub fn keyed(&self) -> bool {
        self.key.is_some()
    }

    /// Bytes a frame adds around its payload.
    pub fn overhead(&self) -> usize {
        HEADER_FIXED + self.cluster.len() + if self.key.is_some() { TAG_LEN } else { 0 }
    }

    /// Writes the frame of `payload` into `out` (cleared first).
    pub fn seal(&self, kind: Kind, payload: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.reserve(self.overhead() + payload.len());
        out.extend_from_slice(MAGIC);
        out.push(kind.code());
        out.push(if self.key.is_some() { FLAG_TAGGED } else { 0 });
        // The length was checked in `with_keys`.
        out.push(self.cluster.len() as u8);
        out.extend_from_slice(&self.cluster);
        out.extend_from_slice(payload);
        if let Some(ring) = &self.key {
            let tag = ring.tag(out);
            out.extend_from_slice(&tag);
        }
    }

    /// Checks a received frame (see the module docs for the order) and returns its kind and
    /// payload.
    pub fn open<'a>(&self, frame: &'a [u8]) -> Result<(Kind, &'a [u8]), Reject> {
        if frame.len() < HEADER_FIXED || &frame[..3] != MAGIC {
            return Err(Reject::Malformed);
        }
        let kind = Kind::from_code(frame[3]).ok_or(Reject::Malformed)?;
        let tagged = frame[4] & FLAG_TAGGED != 0;
        let cl = usize::from(frame[5]);
        let body_start = HEADER_FIXED + cl;
        let tag_len = if tagged { TAG_LEN } else { 0 };
        if cl == 0 || frame.len() < body_start + tag_len {
            return Err(Reject::Malformed);
        }
        if frame[HEADER_FIXED..body_start] != self.cluster[..] {
            return Err(Reject::WrongCluster);
        }
        let body_end = frame.len() - tag_len;
        if let Some(ring) = &self.key {
            if !tagged {
                return Err(Reject::Unauthenticated);
            }
            if !ring.verify(&frame[..body_end], &frame[body_end..]) {
                return Err(Reject::BadTag);
            }
        }
        Ok((kind, &frame[body_start..body_end]))
    }
}

/// Some of one region's busy global figures (see `gossip.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct CountsPacket {
    /// Format version ([`FORMAT_VERSION`]).
    #[prost(uint32, tag = "1")]
    pub version: u32,
    /// The sender's region.
    #[prost(string, tag = "2")]
    pub region: String,
    /// The sender's node id.
    #[prost(string, tag = "3")]
    pub sender: String,
    /// Per sender, +1 per packet.
    #[prost(uint64, tag = "4")]
    pub seq: u64,
    /// Sender's clock at sending, epoch ms.
    #[prost(uint64, tag = "5")]
    pub sent_ms: u64,
    /// Figures grouped by rule and window.
    #[prost(message, repeated, tag = "6")]
    pub rules: Vec<RuleFigures>,
    /// How the packet travels (see `gossip.proto` and [`route_of`]); 0 from older senders.
    #[prost(uint32, tag = "7")]
    pub route: u32,
}

/// The `route` value of a hop.
pub fn route_code(h: Hop) -> u32 {
    match h {
        Hop::Direct => 0,
        Hop::Collect => 1,
        Hop::Relay => 2,
        Hop::FanOut => 3,
        Hop::Forward => 4,
    }
}

/// The hop of a `route` value. A value this release does not know (a later one) is taken
/// as direct: merged, passed on to nobody, which can delay figures but never miscount them.
pub fn route_of(code: u32) -> Hop {
    match code {
        1 => Hop::Collect,
        2 => Hop::Relay,
        3 => Hop::FanOut,
        4 => Hop::Forward,
        _ => Hop::Direct,
    }
}

/// The figures of one rule in one window (see `gossip.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RuleFigures {
    /// Rule id.
    #[prost(string, tag = "1")]
    pub rule: String,
    /// Window start, epoch ms; 0 for cumulative figures (labelled per figure: `Figure`).
    #[prost(uint64, tag = "2")]
    pub window_start_ms: u64,
    /// Sorted by identity, front-coded.
    #[prost(message, repeated, tag = "3")]
    pub figures: Vec<Figure>,
    /// The rule's algorithm at the sender, as its store-key letter (see `gossip.proto`).
    #[prost(string, tag = "4")]
    pub kind: String,
}

/// One key's figure (see `gossip.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Figure {
    /// The identity minus the bytes shared with the previous one.
    #[prost(string, tag = "1")]
    pub suffix: String,
    /// The figure.
    #[prost(uint64, tag = "2")]
    pub count: u64,
    /// Bytes shared with the previous identity of the group.
    #[prost(uint32, tag = "3")]
    pub shared: u32,
    /// A token bucket's or GCRA's generation label: its key's birth, epoch ms (0: none).
    #[prost(uint64, tag = "4")]
    pub generation_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    fn codec(key: Option<&[u8]>) -> FrameCodec {
        FrameCodec::new("prod", key).expect("valid")
    }

    const KEY: &[u8] = b"0123456789abcdef0123";

    #[test]
    fn frames_round_trip_with_and_without_a_key() {
        for key in [None, Some(KEY)] {
            let c = codec(key);
            let mut f = Vec::new();
            c.seal(Kind::Counts, b"hello", &mut f);
            assert_eq!(f.len(), c.overhead() + 5);
            assert_eq!(c.open(&f), Ok((Kind::Counts, &b"hello"[..])));
            c.seal(Kind::Membership, b"", &mut f);
            assert_eq!(c.open(&f), Ok((Kind::Membership, &b""[..])));
        }
    }

    #[test]
    fn foreign_and_forged_frames_are_rejected_by_reason() {
        let keyed = codec(Some(KEY));
        let open = codec(None);
        let mut f = Vec::new();
        // Another cluster.
        FrameCodec::new("staging", Some(KEY))
            .expect("valid")
            .seal(Kind::Counts, b"x", &mut f);
        assert_eq!(keyed.open(&f), Err(Reject::WrongCluster));
        assert_eq!(open.open(&f), Err(Reject::WrongCluster));
        // No tag while one is required; a keyless daemon accepts it.
        open.seal(Kind::Counts, b"x", &mut f);
        assert_eq!(keyed.open(&f), Err(Reject::Unauthenticated));
        // Another key.
        FrameCodec::new("prod", Some(b"another key of 16+ bytes"))
            .expect("valid")
            .seal(Kind::Counts, b"x", &mut f);
        assert_eq!(keyed.open(&f), Err(Reject::BadTag));
        // A tampered payload.
        keyed.seal(Kind::Counts, b"count=5", &mut f);
        let at = keyed.overhead() - TAG_LEN + 6;
        f[at] = b'9';
        assert_eq!(keyed.open(&f), Err(Reject::BadTag));
        // A forged flag byte (claiming no tag) does not help: the tag is then missing.
        keyed.seal(Kind::Counts, b"x", &mut f);
        f[4] = 0;
        assert!(keyed.open(&f).is_err());
        // Garbage.
        for g in [
            &b""[..],
            b"SL",
            b"SLGC",
            b"SLGX\0\x04prod",
            b"SLGC\0\0",
            b"SLGC\x01\x04prod",
        ] {
            assert_eq!(keyed.open(g), Err(Reject::Malformed), "{g:?}");
        }
    }

    #[test]
    fn bad_configuration_is_refused() {
        assert_eq!(
            FrameCodec::new("", None).err(),
            Some(CodecError::ClusterId(0))
        );
        assert_eq!(
            FrameCodec::new("c", Some(b"short")).err(),
            Some(CodecError::KeyTooShort(5))
        );
        let dbg = format!("{:?}", codec(Some(KEY)));
        assert!(!dbg.contains("0123456789"), "{dbg}");
    }

    #[test]
    fn field_numbers_match_the_proto() {
        // Parse the schema and compare `name = number` of every field with what prost
        // writes: a field encoded with tag N starts with the byte (N << 3 | wire type).
        let proto = include_str!("../../../proto/sluice/v1/gossip.proto");
        let field = |msg: &str, name: &str| -> u8 {
            let body = proto
                .split(&format!("message {msg} {{"))
                .nth(1)
                .and_then(|b| b.split("\n}").next())
                .unwrap_or_else(|| panic!("message {msg} in gossip.proto"));
            let line = body
                .lines()
                .map(str::trim)
                .find(|l| !l.starts_with("//") && l.contains(&format!(" {name} = ")))
                .unwrap_or_else(|| panic!("{msg}.{name} in gossip.proto"));
            line.split('=')
                .nth(1)
                .and_then(|n| n.trim().trim_end_matches(';').parse().ok())
                .unwrap_or_else(|| panic!("field number in {line:?}"))
        };
        let first = |bytes: Vec<u8>| bytes[0] >> 3;
        let p = |f: fn(&mut CountsPacket)| {
            let mut m = CountsPacket::default();
            f(&mut m);
            first(m.encode_to_vec())
        };
        assert_eq!(p(|m| m.version = 1), field("CountsPacket", "version"));
        assert_eq!(
            p(|m| m.region = "r".into()),
            field("CountsPacket", "region")
        );
        assert_eq!(
            p(|m| m.sender = "s".into()),
            field("CountsPacket", "sender")
        );
        assert_eq!(p(|m| m.seq = 1), field("CountsPacket", "seq"));
        assert_eq!(p(|m| m.sent_ms = 1), field("CountsPacket", "sent_ms"));
        assert_eq!(
            p(|m| m.rules.push(RuleFigures::default())),
            field("CountsPacket", "rules")
        );
        assert_eq!(p(|m| m.route = 2), field("CountsPacket", "route"));
        let r = |f: fn(&mut RuleFigures)| {
            let mut m = RuleFigures::default();
            f(&mut m);
            first(m.encode_to_vec())
        };
        assert_eq!(r(|m| m.rule = "r".into()), field("RuleFigures", "rule"));
        assert_eq!(
            r(|m| m.window_start_ms = 1),
            field("RuleFigures", "window_start_ms")
        );
        assert_eq!(
            r(|m| m.figures.push(Figure::default())),
            field("RuleFigures", "figures")
        );
        assert_eq!(r(|m| m.kind = "t".into()), field("RuleFigures", "kind"));
        let g = |f: fn(&mut Figure)| {
            let mut m = Figure::default();
            f(&mut m);
            first(m.encode_to_vec())
        };
        assert_eq!(g(|m| m.suffix = "s".into()), field("Figure", "suffix"));
        assert_eq!(g(|m| m.count = 1), field("Figure", "count"));
        assert_eq!(g(|m| m.shared = 1), field("Figure", "shared"));
    }

    proptest! {
        /// Arbitrary bytes never panic the frame check, and are never accepted by a keyed
        /// codec unless they carry a valid tag (which random bytes do not).
        #[test]
        fn arbitrary_bytes_never_pass_a_keyed_codec(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let c = codec(Some(KEY));
            prop_assert!(c.open(&bytes).is_err());
            let _ = codec(None).open(&bytes);
            let _ = CountsPacket::decode(&bytes[..]);
        }

        /// Flipping any single bit of a sealed frame makes a keyed codec reject it.
        #[test]
        fn any_bit_flip_is_detected(payload in proptest::collection::vec(any::<u8>(), 0..64), bit in 0usize..1000) {
            let c = codec(Some(KEY));
            let mut f = Vec::new();
            c.seal(Kind::Counts, &payload, &mut f);
            let bit = bit % (f.len() * 8);
            f[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(c.open(&f).is_err());
        }
    }
}
