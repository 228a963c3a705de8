//! The memory store runs a `leaky_queue` rule as the Redis script does (through
//! `batch::apply`): delays one interval apart, a refusal that writes nothing, and a key that
//! expires once its queue is empty.

use sluice_core::batch::{Call, Item};
use sluice_core::time::{MILLI, SECOND};
use sluice_core::{Params, Rate, Remote, State};
use sluice_store::MemoryStore;

fn call(now: u64, cost: u64) -> Call {
    Call {
        now,
        cost,
        request_id: "r".into(),
        items: vec![Item {
            key: "sl:{sms}:q:aggregator".into(),
            params: Params::LeakyQueue {
                rate: Rate::per_second(100),
                max_delay: 20 * MILLI,
            },
            enforce: true,
            charge_rejected: false,
            remote: Remote::default(),
        }],
    }
}

#[test]
fn the_memory_store_shapes_and_forgets_an_empty_queue() {
    let store = MemoryStore::with_seed(1_000, 7);
    let t0 = 1_800_000_000 * SECOND;
    let delays: Vec<u64> = (0..3)
        .map(|_| {
            let r = store.check_sync(&call(t0, 1)).expect("an answer");
            assert!(r.allowed);
            r.outcomes[0].delay()
        })
        .collect();
    assert_eq!(delays, vec![0, 10 * MILLI, 20 * MILLI]);
    let key = "sl:{sms}:q:aggregator";
    let held = Some(State::LeakyQueue {
        tat: t0 + 30 * MILLI,
    });
    assert_eq!(store.get(key, t0), held);
    let r = store.check_sync(&call(t0, 1)).expect("an answer");
    assert!(!r.allowed);
    assert_eq!(r.outcomes[0].retry_after, 10 * MILLI);
    assert_eq!(store.get(key, t0), held, "a refusal moved the queue");
    // The key lives until its last departure, not after.
    assert_eq!(store.get(key, t0 + 30 * MILLI - 1), held);
    assert_eq!(store.get(key, t0 + 30 * MILLI), None);
    let r = store
        .check_sync(&call(t0 + 30 * MILLI, 2))
        .expect("an answer");
    assert!(r.allowed && r.outcomes[0].delay() == 0);
}
