//! `sluiced` on its embedded default, end to end: the README's promise, bad input, rule
//! reloads, gRPC, metrics, SIGTERM.

use serde_json::{Value, json};
use sluice_testkit::{Daemon, cargo_bin, free_ports, http_request};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

struct Running {
    daemon: Daemon,
    http: SocketAddr,
    grpc: SocketAddr,
    rules: PathBuf,
}

const RULES: &str = r#"
domain: public-api
rules:
  - id: burst
    key: [api_key]
    algorithm: token_bucket
    rate_per_s: 1
    burst: 20
  - id: login
    match: { route: "POST /v1/login" }
    key: [user]
    algorithm: sliding_log
    limit: 2
    window: 1m
    headers: retry_only
  - id: trial
    match: { route: "GET /v1/trial" }
    key: [api_key]
    algorithm: fixed_window
    limit: 1
    window: 1m
    mode: shadow
"#;

fn start(rules: &str) -> Running {
    start_with(rules, &[])
}

fn start_with(rules: &str, extra: &[&str]) -> Running {
    let ports = free_ports(2);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let grpc: SocketAddr = ([127, 0, 0, 1], ports[1]).into();
    let dir = std::env::temp_dir().join(format!("sluice-e2e-{}-{}", std::process::id(), ports[0]));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, rules).expect("write rules");
    let bin = cargo_bin("sluiced").expect("sluiced is built (cargo build --workspace --bins)");
    let (http_s, grpc_s) = (http.to_string(), grpc.to_string());
    let mut args = vec![
        "--rules",
        path.to_str().expect("utf-8 path"),
        "--http-addr",
        &http_s,
        "--grpc-addr",
        &grpc_s,
    ];
    args.extend_from_slice(extra);
    let mut daemon = Daemon::spawn(bin, &args, &[("RUST_LOG", "info")]).expect("spawn sluiced");
    daemon
        .wait_http_ok(http, "/healthz", Duration::from_secs(20))
        .expect("sluiced becomes healthy");
    Running {
        daemon,
        http,
        grpc,
        rules: path,
    }
}

