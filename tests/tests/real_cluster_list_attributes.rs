//! List-typed attributes under the real kube-scheduler of 1.37 with
//! `DRAListTypeAttributes` on (alpha; API server, controller manager and
//! scheduler): our plugin, given the same gate, publishes
//! `resource.kubernetes.io/numaNode` as a list, the API server keeps it,
//! and claims whose selectors range over it (`exists`, `includes`) or
//! whose constraint matches over it (`matchAttribute`: the lists share an
//! element) get the devices Kubernetes' semantics give. (Our allocator's
//! answers to the same cases are checked offline against Kubernetes' own
//! allocator cases: `cargo test -p dra-allocator`, `simulate_list_attributes`.)

use std::path::Path;

use integration_tests::real_cluster::driver::{
    allocation, chart, device_attribute, eventually, install, pod_claim, start_plugin_with,
};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, V1_37};
use integration_tests::workspace_root;
use serde_json::{Value, json};

const NODE: &str = "dgx-lists";

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// A claim of one request for `count` GPUs with `selector` (if any) and
/// `constraint` (if any), and a pod that uses it.
fn claim_and_pod(name: &str, count: u32, selector: Option<&str>, constraint: Option<&str>) -> [Value; 2] {
    let mut exactly = json!({"deviceClassName": "gpu.nvidia.com", "count": count});
    if let Some(expression) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": expression}}]);
    }
    let mut devices = json!({"requests": [{"name": "gpu", "exactly": exactly}]});
    if let Some(attribute) = constraint {
        devices["constraints"] = json!([{"matchAttribute": attribute}]);
    }
    [
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"devices": devices}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "registry.invalid/app", "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}}),
    ]
}

/// The GPUs of the DGX inventory on NUMA node `n` (first half 0, second 1).
fn on_numa(device: &str) -> i64 {
    let minor: i64 = device.trim_start_matches("gpu-").parse().unwrap_or_else(|e| panic!("{device}: {e}"));
    minor / 4
}

#[tokio::test(flavor = "multi_thread")]
async fn list_attributes_are_scheduled_as_kubernetes_1_37_evaluates_them() {
    let cluster = Cluster::start(V1_37.with_optional_gates()).await;
    install(&cluster, &chart(tmp_dir(), json!({"webhook": {"enabled": false}}))).await;
    let inventory = workspace_root().join("examples/inventories/dgx-h100.yaml");
    let plugin =
        start_plugin_with(&cluster, NODE, &inventory, &["--feature-gates", "DRAListTypeAttributes=true"]).await;
    let logs = || format!("{}\n---- plugin\n{}", cluster.logs(), plugin.process.log());

    // The API server kept the list (a server with the gate off drops it).
    let numa = device_attribute(&cluster, NODE, "gpu-5", "resource.kubernetes.io/numaNode").await;
    assert_eq!(numa, Some(json!({"ints": [1]})), "{}", logs());

    let claims = [
        claim_and_pod(
            "numa-one",
            1,
            Some(r#"device.attributes["resource.kubernetes.io"].numaNode.exists(n, n == 1)"#),
            None,
        ),
        claim_and_pod(
            "numa-zero",
            1,
            Some(r#"device.attributes["resource.kubernetes.io"].numaNode.includes(0)"#),
            None,
        ),
        // Three of the six GPUs left, three on each NUMA node: only one
        // node's three share an element.
        claim_and_pod("same-numa", 3, None, Some("resource.kubernetes.io/numaNode")),
    ];
    let objects: Vec<Value> = claims.into_iter().flatten().collect();
    create_all(&cluster.admin(), &objects).await.unwrap_or_else(|e| panic!("the real API server refused them: {e}"));
    let mut picked = Vec::new();
    for name in ["numa-one", "numa-zero", "same-numa"] {
        let claim = eventually(
            &format!("{name} allocated"),
            || async { pod_claim(&cluster, "default", name).await.filter(|c| !allocation(c).is_empty()) },
            logs,
        )
        .await;
        let devices: Vec<String> = allocation(&claim).into_iter().map(|(_, device)| device).collect();
        picked.push((name, devices));
    }
    eprintln!("the real scheduler picked {picked:?}");
    let numas = |i: usize| picked[i].1.iter().map(|d| on_numa(d)).collect::<Vec<_>>();
    assert_eq!(numas(0), [1], "exists(n, n == 1): {picked:?}");
    assert_eq!(numas(1), [0], "includes(0): {picked:?}");
    let same = numas(2);
    assert_eq!(same.len(), 3, "{picked:?}");
    assert!(same.iter().all(|n| *n == same[0]), "matchAttribute over lists: one NUMA node: {picked:?}");
}
