//! The `sluice-gateway` binary between a real client, a real `sluiced` and an echoing
//! upstream, all over loopback sockets: allowed requests reach the upstream and carry the
//! RateLimit headers, the one past the limit is the 429, and with the daemon gone requests
//! pass and `/metrics` counts them; h2 with prior knowledge is served; SIGTERM drains an
//! in-flight request before exiting; a dead upstream is a counted 502; a response streams
//! through before the upstream has finished it; a fail-closed rule whose Redis is gone is a
//! 503 with `Retry-After: 1`; a client that hangs up mid-response frees its concurrency slot.
//! Needs `cargo build -p sluiced --bins`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sluice_testkit::{
    Daemon, Metrics, RedisServer, SluicedOnRules, TempDir, free_ports, http_request,
};
use tokio::sync::Notify;

const RULES: &str = r#"
domain: gw
rules:
  - { id: per-key, match: { route: "GET /v1/users/{id}" }, key: [api_key], algorithm: fixed_window, limit: 2, window: 1h }
"#;

/// A start on a busy machine (debug builds).
const READY: Duration = Duration::from_secs(20);

/// The echoing upstream, and the hold on its `/v1/hold` route.
struct Upstream {
    addr: SocketAddr,
    /// One message per `/v1/hold` request that arrived.
    arrived: std::sync::mpsc::Receiver<()>,
    /// Lets one held request answer.
    release: Arc<Notify>,
}

/// An upstream on its own thread and runtime: echoes the request body and reports, in
/// headers, the path, `X-Forwarded-For` and whether a hop-by-hop header got through.
/// `/v1/hold` answers only once [`Upstream::release`] is notified.
fn start_upstream() -> Upstream {
    let (arrived_tx, arrived) = std::sync::mpsc::channel();
    let release = Arc::new(Notify::new());
    let hold = release.clone();
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (arrived_tx, hold) = (arrived_tx.clone(), hold.clone());
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (arrived_tx, hold) = (arrived_tx.clone(), hold.clone());
                    async move {
                        if req.uri().path() == "/v1/stream" {
                            return Ok(Response::new(streamed(hold).boxed()));
                        }
                        if req.uri().path() == "/v1/hold" {
                            let _ = arrived_tx.send(());
                            hold.notified().await;
                        }
                        let h = req.headers();
                        let xff = h
                            .get("x-forwarded-for")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let keep_alive = h.contains_key("keep-alive");
                        let path = req.uri().path().to_string();
                        let mut resp = Response::new(req.into_body().boxed());
                        let out = resp.headers_mut();
                        out.insert("x-echo-path", path.parse().expect("header"));
                        out.insert("x-echo-xff", xff.parse().expect("header"));
                        out.insert(
                            "x-echo-keep-alive",
                            if keep_alive { "seen" } else { "absent" }
                                .parse()
                                .expect("header"),
                        );
                        Ok::<_, Infallible>(resp)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
    });
    Upstream {
        addr,
        arrived,
        release,
    }
}

/// A body fed through a channel: frames as the sender sends them.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.0.poll_recv(cx).map(|d| d.map(|d| Ok(Frame::data(d))))
    }
}

/// `first;` now, `second` once `hold` is notified.
fn streamed(hold: Arc<Notify>) -> ChannelBody {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        let _ = tx.send(Bytes::from_static(b"first;")).await;
        hold.notified().await;
        let _ = tx.send(Bytes::from_static(b"second")).await;
    });
    ChannelBody(rx)
}

/// The gateway binary and its addresses.
struct Gateway {
    daemon: Daemon,
    listen: SocketAddr,
    metrics: SocketAddr,
    _dir: TempDir,
}

