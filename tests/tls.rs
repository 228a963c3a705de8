//! TLS end to end on a real `sluiced`: the HTTP and admin listeners with `curl --cacert`,
//! gRPC over rustls with ALPN h2, mTLS refusing a client without a certificate, a rewritten
//! certificate served to new handshakes, and the warning for a plain-text listener on a
//! non-loopback address. Certificates are made at test time.

use prost::Message as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use sluice_proto::sluice::v1::CheckRequest;
use sluice_testkit::grpc_wire::{call, handshake, runtime};
use sluice_testkit::{Daemon, TestPki, cargo_bin, free_ports};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const RULES: &str = r#"
domain: api
rules:
  - id: per-key
    key: [api_key]
    algorithm: token_bucket
    rate_per_s: 1000
    burst: 1000
"#;

/// Turns a hang into a failure; never an assertion on how long something took.
const HANG: Duration = Duration::from_secs(60);

struct Running {
    daemon: Daemon,
    http: SocketAddr,
    grpc: SocketAddr,
    admin: SocketAddr,
}

/// A daemon on the memory store with `extra` appended to its config (in the PKI's directory).
fn start(pki: &TestPki, extra: &str, grpc_ip: [u8; 4]) -> Running {
    let ports = free_ports(3);
    let http: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    let grpc: SocketAddr = (grpc_ip, ports[1]).into();
    let admin: SocketAddr = ([127, 0, 0, 1], ports[2]).into();
    let bin = cargo_bin("sluiced").expect("sluiced is built (cargo build -p sluiced --bins)");
    let rules = pki.dir().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("write rules");
    let config = pki.dir().join("sluiced.yaml");
    std::fs::write(
        &config,
        format!(
            "http_addr: {http}\ngrpc_addr: {grpc}\nadmin_addr: {admin}\nrules: {}\n{extra}",
            rules.display()
        ),
    )
    .expect("write config");
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(&config).env("RUST_LOG", "info");
    let mut daemon = Daemon::from_command(cmd).expect("spawn sluiced");
    daemon
        .wait_log_contains("sluiced serving", Duration::from_secs(20))
        .expect("sluiced starts");
    Running {
        daemon,
        http,
        grpc,
        admin,
    }
}

fn tls_block(pki: &TestPki, mtls: bool) -> String {
    let mut s = format!(
        "tls:\n  cert_file: {}\n  key_file: {}\n  reload_ms: 100\n",
        pki.server_cert_file().display(),
        pki.server_key_file().display()
    );
    if mtls {
        s += &format!("  client_ca_file: {}\n", pki.ca_file().display());
    }
    s
}