fn check(http: SocketAddr, body: &Value) -> (u16, Value) {
    let r = http_request(
        http,
        "POST",
        "/v1/limits:check",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .expect("http request");
    let v: Value = serde_json::from_slice(&r.body).expect("json body");
    (r.status, v)
}

fn key(k: &str) -> Value {
    json!({"domain": "public-api", "descriptors": {"api_key": k}})
}

#[test]
fn twenty_of_twenty_five_then_retry_after_one_and_other_keys_unaffected() {
    let r = start(RULES);
    let mut allowed = 0;
    let mut denials = Vec::new();
    for _ in 0..25 {
        let (status, v) = check(r.http, &key("k_8f2a"));
        assert_eq!(status, 200);
        if v["allowed"] == json!(true) {
            allowed += 1;
        } else {
            denials.push(v);
        }
    }
    // A burst of 25 takes well under a second, so at most one token refills.
    assert!((20..=21).contains(&allowed), "allowed {allowed}");
    assert!(!denials.is_empty());
    for d in &denials {
        assert_eq!(d["code"], "OVER_LIMIT");
        assert_eq!(d["decided_by"], "burst");
        let ms = d["retry_after_ms"].as_u64().expect("retry_after_ms");
        assert!(ms > 0 && ms <= 1000, "retry_after_ms {ms}");
        assert_eq!(d["headers"]["Retry-After"], "1");
        // The sustained rate (1 a second), not the burst: the burst is what `r` shows when full.
        assert_eq!(d["headers"]["RateLimit-Policy"], "\"burst\";q=1;w=1");
        assert_eq!(d["policies"][0]["remaining"], 0);
    }
    let (_, other) = check(r.http, &key("k_other"));
    assert_eq!(other["allowed"], true);
    assert_eq!(other["policies"][0]["remaining"], 19);
    assert!(other["headers"].get("Retry-After").is_none());
}

#[test]
fn retry_only_rules_reveal_nothing_but_retry_after() {
    let r = start(RULES);
    let body =
        json!({"domain": "public-api", "descriptors": {"route": "POST /v1/login", "user": "u1"}});
    for _ in 0..2 {
        assert_eq!(check(r.http, &body).1["allowed"], true);
    }
    let (_, v) = check(r.http, &body);
    assert_eq!(v["allowed"], false);
    let headers = v["headers"].as_object().expect("headers");
    assert_eq!(headers.keys().collect::<Vec<_>>(), vec!["Retry-After"]);
}

#[test]
fn bad_input_is_a_400_with_a_message_never_a_500() {
    let r = start(RULES);
    let long = "x".repeat(300);
    let many: serde_json::Map<String, Value> =
        (0..40).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases: Vec<(&[u8], &str)> = vec![
        (b"{\"domain\":", "invalid check body"),
        (b"not json", "invalid check body"),
        (
            b"{\"domain\":\"public-api\",\"descriptors\":{\"a\":1}}",
            "invalid check body",
        ),
        (b"{\"domain\":\"public-api\",\"cots\":1}", "unknown field"),
        (b"{\"domain\":\"nope\"}", "unknown domain"),
        (
            b"{\"domain\":\"public-api\",\"cost\":-1}",
            "invalid check body",
        ),
        (
            b"{\"domain\":\"public-api\",\"cost\":99999999999}",
            "out of range",
        ),
    ];
    let long_body = json!({"domain": "public-api", "descriptors": {"api_key": long}}).to_string();
    let many_body = json!({"domain": "public-api", "descriptors": many}).to_string();
    let mut all = cases;
    all.push((long_body.as_bytes(), "longer than"));
    all.push((many_body.as_bytes(), "too many descriptors"));
    for (body, want) in all {
        let resp = http_request(r.http, "POST", "/v1/limits:check", &[], body).expect("request");
        let text = resp.text();
        assert_eq!(
            resp.status,
            400,
            "{} -> {text}",
            String::from_utf8_lossy(body)
        );
        assert!(
            text.contains(want),
            "{} -> {text}",
            String::from_utf8_lossy(body)
        );
    }
    // Still serving.
    assert_eq!(check(r.http, &key("k")).0, 200);
}

#[test]
fn a_valid_rules_change_goes_live_and_an_invalid_one_is_refused() {
    let mut r = start(RULES);
    std::fs::write(&r.rules, RULES.replace("rate_per_s: 1", "rate_per_s: 3")).expect("write");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = check(r.http, &key("fresh"));
        if v["policies"][0]["limit"] == 3 {
            assert_eq!(v["rules_version"], 1);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "reload not seen: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(
        &r.rules,
        "domain: public-api\nrules:\n  - { id: x, algorithm: leaky }\n",
    )
    .expect("write");
    r.daemon
        .wait_log_contains("rules file refused", Duration::from_secs(10))
        .expect("refusal is logged");
    assert!(
        r.daemon.logs().contains("x: algorithm: unknown algorithm"),
        "{}",
        r.daemon.logs()
    );
    let (_, v) = check(r.http, &key("fresh2"));
    assert_eq!(
        v["policies"][0]["limit"], 3,
        "the last good rules keep serving"
    );
    // Counted for operators too (the series used to stay at 0 whatever was refused).
    let m = sluice_testkit::Metrics::scrape(r.http).expect("metrics");
    assert_eq!(m.count("sluice_rules_refused_total"), 1);
}

#[test]
fn grpc_check_metrics_and_sigterm() {
    grpc_check_metrics_and_sigterm_with(&[]);
}

/// What a daemon pinned to one CPU runs.
#[test]
fn grpc_check_metrics_and_sigterm_on_a_single_threaded_runtime() {
    grpc_check_metrics_and_sigterm_with(&["--worker-threads", "1"]);
}

fn grpc_check_metrics_and_sigterm_with(extra: &[&str]) {
    use sluice_proto::sluice::v1::{CheckRequest, limiter_client::LimiterClient};
    let mut r = start_with(RULES, extra);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut client = LimiterClient::connect(format!("http://{}", r.grpc))
            .await
            .expect("connect");
        let mut allowed = 0;
        for _ in 0..25 {
            let resp = client
                .check(CheckRequest {
                    domain: "public-api".into(),
                    descriptors: [("api_key".to_string(), "g1".to_string())].into(),
                    cost: None,
                })
                .await
                .expect("check")
                .into_inner();
            if resp.allowed {
                allowed += 1;
            } else {
                assert_eq!(resp.decided_by, "burst");
                assert_eq!(
                    resp.headers.get("Retry-After").map(String::as_str),
                    Some("1")
                );
            }
        }
        assert!((20..=21).contains(&allowed));
        let err = client
            .check(CheckRequest {
                domain: "nope".into(),
                descriptors: Default::default(),
                cost: Some(1),
            })
            .await
            .expect_err("unknown domain");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    });
    let m = sluice_testkit::http_get(r.http, "/metrics")
        .expect("metrics")
        .text();
    assert!(
        m.contains(
            "sluice_decisions_total{domain=\"public-api\",rule=\"burst\",outcome=\"over_limit\"}"
        ),
        "{m}"
    );
    assert!(m.contains("sluice_check_duration_seconds_bucket"));
    let status = r
        .daemon
        .terminate(Duration::from_secs(10))
        .expect("exits on SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(r.daemon.logs().contains("stopped"));
}