fn start_gateway(upstream: SocketAddr, sluiced: SocketAddr) -> Gateway {
    let ports = free_ports(2);
    let listen: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let metrics: SocketAddr = ([127, 0, 0, 1], ports[1]).into();
    let dir = TempDir::new(&format!("gateway-{}", ports[0])).expect("temp dir");
    let file = dir.path().join("gateway.yaml");
    // A generous deadline: a debug daemon on a shared machine.
    std::fs::write(
        &file,
        format!(
            "domain: gw\ntemplates: [\"/v1/users/{{id}}\", \"/v1/stream\"]\ntier_header: x-tier\ndeadline_ms: 5000\nfailure: open\nmetrics_addr: \"{metrics}\"\n"
        ),
    )
    .expect("config file");
    let mut daemon = Daemon::spawn(
        env!("CARGO_BIN_EXE_sluice-gateway"),
        &[
            "--listen",
            &listen.to_string(),
            "--upstream",
            &format!("http://{upstream}"),
            "--sluiced",
            &sluiced.to_string(),
            "--config",
            file.to_str().expect("utf-8 path"),
        ],
        &[("RUST_LOG", "info")],
    )
    .expect("gateway starts");
    daemon
        .wait_http_ok(metrics, "/healthz", READY)
        .expect("gateway healthy");
    Gateway {
        daemon,
        listen,
        metrics,
        _dir: dir,
    }
}

fn get_user(gw: &Gateway, key: &str) -> sluice_testkit::HttpResponse {
    let auth = format!("Bearer {key}");
    http_request(
        gw.listen,
        "GET",
        "/v1/users/42",
        &[("authorization", &auth), ("keep-alive", "timeout=5")],
        b"",
    )
    .expect("gateway answers")
}

#[test]
fn allowed_requests_reach_the_upstream_and_the_one_past_the_limit_is_a_429() {
    let sluiced =
        SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)");
    let upstream = start_upstream();
    let gw = start_gateway(upstream.addr, sluiced.grpc);

    for remaining in [1, 0] {
        let r = get_user(&gw, "k1");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-echo-path"), Some("/v1/users/42"));
        assert_eq!(r.header("x-echo-xff"), Some("127.0.0.1"));
        assert_eq!(r.header("x-echo-keep-alive"), Some("absent"));
        assert_eq!(r.header("ratelimit-policy"), Some("\"per-key\";q=2;w=3600"));
        let state = r.header("ratelimit").expect("RateLimit header");
        assert!(
            state.starts_with(&format!("\"per-key\";r={remaining};t=")),
            "{state}"
        );
    }
    // A body streams through to the upstream and back (a route no rule names).
    let body = vec![b'x'; 256 * 1024];
    let r = http_request(gw.listen, "POST", "/v1/upload", &[], &body).expect("gateway answers");
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), body.len());

    let r = get_user(&gw, "k1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let retry: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((1..=3600).contains(&retry), "{retry}");
    assert!(r.header("ratelimit-policy").is_some(), "{:?}", r.headers);
    assert!(r.header("ratelimit").is_some(), "{:?}", r.headers);
    let problem: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"], serde_json::json!(["per-key"]));

    let m = Metrics::scrape(gw.metrics).expect("metrics");
    assert_eq!(
        m.count("sluice_gateway_requests_total{outcome=\"forwarded\"}"),
        3
    );
    assert_eq!(
        m.count("sluice_gateway_requests_total{outcome=\"over_limit\"}"),
        1
    );
    assert_eq!(m.count("sluice_gateway_check_duration_seconds_count"), 4);
}

