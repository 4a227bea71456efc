//! The edge: a client from the user's kubeconfig (as kubectl finds it),
//! with the driver's client settings, and the objects each command reads,
//! listed page by page (`limit`/`continue`, as kubectl's `--chunk-size`):
//! each page is turned into the compact form its command keeps and
//! dropped, so memory follows what is kept, not the cluster's size.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Context, Result, bail};
use dra_allocator::TaintRule;
use gpu_dra_driver::service::kube_client::{self, ApiTimeouts};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceTaintRule, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::explain::ClusterInput;

const USER_AGENT: &str = concat!("kubectl-gpu/", env!("CARGO_PKG_VERSION"));

/// Objects per page of a list: kubectl's default `--chunk-size`.
pub const PAGE: u32 = 500;
/// ResourceSlices per page: a slice holds up to 128 devices of a few
/// hundred bytes to kilobytes each, so a page of 500 would be hundreds of
/// megabytes of JSON.
pub const SLICE_PAGE: u32 = 50;

/// A client, the namespace the kubeconfig's context names, and the
/// server's address (named when it does not answer in time).
pub struct Connection {
    pub client: kube::Client,
    pub default_namespace: String,
    pub server: String,
}

/// `--kubeconfig` wins, then `KUBECONFIG` and `~/.kube/config` (with
/// `--context`), then the in-cluster service account, as kubectl. The
/// client is the driver's (`kube_client::client_with`): connect and read
/// timeouts, no retries of kube's own.
pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Connection> {
    kube_client::install_crypto_provider();
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
    let server = config.cluster_url.to_string();
    // Names the plugin in the API server's audit log, as kubectl names itself.
    let client = kube_client::client_with(config, Some(USER_AGENT), ApiTimeouts::default())
        .context("cannot build a client from the kubeconfig")?;
    Ok(Connection { client, default_namespace, server })
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
        kube::Error::Api(ref status) if status.code == 404 => {
            anyhow::Error::new(NotServed(format!("{doing}: {}", server_reason(&error, VIEWER_ROLE))))
        }
        kube::Error::Api(_) => anyhow::anyhow!("{doing}: {}", server_reason(&error, VIEWER_ROLE)),
        other => anyhow::Error::new(other).context(doing),
    }
}

/// A list the server answered 404 (NotFound): it does not serve that
/// resource (an older release), as opposed to failing.
#[derive(Debug)]
struct NotServed(String);

impl std::fmt::Display for NotServed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotServed {}

/// Lists `api` a page of `limit` at a time, handing each page to `each`,
/// which keeps what it needs; the page is then dropped. A server that
/// ignores `limit` (the real one may, e.g. from its watch cache) sends
/// one page with no `continue`.
pub async fn each_page<K>(
    api: &Api<K>,
    params: ListParams,
    limit: u32,
    what: &str,
    mut each: impl FnMut(Vec<K>) -> Result<()>,
) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.limit(limit);
    loop {
        let page = api.list(&params).await.map_err(|e| failed(e, format!("listing {what}")))?;
        let next = page.metadata.continue_.filter(|token| !token.is_empty());
        each(page.items)?;
        match next {
            // The same token again would page forever.
            Some(token) if params.continue_token.as_deref() == Some(token.as_str()) => {
                bail!("listing {what}: the server sent the same continue token twice")
            }
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// Every claim's allocations, a page at a time.
pub async fn each_claims_page(
    client: &kube::Client,
    namespace: Option<&str>,
    each: impl FnMut(Vec<ResourceClaim>) -> Result<()>,
) -> Result<()> {
    let api = match namespace {
        Some(ns) => Api::<ResourceClaim>::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    each_page(&api, ListParams::default(), PAGE, "resourceclaims", each).await
}

/// The driver's slices, a page at a time.
pub async fn each_slices_page(client: &kube::Client, each: impl FnMut(Vec<ResourceSlice>) -> Result<()>) -> Result<()> {
    each_page(&Api::<ResourceSlice>::all(client.clone()), ListParams::default(), SLICE_PAGE, "resourceslices", each)
        .await
}

/// The cluster's DeviceTaintRules (`resource.k8s.io/v1`, served from
/// 1.37; an older server's 404 means none). A rule that cannot be applied
/// (no taint key) is left out: the API server refuses such rules.
pub async fn taint_rules(client: &kube::Client) -> Result<Vec<TaintRule>> {
    let api = Api::<DeviceTaintRule>::all(client.clone());
    let mut rules = Vec::new();
    let listed = each_page(&api, ListParams::default(), PAGE, "devicetaintrules", |page| {
        rules.extend(page.iter().filter_map(|r| TaintRule::from_api(r).ok()));
        Ok(())
    })
    .await;
    match listed {
        Ok(()) => Ok(rules),
        Err(e) if e.downcast_ref::<NotServed>().is_some() => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The cluster as simulate's input: slices, classes, nodes and every
/// namespace's allocated claims (allocations anywhere take devices), but
/// the claims whose keys are in `except` (kept for the caller). One list
/// at a time, so at most one page is held.
pub async fn read_for_simulate(client: &kube::Client, except: HashSet<String>) -> Result<ClusterInput> {
    let mut input = ClusterInput::new(except);
    for rule in taint_rules(client).await? {
        input.add_taint_rule(rule);
    }
    each_slices_page(client, |page| input.add_slices(&page)).await?;
    let classes = Api::<DeviceClass>::all(client.clone());
    each_page(&classes, ListParams::default(), PAGE, "deviceclasses", |page| input.add_classes(&page)).await?;
    let nodes = Api::<Node>::all(client.clone());
    each_page(&nodes, ListParams::default(), PAGE, "nodes", |page| input.add_nodes(&page)).await?;
    each_claims_page(client, None, |page| input.add_claims(page)).await?;
    Ok(input)
}

/// A claim by name; `None` when there is none. Listed with a
/// `metadata.name` field selector, not fetched: the chart's viewer role
/// lists claims (what every command needs) and does not get them.
pub async fn claim(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<ResourceClaim>> {
    let api = Api::<ResourceClaim>::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    let mut found = None;
    each_page(&api, params, PAGE, "resourceclaims", |page| {
        found = found.take().or_else(|| page.into_iter().find(|c| c.metadata.name.as_deref() == Some(name)));
        Ok(())
    })
    .await?;
    Ok(found)
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
    let mut all = Vec::new();
    let api = Api::namespaced(client.clone(), namespace);
    each_page(&api, ListParams::default(), PAGE, "resourceclaimtemplates", |page| {
        all.extend(page);
        Ok(())
    })
    .await?;
    Ok(all)
}
