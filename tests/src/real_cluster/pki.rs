//! The cluster's keys, made fresh by each test: a CA, the API server's
//! serving certificate (loopback names), and the service-account token
//! signing key pair. The CA also signs client certificates (the real
//! node's kubelet authenticates as `system:node:<name>`).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// Files under the cluster's directory.
pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub service_account_public: PathBuf,
    pub service_account_private: PathBuf,
    /// The CA, for [`Pki::client_certificate`].
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    pub fn write(dir: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "gpu-dra-driver tests CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default.svc".to_string(),
        ])?;
        serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        let service_account = KeyPair::generate()?;
        let pki = Self {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            service_account_public: dir.join("sa.pub"),
            service_account_private: dir.join("sa.key"),
            issuer,
        };
        std::fs::write(&pki.ca_cert, ca_cert.pem())?;
        std::fs::write(&pki.serving_cert, serving_cert.pem())?;
        std::fs::write(&pki.serving_key, serving_key.serialize_pem())?;
        std::fs::write(&pki.service_account_public, service_account.public_key_pem())?;
        std::fs::write(&pki.service_account_private, service_account.serialize_pem())?;
        Ok(pki)
    }

    /// A client certificate for `user` in `group` (the API server takes
    /// the common name as the user and the organization as the group), as
    /// PEM (certificate, key).
    pub fn client_certificate(&self, user: &str, group: &str) -> Result<(String, String), rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        params.distinguished_name.push(DnType::OrganizationName, group);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}
