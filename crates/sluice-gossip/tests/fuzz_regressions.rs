//! Replays the gossip inputs that fuzzing found (fuzz/regressions/gossip_datagram/, see
//! docs/fuzzing.md) through the same property the fuzz target checks: a counts payload that
//! unpacks re-packs, as the daemon ships, to the same figures; a frame sealed opens to its
//! payload. Runs in the ordinary `cargo test`, without the fuzzer.

use sluice_core::ship::ShipEntry;
use sluice_gossip::pack::{Header, Received, pack, unpack};
use sluice_gossip::wire::{FrameCodec, Kind, MAX_DATAGRAM};
use std::path::PathBuf;

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.expect("a directory entry").path();
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.display().to_string(), bytes)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no regression inputs in {}", dir.display());
    out
}

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

/// The fuzz target's payload property; `Err` says how it failed.
fn repacks(payload: &[u8]) -> Result<(), String> {
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
    let packed = pack(&entries, &header, MAX_DATAGRAM - 64);
    if packed.skipped != 0 {
        return Err(format!(
            "{} figures accepted but not shippable",
            packed.skipped
        ));
    }
    let mut again = Vec::new();
    for p in &packed.payloads {
        again.extend(
            unpack(p)
                .map_err(|r| format!("re-packed payload refused: {r:?}"))?
                .figures,
        );
    }
    let want = sorted(u.figures.into_iter().filter(|f| f.kind.is_some()).collect());
    let again = sorted(again);
    if again != want {
        return Err(format!("re-packed {again:?}, received {want:?}"));
    }
    Ok(())
}

#[test]
fn committed_gossip_inputs_repack_to_equal_figures() {
    let codec = FrameCodec::new("fuzz", Some(&[7u8; 32])).expect("a codec");
    for (name, bytes) in inputs("gossip_datagram") {
        repacks(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut sealed = Vec::new();
        codec.seal(Kind::Counts, &bytes, &mut sealed);
        assert_eq!(
            codec.open(&sealed),
            Ok((Kind::Counts, &bytes[..])),
            "{name}"
        );
    }
}

/// Identities are escaped (`{` and `}` never appear in one), so a figure whose identity holds
/// a brace was forged: its store key would end the hash tag early and name another rule.
#[test]
fn identities_with_braces_are_refused() {
    for name in ["identity-with-tag-end", "identity-with-brace"] {
        let (_, bytes) = inputs("gossip_datagram")
            .into_iter()
            .find(|(n, _)| n.ends_with(name))
            .expect("committed input");
        assert_eq!(
            unpack(&bytes).map(|u| u.figures.len()),
            Err(sluice_gossip::wire::Reject::Malformed),
            "{name}"
        );
    }
}
