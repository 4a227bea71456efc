//! The driver against the real Kubernetes control plane -- etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler -- of the oldest
//! and the newest supported release, built from their Go modules
//! (`tests/kube-bins/`, cached outside the clone). Each test starts its own
//! cluster and leaves no process or file behind.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use integration_tests::controller_process::ControllerProcess;
use integration_tests::helm::{self, render_all, rendered};
use integration_tests::kubelet::{Kubelet, KubeletConfig, claim};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, Release, V1_34, V1_37};
use integration_tests::{example_inventories, kubelet_plugin, run, stdout_ok, workspace_root};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const NAMESPACE: &str = helm::NAMESPACE;
const PLUGIN_ACCOUNT: &str = "gpu-dra-driver-kubelet-plugin";
const CONTROLLER_ACCOUNT: &str = "gpu-dra-driver-controller";

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// Polls `check` until it gives `Some`, panicking with `context()` after `WAIT`.
async fn eventually<T, F, Fut>(what: &str, mut check: F, context: impl Fn() -> String) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", context());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    helm::documents(&path.display().to_string(), &text)
}

/// The chart as `helm install` renders it with `values`.
fn chart(values: Value) -> Vec<Value> {
    rendered(&render_all(tmp_dir(), &[("real", values)]), "real").0
}

/// The chart's objects as the tests install them: the webhook off (no
/// controller serves it in these tests; with `failurePolicy: Fail` every
/// claim would be refused).
fn chart_without_webhook() -> Vec<Value> {
    chart(json!({"webhook": {"enabled": false}}))
}

/// `helm install --create-namespace`: the namespace, then the objects.
async fn install(cluster: &Cluster, objects: &[Value]) {
    let namespaces: Api<Namespace> = Api::all(cluster.admin());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    namespaces.create(&PostParams::default(), &namespace).await.unwrap();
    if let Err(e) = create_all(&cluster.admin(), objects).await {
        panic!("the real API server refused the chart: {e}");
    }
}

/// A node's plugin on its own ServiceAccount token (bound to a pod on the
/// node), publishing `inventory`'s slices.
struct NodePlugin {
    node: String,
    dirs: PluginDirs,
    process: PluginProcess,
}

async fn start_plugin(cluster: &Cluster, node: &str, inventory: &Path) -> NodePlugin {
    cluster.create_node(node).await;
    let token = cluster.pod_bound_token(NAMESPACE, PLUGIN_ACCOUNT, node).await;
    let dirs = PluginDirs::new(&std::fs::read_to_string(inventory).unwrap()).unwrap();
    cluster.write_kubeconfig(&dirs.kubeconfig, &token);
    let options = PluginOptions { node: node.to_string(), ..PluginOptions::default() };
    let process = PluginProcess::spawn(&dirs, &options).unwrap();
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
                (!list.items.is_empty()).then_some(())
            }
        },
        || plugin.process.log(),
    )
    .await;
    plugin
}

// ------------------------------------------------------------------ slices

fn taints(spec: &mut Value) -> impl Iterator<Item = &mut Value> {
    let devices = spec.get_mut("devices").and_then(Value::as_array_mut).into_iter().flatten();
    devices.flat_map(|d| d.get_mut("taints").and_then(Value::as_array_mut).into_iter().flatten())
}

/// Every slice every example inventory publishes passes the real API
/// server's validation, and reads back as written.
async fn example_slices_are_accepted(release: Release) {
    let cluster = Cluster::start(release).await;
    let slices: Api<ResourceSlice> = Api::all(cluster.admin());
    let mut created = 0;
    for inventory in example_inventories() {
        let node = inventory.file_stem().unwrap().to_string_lossy().to_string();
        let out = run(
            kubelet_plugin(),
            &["print-slices", "--node-name", &node, "--fake-inventory", inventory.to_str().unwrap(), "-o", "json"],
            None,
        );
        let list: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
        let printed: Vec<ResourceSlice> = serde_json::from_value(list["items"].clone()).unwrap();
        assert!(!printed.is_empty(), "{}", inventory.display());
        for slice in printed {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let stored = slices.create(&PostParams::default(), &slice).await.unwrap_or_else(|e| {
                panic!("{}: slice {name} refused by kube-apiserver {}: {e}", inventory.display(), release.minor)
            });
            // The server defaults a taint's `timeAdded` (SetDefaults_DeviceTaint);
            // everything else reads back as written.
            let mut stored_spec = serde_json::to_value(&stored.spec).unwrap();
            for taint in taints(&mut stored_spec) {
                let added = taint.as_object_mut().unwrap().remove("timeAdded");
                assert!(added.is_some_and(|t| t.is_string()), "{name}: a taint without timeAdded: {taint}");
            }
            assert_eq!(
                stored_spec,
                serde_json::to_value(&slice.spec).unwrap(),
                "{name}: the server stored a different spec"
            );
            created += 1;
        }
    }
    eprintln!("kube-apiserver {} accepted {created} slices", release.minor);
}

