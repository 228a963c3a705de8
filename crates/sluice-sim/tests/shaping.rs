//! A scenario with a `leaky_queue` rule runs through the core like any other, and its report
//! (JSON and table) holds the queue to its rate: at most the rate over the run plus one full
//! queue admitted, the rest of five times the rate refused.

use sluice_sim::{parse, report, run};

const SCENARIO: &str = r#"
name = "shaping"
duration_s = 60
seed = 5
regions = ["us"]

[measure]
warmup_s = 0

[[rules]]
id = "aggregator"
key = ["api_key"]
algorithm = "leaky_queue"
rate_per_s = 10
max_delay = "2s"

[[traffic]]
name = "five times the rate"
rate_per_s = 50
arrivals = "constant"
keys = { kind = "one", name = "k_sender" }
"#;

#[test]
fn a_shaping_rule_is_simulated_and_reported() {
    let sc = match parse(SCENARIO, &[]) {
        Ok(s) => s,
        Err(e) => panic!("a leaky_queue scenario parses: {e}"),
    };
    let r = run(&sc, sc.seed, &mut |_| {});
    let json = report::json(&r);
    let table = report::table(&r);
    assert!(
        json.contains("aggregator") && table.contains("aggregator"),
        "{table}"
    );
    eprintln!(
        "shaping (simulated): {} requests, {} admitted",
        r.requests, r.admitted
    );
    // 10 a second for 60 s, plus the 21 departures a 2 s queue holds at the end.
    assert!(r.admitted <= 10 * 60 + 21, "{} admitted", r.admitted);
    assert!(
        r.admitted >= 10 * 59,
        "{} admitted: the queue ran dry",
        r.admitted
    );
    assert!(r.requests >= 50 * 59, "{} requests", r.requests);
}
