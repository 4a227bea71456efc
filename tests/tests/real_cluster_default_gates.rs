//! Each release as its users run it: the real control plane with its
//! default feature gates, and a node with a faulty GPU
//! (`examples/inventories/faulty-node.yaml`: GPU 2 fell off the bus,
//! XID 79; GPU 3 is lost).
//!
//! On 1.34 and 1.35 device taints are alpha and off, and the API server
//! drops a slice's `taints` on write (the resourceslice strategy's
//! `dropDisabledFields`). The node agent must then neither rewrite its
//! slice forever (it once did, about 85 times a second, because the slice
//! it read back differed from the one it wrote) nor offer the faulty GPU
//! untainted: a claim for it must stay unallocated. On 1.37 taints are GA
//! and served; the faulty GPU is published tainted and the scheduler
//! keeps it from claims that do not tolerate the taint.

use std::path::Path;
use std::time::Duration;

use integration_tests::real_cluster::driver::{
    allocation, bound_node, chart, eventually, install, pod_claim, start_plugin, unschedulable,
};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, Release, V1_34, V1_35, V1_36, V1_37};
use integration_tests::{kubelet_plugin, run, workspace_root};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const NODE: &str = "faulty-node";
const NAMESPACE: &str = "default";

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn inventory() -> std::path::PathBuf {
    workspace_root().join("examples/inventories/faulty-node.yaml")
}

/// The UUID the node agent gives GPU `device` of the node (what a user's
/// selector names), read from `print-slices` as the node would publish
/// it: the published slice may lack a withheld device.
fn uuid_of(device: &str) -> String {
    let inventory = inventory();
    let out = run(
        kubelet_plugin(),
        &["print-slices", "--node-name", NODE, "--fake-inventory", inventory.to_str().unwrap(), "-o", "json"],
        None,
    );
    assert!(out.status.success(), "print-slices: {}", String::from_utf8_lossy(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices =
        list["items"].as_array().into_iter().flatten().flat_map(|s| s["spec"]["devices"].as_array()).flatten();
    let found = devices.into_iter().find(|d| d["name"] == device).unwrap_or_else(|| panic!("no {device}"));
    found["attributes"]["uuid"]["string"].as_str().unwrap().to_string()
}

/// A pod whose claim (from a template) asks for the GPU with `uuid`.
fn pod_for(name: &str, uuid: &str) -> Vec<Value> {
    let selector = format!("device.attributes[\"gpu.nvidia.com\"].uuid == \"{uuid}\"");
    vec![
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": selector}}]}}]}}}}),
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "main", "image": "registry.invalid/app", "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}]}}),
    ]
}

/// The node's slices' generations added up: every write of a slice adds one.
async fn generations(cluster: &Cluster) -> i64 {
    let slices: Api<ResourceSlice> = Api::all(cluster.admin());
    let list = slices.list(&ListParams::default().fields(&format!("spec.nodeName={NODE}"))).await.unwrap();
    list.items.iter().map(|s| s.metadata.generation.unwrap_or(0)).sum()
}

/// Whether the node's published slices offer `device` at all.
async fn offered(cluster: &Cluster, device: &str) -> bool {
    let slices: Api<ResourceSlice> = Api::all(cluster.admin());
    let list = slices.list(&ListParams::default().fields(&format!("spec.nodeName={NODE}"))).await.unwrap();
    list.items.iter().flat_map(|s| s.spec.devices.iter().flatten()).any(|d| d.name == device)
}

async fn a_faulty_gpu_is_never_allocated_and_the_slice_is_written_once(release: Release) {
    let cluster = Cluster::start(release).await;
    install(&cluster, &chart(tmp_dir(), json!({"webhook": {"enabled": false}}))).await;
    let plugin = start_plugin(&cluster, NODE, &inventory()).await;
    let logs = || format!("{}\n---- plugin\n{}", cluster.logs(), plugin.process.log());

    // An idle node writes nothing: over a window long enough for the old
    // loop's hundreds of writes, at most one (the publisher learning, from
    // the server's answer, which fields this release drops).
    let before = generations(&cluster).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = generations(&cluster).await;
    assert!(
        after - before <= 1,
        "{}: {} slice writes in 5 s by an idle node\n{}",
        release.describe(),
        after - before,
        logs()
    );
    let settled = generations(&cluster).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        generations(&cluster).await,
        settled,
        "{}: the node still rewrites its slice\n{}",
        release.describe(),
        logs()
    );

    // The healthy GPU 1 is given to a claim that names it ...
    create_all(&cluster.admin(), &pod_for("wants-gpu-1", &uuid_of("gpu-1"))).await.unwrap();
    let node = eventually(
        "wants-gpu-1 bound",
        || async {
            let node = bound_node(&cluster, NAMESPACE, "wants-gpu-1").await?;
            let claim = pod_claim(&cluster, NAMESPACE, "wants-gpu-1").await?;
            (allocation(&claim) == [(NODE.to_string(), "gpu-1".to_string())]).then_some(node)
        },
        logs,
    )
    .await;
    assert_eq!(node, NODE);

    // ... the faulty GPU 2 to none: withheld where taints are not served,
    // tainted where they are.
    create_all(&cluster.admin(), &pod_for("wants-gpu-2", &uuid_of("gpu-2"))).await.unwrap();
    eventually(
        "wants-gpu-2 unschedulable",
        || async { unschedulable(&cluster, NAMESPACE, "wants-gpu-2").await.then_some(()) },
        logs,
    )
    .await;
    let claim = pod_claim(&cluster, NAMESPACE, "wants-gpu-2").await.expect("its claim");
    assert!(allocation(&claim).is_empty(), "{}: the faulty GPU was allocated: {:?}", release.describe(), claim.status);
    eprintln!(
        "{}: the faulty GPU is {} ({} slice writes in all)",
        release.describe(),
        if offered(&cluster, "gpu-2").await { "published tainted" } else { "withheld" },
        generations(&cluster).await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_34_defaults_a_faulty_gpu_is_never_allocated() {
    a_faulty_gpu_is_never_allocated_and_the_slice_is_written_once(V1_34).await
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_34_optional_gates_a_faulty_gpu_is_never_allocated() {
    a_faulty_gpu_is_never_allocated_and_the_slice_is_written_once(V1_34.with_optional_gates()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_37_defaults_a_faulty_gpu_is_never_allocated() {
    a_faulty_gpu_is_never_allocated_and_the_slice_is_written_once(V1_37).await
}

/// 1.35 and 1.36 are not in CI's matrix: each adds its own Kubernetes
/// build (see docs/compatibility.md's real-cluster matrix for the minutes) to a cold
/// run. `cargo test -p integration-tests --test real_cluster_default_gates
/// -- --ignored` runs them (building their binaries on first use).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "1.35 is outside CI's matrix (cold build cost); run with --ignored"]
async fn k8s_1_35_defaults_a_faulty_gpu_is_never_allocated() {
    a_faulty_gpu_is_never_allocated_and_the_slice_is_written_once(V1_35).await
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "1.36 is outside CI's matrix (cold build cost); run with --ignored"]
async fn k8s_1_36_defaults_a_faulty_gpu_is_never_allocated() {
    a_faulty_gpu_is_never_allocated_and_the_slice_is_written_once(V1_36).await
}
