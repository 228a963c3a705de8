//! A region rolled onto this release from the one before generation labels: its daemons
//! share one Redis, so for a while the older script and this one meet the same keys. The
//! older script (`fixtures/check-before-generations.lua`, `lua/check.lua` as that release
//! shipped it) refuses a labelled shared bucket state as corrupt; with labels off
//! (`gossip.bucket_generations: false`, `Remote::without_labels`) this release writes, and
//! rewrites, the form the older one reads. Real `redis-server`, the store's own encoding.

mod common;

use common::cases::{T0, call, item};
use sluice_core::algo::Remote;
use sluice_core::batch::Call;
use sluice_core::time::SECOND;
use sluice_core::{Params, Rate};
use sluice_store::redis::{CHECK_SCRIPT, encode_check};

/// The check script of the release before generation labels.
const BEFORE: &str = include_str!("fixtures/check-before-generations.lua");

/// Runs `call` through the script `sha`: the raw reply, or Redis's error text.
fn run(conn: &mut redis::Connection, sha: &str, call: &Call) -> Result<redis::Value, String> {
    let enc = encode_check(call).expect("encodable call");
    redis::cmd("EVALSHA")
        .arg(sha)
        .arg(enc.keys.len())
        .arg(&enc.keys)
        .arg(&enc.args)
        .query::<redis::Value>(conn)
        .map_err(|e| e.to_string())
        .and_then(|v| match v {
            redis::Value::ServerError(e) => Err(format!("{e:?}")),
            v => Ok(v),
        })
}

fn get(conn: &mut redis::Connection, key: &str) -> String {
    redis::cmd("GET").arg(key).query(conn).expect("GET")
}

#[test]
fn labels_off_keep_the_state_an_older_release_reads() {
    let server = common::redis();
    let mut conn = common::sync_conn(&server.url());
    let new = common::load(&mut conn, CHECK_SCRIPT);
    let old = common::load(&mut conn, BEFORE);
    let rate = Rate::per_second(10);
    for (name, params, fields) in [
        ("tb", Params::TokenBucket { rate, burst: 5 }, 4),
        ("gcra", Params::Gcra { rate, burst: 5 }, 3),
    ] {
        // What an older daemon sends: the rule shared by one region.
        let shared = |key: &str| {
            let mut it = item(key, params.clone());
            it.remote = Remote::shared_bucket(0, 1);
            it
        };
        let take = |key: &str, remote: fn(Remote) -> Remote, at| {
            let mut it = shared(key);
            it.remote = remote(it.remote);
            call(T0 + at * SECOND, 1, "r", vec![it])
        };
        let on = |r: Remote| r;
        let off = |r: Remote| r.without_labels();

        // Labels on: the older script refuses the key this release wrote.
        let labelled = format!("sl:{{up}}:{name}-on");
        run(&mut conn, &new, &take(&labelled, on, 0)).expect("a labelled take");
        assert_eq!(get(&mut conn, &labelled).split(' ').count(), fields + 1);
        let refused = run(&mut conn, &old, &take(&labelled, on, 0));
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("SLUICE_CORRUPT")),
            "{name}: the older script on a labelled state: {refused:?}"
        );

        // Labels off: the older script reads every state this release writes, and back.
        let plain = format!("sl:{{up}}:{name}-off");
        for at in 0..3 {
            run(&mut conn, &new, &take(&plain, off, at)).expect("a take with labels off");
            assert_eq!(
                get(&mut conn, &plain).split(' ').count(),
                fields,
                "{name}: the older form"
            );
            run(&mut conn, &old, &take(&plain, on, at)).unwrap_or_else(|e| {
                panic!("{name}: the older script refused a state written with labels off: {e}")
            });
        }

        // A labelled key met with labels off is rewritten in the older form.
        run(&mut conn, &new, &take(&labelled, off, 1)).expect("a take with labels off");
        assert_eq!(get(&mut conn, &labelled).split(' ').count(), fields);
        run(&mut conn, &old, &take(&labelled, on, 1))
            .unwrap_or_else(|e| panic!("{name}: still refused after the rewrite: {e}"));
    }
}
