//! Hand-written records through [`replay`]: weights, stores, rule identity across sets, the
//! empty window and bad records.

use super::*;
use serde_json::json;

const T0: Micros = 1_800_000_000_000_000;
const S: Micros = 1_000_000;

fn set(version: u64, yaml: &str) -> RuleSet {
    let mut s = sluice_core::rules::parse_yaml(yaml).expect("rules");
    s.version = version;
    s
}

fn bucket(rate: u64, extra: &str) -> RuleSet {
    set(
        1,
        &format!(
            "domain: api\nrules:\n  - {{ id: per-user, key: [user], algorithm: token_bucket, \
             rate: {rate}/1h, burst: {rate} }}\n{extra}"
        ),
    )
}

/// `n` checks of `user`, one record a second, each standing for `weight` checks.
fn records(user: &str, n: u64, weight: u64, store: Option<&str>) -> Vec<LoggedCheck> {
    (0..n)
        .map(|i| {
            LoggedCheck::from_value(
                0,
                json!({"v": 1, "ts": T0 + i * S, "domain": "api", "identity": format!("api|user={user}"),
                       "request_id": format!("{user}-{i}"), "cost": 1, "code": "OK",
                       "descriptors": {"user": user}, "weight": weight, "counts_in": store}),
            )
            .expect("record")
        })
        .collect()
}

fn rule<'r>(r: &'r Report, id: &str) -> &'r RuleReport {
    r.rules
        .iter()
        .find(|x| x.rule == id)
        .expect("rule in report")
}

fn refused(f: &Option<Figures>, identity: &str) -> u64 {
    f.as_ref()
        .and_then(|f| f.refused_by.iter().find(|c| c.identity == identity))
        .map_or(0, |c| c.refused)
}

/// A 10× tightening: 400 checks of a heavy user (40 records of weight 10) and 50 of a light
/// one. The candidate's burst of 100 refuses the heavy user's last 300 (the bucket refills
/// one token in 36 s, less than the 40 s span: at most one more admitted), none of the light
/// user's, and the report says it is an estimate.
#[test]
fn a_tightening_names_who_would_be_refused_and_how_often() {
    let mut recs = records("heavy", 40, 10, None);
    recs.extend(records("light", 50, 1, None));
    let r = replay(
        &recs,
        &bucket(1000, ""),
        &bucket(100, ""),
        Window::default(),
    )
    .expect("replay");
    assert_eq!((r.records, r.checks), (90, 450));
    let pu = rule(&r, "per-user");
    assert_eq!(pu.change, "changed");
    assert_eq!(pu.current.as_ref().map(|f| f.refused), Some(0));
    let heavy = refused(&pu.candidate, "api|user=heavy");
    assert!((299..=300).contains(&heavy), "heavy refused {heavy}");
    assert_eq!(refused(&pu.candidate, "api|user=light"), 0);
    assert_eq!(pu.candidate.as_ref().map(|f| f.identities), Some(1));
    assert_eq!(r.newly_refused.checks, heavy);
    assert_eq!(r.newly_admitted.checks, 0);
    assert!(
        r.note.contains("90 records standing for 450 checks"),
        "{}",
        r.note
    );
}

/// Without the weights (every record one check) the same log shows nobody over the
/// candidate's limit: the undercount the weights are there to prevent.
#[test]
fn without_weights_the_sampled_log_undercounts() {
    let recs = records("heavy", 40, 1, None);
    let r = replay(
        &recs,
        &bucket(1000, ""),
        &bucket(100, ""),
        Window::default(),
    )
    .expect("replay");
    assert_eq!(
        refused(&rule(&r, "per-user").candidate, "api|user=heavy"),
        0
    );
}

/// A rule's count lives in its store: 80 checks in each of two stores stay under a limit
/// of 100 there, while the same 160 in one store go over it.
#[test]
fn stores_are_replayed_apart() {
    let mut recs = records("u", 8, 10, Some("eu"));
    recs.extend(records("u", 8, 10, Some("us")));
    let r = replay(
        &recs,
        &bucket(1000, ""),
        &bucket(100, ""),
        Window::default(),
    )
    .expect("replay");
    assert_eq!(r.stores, vec!["eu".to_string(), "us".to_string()]);
    assert_eq!(r.newly_refused.checks, 0);
    for x in &mut recs {
        x.counts_in = None;
    }
    let r = replay(
        &recs,
        &bucket(1000, ""),
        &bucket(100, ""),
        Window::default(),
    )
    .expect("replay");
    assert!((59..=60).contains(&r.newly_refused.checks), "{r:?}");
}

