//! `window_start: first_request` end to end: two real `sluiced` processes sharing one real
//! Redis, rules of 3 requests per 2 s.
//!
//! 1. `fixed_window`: client A's first request, then 0.7 s later client B's, both driven over
//!    their limit alternating between the daemons. Each key's refusals count to its own first
//!    request's decision time plus the window, so A's and B's resets lie exactly their first
//!    requests apart; the same rule with the default epoch start sends both back at one
//!    boundary, a multiple of the window. Polled on the daemon that did not see its first
//!    request, each key is refused up to its own window end and admitted from it, A while B
//!    is still refused; the re-admission starts the key's next window.
//! 2. `sliding_window`: the same reset relation (the wait into the next window, where the
//!    full window before still weighs in) on both daemons, and A's re-admission on the other
//!    daemon no earlier than it, in the window that goes on from its own origin.
//! 3. The state is the rule key itself in Redis (`"start count"`, `"start cur prev"`), its
//!    start the first request's decision time; the epoch rule keeps a key per window start.
//!
//! Every expectation is derived from the daemons' own answers: `decided_at_us` (the daemon's
//! clock at the decision, the `now` it gives the store) and the refusals' `retry_after_ms`
//! (µs rounded up to ms), `reset_s`, `Retry-After` and `X-RateLimit-Reset` (rounded up to
//! seconds). Waits are for events (an admission), bounded by a request count. It fails if a
//! key's window were the epoch's (the relations below name the key's own end, and the keys'
//! ends would coincide), if one daemon kept its own window state, or if a key came back early.

use serde_json::{Value, json};
use sluice_testkit::{RedisServer, http_request};
use sluice_tests::common::node::{Node, start};
use sluice_tests::common::serial;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const LIMIT: u64 = 3;
const WINDOW_US: u64 = 2_000_000;
/// Between A's first request and B's.
const APART: Duration = Duration::from_millis(700);
/// Between two polls while waiting for a re-admission (pacing only).
const POLL: Duration = Duration::from_millis(20);
/// Polls before a wait is a failure: 12 s, far more than the 2.7 s waited for.
const MAX_POLLS: usize = 600;

const RULES: &str = "domain: first
rules:
  - { id: fw, key: [user], algorithm: fixed_window, limit: 3, window: 2s, window_start: first_request }
---
domain: epoch
rules:
  - { id: fw, key: [user], algorithm: fixed_window, limit: 3, window: 2s }
---
domain: sliding
rules:
  - { id: sw, key: [user], algorithm: sliding_window, limit: 3, window: 2s, window_start: first_request }
";

/// One check's answer, as the JSON API gave it.
#[derive(Debug, Clone)]
struct Answer {
    /// Index of the daemon that answered.
    daemon: usize,
    allowed: bool,
    /// `decided_at_us`.
    at: u64,
    retry_ms: u64,
    /// The policy's `reset_s`.
    reset_s: u64,
    json: Value,
}

impl Answer {
    /// The end of the wait it reports, on the daemon's clock, to the ms it is rounded to.
    fn retry_at(&self) -> u64 {
        self.at + self.retry_ms * 1_000
    }
}

fn check(nodes: &[Node], daemon: usize, domain: &str, user: &str) -> Answer {
    let body = json!({"domain": domain, "descriptors": {"user": user}}).to_string();
    let r = http_request(
        nodes[daemon].http,
        "POST",
        "/v1/limits:check",
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .expect("a check over loopback");
    assert_eq!(r.status, 200, "check {domain}/{user}: {}", r.text());
    let json: Value = serde_json::from_slice(&r.body).expect("the check answer is JSON");
    let num = |v: &Value, what: &str| v.as_u64().unwrap_or_else(|| panic!("{what}: {json}"));
    Answer {
        daemon,
        allowed: json["allowed"]
            .as_bool()
            .unwrap_or_else(|| panic!("allowed: {json}")),
        at: num(&json["decided_at_us"], "decided_at_us"),
        retry_ms: num(&json["retry_after_ms"], "retry_after_ms"),
        reset_s: num(&json["policies"][0]["reset_s"], "policies[0].reset_s"),
        json,
    }
}

/// A header of the answer as a number.
fn header(a: &Answer, name: &str) -> u64 {
    a.json["headers"][name]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("header {name}: {}", a.json))
}

