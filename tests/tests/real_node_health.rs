//! Device health in the pod's status, through the real kubelet of 1.37
//! (ResourceHealthStatus beta and on since 1.36): the kubelet opens our
//! plugin's `DRAResourceHealth` stream (v1 on 1.37) and shows each
//! container's devices in `status.containerStatuses[].allocatedResourcesStatus`
//! (`pkg/kubelet/cm/dra/manager.go`, `UpdateAllocatedResourcesStatus`:
//! the resource is `claim:<name>/<request>`, each device's id its first CDI
//! device id, the message shown with ResourceHealthStatusMessage, beta and
//! on since 1.36).
//!
//! The plugin discovers through the mock NVML; an XID appended to the
//! mock's event file reaches the plugin as NVML's critical-XID event. A
//! fault holds until the plugin restarts (as NVIDIA's device plugin keeps
//! an XID'd GPU unhealthy until it restarts): after the GPU is reset, the
//! plugin's pod is restarted and the kubelet's new stream says Healthy.
//! Needs root, like the real node.

use std::io::Write as _;
use std::path::Path;

use integration_tests::mock_nvml_node::MockNvmlNode;
use integration_tests::plugin_process::{PluginOptions, PluginProcess};
use integration_tests::real_cluster::driver::eventually_within;
use integration_tests::real_cluster::node::{NODE_WAIT, TEST_IMAGE, TWO_H100, cluster_with_node};
use integration_tests::real_cluster::objects::create_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams};
use serde_json::json;

const NODE: &str = "health-node";

/// One device's health as the pod shows it: (resource name, device id,
/// health, message).
type Shown = (String, String, String, String);

/// What the container `main` of `pod` shows of its devices' health.
fn shown(pod: &Pod) -> Vec<Shown> {
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    let main = statuses.into_iter().flatten().find(|c| c.name == "main");
    let mut out = Vec::new();
    for resource in main.and_then(|c| c.allocated_resources_status.as_ref()).into_iter().flatten() {
        for device in resource.resources.iter().flatten() {
            out.push((
                resource.name.clone(),
                device.resource_id.clone(),
                device.health.clone().unwrap_or_default(),
                device.message.clone().unwrap_or_default(),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn an_xid_shows_in_the_pods_status_and_a_restarted_plugin_shows_the_reset_gpu_healthy() {
    let (cluster, node, token) = cluster_with_node(NODE, Path::new(env!("CARGO_TARGET_TMPDIR"))).await;
    let gpus = MockNvmlNode::new(TWO_H100);
    let dirs = node.plugin_dirs(&cluster, TWO_H100, &token);
    let options = PluginOptions {
        node: NODE.into(),
        fake_inventory: false,
        extra_args: gpus.args(),
        env: gpus.env(),
        ..PluginOptions::default()
    };
    let mut plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let logs = |plugin: &PluginProcess| format!("{}\n{}\n---- plugin\n{}", cluster.logs(), node.logs(), plugin.log());

    // A pod holding one GPU, running until the test ends.
    let objects = [
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "one-gpu", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {
            "hostNetwork": true, "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
            // containerd has no CNI configuration: the node is NotReady.
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
            "containers": [{"name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"], "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}],
        }}),
    ];
    create_all(&cluster.admin(), &objects).await.unwrap_or_else(|e| panic!("{e}"));
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.admin(), "default");
    let health = |want: &'static str| {
        let pods = pods.clone();
        move || {
            let pods = pods.clone();
            async move {
                let shown = shown(&pods.get("trainer").await.ok()?);
                shown.iter().any(|s| s.2 == want).then_some(shown)
            }
        }
    };
    let healthy =
        eventually_within("the pod to show its GPU Healthy", NODE_WAIT, health("Healthy"), || logs(&plugin)).await;
    let claim = claims.get("one-gpu").await.unwrap();
    let uid = claim.metadata.uid.clone().unwrap();
    let result = &claim.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap()[0];
    let gpu = result.device.clone();
    let minor: u32 = gpu.trim_start_matches("gpu-").parse().unwrap();
    // The kubelet names the device by its first CDI id: the claim's spec.
    let cdi_id = format!("k8s.gpu.nvidia.com/claim={uid}-{gpu}");
    assert_eq!(healthy, [("claim:gpu/gpu".into(), cdi_id.clone(), "Healthy".into(), String::new())], "{healthy:?}");

    // XID 79 (fallen off the bus) on that GPU: Unhealthy, with the reason.
    let mut events = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(format!("{}.events", gpus.table().display()))
        .unwrap();
    writeln!(events, "{minor}|79").unwrap();
    let unhealthy =
        eventually_within("the pod to show its GPU Unhealthy", NODE_WAIT, health("Unhealthy"), || logs(&plugin)).await;
    assert_eq!(
        unhealthy,
        [("claim:gpu/gpu".into(), cdi_id.clone(), "Unhealthy".into(), "critical XID 79".into())],
        "{unhealthy:?}"
    );
    let pod = pods.get("trainer").await.unwrap();
    let restarts = pod.status.unwrap().container_statuses.unwrap()[0].restart_count;
    assert_eq!(restarts, 0, "an unhealthy device is reported, the container is not restarted");

    // The GPU is reset (NVML delivers no old event again: the mock's event
    // file is emptied) and the plugin's pod restarted: the new plugin
    // re-registers, the kubelet opens a new stream, the GPU is Healthy.
    drop(events);
    std::fs::write(format!("{}.events", gpus.table().display()), b"").unwrap();
    plugin.kill().unwrap();
    plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let recovered =
        eventually_within("the pod to show its GPU Healthy again", NODE_WAIT, health("Healthy"), || logs(&plugin))
            .await;
    assert_eq!(recovered, healthy);
    assert!(plugin.log().contains("kubelet opened the device health stream"), "{}", plugin.log());
    assert!(plugin.log().contains(r#"version="v1""#), "the kubelet of 1.37 uses health v1\n{}", plugin.log());

    pods.delete("trainer", &DeleteParams::default()).await.unwrap();
    eventually_within(
        "the pod to be gone",
        NODE_WAIT,
        || async { pods.get_opt("trainer").await.ok()?.is_none().then_some(()) },
        || logs(&plugin),
    )
    .await;
    drop(plugin);
}
