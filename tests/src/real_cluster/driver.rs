//! The driver's pieces on a real cluster, shared by the real-cluster test
//! files: the chart's objects installed as they are, each node's plugin on
//! its own ServiceAccount token, the controller on its own token, and
//! reading back what the real scheduler allocated.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{Device, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use super::Cluster;
use super::intercept::{Intercept, Trap};
use super::objects::create_all;
use crate::controller_process::ControllerProcess;
use crate::helm;
use crate::plugin_process::{PluginDirs, PluginOptions, PluginProcess};

/// How long a test waits for the cluster to act (the scheduler, the
/// controllers, a plugin's first publish) on a busy 2-core machine.
pub const WAIT: Duration = Duration::from_secs(90);
pub const NAMESPACE: &str = helm::NAMESPACE;
pub const PLUGIN_ACCOUNT: &str = "gpu-dra-driver-kubelet-plugin";
pub const CONTROLLER_ACCOUNT: &str = "gpu-dra-driver-controller";

/// Polls `check` until it gives `Some`, panicking with `context()` after `WAIT`.
pub async fn eventually<T, F, Fut>(what: &str, check: F, context: impl Fn() -> String) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(what, WAIT, check, context).await
}

/// [`eventually`] with a deadline of `wait`.
pub async fn eventually_within<T, F, Fut>(what: &str, wait: Duration, mut check: F, context: impl Fn() -> String) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + wait;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", context());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The chart as `helm install` renders it with `values` (Helm's engine,
/// from a virtual environment under `tmp_dir`).
pub fn chart(tmp_dir: &Path, values: Value) -> Vec<Value> {
    helm::rendered(&helm::render_all(tmp_dir, &[("real", values)]), "real").0
}

/// The documents of a YAML file, as `kubectl apply -f` reads them.
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    helm::documents(&path.display().to_string(), &text)
}

/// `helm install --create-namespace`: the namespace, then the objects.
pub async fn install(cluster: &Cluster, objects: &[Value]) {
    let namespaces: Api<Namespace> = Api::all(cluster.admin());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("Namespace");
    namespaces.create(&PostParams::default(), &namespace).await.expect("creating the release's namespace");
    if let Err(e) = create_all(&cluster.admin(), objects).await {
        panic!("the real API server refused the chart: {e}");
    }
}

/// The chart's objects without its workloads (webhook off: no controller
/// serves it), for tests that run the plugin as a process on a real node:
/// the real kubelet would otherwise start the chart's pods there, with an
/// image the node does not have. Helm's engine runs from under `tmp_dir`.
pub async fn install_without_workloads(cluster: &Cluster, tmp_dir: &Path) {
    let mut objects = chart(tmp_dir, json!({"webhook": {"enabled": false}}));
    objects.retain(|o| !matches!(o["kind"].as_str(), Some("Deployment" | "DaemonSet")));
    install(cluster, &objects).await;
}

/// A node's plugin on its own ServiceAccount token (bound to a pod on the
/// node), publishing its fake inventory's slices.
pub struct NodePlugin {
    pub node: String,
    pub dirs: PluginDirs,
    pub process: PluginProcess,
}

/// Makes the Node, starts its plugin with `inventory` and waits for its
/// first slices.
pub async fn start_plugin(cluster: &Cluster, node: &str, inventory: &Path) -> NodePlugin {
    start_plugin_with(cluster, node, inventory, &[]).await
}

/// [`start_plugin`] with more flags (feature gates, sharing modes).
pub async fn start_plugin_with(cluster: &Cluster, node: &str, inventory: &Path, extra_args: &[&str]) -> NodePlugin {
    let text = std::fs::read_to_string(inventory).unwrap_or_else(|e| panic!("{}: {e}", inventory.display()));
    let options = PluginOptions {
        node: node.to_string(),
        extra_args: extra_args.iter().map(ToString::to_string).collect(),
        ..PluginOptions::default()
    };
    start_plugin_with_options(cluster, &text, options).await
}