/// A refusal counts to `end` (µs, the daemon's clock): its wait is `end - decided_at`
/// rounded up to a ms, and `reset_s`, `Retry-After` and `X-RateLimit-Reset` are that wait
/// rounded up to a second (`decision::status`, `reset_secs`, `headers_of`).
fn assert_refused_until(a: &Answer, rule: &str, end: u64, what: &str) {
    assert!(!a.allowed, "{what}: refused at {}: {}", a.at, a.json);
    assert_eq!(a.json["decided_by"], rule, "{what}: {}", a.json);
    assert!(a.at < end, "{what}: refused at {} µs, end {end}", a.at);
    let want_ms = (end - a.at).div_ceil(1_000);
    assert_eq!(
        a.retry_ms,
        want_ms,
        "{what}: refused on daemon {} at {} µs: retry_after_ms {} but the window ends at {end} µs, {} µs later",
        a.daemon,
        a.at,
        a.retry_ms,
        end - a.at
    );
    let secs = want_ms.div_ceil(1_000).max(1);
    assert_eq!(a.reset_s, secs, "{what}: reset_s: {}", a.json);
    assert_eq!(header(a, "Retry-After"), secs, "{what}: {}", a.json);
    assert_eq!(header(a, "X-RateLimit-Reset"), secs, "{what}: {}", a.json);
}

/// The key's Redis value, split on spaces; `None` when absent.
fn stored(redis: &RedisServer, key: &str) -> Option<Vec<u64>> {
    let v = redis.cmd(&["GET", key]).expect("GET over loopback");
    (v != "(nil)").then(|| {
        v.split(' ')
            .map(|n| n.parse().unwrap_or_else(|_| panic!("{key} holds {v:?}")))
            .collect()
    })
}

/// The Redis keys matching `pattern`, sorted.
fn keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    let v = redis.cmd(&["KEYS", pattern]).expect("KEYS over loopback");
    let mut k: Vec<String> = v
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    k.sort();
    k
}

