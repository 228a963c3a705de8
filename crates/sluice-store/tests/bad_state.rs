//! Bad state in Redis: a key of the wrong type, a corrupt value, an error reply. Each must
//! come back as a classified [`StoreError`] (so the rule's `on_store_failure` decides what the
//! client sees), never a panic and never a silent allow, and a failed call writes nothing.

mod common;

use common::cases::{T0, call, item};
use sluice_core::Params;
use sluice_core::Rate;
use sluice_core::algo::Window;
use sluice_core::batch::Item;
use sluice_core::time::SECOND;
use sluice_store::redis::{CHECK_SCRIPT, RedisConfig, RedisStore, item_keys};
use sluice_store::{Store, StoreError};
use sluice_testkit::RedisServer;

fn all_algorithms() -> Vec<(&'static str, Params)> {
    vec![
        (
            "tb",
            Params::TokenBucket {
                rate: Rate::per_second(1),
                burst: 5,
            },
        ),
        (
            "gcra",
            Params::Gcra {
                rate: Rate::per_second(1),
                burst: 5,
            },
        ),
        (
            "fw",
            Params::FixedWindow {
                limit: 5,
                window: Window::Epoch(60 * SECOND),
            },
        ),
        (
            "sw",
            Params::SlidingWindow {
                limit: 5,
                window: 60 * SECOND,
                start: Default::default(),
            },
        ),
        (
            "sl",
            Params::SlidingLog {
                limit: 5,
                window: 60 * SECOND,
            },
        ),
        (
            "cc",
            Params::Concurrency {
                limit: 5,
                timeout: 60 * SECOND,
            },
        ),
    ]
}

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&common::config(server.url()))
        .await
        .expect("store")
}

fn cmd(server: &RedisServer, args: &[&str]) -> String {
    server.cmd(args).expect("a redis command in the test")
}

