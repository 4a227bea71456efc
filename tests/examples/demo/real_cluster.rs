//! The demo against the real control plane (`--real-cluster`): etcd,
//! kube-apiserver, kube-controller-manager and kube-scheduler of the
//! release, from the cache `tests/kube-bins/build.sh` fills (never built
//! here: without them this says how to build them). The same two fake
//! nodes and the controller run against it with the admin credential (the
//! tests run them on their own ServiceAccount tokens through the chart's
//! RBAC). The workload is applied without its delegation annotation: the
//! real controller manager makes the pods' claims from their templates,
//! the real scheduler picks the devices and binds the pods, and the
//! controller explains the claim that cannot fit. There is no kubelet:
//! the kubelet stand-in has each node prepare what was allocated there.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context as _, bail};
use integration_tests::controller_process::ControllerProcess;
use integration_tests::real_cluster::objects::{create, create_all};
use integration_tests::real_cluster::{Cluster, RELEASES, cached_binaries};
use integration_tests::workspace_root;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::Value;

use super::{DemoNode, NODES, WAIT, prepare_on_each_node, shorten, start_node};

const DELEGATION: &str = "gpu.nvidia.com/allocate";

pub fn run(minor: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let Some(release) = RELEASES.iter().copied().find(|r| r.minor == minor) else {
        let known: Vec<_> = RELEASES.iter().map(|r| r.minor).collect();
        bail!("--real-cluster {minor}: the tested releases are {}", known.join(", "));
    };
    let binaries = cached_binaries(minor).map_err(anyhow::Error::msg)?;
    // Our binaries first (a first run compiles them), so the control plane
    // does not idle meanwhile.
    integration_tests::kubelet_plugin();
    integration_tests::controller();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let cluster = runtime.block_on(Cluster::start(release));
    println!(
        "== the cluster: Kubernetes {minor}: etcd, kube-apiserver, kube-controller-manager, kube-scheduler from {}",
        binaries.kube_apiserver.parent().map(|p| p.display().to_string()).unwrap_or_default()
    );

    // The release's namespace, as `helm install --create-namespace` makes
    // it: the controller's leader-election Lease lives there.
    let namespace =
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-dra-driver"}});
    runtime.block_on(create(&cluster.admin(), &namespace)).map_err(anyhow::Error::msg)?;
    let mut nodes = Vec::new();
    for (name, inventory) in NODES {
        runtime.block_on(cluster.create_node(name));
        nodes.push(start_node(cluster.admin_kubeconfig(), &runtime, name, inventory)?);
    }
    let mut controller =
        ControllerProcess::spawn(cluster.admin_kubeconfig(), "demo", &["--explain-after", "0s", "--event-qps", "100"])
            .context("starting gpu-dra-controller")?;
    println!("   gpu-dra-controller started (explanations; leader election on a real Lease)");

    let result = runtime.block_on(demo(&cluster, &mut nodes));
    if result.is_err() {
        eprintln!("controller log:\n{}\n{}", controller.log(), cluster.logs());
        for node in &nodes {
            eprintln!("{} plugin log:\n{}", node.name, node.process.log());
        }
    }
    controller.kill();
    for node in &mut nodes {
        let _ = node.process.terminate(WAIT);
    }
    drop(cluster);
    println!(
        "\n== stopped the controller, both plugins and the control plane; removed every file ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    result
}

async fn demo(cluster: &Cluster, nodes: &mut [DemoNode]) -> anyhow::Result<()> {
    let admin = cluster.admin();
    println!("\n== published devices (accepted by the real API server's validation)");
    for node in nodes.iter() {
        let selector = format!("spec.nodeName={}", node.name);
        let slices = Api::<ResourceSlice>::all(admin.clone()).list(&ListParams::default().fields(&selector)).await?;
        let devices: Vec<String> =
            slices.items.iter().flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone())).collect();
        println!("   {:<13} {} devices: {}", node.name, devices.len(), shorten(&devices, 6));
    }

    println!("\n== applying the DeviceClasses and the workload (without its delegation annotation)");
    for file in ["gpu.nvidia.com.yaml", "mig.nvidia.com.yaml"] {
        let class = documents(&format!("deviceclasses/{file}"))?;
        create(&admin, &class[0]).await.map_err(anyhow::Error::msg)?;
        println!("   DeviceClass {}", class[0]["metadata"]["name"].as_str().unwrap_or_default());
    }
    let mut workload = documents("examples/demo/workload.yaml")?;
    for object in &mut workload {
        if let Some(annotations) = object.pointer_mut("/spec/metadata/annotations").and_then(Value::as_object_mut) {
            annotations.remove(DELEGATION);
        }
        println!(
            "   {} {}",
            object["kind"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default()
        );
    }
    create_all(&admin, &workload).await.map_err(anyhow::Error::msg)?;
    let pods: Vec<String> = workload
        .iter()
        .filter(|o| o["kind"] == "Pod")
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect();

    println!(
        "\n== kube-controller-manager makes the claims; kube-scheduler allocates and binds (or the controller explains)"
    );
    let pod_api: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let claim_api: Api<ResourceClaim> = Api::namespaced(admin.clone(), "default");
    let mut by_node: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for pod in &pods {
        let (claim, node) = settle(&pod_api, &claim_api, &admin, pod).await?;
        let name = claim.metadata.name.clone().unwrap_or_default();
        match node {
            Some(node) => {
                let results =
                    claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
                let devices: Vec<String> =
                    results.and_then(|d| d.results.as_ref()).into_iter().flatten().map(|r| r.device.clone()).collect();
                println!("   pod {pod:<10} bound to {node}; claim {name}: {}", devices.join(", "));
                by_node.entry(node).or_default().push((name, claim.metadata.uid.clone().unwrap_or_default()));
            }
            None => {
                let note = explanation(&admin, &name).await.and_then(|e| e.note).unwrap_or_default();
                println!("   pod {pod:<10} unschedulable; claim {name}: {note}");
            }
        }
    }

    prepare_on_each_node(nodes, &by_node).await?;

    println!("\n== deleting the pods: the controller manager deletes their claims");
    for pod in &pods {
        // No kubelet confirms the containers stopped: delete at once.
        pod_api.delete(pod, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await?;
    }
    let deadline = Instant::now() + WAIT;
    while !claim_api.list(&ListParams::default()).await?.items.is_empty() {
        if Instant::now() > deadline {
            bail!("the claims were not deleted within {:?}", WAIT);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    println!("   every claim deallocated and gone");
    Ok(())
}

/// The pod's claim once the scheduler bound the pod with it allocated
/// (and the node), or once the pod is unschedulable and the controller
/// has explained its claim (no node).
async fn settle(
    pods: &Api<Pod>,
    claims: &Api<ResourceClaim>,
    admin: &kube::Client,
    pod: &str,
) -> anyhow::Result<(ResourceClaim, Option<String>)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let current = pods.get(pod).await?;
        let node = current.spec.as_ref().and_then(|s| s.node_name.clone());
        let claim_name = current
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .and_then(|s| s.first())
            .and_then(|s| s.resource_claim_name.clone());
        if let Some(name) = claim_name {
            let claim = claims.get(&name).await?;
            let allocated = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).is_some();
            if allocated && node.is_some() {
                return Ok((claim, node));
            }
            if node.is_none() && explanation(admin, &name).await.is_some() {
                return Ok((claim, None));
            }
        }
        if Instant::now() > deadline {
            bail!("pod {pod} neither scheduled nor explained within {:?}", WAIT);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The controller's explanation Event on claim `name`, if any.
async fn explanation(admin: &kube::Client, name: &str) -> Option<Event> {
    let events = Api::<Event>::namespaced(admin.clone(), "default").list(&ListParams::default()).await.ok()?;
    events.items.into_iter().find(|e| {
        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            && e.reporting_controller.as_deref() == Some("gpu.nvidia.com/controller")
    })
}

fn documents(path: &str) -> anyhow::Result<Vec<Value>> {
    let file = workspace_root().join(path);
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    Ok(integration_tests::helm::documents(path, &text))
}
