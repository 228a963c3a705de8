//! Golden reports: every shipped scenario's JSON report (its own seed, no `--set`) is
//! committed in `simulations/golden/NAME.json`, and these tests hold the simulator to it byte
//! for byte, so a change in the model shows as a diff in review instead of passing silently.
//!
//! After an intended change, regenerate and commit the diff:
//!
//! ```text
//! SLUICE_GOLDEN=update cargo test -p sluice-sim --test golden
//! SLUICE_GOLDEN=update cargo test --release -p sluice-sim --test golden -- --ignored
//! ```
//!
//! (the second for the scenarios in [`SLOW`]).

use sluice_sim::{load, report, run};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Too slow for the debug test suite (`scale`: 60 M requests, minutes even in release).
/// Their goldens are checked by the ignored `slow_scenarios_match_their_golden`, in release.
const SLOW: &[&str] = &["scale"];

/// The variable that turns a comparison into a rewrite.
const UPDATE: &str = "SLUICE_GOLDEN";

fn simulations() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../simulations")
}

fn golden_dir() -> PathBuf {
    simulations().join("golden")
}

/// The file stems in `dir` with extension `ext`, sorted.
fn stems(dir: &Path, ext: &str) -> Vec<String> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut names: Vec<String> = entries
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path()
        })
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .filter_map(|p| Some(p.file_stem()?.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

fn scenarios() -> Vec<String> {
    let names = stems(&simulations(), "toml");
    assert!(
        !names.is_empty(),
        "no scenarios in {}",
        simulations().display()
    );
    names
}

fn updating() -> bool {
    match std::env::var(UPDATE) {
        Ok(v) if v == "update" => true,
        Ok(v) => panic!("{UPDATE}={v}: the only value is `update`"),
        Err(_) => false,
    }
}

/// What `sluice-sim run simulations/NAME.toml --format json` prints.
fn report_json(name: &str) -> Result<String, String> {
    let path = simulations().join(format!("{name}.toml"));
    let sc = load(&path.to_string_lossy(), &[]).map_err(|e| format!("{name}: {e}"))?;
    let r = run(&sc, sc.seed, &mut |_| {});
    Ok(report::json(&r))
}

/// The first lines where `want` and `got` differ, line by line.
fn diff(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let mut out = String::new();
    let mut shown = 0;
    let mut differing = 0;
    for i in 0..w.len().max(g.len()) {
        let (a, b) = (w.get(i), g.get(i));
        if a == b {
            continue;
        }
        differing += 1;
        if shown < 6 {
            shown += 1;
            out.push_str(&format!(
                "  line {}:\n    - {}\n    + {}\n",
                i + 1,
                a.unwrap_or(&"(none)"),
                b.unwrap_or(&"(none)")
            ));
        }
    }
    if differing > shown {
        out.push_str(&format!(
            "  ... {} more differing lines\n",
            differing - shown
        ));
    }
    out
}

/// Compares `got` with `NAME.json`, or rewrites it when updating.
fn check(name: &str, got: &str) -> Result<(), String> {
    let file = golden_dir().join(format!("{name}.json"));
    let regen = format!(
        "regenerate with `{UPDATE}=update cargo test -p sluice-sim --test golden` \
         (see simulations/README.md) and commit the diff if the change is intended"
    );
    let want = match std::fs::read_to_string(&file) {
        Ok(want) => Some(want),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{name}: reading {}: {e}", file.display())),
    };
    if updating() {
        if want.as_deref() != Some(got) {
            std::fs::create_dir_all(golden_dir()).map_err(|e| format!("{name}: {e}"))?;
            std::fs::write(&file, got)
                .map_err(|e| format!("{name}: writing {}: {e}", file.display()))?;
            eprintln!("rewrote {}", file.display());
        }
        return Ok(());
    }
    match want {
        None => Err(format!(
            "{name}: no golden report simulations/golden/{name}.json; {regen}"
        )),
        Some(want) if want == got => Ok(()),
        Some(want) => Err(format!(
            "{name}: the report differs from simulations/golden/{name}.json (- golden, + now):\n{}{regen}",
            diff(&want, got)
        )),
    }
}

/// Runs and checks `names` on every core; the failures, all of them.
fn check_all(names: &[String]) -> Vec<String> {
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers.min(names.len()) {
            s.spawn(|| {
                while let Some(name) = names.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(e) = report_json(name).and_then(|got| check(name, &got)) {
                        failures.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    failures.sort();
    failures
}

#[test]
fn every_scenario_matches_its_golden() {
    let names: Vec<String> = scenarios()
        .into_iter()
        .filter(|n| !SLOW.contains(&n.as_str()))
        .collect();
    let failures = check_all(&names);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Run in release: `cargo test --release -p sluice-sim --test golden -- --ignored`.
#[test]
#[ignore = "minutes even in release; run with --release -- --ignored"]
fn slow_scenarios_match_their_golden() {
    let names: Vec<String> = SLOW.iter().map(|s| s.to_string()).collect();
    let failures = check_all(&names);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_scenario_has_a_golden_and_every_golden_a_scenario() {
    let scenarios = scenarios();
    for slow in SLOW {
        assert!(scenarios.iter().any(|n| n == slow), "{slow} is not shipped");
    }
    let goldens = stems(&golden_dir(), "json");
    let missing: Vec<&String> = scenarios.iter().filter(|n| !goldens.contains(n)).collect();
    let orphans: Vec<&String> = goldens.iter().filter(|n| !scenarios.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "no golden report for {missing:?} in simulations/golden/: run \
         `{UPDATE}=update cargo test -p sluice-sim --test golden` and commit it"
    );
    assert!(
        orphans.is_empty(),
        "golden reports without a scenario: {orphans:?}; delete them"
    );
}

/// The library path above is the binary's: its stdout is the golden file too.
#[test]
fn the_binary_prints_the_golden() {
    let name = "client-moves";
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-sim"))
        .arg("run")
        .arg(simulations().join(format!("{name}.toml")))
        .args(["--format", "json"])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).expect("UTF-8");
    if let Err(e) = check(name, &got) {
        panic!("{e}");
    }
}
