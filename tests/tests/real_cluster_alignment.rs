//! What `resource.kubernetes.io/pcieRoot` is for, under the real 1.37
//! kube-scheduler: a claim asks for a GPU of ours and a NIC of another
//! driver (a test driver whose slice the test publishes, as a NIC driver's
//! plugin would) with one `matchAttribute` on the standard attribute, and
//! gets the GPU that shares the NIC's PCIe root (GPUDirect RDMA). A claim
//! that cannot align (three GPUs on one root that has two) stays pending,
//! and `kubectl gpu why` says which constraint keeps it out.

use std::path::Path;

use integration_tests::real_cluster::driver::{
    allocation, bound_node, chart, device_attribute, eventually, install, pod_claim, start_plugin, unschedulable,
};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, V1_37};
use integration_tests::{kubectl_gpu, run, stdout_ok, workspace_root};
use serde_json::{Value, json};

const NODE: &str = "dgx";
const NIC_DRIVER: &str = "nic.example.com";
/// The NICs' PCIe roots: those of the DGX inventory's GPUs 0 and 1, and 4
/// and 5 (`print-slices` shows them).
const NIC_ROOTS: [&str; 2] = ["pci0000:17", "pci0000:57"];

/// The NIC driver's class and its slice on the node: a NIC on each of two
/// roots that have two GPUs each.
fn nic_driver() -> Vec<Value> {
    vec![
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NIC_DRIVER},
               "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{NIC_DRIVER}'")}}]}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "dgx-nics"},
               "spec": {"driver": NIC_DRIVER, "nodeName": NODE,
                        "pool": {"name": "dgx-nics", "generation": 1, "resourceSliceCount": 1},
                        "devices": NIC_ROOTS.iter().enumerate().map(|(i, root)| json!({"name": format!("nic-{i}"),
                            "attributes": {"resource.kubernetes.io/pcieRoot": {"string": root}}})).collect::<Vec<_>>()}}),
    ]
}

/// A claim for `gpus` GPUs and the NIC on one PCIe root, and a pod using it.
fn aligned(name: &str, gpus: u32) -> Vec<Value> {
    vec![
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": name, "namespace": "default"},
               "spec": {"devices": {
                   "requests": [
                       {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}},
                       {"name": "nic", "exactly": {"deviceClassName": NIC_DRIVER}}],
                   "constraints": [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]}}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
               "spec": {"containers": [{"name": "main", "image": "registry.invalid/app",
                                         "resources": {"claims": [{"name": "devices"}]}}],
                        "resourceClaims": [{"name": "devices", "resourceClaimName": name}]}}),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gpu_and_a_nic_of_another_driver_share_a_pcie_root_1_37() {
    let cluster = Cluster::start(V1_37).await;
    install(&cluster, &chart(Path::new(env!("CARGO_TARGET_TMPDIR")), json!({"webhook": {"enabled": false}}))).await;
    let plugin = start_plugin(&cluster, NODE, &workspace_root().join("examples/inventories/dgx-h100.yaml")).await;
    let logs = || format!("{}\n---- plugin\n{}", cluster.logs(), plugin.process.log());
    create_all(&cluster.admin(), &nic_driver()).await.unwrap_or_else(|e| panic!("the NIC driver's objects: {e}"));

    create_all(&cluster.admin(), &aligned("rdma", 1)).await.unwrap_or_else(|e| panic!("{e}"));
    let claim = eventually(
        "pod rdma bound with its claim allocated",
        || async {
            bound_node(&cluster, "default", "rdma").await?;
            let claim = pod_claim(&cluster, "default", "rdma").await?;
            (!allocation(&claim).is_empty()).then_some(claim)
        },
        logs,
    )
    .await;
    let devices = allocation(&claim);
    let gpu = devices.iter().find(|(pool, _)| pool == NODE).unwrap_or_else(|| panic!("a GPU: {devices:?}"));
    let nic = devices.iter().find(|(pool, _)| pool == "dgx-nics").unwrap_or_else(|| panic!("a NIC: {devices:?}"));
    let nic_root = NIC_ROOTS[usize::from(nic.1 == "nic-1")];
    let root = device_attribute(&cluster, NODE, &gpu.1, "resource.kubernetes.io/pcieRoot").await;
    assert_eq!(root, Some(json!({"string": nic_root})), "{} shares {}'s root: {devices:?}", gpu.1, nic.1);

    // Three GPUs on a NIC's root: each root has two (and one NIC is free).
    create_all(&cluster.admin(), &aligned("rdma-three", 3)).await.unwrap_or_else(|e| panic!("{e}"));
    eventually(
        "rdma-three unschedulable",
        || async { unschedulable(&cluster, "default", "rdma-three").await.then_some(()) },
        logs,
    )
    .await;
    let out = run(
        kubectl_gpu(),
        &["--kubeconfig", cluster.admin_kubeconfig().to_str().unwrap(), "why", "rdma-three", "-o", "json"],
        None,
    );
    let why: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    let reason = why["results"][0]["reason"].as_str().unwrap_or_default().to_string();
    assert_eq!(why["results"][0]["allocated"], false, "{why}");
    assert!(reason.contains("resource.kubernetes.io/pcieRoot"), "the constraint is named: {reason}");
}
