//! `kubectl gpu nodes|claims|why|fit` against the real control plane
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) of the
//! oldest and the newest supported release: the chart installed, two nodes' plugins publishing
//! (an 8x H100 node on the mock NVML with load figures, serving
//! `/metrics`; an A100 MIG node on its fake inventory), the demo workload
//! placed by the real scheduler, the notebook's claim prepared by the
//! node's plugin. The commands read what the real API server serves, the
//! utilization comes through its pod proxy, and `why` says what
//! `gpu-dra-controller simulate` says for the same objects.
//! About 20 s per release.

use std::path::Path;

use integration_tests::kubelet::{Kubelet, KubeletConfig, claim};
use integration_tests::mock_nvml_node::{Load, MockNvmlNode};
use integration_tests::plugin_process::PluginOptions;
use integration_tests::real_cluster::driver::{
    NAMESPACE, PLUGIN_ACCOUNT, WAIT, allocation, chart, eventually, install, pod_claim, start_plugin,
    start_plugin_with_options, unschedulable, yaml_documents,
};
use integration_tests::real_cluster::host_address::HostAddress;
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, Release, V1_34, V1_37};
use integration_tests::{controller, kubectl_gpu, run, stdout_ok, workspace_root};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const DGX: &str = "dgx-h100-a";
const HGX: &str = "hgx-a100-mig";

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// `kubectl gpu ARGS` with the cluster's admin kubeconfig: stdout, stderr.
fn kubectl_gpu_on(cluster: &Cluster, args: &[&str]) -> (String, String) {
    let mut all = vec!["--kubeconfig", cluster.admin_kubeconfig().to_str().expect("path")];
    all.extend_from_slice(args);
    let out = run(kubectl_gpu(), &all, None);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (stdout_ok(&out), stderr)
}

/// The node agent's pod as the DaemonSet would make it on `node` (the
/// chart's labels, its ServiceAccount, the `metrics` port), with the
/// status a kubelet would write: running at `ip`.
async fn plugin_pod(cluster: &Cluster, node: &str, ip: &str, port: u16) {
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), NAMESPACE);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("gpu-dra-driver-kubelet-plugin-{node}"), "labels": {
            "app.kubernetes.io/name": "gpu-dra-driver", "app.kubernetes.io/instance": "real",
            "app.kubernetes.io/component": "kubelet-plugin"}},
        "spec": {"nodeName": node, "serviceAccountName": PLUGIN_ACCOUNT,
            "containers": [{"name": "plugin", "image": "registry.invalid/gpu-dra-driver",
                "ports": [{"name": "metrics", "containerPort": port}]}]}
    }))
    .expect("Pod");
    let created = pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("plugin pod: {e}"));
    let name = created.metadata.name.unwrap_or_default();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip,
        "hostIPs": [{"ip": ip}]}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("plugin pod status: {e}"));
}

