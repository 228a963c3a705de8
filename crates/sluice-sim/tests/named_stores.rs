//! Named stores in the simulator: a scenario declares `[stores.NAME]`, a rule or override
//! names one with `store:`, and each call goes to its store as the daemon routes it
//! (`Plan::store_of`), through that store's guard and local buckets. A store that fails
//! degrades only the identities counted there; a rule naming a store the scenario lacks is
//! refused, naming the rule and the store.

use sluice_core::Micros;
use sluice_core::decision::{Code, Decision};
use sluice_core::matching::Descriptors;
use sluice_core::time::{MILLI, SECOND};
use sluice_sim::engine::Sim;
use std::path::PathBuf;

/// Tenant "big" counts in store "bigcorp" (an override), every other tenant in the main
/// store; bigcorp fails in us-east from 60 s to 90 s. The rule fails closed, so a request
/// whose call failed is answered UNAVAILABLE: a request of any tenant whose calls went to
/// the failing store shows.
const SCENARIO: &str = r#"
name = "tenant-store-test"
duration_s = 200
seed = 5
regions = ["us-east", "eu-west"]

[store]
latency_ms = { dist = "uniform", min = 0.2, max = 0.6 }
breaker_min_calls = 4
breaker_cool_off_ms = 5000

[stores.bigcorp]
latency_ms = { dist = "fixed", value = 1 }

[[rules]]
id = "per-tenant"
key = ["tenant"]
algorithm = "fixed_window"
limit = 12
window = "10s"
on_store_failure = "closed"

[[overrides]]
identity = { tenant = "big" }
rule = "per-tenant"
store = "bigcorp"
limit = 60

[[events]]
kind = "store_failover"
at_s = 60
region = "us-east"
store = "bigcorp"
lost_ms = 0
outage_ms = 30000

# No traffic of its own: the test gives every request.
[[traffic]]
rate_per_s = 0
keys = { kind = "one", name = "unused" }
"#;

/// The same scenario without the failure.
fn without_failure() -> String {
    let at = SCENARIO.find("[[events]]").expect("an event");
    let end = SCENARIO.find("# No traffic").expect("the traffic");
    format!("{}{}", &SCENARIO[..at], &SCENARIO[end..])
}

/// `(region, tenant, at)` of every request: big at 20/s and five small tenants at 4/s
/// each, alternating regions, for 180 s (big's 10/s a region is over its 60 a window too).
fn sequence() -> Vec<(usize, String, Micros)> {
    let mut out = Vec::new();
    let mut i = 0u64;
    let mut t = SECOND;
    while t < 181 * SECOND {
        let tenant = if i.is_multiple_of(2) {
            "big".to_string()
        } else {
            format!("t{}", (i / 2) % 5)
        };
        out.push((((i / 2) % 2) as usize, tenant, t));
        i += 1;
        t += 25 * MILLI;
    }
    out
}

/// Every request's decision, in sequence order.
fn decisions(text: &str) -> (Vec<Decision>, sluice_sim::metrics::Metrics) {
    let sc = sluice_sim::parse(text, &[]).unwrap_or_else(|e| panic!("{e}"));
    let mut sim = Sim::new(&sc, sc.seed);
    let mut out = Vec::new();
    for (region, tenant, at) in sequence() {
        let d = Descriptors::new(vec![("tenant".to_string(), tenant.clone())])
            .unwrap_or_else(|e| panic!("{e}"));
        let decided = sim.decide(region, 0, at, &d, 1);
        out.push(decided.unwrap_or_else(|| panic!("{tenant} at {at} lost")));
    }
    (out, sim.metrics)
}