/// Sleeps until `at`, if it is still ahead (pacing only).
fn sleep_until(at: Instant) {
    if let Some(d) = at.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

/// Returns just after an epoch window boundary (this machine's clock, the daemons' too), so
/// the 0.7 s between A and B and their drive fit in one epoch window, as the epoch rule's
/// comparison needs (it checks that they did).
fn just_after_an_epoch_boundary() {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after the epoch")
        .as_micros() as u64;
    let into = now % WINDOW_US;
    if into > 100_000 {
        std::thread::sleep(Duration::from_micros(WINDOW_US - into + 20_000));
    }
}

/// Drives each `(user, domain)` over its limit, alternating daemons: 2 × LIMIT checks each.
/// `first` is the daemon that made each user's first request: the next goes to the other.
fn drive(nodes: &[Node], users: &[(&str, usize)], domains: &[&str]) -> Vec<(String, Answer)> {
    let mut out = Vec::new();
    for round in 0..2 * LIMIT as usize {
        for &(user, first) in users {
            for &domain in domains {
                let d = (first + 1 + round) % 2;
                out.push((format!("{domain}/{user}"), check(nodes, d, domain, user)));
            }
        }
    }
    out
}

#[test]
fn each_key_counts_from_its_own_first_request_on_both_daemons() {
    let _serial = serial();
    let redis = match RedisServer::start() {
        Ok(r) => r,
        Err(e) => {
            panic!("this test needs a real redis-server (apt-get install redis-server): {e:#}")
        }
    };
    let nodes = [start(&redis, RULES, ""), start(&redis, RULES, "")];

    // 1. fixed_window. A's first request on daemon 0, B's 0.7 s later on daemon 1, each in
    // both domains (first_request, epoch).
    just_after_an_epoch_boundary();
    let a_sent = Instant::now();
    let a0 = check(&nodes, 0, "first", "a");
    let a0_epoch = check(&nodes, 0, "epoch", "a");
    sleep_until(a_sent + APART);
    let b0 = check(&nodes, 1, "first", "b");
    let b0_epoch = check(&nodes, 1, "epoch", "b");
    for f in [&a0, &a0_epoch, &b0, &b0_epoch] {
        assert!(f.allowed, "a first request: {}", f.json);
    }
    let (end_a, end_b) = (a0.at + WINDOW_US, b0.at + WINDOW_US);
    let driven = drive(&nodes, &[("a", 0), ("b", 1)], &["first", "epoch"]);

    let mut admitted = std::collections::BTreeMap::<String, u64>::new();
    let mut last_refusal = std::collections::BTreeMap::<String, Answer>::new();
    let epoch_end = |at: u64| (at / WINDOW_US + 1) * WINDOW_US;
    for (what, a) in &driven {
        if a.allowed {
            *admitted.entry(what.clone()).or_default() += 1;
            continue;
        }
        match what.as_str() {
            "first/a" => assert_refused_until(a, "fw", end_a, what),
            "first/b" => assert_refused_until(a, "fw", end_b, what),
            _ => assert_refused_until(a, "fw", epoch_end(a.at), what),
        }
        last_refusal.insert(what.clone(), a.clone());
    }
    // Counted together by both daemons: the first request and LIMIT - 1 more, whichever
    // daemon they went to; every key was refused on both.
    for what in ["first/a", "first/b", "epoch/a", "epoch/b"] {
        assert_eq!(
            admitted.get(what).copied().unwrap_or(0),
            LIMIT - 1,
            "{what}"
        );
        for d in 0..2 {
            assert!(
                driven
                    .iter()
                    .any(|(w, a)| w == what && !a.allowed && a.daemon == d),
                "{what} refused on daemon {d}"
            );
        }
    }
    let (ra, rb) = (&last_refusal["first/a"], &last_refusal["first/b"]);
    let (ea, eb) = (&last_refusal["epoch/a"], &last_refusal["epoch/b"]);
    // Under the epoch rule every decision so far fell in one window (the start arranged it;
    // a stall past the boundary would make this comparison meaningless, not pass it).
    let epoch_window = a0_epoch.at / WINDOW_US;
    assert!(
        [&b0_epoch, ea, eb]
            .iter()
            .all(|x| x.at / WINDOW_US == epoch_window),
        "the epoch rule's checks spanned a window boundary ({} .. {} µs): the machine stalled",
        a0_epoch.at,
        eb.at
    );
    assert_eq!(epoch_end(ea.at), epoch_end(eb.at));
    assert_eq!(epoch_end(ea.at) % WINDOW_US, 0);
    // A's and B's reported resets lie their first requests apart (to the ms each is rounded
    // up to); the epoch rule's coincide (to that ms).
    let apart_us = b0.at - a0.at;
    let reported_apart = rb.retry_at() as i64 - ra.retry_at() as i64;
    assert!(
        (reported_apart - apart_us as i64).abs() < 1_000,
        "resets {reported_apart} µs apart, first requests {apart_us} µs"
    );
    assert!(
        (eb.retry_at() as i64 - ea.retry_at() as i64).abs() < 1_000,
        "epoch resets at {} and {}",
        ea.retry_at(),
        eb.retry_at()
    );

    // 3. The state is the rule key itself: the key's own start (the first request's decision
    // time) and its count; no window index. The epoch rule keeps one key per window start.
    assert_eq!(
        stored(&redis, "sl:{first|user=a}:f:fw"),
        Some(vec![a0.at, LIMIT])
    );
    assert_eq!(
        stored(&redis, "sl:{first|user=b}:f:fw"),
        Some(vec![b0.at, LIMIT])
    );
    assert_eq!(
        keys(&redis, "sl:{first|user=a}:f:fw:*"),
        Vec::<String>::new()
    );
    let epoch_start = epoch_window * WINDOW_US;
    assert_eq!(
        keys(&redis, "sl:{epoch|user=a}:f:fw*"),
        vec![format!("sl:{{epoch|user=a}}:f:fw:{epoch_start}")]
    );

    // Polled on the daemon that did not see its first request (A on 1, B on 0): refused up to
    // its own end, admitted from it; A admitted while B is still refused.
    let mut back: [Option<Answer>; 2] = [None, None];
    let mut b_out_after_a_back = None;
    for n in 0.. {
        assert!(
            n < MAX_POLLS,
            "not re-admitted after {MAX_POLLS} polls: {back:?}"
        );
        for (i, (user, daemon, end)) in [("a", 1, end_a), ("b", 0, end_b)].into_iter().enumerate() {
            if back[i].is_some() {
                continue;
            }
            let p = check(&nodes, daemon, "first", user);
            if p.allowed {
                assert!(
                    p.at >= end,
                    "{user} re-admitted at {} µs, {} µs before its window's end {end}",
                    p.at,
                    end - p.at
                );
                back[i] = Some(p);
            } else {
                assert_refused_until(&p, "fw", end, &format!("polled {user}"));
                if i == 1 && back[0].is_some() {
                    b_out_after_a_back.get_or_insert(p.at);
                }
            }
        }
        if back.iter().all(Option::is_some) {
            break;
        }
        std::thread::sleep(POLL);
    }
    let [Some(a_back), Some(b_back)] = back else {
        unreachable!("the loop ends when both are back")
    };
    let b_out = b_out_after_a_back.expect("B was still refused after A was re-admitted");
    // The re-admission starts A's next window, from its own decision time, and both daemons
    // count in it: two more admitted (on daemon 0, then 1), then refused until its end.
    assert_eq!(
        stored(&redis, "sl:{first|user=a}:f:fw"),
        Some(vec![a_back.at, 1])
    );
    let next_end = a_back.at + WINDOW_US;
    for (k, d) in [0, 1, 0, 1].into_iter().enumerate() {
        let a = check(&nodes, d, "first", "a");
        if (k as u64) < LIMIT - 1 {
            assert!(a.allowed, "A in its next window, daemon {d}: {}", a.json);
        } else {
            assert_refused_until(&a, "fw", next_end, "A's next window");
        }
    }
    eprintln!(
        "fixed_window, first_request: first requests {:.3} ms apart; refused until {} (A) and {} (B) \
         µs, {:.3} ms apart as reported; epoch rule: both until {} µs ({:.3} ms apart as reported). \
         A back at +{} µs past its end (daemon 1), B at +{} µs (daemon 0), B still refused {:.3} ms \
         after A was back, back {:.3} ms after A",
        apart_us as f64 / 1e3,
        end_a,
        end_b,
        reported_apart as f64 / 1e3,
        epoch_end(ea.at),
        (eb.retry_at() as i64 - ea.retry_at() as i64) as f64 / 1e3,
        a_back.at - end_a,
        b_back.at - end_b,
        (b_out - a_back.at) as f64 / 1e3,
        (b_back.at - a_back.at) as f64 / 1e3,
    );

    // 2. sliding_window. A's 3 fill its first window; from there a refusal waits into the
    // next window until the full window before weighs little enough: with cur = LIMIT and
    // probe 1, r = (LIMIT - 1)·w_ms / LIMIT ms of the window may remain, so the wait ends
    // `WINDOW + (WINDOW - ((r + 1)·1000 - 1))` after the origin (algo::sliding_window).
    let w_ms = WINDOW_US / 1_000;
    let r = (LIMIT - 1) * w_ms / LIMIT;
    let until = WINDOW_US + (WINDOW_US - ((r + 1) * 1_000 - 1));
    let a_sent = Instant::now();
    let sa = check(&nodes, 0, "sliding", "a");
    sleep_until(a_sent + APART);
    let sb = check(&nodes, 1, "sliding", "b");
    assert!(sa.allowed && sb.allowed, "{} {}", sa.json, sb.json);
    let (until_a, until_b) = (sa.at + until, sb.at + until);
    let driven = drive(&nodes, &[("a", 0), ("b", 1)], &["sliding"]);
    let mut admitted = [0u64; 2];
    for (what, a) in &driven {
        let (i, end) = if what == "sliding/a" {
            (0, until_a)
        } else {
            (1, until_b)
        };
        if a.allowed {
            admitted[i] += 1;
        } else {
            assert_refused_until(a, "sw", end, what);
        }
    }
    assert_eq!(admitted, [LIMIT - 1; 2], "counted together by both daemons");
    for d in 0..2 {
        assert!(
            driven.iter().any(|(_, a)| !a.allowed && a.daemon == d),
            "sliding refused on daemon {d}"
        );
    }
    assert_eq!(
        stored(&redis, "sl:{sliding|user=a}:w:sw"),
        Some(vec![sa.at, LIMIT, 0])
    );
    assert_eq!(
        keys(&redis, "sl:{sliding|user=a}:w:sw:*"),
        Vec::<String>::new()
    );
    // A polled on daemon 1: refused until its end, then admitted in the window that goes on
    // from its origin, `[origin + len, origin + 2·len)`, the full window before its previous.
    let mut polls = 0;
    let sa_back = loop {
        assert!(
            polls < MAX_POLLS,
            "sliding A not re-admitted after {MAX_POLLS} polls"
        );
        polls += 1;
        let p = check(&nodes, 1, "sliding", "a");
        if p.allowed {
            break p;
        }
        assert_refused_until(&p, "sw", until_a, "polled sliding A");
        std::thread::sleep(POLL);
    };
    assert!(
        sa_back.at >= until_a,
        "sliding A re-admitted at {} µs, {} µs before {until_a}",
        sa_back.at,
        until_a - sa_back.at
    );
    assert_eq!(
        stored(&redis, "sl:{sliding|user=a}:w:sw"),
        Some(vec![sa.at + WINDOW_US, 1, LIMIT])
    );
    eprintln!(
        "sliding_window, first_request: first requests {:.3} ms apart; refused until origin + {} µs \
         (A {until_a}, B {until_b}); A back at +{} µs past it on daemon 1 after {polls} polls",
        (sb.at - sa.at) as f64 / 1e3,
        until,
        sa_back.at - until_a,
    );
}