/// [`start_plugin`] on node `options.node` with any options (a mock NVML
/// instead of the fake inventory, a metrics address); `inventory_text` is
/// the fake inventory file's content (used when `options.fake_inventory`).
pub async fn start_plugin_with_options(cluster: &Cluster, inventory_text: &str, options: PluginOptions) -> NodePlugin {
    let node = options.node.as_str();
    cluster.create_node(node).await;
    let token = cluster.pod_bound_token(NAMESPACE, PLUGIN_ACCOUNT, node).await;
    let dirs = PluginDirs::new(inventory_text).unwrap_or_else(|e| panic!("plugin directories: {e}"));
    cluster.write_kubeconfig(&dirs.kubeconfig, &token);
    let process = PluginProcess::spawn(&dirs, &options).unwrap_or_else(|e| panic!("starting the plugin: {e}"));
    let plugin = NodePlugin { node: node.to_string(), dirs, process };
    let slices: Api<ResourceSlice> = Api::all(cluster.admin());
    let selector = format!("spec.nodeName={node}");
    eventually(
        &format!("{node}'s slices"),
        || {
            let slices = slices.clone();
            let selector = selector.clone();
            async move {
                let list = slices.list(&ListParams::default().fields(&selector)).await.ok()?;
                pools_complete(&list.items).then_some(())
            }
        },
        || plugin.process.log(),
    )
    .await;
    plugin
}

/// Waits for the Event with `reason` about the object `regarding` in
/// `namespace` (a controller's explanation), panicking with `context()`
/// after [`WAIT`].
pub async fn event_about(
    cluster: &Cluster,
    namespace: &str,
    regarding: &str,
    reason: &str,
    context: impl Fn() -> String,
) -> Event {
    let events: Api<Event> = Api::namespaced(cluster.admin(), namespace);
    eventually(
        &format!("the {reason} Event on {namespace}/{regarding}"),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding)
                    && e.reason.as_deref() == Some(reason)
            })
        },
        context,
    )
    .await
}

/// Whether `slices` are some and every pool among them (a driver's pool of
/// a name: the ComputeDomain driver's pool bears the node's name too) is
/// whole: as many
/// slices at its newest generation as they say the pool has. A plugin
/// writes a pool's slices one at a time (a GPU's counter set, its MIG
/// devices); a test that reads after the first one saw half a pool under
/// load (2 of 3 counter sets, a device missing).
pub fn pools_complete(slices: &[ResourceSlice]) -> bool {
    let mut newest: std::collections::BTreeMap<(&str, &str), (i64, i64, i64)> = std::collections::BTreeMap::new();
    for s in slices {
        let pool = &s.spec.pool;
        let key = (s.spec.driver.as_str(), pool.name.as_str());
        let entry = newest.entry(key).or_insert((pool.generation, pool.resource_slice_count, 0));
        if pool.generation > entry.0 {
            *entry = (pool.generation, pool.resource_slice_count, 0);
        }
        if pool.generation == entry.0 {
            entry.2 += 1;
        }
    }
    !newest.is_empty() && newest.values().all(|(_, count, seen)| seen == count)
}

/// The controller on its own token (bound to a pod on `node`, as the
/// chart's Deployment runs it), explaining at once, with `extra_args`.
pub async fn start_controller(cluster: &Cluster, identity: &str, node: &str, extra_args: &[&str]) -> ControllerProcess {
    let token = cluster.pod_bound_token(NAMESPACE, CONTROLLER_ACCOUNT, node).await;
    let dir = cluster.dir().join(format!("controller-{identity}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let kubeconfig = dir.join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, &token);
    let mut args = vec!["--explain-after", "0s"];
    args.extend_from_slice(extra_args);
    ControllerProcess::spawn(&kubeconfig, identity, &args).unwrap_or_else(|e| panic!("starting the controller: {e}"))
}

/// [`start_controller`] behind an [`Intercept`] front that springs `trap`
/// (the controller still calls with its own token, added by the front).
pub async fn start_controller_through(
    cluster: &Cluster,
    identity: &str,
    node: &str,
    trap: Arc<Trap>,
) -> (ControllerProcess, Intercept) {
    let token = cluster.pod_bound_token(NAMESPACE, CONTROLLER_ACCOUNT, node).await;
    let front = Intercept::start(cluster.client_with_token(&token).await, trap)
        .await
        .unwrap_or_else(|e| panic!("starting the front: {e}"));
    let dir = cluster.dir().join(format!("controller-{identity}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let kubeconfig = dir.join("kubeconfig");
    front.write_kubeconfig(&kubeconfig).unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    let process = ControllerProcess::spawn(&kubeconfig, identity, &["--explain-after", "0s"])
        .unwrap_or_else(|e| panic!("starting the controller: {e}"));
    (process, front)
}

/// `(pool, device)` of each result of the claim's allocation.
pub fn allocation(claim: &ResourceClaim) -> Vec<(String, String)> {
    results(claim).iter().map(|r| (r["pool"].as_str().unwrap_or_default().into(), device_of(r))).collect()
}

fn device_of(result: &Value) -> String {
    result["device"].as_str().unwrap_or_default().to_string()
}

/// The allocation's device results as JSON (request, pool, device,
/// shareID, consumedCapacity).
pub fn results(claim: &ResourceClaim) -> Vec<Value> {
    let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
    results
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| serde_json::to_value(r).unwrap_or_default())
        .collect()
}

/// The claim of a pod's first `resourceClaims` entry: the one it names, or
/// the one the controller manager made from its template (recorded in
/// the pod's status).
pub async fn pod_claim(cluster: &Cluster, namespace: &str, pod: &str) -> Option<ResourceClaim> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), namespace);
    let pod = pods.get(pod).await.ok()?;
    let named = pod.spec.as_ref()?.resource_claims.as_ref()?.first()?.resource_claim_name.clone();
    let name = match named {
        Some(name) => name,
        None => pod.status?.resource_claim_statuses?.first()?.resource_claim_name.clone()?,
    };
    Api::<ResourceClaim>::namespaced(cluster.admin(), namespace).get(&name).await.ok()
}

