//! The live switch from NVIDIA's DRA driver, on a real 1.37 node (real
//! kubelet, containerd, runc): a pod whose claim NVIDIA's kubelet plugin
//! prepared keeps running through the switch, runs again in a new sandbox
//! through our plugin with the devices of NVIDIA's spec, and is unprepared
//! cleanly; a new pod gets a claim from ours.
//!
//! NVIDIA's plugin cannot run here (no GPU, no registry), so the node's
//! driver state is made NVIDIA's: the claim is prepared through our plugin
//! (the kubelet records the CDI ids, which both drivers derive alike:
//! `k8s.gpu.nvidia.com/claim=<uid>-<device>`), then, with the plugin
//! stopped, its record and spec are replaced by NVIDIA's checkpoint, as
//! NVIDIA's latest layout has it (`tests/nvidia-state`: a generator
//! following their source, with the kubelet's checksum package), and
//! NVIDIA's YAML spec (written by the CNCF CDI library), which also sets a
//! variable of its own so the restarted container shows whose spec it got.
//! A ResourceSlice left by NVIDIA's plugin is there too. Needs root.

use std::path::{Path, PathBuf};

use integration_tests::nvidia_state::{self, NvidiaClaim, NvidiaDevice, NvidiaFormat};
use integration_tests::plugin_process::{PluginOptions, PluginProcess};
use integration_tests::real_cluster::driver::eventually_within;
use integration_tests::real_cluster::node::{NODE_WAIT, RealNode, TEST_IMAGE, TWO_H100, cluster_with_node};
use integration_tests::real_cluster::objects::create_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

const NODE: &str = "switch-node";
/// What NVIDIA's spec sets beside the devices, to tell it from ours.
const MARK: &str = "SPEC_WRITTEN_BY=nvidia-dra-driver-gpu";

fn claim(name: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
}

/// A pod on `claim` whose container prints its environment, then sleeps.
fn pod(name: &str, claim: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
    "spec": {
        "hostNetwork": true, "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
        // containerd has no CNI configuration: the node is NotReady.
        "tolerations": [{"operator": "Exists"}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        "containers": [{"name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", "env; echo '== end'; exec sleep 3600"],
            "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}],
    }})
}

/// The running container's (id, restart count) of `pod`.
fn running(pod: &Pod) -> Option<(String, i32)> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == "main")?;
    status.state.as_ref()?.running.as_ref()?;
    Some((status.container_id.clone()?, status.restart_count))
}

