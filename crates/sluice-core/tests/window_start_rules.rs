//! `window_start` in the rule format: what it builds, and every combination it refuses, with
//! the rule and the field named.

use sluice_core::algo::{Window, WindowStart};
use sluice_core::matching::{Descriptors, applicable};
use sluice_core::rules::{Problem, parse_yaml};
use sluice_core::time::SECOND;
use sluice_core::{Micros, Params};

fn rule(extra: &str) -> String {
    format!(
        "domain: d\nrules:\n  - {{ id: r, key: [api_key], algorithm: fixed_window, limit: 5, window: 1m{extra} }}\n"
    )
}

fn problems(yaml: &str) -> Vec<Problem> {
    match parse_yaml(yaml) {
        Ok(_) => Vec::new(),
        Err(e) => e.problems,
    }
}

/// The one problem of a refused rule, as `(at, field, message)`.
fn refusal(yaml: &str) -> (String, String, String) {
    let p = problems(yaml);
    assert_eq!(p.len(), 1, "{p:?}");
    (p[0].at.clone(), p[0].field.clone(), p[0].message.clone())
}

/// The applied rule's key and numbers for `api_key`, overrides included.
fn applied(yaml: &str, api_key: &str) -> (String, Params) {
    let set = parse_yaml(yaml).expect("a valid rule set");
    let d = Descriptors::new(vec![("api_key".into(), api_key.into())]).expect("descriptors");
    let dom = set.domain("d").expect("domain d");
    let a = applicable(dom, &d);
    let first = a.first().expect("the rule applies");
    (first.key.clone(), first.params.clone().into_owned())
}

#[test]
fn first_request_builds_a_per_key_window_and_epoch_stays_the_default() {
    let minute: Micros = 60 * SECOND;
    for (extra, window) in [
        ("", Window::Epoch(minute)),
        (", window_start: epoch", Window::Epoch(minute)),
        (
            ", window_start: first_request",
            Window::FirstRequest(minute),
        ),
    ] {
        let (key, params) = applied(&rule(extra), "k1");
        assert_eq!(params, Params::FixedWindow { limit: 5, window }, "{extra}");
        // The store key carries no window: Redis's epoch counters add the start to it.
        assert_eq!(key, "sl:{d|api_key=k1}:f:r");
    }
}

#[test]
fn a_sliding_window_takes_it_too() {
    let yaml = "domain: d\nrules:\n  - { id: r, key: [api_key], algorithm: sliding_window, limit: 5, window: 1m, window_start: first_request }\n";
    let (key, params) = applied(yaml, "k1");
    assert_eq!(
        params,
        Params::SlidingWindow {
            limit: 5,
            window: 60 * SECOND,
            start: WindowStart::FirstRequest
        }
    );
    assert_eq!(key, "sl:{d|api_key=k1}:w:r");
    let (_, params) = applied(&yaml.replace(", window_start: first_request", ""), "k1");
    assert!(!params.per_key_window(), "epoch by default");
    let (at, field, msg) = refusal(&yaml.replace(" }\n", ", scope: global }\n"));
    assert_eq!((at.as_str(), field.as_str()), ("r", "window_start"));
    assert!(msg.contains("scope: global"), "{msg}");
}

#[test]
fn an_override_keeps_the_rules_alignment() {
    let yaml = format!(
        "{}overrides:\n  - {{ identity: {{ api_key: big }}, rule: r, limit: 50 }}\n",
        rule(", window_start: first_request")
    );
    let (_, params) = applied(&yaml, "big");
    assert_eq!(
        params,
        Params::FixedWindow {
            limit: 50,
            window: Window::FirstRequest(60 * SECOND)
        }
    );
}

