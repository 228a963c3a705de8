//! The property the gossip decoder is held to, in one place.
//!
//! The `gossip_datagram` fuzz target (`fuzz/`, built apart with cargo fuzz) feeds random
//! bytes to [`check_datagram`], and `tests/fuzz_regressions.rs` replays the inputs it once
//! failed on (`fuzz/regressions/gossip_datagram/`) through the same function, so what the
//! fuzzer looked for and what the ordinary `cargo test` re-checks can never drift apart
//! (docs/fuzzing.md).

use crate::pack::{Header, Received, pack_hop, unpack};
use crate::wire::{FrameCodec, Kind, MAX_DATAGRAM};
use sluice_core::ship::ShipEntry;
use std::sync::LazyLock;

/// The cluster id of the check's codecs: fixed, so a committed input replays as it was found.
const CLUSTER_ID: &str = "fuzz";
/// The shared key of the check's keyed codec: fixed for the same reason.
const KEY: [u8; 32] = [7; 32];

static PLAIN: LazyLock<FrameCodec> =
    LazyLock::new(|| FrameCodec::new(CLUSTER_ID, None).expect("a fixed, valid cluster id"));
static KEYED: LazyLock<FrameCodec> = LazyLock::new(|| {
    FrameCodec::new(CLUSTER_ID, Some(&KEY)).expect("a fixed, valid cluster id and key")
});

/// Checks `data` both as a received datagram (framed, opened with and without a key) and as
/// a bare counts payload, and says how the decoder broke its promises, if it did:
///
/// - a keyed codec opens only frames it sealed itself (sealing what it opened gives back the
///   same bytes);
/// - any payload a keyed codec seals opens again to itself, as a counts frame;
/// - a payload that unpacks re-packs, as a daemon ships it, within the datagram budget, to the
///   same region, sender and figures, none skipped.
///
/// This is the property both the fuzz target and the regression replay hold the decoder to:
/// the target panics on the `Err`, the replay names the input that produced it.
pub fn check_datagram(data: &[u8]) -> Result<(), String> {
    if let Ok((_, payload)) = PLAIN.open(data) {
        check_payload(payload)?;
    }
    if let Ok((kind, payload)) = KEYED.open(data) {
        let mut again = Vec::new();
        KEYED.seal(kind, payload, &mut again);
        if again != data {
            return Err("a keyed codec opened a frame it did not seal".into());
        }
    }
    let mut sealed = Vec::new();
    KEYED.seal(Kind::Counts, data, &mut sealed);
    let opened = KEYED.open(&sealed);
    if opened != Ok((Kind::Counts, data)) {
        return Err(format!("a sealed frame does not open: {opened:?}"));
    }
    check_payload(data)
}

/// The re-pack half of [`check_datagram`], on one payload.
fn check_payload(payload: &[u8]) -> Result<(), String> {
    let Ok(u) = unpack(payload) else {
        return Ok(());
    };
    let entries: Vec<ShipEntry> = u
        .figures
        .iter()
        .filter_map(|f| {
            Some(ShipEntry {
                key: sluice_core::matching::store_key(&f.identity, &f.rule, f.kind?),
                window_start: f.window_start,
                count: f.count,
            })
        })
        .collect();
    let header = Header {
        region: &u.region,
        sender: &u.sender,
        first_seq: u.seq,
        sent_ms: u.sent_ms,
    };
    let max = MAX_DATAGRAM - KEYED.overhead();
    let packed = pack_hop(&entries, &header, u.hop, max);
    if packed.skipped != 0 {
        return Err(format!(
            "figures accepted from the wire cannot be shipped: {} skipped",
            packed.skipped
        ));
    }
    let mut again = Vec::new();
    for p in &packed.payloads {
        if p.len() > max {
            return Err(format!(
                "a packed payload of {} bytes is over the {max} budget",
                p.len()
            ));
        }
        let v = unpack(p).map_err(|r| format!("a packed payload does not unpack: {r:?}"))?;
        if (&v.region, &v.sender) != (&u.region, &u.sender) {
            return Err(format!(
                "re-packed as from {:?}/{:?}, received from {:?}/{:?}",
                v.region, v.sender, u.region, u.sender
            ));
        }
        again.extend(v.figures);
    }
    let want = sorted(u.figures.into_iter().filter(|f| f.kind.is_some()).collect());
    let again = sorted(again);
    if again != want {
        return Err(format!(
            "re-packed figures differ: {again:?}, received {want:?}"
        ));
    }
    Ok(())
}

/// Figures in a fixed order, the algorithm included: one figure received under two
/// algorithms re-packs in either order.
fn sorted(mut v: Vec<Received>) -> Vec<Received> {
    v.sort_by(|a, b| {
        (
            &a.rule,
            &a.identity,
            a.window_start,
            a.count,
            a.kind.map(sluice_core::keys::code),
        )
            .cmp(&(
                &b.rule,
                &b.identity,
                b.window_start,
                b.count,
                b.kind.map(sluice_core::keys::code),
            ))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_garbage_bytes_hold() {
        assert_eq!(check_datagram(b""), Ok(()));
        assert_eq!(check_datagram(b"SLG\xff\x00\x04fuzz"), Ok(()));
    }

    #[test]
    fn a_packet_a_daemon_ships_holds_bare_and_framed() {
        let entries: Vec<ShipEntry> = [
            sluice_core::algo::Kind::FixedWindow,
            sluice_core::algo::Kind::TokenBucket,
        ]
        .into_iter()
        .map(|kind| ShipEntry {
            key: sluice_core::matching::store_key("a", "r", kind),
            window_start: 60_000_000,
            count: 3,
        })
        .collect();
        let header = Header {
            region: "eu-west",
            sender: "eu-west-1",
            first_seq: 7,
            sent_ms: 1_700_000_000_000,
        };
        let packed = crate::pack::pack(&entries, &header, 1200);
        assert_eq!(packed.payloads.len(), 1);
        let payload = &packed.payloads[0];
        assert_eq!(unpack(payload).map(|u| u.figures.len()), Ok(2));
        assert_eq!(check_datagram(payload), Ok(()));
        let mut frame = Vec::new();
        PLAIN.seal(Kind::Counts, payload, &mut frame);
        assert_eq!(check_datagram(&frame), Ok(()));
    }

    #[test]
    fn a_frame_the_keyed_codec_sealed_holds() {
        let mut frame = Vec::new();
        KEYED.seal(Kind::Counts, b"not a packet", &mut frame);
        assert_eq!(check_datagram(&frame), Ok(()));
    }
}