#[test]
fn with_sluiced_gone_requests_pass_and_are_counted_then_sigterm_exits_cleanly() {
    let mut sluiced =
        SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)");
    let upstream = start_upstream();
    let mut gw = start_gateway(upstream.addr, sluiced.grpc);
    assert_eq!(get_user(&gw, "k1").status, 200);

    sluiced.daemon.kill().expect("sluiced killed");
    for _ in 0..3 {
        let r = get_user(&gw, "k1");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-echo-path"), Some("/v1/users/42"));
        assert_eq!(
            r.header("ratelimit"),
            None,
            "unchecked: no decision headers"
        );
    }
    let m = Metrics::scrape(gw.metrics).expect("metrics");
    assert_eq!(
        m.count("sluice_gateway_requests_total{outcome=\"failed_open\"}"),
        3
    );
    assert_eq!(
        m.count("sluice_gateway_requests_total{outcome=\"forwarded\"}"),
        1
    );

    let status = gw.daemon.terminate(READY).expect("exits on SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[test]
fn h2_with_prior_knowledge_is_checked_and_forwarded() {
    let sluiced =
        SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)");
    let upstream = start_upstream();
    let gw = start_gateway(upstream.addr, sluiced.grpc);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http::<Full<Bytes>>();
        let req = Request::post(format!("http://{}/v1/users/7", gw.listen))
            .header("authorization", "Bearer h2-key")
            .body(Full::new(Bytes::from_static(b"over h2")))
            .expect("request");
        let resp = client.request(req).await.expect("h2 answer");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-echo-path"], "/v1/users/7");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"over h2");
        let req = Request::get(format!("http://{}/v1/users/7", gw.listen))
            .header("authorization", "Bearer h2-key")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = client.request(req).await.expect("h2 answer");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["ratelimit-policy"], "\"per-key\";q=2;w=3600");
    });
}

#[test]
fn sigterm_lets_an_in_flight_request_finish() {
    let sluiced =
        SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)");
    let upstream = start_upstream();
    let mut gw = start_gateway(upstream.addr, sluiced.grpc);
    let listen = gw.listen;
    let client = std::thread::spawn(move || {
        http_request(listen, "POST", "/v1/hold", &[], b"held body").expect("gateway answers")
    });
    upstream
        .arrived
        .recv_timeout(READY)
        .expect("the request reached the upstream");
    gw.daemon.signal("TERM").expect("SIGTERM");
    gw.daemon
        .wait_log_contains("shutting down", READY)
        .expect("the gateway is draining");
    upstream.release.notify_one();
    let r = client.join().expect("client thread");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"held body");
    let status = gw.daemon.wait(READY).expect("exits after the drain");
    assert!(status.success(), "{status:?}");
}

#[test]
fn an_upstream_that_is_down_is_a_502_and_counted() {
    let sluiced =
        SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)");
    // A free port nothing listens on.
    let nowhere: SocketAddr = ([127, 0, 0, 1], free_ports(1)[0]).into();
    let gw = start_gateway(nowhere, sluiced.grpc);
    let r = get_user(&gw, "k1");
    assert_eq!(r.status, 502, "{}", r.text());
    let m = Metrics::scrape(gw.metrics).expect("metrics");
    assert_eq!(m.count("sluice_gateway_upstream_errors_total"), 1);
    assert_eq!(
        m.count("sluice_gateway_requests_total{outcome=\"forwarded\"}"),
        1
    );
}

#[test]
fn a_response_streams_before_the_upstream_has_finished_it() {
    let sluiced =
        SluicedOnRules::start(RULES).expect("sluiced starts (cargo build -p sluiced --bins)");
    let upstream = start_upstream();
    let gw = start_gateway(upstream.addr, sluiced.grpc);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let req = Request::get(format!("http://{}/v1/stream", gw.listen))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = client.request(req).await.expect("answer");
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        // The first chunk arrives while the upstream still holds the rest (a buffering proxy
        // never sends it: the bound turns that hang into a failure).
        let first = tokio::time::timeout(READY, body.frame())
            .await
            .expect("the first chunk before the upstream finished")
            .expect("a frame")
            .expect("no error")
            .into_data()
            .expect("data");
        assert_eq!(&first[..], b"first;");
        upstream.release.notify_one();
        let rest = body.collect().await.expect("rest").to_bytes();
        assert_eq!(&rest[..], b"second");
    });
}