#[test]
fn shadow_rules_record_would_be_refusals_and_never_refuse() {
    let mut r = start(RULES);
    let body = json!({"domain": "public-api", "descriptors": {"route": "GET /v1/trial", "api_key": "sh1"}});
    let first = check(r.http, &body).1;
    assert_eq!(first["shadow_denied"], json!([]));
    for _ in 0..2 {
        let (_, v) = check(r.http, &body);
        assert_eq!(v["allowed"], true, "shadow never refuses");
        assert_eq!(v["shadow_denied"], json!(["trial"]));
        assert!(v["headers"].get("Retry-After").is_none());
    }
    r.daemon
        .wait_log_contains("shadow rule would have refused", Duration::from_secs(5))
        .expect("decision log line");
    let logs = r.daemon.logs();
    assert!(
        logs.contains("public-api|api_key=sh1"),
        "the identity is logged: {logs}"
    );
    let m = sluice_testkit::http_get(r.http, "/metrics")
        .expect("metrics")
        .text();
    assert!(
        m.contains("sluice_decisions_total{domain=\"public-api\",rule=\"trial\",outcome=\"shadow_denied\"} 2"),
        "{m}"
    );
}

/// A raw HTTP/2 call to the gRPC port: `(HTTP status, grpc-status, grpc-message, body)`,
/// the request body sent as the given DATA frames.
async fn raw_call(
    send: &mut h2::client::SendRequest<bytes::Bytes>,
    grpc: SocketAddr,
    path: &str,
    content_type: &str,
    frames: Vec<Vec<u8>>,
) -> (u16, Option<String>, Option<String>, Vec<u8>) {
    let (resp, mut stream) = open_call(send, grpc, path, content_type).await;
    let n = frames.len();
    for (i, f) in frames.into_iter().enumerate() {
        stream.send_data(f.into(), i + 1 == n).expect("send data");
        // Separate frames on the wire, not one buffered write.
        tokio::task::yield_now().await;
    }
    read_answer(resp).await
}