#[test]
fn combinations_that_cannot_hold_are_refused_naming_rule_and_field() {
    let (at, field, msg) = refusal(&rule(", window_start: first_request, scope: global"));
    assert_eq!((at.as_str(), field.as_str()), ("r", "window_start"));
    assert!(
        msg.contains("scope: global") && msg.contains("epoch-aligned"),
        "{msg}"
    );

    let cal = "domain: d\nrules:\n  - { id: r, key: [api_key], algorithm: fixed_window, limit: 5, window: 1d, calendar_tz: UTC, window_start: first_request }\n";
    let (at, field, msg) = refusal(cal);
    assert_eq!((at.as_str(), field.as_str()), ("r", "window_start"));
    assert!(msg.contains("calendar_tz"), "{msg}");
    // epoch with a calendar is what a calendar window is anyway.
    assert_eq!(
        problems(&cal.replace("first_request", "epoch")),
        Vec::<Problem>::new()
    );

    for hk in [
        "lease: 2",
        "lease: auto",
        "sync_interval: 1s",
        "local_share: true",
    ] {
        let (at, field, msg) = refusal(&rule(&format!(
            ", window_start: first_request, hot_keys: {{ {hk} }}"
        )));
        assert_eq!((at.as_str(), field.as_str()), ("r", "window_start"), "{hk}");
        let name = hk.split(':').next().unwrap_or_default();
        assert!(msg.contains(&format!("hot_keys.{name}")), "{hk}: {msg}");
    }
    // The deny cache, splitting and sampling keep working on the key's own outcome.
    assert_eq!(
        problems(&rule(
            ", window_start: first_request, hot_keys: { deny_cache: true, split: 2, sample: 2 }"
        )),
        Vec::<Problem>::new()
    );

    let (at, field, msg) = refusal(&rule(", window_start: sometimes"));
    assert_eq!((at.as_str(), field.as_str()), ("r", "window_start"));
    assert_eq!(
        msg,
        "expected one of epoch | first_request, got \"sometimes\""
    );

    for other in [
        "algorithm: sliding_log, limit: 5, window: 1m",
        "algorithm: token_bucket, rate_per_s: 1, burst: 5",
        "algorithm: gcra, rate_per_s: 1, burst: 5",
        "algorithm: concurrency, limit: 5",
    ] {
        let yaml = format!(
            "domain: d\nrules:\n  - {{ id: r, key: [api_key], {other}, window_start: first_request }}\n"
        );
        let (at, field, msg) = refusal(&yaml);
        assert_eq!(
            (at.as_str(), field.as_str()),
            ("r", "window_start"),
            "{other}"
        );
        assert!(msg.starts_with("does not apply to"), "{other}: {msg}");
    }
}

/// `Retry-After` and `RateLimit`'s `t` count to the key's own window end: a key first seen 17 s
/// into a minute and refused 30 s later waits 30 s, where an epoch window makes it wait the
/// 13 s to the minute.
#[test]
fn headers_count_to_the_keys_own_window_end() {
    use sluice_core::batch::{Write, apply};
    use sluice_core::decision::{Answer, headers, plan};
    use std::collections::HashMap;
    let minute = 60 * SECOND;
    let t0: Micros = 1_800_000_000 * SECOND - (1_800_000_000 * SECOND) % minute;
    for (extra, wait) in [(", window_start: first_request", "30"), ("", "13")] {
        let yaml = format!(
            "domain: d\nrules:\n  - {{ id: r, key: [api_key], algorithm: fixed_window, limit: 2, window: 1m{extra} }}\n"
        );
        let set = parse_yaml(&yaml).expect("a valid rule");
        let dom = set.domain("d").expect("domain d");
        let d = Descriptors::new(vec![("api_key".into(), "k".into())]).expect("descriptors");
        let mut states: HashMap<String, sluice_core::State> = HashMap::new();
        let mut last = Vec::new();
        for at in [t0 + 17 * SECOND, t0 + 40 * SECOND, t0 + 47 * SECOND] {
            let p = plan(dom, &d, at, 1, "r", |_| Default::default());
            let answers: Vec<Answer> = p
                .calls
                .iter()
                .map(|pc| {
                    let cur: Vec<_> = pc
                        .call
                        .items
                        .iter()
                        .map(|i| states.get(&i.key).cloned())
                        .collect();
                    let (r, w) = apply(&pc.call, &cur);
                    for (i, w) in pc.call.items.iter().zip(w) {
                        if let Write::Put(s, _) = w {
                            states.insert(i.key.clone(), s);
                        }
                    }
                    Answer::Done(r)
                })
                .collect();
            last = headers(&p.decide(set.version, &answers));
        }
        let get = |name: &str| {
            last.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(get("Retry-After"), wait, "{extra}: {last:?}");
        assert!(
            get("RateLimit").ends_with(&format!("t={wait}")),
            "{extra}: {last:?}"
        );
    }
}