#[test]
fn a_fail_closed_rule_whose_store_is_gone_is_a_503_with_retry_after_1() {
    const CLOSED: &str = r#"
domain: gw
rules:
  - { id: closed, match: { route: "GET /v1/users/{id}" }, key: [api_key], algorithm: fixed_window, limit: 1000, window: 1h, on_store_failure: closed }
"#;
    let mut redis = RedisServer::start().expect("redis-server starts");
    // A store deadline a debug daemon on a shared machine keeps while Redis is up.
    let sluiced = SluicedOnRules::start_with_args(
        CLOSED,
        &["--redis", &redis.url(), "--store-timeout-ms", "1000"],
    )
    .expect("sluiced starts (cargo build -p sluiced --bins)");
    let upstream = start_upstream();
    let gw = start_gateway(upstream.addr, sluiced.grpc);
    let r = get_user(&gw, "k1");
    assert_eq!(r.status, 200, "decided on Redis: {}", r.text());

    redis.kill().expect("redis-server killed");
    // The daemon's store client may take a call or two to see the socket gone.
    let deadline = std::time::Instant::now() + READY;
    let r = loop {
        let r = get_user(&gw, "k1");
        if r.status != 200 || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("x-echo-path"), None, "never forwarded");
    let m = Metrics::scrape(gw.metrics).expect("metrics");
    assert_eq!(
        m.count("sluice_gateway_requests_total{outcome=\"unavailable\"}"),
        1
    );
    assert_eq!(
        m.count("sluice_gateway_requests_total{outcome=\"failed_open\"}"),
        0,
        "the daemon answered: the gateway's own failure mode is not involved"
    );
}

/// Opens `GET /v1/stream` as key `s1` and tier `tier` on a raw connection and reads the
/// status line and headers; on a 200 also the first chunk, which the upstream sends before
/// it holds the rest. The stream stays open while the returned socket lives.
fn open_stream(gw: &Gateway, tier: &str) -> (u16, std::net::TcpStream) {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(gw.listen).expect("connect");
    s.set_read_timeout(Some(READY)).expect("read timeout");
    write!(
        s,
        "GET /v1/stream HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer s1\r\nx-tier: {tier}\r\n\r\n"
    )
    .expect("request sent");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut buf).expect("the answer's head");
        assert!(n > 0, "closed before the head: {got:?}");
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_string();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    if status == 200 {
        while !got[head_end..].windows(6).any(|w| w == b"first;") {
            let n = s.read(&mut buf).expect("the first chunk");
            assert!(n > 0, "closed before the first chunk");
            got.extend_from_slice(&buf[..n]);
        }
    }
    (status, s)
}

#[test]
fn a_client_that_hangs_up_mid_response_frees_its_concurrency_slot() {
    // A slot outlives the test unless released: only the release can free it.
    const ONE_STREAM: &str = r#"
domain: gw
rules:
  - { id: one-stream, match: { route: "GET /v1/stream" }, key: [api_key], algorithm: concurrency, limit: 1, timeout: 1h }
"#;
    let sluiced =
        SluicedOnRules::start(ONE_STREAM).expect("sluiced starts (cargo build -p sluiced --bins)");
    let upstream = start_upstream();
    let gw = start_gateway(upstream.addr, sluiced.grpc);

    let (status, held) = open_stream(&gw, "first");
    assert_eq!(status, 200);
    // While the first response streams, the key's one slot is taken.
    let (status, _) = open_stream(&gw, "while-held");
    assert_eq!(
        status, 429,
        "a second stream while the first holds the slot"
    );

    drop(held);
    // The gateway's edge guard remembers a refusal per identity (descriptors), concurrency ones
    // included (docs/gateway.md, "Not yet"): each probe is a tier of its own, so every one is
    // asked of the daemon, which admits once the release has freed the slot.
    let deadline = std::time::Instant::now() + READY;
    let mut probes = 0;
    let (status, _again) = loop {
        probes += 1;
        let (status, s) = open_stream(&gw, &format!("after-{probes}"));
        if status != 429 || std::time::Instant::now() > deadline {
            break (status, s);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status, 200, "the slot was never released ({probes} probes)");
    let m = Metrics::scrape(gw.metrics).expect("metrics");
    assert_eq!(
        m.count("sluice_gateway_requests_total{outcome=\"forwarded\"}"),
        2
    );
}
