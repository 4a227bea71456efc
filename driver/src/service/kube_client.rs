//! The Kubernetes client: from `--kubeconfig`, else `KUBECONFIG`, else the
//! in-cluster service account.
//!
//! A kubeconfig whose server is plain `http://127.0.0.1:PORT` works: kube's
//! rustls connector is built with `https_or_http()`, so TLS is used only
//! for `https` URLs.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Where the client configuration came from (for logs and errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// `--kubeconfig FILE`.
    Flag(PathBuf),
    /// The `KUBECONFIG` environment variable (one or more paths).
    Env(String),
    /// The pod's service account and `KUBERNETES_SERVICE_HOST`.
    InCluster,
}

impl std::fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigSource::Flag(p) => write!(f, "--kubeconfig {}", p.display()),
            ConfigSource::Env(v) => write!(f, "KUBECONFIG={v}"),
            ConfigSource::InCluster => f.write_str("the in-cluster service account"),
        }
    }
}

/// Why no client could be built. Each names the source and the fix.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    #[error(
        "cannot load the kubeconfig from {source_desc}: {error}; fix: pass --kubeconfig with a readable kubeconfig file"
    )]
    Kubeconfig { source_desc: ConfigSource, error: kube::config::KubeconfigError },
    #[error(
        "no kubeconfig given and not running in a cluster ({error}); fix: pass --kubeconfig FILE, set KUBECONFIG, or run in a pod with a service account"
    )]
    InCluster { error: kube::config::InClusterError },
    #[error("cannot build a Kubernetes client from {source_desc}: {error}")]
    Client { source_desc: ConfigSource, error: kube::Error },
}

/// Picks the configuration source: the flag wins, then a non-empty
/// `KUBECONFIG`, then in-cluster.
pub fn config_source(flag: Option<&Path>, env: Option<String>) -> ConfigSource {
    match (flag, env.filter(|v| !v.trim().is_empty())) {
        (Some(path), _) => ConfigSource::Flag(path.to_path_buf()),
        (None, Some(env)) => ConfigSource::Env(env),
        (None, None) => ConfigSource::InCluster,
    }
}

/// Makes ring the process's rustls provider unless one is installed. The
/// workspace links rustls with both ring and aws-lc-rs enabled (through
/// other crates), and then rustls refuses to pick one by itself.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Builds a binary's client (see the module docs for the order).
/// `user_agent` (`gpu-kubelet-plugin/0.1.0`) names the binary in the API
/// server's audit log and is the field manager of its non-apply writes.
pub async fn client(
    kubeconfig: Option<&Path>,
    user_agent: &str,
) -> Result<(kube::Client, ConfigSource), KubeClientError> {
    let source = config_source(kubeconfig, std::env::var("KUBECONFIG").ok());
    let client = client_for(&source, Some(user_agent)).await?;
    Ok((client, source))
}

/// Builds a client from one kubeconfig file (tests and tools).
pub async fn client_from_file(path: &Path) -> Result<kube::Client, KubeClientError> {
    client_for(&ConfigSource::Flag(path.to_path_buf()), None).await
}

async fn client_for(source: &ConfigSource, user_agent: Option<&str>) -> Result<kube::Client, KubeClientError> {
    let mut config = config_for(source).await?;
    // A value that is not a valid header is dropped, never fatal: it only
    // labels requests.
    if let Some(value) = user_agent.and_then(|ua| axum::http::HeaderValue::from_str(ua).ok()) {
        config.headers.push((axum::http::header::USER_AGENT, value));
    }
    install_crypto_provider();
    kube::Client::try_from(config).map_err(|error| KubeClientError::Client { source_desc: source.clone(), error })
}

async fn config_for(source: &ConfigSource) -> Result<kube::Config, KubeClientError> {
    let kubeconfig_error = |error| KubeClientError::Kubeconfig { source_desc: source.clone(), error };
    let kubeconfig = match source {
        ConfigSource::Flag(path) => Kubeconfig::read_from(path).map_err(kubeconfig_error)?,
        ConfigSource::Env(_) => Kubeconfig::read().map_err(kubeconfig_error)?,
        ConfigSource::InCluster => {
            return kube::Config::incluster().map_err(|error| KubeClientError::InCluster { error });
        }
    };
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.map_err(kubeconfig_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_then_the_environment_then_in_cluster() {
        let flag = Path::new("/etc/kubeconfig");
        assert_eq!(config_source(Some(flag), Some("/x".into())), ConfigSource::Flag(flag.into()));
        assert_eq!(config_source(None, Some("/x:/y".into())), ConfigSource::Env("/x:/y".into()));
        assert_eq!(config_source(None, Some(" ".into())), ConfigSource::InCluster);
        assert_eq!(config_source(None, None), ConfigSource::InCluster);
    }

    #[tokio::test]
    async fn errors_name_the_source_and_the_fix() {
        let Err(err) = client_from_file(Path::new("/nonexistent/kubeconfig")).await else {
            panic!("a missing kubeconfig must fail");
        };
        let err = err.to_string();
        assert!(err.contains("--kubeconfig /nonexistent/kubeconfig"), "{err}");
        assert!(err.contains("fix:"), "{err}");
    }

    #[tokio::test]
    async fn a_plain_http_server_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n\
             contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {}}]\n",
        )
        .unwrap();
        let client = client_from_file(&path).await.unwrap();
        assert_eq!(client.default_namespace(), "default");
    }
}