/// Opens a call's stream (its headers sent, its body still open).
async fn open_call(
    send: &h2::client::SendRequest<bytes::Bytes>,
    grpc: SocketAddr,
    path: &str,
    content_type: &str,
) -> (h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>) {
    let req = http::Request::post(format!("http://{grpc}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(())
        .expect("request");
    let mut ready = send.clone().ready().await.expect("connection ready");
    ready.send_request(req, false).expect("send")
}

/// A call's answer: `(HTTP status, grpc-status, grpc-message, body)`, the status and message
/// from the trailers when there are any.
async fn read_answer(
    resp: h2::client::ResponseFuture,
) -> (u16, Option<String>, Option<String>, Vec<u8>) {
    let resp = resp.await.expect("response");
    let status = resp.status().as_u16();
    let text = |h: &http::HeaderMap, k: &str| {
        h.get(k)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let mut grpc_status = text(resp.headers(), "grpc-status");
    let mut message = text(resp.headers(), "grpc-message");
    let mut body = resp.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("data");
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    if let Some(t) = body.trailers().await.expect("trailers") {
        grpc_status = text(&t, "grpc-status");
        message = text(&t, "grpc-message");
    }
    (status, grpc_status, message, data)
}

fn framed(flag: u8, msg: &[u8]) -> Vec<u8> {
    let mut b = vec![flag];
    b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// The gRPC port is Sluice's own lean HTTP/2 server: what gRPC clients rely on at the wire
/// (a message split over frames, trailers-only errors with their codes, HTTP errors for
/// non-gRPC requests), and a connection left open does not hold up SIGTERM.
#[test]
fn the_grpc_port_keeps_the_grpc_wire_rules() {
    use prost::Message as _;
    use sluice_proto::sluice::v1::{CheckRequest, CheckResponse};
    let mut r = start(RULES);
    let grpc = r.grpc;
    // Multi-threaded, so the client's connection task keeps answering (the server's GOAWAY
    // and PING) after `block_on` returns, as a live client would.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let idle = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(grpc).await.expect("connect");
        let (mut send, conn) = h2::client::handshake(tcp).await.expect("handshake");
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let check = CheckRequest {
            domain: "public-api".into(),
            descriptors: [("api_key".to_string(), "wire".to_string())].into(),
            cost: None,
        }
        .encode_to_vec();
        let path = "/sluice.v1.Limiter/Check";
        // One message over three DATA frames, cut inside the prefix and inside the message.
        let whole = framed(0, &check);
        let frames = vec![
            whole[..3].to_vec(),
            whole[3..9].to_vec(),
            whole[9..].to_vec(),
        ];
        let (status, code, _, body) =
            raw_call(&mut send, grpc, path, "application/grpc", frames).await;
        assert_eq!((status, code.as_deref()), (200, Some("0")));
        let resp = CheckResponse::decode(&body[5..]).expect("a CheckResponse");
        assert!(resp.allowed);
        assert_eq!(resp.decided_by, "");
        // `application/grpc+proto` is gRPC too.
        let (_, code, _, _) = raw_call(
            &mut send,
            grpc,
            path,
            "application/grpc+proto",
            vec![framed(0, &check)],
        )
        .await;
        assert_eq!(code.as_deref(), Some("0"));
        // Errors: trailers-only, with the code and a percent-encoded message.
        let cases: [(&str, &str, Vec<Vec<u8>>, &str); 5] = [
            (
                "/sluice.v1.Limiter/Nope",
                "application/grpc",
                vec![framed(0, &check)],
                "12",
            ),
            (path, "application/grpc", vec![framed(1, &check)], "12"),
            (
                path,
                "application/grpc",
                vec![framed(0, b"\xff\xff\xff")],
                "13",
            ),
            (path, "application/grpc", vec![check.clone()], "13"),
            (
                path,
                "application/grpc",
                vec![framed(0, &CheckRequest::default().encode_to_vec())],
                "3",
            ),
        ];
        for (p, ct, frames, want) in cases {
            let (status, code, message, body) = raw_call(&mut send, grpc, p, ct, frames).await;
            assert_eq!(
                (status, code.as_deref()),
                (200, Some(want)),
                "{p}: {message:?}"
            );
            assert!(
                message.is_some_and(|m| !m.is_empty()),
                "{p}: a message says why"
            );
            assert!(body.is_empty());
        }
        // Not gRPC at all: an HTTP error, as gRPC servers answer.
        let (status, code, _, _) = raw_call(
            &mut send,
            grpc,
            path,
            "application/json",
            vec![b"{}".to_vec()],
        )
        .await;
        assert_eq!((status, code), (415, None));
        // The connection stays open, idle, while the daemon is told to stop: it is closed
        // (GOAWAY) without waiting for the drain timeout.
        (send, driver)
    });
    let status = r
        .daemon
        .terminate(Duration::from_secs(10))
        .expect("exits on SIGTERM with a connection open");
    assert!(status.success(), "{status:?}");
    assert!(
        !r.daemon.logs().contains("drain timed out"),
        "{}",
        r.daemon.logs()
    );
    drop(idle);
}

/// A gateway's burst: 1,000 calls at once on one connection, each ending with an empty DATA
/// frame after its message (as grpc-go sends a unary request). Every message frame waits in
/// the server's h2 until its call reads it, and h2 tears down a connection whose unread small
/// frames exceed its budget: the daemon's window must leave room for all of them.
#[test]
fn a_burst_of_calls_ending_in_empty_frames_keeps_its_connection() {
    use prost::Message as _;
    use sluice_proto::sluice::v1::CheckRequest;
    let r = start(RULES);
    let grpc = r.grpc;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(grpc).await.expect("connect");
        // The client's own budget is large: the test is about the server's.
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(16 << 20)
            .handshake::<_, bytes::Bytes>(tcp)
            .await
            .expect("handshake");
        let driver = tokio::spawn(conn);
        let mut pending = Vec::new();
        for i in 0..1000 {
            let msg = CheckRequest {
                domain: "public-api".into(),
                descriptors: [("api_key".to_string(), format!("burst{i}"))].into(),
                cost: None,
            }
            .encode_to_vec();
            let (resp, mut stream) =
                open_call(&send, grpc, "/sluice.v1.Limiter/Check", "application/grpc").await;
            stream
                .send_data(framed(0, &msg).into(), false)
                .expect("message");
            stream
                .send_data(bytes::Bytes::new(), true)
                .expect("end of stream");
            pending.push((resp, stream));
        }
        let mut answered = 0;
        for (resp, _stream) in pending {
            // A dropped connection fails here ("response"): every call must be answered.
            let (status, code, _, body) = read_answer(resp).await;
            assert_eq!((status, code.as_deref()), (200, Some("0")));
            assert!(body.len() > 5, "a CheckResponse");
            answered += 1;
        }
        assert_eq!(answered, 1000);
        drop(send);
        let _ = driver.await;
    });
}

