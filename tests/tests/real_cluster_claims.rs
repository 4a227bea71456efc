//! The docs' claims under the real kube-scheduler, on the oldest and the
//! newest supported release: the seeds' claims (`examples/claims/`: an H100
//! with more than 40 GiB, prefer an H100 but accept an A100, a MIG 1g slice
//! through a template, one claim shared by two pods) and both sharing
//! examples (`examples/sharing/`: memory shares of one H100 under our
//! ConsumableCapacity, NVIDIA's four-replica Deployment under
//! ConsumableShares), applied as they are, with pods that use them. The
//! real kube-controller-manager makes the templates' claims, the real
//! scheduler allocates them from the slices our plugins publish (on their
//! own tokens), and the devices it chose are the ones the docs say.
//!
//! One cluster per release serves the three phases; each phase's nodes are
//! tainted before the next starts, so that the next phase's pods can only
//! land on its own node (the sharing claims would fit the DGX too).
//!
//! NVIDIA's Deployment runs before the memory shares: in the other order
//! the real 1.37 scheduler left the fourth replica unschedulable ("cannot
//! allocate all claims") although its GPU, on a node of its own, had a
//! share left, and an update of the class (a DRA event that requeues the
//! pod) did not change that; alone, or first, all four fit at once. Not
//! explained yet: see the project's notes before reordering.

use std::collections::BTreeSet;
use std::path::Path;

use std::time::Duration;

use integration_tests::real_cluster::driver::{
    NodePlugin, WAIT, allocation, bound_node, chart, device_attribute, device_capacity, eventually, eventually_within,
    install, pod_claim, results, start_plugin, start_plugin_with, unschedulable, yaml_documents,
};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, Release, V1_34, V1_37};
use integration_tests::workspace_root;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

/// The scheduler's longest wait before it retries an unschedulable pod
/// (`podMaxInUnschedulablePodsDuration`, 5 min), and a margin.
const UNSCHEDULABLE_FLUSH: Duration = Duration::from_secs(330);

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn example(path: &str) -> Vec<Value> {
    yaml_documents(&workspace_root().join("examples").join(path))
}

/// A pod that uses the existing claim `claim` (as the docs' pods do).
fn pod_using(namespace: &str, claim: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("uses-{claim}"), "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/app", "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}})
}

/// Bytes of a quantity as the API writes them ("80Gi", "10737418240").
fn bytes(quantity: &str) -> u64 {
    let (digits, unit) = quantity.split_at(quantity.find(|c: char| !c.is_ascii_digit()).unwrap_or(quantity.len()));
    let scale = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        other => panic!("quantity {quantity}: unit {other} not expected here"),
    };
    digits.parse::<u64>().unwrap_or_else(|e| panic!("quantity {quantity}: {e}")) * scale
}

struct Phase<'a> {
    cluster: &'a Cluster,
    plugins: Vec<NodePlugin>,
}

impl Phase<'_> {
    fn logs(&self) -> String {
        let plugins = self.plugins.iter().map(|p| format!("---- plugin {}\n{}", p.node, p.process.log()));
        format!("{}\n{}", self.cluster.logs(), plugins.collect::<Vec<_>>().join("\n"))
    }

    /// Waits until `pod` is bound and its first claim allocated.
    async fn scheduled(&self, namespace: &str, pod: &str) -> (String, ResourceClaim) {
        self.scheduled_within(namespace, pod, WAIT).await
    }

    async fn scheduled_within(&self, namespace: &str, pod: &str, wait: Duration) -> (String, ResourceClaim) {
        eventually_within(
            &format!("pod {namespace}/{pod} bound with its claim allocated"),
            wait,
            || async {
                let node = bound_node(self.cluster, namespace, pod).await?;
                let claim = pod_claim(self.cluster, namespace, pod).await?;
                (!allocation(&claim).is_empty()).then_some((node, claim))
            },
            || self.logs(),
        )
        .await
    }

    /// Taints the phase's nodes so that later phases' pods go elsewhere.
    async fn close(self) {
        let nodes: Api<Node> = Api::all(self.cluster.admin());
        for plugin in &self.plugins {
            let taint =
                json!({"spec": {"taints": [{"key": "example.com/phase", "value": "done", "effect": "NoSchedule"}]}});
            nodes.patch(&plugin.node, &PatchParams::default(), &Patch::Merge(&taint)).await.unwrap();
        }
    }
}

