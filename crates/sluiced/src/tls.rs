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