#[test]
fn networks_anonymous_traffic_route_prefixes_and_costs() {
    use sluice_proto::sluice::v1::{CheckRequest, limiter_client::LimiterClient};
    let r = start(
        r#"
domain: public-api
rules:
  - { id: anon, match: { api_key: { absent: true } }, key: [ip/64], algorithm: fixed_window, limit: 2, window: 1m }
  - { id: admin, match: { route: { prefix: "GET /v1/admin/" } }, key: [api_key], algorithm: fixed_window, limit: 1, window: 1m }
  - { id: units, key: [api_key], algorithm: fixed_window, limit: 10, window: 1m, cost: { by: route, values: { "GET /v1/export": 5 } } }
"#,
    );
    let ask = |d: Value| check(r.http, &json!({"domain": "public-api", "descriptors": d}));
    let ids = |v: &Value| -> Vec<String> {
        v["policies"]
            .as_array()
            .expect("policies")
            .iter()
            .map(|p| p["id"].as_str().expect("id").to_string())
            .collect()
    };
    // One host rotating through its /64 is one anonymous identity.
    for ip in ["2001:db8::1", "2001:db8::ffff:1"] {
        let (status, v) = ask(json!({"ip": ip}));
        assert_eq!((status, &v["allowed"]), (200, &json!(true)), "{ip}: {v}");
        assert_eq!(ids(&v), ["anon"]);
    }
    let (_, v) = ask(json!({"ip": "2001:db8::2"}));
    assert_eq!(v["allowed"], false, "{v}");
    assert_eq!(v["decided_by"], "anon", "{v}");
    assert_eq!(ask(json!({"ip": "2001:db8:0:1::1"})).1["allowed"], true);
    // With an API key the anonymous rule does not apply.
    let (_, v) = ask(json!({"ip": "2001:db8::3", "api_key": "k1"}));
    assert_eq!(
        (ids(&v), &v["allowed"]),
        (vec!["units".to_string()], &json!(true))
    );
    // No address where a rule counts a network: a 400 naming it.
    let (status, v) = ask(json!({"ip": "not-an-ip"}));
    assert_eq!(status, 400, "{v}");
    assert!(v.to_string().contains("must be an IP address"), "{v}");
    // An export costs 5 of the 10.
    let export = json!({"api_key": "c1", "route": "GET /v1/export"});
    for left in [5, 0] {
        let (_, v) = ask(export.clone());
        assert_eq!(v["allowed"], true, "{v}");
        assert_eq!(v["policies"][0]["remaining"], left, "{v}");
    }
    let (_, v) = ask(export.clone());
    assert_eq!(v["decided_by"], "units", "{v}");
    let (status, v) = check(
        r.http,
        &json!({"domain": "public-api", "descriptors": export, "cost": 300_000_000}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(v.to_string().contains("is above"), "{v}");
    // A route prefix.
    let admin = json!({"api_key": "a1", "route": "GET /v1/admin/users"});
    assert_eq!(ids(&ask(admin.clone()).1), ["admin", "units"]);
    assert_eq!(ask(admin).1["decided_by"], "admin");
    assert_eq!(
        ids(&ask(json!({"api_key": "a1", "route": "GET /v1/users"})).1),
        ["units"]
    );
    // gRPC answers the bad address as INVALID_ARGUMENT.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut client = LimiterClient::connect(format!("http://{}", r.grpc))
            .await
            .expect("connect");
        let err = client
            .check(CheckRequest {
                domain: "public-api".into(),
                descriptors: [("ip".to_string(), "300.1.1.1".to_string())].into(),
                cost: None,
            })
            .await
            .expect_err("no address");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("must be an IP address"), "{err:?}");
    });
}