/// The seeds' claims: where the docs say each goes.
async fn seeds(cluster: &Cluster) {
    let inventories = workspace_root().join("examples/inventories");
    let plugins = vec![
        start_plugin(cluster, "dgx-h100-a", &inventories.join("dgx-h100.yaml")).await,
        start_plugin(cluster, "hgx-a100-mig", &inventories.join("a100-mig.yaml")).await,
    ];
    let phase = Phase { cluster, plugins };
    // prefer-h200 can only use one of the A100 node's two whole GPUs;
    // prefer-h100 and the shared claim may take those too (the scheduler
    // scores either node first), so it goes first and the rest after.
    let mut first = vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "inference"}})];
    first.extend(example("claims/02-prefer-h100-accept-a100.yaml"));
    first.push(pod_using("inference", "prefer-h200"));
    create_all(&cluster.admin(), &first).await.unwrap_or_else(|e| panic!("the real API server refused it: {e}"));
    phase.scheduled("inference", "uses-prefer-h200").await;
    let mut objects = Vec::new();
    for file in ["01-h100-large-memory.yaml", "04-mig-1g.yaml", "05-shared-claim.yaml"] {
        objects.extend(example(&format!("claims/{file}")));
    }
    objects.push(pod_using("default", "h100-large-memory"));
    objects.push(pod_using("inference", "prefer-h100"));
    create_all(&cluster.admin(), &objects).await.unwrap_or_else(|e| panic!("the real API server refused it: {e}"));

    let mut chosen = Vec::new();
    // One H100 with more than 40Gi: on the DGX.
    let (node, claim) = phase.scheduled("default", "uses-h100-large-memory").await;
    let devices = allocation(&claim);
    assert_eq!((node.as_str(), devices.len()), ("dgx-h100-a", 1), "{devices:?}");
    let (pool, device) = &devices[0];
    let product = device_attribute(cluster, pool, device, "productName").await.unwrap();
    assert!(product["string"].as_str().unwrap().contains("H100"), "{product}");
    let memory = device_capacity(cluster, pool, device, "memory").await.unwrap();
    assert!(bytes(&memory) > 40 << 30, "{device}: {memory}");
    chosen.extend(devices);

    // firstAvailable: the alternative used names the result and matches
    // the node's GPUs (the scheduler may score either node first); with
    // no H200 anywhere, prefer-h200 gets an A100.
    for (pod, wanted) in [("uses-prefer-h100", None), ("uses-prefer-h200", Some("gpu/a100"))] {
        let (node, claim) = phase.scheduled("inference", pod).await;
        let result = &results(&claim)[0];
        let request = result["request"].as_str().unwrap();
        let (expected_request, product) = match node.as_str() {
            "dgx-h100-a" => ("gpu/h100", "H100"),
            _ => ("gpu/a100", "A100"),
        };
        assert_eq!(request, expected_request, "{pod} on {node}: {result}");
        if let Some(wanted) = wanted {
            assert_eq!(request, wanted, "{pod} on {node}: {result}");
        }
        let (pool, device) = &allocation(&claim)[0];
        let name = device_attribute(cluster, pool, device, "productName").await.unwrap();
        assert!(name["string"].as_str().unwrap().contains(product), "{pod}: {name}");
        chosen.extend(allocation(&claim));
    }

    // A MIG 1g slice through the template: the controller manager made
    // the pod's claim, labelled as the template says.
    let (node, claim) = phase.scheduled("inference", "tiny-llm").await;
    assert_eq!(node, "hgx-a100-mig");
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("app.kubernetes.io/part-of").map(String::as_str), Some("small-inference"));
    let (pool, device) = &allocation(&claim)[0];
    let profile = device_attribute(cluster, pool, device, "profile").await.unwrap();
    assert!(profile["string"].as_str().unwrap().starts_with("1g."), "{device}: {profile}");
    chosen.extend(allocation(&claim));

    // One claim, two pods: allocated once, reserved for both, which run
    // on its node.
    let (producer_node, shared) = phase.scheduled("default", "producer").await;
    let (consumer_node, _) = phase.scheduled("default", "consumer").await;
    let claim: ResourceClaim = eventually(
        "shared-gpu reserved for both pods",
        || async {
            let claim = Api::<ResourceClaim>::namespaced(cluster.admin(), "default").get("shared-gpu").await.ok()?;
            let reserved = claim.status.as_ref()?.reserved_for.as_ref()?;
            (reserved.len() == 2).then_some(claim)
        },
        || phase.logs(),
    )
    .await;
    let reserved: BTreeSet<_> =
        claim.status.as_ref().unwrap().reserved_for.iter().flatten().map(|r| r.name.clone()).collect();
    assert_eq!(reserved, BTreeSet::from(["consumer".to_string(), "producer".to_string()]));
    assert_eq!(allocation(&claim), allocation(&shared), "the shared claim was allocated again");
    assert_eq!(allocation(&claim).len(), 1);
    assert_eq!(producer_node, consumer_node);
    assert_eq!(allocation(&claim)[0].0, producer_node);
    chosen.extend(allocation(&claim));

    let distinct: BTreeSet<_> = chosen.iter().collect();
    assert_eq!(distinct.len(), chosen.len(), "a dedicated device was given twice: {chosen:?}");
    phase.close().await;
}

