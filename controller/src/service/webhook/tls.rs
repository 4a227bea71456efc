//! The webhook's certificate, reloaded when its files change (so that
//! cert-manager's rotation needs no restart). Each handshake checks the
//! files' modification times (two `stat`s); a file that fails to load keeps
//! the previous certificate in use, and the failure is logged.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Option<SystemTime>, Option<SystemTime>, Arc<CertifiedKey>)>,
}

fn modified(path: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn load(cert: &PathBuf, key: &PathBuf) -> anyhow::Result<Arc<CertifiedKey>> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {}", cert.display()))?;
    anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
    let key =
        PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading the private key {}", key.display()))?;
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let signing = provider.key_provider.load_private_key(key).context("the private key is not usable")?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

impl ReloadingCert {
    pub fn new(cert: PathBuf, key: PathBuf) -> anyhow::Result<Self> {
        let loaded = load(&cert, &key)?;
        let stamps = (modified(&cert), modified(&key));
        Ok(ReloadingCert { current: RwLock::new((stamps.0, stamps.1, loaded)), cert, key })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let stamps = (modified(&self.cert), modified(&self.key));
        {
            let current = self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if (current.0, current.1) == stamps {
                return current.2.clone();
            }
        }
        let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        match load(&self.cert, &self.key) {
            Ok(loaded) => {
                tracing::info!(cert = %self.cert.display(), "loaded the rotated webhook certificate");
                *current = (stamps.0, stamps.1, loaded);
            }
            Err(error) => tracing::warn!(error = %format!("{error:#}"), "keeping the previous webhook certificate"),
        }
        current.2.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}
