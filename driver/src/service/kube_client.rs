//! The Kubernetes client: from `--kubeconfig`, else `KUBECONFIG`, else the
//! in-cluster service account.
//!
//! A kubeconfig whose server is plain `http://127.0.0.1:PORT` works: kube's
//! rustls connector is built with `https_or_http()`, so TLS is used only
//! for `https` URLs.
//!
//! Every client has connect and read timeouts ([`ApiTimeouts`]) and no
//! retries of its own: kube's default retry layer retries 429/503/504 up to
//! 15 times with delays growing to 1,000 s, which made one prepare against
//! an API server answering 503 wait 700 s. Callers retry within their own
//! deadline instead (see [`super::api_call`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// A log directive for the binaries' filters: kube's HTTP trace layer logs
/// every failed request at ERROR with the server's status, one line per
/// request (a server answering 503 made 96 lines in 12 s); our callers log
/// failures themselves, in words and rate-limited. Left out when the
/// user's filter names `kube_client` (asking for those lines).
pub fn request_log_directive(user_filter: &str) -> Option<&'static str> {
    (!user_filter.contains("kube_client")).then_some("kube_client::client::builder=off")
}

/// How long a client waits for the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiTimeouts {
    /// To open a connection.
    pub connect: Duration,
    /// For the next bytes of a response (counted from when the request was
    /// sent): a server that stops answering mid-body, or sends a body
    /// shorter than its Content-Length and keeps the connection open, fails
    /// the call after this long instead of holding it for good.
    pub read: Duration,
}

impl Default for ApiTimeouts {
    /// 5 s to connect (client-go's dialer uses 30 s; a server on the same
    /// network answers in milliseconds), 30 s to read: a watch stays
    /// quiet longer only if the server sends no bookmark, and the
    /// watchers ask the server to end a watch before that
    /// ([`ApiTimeouts::watch_timeout_seconds`]).
    fn default() -> Self {
        Self { connect: Duration::from_secs(5), read: Duration::from_secs(30) }
    }
}

impl ApiTimeouts {
    /// Both from one read timeout (the binaries' `--api-timeout`).
    pub fn with_read(read: Duration) -> Self {
        Self { connect: ApiTimeouts::default().connect.min(read), read }
    }

    /// The `timeoutSeconds` a watch asks for: the server ends a quiet watch
    /// (and the watcher resumes it from its resourceVersion) before the
    /// read timeout would cut it as a failure. At least 1 s.
    pub fn watch_timeout_seconds(&self) -> u32 {
        let secs = self.read.as_secs().saturating_mul(2) / 3;
        u32::try_from(secs.clamp(1, 290)).unwrap_or(290)
    }
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
    timeouts: ApiTimeouts,
) -> Result<(kube::Client, ConfigSource), KubeClientError> {
    let source = config_source(kubeconfig, std::env::var("KUBECONFIG").ok());
    let client = client_for(&source, Some(user_agent), timeouts).await?;
    Ok((client, source))
}

/// Builds a client from one kubeconfig file (tests and tools).
pub async fn client_from_file(path: &Path) -> Result<kube::Client, KubeClientError> {
    client_for(&ConfigSource::Flag(path.to_path_buf()), None, ApiTimeouts::default()).await
}

async fn client_for(
    source: &ConfigSource,
    user_agent: Option<&str>,
    timeouts: ApiTimeouts,
) -> Result<kube::Client, KubeClientError> {
    let config = config_for(source).await?;
    client_with(config, user_agent, timeouts)
        .map_err(|error| KubeClientError::Client { source_desc: source.clone(), error })
}

/// A client from a configuration read elsewhere (`kubectl gpu` reads the
/// user's kubeconfig with `--context`), with the same settings as the
/// binaries' clients: the timeouts, no retries of kube's own, `user_agent`.
pub fn client_with(
    mut config: kube::Config,
    user_agent: Option<&str>,
    timeouts: ApiTimeouts,
) -> Result<kube::Client, kube::Error> {
    config.connect_timeout = Some(timeouts.connect);
    config.read_timeout = Some(timeouts.read);
    config.write_timeout = Some(timeouts.read);
    // Counted from the request, not from when a pooled connection went idle.
    config.reset_reader_on_write = true;
    config.default_retry = false;
    // A value that is not a valid header is dropped, never fatal: it only
    // labels requests.
    if let Some(value) = user_agent.and_then(|ua| axum::http::HeaderValue::from_str(ua).ok()) {
        config.headers.push((axum::http::header::USER_AGENT, value));
    }
    install_crypto_provider();
    kube::Client::try_from(config)
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

    #[test]
    fn watches_end_before_the_read_timeout() {
        assert_eq!(ApiTimeouts::default().watch_timeout_seconds(), 20);
        assert_eq!(ApiTimeouts::with_read(Duration::from_secs(1)).watch_timeout_seconds(), 1);
        assert_eq!(ApiTimeouts::with_read(Duration::from_secs(3600)).watch_timeout_seconds(), 290);
        assert_eq!(ApiTimeouts::with_read(Duration::from_secs(2)).connect, Duration::from_secs(2));
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
