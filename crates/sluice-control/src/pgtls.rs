//! TLS to PostgreSQL over rustls: `sslmode` as libpq reads it, with tokio-postgres' own
//! negotiation underneath.
//!
//! tokio-postgres knows `disable`, `prefer` and `require` and takes the TLS implementation
//! from the caller; this module is that implementation (a `MakeTlsConnect` over
//! tokio-rustls) and reads `sslmode=verify-ca|verify-full` and `sslrootcert=FILE` out of the
//! URL first. As in libpq, `require` without `sslrootcert` encrypts without verifying the
//! server; with it, it verifies the chain like `verify-ca`; `verify-full` checks the host name
//! too. See `docs/tls.md`.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{
    CryptoProvider, WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Nothing (encryption only: libpq's `require` without a root certificate).
    None,
    /// The chain up to the root certificate (`verify-ca`).
    Chain,
    /// The chain and the host name (`verify-full`).
    Full,
}

/// A URL with the sslmode values tokio-postgres does not parse taken out, and what they asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The URL tokio-postgres parses (`verify-*` become `require`, `sslrootcert` removed).
    pub url: String,
    /// How to verify the server.
    pub verify: Verify,
    /// `sslrootcert`, when given.
    pub root_cert: Option<String>,
}

/// Reads `sslmode` and `sslrootcert` from a URL's query string.
pub fn split_url(url: &str) -> Split {
    let Some((base, query)) = url.split_once('?') else {
        return Split {
            url: url.to_string(),
            verify: Verify::None,
            root_cert: None,
        };
    };
    let mut kept = Vec::new();
    let mut mode = None;
    let mut root_cert = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslrootcert", v)) => root_cert = Some(v.to_string()),
            Some(("sslmode", v @ ("verify-ca" | "verify-full"))) => {
                mode = Some(v.to_string());
                kept.push("sslmode=require".to_string());
            }
            _ => kept.push(pair.to_string()),
        }
    }
    let verify = match (mode.as_deref(), &root_cert) {
        (Some("verify-full"), _) => Verify::Full,
        (Some(_), _) | (None, Some(_)) => Verify::Chain,
        (None, None) => Verify::None,
    };
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Split {
        url,
        verify,
        root_cert,
    }
}

/// The rustls client configuration for `verify` against the PEM roots in `root_cert`.
pub fn client_config(verify: Verify, root_cert: Option<&Path>) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier(verify, root_cert, provider)?)
        .with_no_client_auth())
}

/// What checks the server's certificate for `verify`: webpki itself for `verify-full`, a
/// [`Relaxed`] one for the two modes libpq checks less in.
fn verifier(
    verify: Verify,
    root_cert: Option<&Path>,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, String> {
    let algorithms = provider.signature_verification_algorithms;
    if verify == Verify::None {
        return Ok(Arc::new(Relaxed {
            chain: None,
            algorithms,
        }));
    }
    let path = root_cert.ok_or("sslmode=verify-ca/verify-full needs sslrootcert=FILE")?;
    let roots = read_roots(path).map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(if verify == Verify::Full {
        webpki
    } else {
        Arc::new(Relaxed {
            chain: Some(webpki),
            algorithms,
        })
    })
}

/// Every certificate of a PEM file, as trust roots.
fn read_roots(path: &Path) -> Result<RootCertStore, Box<dyn std::error::Error>> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path)? {
        roots.add(cert?)?;
    }
    Ok(roots)
}

/// The server's certificate checked less than webpki checks it, as libpq does short of
/// `verify-full`; the handshake's signatures are checked all the same, with the provider's
/// algorithms (those webpki's own verifier uses).
#[derive(Debug)]
struct Relaxed {
    /// The chain's verifier, whose refusal of the host name alone is ignored (`verify-ca`);
    /// `None` accepts any certificate (libpq's `require` without a root certificate).
    chain: Option<Arc<WebPkiServerVerifier>>,
    /// What the handshake's signatures are checked with.
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Relaxed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// tokio-postgres' TLS maker over one rustls client configuration.
#[derive(Clone)]
pub struct MakeRustls(Arc<ClientConfig>);

impl MakeRustls {
    /// A maker for `config`.
    pub fn new(config: ClientConfig) -> MakeRustls {
        MakeRustls(Arc::new(config))
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name = ServerName::try_from(domain.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(RustlsConnect {
            connector: tokio_rustls::TlsConnector::from(self.0.clone()),
            name,
        })
    }
}

/// One connection's TLS handshake.
pub struct RustlsConnect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let s = self.connector.connect(self.name, stream).await?;
            Ok(RustlsStream(Box::new(s)))
        })
    }
}