/// The node of `examples/fleets/<fleet>` written as a fake inventory in
/// the cluster's directory.
fn fleet_inventory(cluster: &Cluster, fleet: &str) -> std::path::PathBuf {
    let path = workspace_root().join("examples/fleets").join(fleet);
    let inventory = &yaml_documents(&path)[0]["nodes"][0]["inventory"];
    let file = cluster.dir().join(format!("inventory-{fleet}"));
    // JSON is YAML: the plugin reads it as its inventory file.
    std::fs::write(&file, inventory.to_string()).unwrap();
    file
}

/// `examples/sharing/memory-shares.yaml` on a plugin run with
/// ConsumableCapacity (and MPSSupport, which it needs), one pod per claim
/// in the file's order: three 20Gi shares on the H100, each its own share;
/// the 30Gi one does not fit the 20Gi left; 9500Mi takes 10Gi.
async fn memory_shares(cluster: &Cluster) {
    let inventory = fleet_inventory(cluster, "fractional.yaml");
    let gates = ["--feature-gates", "ConsumableCapacity=true,MPSSupport=true"];
    let plugin = start_plugin_with(cluster, "h100-shared", &inventory, &gates).await;
    let phase = Phase { cluster, plugins: vec![plugin] };
    let claims = example("sharing/memory-shares.yaml");
    create_all(&cluster.admin(), &claims).await.unwrap_or_else(|e| panic!("the real API server refused it: {e}"));

    let mut shares = BTreeSet::new();
    for claim in &claims {
        let name = claim["metadata"]["name"].as_str().unwrap();
        create_all(&cluster.admin(), &[pod_using("default", name)]).await.unwrap();
        let pod = format!("uses-{name}");
        if name == "llm-too-big" {
            eventually(
                "llm-too-big to be unschedulable",
                || async { unschedulable(cluster, "default", &pod).await.then_some(()) },
                || phase.logs(),
            )
            .await;
            let claim = Api::<ResourceClaim>::namespaced(cluster.admin(), "default").get(name).await.unwrap();
            assert!(allocation(&claim).is_empty(), "{claim:?}");
            continue;
        }
        let (node, allocated) = phase.scheduled("default", &pod).await;
        assert_eq!(node, "h100-shared");
        let result = &results(&allocated)[0];
        assert_eq!(
            (result["pool"].as_str(), result["device"].as_str()),
            (Some("h100-shared"), Some("gpu-0")),
            "{result}"
        );
        let share = result["shareID"].as_str().unwrap_or_else(|| panic!("{name}: no shareID: {result}"));
        assert!(shares.insert(share.to_string()), "{name}: share {share} given twice");
        let consumed = &result["consumedCapacity"];
        let requested = claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"].clone();
        let memory = bytes(consumed["memory"].as_str().unwrap());
        // Requests round up to the published step (1Gi).
        let asked = bytes(requested["memory"].as_str().unwrap());
        assert_eq!(memory, asked.div_ceil(1 << 30) << 30, "{name}: {consumed}");
        if let Some(sm) = requested.get("smPercent") {
            assert_eq!(consumed["smPercent"], *sm, "{name}: {consumed}");
        }
    }
    assert_eq!(shares.len(), 4, "{shares:?}");
}

