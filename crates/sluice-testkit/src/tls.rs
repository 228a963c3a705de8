//! Test certificates made at test time: a CA, a server certificate and a client certificate.
//!
//! TLS tests need files a real server reads (`redis-server --tls-cert-file`, PostgreSQL's
//! `ssl_cert_file`, `sluiced`'s `tls:` block). Generating them per test means no private key
//! is ever committed and every test has its own trust root.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::tempdir::TempDir;

static SERIAL: AtomicU64 = AtomicU64::new(1);

/// A throwaway CA with a server and a client certificate it signed, as PEM files in a temp
/// directory (removed on drop).
///
/// The server certificate names `localhost` and `127.0.0.1`; the client certificate is for
/// mTLS. [`TestPki::reissue_server`] rewrites the server files with a fresh certificate, for
/// reload tests.
pub struct TestPki {
    dir: TempDir,
    ca_params: CertificateParams,
    ca_key: KeyPair,
    ca_pem: String,
    server_pem: String,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn leaf_params(name: &str, usage: Vec<ExtendedKeyUsagePurpose>) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .context("certificate parameters")?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = usage;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.serial_number = Some(SERIAL.fetch_add(1, Ordering::Relaxed).into());
    Ok(params)
}

impl TestPki {
    /// Makes a CA, a server and a client certificate and writes `ca.pem`, `server.pem`,
    /// `server.key`, `client.pem` and `client.key`.
    pub fn new() -> Result<Self> {
        let dir = TempDir::new("pki")?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).context("CA params")?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "sluice test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().context("CA key")?;
        let ca_pem = ca_params
            .self_signed(&ca_key)
            .context("CA certificate")?
            .pem();
        let mut pki = TestPki {
            dir,
            ca_params,
            ca_key,
            ca_pem,
            server_pem: String::new(),
        };
        std::fs::write(pki.ca_file(), &pki.ca_pem).context("writing ca.pem")?;
        pki.reissue_server()?;
        let (cert, key) = pki.issue(
            "sluice test client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        std::fs::write(pki.client_cert_file(), cert).context("writing client.pem")?;
        std::fs::write(pki.client_key_file(), key).context("writing client.key")?;
        Ok(pki)
    }

    /// A certificate and key (PEM) signed by the CA.
    fn issue(&self, name: &str, usage: Vec<ExtendedKeyUsagePurpose>) -> Result<(String, String)> {
        let key = KeyPair::generate().context("leaf key")?;
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = leaf_params(name, usage)?
            .signed_by(&key, &issuer)
            .context("signing a leaf certificate")?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Writes a new server certificate and key (a new key, a new serial) over the old files,
    /// the key first, the certificate last (each by a rename, so a reader never sees half a
    /// file). Returns the new certificate's PEM.
    pub fn reissue_server(&mut self) -> Result<String> {
        // Client use too: Redis Cluster nodes present it to each other's bus, which always
        // asks for a certificate.
        let (cert, key) = self.issue(
            "sluice test server",
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
        write_atomically(&self.server_key_file(), &key)?;
        write_atomically(&self.server_cert_file(), &cert)?;
        self.server_pem = cert.clone();
        Ok(cert)
    }

    /// The directory holding the files.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate (PEM) file.
    #[must_use]
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The CA certificate's PEM.
    #[must_use]
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The current server certificate's PEM.
    #[must_use]
    pub fn server_pem(&self) -> &str {
        &self.server_pem
    }

    /// The server certificate (PEM) file.
    #[must_use]
    pub fn server_cert_file(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// The server private key (PEM) file.
    #[must_use]
    pub fn server_key_file(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The client certificate (PEM) file, for mTLS.
    #[must_use]
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The client private key (PEM) file, for mTLS.
    #[must_use]
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }
}

fn write_atomically(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}
