//! `sluice-bench --api get` against `sluice-upstream`: every request a 2xx, counted as
//! allowed, over both loops; a 429 is counted as refused, another status as an error.
//! (Latency is measured by bench/gateway-latency.sh, never asserted here.)

use serde_json::Value;
use sluice_testkit::{Daemon, free_port};
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::Duration;

fn bench(addr: SocketAddr, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args([
            "--api",
            "get",
            "--addr",
            &addr.to_string(),
            "--path",
            "/v1/items",
        ])
        .args(args)
        .args(["--json", "--quiet", "--timeout-ms", "5000", "--warmup", "0"])
        .output()
        .expect("run sluice-bench");
    assert!(
        out.status.success(),
        "sluice-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

#[test]
fn every_get_to_the_upstream_is_answered_on_both_loops() {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut up = Daemon::spawn(
        env!("CARGO_BIN_EXE_sluice-upstream"),
        &["--listen", &addr.to_string()],
        &[],
    )
    .expect("sluice-upstream starts");
    up.wait_http_ok(addr, "/", Duration::from_secs(20))
        .expect("sluice-upstream answers");
    let closed = bench(
        addr,
        &[
            "--requests",
            "300",
            "--concurrency",
            "4",
            "--duration",
            "30",
        ],
    );
    assert_eq!(
        (closed["allowed"].as_u64(), closed["errors"].as_u64()),
        (Some(300), Some(0)),
        "{closed}"
    );
    let open = bench(
        addr,
        &[
            "--rate",
            "500",
            "--requests",
            "200",
            "--concurrency",
            "4",
            "--duration",
            "30",
        ],
    );
    assert_eq!(
        (open["allowed"].as_u64(), open["errors"].as_u64()),
        (Some(200), Some(0)),
        "{open}"
    );
}

/// A server answering each request with the next status of `statuses`, then closing.
fn statuses_server(statuses: &'static [u16]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        for status in statuses {
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).expect("read");
                if n == 0 {
                    return;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            let text = String::from_utf8_lossy(&seen).to_string();
            assert!(text.starts_with("GET /v1/items HTTP/1.1\r\n"), "{text}");
            assert!(text.contains("\r\nx-api-key: k0\r\n"), "{text}");
            seen.clear();
            let resp = format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nno");
            s.write_all(resp.as_bytes()).expect("write");
        }
    });
    addr
}

#[test]
fn a_429_is_refused_and_another_status_an_error() {
    let addr = statuses_server(&[200, 429, 503]);
    let r = bench(
        addr,
        &[
            "--key-header",
            "x-api-key",
            "--dist",
            "hot",
            "--key-prefix",
            "k",
            "--requests",
            "3",
            "--concurrency",
            "1",
            "--duration",
            "30",
        ],
    );
    assert_eq!(
        (
            r["allowed"].as_u64(),
            r["denied"].as_u64(),
            r["errors"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{r}"
    );
    assert!(
        r["first_error"]
            .as_str()
            .unwrap_or_default()
            .contains("HTTP 503"),
        "{r}"
    );
}
