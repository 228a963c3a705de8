//! A scenario with a `fair_share` rule runs through the core like any other (the memory
//! store reads and writes the tenant's bucket and the parent together), and its report holds
//! the parent to its numbers: a lone tenant at five times the parent borrows it whole, and
//! never more than the parent's burst plus its rate over the run.

use sluice_sim::{parse, report, run};

const SCENARIO: &str = r#"
name = "fair share"
duration_s = 60
seed = 5
regions = ["us"]

[measure]
warmup_s = 0

[[rules]]
id = "backend"
key = ["api_key"]
algorithm = "token_bucket"
rate_per_s = 20
burst = 20
fair_share = 0.25

[[traffic]]
name = "one tenant at five times the parent"
rate_per_s = 100
arrivals = "constant"
keys = { kind = "one", name = "k_alone" }
"#;

#[test]
fn a_fair_share_rule_is_simulated_and_reported() {
    let sc = match parse(SCENARIO, &[]) {
        Ok(s) => s,
        Err(e) => panic!("a fair_share scenario parses: {e}"),
    };
    let r = run(&sc, sc.seed, &mut |_| {});
    let json = report::json(&r);
    let table = report::table(&r);
    assert!(
        json.contains("backend") && table.contains("backend"),
        "{table}"
    );
    eprintln!(
        "fair share (simulated): {} requests, {} admitted",
        r.requests, r.admitted
    );
    // The parent: its burst of 20 plus 20 a second for 60 s.
    assert!(r.admitted <= 20 + 20 * 60, "{} admitted", r.admitted);
    // Its own share would be 5 a second (300): borrowing gives it the parent's burst and rate
    // over the (at least 59 s) span of its requests, all but the reserve (half the burst)
    // and 2 tokens of rounding (`a_lone_tenant_takes_the_whole_parent`).
    assert!(
        r.admitted >= 20 + 20 * 59 - 10 - 2,
        "{} admitted",
        r.admitted
    );
    assert!(r.requests >= 100 * 59, "{} requests", r.requests);
}