/// `curl` of `url` with `args`: the HTTP status, or `Err` with curl's exit and message.
fn curl(url: &str, args: &[&str]) -> Result<u16, String> {
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
        ])
        .args(args)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("this test needs curl (apt-get install curl): {e}"));
    if !out.status.success() {
        return Err(format!(
            "curl {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("{e}"))
}

/// Waits for `/healthz` over TLS to answer 200.
fn wait_healthy(r: &Running, args: &[&str]) {
    let url = format!("https://127.0.0.1:{}/healthz", r.http.port());
    let deadline = Instant::now() + HANG;
    loop {
        match curl(&url, args) {
            Ok(200) => return,
            other if Instant::now() > deadline => {
                panic!("never healthy over TLS: {other:?}\n{}", r.daemon.logs())
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn client_config(pki: &TestPki, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca_pem().as_bytes()).expect("CA PEM"))
        .expect("CA");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(cfg)
}

async fn tls_connect(
    pki: &TestPki,
    addr: SocketAddr,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tokio_rustls::TlsConnector::from(client_config(pki, alpn))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake")
}

/// One `sluice.v1.Limiter/Check` over TLS + h2: its `grpc-status`.
async fn grpc_check(pki: &TestPki, grpc: SocketAddr) -> String {
    let tls = tls_connect(pki, grpc, b"h2").await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let send = handshake(tls, &h2::client::Builder::new())
        .await
        .expect("h2 handshake");
    let msg = CheckRequest {
        domain: "api".into(),
        descriptors: [("api_key".to_string(), "k".to_string())].into(),
        cost: None,
    }
    .encode_to_vec();
    let base = format!("https://localhost:{}", grpc.port());
    call(&send, &base, "/sluice.v1.Limiter/Check", &[], &msg)
        .await
        .expect("a grpc-status")
}

#[test]
fn every_listener_serves_tls_and_a_rewritten_certificate_is_served() {
    let mut pki = TestPki::new().expect("test certificates");
    let r = start(&pki, &tls_block(&pki, false), [127, 0, 0, 1]);
    let ca = pki.ca_file().display().to_string();
    wait_healthy(&r, &["--cacert", &ca]);

    // Admin: any HTTP answer over TLS (the read API wants a token).
    let admin = curl(
        &format!("https://127.0.0.1:{}/v1/rules", r.admin.port()),
        &["--cacert", &ca],
    )
    .expect("admin over TLS");
    assert!((200..500).contains(&admin), "{admin}");
    // Plain HTTP to a TLS port gets no HTTP answer.
    let plain = curl(&format!("http://127.0.0.1:{}/healthz", r.http.port()), &[]);
    assert!(matches!(plain, Err(_) | Ok(0)), "{plain:?}");

    let rt = runtime().expect("runtime");
    assert_eq!(
        rt.block_on(grpc_check(&pki, r.grpc)),
        "0",
        "gRPC Check over TLS"
    );

    // Rewrite the files: new handshakes get the new certificate once the poll has seen it.
    let before = served_leaf(&rt, &pki, r.http, b"http/1.1");
    assert_eq!(before, der_of(pki.server_pem()));
    let new = pki.reissue_server().expect("new certificate");
    let want = der_of(&new);
    assert_ne!(want, before);
    let deadline = Instant::now() + HANG;
    while served_leaf(&rt, &pki, r.http, b"http/1.1") != want {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served\n{}",
            r.daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        served_leaf(&rt, &pki, r.grpc, b"h2"),
        want,
        "gRPC reloaded too"
    );
    assert!(r.daemon.logs().contains("TLS certificate reloaded"));
}

fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("PEM")
        .to_vec()
}

fn served_leaf(
    rt: &tokio::runtime::Runtime,
    pki: &TestPki,
    addr: SocketAddr,
    alpn: &[u8],
) -> Vec<u8> {
    rt.block_on(async {
        let tls = tls_connect(pki, addr, alpn).await;
        tls.get_ref().1.peer_certificates().expect("a certificate")[0].to_vec()
    })
}

#[test]
fn mtls_refuses_a_client_without_a_certificate() {
    let pki = TestPki::new().expect("test certificates");
    let r = start(&pki, &tls_block(&pki, true), [127, 0, 0, 1]);
    let ca = pki.ca_file().display().to_string();
    let cert = pki.client_cert_file().display().to_string();
    let key = pki.client_key_file().display().to_string();
    wait_healthy(&r, &["--cacert", &ca, "--cert", &cert, "--key", &key]);
    let url = format!("https://127.0.0.1:{}/healthz", r.http.port());
    let err = curl(&url, &["--cacert", &ca]).expect_err("no client certificate");
    assert!(!err.is_empty());
    assert_eq!(
        curl(&url, &["--cacert", &ca, "--cert", &cert, "--key", &key]),
        Ok(200)
    );
}

#[test]
fn a_plain_text_listener_on_a_non_loopback_address_is_warned_about() {
    let pki = TestPki::new().expect("test certificates");
    let mut r = start(&pki, "", [0, 0, 0, 0]);
    r.daemon
        .wait_log_contains("plain-text listener on a non-loopback address", HANG)
        .expect("a warning for the gRPC listener on 0.0.0.0");
    let logs = r.daemon.logs();
    let warned: Vec<_> = logs
        .lines()
        .filter(|l| l.contains("plain-text listener"))
        .collect();
    assert_eq!(warned.len(), 1, "only the non-loopback one: {warned:?}");
    assert!(warned[0].contains("grpc"), "{warned:?}");
}

#[test]
fn sluicectl_reaches_the_admin_api_over_https_with_a_ca_file() {
    let pki = TestPki::new().expect("test certificates");
    let extra = format!("{}read_token: t0ken-for-reads\n", tls_block(&pki, false));
    let r = start(&pki, &extra, [127, 0, 0, 1]);
    let ca = pki.ca_file().display().to_string();
    wait_healthy(&r, &["--cacert", &ca]);
    let ctl = cargo_bin("sluicectl").expect("sluicectl is built (cargo build --workspace --bins)");
    let server = format!("https://localhost:{}", r.admin.port());
    let run = |args: &[&str]| {
        let out = Command::new(&ctl)
            .args(["--server", &server, "--timeout", "20"])
            .args(args)
            .env("SLUICE_READ_TOKEN", "t0ken-for-reads")
            .env_remove("SLUICE_ADMIN_TOKEN")
            .output()
            .expect("run sluicectl");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, text) = run(&["--ca-file", &ca, "-o", "json", "status"]);
    assert!(ok, "sluicectl status over https: {text}");
    // The console's session cookie is Secure on a TLS listener (docs/console.md).
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "--cacert",
            &ca,
            "-o",
            "/dev/null",
            "-D",
            "-",
        ])
        .args(["--data", "token=t0ken-for-reads"])
        .arg(format!("https://127.0.0.1:{}/ui/login", r.admin.port()))
        .output()
        .expect("curl");
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let cookie = head
        .lines()
        .find(|l| l.starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no session cookie: {head}"));
    assert!(
        cookie.contains("; secure") && cookie.contains("httponly") && !cookie.contains("t0ken"),
        "{cookie}"
    );
    let (ok, text) = run(&["status"]);
    assert!(!ok, "the system's roots do not know the test CA: {text}");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
}
