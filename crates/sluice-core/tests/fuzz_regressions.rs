//! Replays the rule files that fuzzing found (fuzz/regressions/rules_file/, see
//! docs/fuzzing.md) through the fuzz target's property: a file that parses round-trips
//! through its stored form, and every refusal names where and which field. Runs in the
//! ordinary `cargo test`, without the fuzzer.

use sluice_core::rules::{from_values, parse_yaml};
use std::path::PathBuf;

#[test]
fn committed_rule_files_round_trip_or_name_each_problem() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/rules_file");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("a directory entry").path();
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        n += 1;
        match parse_yaml(text) {
            Ok(set) => {
                let docs: Vec<_> = set.domains.values().map(|d| d.to_value()).collect();
                assert_eq!(
                    from_values(&docs, set.version).as_ref(),
                    Ok(&set),
                    "{}",
                    p.display()
                );
            }
            Err(e) => {
                for pr in &e.problems {
                    assert!(
                        !pr.at.is_empty() && !pr.field.is_empty() && !pr.message.is_empty(),
                        "{}: a problem that does not say where: {pr:?}",
                        p.display()
                    );
                }
            }
        }
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
}
