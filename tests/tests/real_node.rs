//! One real node: the release's kubelet and containerd (built from their
//! Go modules, `tests/kube-bins/build.sh <minor> node`) with Debian's runc,
//! registered with the real control plane. Our plugin registers with this
//! kubelet over its real plugin-registration and DRA sockets; the real
//! kube-scheduler allocates a pod's GPU claim from the slices the plugin
//! publishes; the kubelet has the plugin prepare it and hands the CDI
//! device to containerd, which injects our spec into a busybox container;
//! the claim's status.devices shows the device Ready with its GPU UUID.
//! Needs root (mounts, cgroups, device nodes), like a kubelet.

use std::path::Path;
use std::time::Duration;

use gpu_dra_driver::driver_root::fake_tree;
use integration_tests::plugin_process::{PluginOptions, PluginProcess};
use integration_tests::real_cluster::driver::{eventually_within, install_without_workloads};
use integration_tests::real_cluster::node::{RealNode, TEST_IMAGE, require_root};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, V1_37};
use integration_tests::workspace_root;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const NODE: &str = "real-node";
const INVENTORY: &str = "examples/inventories/dgx-h100.yaml";
/// The inventory's `driverVersion`: the fake driver root holds its files.
const DRIVER_VERSION: &str = "580.82.07";

/// Polls `check` until it gives `Some`, panicking with `context()` after `WAIT`.
async fn eventually<T, F, Fut>(what: &str, check: F, context: impl Fn() -> String) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(what, WAIT, check, context).await
}

/// What the container prints: its device nodes (type, major and minor in
/// hex, as busybox's stat gives them), its mount points, its environment;
/// then it waits for the test to let it finish.
const SHOW: &str = r#"
echo '== devices'
for f in $(find /dev -name 'nvidia*'); do stat -c '%n %F %t %T' "$f"; done
echo '== mounts'
awk '{print $5}' /proc/self/mountinfo
echo '== env'
env
echo '== end'
until [ -e /signal/finish ]; do sleep 0.2; done
"#;

/// The lines of `log` between `== <section>` and the next `== `.
fn section<'a>(log: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!("== {name}");
    log.lines().skip_while(|l| *l != header).skip(1).take_while(|l| !l.starts_with("== ")).collect()
}

/// Every edit of the spec (its own and its devices'), of kind `kind`.
fn edits<'a>(spec: &'a Value, kind: &str) -> Vec<&'a Value> {
    let mut all = Vec::new();
    let devices = spec["devices"].as_array().into_iter().flatten();
    for edits in std::iter::once(&spec["containerEdits"]).chain(devices.map(|d| &d["containerEdits"])) {
        all.extend(edits[kind].as_array().into_iter().flatten());
    }
    all
}