/// The node a pod is bound to, once it is.
pub async fn bound_node(cluster: &Cluster, namespace: &str, pod: &str) -> Option<String> {
    Api::<Pod>::namespaced(cluster.admin(), namespace).get(pod).await.ok()?.spec?.node_name
}

/// Whether the scheduler marked the pod unschedulable.
pub async fn unschedulable(cluster: &Cluster, namespace: &str, pod: &str) -> bool {
    let Ok(pod) = Api::<Pod>::namespaced(cluster.admin(), namespace).get(pod).await else {
        return false;
    };
    let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
    conditions
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
}

/// Device `device` of pool `pool` as the server holds it now.
async fn published_device(cluster: &Cluster, pool: &str, device: &str) -> Option<Device> {
    let slices = Api::<ResourceSlice>::all(cluster.admin()).list(&ListParams::default()).await.ok()?;
    slices
        .items
        .into_iter()
        .filter(|s| s.spec.pool.name == pool)
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .find(|d| d.name == device)
}

/// A published device's attribute (`{"string": ...}`, `{"int": ...}`, ...).
pub async fn device_attribute(cluster: &Cluster, pool: &str, device: &str, attribute: &str) -> Option<Value> {
    let device = published_device(cluster, pool, device).await?;
    serde_json::to_value(device.attributes.as_ref()?.get(attribute)?).ok()
}

/// A published device's capacity value (e.g. "80Gi").
pub async fn device_capacity(cluster: &Cluster, pool: &str, device: &str, capacity: &str) -> Option<String> {
    let device = published_device(cluster, pool, device).await?;
    Some(device.capacity.as_ref()?.get(capacity)?.value.0.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(pool: &str, generation: i64, count: i64) -> ResourceSlice {
        slice_of("gpu.nvidia.com", pool, generation, count)
    }

    fn slice_of(driver: &str, pool: &str, generation: i64, count: i64) -> ResourceSlice {
        serde_json::from_value(json!({"metadata": {"name": format!("{pool}-{generation}")},
            "spec": {"driver": driver, "nodeName": "n",
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": count}}}))
        .unwrap()
    }

    #[test]
    fn a_pool_is_complete_when_its_newest_generation_has_all_its_slices() {
        assert!(!pools_complete(&[]));
        assert!(pools_complete(&[slice("n", 1, 1)]));
        assert!(!pools_complete(&[slice("n", 1, 3), slice("n", 1, 3)]), "two of three");
        assert!(pools_complete(&[slice("n", 1, 2), slice("n", 1, 2)]));
        assert!(!pools_complete(&[slice("n", 1, 1), slice("n", 2, 2)]), "the newest generation has one of two");
        assert!(!pools_complete(&[slice("n", 1, 1), slice("m", 1, 2)]), "every pool counts");
        let two_drivers = [slice("n", 1, 1), slice_of("compute-domain.nvidia.com", "n", 1, 1)];
        assert!(pools_complete(&two_drivers), "pools of one name but two drivers are two pools");
    }
}
