//! Shaping end to end: two `sluiced` processes sharing one real Redis, a `leaky_queue` rule
//! of 50 a second with `max_delay: 2s`, and load at five times the rate split across both
//! daemons for three seconds (a bounded number of requests).
//!
//! Every allowed answer's departure is its daemon's decision time (`decided_at_us`, the
//! daemon's clock, which both share: one machine) plus `delay_ms`. `delay_ms` is rounded up
//! to a millisecond, so a computed departure is at most 1 ms after the true one and never
//! before it: consecutive departures are at least the interval less 1 ms apart, and no
//! second holds more than the rate plus one. The excess is refused, with a retry time.

use serde_json::{Value, json};
use sluice_proto::sluice::v1::limiter_client::LimiterClient;
use sluice_testkit::{RedisServer, http_request};
use sluice_tests::common::load::{channel, check_request, grpc_runtime};
use sluice_tests::common::node::start;
use sluice_tests::common::serial;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const RATE: u64 = 50;
const INTERVAL_US: u64 = 1_000_000 / RATE;
const MAX_DELAY_MS: u64 = 2_000;
const RULES: &str = "domain: sms\nrules:\n  - { id: aggregator, key: [user], algorithm: leaky_queue, rate_per_s: 50, max_delay: 2s }\n";

/// One JSON check; `None` when the daemon did not answer 200.
fn check(http: SocketAddr) -> Option<Value> {
    let body = json!({"domain": "sms", "descriptors": {"user": "otp-sender"}}).to_string();
    let r = http_request(
        http,
        "POST",
        "/v1/limits:check",
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .ok()?;
    (r.status == 200)
        .then(|| serde_json::from_slice(&r.body).ok())
        .flatten()
}

/// `per_thread` checks at `rate_per_thread` a second on an absolute schedule.
fn paced(http: SocketAddr, rate_per_thread: f64, per_thread: u32, offset: Duration) -> Vec<Value> {
    let gap = Duration::from_secs_f64(1.0 / rate_per_thread);
    let start = Instant::now() + offset;
    (0..per_thread)
        .filter_map(|n| {
            if let Some(wait) = (start + gap * n).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            check(http)
        })
        .collect()
}

#[test]
fn two_daemons_let_requests_out_at_the_rate() {
    let _serial = serial();
    let redis = match RedisServer::start() {
        Ok(r) => r,
        Err(e) => {
            panic!("this test needs a real redis-server (apt-get install redis-server): {e:#}")
        }
    };
    let a = start(&redis, RULES, "");
    let b = start(&redis, RULES, "");
    // 250 a second for 3 s: four senders of 62.5 a second, two on each daemon.
    let (threads, per_thread) = (4u32, 188u32);
    let rate_per_thread = (5 * RATE) as f64 / f64::from(threads);
    let answers: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let http = if t % 2 == 0 { a.http } else { b.http };
                let offset = Duration::from_secs_f64(f64::from(t) / (5 * RATE) as f64);
                s.spawn(move || paced(http, rate_per_thread, per_thread, offset))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("sender"))
            .collect()
    });
    let sent = u64::from(threads * per_thread);
    assert_eq!(answers.len() as u64, sent, "every check answered");

    let mut departures: Vec<u64> = Vec::new();
    let mut refused = 0u64;
    let mut decided: Vec<u64> = Vec::new();
    for v in &answers {
        let at = v["decided_at_us"].as_u64().expect("decided_at_us");
        let delay = v["delay_ms"].as_u64().expect("delay_ms");
        decided.push(at);
        if v["allowed"] == true {
            assert!(delay <= MAX_DELAY_MS, "delay {delay} ms: {v}");
            departures.push(at + delay * 1_000);
        } else {
            refused += 1;
            assert_eq!(delay, 0, "{v}");
            assert_eq!(v["decided_by"], "aggregator", "{v}");
            assert!(v["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{v}");
        }
    }
    departures.sort_unstable();
    let admitted = departures.len() as u64;
    let gaps: Vec<u64> = departures.windows(2).map(|w| w[1] - w[0]).collect();
    let min_gap = gaps.iter().copied().min().unwrap_or(0);
    let mean_gap = gaps.iter().sum::<u64>() as f64 / gaps.len().max(1) as f64;
    let most_in_a_second = (0..departures.len())
        .map(|i| {
            departures[i..]
                .iter()
                .take_while(|d| **d < departures[i] + 1_000_000)
                .count()
        })
        .max()
        .unwrap_or(0);
    decided.sort_unstable();
    let span_ms = (decided[decided.len() - 1] - decided[0]) / 1_000;
    eprintln!(
        "shaping: {sent} checks over {span_ms} ms on 2 daemons: {admitted} admitted, {refused} refused; \
         departures {:.1} ms apart on average, {:.3} ms at least (interval {} ms); at most {most_in_a_second} in any 1 s",
        mean_gap / 1_000.0,
        min_gap as f64 / 1_000.0,
        INTERVAL_US / 1_000
    );
    assert!(
        min_gap + 1_000 >= INTERVAL_US,
        "departures {min_gap} µs apart, interval {INTERVAL_US} µs"
    );
    assert!(
        most_in_a_second as u64 <= RATE + 1,
        "{most_in_a_second} departures in one second"
    );
    // What fits: the rate over the decisions' span, plus a full queue (2 s of departures)
    // and the one leaving at once. The rest of five times the rate was refused.
    let fits = RATE * (span_ms + MAX_DELAY_MS) / 1_000 + 1;
    assert!(admitted <= fits, "{admitted} admitted, at most {fits} fit");
    assert!(
        admitted >= RATE * 3,
        "{admitted} admitted: the queue ran dry"
    );
    assert_eq!(admitted + refused, sent);
    assert!(refused >= sent / 2, "{refused} of {sent} refused");

    // The gRPC answer carries the delay too: a fresh key's second request waits one interval
    // (less the sub-millisecond between the two decisions, rounded up).
    let rt = grpc_runtime();
    let delays: Vec<u64> = rt.block_on(async {
        let mut client = LimiterClient::new(channel(b.grpc).await);
        let mut out = Vec::new();
        for _ in 0..2 {
            let r = client
                .check(check_request("sms", "grpc-sender"))
                .await
                .expect("a gRPC check");
            assert!(r.get_ref().allowed);
            out.push(r.get_ref().delay_ms);
        }
        out
    });
    assert_eq!(delays[0], 0);
    assert!((1..=INTERVAL_US / 1_000).contains(&delays[1]), "{delays:?}");
}
