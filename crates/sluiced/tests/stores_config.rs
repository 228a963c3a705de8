//! `stores:` in the daemon's config: named stores take the shape of `store` and default their
//! deadline and breaker to the main store's; a bad one is an error at start naming it.

use sluiced::config::{Config, StoreConfig};

#[test]
fn named_stores_resolve_with_the_main_stores_settings_as_defaults() {
    let c = Config::from_yaml(
        "store: { kind: redis, url: \"redis://main:6379/\" }\nstore_timeout_ms: 7\nbreaker_cool_off_ms: 3000\n\
         stores:\n  bigcorp: { kind: redis_cluster, urls: [\"redis://b1:6379/\"], breaker_min_calls: 4 }\n  \
         eu-2: { kind: redis, url: \"redis://eu2:6379/\", store_timeout_ms: 20, breaker_cool_off_ms: 500 }\n",
    )
    .expect("valid");
    let named = c.named_stores().expect("valid stores");
    let names: Vec<&str> = named.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["bigcorp", "eu-2"]);
    let (big, eu) = (&named[0], &named[1]);
    assert_eq!(
        big.store,
        StoreConfig::RedisCluster {
            urls: vec!["redis://b1:6379/".into()]
        }
    );
    assert_eq!(big.timeout_ms, 7, "the main store's deadline");
    assert_eq!(big.breaker.min_calls, 4);
    assert_eq!(big.breaker.cool_off, 3_000_000, "the main store's cool-off");
    assert_eq!(big.breaker.failure_pct, c.breaker().failure_pct);
    assert_eq!(
        eu.store,
        StoreConfig::Redis {
            url: "redis://eu2:6379/".into()
        }
    );
    assert_eq!((eu.timeout_ms, eu.breaker.cool_off), (20, 500_000));
    assert!(Config::default().named_stores().expect("none").is_empty());
}

#[test]
fn bad_named_stores_are_refused_naming_the_store_and_field() {
    for (stores, why) in [
        (
            "Big: { kind: memory }",
            "stores.Big: a store name is 1 to 64",
        ),
        (
            "default: { kind: memory }",
            "stores.default: default is the main store's name",
        ),
        ("big: { kind: redis }", "stores.big: kind redis needs url"),
        (
            "big: { kind: redis_cluster, urls: [] }",
            "stores.big: kind redis_cluster needs urls",
        ),
        (
            "big: { kind: floppy }",
            "stores.big: unknown kind \"floppy\"",
        ),
        (
            "big: { kind: redis, url: \"redis://x/\", urls: [\"redis://y/\"] }",
            "stores.big: urls does not apply to kind redis",
        ),
        (
            "big: { kind: redis, url: \"redis://x/\", store_timeout_ms: 0 }",
            "stores.big: store_timeout_ms must be 1 to 60000",
        ),
        (
            "big: { kind: redis, url: \"redis://x/\", breaker_failure_pct: 0 }",
            "stores.big: breaker_failure_pct must be 1 to 100",
        ),
        (
            "big: { kind: redis, url: \"redis://x/\", timeout: 3 }",
            "unknown field `timeout`",
        ),
    ] {
        let err = Config::from_yaml(&format!("stores:\n  {stores}\n")).expect_err(stores);
        assert!(format!("{err:#}").contains(why), "{stores}: {err:#}");
    }
}
