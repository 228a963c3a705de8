//! Replays the gossip inputs that fuzzing found (fuzz/regressions/gossip_datagram/, see
//! docs/fuzzing.md) through the same property the fuzz target checks,
//! [`sluice_gossip::wire_check::check_datagram`]: a counts payload that unpacks re-packs, as
//! the daemon ships, to the same figures; a frame sealed opens to its payload. Runs in the
//! ordinary `cargo test`, without the fuzzer.

use sluice_gossip::pack::unpack;
use sluice_gossip::wire_check::check_datagram;
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

#[test]
fn committed_gossip_inputs_repack_to_equal_figures() {
    for (name, bytes) in inputs("gossip_datagram") {
        check_datagram(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
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
