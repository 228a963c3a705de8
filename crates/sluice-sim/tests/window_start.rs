//! `window_start: first_request` in the simulator's terms: a scenario rule says it (checked by
//! the core's rule validator, as every scenario rule is), and clients refused together come
//! back spread out instead of at one instant.
//!
//! The scenario's engine has no clients that wait out a refusal, so the retrying clients are
//! driven here, in virtual time, through what a simulated daemon runs for each request: the
//! core's matching for the store call and the memory store's atomic check (the simulator's
//! store). 200 clients of one `limit: 5, window: 1m` rule each arrive at a random moment of
//! one minute with a burst of 10, are refused at the sixth request, and retry at each
//! `Retry-After` until admitted; the measure is the spread of those first re-admissions.

use sluice_core::Micros;
use sluice_core::batch::{Call, Item};
use sluice_core::matching::{Descriptors, applicable};
use sluice_core::time::{MILLI, SECOND};
use sluice_rng::Rng;
use sluice_sim::Scenario;
use sluice_store::MemoryStore;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const SCENARIO: &str = r#"
name = "window-start"
duration_s = 180
regions = ["us"]
[[rules]]
id = "per-min"
key = ["api_key"]
algorithm = "fixed_window"
limit = 5
window = "1m"
[[traffic]]
rate_per_s = 1
"#;

const CLIENTS: u64 = 200;
const BURST: u64 = 10;
/// A minute boundary: the clients arrive within the minute after it.
const T0: Micros = 1_800_000_000 * SECOND - (1_800_000_000 * SECOND) % (60 * SECOND);

fn scenario(algorithm: &str, window_start: &str) -> Scenario {
    let set = [
        ("rules.per-min.algorithm".to_string(), algorithm.to_string()),
        (
            "rules.per-min.window_start".to_string(),
            window_start.to_string(),
        ),
    ];
    match sluice_sim::parse(SCENARIO, &set) {
        Ok(s) => s,
        Err(e) => panic!("window_start = {window_start}: {e}"),
    }
}

/// One request of `client` at `now` through the rule's store call; its outcome's
/// (allowed, retry_after).
fn request(sc: &Scenario, store: &MemoryStore, client: u64, now: Micros) -> (bool, Micros) {
    let desc = Descriptors::new(vec![("api_key".into(), format!("c{client}"))])
        .expect("valid descriptors");
    let rules = applicable(sc.domain(), &desc);
    let a = rules.first().expect("the rule applies");
    let call = Call {
        now,
        cost: 1,
        request_id: String::new(),
        items: vec![Item {
            key: a.key.clone(),
            params: a.params.clone().into_owned(),
            enforce: true,
            charge_rejected: false,
            remote: Default::default(),
        }],
    };
    let r = store.check_sync(&call).expect("the memory store answers");
    (r.allowed, r.outcomes[0].retry_after)
}

/// Each client's first re-admission after its refusal, in virtual time.
fn readmissions(sc: &Scenario) -> Vec<Micros> {
    let store = MemoryStore::with_seed(1_000_000, 7);
    let mut rng = Rng::stream(42, 0);
    let mut due: BinaryHeap<Reverse<(Micros, u64, bool)>> = (0..CLIENTS)
        .map(|c| Reverse((T0 + rng.range(0, 60 * SECOND - 1), c, false)))
        .collect();
    let mut back = Vec::new();
    while let Some(Reverse((now, client, retrying))) = due.pop() {
        let tries = if retrying { 1 } else { BURST };
        for _ in 0..tries {
            let (allowed, wait) = request(sc, &store, client, now);
            if !allowed {
                assert!(wait > 0, "a refusal says when to retry");
                due.push(Reverse((now + wait, client, true)));
                break;
            }
            if retrying {
                back.push(now);
            }
        }
    }
    back.sort_unstable();
    back
}

/// The most re-admissions within one second.
fn peak_per_second(back: &[Micros]) -> usize {
    back.iter()
        .map(|&t| back.iter().filter(|&&u| u >= t && u < t + SECOND).count())
        .max()
        .unwrap_or(0)
}

#[test]
fn clients_refused_together_come_back_spread_out() {
    let epoch = readmissions(&scenario("fixed_window", "epoch"));
    let own = readmissions(&scenario("fixed_window", "first_request"));
    assert_eq!(epoch.len() as u64, CLIENTS, "every client was refused once");
    assert_eq!(own.len() as u64, CLIENTS, "every client was refused once");
    let spread = |b: &[Micros]| b[b.len() - 1] - b[0];
    eprintln!(
        "first re-admissions of {CLIENTS} clients: epoch spread {} ms, peak {} in one second; \
         first_request spread {} ms, peak {} in one second",
        spread(&epoch) / MILLI,
        peak_per_second(&epoch),
        spread(&own) / MILLI,
        peak_per_second(&own),
    );
    // Epoch: every client is back at the next minute, the same microsecond.
    assert_eq!(spread(&epoch), 0);
    assert!(epoch.iter().all(|&t| t == T0 + 60 * SECOND));
    // Their own windows: each is back a minute after its own first request, so the
    // re-admissions spread over the minute the arrivals spread over.
    assert!(spread(&own) > 55 * SECOND, "{} ms", spread(&own) / MILLI);
    assert!(peak_per_second(&own) < 15, "{}", peak_per_second(&own));
}

/// The same clients on a sliding window: with epoch windows they come back together (the
/// previous minute's weight falls for every key alike), with their own windows spread out.
#[test]
fn sliding_windows_refused_together_come_back_spread_out() {
    let epoch = readmissions(&scenario("sliding_window", "epoch"));
    let own = readmissions(&scenario("sliding_window", "first_request"));
    assert_eq!(epoch.len() as u64, CLIENTS);
    assert_eq!(own.len() as u64, CLIENTS);
    let spread = |b: &[Micros]| b[b.len() - 1] - b[0];
    eprintln!(
        "sliding window, first re-admissions of {CLIENTS} clients: epoch spread {} ms, peak {} \
         in one second; first_request spread {} ms, peak {} in one second",
        spread(&epoch) / MILLI,
        peak_per_second(&epoch),
        spread(&own) / MILLI,
        peak_per_second(&own),
    );
    assert!(spread(&own) > 55 * SECOND, "{} ms", spread(&own) / MILLI);
    assert!(peak_per_second(&own) < 15, "{}", peak_per_second(&own));
    assert!(peak_per_second(&epoch) > 10 * peak_per_second(&own));
}

#[test]
fn a_scenario_refuses_first_request_with_global_scope() {
    let set = [
        (
            "rules.per-min.window_start".to_string(),
            "first_request".to_string(),
        ),
        ("rules.per-min.scope".to_string(), "global".to_string()),
    ];
    let err = match sluice_sim::parse(SCENARIO, &set) {
        Ok(_) => panic!("a global first_request rule was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("per-min") && err.contains("window_start") && err.contains("global"),
        "{err}"
    );
}