// ------------------------------------------------------ chart, RBAC, policy

/// The chart's manifests install as they are; each node's plugin publishes
/// on its own token; the ValidatingAdmissionPolicy refuses node A's plugin
/// writing node B's slice, and RBAC refuses it what the chart does not grant.
async fn chart_installs_and_plugins_publish_on_their_own_tokens(release: Release) {
    let cluster = Cluster::start(release).await;
    let objects = chart_without_webhook();
    install(&cluster, &objects).await;
    let a = start_plugin(&cluster, "node-a", &workspace_root().join("examples/inventories/dgx-h100.yaml")).await;

    let token = cluster.pod_bound_token(NAMESPACE, PLUGIN_ACCOUNT, "node-b").await;
    cluster.create_node("node-b").await;
    let node_b = cluster.client_with_token(&token).await;
    let node_a = {
        let token = cluster.pod_bound_token(NAMESPACE, PLUGIN_ACCOUNT, &a.node).await;
        cluster.client_with_token(&token).await
    };

    // Node B's plugin may write its own slice ...
    let slice = |node: &str| -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-by-hand")},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]},
        }))
        .unwrap()
    };
    Api::<ResourceSlice>::all(node_b.clone()).create(&PostParams::default(), &slice("node-b")).await.unwrap();
    // ... node A's may not write it, nor delete it, once the API server has
    // loaded the policy (it refreshes its policies about every second: a
    // new policy is not enforced at once, unlike in the stand-in).
    let message = eventually(
        "the ValidatingAdmissionPolicy to refuse node A's plugin",
        || async {
            let mut attempt = slice("node-b");
            attempt.metadata.name = Some("node-b-from-a".into());
            match Api::<ResourceSlice>::all(node_a.clone()).create(&PostParams::default(), &attempt).await {
                Ok(_) => {
                    let admin: Api<ResourceSlice> = Api::all(cluster.admin());
                    admin.delete("node-b-from-a", &Default::default()).await.unwrap();
                    None
                }
                Err(refused) => Some(refused.to_string()),
            }
        },
        || cluster.logs(),
    )
    .await;
    assert!(message.contains("may not modify ResourceSlices of node 'node-b'"), "{message}");
    let refused = Api::<ResourceSlice>::all(node_a.clone())
        .delete("node-b-by-hand", &Default::default())
        .await
        .expect_err("node A's plugin deleted a slice of node B");
    assert!(refused.to_string().contains("node 'node-b'"), "{refused}");
    // RBAC: the plugin's account reads no pods, writes no claims.
    let pods = Api::<Pod>::all(node_a.clone()).list(&ListParams::default()).await;
    assert!(matches!(pods, Err(kube::Error::Api(ref s)) if s.code == 403), "{pods:?}");

    // The plugin published its node's pool through its own token.
    let published = Api::<ResourceSlice>::all(cluster.admin())
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    let devices: usize = published.items.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum();
    assert!(devices >= 8, "node-a published {devices} devices\n{}", a.process.log());
    assert!(!a.process.log().contains("Forbidden"), "{}", a.process.log());
    drop(a.dirs);
}

// ------------------------------------------------- the real kube-scheduler

fn allocation(claim: &ResourceClaim) -> Vec<(String, String)> {
    let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
    results.and_then(|d| d.results.as_ref()).into_iter().flatten().map(|r| (r.pool.clone(), r.device.clone())).collect()
}

/// The claim a pod's `resourceClaims[name]` became.
async fn pod_claim(cluster: &Cluster, pod: &str) -> Option<ResourceClaim> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), "default");
    let pod = pods.get(pod).await.ok()?;
    let name = pod.status?.resource_claim_statuses?.first()?.resource_claim_name.clone()?;
    Api::<ResourceClaim>::namespaced(cluster.admin(), "default").get(&name).await.ok()
}