/// The kernel tunables the kubelet sets at start.
fn kernel_tunables() -> Vec<(String, String)> {
    let names = ["vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops"];
    names
        .iter()
        .map(|n| (n.to_string(), std::fs::read_to_string(format!("/proc/sys/{n}")).unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_with_a_gpu_claim_runs_through_the_real_kubelet_and_containerd() {
    require_root();
    let cluster = Cluster::start(V1_37).await;
    install_without_workloads(&cluster, Path::new(env!("CARGO_TARGET_TMPDIR"))).await;
    let tunables_before = kernel_tunables();
    let node = RealNode::start(&cluster, NODE).await;
    let token = node.plugin_token(&cluster).await;

    // The plugin on the kubelet's sockets, the CDI directory containerd
    // reads, a fake driver root and a test /dev root.
    let inventory = std::fs::read_to_string(workspace_root().join(INVENTORY)).unwrap();
    let dirs = node.plugin_dirs(&cluster, &inventory, &token);
    let driver_root = dirs.root.path().join("driver-root");
    fake_tree::build(
        &driver_root,
        DRIVER_VERSION,
        &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")],
    )
    .unwrap();
    let dev_root = dirs.root.path().join("dev-root");
    std::fs::create_dir_all(&dev_root).unwrap();
    let options = PluginOptions {
        node: NODE.into(),
        extra_args: vec![
            "--driver-root".into(),
            driver_root.display().to_string(),
            "--dev-root".into(),
            dev_root.display().to_string(),
        ],
        ..PluginOptions::default()
    };
    let plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let logs = || format!("{}\n{}\n---- plugin\n{}", cluster.logs(), node.logs(), plugin.log());

    let slices: Api<ResourceSlice> = Api::all(cluster.admin());
    eventually(
        "the plugin's slices",
        || async {
            let list = slices.list(&ListParams::default().fields(&format!("spec.nodeName={NODE}"))).await.ok()?;
            (!list.items.is_empty()).then_some(())
        },
        logs,
    )
    .await;

    // A pod with a GPU claim from a template: the controller manager makes
    // the claim, the scheduler allocates it, the kubelet prepares it.
    let signal = node.dir().join("signal");
    std::fs::create_dir_all(&signal).unwrap();
    let objects = [
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cuda-job", "namespace": "default"},
        "spec": {
            "hostNetwork": true, "restartPolicy": "Never", "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            // containerd has no CNI configuration: the node is NotReady.
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "volumes": [{"name": "signal", "hostPath": {"path": signal.display().to_string()}}],
            "containers": [{"name": "show", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", SHOW],
                "volumeMounts": [{"name": "signal", "mountPath": "/signal"}],
                "resources": {"claims": [{"name": "gpu"}]}}],
        }}),
    ];
    create_all(&cluster.admin(), &objects).await.unwrap_or_else(|e| panic!("{e}"));
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), "default");
    let uid = pods.get("cuda-job").await.unwrap().metadata.uid.unwrap();
    let log = eventually(
        "the container's report",
        || async {
            let log = node.container_log("default", "cuda-job", &uid, "show");
            log.contains("== end").then_some(log)
        },
        logs,
    )
    .await;
    eprintln!("---- the container's report\n{log}");

    // The claim the scheduler allocated, and the spec the plugin wrote.
    let claim_name = pods.get("cuda-job").await.unwrap().status.unwrap().resource_claim_statuses.unwrap()[0]
        .resource_claim_name
        .clone()
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.admin(), "default");
    let claim = claims.get(&claim_name).await.unwrap();
    let claim_uid = claim.metadata.uid.clone().unwrap();
    let results = claim.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].pool, NODE);
    // The plugin, on its own token under the chart's RBAC, wrote the
    // device's status: Ready, with the GPU's UUID.
    let entry = eventually(
        "the claim's status.devices entry Ready",
        || async {
            let claim = claims.get(&claim_name).await.ok()?;
            claim.status?.devices?.into_iter().find(|d| {
                d.driver == "gpu.nvidia.com"
                    && d.device == results[0].device
                    && d.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
            })
        },
        logs,
    )
    .await;
    let uuid = entry.data.as_ref().and_then(|d| d.0["uuid"].as_str().map(str::to_owned)).unwrap_or_default();
    assert!(uuid.starts_with("GPU-"), "{entry:?}");
    let spec_path = node.cdi_dir().join(format!("k8s.gpu.nvidia.com-claim_{claim_uid}.json"));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap_or_else(|e| {
        panic!("{}: {e}\n{}", spec_path.display(), logs());
    }))
    .unwrap();

    // What CDI gave the container is what the spec says: each device
    // node (made under the test /dev root on the host too), each driver
    // file, each variable.
    let devices = section(&log, "devices");
    let nodes = edits(&spec, "deviceNodes");
    assert!(nodes.iter().any(|n| n["path"] == "/dev/nvidiactl"), "{spec}");
    assert!(
        nodes
            .iter()
            .any(|n| n["path"].as_str().is_some_and(|p| p.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok()))
    );
    for n in &nodes {
        let path = n["path"].as_str().unwrap();
        let expected = format!(
            "{path} character special file {:x} {:x}",
            n["major"].as_i64().unwrap(),
            n["minor"].as_i64().unwrap()
        );
        assert!(devices.contains(&expected.as_str()), "{expected} not in the container's /dev: {devices:?}");
        assert!(dev_root.join(path.trim_start_matches('/')).exists(), "{path} was not made under the test /dev root");
    }
    assert_eq!(devices.len(), nodes.len(), "the container has exactly the spec's NVIDIA device nodes: {devices:?}");
    let mounts = section(&log, "mounts");
    let files = edits(&spec, "mounts");
    assert!(
        files.iter().any(|m| m["containerPath"].as_str().is_some_and(|p| p.contains("libcuda.so.580.82.07"))),
        "{spec}"
    );
    for m in &files {
        let target = m["containerPath"].as_str().unwrap();
        assert!(mounts.contains(&target), "{target} is not mounted in the container: {mounts:?}");
        assert!(m["hostPath"].as_str().unwrap().starts_with(&driver_root.display().to_string()), "{m}");
    }
    let env = section(&log, "env");
    let variables = edits(&spec, "env");
    assert!(!variables.is_empty(), "{spec}");
    for variable in &variables {
        let variable = variable.as_str().unwrap();
        assert!(env.contains(&variable), "{variable} is not in the container's environment: {env:?}");
    }

    // The container finishes; the kubelet unprepares the claim once the
    // pod has terminated (before reporting it Succeeded): the spec goes.
    std::fs::write(signal.join("finish"), b"").unwrap();
    eventually(
        "the pod to succeed",
        || async {
            let phase = pods.get("cuda-job").await.ok()?.status?.phase?;
            (phase == "Succeeded").then_some(())
        },
        logs,
    )
    .await;
    assert!(!spec_path.exists(), "the spec outlived the pod's end\n{}", logs());
    // Deleting the pod: the controller manager deletes its claim, which the
    // plugin no longer holds.
    pods.delete("cuda-job", &DeleteParams::default()).await.unwrap();
    eventually(
        "the pod and its claim to be gone",
        || async {
            let pod_gone = pods.get_opt("cuda-job").await.ok()?.is_none();
            let claim_gone = claims.get_opt(&claim_name).await.ok()?.is_none();
            (pod_gone && claim_gone).then_some(())
        },
        logs,
    )
    .await;
    let left: Vec<_> = std::fs::read_dir(node.cdi_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "CDI specs left: {left:?}");
    assert!(!plugin.log().contains("ERROR"), "{}", plugin.log());
    // The kubelet, on its node credential, was refused nothing it needed
    // for the claim (the Node authorizer lets it read its pods' claims).
    let kubelet = node.log("kubelet");
    // (Except its status manager reading a pod already deleted: the Node
    // authorizer drops a pod's edge to its node when the pod goes, so that
    // read is refused; seen once in this stop's CI runs, harmless.)
    let after_deletion =
        |l: &str| l.contains("Failed to get status for pod") && l.contains("no relationship found between node");
    let refused: Vec<&str> =
        kubelet.lines().filter(|l| l.contains("forbidden") && l.contains("resource") && !after_deletion(l)).collect();
    assert!(refused.is_empty(), "the kubelet was refused: {refused:#?}");

    // A running pod deleted: the kubelet kills its container and
    // unprepares its claim before the pod goes.
    let mut sleeper = objects[1].clone();
    sleeper["metadata"]["name"] = json!("sleeper");
    sleeper["spec"]["containers"][0]["command"] = json!(["sleep", "3600"]);
    // Graceful: the API server keeps the pod until the kubelet has killed
    // it and unprepared its claim (a grace period of 0 would delete it at
    // once).
    sleeper["spec"]["terminationGracePeriodSeconds"] = json!(1);
    create_all(&cluster.admin(), &[sleeper]).await.unwrap_or_else(|e| panic!("{e}"));
    let spec_of_sleeper = eventually(
        "the sleeper's container to run with its spec written",
        || async {
            let pod = pods.get("sleeper").await.ok()?;
            let running = pod.status.as_ref()?.container_statuses.as_ref()?.first()?.state.as_ref()?.running.is_some();
            let claim = pod.status?.resource_claim_statuses?.first()?.resource_claim_name.clone()?;
            let uid = claims.get(&claim).await.ok()?.metadata.uid?;
            let spec = node.cdi_dir().join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"));
            (running && spec.exists()).then_some(spec)
        },
        logs,
    )
    .await;
    pods.delete("sleeper", &DeleteParams::default()).await.unwrap();
    eventually(
        "the sleeper to be gone",
        || async { pods.get_opt("sleeper").await.ok()?.is_none().then_some(()) },
        logs,
    )
    .await;
    assert!(!spec_of_sleeper.exists(), "deleting the pod left its spec\n{}", logs());

    // Everything torn down: no mount, cgroup or directory of the node
    // left, the kernel tunables the kubelet changed restored.
    let (node_dir, cgroup_root) = (node.dir().to_path_buf(), node.cgroup_root().to_string());
    drop(plugin);
    drop(node);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&*node_dir.to_string_lossy()), "{mounts}");
    assert!(!node_dir.exists());
    let cgroups = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|h| h.path().join(cgroup_root.trim_start_matches('/')));
    let left: Vec<_> = cgroups.filter(|c| c.exists()).collect();
    assert!(left.is_empty(), "cgroups left: {left:?}");
    assert_eq!(kernel_tunables(), tunables_before);
}
