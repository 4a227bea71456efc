//! The edge: a client from the user's kubeconfig (as kubectl finds it) and
//! the objects each command reads, fetched once.

use std::path::Path;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

const USER_AGENT: &str = concat!("kubectl-gpu/", env!("CARGO_PKG_VERSION"));

/// A client and the namespace the kubeconfig's context names.
pub struct Connection {
    pub client: kube::Client,
    pub default_namespace: String,
}

/// `--kubeconfig` wins, then `KUBECONFIG` and `~/.kube/config` (with
/// `--context`), then the in-cluster service account, as kubectl.
pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Connection> {
    gpu_dra_driver::service::kube_client::install_crypto_provider();
    let options = KubeConfigOptions { context: context.map(str::to_string), ..KubeConfigOptions::default() };
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("--context {}", context.unwrap_or_default()))?,
        None => kube::Config::infer().await.context("no kubeconfig found (set KUBECONFIG or pass --kubeconfig)")?,
    };
    let default_namespace = config.default_namespace.clone();
    let mut config = config;
    // Names the plugin in the API server's audit log, as kubectl names itself.
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
    let client = kube::Client::try_from(config).context("cannot build a client from the kubeconfig")?;
    Ok(Connection { client, default_namespace })
}

/// What the cluster holds for GPU scheduling, at one moment.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub slices: Vec<ResourceSlice>,
    pub classes: Vec<DeviceClass>,
    /// Every namespace's claims: allocations anywhere take devices.
    pub claims: Vec<ResourceClaim>,
    pub nodes: Vec<Node>,
}

/// The chart's roles for `kubectl gpu`'s users, named in a refusal.
pub const VIEWER_ROLE: &str = "ClusterRole <release>-gpu-viewer";
pub const METRICS_ROLE: &str = "Role <release>-gpu-metrics-reader (in the driver's namespace)";

/// An API server's answer in its own words and code; a refusal (403) also
/// says which of the chart's roles grants the call.
pub fn server_reason(error: &kube::Error, role: &str) -> String {
    match error {
        kube::Error::Api(status) => {
            let code = match status.reason.as_str() {
                "" => status.code.to_string(),
                reason => format!("{} {reason}", status.code),
            };
            let hint = if status.code == 403 {
                format!("; the chart's {role} grants it: ask your cluster's administrator to bind it to you")
            } else {
                String::new()
            };
            format!("{} ({code}){hint}", status.message.trim())
        }
        other => other.to_string(),
    }
}

/// `doing` failed: the server's answer as [`server_reason`] words it; any
/// other error with its causes.
fn failed(error: kube::Error, doing: String) -> anyhow::Error {
    match error {
        kube::Error::Api(_) => anyhow::anyhow!("{doing}: {}", server_reason(&error, VIEWER_ROLE)),
        other => anyhow::Error::new(other).context(doing),
    }
}

async fn list<K>(api: Api<K>, what: &str) -> Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api.list(&ListParams::default()).await.map_err(|e| failed(e, format!("listing {what}")))?.items)
}

/// Slices, classes, all claims and nodes.
pub async fn snapshot(client: &kube::Client) -> Result<Snapshot> {
    let (slices, classes, claims, nodes) = tokio::try_join!(
        list(Api::<ResourceSlice>::all(client.clone()), "resourceslices"),
        list(Api::<DeviceClass>::all(client.clone()), "deviceclasses"),
        list(Api::<ResourceClaim>::all(client.clone()), "resourceclaims"),
        list(Api::<Node>::all(client.clone()), "nodes"),
    )?;
    Ok(Snapshot { slices, classes, claims, nodes })
}

/// The claims of one namespace, or of all.
pub async fn claims(client: &kube::Client, namespace: Option<&str>) -> Result<Vec<ResourceClaim>> {
    let api = match namespace {
        Some(ns) => Api::<ResourceClaim>::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    list(api, "resourceclaims").await
}

/// A pod by name; `None` when there is none.
pub async fn pod(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<Pod>> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| failed(e, format!("getting pod {name}")))
}

/// The claim templates of a namespace (a pending pod's claims may not exist yet).
pub async fn templates(client: &kube::Client, namespace: &str) -> Result<Vec<ResourceClaimTemplate>> {
    list(Api::namespaced(client.clone(), namespace), "resourceclaimtemplates").await
}
