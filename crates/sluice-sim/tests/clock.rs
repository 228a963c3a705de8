//! A region's clock offset (`[clock]`) is the `now` its daemons decide on: windows open and
//! close by the region's clock, not the reference the run keeps.

use sluice_core::decision::Code;
use sluice_core::matching::Descriptors;
use sluice_core::time::SECOND;
use sluice_sim::engine::Sim;
use sluice_sim::parse;

/// One region, a 1-minute fixed window of 3; the clock's offset comes from `clock`.
fn scenario(clock: &str) -> sluice_sim::Scenario {
    let text = format!(
        r#"
name = "clock"
duration_s = 120
regions = ["us"]
{clock}
[[rules]]
id = "w"
key = ["api_key"]
algorithm = "fixed_window"
limit = 3
window = "1m"
[[traffic]]
rate_per_s = 0
"#
    );
    parse(&text, &[]).unwrap_or_else(|e| panic!("{e}"))
}

/// The codes of four requests at reference 20 s (filling the window), then one at 45 s and
/// one at 65 s.
fn codes(clock: &str) -> Vec<Code> {
    let sc = scenario(clock);
    let mut sim = Sim::new(&sc, 1);
    let d =
        Descriptors::new(vec![("api_key".into(), "k".into())]).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    for (i, t) in [20, 20, 20, 20, 45, 65].into_iter().enumerate() {
        let at = t * SECOND + i as u64;
        let decision = sim.decide(0, 0, at, &d, 1);
        out.push(decision.map_or(Code::Unavailable, |d| d.code));
    }
    out
}

#[test]
fn a_region_decides_on_its_own_clock() {
    use Code::{Ok, OverLimit};
    let on_time = codes("");
    assert_eq!(
        on_time,
        [Ok, Ok, Ok, OverLimit, OverLimit, Ok],
        "65 s is window 1"
    );
    // 20 s ahead: its clock reads 65 s at reference 45 s, the next window.
    let ahead = codes("[clock]\noffset_ms = [20000]");
    assert_eq!(ahead, [Ok, Ok, Ok, OverLimit, Ok, Ok]);
    // 10 s behind: its clock reads 55 s at reference 65 s, still window 0.
    let behind = codes("[clock]\noffset_ms = [-10000]");
    assert_eq!(behind, [Ok, Ok, Ok, OverLimit, OverLimit, OverLimit]);
}

/// `simulations/clock-skew.toml` at `skew_ms`: per rule, (overshoot max, false rejections as
/// a share of refusals).
fn skewed(skew_ms: &str) -> Vec<(String, f64, f64)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../simulations/clock-skew.toml"
    );
    let p = [("clock_skew_ms".to_string(), skew_ms.to_string())];
    let sc = sluice_sim::load(path, &p).unwrap_or_else(|e| panic!("{e}"));
    let r = sluice_sim::run(&sc, sc.seed, &mut |_| {});
    r.rules
        .iter()
        .map(|x| (x.id.clone(), x.overshoot_max, x.false_rejection_pct))
        .collect()
}

/// The tolerance docs/regions.md states: a skew of a quarter of the ship interval adds no
/// overshoot to speak of and few false rejections; a skew past a window (10 s rules, clocks
/// 12.5 s either side) cuts the regions off from each other's figures.
#[test]
fn skew_below_the_interval_is_tolerated_and_past_a_window_is_not() {
    let none = skewed("0");
    let quarter = skewed("250");
    let past = skewed("25000");
    for ((id, max0, fr0), (_, max, fr)) in none.iter().zip(&quarter) {
        assert_eq!(*fr0, 0.0, "{id}: clocks that agree refuse nothing falsely");
        assert!(max - max0 <= 0.03, "{id}: {max0} -> {max} at 250 ms");
        assert!(*fr <= 3.0, "{id}: {fr}% of refusals false at 250 ms");
    }
    let ten_fixed =
        |v: &[(String, f64, f64)]| v.iter().find(|x| x.0 == "ten-s-fixed").map_or(0.0, |x| x.1);
    assert!(
        ten_fixed(&past) > 1.5 * ten_fixed(&none),
        "{} against {}",
        ten_fixed(&past),
        ten_fixed(&none)
    );
}