/// Rules match by id: a new rule has no current figures, a removed rule none in the
/// candidate, and what only it refused is newly admitted.
#[test]
fn new_and_removed_rules() {
    let recs = records("u", 30, 1, None);
    let strict =
        "  - { id: strict, key: [user], algorithm: token_bucket, rate: 10/1h, burst: 10 }\n";
    let r = replay(
        &recs,
        &bucket(1000, strict),
        &bucket(1000, ""),
        Window::default(),
    )
    .expect("replay");
    let s = rule(&r, "strict");
    assert_eq!(s.change, "removed");
    assert!(s.candidate.is_none());
    assert_eq!(refused(&s.current, "api|user=u"), 20);
    assert_eq!(r.newly_admitted.checks, 20);
    assert_eq!(r.newly_refused.checks, 0);
    let r = replay(
        &recs,
        &bucket(1000, ""),
        &bucket(1000, strict),
        Window::default(),
    )
    .expect("replay");
    let s = rule(&r, "strict");
    assert_eq!(s.change, "new");
    assert!(s.current.is_none());
    assert_eq!(r.newly_refused.checks, 20);
    assert_eq!(rule(&r, "per-user").change, "unchanged");
    // An override of the rule is a change of it, and the identity it names is admitted.
    let exempt = "overrides:\n  - { identity: { user: u }, rule: strict, exempt: true }\n";
    let (a, b) = (
        bucket(1000, strict),
        bucket(1000, &format!("{strict}{exempt}")),
    );
    let r = replay(&recs, &a, &b, Window::default()).expect("replay");
    assert_eq!(rule(&r, "strict").change, "changed");
    assert_eq!(rule(&r, "per-user").change, "unchanged");
    assert_eq!(r.newly_admitted.checks, 20);
}

/// A shadow rule's would-refusals are its refusals in the figures, and refuse no check.
#[test]
fn shadow_rules_count_would_refusals() {
    let recs = records("u", 30, 1, None);
    let shadow = set(
        2,
        "domain: api\nrules:\n  - { id: per-user, key: [user], algorithm: token_bucket, \
         rate: 10/1h, burst: 10, mode: shadow }\n",
    );
    let r = replay(&recs, &bucket(1000, ""), &shadow, Window::default()).expect("replay");
    let pu = rule(&r, "per-user");
    assert_eq!(
        pu.candidate.as_ref().map(|f| f.mode.as_str()),
        Some("shadow")
    );
    assert_eq!(refused(&pu.candidate, "api|user=u"), 20);
    assert_eq!(r.newly_refused.checks, 0);
}

/// The window keeps what is in it; one with no records says so.
#[test]
fn the_window_and_an_empty_one() {
    let recs = records("u", 30, 1, None);
    let w = Window {
        since: Some(T0 + 10 * S),
        until: Some(T0 + 20 * S),
    };
    let r = replay(&recs, &bucket(1000, ""), &bucket(100, ""), w).expect("replay");
    assert_eq!(r.records, 10);
    let empty = Window {
        since: Some(T0 + 100 * S),
        until: None,
    };
    let r = replay(&recs, &bucket(1000, ""), &bucket(100, ""), empty).expect("replay");
    assert_eq!((r.records, r.checks), (0, 0));
    assert!(r.note.contains("no decision log records"), "{}", r.note);
}

/// A weight's checks are spread since the identity's previous record of the same kind, or
/// since the window's start for its first record.
#[test]
fn a_weight_is_spread_since_the_previous_record() {
    let mut recs = records("u", 2, 1, None);
    recs[1].weight = 4;
    let d: Vec<Descriptors> = recs
        .iter()
        .map(|r| Descriptors::new(vec![("user".into(), r.descriptors["user"].clone())]).expect("d"))
        .collect();
    let times: Vec<Micros> = expand(&recs, &d, Window::default())
        .iter()
        .map(|c| c.now - T0)
        .collect();
    assert_eq!(times, vec![0, S / 4, S / 2, 3 * S / 4, S]);
    let w = Window {
        since: Some(T0 - S),
        until: None,
    };
    let first: Vec<Micros> = expand(&recs[1..], &d[1..], w)
        .iter()
        .map(|c| c.now)
        .collect();
    assert_eq!(first[0], T0 - S + S / 2, "spread from the window's start");
}

#[test]
fn bad_records_name_the_field() {
    let e = LoggedCheck::from_value(
        3,
        json!({"v": 2, "ts": 1, "domain": "api", "identity": "",
        "cost": 1, "code": "OK", "descriptors": {}}),
    )
    .expect_err("a later format");
    assert!(e.to_string().contains("record 3: v:"), "{e}");
    let e = LoggedCheck::from_value(0, json!({"v": 1, "domain": "api"})).expect_err("no ts");
    assert!(e.to_string().contains("ts"), "{e}");
    let e = LoggedCheck::from_value(
        0,
        json!({"v": 1, "ts": 1, "domain": "api", "identity": "",
        "cost": 1, "code": "OK", "descriptors": {}, "weight": 0}),
    )
    .expect_err("weight 0");
    assert!(e.to_string().contains("weight"), "{e}");
}

#[test]
fn windows_parse_and_name_the_field() {
    let w = Window::parse(None, None, T0).expect("default");
    assert_eq!((w.since, w.until), (Some(T0 - DEFAULT_SINCE), None));
    let w = Window::parse(Some("30m"), Some("10m"), T0).expect("durations");
    assert_eq!(
        (w.since, w.until),
        (Some(T0 - 1_800 * S), Some(T0 - 600 * S))
    );
    let w = Window::parse(Some("5"), Some("9"), T0).expect("epoch");
    assert_eq!((w.since, w.until), (Some(5), Some(9)));
    let e = Window::parse(Some("yesterday"), None, T0).expect_err("bad since");
    assert!(e.to_string().starts_with("since:"), "{e}");
    let e = Window::parse(Some("10m"), Some("30m"), T0).expect_err("until before since");
    assert!(e.to_string().starts_with("until:"), "{e}");
}
