//! TLS for the daemon: the listeners' certificates (rustls, ring provider), re-read when the
//! files change, and the client-side files for `rediss://`.
//!
//! Each listener may have its own certificate, or share one block; a `client_ca_file` turns
//! on mTLS (a client without a certificate signed by it is refused in the handshake). See
//! `docs/tls.md`.

use serde::Deserialize;
use std::path::PathBuf;

/// The files `rediss://` store connections use (`redis_tls:` in the config).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RedisTlsFiles {
    /// PEM CA certificates to verify Redis with, instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for a Redis with `tls-auth-clients yes`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl RedisTlsFiles {
    /// The store's form of the same files.
    pub fn to_store(&self) -> sluice_store::redis::RedisTlsConfig {
        sluice_store::redis::RedisTlsConfig {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        }
    }
}

use anyhow::Context as _;
use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::net::TcpStream;

/// One listener's certificate files; every field falls back to the shared block.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates: when set, clients must present a certificate signed by one (mTLS).
    pub client_ca_file: Option<PathBuf>,
}

/// The `tls:` section: a shared certificate and per-listener overrides. A listener with no
/// `cert_file` and `key_file` (own or shared) serves plain text.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain for every listener without its own.
    pub cert_file: Option<PathBuf>,
    /// Its private key.
    pub key_file: Option<PathBuf>,
    /// mTLS for every listener without its own `client_ca_file`.
    pub client_ca_file: Option<PathBuf>,
    /// The HTTP listener's overrides.
    pub http: TlsFiles,
    /// The gRPC listener's overrides.
    pub grpc: TlsFiles,
    /// The admin listener's overrides.
    pub admin: TlsFiles,
    /// How often the files' modification times are checked, ms; a change is served to new
    /// handshakes once the new files load.
    pub reload_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            http: TlsFiles::default(),
            grpc: TlsFiles::default(),
            admin: TlsFiles::default(),
            reload_ms: 2_000,
        }
    }
}

/// The three listeners, for their files and ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// HTTP/1.1 JSON API.
    Http,
    /// gRPC over HTTP/2.
    Grpc,
    /// Admin API, HTTP/1.1.
    Admin,
}

impl Listener {
    fn name(self) -> &'static str {
        match self {
            Listener::Http => "http",
            Listener::Grpc => "grpc",
            Listener::Admin => "admin",
        }
    }

    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Listener::Grpc => vec![b"h2".to_vec()],
            Listener::Http | Listener::Admin => vec![b"http/1.1".to_vec()],
        }
    }
}

/// A listener's effective files: cert and key both set, the client CA optional.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Effective {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

impl TlsConfig {
    fn effective(&self, l: Listener) -> anyhow::Result<Option<Effective>> {
        let own = match l {
            Listener::Http => &self.http,
            Listener::Grpc => &self.grpc,
            Listener::Admin => &self.admin,
        };
        let cert = own.cert_file.clone().or_else(|| self.cert_file.clone());
        let key = own.key_file.clone().or_else(|| self.key_file.clone());
        let client_ca = own
            .client_ca_file
            .clone()
            .or_else(|| self.client_ca_file.clone());
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(Effective {
                cert,
                key,
                client_ca,
            })),
            (None, None) if client_ca.is_none() => Ok(None),
            _ => anyhow::bail!(
                "tls for the {} listener needs both cert_file and key_file",
                l.name()
            ),
        }
    }

    /// Refuses a half-configured listener and a zero reload interval.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.reload_ms > 0,
            "tls.reload_ms must be greater than zero"
        );
        for l in [Listener::Http, Listener::Grpc, Listener::Admin] {
            self.effective(l)?;
        }
        Ok(())
    }
}

fn server_config(files: &Effective, l: Listener) -> anyhow::Result<ServerConfig> {
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading certificates from {}", files.cert.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "no certificate in {}",
        files.cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("reading the private key from {}", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .with_context(|| format!("reading {}", ca.display()))?
            {
                roots.add(c.with_context(|| format!("reading {}", ca.display()))?)?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build()?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_single_cert(certs, key).with_context(|| {
        format!(
            "{} does not match {}",
            files.key.display(),
            files.cert.display()
        )
    })?;
    cfg.alpn_protocols = l.alpn();
    Ok(cfg)
}

/// A listener's TLS: the current rustls configuration, swapped when its files change.
pub struct ServerTls {
    current: ArcSwap<ServerConfig>,
}

impl ServerTls {
    /// The TLS handshake on an accepted connection, with the configuration current now.
    pub async fn accept(
        &self,
        tcp: TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
            .accept(tcp)
            .await
    }
}

/// The listeners serving TLS, by their local address (unique in a process, so daemons run
/// in one test process do not mix).
static SERVING: Mutex<Option<HashMap<SocketAddr, Arc<ServerTls>>>> = Mutex::new(None);

/// The TLS of the listener bound to `addr`, if it serves TLS.
pub fn for_addr(addr: Option<SocketAddr>) -> Option<Arc<ServerTls>> {
    let addr = addr?;
    let map = SERVING.lock().unwrap_or_else(|p| p.into_inner());
    map.as_ref()?.get(&addr).cloned()
}

fn mtimes(files: &Effective) -> Vec<Option<SystemTime>> {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
    .collect()
}

/// Loads each listener's certificate (an unreadable one fails the start), registers it for
/// its accept loop, starts the reload poll, and warns about every plain-text listener on an
/// address other than loopback.
pub fn install(cfg: &TlsConfig, listeners: &[(Listener, SocketAddr)]) -> anyhow::Result<()> {
    for &(l, addr) in listeners {
        let Some(files) = cfg.effective(l)? else {
            if !addr.ip().is_loopback() {
                tracing::warn!(listener = l.name(), %addr, "plain-text listener on a non-loopback address: set tls (docs/tls.md)");
            }
            continue;
        };
        let tls = Arc::new(ServerTls {
            current: ArcSwap::from_pointee(server_config(&files, l)?),
        });
        tracing::info!(listener = l.name(), %addr, mtls = files.client_ca.is_some(), "serving TLS");
        SERVING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(addr, tls.clone());
        let every = Duration::from_millis(cfg.reload_ms);
        tokio::spawn(async move {
            let mut seen = mtimes(&files);
            loop {
                tokio::time::sleep(every).await;
                let now = mtimes(&files);
                if now == seen {
                    continue;
                }
                match server_config(&files, l) {
                    Ok(c) => {
                        tls.current.store(Arc::new(c));
                        seen = now;
                        tracing::info!(listener = l.name(), "TLS certificate reloaded");
                    }
                    // Half-written files: try again next time; the old certificate serves.
                    Err(e) => {
                        tracing::warn!(listener = l.name(), error = %format!("{e:#}"), "TLS reload failed; the previous certificate is kept");
                    }
                }
            }
        });
    }
    Ok(())
}

/// `TCP_NODELAY` on a connection, plain or TLS (the accept loops set it on every one).
pub trait NoDelay {
    /// Sets it, ignoring failure (an already closed socket).
    fn no_delay(&self);
}

impl NoDelay for TcpStream {
    fn no_delay(&self) {
        let _ = self.set_nodelay(true);
    }
}

impl NoDelay for tokio_rustls::server::TlsStream<TcpStream> {
    fn no_delay(&self) {
        let _ = self.get_ref().0.set_nodelay(true);
    }
}