/// NVIDIA's four-replica Deployment (`examples/sharing/nvidia-integer-sharing.yaml`,
/// as they wrote it) on a plugin run with `ConsumableShares` and
/// `--consumable-shares 4`: all four pods' claims share the one GPU.
async fn nvidia_integer_sharing(cluster: &Cluster) {
    let inventory = fleet_inventory(cluster, "consumable-shares.yaml");
    let args = ["--feature-gates", "ConsumableShares=true", "--consumable-shares", "4"];
    let plugin = start_plugin_with(cluster, "h100-shares", &inventory, &args).await;
    let phase = Phase { cluster, plugins: vec![plugin] };
    create_all(&cluster.admin(), &example("sharing/nvidia-integer-sharing.yaml"))
        .await
        .unwrap_or_else(|e| panic!("the real API server refused it: {e}"));
    let namespace = "gpu-share-integer";
    let pods = eventually(
        "the Deployment's four pods",
        || async {
            let list = Api::<Pod>::namespaced(cluster.admin(), namespace)
                .list(&ListParams::default().labels("app=integer-sharing"))
                .await
                .ok()?;
            let names: Vec<String> = list.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
            (names.len() == 4).then_some(names)
        },
        || phase.logs(),
    )
    .await;
    let mut placed = Vec::new();
    for pod in &pods {
        // The real scheduler (seen on 1.37 and on 1.34) sometimes leaves
        // one replica "cannot allocate all claims" although the GPU has a
        // share left (not explained yet; compare kubernetes#133705 and
        // #134100, consumable-capacity bugs). It places it when it
        // retries its unschedulable pods, within 5 minutes
        // (podMaxInUnschedulablePodsDuration), as a user's cluster would.
        let (node, claim) = phase.scheduled_within(namespace, pod, UNSCHEDULABLE_FLUSH).await;
        placed.push((pod.clone(), node, results(&claim)[0].clone()));
    }
    let mut shares = BTreeSet::new();
    for (pod, node, result) in &placed {
        assert_eq!(node, "h100-shares", "{pod}");
        assert_eq!(
            (result["pool"].as_str(), result["device"].as_str()),
            (Some("h100-shares"), Some("gpu-0")),
            "{result}"
        );
        shares.insert(result["shareID"].as_str().unwrap_or_else(|| panic!("{pod}: no shareID: {result}")).to_string());
    }
    assert_eq!(shares.len(), 4, "each replica its own share: {shares:?}");
    phase.close().await;
}

async fn readme_claims_are_scheduled_as_it_says(release: Release) {
    let cluster = Cluster::start(release).await;
    install(&cluster, &chart(tmp_dir(), json!({"webhook": {"enabled": false}}))).await;
    seeds(&cluster).await;
    nvidia_integer_sharing(&cluster).await;
    memory_shares(&cluster).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_34_readme_claims_are_scheduled_as_it_says() {
    // Consumable capacity and partitionable devices are alpha in 1.34.
    readme_claims_are_scheduled_as_it_says(V1_34.with_optional_gates()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_37_readme_claims_are_scheduled_as_it_says() {
    readme_claims_are_scheduled_as_it_says(V1_37).await
}