/// The demo's workload (`examples/demo/workload.yaml`, applied as it is):
/// the real kube-controller-manager makes the pods' claims from their
/// templates, the real kube-scheduler allocates them from the slices our
/// plugins publish and binds the pods (there is no kubelet: they stay
/// bound, not running), and the impossible one stays unschedulable. The
/// kubelet stand-in then has the node's plugin prepare a claim the
/// scheduler allocated.
async fn real_scheduler_allocates_from_our_slices(release: Release) {
    let cluster = Cluster::start(release).await;
    install(&cluster, &chart_without_webhook()).await;
    let inventories = workspace_root().join("examples/inventories");
    let dgx = start_plugin(&cluster, "dgx-h100-a", &inventories.join("dgx-h100.yaml")).await;
    let mig = start_plugin(&cluster, "hgx-a100-mig", &inventories.join("a100-mig.yaml")).await;
    let workload = yaml_documents(&workspace_root().join("examples/demo/workload.yaml"));
    create_all(&cluster.admin(), &workload).await.unwrap_or_else(|e| panic!("the real API server refused it: {e}"));

    let logs = || format!("{}\n{}\n{}", cluster.logs(), dgx.process.log(), mig.process.log());
    let mut placed = BTreeMap::new();
    // The scheduler scores the nodes that fit: an NVLink pair fits the DGX
    // and the HGX's two whole GPUs alike, so either is right for trainer.
    for (pod, nodes, devices) in [
        ("notebook", &["dgx-h100-a"][..], 1),
        ("trainer", &["dgx-h100-a", "hgx-a100-mig"][..], 2),
        ("tiny-llm", &["hgx-a100-mig"][..], 1),
    ] {
        let (bound_to, claim) = eventually(
            &format!("pod {pod} bound with its claim allocated"),
            || async {
                let bound = Api::<Pod>::namespaced(cluster.admin(), "default").get(pod).await.ok()?.spec?.node_name?;
                let claim = pod_claim(&cluster, pod).await?;
                (!allocation(&claim).is_empty()).then_some((bound, claim))
            },
            logs,
        )
        .await;
        assert!(nodes.contains(&bound_to.as_str()), "{pod} bound to {bound_to}, expected one of {nodes:?}");
        let allocated = allocation(&claim);
        assert_eq!(allocated.len(), devices, "{pod}: {allocated:?}");
        assert!(allocated.iter().all(|(pool, _)| *pool == bound_to), "{pod}: {allocated:?}");
        let reserved = claim.status.as_ref().and_then(|s| s.reserved_for.as_ref()).map_or(0, Vec::len);
        assert_eq!(reserved, 1, "{pod}: the scheduler reserves the claim for the pod");
        placed.insert(pod, claim);
    }
    // The MIG request got a 1g MIG device; the pair shares an NVLink group.
    let slices = Api::<ResourceSlice>::all(cluster.admin()).list(&ListParams::default()).await.unwrap();
    let attribute = |pool: &str, device: &str, name: &str| -> Option<Value> {
        let device = slices
            .items
            .iter()
            .filter(|s| s.spec.pool.name == pool)
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == device)?;
        serde_json::to_value(device.attributes.as_ref()?.get(name)?).ok()
    };
    let (pool, device) = &allocation(&placed["tiny-llm"])[0];
    let profile = attribute(pool, device, "profile").unwrap_or_else(|| panic!("{device} has no profile"));
    assert!(profile["string"].as_str().is_some_and(|p| p.starts_with("1g.")), "{profile}");
    let pair = allocation(&placed["trainer"]);
    let groups: Vec<_> = pair.iter().map(|(pool, device)| attribute(pool, device, "nvlinkGroup")).collect();
    assert!(groups[0].is_some() && groups[0] == groups[1], "{groups:?}");

    // Eight B200s exist nowhere: the scheduler leaves that pod pending.
    eventually(
        "big-model to be marked unschedulable",
        || async {
            let pod = Api::<Pod>::namespaced(cluster.admin(), "default").get("big-model").await.ok()?;
            let conditions = pod.status?.conditions?;
            conditions
                .iter()
                .any(|c| {
                    c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
                })
                .then_some(())
        },
        logs,
    )
    .await;

    // The node's plugin prepares what the real scheduler chose.
    let kubelet = Kubelet::new(KubeletConfig::new(&dgx.dirs.registry, "gpu.nvidia.com"));
    let plugin = kubelet.wait_and_register(WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", dgx.process.log()));
    let notebook = &placed["notebook"];
    let uid = notebook.metadata.uid.clone().unwrap();
    let request = claim("default", notebook.metadata.name.as_deref().unwrap(), &uid);
    let prepared = kubelet.prepare(&plugin, &[request]).await.unwrap_or_else(|e| panic!("{e}\n{}", dgx.process.log()));
    let devices = &prepared[&uid];
    assert_eq!(devices.len(), 1);
    assert_eq!((devices[0].pool_name.clone(), devices[0].device_name.clone()), allocation(notebook)[0]);
    assert!(!devices[0].cdi_device_ids.is_empty(), "{devices:?}");
}

// ------------------------------------------------------------ the controller