#[test]
fn a_failing_named_store_degrades_only_the_tenant_counted_there() {
    let (failed, m) = decisions(SCENARIO);
    let (healthy, m0) = decisions(&without_failure());
    let seq = sequence();
    assert_eq!(failed.len(), seq.len());
    let (mut big_changed, mut big_unavailable, mut small_refused) = (0, 0, 0);
    for (i, (region, tenant, at)) in seq.iter().enumerate() {
        let in_outage = *region == 0 && (60 * SECOND..90 * SECOND).contains(at);
        if tenant == "big" && in_outage {
            big_changed += u64::from(failed[i] != healthy[i]);
            big_unavailable += u64::from(failed[i].code == Code::Unavailable);
        } else if tenant == "big" && *region == 1 {
            // eu-west's bigcorp never failed: big there is decided as without the failure.
            assert_eq!(failed[i], healthy[i], "request {i}: big in eu-west at {at}");
        } else if tenant != "big" {
            // Every other tenant counts in the main store, which never failed.
            assert_eq!(failed[i], healthy[i], "request {i}: {tenant} at {at} µs");
            small_refused += u64::from(failed[i].code == Code::OverLimit);
        }
    }
    // Big's requests to us-east during the outage fail closed (refused by the breaker once
    // it opened, then probes); without the failure none is unavailable.
    assert!(big_unavailable > 100, "{big_unavailable} unavailable");
    assert_eq!(
        big_changed, big_unavailable,
        "only the failure changed them"
    );
    assert!(
        healthy.iter().all(|d| d.code != Code::Unavailable),
        "no failure, no unavailable"
    );
    // The small tenants' limit binds (each 2 requests/s in each region: 20 a 10 s window
    // against 12), so their identical decisions include refusals.
    assert!(small_refused > 100, "{small_refused} refused");
    // Per store: only bigcorp failed, opened its breakers and answered by failure mode.
    let (main, big) = (&m.stores[0], &m.stores[1]);
    assert_eq!(
        (main.failures, main.breaker_opened, main.answered_closed),
        (0, 0, 0)
    );
    assert!(
        big.failures >= big_unavailable && big.breaker_opened >= 1,
        "{big:?}"
    );
    assert_eq!(big.answered_closed, big.failures, "{big:?}");
    assert!(big.breaker_refused > 0, "{big:?}");
    assert_eq!(m0.stores[1].failures, 0);
    // The small tenants' calls went to the main store and big's to bigcorp: each store saw
    // at most its tenants' requests (the deny cache answers some refusals itself).
    let small = seq.iter().filter(|(_, t, _)| t != "big").count() as u64;
    let (c0, c1) = (m0.stores[0].calls, m0.stores[1].calls);
    assert_eq!(c0 + c1, m0.store_calls);
    assert!(c0 > small / 2 && c0 <= small, "{c0} of {small}");
    let big_requests = seq.len() as u64 - small;
    assert!(
        c1 > big_requests / 2 && c1 <= big_requests,
        "{c1} of {big_requests}"
    );
}

fn blind_spot() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../simulations/blind-spot.toml");
    std::fs::read_to_string(p).expect("simulations/blind-spot.toml")
}

#[test]
fn a_scenario_naming_an_undeclared_store_is_refused_with_the_rule_and_store() {
    let good = blind_spot();
    sluice_sim::scenario::parse(&good, &[]).expect("the scenario as shipped is valid");
    let bad = good.replace(
        "scope = \"global\"\n",
        "scope = \"global\"\nstore = \"bigcorp\"\n",
    );
    assert_ne!(bad, good, "the rule was edited");
    let err = sluice_sim::scenario::parse(&bad, &[])
        .expect_err("an undeclared store")
        .to_string();
    assert!(
        err.contains("rule \"global-per-minute\" names store \"bigcorp\"")
            && err.contains("does not declare"),
        "{err}"
    );
    // Declared, it runs.
    let declared = format!("{bad}\n[stores.bigcorp]\n");
    sluice_sim::scenario::parse(&declared, &[]).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_failover_of_an_undeclared_store_is_refused() {
    let bad = SCENARIO.replace("store = \"bigcorp\"\nlost_ms", "store = \"other\"\nlost_ms");
    assert_ne!(bad, SCENARIO);
    let err = sluice_sim::scenario::parse(&bad, &[])
        .expect_err("an undeclared store")
        .to_string();
    assert!(
        err.contains("events[0].store") && err.contains("\"other\""),
        "{err}"
    );
    let bad = SCENARIO.replace("[stores.bigcorp]", "[stores.default]");
    let err = sluice_sim::scenario::parse(&bad, &[])
        .expect_err("default is the main store")
        .to_string();
    assert!(err.contains("stores.default"), "{err}");
}
