//! Resource limits and self-protection, end to end: real `sluiced` processes, on the wire.
//!
//! What one client may make the daemon hold (a big message, bodiless streams, a slow-loris
//! header, a body that never ends, connections past the cap), a caller's expired deadline,
//! and the bound on checks in flight with a stalled Redis. Every assertion is on an answer or
//! a counter in `/metrics`; the only waits are for events, each with a generous bound that
//! turns a hang into a failure.

use prost::Message as _;
use serde_json::Value;
use sluice_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice_proto::sluice::v1::CheckRequest;
use sluice_testkit::grpc_wire::{call, handshake, open, runtime};
use sluice_testkit::{
    Daemon, Metrics, RedisServer, TempDir, cargo_bin, free_ports, http_get, http_request,
};
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const RULES: &str = r#"
domain: api
rules:
  - id: per-key
    key: [api_key]
    algorithm: token_bucket
    rate_per_s: 1000
    burst: 1000
  - id: per-user
    match: { envoy.keys: user }
    key: [user]
    algorithm: token_bucket
    rate_per_s: 1000
    burst: 1000
"#;

/// Turns a hang into a failure; never an assertion on how long something took.
const HANG: Duration = Duration::from_secs(60);

struct Running {
    _daemon: Daemon,
    // After the daemon: its config is removed once it is gone.
    _dir: TempDir,
    http: SocketAddr,
    grpc: SocketAddr,
    /// The gRPC port as a request URI's scheme and authority, for the wire calls.
    base: String,
    admin: SocketAddr,
}