/// simulate's answer for `claim`, given the cluster's slices, classes,
/// nodes and allocated claims plus that claim, as files.
async fn simulate_reason(cluster: &Cluster, claim: &ResourceClaim) -> String {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut objects: Vec<Value> = Vec::new();
    let admin = cluster.admin();
    let lp = ListParams::default();
    let typed = |kind: &str, version: &str, mut v: Value| {
        v["kind"] = json!(kind);
        v["apiVersion"] = json!(version);
        v
    };
    for s in Api::<ResourceSlice>::all(admin.clone()).list(&lp).await.expect("slices").items {
        objects.push(typed("ResourceSlice", "resource.k8s.io/v1", serde_json::to_value(s).expect("JSON")));
    }
    for c in Api::<DeviceClass>::all(admin.clone()).list(&lp).await.expect("classes").items {
        objects.push(typed("DeviceClass", "resource.k8s.io/v1", serde_json::to_value(c).expect("JSON")));
    }
    for n in Api::<Node>::all(admin.clone()).list(&lp).await.expect("nodes").items {
        objects.push(typed("Node", "v1", serde_json::to_value(n).expect("JSON")));
    }
    for c in Api::<ResourceClaim>::all(admin.clone()).list(&lp).await.expect("claims").items {
        let allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
        if allocated || c.metadata.uid == claim.metadata.uid {
            objects.push(typed("ResourceClaim", "resource.k8s.io/v1", serde_json::to_value(c).expect("JSON")));
        }
    }
    for (i, object) in objects.iter().enumerate() {
        let file = dir.path().join(format!("{i:03}.json"));
        std::fs::write(&file, serde_json::to_string(object).expect("JSON")).expect("object file");
    }
    let out = run(controller(), &["simulate", "-f", dir.path().to_str().expect("path"), "-o", "json"], None);
    let v: Value = serde_json::from_str(&stdout_ok(&out)).expect("simulate's JSON");
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let result = v["results"].as_array().and_then(|r| r.iter().find(|r| r["name"] == name)).cloned();
    let result = result.unwrap_or_else(|| panic!("simulate says nothing of {name}: {v}"));
    result["reason"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_gpu_reads_the_real_control_plane_1_34() {
    kubectl_gpu_reads_the_real_control_plane(V1_34).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_gpu_reads_the_real_control_plane_1_37() {
    kubectl_gpu_reads_the_real_control_plane(V1_37).await;
}

async fn kubectl_gpu_reads_the_real_control_plane(release: Release) {
    let cluster = Cluster::start(release).await;
    let objects = chart(tmp_dir(), json!({"webhook": {"enabled": false}}));
    install(&cluster, &objects).await;
    let inventories = workspace_root().join("examples/inventories");

    // The H100 node: the mock NVML (the notebook's GPU at 64 %, set once
    // the scheduler has chosen it), /metrics on an address the API server
    // may proxy to (it refuses loopback pod IPs).
    let host = HostAddress::acquire();
    let dgx_text = std::fs::read_to_string(inventories.join("dgx-h100.yaml")).expect("inventory");
    let gpus = MockNvmlNode::new(&dgx_text);
    let mut extra_args = gpus.args();
    extra_args.extend(["--telemetry-interval-ms", "200"].map(String::from));
    let options = PluginOptions {
        node: DGX.into(),
        fake_inventory: false,
        metrics_addr: format!("{}:0", host.ip()),
        extra_args,
        env: gpus.env(),
        ..PluginOptions::default()
    };
    let mut dgx = start_plugin_with_options(&cluster, "gpus: []\n", options).await;
    let line = dgx.process.wait_for_log("serving /metrics", WAIT).unwrap_or_else(|| panic!("{}", dgx.process.log()));
    let port: u16 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    plugin_pod(&cluster, DGX, &host.ip().to_string(), port).await;
    let hgx = start_plugin(&cluster, HGX, &inventories.join("a100-mig.yaml")).await;

    let workload = yaml_documents(&workspace_root().join("examples/demo/workload.yaml"));
    create_all(&cluster.admin(), &workload).await.unwrap_or_else(|e| panic!("the real API server refused it: {e}"));
    let logs = || format!("{}\n{}\n{}", cluster.logs(), dgx.process.log(), hgx.process.log());
    let mut placed = Vec::new();
    for pod in ["notebook", "trainer", "tiny-llm"] {
        let claim = eventually(
            &format!("{pod}'s claim allocated"),
            || async { pod_claim(&cluster, "default", pod).await.filter(|c| !allocation(c).is_empty()) },
            logs,
        )
        .await;
        placed.push(claim);
    }
    let big = eventually(
        "big-model unschedulable with its claim",
        || async {
            let claim = pod_claim(&cluster, "default", "big-model").await?;
            unschedulable(&cluster, "default", "big-model").await.then_some(claim)
        },
        logs,
    )
    .await;

    // The DGX's plugin prepares the notebook's claim, as its kubelet would.
    let kubelet = Kubelet::new(KubeletConfig::new(&dgx.dirs.registry, "gpu.nvidia.com"));
    let plugin = kubelet.wait_and_register(WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", dgx.process.log()));
    let notebook = &placed[0];
    // The scheduler may pick any of the DGX's GPUs for it.
    let (_, notebook_gpu) = allocation(notebook).into_iter().next().unwrap_or_default();
    gpus.set_loads(&[(&gpus.uuid(&notebook_gpu), Load::gpu(64))]);
    let notebook_name = notebook.metadata.name.clone().unwrap_or_default();
    let uid = notebook.metadata.uid.clone().unwrap_or_default();
    let prepared = kubelet.prepare(&plugin, &[claim("default", &notebook_name, &uid)]).await;
    prepared.unwrap_or_else(|e| panic!("{e}\n{}", dgx.process.log()));

    // nodes: both nodes, by model and MIG layout; the four allocated devices.
    let (text, _) = kubectl_gpu_on(&cluster, &["nodes"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("NODE ") && lines[0].ends_with("TAINTS"), "{text}");
    assert!(lines[1].starts_with(&format!("{DGX}     8x NVIDIA H100 80GB HBM3")), "{text}");
    assert!(lines[2].starts_with(&format!("{HGX}   2x NVIDIA A100-SXM4-80GB")), "{text}");
    let (json_text, _) = kubectl_gpu_on(&cluster, &["nodes", "-o", "json"]);
    let nodes: Value = serde_json::from_str(&json_text).expect("JSON");
    let allocated: u64 = nodes.as_array().into_iter().flatten().filter_map(|n| n["allocated"].as_u64()).sum();
    assert_eq!(allocated, 4, "notebook 1, trainer 2, tiny-llm 1: {nodes}");

    // claims: the notebook's utilization through the real pod proxy; the
    // MIG node has no agent pod: "-" and a warning.
    let (text, stderr) = eventually(
        "the notebook's utilization in kubectl gpu claims",
        || async {
            let (text, stderr) = kubectl_gpu_on(&cluster, &["claims", "--metrics-timeout", "3s"]);
            text.lines()
                .any(|l| l.starts_with(&format!("default     {notebook_name}")) && l.ends_with("64%"))
                .then_some((text, stderr))
        },
        logs,
    )
    .await;
    let big_name = big.metadata.name.clone().unwrap_or_default();
    let row = |name: &str| text.lines().find(|l| l.split_whitespace().nth(1) == Some(name)).unwrap_or_default();
    assert!(row(&big_name).contains(" pending "), "{text}");
    assert!(row(&notebook_name).contains(&format!(" pod/notebook   {DGX} ")), "{text}");
    let tiny = placed[2].metadata.name.clone().unwrap_or_default();
    assert!(row(&tiny).ends_with(" -"), "{text}");
    assert!(stderr.contains(&format!("Warning: utilization on node {HGX} unknown: no node agent pod")), "{stderr}");
    let (json_text, _) = kubectl_gpu_on(&cluster, &["claims", "-o", "json", "--metrics-timeout", "3s"]);
    let claims: Value = serde_json::from_str(&json_text).expect("JSON");
    let of = |name: &str| claims.as_array().into_iter().flatten().find(|c| c["name"] == name).cloned();
    let notebook_json = of(&notebook_name).unwrap_or_default();
    assert_eq!(notebook_json["utilization"]["percent"]["mean"], 64.0, "{claims}");
    // The trainer's claim is allocated on the DGX but not prepared there.
    let trainer = placed[1].metadata.name.clone().unwrap_or_default();
    let trainer_json = of(&trainer).unwrap_or_default();
    if trainer_json["node"] == DGX {
        let why = trainer_json["utilization"]["unavailable"].as_str().unwrap_or_default();
        assert!(why.contains("not prepared there yet"), "{trainer_json}");
    }

    // why: simulate's explanation, word for word, for the same cluster.
    let expected = simulate_reason(&cluster, &big).await;
    assert!(!expected.is_empty(), "simulate explains why big-model's claim does not fit");
    let (json_text, _) = kubectl_gpu_on(&cluster, &["why", &big_name, "-o", "json"]);
    let why: Value = serde_json::from_str(&json_text).expect("JSON");
    assert_eq!(why["results"][0]["allocated"], false, "{why}");
    assert_eq!(why["results"][0]["reason"].as_str(), Some(expected.as_str()), "{why}");
    let (text, _) = kubectl_gpu_on(&cluster, &["why", "pod/big-model"]);
    assert_eq!(
        text,
        format!("pod default/big-model:\n  ResourceClaim default/{big_name}: cannot be allocated now: {expected}\n")
    );

    // fit: one more H100 fits (on the DGX), nine do not.
    let file = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(
        file.path(),
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: one}\nspec:\n  devices:\n    requests:\n    - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, selectors: [{cel: {expression: \"device.attributes['gpu.nvidia.com'].productName.contains('H100')\"}}]}}\n---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: nine}\nspec:\n  devices:\n    requests:\n    - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 9}}\n",
    )
    .expect("claims file");
    let (json_text, _) = kubectl_gpu_on(&cluster, &["fit", "-f", file.path().to_str().expect("path"), "-o", "json"]);
    let fit: Value = serde_json::from_str(&json_text).expect("JSON");
    let results = fit["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 2, "{fit}");
    assert_eq!((results[0]["name"].as_str(), results[0]["allocated"].as_bool()), (Some("one"), Some(true)), "{fit}");
    assert!(results[0].to_string().contains(DGX), "placed on the DGX: {fit}");
    assert_eq!((results[1]["name"].as_str(), results[1]["allocated"].as_bool()), (Some("nine"), Some(false)), "{fit}");
    assert!(results[1]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{fit}");

    // An administrator's DeviceTaintRule (served in resource.k8s.io/v1
    // from 1.37) on the MIG node's pool: nodes shows its taint with the
    // rule's name, as the scheduler would count it.
    if release.minor == "1.37" {
        let rule = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "hgx-maintenance"},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": HGX},
                     "taint": {"key": "example.com/maintenance", "value": "bios", "effect": "NoSchedule"}}});
        create_all(&cluster.admin(), &[rule]).await.unwrap_or_else(|e| panic!("the real API server refused it: {e}"));
        let (text, _) = kubectl_gpu_on(&cluster, &["nodes"]);
        let hgx_line = text.lines().find(|l| l.starts_with(HGX)).unwrap_or_default();
        assert!(
            hgx_line.contains("example.com/maintenance=bios:NoSchedule (DeviceTaintRule hgx-maintenance)"),
            "{text}"
        );
        let dgx_line = text.lines().find(|l| l.starts_with(DGX)).unwrap_or_default();
        assert!(!dgx_line.contains("hgx-maintenance"), "{text}");
    }

    // A user holding only the chart's two viewer roles sees the same.
    let analyst = tmp_dir().join(format!("analyst-{}.kubeconfig", release.minor));
    cluster.write_kubeconfig(&analyst, &service_account_token(&cluster, "default", "analyst").await);
    let refused = run(kubectl_gpu(), &["--kubeconfig", analyst.to_str().expect("path"), "nodes"], None);
    let why_not = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && why_not.starts_with("error: listing "), "{why_not}");
    assert!(why_not.contains(" is forbidden: User \"system:serviceaccount:default:analyst\" cannot list"), "{why_not}");
    assert!(
        why_not.trim_end().ends_with(
            "(403 Forbidden); the chart's ClusterRole <release>-gpu-viewer grants it: ask your cluster's \
             administrator to bind it to you"
        ),
        "{why_not}"
    );
    let as_user = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", analyst.to_str().expect("path")];
        all.extend_from_slice(args);
        let out = run(kubectl_gpu(), &all, None);
        out.status.success().then(|| {
            (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
        })
    };
    // The viewer ClusterRole alone: everything but the utilization, whose
    // warning names the Role that grants it.
    bind(&cluster, &objects, "ClusterRole", "-gpu-viewer", "analyst").await;
    eventually(
        "the analyst's kubectl gpu claims, the pod proxy refused",
        || async {
            let (_, warnings) = as_user(&["claims", "--metrics-timeout", "3s"])?;
            warnings
                .contains(
                    "(403 Forbidden); the chart's Role <release>-gpu-metrics-reader (in the driver's namespace) \
                     grants it: ask your cluster's administrator to bind it to you",
                )
                .then_some(())
        },
        logs,
    )
    .await;
    bind(&cluster, &objects, "Role", "-gpu-metrics-reader", "analyst").await;
    let (as_admin, _) = kubectl_gpu_on(&cluster, &["why", "pod/big-model"]);
    eventually(
        "the analyst's kubectl gpu, once both roles are bound",
        || async {
            let (claims, warnings) = as_user(&["claims", "--metrics-timeout", "3s"])?;
            let utilization =
                claims.lines().any(|l| l.starts_with(&format!("default     {notebook_name}")) && l.ends_with("64%"));
            let (nodes, _) = as_user(&["nodes"])?;
            let (why, _) = as_user(&["why", "pod/big-model"])?;
            let fits = as_user(&["fit", "-f", file.path().to_str().expect("path")]).is_some();
            (utilization && !warnings.contains(DGX) && nodes.lines().count() == 3 && why == as_admin && fits)
                .then_some(())
        },
        logs,
    )
    .await;
}

/// A token for `namespace/name`, a ServiceAccount made here (standing for
/// a user the chart's roles are bound to).
async fn service_account_token(cluster: &Cluster, namespace: &str, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.admin(), namespace);
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).expect("ServiceAccount");
    accounts.create(&PostParams::default(), &account).await.unwrap_or_else(|e| panic!("ServiceAccount: {e}"));
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": 3600}})).expect("TokenRequest");
    let answer = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{name}: {e}"));
    answer.status.and_then(|s| s.token).expect("TokenRequest answered without a token")
}

/// Binds the chart's `kind` (ClusterRole or Role) whose name ends in
/// `suffix` (found among the rendered `objects`) to the ServiceAccount
/// `default/account`, as an administrator following docs/operating.md would.
async fn bind(cluster: &Cluster, objects: &[Value], kind: &str, suffix: &str, account: &str) {
    let role = objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(suffix)))
        .and_then(|o| o["metadata"]["name"].as_str())
        .unwrap_or_else(|| panic!("the chart renders no {kind} *{suffix}"));
    let mut metadata = json!({"name": format!("{account}{suffix}")});
    if kind == "Role" {
        metadata["namespace"] = json!(NAMESPACE);
    }
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": format!("{kind}Binding"),
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}]});
    create_all(&cluster.admin(), &[binding]).await.unwrap_or_else(|e| panic!("binding {role}: {e}"));
}