async fn expect_corrupt(store: &RedisStore, it: &Item, key: &str) -> String {
    let err = store
        .check(&call(T0, 1, "r", vec![it.clone()]))
        .await
        .expect_err("bad state must be an error, not an outcome");
    match &err {
        StoreError::Corrupt { key: k, detail } => {
            assert_eq!(k, key, "the error names the bad key");
            assert!(!err.retryable());
            assert_eq!(err.label(), "corrupt");
            detail.clone()
        }
        other => panic!("expected Corrupt for {key}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_is_corrupt() {
    let server = common::redis();
    let store = store(&server).await;
    for (name, params) in all_algorithms() {
        let it = item(&format!("sl:{{wt}}:{name}"), params);
        let key = item_keys(&it, T0)[0].clone();
        cmd(&server, &["DEL", &key]);
        // A list is no algorithm's type.
        cmd(&server, &["RPUSH", &key, "x"]);
        let detail = expect_corrupt(&store, &it, &key).await;
        assert!(detail.contains("list"), "{name}: {detail}");
        // And a string where a sorted set belongs (and the reverse) is caught too.
        cmd(&server, &["DEL", &key]);
        if matches!(name, "sl" | "cc") {
            cmd(&server, &["SET", &key, "1"]);
        } else {
            cmd(&server, &["ZADD", &key, "1", "m"]);
        }
        expect_corrupt(&store, &it, &key).await;
        assert!(
            !store
                .release(&format!("sl:{{wt}}:{name}"), "r", T0)
                .await
                .is_ok_and(|freed| freed),
            "nothing to release from a bad key"
        );
    }
    // release on a key holding a string is corrupt too.
    cmd(&server, &["SET", "sl:{wt}:slot", "x"]);
    let err = store
        .release("sl:{wt}:slot", "r", T0)
        .await
        .expect_err("corrupt");
    assert!(
        matches!(err, StoreError::Corrupt { ref key, .. } if key == "sl:{wt}:slot"),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_values_are_corrupt() {
    let server = common::redis();
    let store = store(&server).await;
    let algs = all_algorithms();
    let by = |n: &str| {
        algs.iter()
            .find(|(name, _)| *name == n)
            .map(|(_, p)| p.clone())
            .expect("known algorithm")
    };
    // String states.
    for (name, value) in [
        ("tb", "abc"),
        ("tb", "1 2"),
        // A shared bucket's `used` is a fourth field and its generation's birth a fifth
        // (GCRA: third and fourth); one more is corrupt.
        ("tb", "1 2 3 4 5 6"),
        ("tb", "1 2 3 9007199254740992"),
        ("tb", "1 2 3 4 9007199254740992"),
        ("tb", "-5 1 0"),
        ("tb", "99999999999999999999 1 0"),
        ("tb", "1.5 2 0"),
        ("gcra", "x"),
        ("gcra", "1 2 3 4 5"),
        ("gcra", "1 2 3 x"),
        ("gcra", "1 2 x"),
        ("gcra", "1 "),
        ("fw", "ten"),
        ("fw", "-1"),
    ] {
        let it = item(&format!("sl:{{cv}}:{name}"), by(name));
        let key = item_keys(&it, T0)[0].clone();
        cmd(&server, &["SET", &key, value]);
        expect_corrupt(&store, &it, &key).await;
        assert_eq!(
            cmd(&server, &["GET", &key]),
            value,
            "a failed call writes nothing"
        );
    }
    // The previous window's counter of a sliding window.
    let sw = item("sl:{cv}:sw", by("sw"));
    let prev = item_keys(&sw, T0)[1].clone();
    cmd(&server, &["SET", &prev, "1.5"]);
    expect_corrupt(&store, &sw, &prev).await;
    // A log entry that is not a time, and a slot that is not "<cost>:<id>".
    let sl = item("sl:{cv}:sl", by("sl"));
    cmd(&server, &["ZADD", "sl:{cv}:sl", "1800000000000000.5", "a"]);
    expect_corrupt(&store, &sl, "sl:{cv}:sl").await;
    let cc = item("sl:{cv}:cc", by("cc"));
    cmd(
        &server,
        &["ZADD", "sl:{cv}:cc", "1900000000000000", "garbage"],
    );
    expect_corrupt(&store, &cc, "sl:{cv}:cc").await;
    let err = store
        .release("sl:{cv}:cc", "r", T0)
        .await
        .expect_err("corrupt slot");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_key_in_one_rule_takes_from_none() {
    let server = common::redis();
    let store = store(&server).await;
    let good = item(
        "sl:{mix}:burst",
        Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 5,
        },
    );
    let bad = item(
        "sl:{mix}:daily",
        Params::FixedWindow {
            limit: 5,
            window: Window::Epoch(86_400 * SECOND),
        },
    );
    let bad_key = item_keys(&bad, T0)[0].clone();
    cmd(&server, &["HSET", &bad_key, "f", "v"]);
    let err = store
        .check(&call(T0, 1, "r", vec![good, bad]))
        .await
        .expect_err("corrupt");
    assert!(
        matches!(err, StoreError::Corrupt { ref key, .. } if *key == bad_key),
        "{err:?}"
    );
    assert_eq!(
        cmd(&server, &["EXISTS", "sl:{mix}:burst"]),
        "0",
        "no token was taken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_error_replies_are_classified() {
    let server = common::redis();
    let store = store(&server).await;
    let c = call(
        T0,
        1,
        "r",
        vec![item(
            "sl:{err}:tb",
            Params::TokenBucket {
                rate: Rate::per_second(1),
                burst: 5,
            },
        )],
    );
    // Out of memory with noeviction: the store is full, which may pass.
    cmd(&server, &["SET", "ballast", &"x".repeat(64 * 1024)]);
    cmd(&server, &["CONFIG", "SET", "maxmemory", "1"]);
    let err = store.check(&c).await.expect_err("OOM");
    assert!(matches!(err, StoreError::Full(_)), "{err:?}");
    assert!(err.retryable());
    cmd(&server, &["CONFIG", "SET", "maxmemory", "0"]);
    store.check(&c).await.expect("fine again");

    // A read-only replica (a failover in progress): unavailable, retryable.
    let primary = common::redis();
    cmd(
        &server,
        &["REPLICAOF", "127.0.0.1", &primary.port().to_string()],
    );
    let err = store.check(&c).await.expect_err("READONLY");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(err.retryable());
    cmd(&server, &["REPLICAOF", "NO", "ONE"]);

    // A user without the right to run scripts (AUTH through the URL): a permanent error.
    cmd(
        &server,
        &[
            "ACL", "SETUSER", "limited", "on", ">s3cret", "~*", "+@all", "-evalsha", "-eval",
        ],
    );
    let cfg = RedisConfig {
        urls: vec![format!(
            "redis://limited:s3cret@127.0.0.1:{}/",
            server.port()
        )],
        ..common::config(String::new())
    };
    let limited = RedisStore::connect(&cfg).await.expect("store");
    let err = limited.check(&c).await.expect_err("NOPERM");
    assert!(matches!(err, StoreError::Server(_)), "{err:?}");
    assert!(!err.retryable());
    // The password stays out of logs and errors.
    assert!(!format!("{limited:?}").contains("s3cret"));
    assert!(!err.to_string().contains("s3cret"));

    // A wrong password: permanent until an operator fixes the URL.
    let cfg = RedisConfig {
        urls: vec![format!(
            "redis://limited:wrong@127.0.0.1:{}/",
            server.port()
        )],
        ..common::config(String::new())
    };
    let denied = RedisStore::connect(&cfg).await.expect("lazy");
    let err = denied.check(&c).await.expect_err("WRONGPASS");
    assert!(matches!(err, StoreError::Server(_)), "{err:?}");
    assert!(!err.retryable());
    assert!(!err.to_string().contains("wrong@"), "{err}");
}

/// Arguments the script cannot trust answer `SLUICE_BADARG` and write nothing: the packed
/// header and items are checked digit by digit and against 2^53 before any key is read. In a
/// batch the bad call alone fails; the others are answered and taken.
#[test]
fn malformed_arguments_answer_badarg_and_write_nothing() {
    let server = common::redis();
    let now = T0.to_string();
    let (ws, we) = (
        T0 - T0 % (60 * SECOND),
        T0 - T0 % (60 * SECOND) + 60 * SECOND,
    );
    let good = format!("3 5 60000000 1 0 0 {ws} {we}");
    let eval = |keys: &[&str], args: &[&str]| {
        let mut c: Vec<String> = vec!["EVAL".into(), CHECK_SCRIPT.into(), keys.len().to_string()];
        c.extend(keys.iter().map(|k| k.to_string()));
        c.extend(args.iter().map(|a| a.to_string()));
        server.cmd(&c)
    };
    let header = format!("{now} 1");
    // A good call first: the encoding the cases below break. One fixed window answers the
    // count its window held (the daemon computes the outcome from it); a second call sees
    // the first one's unit.
    assert_eq!(
        eval(&["sl:{ba}:ok"], &[&header, "r", &good]).expect("a good call"),
        "0"
    );
    assert_eq!(
        eval(&["sl:{ba}:ok"], &[&header, "r", &good]).expect("a good call"),
        "1"
    );
    // Two items take the general path: allowed, then eight fields per item (the last, a
    // shared bucket's generation label, 0 for a window).
    let two = eval(
        &["sl:{ba}:ok2", "sl:{ba}:ok3"],
        &[&header, "r", &good, &good],
    )
    .expect("a good call of two items");
    let fields = format!("1\n5\n4\n{}\n0\n60000000\n1\n0", we - T0);
    assert_eq!(two, format!("1\n{fields}\n{fields}"));
    let too_big = format!("3 9007199254740992 60000000 1 0 0 {ws} {we}");
    let cases: Vec<(&str, Vec<&str>, Vec<String>)> = vec![
        (
            "header without a cost",
            vec!["sl:{ba}:k"],
            vec![now.clone(), "r".into(), good.clone()],
        ),
        (
            "header not digits",
            vec!["sl:{ba}:k"],
            vec!["12x 1".into(), "r".into(), good.clone()],
        ),
        ("no request id", vec!["sl:{ba}:k"], vec![header.clone()]),
        (
            "nine fields",
            vec!["sl:{ba}:k"],
            vec![header.clone(), "r".into(), format!("{good} 7")],
        ),
        (
            "unknown code",
            vec!["sl:{ba}:k"],
            vec![header.clone(), "r".into(), good.replacen('3', "9", 1)],
        ),
        (
            "negative limit",
            vec!["sl:{ba}:k"],
            vec![header.clone(), "r".into(), good.replacen(" 5 ", " -5 ", 1)],
        ),
        (
            "limit of 2^53",
            vec!["sl:{ba}:k"],
            vec![header.clone(), "r".into(), too_big],
        ),
        (
            "zero limit",
            vec!["sl:{ba}:k"],
            vec![header.clone(), "r".into(), good.replacen(" 5 ", " 0 ", 1)],
        ),
        (
            "flags beyond two bits",
            vec!["sl:{ba}:k"],
            vec![
                header.clone(),
                "r".into(),
                good.replacen(" 1 0 0 ", " 4 0 0 ", 1),
            ],
        ),
        (
            "no key",
            vec![],
            vec![header.clone(), "r".into(), good.clone()],
        ),
    ];
    for (what, keys, args) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = eval(keys, &args).expect_err(what);
        assert!(
            format!("{err:#}").contains("SLUICE_BADARG"),
            "{what}: {err:#}"
        );
        assert_eq!(
            cmd(&server, &["EXISTS", "sl:{ba}:k"]),
            "0",
            "{what}: nothing written"
        );
    }
    // A batch: the bad call's answer is its error; the good one is counted.
    let reply = eval(
        &["sl:{ba}:b1", "sl:{ba}:b2"],
        &[
            "B", "2", "1 3", &header, "r", &good, "1 3", &header, "r", "3 5 x",
        ],
    )
    .expect("a batch answers per call");
    let lines: Vec<&str> = reply.lines().collect();
    assert_eq!(lines.len(), 2, "{reply}");
    assert_eq!(lines[0], "0", "{reply}");
    assert!(
        lines.last().is_some_and(|l| l.starts_with("SLUICE_BADARG")),
        "{reply}"
    );
    assert_eq!(cmd(&server, &["GET", "sl:{ba}:b1"]), "1");
    assert_eq!(cmd(&server, &["EXISTS", "sl:{ba}:b2"]), "0");
}