/// A daemon on the memory store with `extra` appended to its config file.
fn start(extra: &str) -> Running {
    let ports = free_ports(3);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let grpc: SocketAddr = ([127, 0, 0, 1], ports[1]).into();
    let admin: SocketAddr = ([127, 0, 0, 1], ports[2]).into();
    let bin = cargo_bin("sluiced").expect("sluiced is built (cargo build -p sluiced --bins)");
    let dir = TempDir::new(&format!("limits-{}", ports[0])).expect("temp dir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("write rules");
    let config = dir.path().join("sluiced.yaml");
    std::fs::write(
        &config,
        format!(
            "http_addr: {http}\ngrpc_addr: {grpc}\nadmin_addr: {admin}\nrules: {}\n{extra}",
            rules.display()
        ),
    )
    .expect("write config");
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--config").arg(&config).env("RUST_LOG", "info");
    let mut daemon = Daemon::from_command(cmd).expect("spawn sluiced");
    daemon
        .wait_http_ok(http, "/healthz", Duration::from_secs(20))
        .expect("sluiced becomes healthy");
    Running {
        _daemon: daemon,
        _dir: dir,
        http,
        grpc,
        base: format!("http://{grpc}"),
        admin,
    }
}

/// The value of one series in `/metrics`, 0 when absent.
fn metric(http: SocketAddr, series: &str) -> u64 {
    Metrics::scrape(http)
        .expect("metrics")
        .count_or_zero(series)
}

/// Polls `/metrics` until `series` reaches `want`.
fn wait_metric(http: SocketAddr, series: &str, want: u64) {
    let until = Instant::now() + HANG;
    loop {
        let v = metric(http, series);
        if v >= want {
            assert_eq!(v, want, "{series}");
            return;
        }
        assert!(Instant::now() < until, "{series} stayed at {v}, not {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn check_msg(key: &str) -> Vec<u8> {
    CheckRequest {
        domain: "api".into(),
        descriptors: [("api_key".to_string(), key.to_string())].into(),
        cost: None,
    }
    .encode_to_vec()
}

fn rls_msg(user: &str) -> Vec<u8> {
    RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
    .encode_to_vec()
}

const CHECK: &str = "/sluice.v1.Limiter/Check";
const RLS: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// An HTTP/2 connection to the gRPC port, its I/O on its own task; its windows take a
/// message near the 4 MiB cap in one go.
async fn connect(grpc: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(grpc).await.expect("connect");
    let mut builder = h2::client::Builder::new();
    builder
        .initial_window_size(8 << 20)
        .initial_connection_window_size(16 << 20);
    handshake(tcp, &builder).await.expect("handshake")
}

#[test]
fn a_message_over_the_cap_is_resource_exhausted_and_the_connection_keeps_serving() {
    let r = start("");
    let grpc = r.grpc;
    let base = r.base.as_str();
    let rt = runtime().expect("runtime");
    rt.block_on(async {
        let send = connect(grpc).await;
        // A valid CheckRequest just under 4 MiB (tonic's default cap): the daemon must refuse
        // it from its prefix.
        let big = CheckRequest {
            domain: "api".into(),
            descriptors: [("api_key".to_string(), "x".repeat((4 << 20) - 64))].into(),
            cost: None,
        }
        .encode_to_vec();
        let code = tokio::time::timeout(HANG, call(&send, base, CHECK, &[], &big))
            .await
            .expect("answered")
            .expect("a grpc-status");
        assert_eq!(code, "8", "RESOURCE_EXHAUSTED");
        // The same connection still serves.
        let ok = call(&send, base, CHECK, &[], &check_msg("after"))
            .await
            .expect("a grpc-status");
        assert_eq!(ok, "0");
    });
    assert_eq!(
        metric(r.http, "sluice_requests_too_large_total{port=\"grpc\"}"),
        1
    );
    assert_eq!(metric(r.http, "sluice_checks_total{code=\"OK\"}"), 1);
}

#[test]
fn streams_that_never_send_their_body_are_reset_and_bounded() {
    let r = start("");
    let grpc = r.grpc;
    let base = r.base.as_str();
    let rt = runtime().expect("runtime");
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(grpc).await.expect("connect");
        let (send, mut conn) = h2::client::handshake(tcp).await.expect("handshake");
        // Drive the connection until the server's SETTINGS are in.
        let mut send = send;
        let probe = async {
            let c = call(&send, base, CHECK, &[], &check_msg("probe"))
                .await
                .expect("a grpc-status");
            assert_eq!(c, "0");
        };
        tokio::select! {
            _ = &mut conn => panic!("connection ended"),
            () = probe => {}
        }
        assert_eq!(
            conn.max_concurrent_send_streams(),
            1024,
            "the server bounds the streams a connection may open"
        );
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut bodiless = Vec::new();
        for _ in 0..20 {
            bodiless.push(open(&send, base, CHECK, &[]).await.expect("a stream"));
        }
        // While they hang, other calls on the connection are answered.
        assert_eq!(
            call(&send, base, CHECK, &[], &check_msg("meanwhile"))
                .await
                .expect("a grpc-status"),
            "0"
        );
        for (resp, _stream) in bodiless {
            let err = tokio::time::timeout(HANG, resp)
                .await
                .expect("a bodiless stream is reset, not left open")
                .expect_err("reset, not answered");
            assert_eq!(err.reason(), Some(h2::Reason::CANCEL), "{err}");
        }
        send = send.ready().await.expect("the connection stays open");
        assert_eq!(
            call(&send, base, CHECK, &[], &check_msg("after"))
                .await
                .expect("a grpc-status"),
            "0"
        );
    });
    assert_eq!(
        metric(r.http, "sluice_request_body_timeouts_total{port=\"grpc\"}"),
        20
    );
}

/// The stream budget is the daemon's, not a connection's: with `grpc_max_open_streams: 8`,
/// eight bodiless streams over two connections take it all, a check on a third connection is
/// answered UNAVAILABLE at once (counted), and once the eight are reset checks answer again.
#[test]
fn open_streams_are_bounded_over_all_connections() {
    let r = start("limits:\n  grpc_max_open_streams: 8\n  body_timeout_ms: 1000\n");
    let grpc = r.grpc;
    let base = r.base.as_str();
    let http = r.http;
    let rt = runtime().expect("runtime");
    rt.block_on(async {
        let a = connect(grpc).await;
        let b = connect(grpc).await;
        let mut bodiless = Vec::new();
        for send in [&a, &b] {
            for _ in 0..4 {
                bodiless.push(open(send, base, CHECK, &[]).await.expect("a stream"));
            }
        }
        tokio::task::spawn_blocking(move || wait_metric(http, "sluice_grpc_streams_open", 8))
            .await
            .expect("join");
        let c = connect(grpc).await;
        assert_eq!(
            call(&c, base, CHECK, &[], &check_msg("over"))
                .await
                .expect("a grpc-status"),
            "14",
            "UNAVAILABLE past the daemon's stream budget"
        );
        for (resp, _stream) in bodiless {
            let err = tokio::time::timeout(HANG, resp)
                .await
                .expect("a bodiless stream is reset")
                .expect_err("reset, not answered");
            assert_eq!(err.reason(), Some(h2::Reason::CANCEL), "{err}");
        }
        tokio::task::spawn_blocking(move || wait_metric(http, "sluice_grpc_streams_open", 0))
            .await
            .expect("join");
        assert_eq!(
            call(&c, base, CHECK, &[], &check_msg("after"))
                .await
                .expect("a grpc-status"),
            "0"
        );
    });
    assert_eq!(metric(r.http, "sluice_grpc_streams_refused_total"), 1);
}

#[test]
fn an_expired_grpc_timeout_is_deadline_exceeded_without_a_decision() {
    let r = start("");
    let grpc = r.grpc;
    let base = r.base.as_str();
    let rt = runtime().expect("runtime");
    rt.block_on(async {
        let send = connect(grpc).await;
        let gone = [("grpc-timeout", "1n")];
        assert_eq!(
            call(&send, base, CHECK, &gone, &check_msg("late"))
                .await
                .expect("a grpc-status"),
            "4"
        );
        assert_eq!(
            call(&send, base, RLS, &gone, &rls_msg("late"))
                .await
                .expect("a grpc-status"),
            "4"
        );
        // A deadline still ahead: decided as usual.
        let ahead = [("grpc-timeout", "10S")];
        assert_eq!(
            call(&send, base, CHECK, &ahead, &check_msg("on-time"))
                .await
                .expect("a grpc-status"),
            "0"
        );
        // A malformed one is an error, as gRPC servers answer.
        let bad = [("grpc-timeout", "soon")];
        assert_eq!(
            call(&send, base, CHECK, &bad, &check_msg("bad"))
                .await
                .expect("a grpc-status"),
            "13"
        );
    });
    assert_eq!(metric(r.http, "sluice_grpc_deadline_exceeded_total"), 2);
    // Only the on-time call reached the engine and the store.
    assert_eq!(metric(r.http, "sluice_checks_total{code=\"OK\"}"), 1);
    assert_eq!(
        metric(
            r.http,
            "sluice_store_duration_seconds_count{store=\"default\"}"
        ),
        1
    );
}

/// Reads from a raw connection until EOF or a reset; what was read.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(HANG)).expect("read timeout");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return out,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!(
                    "the connection was never closed (read so far: {:?})",
                    String::from_utf8_lossy(&out)
                )
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn check_json(http: SocketAddr, key: &str) -> u16 {
    let body = format!(r#"{{"domain":"api","descriptors":{{"api_key":"{key}"}}}}"#);
    http_request(
        http,
        "POST",
        "/v1/limits:check",
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .expect("check")
    .status
}

#[test]
fn a_slow_loris_client_is_disconnected_while_checks_answer() {
    let r = start("");
    // Headers that never end.
    let mut loris = TcpStream::connect(r.http).expect("connect");
    loris
        .write_all(b"POST /v1/limits:check HTTP/1.1\r\nHost: sluice\r\nX-Slow: 1")
        .expect("write");
    // A body that never ends.
    let mut slow_body = TcpStream::connect(r.http).expect("connect");
    slow_body
        .write_all(b"POST /v1/limits:check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"domain\":")
        .expect("write");
    // Meanwhile a normal check answers.
    assert_eq!(check_json(r.http, "normal"), 200);
    let got = read_to_close(&mut loris);
    assert!(
        got.is_empty() || got.starts_with(b"HTTP/1.1 408"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    let got = String::from_utf8_lossy(&read_to_close(&mut slow_body)).into_owned();
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(
        got.to_ascii_lowercase().contains("connection: close"),
        "{got}"
    );
    assert_eq!(check_json(r.http, "normal"), 200);
    assert_eq!(
        metric(r.http, "sluice_request_body_timeouts_total{port=\"http\"}"),
        1
    );
}

#[test]
fn an_http_body_over_the_cap_is_413_without_being_read() {
    let r = start("");
    // Declared 4 MiB, 1 KiB sent: answered from the header, the rest never needed.
    let mut s = TcpStream::connect(r.http).expect("connect");
    let mut req = format!(
        "POST /v1/limits:check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        4 << 20
    )
    .into_bytes();
    req.extend_from_slice(&[b' '; 1024]);
    s.write_all(&req).expect("write");
    let got = String::from_utf8_lossy(&read_to_close(&mut s)).into_owned();
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    // Chunked, no length: refused once the cap is passed.
    let mut s = TcpStream::connect(r.http).expect("connect");
    let chunk = vec![b' '; 100 << 10];
    let mut req = b"POST /v1/limits:check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
    req.extend_from_slice(&chunk);
    req.extend_from_slice(b"\r\n0\r\n\r\n");
    s.write_all(&req).expect("write");
    let got = String::from_utf8_lossy(&read_to_close(&mut s)).into_owned();
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert_eq!(check_json(r.http, "normal"), 200);
    assert_eq!(
        metric(r.http, "sluice_requests_too_large_total{port=\"http\"}"),
        2
    );
}

/// An HTTP/1.1 request on a kept-alive raw connection; the status line.
fn keep_alive_get(s: &mut TcpStream, path: &str) -> String {
    s.set_read_timeout(Some(HANG)).expect("read timeout");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: sluice\r\n\r\n").as_bytes())
        .expect("write");
    let mut buf = vec![0u8; 64 << 10];
    let n = s.read(&mut buf).expect("read");
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.lines().next().unwrap_or_default().to_string()
}

#[test]
fn connections_past_the_cap_are_refused_on_every_port() {
    let r = start("limits: { max_connections: 3, header_timeout_ms: 600000 }\n");
    let (grpc, http, admin) = (r.grpc, r.http, r.admin);
    let base = r.base.as_str();
    let rt = runtime().expect("runtime");
    // gRPC: three connections serve, the fourth is closed without a byte.
    let held = rt.block_on(async {
        let mut held = Vec::new();
        for i in 0..3 {
            let send = connect(grpc).await;
            assert_eq!(
                call(&send, base, CHECK, &[], &check_msg(&format!("c{i}")))
                    .await
                    .expect("a grpc-status"),
                "0"
            );
            held.push(send);
        }
        held
    });
    let mut fourth = TcpStream::connect(grpc).expect("the kernel accepts");
    assert!(
        read_to_close(&mut fourth).is_empty(),
        "no SETTINGS: closed at once"
    );
    // HTTP and admin: three kept-alive connections answer, the fourth is closed.
    for (addr, path) in [(http, "/healthz"), (admin, "/healthz")] {
        let mut kept = Vec::new();
        for _ in 0..3 {
            let mut s = TcpStream::connect(addr).expect("connect");
            assert_eq!(keep_alive_get(&mut s, path), "HTTP/1.1 200 OK");
            kept.push(s);
        }
        let mut s = TcpStream::connect(addr).expect("the kernel accepts");
        let _ = s.write_all(format!("GET {path} HTTP/1.1\r\nHost: sluice\r\n\r\n").as_bytes());
        assert!(read_to_close(&mut s).is_empty(), "refused at once");
        drop(kept);
    }
    // Once connections close, new ones are served again (the metrics request itself waits
    // for the HTTP port to notice).
    let until = Instant::now() + HANG;
    let text = loop {
        match http_get(http, "/metrics") {
            Ok(r) if r.status == 200 => break r.text(),
            _ => assert!(Instant::now() < until, "the HTTP port never served again"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for port in ["grpc", "http", "admin"] {
        let series = format!("sluice_connections_refused_total{{port=\"{port}\"}} ");
        let v: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&series)?.parse().ok())
            .unwrap_or(0);
        assert!(v >= 1, "{series}: {text}");
    }
    drop(held);
}

#[test]
fn past_the_in_flight_bound_checks_are_shed_at_once_and_counted() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let r = start(&format!(
        "store: {{ kind: redis, url: \"{}\" }}\nstore_timeout_ms: 60000\nlimits: {{ max_in_flight: 4 }}\n",
        redis.url()
    ));
    let http = r.http;
    let grpc = r.grpc;
    let base = r.base.as_str();
    // Warm: the store's connection and script are in place.
    assert_eq!(check_json(http, "warm"), 200);
    redis.pause().expect("SIGSTOP redis");
    // Four checks wait on the stalled store...
    let waiting: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let body = format!(r#"{{"domain":"api","descriptors":{{"api_key":"w{i}"}}}}"#);
                sluice_testkit::http::http_request_timeout(
                    http,
                    "POST",
                    "/v1/limits:check",
                    &[("content-type", "application/json")],
                    body.as_bytes(),
                    Duration::from_secs(120),
                )
                .map(|r| r.status)
            })
        })
        .collect();
    wait_metric(http, "sluice_checks_in_flight", 4);
    // ...so the next ones, on every API, are answered while the store is still stalled.
    let resp = http_request(
        http,
        "POST",
        "/v1/limits:check",
        &[("content-type", "application/json")],
        br#"{"domain":"api","descriptors":{"api_key":"shed"}}"#,
    )
    .expect("shed check");
    assert_eq!(resp.status, 503, "{}", resp.text());
    assert_eq!(resp.header("retry-after"), Some("1"));
    let v: Value = serde_json::from_slice(&resp.body).expect("json");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("overloaded")),
        "{v}"
    );
    let rt = runtime().expect("runtime");
    rt.block_on(async {
        let send = connect(grpc).await;
        assert_eq!(
            call(&send, base, CHECK, &[], &check_msg("shed"))
                .await
                .expect("a grpc-status"),
            "14"
        );
        assert_eq!(
            call(&send, base, RLS, &[], &rls_msg("shed"))
                .await
                .expect("a grpc-status"),
            "14"
        );
    });
    assert!(redis.is_paused(), "all of it while the store was stalled");
    assert_eq!(metric(http, "sluice_checks_shed_total{port=\"http\"}"), 1);
    assert_eq!(metric(http, "sluice_checks_shed_total{port=\"grpc\"}"), 2);
    redis.resume().expect("SIGCONT redis");
    for w in waiting {
        let status = w
            .join()
            .expect("thread")
            .expect("answered once redis resumed");
        assert_eq!(status, 200);
    }
    wait_metric(http, "sluice_checks_in_flight", 0);
    assert_eq!(check_json(http, "after"), 200);
}