/// The controller on its own token (bound to a pod on a node, as the
/// chart's Deployment runs it).
async fn start_controller(cluster: &Cluster, identity: &str, node: &str) -> ControllerProcess {
    let token = cluster.pod_bound_token(NAMESPACE, CONTROLLER_ACCOUNT, node).await;
    let dir = cluster.dir().join(format!("controller-{identity}"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, &token);
    ControllerProcess::spawn(&kubeconfig, identity, &["--explain-after", "0s"]).unwrap()
}

async fn lease_holder(cluster: &Cluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.admin(), NAMESPACE);
    leases.get("gpu-dra-controller").await.ok()?.spec?.holder_identity
}

/// Two controllers on their own tokens elect a leader on a real Lease; the
/// leader explains an unsatisfiable claim with an Event the real API
/// server stores, allocates a delegated claim through the real status
/// subresource; when it is killed the other takes the Lease over.
async fn controller_explains_allocates_and_fails_over(release: Release) {
    let cluster = Cluster::start(release).await;
    install(&cluster, &chart_without_webhook()).await;
    let inventories = workspace_root().join("examples/inventories");
    let dgx = start_plugin(&cluster, "dgx-h100-a", &inventories.join("dgx-h100.yaml")).await;
    let mut controllers: BTreeMap<String, ControllerProcess> = BTreeMap::new();
    for identity in ["replica-a", "replica-b"] {
        controllers.insert(identity.to_string(), start_controller(&cluster, identity, "dgx-h100-a").await);
    }
    let logs = |controllers: &BTreeMap<String, ControllerProcess>| {
        let mut text = format!("{}\n{}", cluster.logs(), dgx.process.log());
        for (id, c) in controllers {
            text += &format!("\n---- controller {id}\n{}", c.log());
        }
        text
    };
    let leader = eventually("a leader", || lease_holder(&cluster), || logs(&controllers)).await;
    assert!(controllers.contains_key(&leader), "{leader}");

    // An impossible claim with a pod waiting for it: explained.
    let claims = yaml_documents(&workspace_root().join("examples/claims/08-unsatisfiable.yaml"));
    create_all(&cluster.admin(), &claims[..1]).await.unwrap();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x"}],
                 "resourceClaims": [{"name": "gpus", "resourceClaimName": "eight-b200"}]}});
    create_all(&cluster.admin(), &[pod]).await.unwrap();
    let events: Api<Event> = Api::namespaced(cluster.admin(), "default");
    let event = eventually(
        "the explanation Event on the claim",
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("eight-b200")
                    && e.reason.as_deref() == Some("Unsatisfiable")
            })
        },
        || logs(&controllers),
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reporting_controller.as_deref(), Some("gpu.nvidia.com/controller"));
    let note = event.note.clone().unwrap_or_default();
    assert!(note.contains("default/eight-b200"), "{note}");

    // A delegated claim: the controller allocates it through /status.
    let delegated = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "delegated", "namespace": "default", "annotations": {"gpu.nvidia.com/allocate": "true"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}});
    create_all(&cluster.admin(), &[delegated]).await.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.admin(), "default");
    let allocated = eventually(
        "the delegated claim's allocation",
        || async {
            let claim = claims.get("delegated").await.ok()?;
            let devices = allocation(&claim);
            (!devices.is_empty()).then_some(devices)
        },
        || logs(&controllers),
    )
    .await;
    assert_eq!(allocated.len(), 1);
    assert_eq!(allocated[0].0, "dgx-h100-a");

    // The leader dies: the other takes the Lease over.
    controllers.get_mut(&leader).unwrap().kill();
    let next = eventually(
        "the other replica to take the Lease",
        || async { lease_holder(&cluster).await.filter(|holder| *holder != leader) },
        || logs(&controllers),
    )
    .await;
    assert!(controllers.contains_key(&next) && next != leader, "{next}");
    for (id, controller) in &controllers {
        assert!(!controller.log().contains("Forbidden"), "controller {id} was refused a call:\n{}", controller.log());
    }
}

macro_rules! on_release {
    ($module:ident, $release:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread")]
            async fn example_slices_are_accepted() {
                super::example_slices_are_accepted($release).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn chart_installs_and_plugins_publish_on_their_own_tokens() {
                super::chart_installs_and_plugins_publish_on_their_own_tokens($release).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn real_scheduler_allocates_from_our_slices() {
                super::real_scheduler_allocates_from_our_slices($release).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn controller_explains_allocates_and_fails_over() {
                super::controller_explains_allocates_and_fails_over($release).await
            }
        }
    };
}

on_release!(k8s_1_34, V1_34);
on_release!(k8s_1_37, V1_37);