/// A TLS connection to PostgreSQL (no channel binding: SCRAM without `-PLUS`).
pub struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_values_tokio_postgres_lacks_are_read_out_of_the_url() {
        let s = split_url("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&x=1");
        assert_eq!(s.url, "postgres://u@h/db?sslmode=require&x=1");
        assert_eq!(s.verify, Verify::Full);
        assert_eq!(s.root_cert.as_deref(), Some("/ca.pem"));
        let s = split_url("postgres://u@h/db?sslmode=require");
        assert_eq!(
            (s.url.as_str(), s.verify),
            ("postgres://u@h/db?sslmode=require", Verify::None)
        );
        let s = split_url("postgres://u@h/db?sslmode=require&sslrootcert=/ca.pem");
        assert_eq!(
            s.verify,
            Verify::Chain,
            "libpq: a root certificate means verify-ca"
        );
        assert_eq!(split_url("postgres://u@h/db").verify, Verify::None);
        assert!(
            client_config(Verify::Full, None).is_err(),
            "verify-full needs a root"
        );
    }

    #[test]
    fn each_mode_checks_what_libpq_checks_of_the_server_certificate() {
        let pki = sluice_testkit::TestPki::new().expect("test certificates");
        let other = sluice_testkit::TestPki::new().expect("another CA");
        let server =
            CertificateDer::from_pem_file(pki.server_cert_file()).expect("the server certificate");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let ca = pki.ca_file();
        let wrong = other.ca_file();
        let check = |verify: Verify, root: Option<&Path>, name: &'static str| {
            verifier(verify, root, provider.clone())
                .expect("a verifier")
                .verify_server_cert(
                    &server,
                    &[],
                    &ServerName::try_from(name).expect("a server name"),
                    &[],
                    UnixTime::now(),
                )
                .map(|_| ())
        };
        let wrong_name = |r: Result<(), rustls::Error>| {
            matches!(
                r,
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForName
                        | rustls::CertificateError::NotValidForNameContext { .. }
                ))
            )
        };

        assert_eq!(check(Verify::Full, Some(&ca), "localhost"), Ok(()));
        assert!(wrong_name(check(Verify::Full, Some(&ca), "db.example")));
        assert!(check(Verify::Full, Some(&wrong), "localhost").is_err());

        assert_eq!(
            check(Verify::Chain, Some(&ca), "db.example"),
            Ok(()),
            "verify-ca does not check the host name"
        );
        let err = check(Verify::Chain, Some(&wrong), "localhost");
        assert!(
            matches!(err, Err(rustls::Error::InvalidCertificate(_))) && !wrong_name(err.clone()),
            "verify-ca checks the chain: {err:?}"
        );

        assert_eq!(check(Verify::None, None, "db.example"), Ok(()));
        assert_eq!(check(Verify::None, Some(&wrong), "db.example"), Ok(()));

        let schemes = |verify: Verify| {
            verifier(verify, Some(&ca), provider.clone())
                .expect("a verifier")
                .supported_verify_schemes()
        };
        let full = schemes(Verify::Full);
        assert!(!full.is_empty());
        assert_eq!(schemes(Verify::Chain), full);
        assert_eq!(schemes(Verify::None), full);
    }

    #[test]
    fn an_unreadable_root_file_is_named() {
        let err = client_config(Verify::Chain, Some(Path::new("/nonexistent/ca.pem")))
            .expect_err("no such file");
        assert!(
            err.starts_with("sslrootcert /nonexistent/ca.pem: "),
            "{err}"
        );
        let pki = sluice_testkit::TestPki::new().expect("test certificates");
        let empty = pki.dir().join("empty.pem");
        std::fs::write(&empty, "").expect("an empty file");
        assert_eq!(
            client_config(Verify::Full, Some(&empty)).map(|_| ()),
            Err("no root trust anchors were provided".into()),
            "an empty root file is refused by webpki"
        );
    }
}
