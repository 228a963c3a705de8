//! The simulator models one store per region: a scenario whose rule or override names a
//! store is refused, naming the rule and the store, rather than counted in the wrong store.

use std::path::PathBuf;

fn blind_spot() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../simulations/blind-spot.toml");
    std::fs::read_to_string(p).expect("simulations/blind-spot.toml")
}

#[test]
fn a_scenario_naming_a_store_is_refused_with_the_rule_and_store() {
    let good = blind_spot();
    sluice_sim::scenario::parse(&good, &[]).expect("the scenario as shipped is valid");
    let bad = good.replace(
        "scope = \"global\"\n",
        "scope = \"global\"\nstore = \"bigcorp\"\n",
    );
    assert_ne!(bad, good, "the rule was edited");
    let err = sluice_sim::scenario::parse(&bad, &[])
        .expect_err("a named store")
        .to_string();
    assert!(
        err.contains("rule \"global-per-minute\" names store \"bigcorp\"")
            && err.contains("named stores are not simulated"),
        "{err}"
    );
}