/// The bootId of our record of `uid` (the envelope's `claim.bootId`).
fn record_boot_id(record: &Path) -> String {
    let text = std::fs::read_to_string(record).unwrap_or_else(|e| panic!("{}: {e}", record.display()));
    let value: Value = serde_json::from_str(&text).unwrap();
    value["claim"]["bootId"].as_str().unwrap_or_else(|| panic!("no bootId in {text}")).to_owned()
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned())).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_prepared_by_nvidias_driver_keeps_running_through_the_switch_and_is_unprepared_by_ours() {
    let (cluster, mut node, token) = cluster_with_node(NODE, Path::new(env!("CARGO_TARGET_TMPDIR"))).await;
    let dirs = node.plugin_dirs(&cluster, TWO_H100, &token);
    let options = PluginOptions { node: NODE.into(), ..PluginOptions::default() };
    let mut plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let state: PathBuf = dirs.plugins.join("gpu.nvidia.com");
    let cdi = dirs.cdi.clone();
    let logs = |plugin: &PluginProcess, node: &RealNode| {
        format!("{}\n{}\n---- plugin\n{}", cluster.logs(), node.logs(), plugin.log())
    };

    // 1. A pod running on a claim, as NVIDIA's driver would have left it.
    create_all(&cluster.admin(), &[claim("trained"), pod("trainer", "trained")])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.admin(), "default");
    let first = eventually_within(
        "the pod to run",
        NODE_WAIT,
        || async { running(&pods.get("trainer").await.ok()?) },
        || logs(&plugin, &node),
    )
    .await;
    let trainer = pods.get("trainer").await.unwrap();
    let pod_uid = trainer.metadata.uid.clone().unwrap();
    let claim_object = claims.get("trained").await.unwrap();
    let uid = claim_object.metadata.uid.clone().unwrap();
    let result = claim_object.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap().remove(0);
    let device = result.device.clone();
    let slices: Api<ResourceSlice> = Api::all(cluster.admin());
    let gpu_uuid = slices
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == device)
        .and_then(|d| d.attributes.as_ref()?.get("uuid")?.string.clone())
        .unwrap_or_else(|| panic!("no uuid of {device} in the slices"));

    // 2. NVIDIA's plugin's state instead of ours, with our plugin stopped.
    plugin.kill().unwrap();
    let record = state.join("checkpoint").join(format!("{uid}.json"));
    let boot_id = record_boot_id(&record);
    let ours = cdi.join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"));
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&ours).unwrap()).unwrap();
    spec["containerEdits"]["env"].as_array_mut().expect("the spec's env").push(json!(MARK));
    let theirs = cdi.join(format!("k8s.gpu.nvidia.com-claim_{uid}.yaml"));
    nvidia_state::write_cdi_yaml(spec.to_string().as_bytes(), &theirs);
    std::fs::remove_file(&ours).unwrap();
    std::fs::remove_file(&record).unwrap();
    let nvidia_claim = NvidiaClaim::completed(
        &uid,
        "default",
        "trained",
        vec![NvidiaDevice::gpu(&gpu_uuid, "gpu", NODE, &device, &format!("k8s.gpu.nvidia.com/claim={uid}-{device}"))],
    );
    let checkpoint = nvidia_state::checkpoint(NvidiaFormat::latest(), &boot_id, &[nvidia_claim]);
    std::fs::write(state.join("checkpoint.json"), &checkpoint).unwrap();
    // The slice NVIDIA's plugin published, named and owned as theirs.
    let leftover: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("{NODE}-gpu.nvidia.com-nv7q2")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": NODE,
            "pool": {"name": NODE, "generation": 3, "resourceSliceCount": 1},
            "devices": [{"name": device, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu_uuid}}}]}}))
    .unwrap();
    slices.create(&PostParams::default(), &leftover).await.unwrap_or_else(|e| panic!("the leftover slice: {e}"));

    // 3. Our plugin again: it adopts NVIDIA's claim; the pod runs on.
    plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let adopted = eventually_within(
        "the plugin to adopt NVIDIA's checkpoint",
        NODE_WAIT,
        || async {
            let log = plugin.log();
            log.lines().find(|l| l.contains("adopted the claims NVIDIA's DRA plugin prepared")).map(str::to_owned)
        },
        || logs(&plugin, &node),
    )
    .await;
    assert!(adopted.contains("served=1") && adopted.contains("refused=0"), "{adopted}");
    assert!(!state.join("checkpoint.json").exists(), "NVIDIA's file is set aside");
    assert!(files(&state).iter().any(|f| f.starts_with("checkpoint.json.adopted-")), "{:?}", files(&state));
    assert_eq!(
        files(&cdi).iter().filter(|f| f.contains(&uid)).collect::<Vec<_>>(),
        [&format!("k8s.gpu.nvidia.com-claim_{uid}.yaml")]
    );
    assert_eq!(running(&pods.get("trainer").await.unwrap()), Some(first.clone()), "the pod ran on through the switch");
    eventually_within(
        "NVIDIA's slice to be replaced by ours",
        NODE_WAIT,
        || async {
            let names: Vec<String> = slices
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .collect();
            (!names.iter().any(|n| n.ends_with("-nv7q2")) && !names.is_empty()).then_some(())
        },
        || logs(&plugin, &node),
    )
    .await;

    // 4. The kubelet restarted and the pod's sandbox killed: the kubelet
    // prepares the claim again, through our plugin, which answers NVIDIA's
    // CDI ids; the new container gets the devices of NVIDIA's spec.
    node.restart_kubelet(&cluster);
    node.kill_pod(&pod_uid);
    let again = eventually_within(
        "the pod to run again in a new sandbox",
        NODE_WAIT,
        || async { running(&pods.get("trainer").await.ok()?).filter(|(id, _)| *id != first.0) },
        || logs(&plugin, &node),
    )
    .await;
    let log = eventually_within(
        "the restarted container's environment",
        NODE_WAIT,
        || async {
            let log = node.container_log_of_run("default", "trainer", &pod_uid, "main", again.1);
            log.contains("== end").then_some(log)
        },
        || logs(&plugin, &node),
    )
    .await;
    assert!(log.contains(MARK), "the container did not get NVIDIA's spec:\n{log}");
    assert!(plugin.log().contains("NodePrepareResources"), "the kubelet did not prepare again:\n{}", plugin.log());

    // 5. A new pod gets a claim from ours, on the other GPU.
    create_all(&cluster.admin(), &[claim("fresh"), pod("newcomer", "fresh")]).await.unwrap_or_else(|e| panic!("{e}"));
    eventually_within(
        "the new pod to run",
        NODE_WAIT,
        || async { running(&pods.get("newcomer").await.ok()?) },
        || logs(&plugin, &node),
    )
    .await;
    let fresh = claims.get("fresh").await.unwrap();
    let fresh_uid = fresh.metadata.uid.clone().unwrap();
    let fresh_device = fresh.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap().remove(0).device;
    assert_ne!(fresh_device, device, "the adopted claim's GPU was given again");
    assert!(cdi.join(format!("k8s.gpu.nvidia.com-claim_{fresh_uid}.json")).exists());

    // 6. The adopted claim's pod deleted: its unprepare removes NVIDIA's
    // spec and our record of it.
    pods.delete("trainer", &DeleteParams::default()).await.unwrap();
    eventually_within(
        "the pod to be gone and its claim unprepared",
        NODE_WAIT,
        || async {
            let gone = pods.get_opt("trainer").await.ok()?.is_none();
            (gone && !theirs.exists() && !record.exists()).then_some(())
        },
        || logs(&plugin, &node),
    )
    .await;
    assert_eq!(files(&state.join("checkpoint")), [format!("{fresh_uid}.json")]);
    pods.delete("newcomer", &DeleteParams::default()).await.unwrap();
    drop(plugin);
}
