//! The webhook's certificate, reloaded when its files change (so that
//! cert-manager's rotation needs no restart). Each handshake checks the
//! files' modification times (two `stat`s). A new pair is used only when the
//! certificate parses as X.509 and the key is the certificate's (a rotation
//! caught between writing the certificate and its key, or a file holding
//! some other PEM block, would otherwise fail every handshake); else the
//! previous pair stays in use and why is logged, once per change of the
//! files.

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
    let pair = CertifiedKey::new(chain, signing);
    pair.keys_match().map_err(|error| match error {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            anyhow::anyhow!("the private key is not the key of the certificate in {}", cert.display())
        }
        rustls::Error::InconsistentKeys(_) => {
            anyhow::anyhow!("cannot tell whether the private key is the key of the certificate in {}", cert.display())
        }
        other => {
            anyhow::anyhow!("the first certificate in {} is not a valid X.509 certificate: {other}", cert.display())
        }
    })?;
    Ok(Arc::new(pair))
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
            Err(error) => {
                // Not retried (nor logged) again until the files change again.
                current.0 = stamps.0;
                current.1 = stamps.1;
                tracing::warn!(error = %format!("{error:#}"), "keeping the previous webhook certificate");
            }
        }
        current.2.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap().self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn served(reloading: &ReloadingCert) -> Vec<u8> {
        reloading.current().cert[0].to_vec()
    }

    #[test]
    fn a_bad_rotation_keeps_the_previous_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (cert, key) = pair("old");
        std::fs::write(&cert_path, &cert).unwrap();
        std::fs::write(&key_path, &key).unwrap();
        let reloading = ReloadingCert::new(cert_path.clone(), key_path.clone()).unwrap();
        let old = served(&reloading);
        let set_time = |path: &PathBuf, secs: u64| {
            let file = std::fs::File::options().write(true).open(path).unwrap();
            file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)).unwrap();
        };
        // A certificate rotated before its key.
        let (new_cert, new_key) = pair("new");
        std::fs::write(&cert_path, &new_cert).unwrap();
        set_time(&cert_path, 1_000);
        assert_eq!(served(&reloading), old);
        // A PEM "CERTIFICATE" block that is not X.509.
        std::fs::write(&cert_path, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
        std::fs::write(&key_path, &new_key).unwrap();
        set_time(&cert_path, 2_000);
        assert_eq!(served(&reloading), old);
        let error = load(&cert_path, &key_path).unwrap_err();
        assert!(format!("{error:#}").contains("not a valid X.509 certificate"), "{error:#}");
        // The matching pair is taken.
        std::fs::write(&cert_path, &new_cert).unwrap();
        set_time(&cert_path, 3_000);
        assert_ne!(served(&reloading), old);
        std::fs::write(&cert_path, &cert).unwrap();
        let error = load(&cert_path, &key_path).unwrap_err();
        assert!(format!("{error:#}").contains("is not the key of the certificate"), "{error:#}");
    }
}
