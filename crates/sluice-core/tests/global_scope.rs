//! `scope: global` is refused for algorithms whose counts cannot be shared between regions:
//! a sliding log's timestamps and a concurrency rule's held slots take no remote figure, so
//! a global one would silently be counted in each region alone.

use sluice_core::rules::parse_yaml;

fn rules(algorithm: &str, numbers: &str, scope: &str) -> String {
    format!(
        "domain: d\nrules:\n  - {{ id: r, key: [k], algorithm: {algorithm}, {numbers}, scope: {scope} }}\n"
    )
}

#[test]
fn only_shared_algorithms_may_be_global() {
    for (algorithm, numbers) in [
        ("sliding_log", "limit: 10, window: 1m"),
        ("concurrency", "limit: 10"),
    ] {
        let err = parse_yaml(&rules(algorithm, numbers, "global")).expect_err(algorithm);
        assert_eq!(err.problems.len(), 1, "{err}");
        let p = &err.problems[0];
        assert_eq!((p.at.as_str(), p.field.as_str()), ("r", "scope"), "{err}");
        assert!(
            p.message.contains(algorithm) && p.message.contains("cannot be shared"),
            "{err}"
        );
        assert!(parse_yaml(&rules(algorithm, numbers, "region")).is_ok());
    }
    for (algorithm, numbers) in [
        ("fixed_window", "limit: 10, window: 1m"),
        ("sliding_window", "limit: 10, window: 1m"),
        ("token_bucket", "rate_per_s: 10, burst: 20"),
        ("gcra", "rate_per_s: 10, burst: 20"),
    ] {
        assert!(
            parse_yaml(&rules(algorithm, numbers, "global")).is_ok(),
            "{algorithm}"
        );
    }
}
