//! `kubectl gpu` against the API server stand-in: slices built by the
//! plugin's slice builder from the example inventories, the shipped
//! DeviceClasses, claims allocated and pending. `why` must say what
//! `gpu-dra-controller simulate` says for the same objects.

use std::path::Path;
use std::time::{Duration, Instant};

use gpu_dra_driver::inventory::fake;
use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_dra_driver::slices::SliceBuilder;
use integration_tests::apiserver::ApiServer;
use integration_tests::claim_fixtures::{self, Allocated, allocated_claim, pending_claim};
use integration_tests::kubelet::{self as kubelet_standin, KubeletConfig};
use integration_tests::mock_nvml_node::{Load, MockNvmlNode};
use integration_tests::node::{DRIVER, NODE, RunningNode};
use integration_tests::plugin_process::PluginOptions;
use integration_tests::real_cluster::host_address::HostAddress;
use integration_tests::wait;
use integration_tests::{controller, kubectl_gpu, run, stdout_ok, workspace_root};

const WAIT: Duration = Duration::from_secs(60);
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimTemplate, ResourceSlice,
};
use serde_json::{Value, json};

const A100_NODE: &str = "node-a";
const H100_NODE: &str = "node-b";

fn slices(inventory: &str, node: &str) -> Vec<ResourceSlice> {
    let node = NodeName::new(node).unwrap();
    let path = workspace_root().join("examples/inventories").join(inventory);
    let inventory = fake::load(&path, &node).unwrap();
    SliceBuilder::new(DriverName::nvidia_default(), node).build(&inventory, 1).unwrap()
}

fn classes() -> Vec<DeviceClass> {
    ["gpu.nvidia.com.yaml", "mig.nvidia.com.yaml"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(workspace_root().join("deviceclasses").join(f)).unwrap();
            serde_yaml_ng::from_str(&text).unwrap()
        })
        .collect()
}

/// A claim holding `devices` of `node`, reserved for pod `pod`.
fn allocated(name: &str, node: &str, devices: &[&str], pod: &str) -> ResourceClaim {
    let mut c = pending_claim(name, "gpu.nvidia.com", u32::try_from(devices.len()).unwrap(), None);
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": d}))
        .collect();
    c.status = Some(
        serde_json::from_value(json!({
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": "00000000-0000-0000-0000-000000000001"}]
        }))
        .unwrap(),
    );
    c
}

/// The stand-in with an A100 MIG node, an 8x H100 node, both classes,
/// 7 of the H100s allocated and two pending claims.
fn cluster() -> ApiServer {
    let server = ApiServer::start_in_thread().unwrap();
    for s in slices("a100-mig.yaml", A100_NODE).iter().chain(&slices("dgx-h100.yaml", H100_NODE)) {
        server.create(s).unwrap();
    }
    for c in classes() {
        server.create(&c).unwrap();
    }
    for n in [A100_NODE, H100_NODE] {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}})).unwrap();
        server.create(&node).unwrap();
    }
    let held: Vec<String> = (0..7).map(|i| format!("gpu-{i}")).collect();
    let held: Vec<&str> = held.iter().map(String::as_str).collect();
    server.create_with_status(&allocated("trainer", H100_NODE, &held, "trainer-0")).unwrap();
    server
        .create(&pending_claim(
            "two-h100",
            "gpu.nvidia.com",
            2,
            Some(r#"device.attributes["gpu.nvidia.com"].productName.contains("H100")"#),
        ))
        .unwrap();
    server
        .create(&pending_claim(
            "typo",
            "gpu.nvidia.com",
            1,
            Some(r#"device.attributes["gpu.nvidia.com"].architecure == "Hopper""#),
        ))
        .unwrap();
    server
}

fn kubectl_gpu_in(server: &ApiServer, dir: &Path, args: &[&str]) -> std::process::Output {
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut all = vec!["--kubeconfig", kubeconfig.to_str().unwrap()];
    all.extend_from_slice(args);
    run(kubectl_gpu(), &all, None)
}

/// simulate's reason for `claim_name`, given the cluster's slices, classes,
/// nodes and allocated claims plus that claim, as files.
fn simulate_reason(server: &ApiServer, dir: &Path, claim_name: &str) -> String {
    let files = dir.join("objects");
    std::fs::create_dir_all(&files).unwrap();
    let mut n = 0;
    let mut write = |value: Value| {
        n += 1;
        std::fs::write(files.join(format!("{n:03}.json")), serde_json::to_string(&value).unwrap()).unwrap();
    };
    for s in server.list::<ResourceSlice>(None, "").unwrap() {
        write(serde_json::to_value(s).unwrap());
    }
    for c in server.list::<DeviceClass>(None, "").unwrap() {
        write(serde_json::to_value(c).unwrap());
    }
    for node in server.list::<Node>(None, "").unwrap() {
        write(serde_json::to_value(node).unwrap());
    }
    for c in server.list::<ResourceClaim>(Some("default"), "").unwrap() {
        let allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
        if allocated || c.metadata.name.as_deref() == Some(claim_name) {
            write(serde_json::to_value(c).unwrap());
        }
    }
    let out = run(controller(), &["simulate", "-f", files.to_str().unwrap(), "-o", "json"], None);
    let v: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    let results = v["results"].as_array().unwrap();
    let r = results.iter().find(|r| r["name"] == claim_name).unwrap();
    r["reason"].as_str().unwrap().to_string()
}

#[test]
fn why_says_what_simulate_says() {
    let server = cluster();
    for name in ["two-h100", "typo"] {
        let dir = tempfile::tempdir().unwrap();
        let out = kubectl_gpu_in(&server, dir.path(), &["why", name, "-o", "json"]);
        let v: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 1, "{v}");
        assert_eq!(results[0]["allocated"], false, "{v}");
        let reason = results[0]["reason"].as_str().unwrap();
        assert_eq!(reason, simulate_reason(&server, dir.path(), name), "claim {name}");
        // The explanation itself, not just agreement. A selector that
        // cannot be evaluated is an error, not "does not fit".
        let verdict = if name == "typo" {
            assert!(reason.contains(r#"did you mean "architecture"?"#), "{reason}");
            "error"
        } else {
            assert!(!reason.is_empty());
            "cannot be allocated now"
        };
        assert_eq!(results[0]["error"], name == "typo", "{v}");
        // The table form names the claim and carries the same reason.
        let text = stdout_ok(&kubectl_gpu_in(&server, dir.path(), &["why", &format!("resourceclaim/{name}")]));
        assert_eq!(text, format!("ResourceClaim default/{name}: {verdict}: {reason}\n"));
    }
}

#[test]
fn why_a_pod_simulates_its_claims_together() {
    let server = cluster();
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": "one-mig", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}}
    }))
    .unwrap();
    server.create(&template).unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "resourceClaims": [
            {"name": "mig", "resourceClaimTemplateName": "one-mig"},
            {"name": "h100", "resourceClaimName": "two-h100"}]}
    }))
    .unwrap();
    server.create(&pod).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = stdout_ok(&kubectl_gpu_in(&server, dir.path(), &["why", "pod/p"]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "pod default/p:", "{text}");
    // The MIG device would fit on node-a, the H100s do not: the pod's
    // claims share a node, so neither is allocated and the MIG claim says why.
    assert!(lines[1].starts_with("  ResourceClaim default/p-mig: cannot be allocated now: "), "{text}");
    assert!(lines[2].starts_with("  ResourceClaim default/two-h100: cannot be allocated now: "), "{text}");
    assert_eq!(lines.len(), 3, "{text}");
}

#[test]
fn nodes_counts_models_mig_and_holders() {
    let server = cluster();
    let dir = tempfile::tempdir().unwrap();
    let text = stdout_ok(&kubectl_gpu_in(&server, dir.path(), &["nodes"]));
    let expected = "\
NODE     GPUS                       MIG                                  DEVICES   ALLOCATED   SHARED   FREE   TAINTS
node-a   2x NVIDIA A100-SXM4-80GB   8x 1g.10gb, 1x 2g.20gb, 1x 3g.40gb   12        0           0        12     -
node-b   8x NVIDIA H100 80GB HBM3   -                                    8         7           0        1      -
";
    assert_eq!(text, expected);
}

#[test]
fn claims_lists_pods_nodes_and_devices() {
    let server = cluster();
    let dir = tempfile::tempdir().unwrap();
    let out = kubectl_gpu_in(&server, dir.path(), &["claims", "-A"]);
    let text = stdout_ok(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].starts_with("NAMESPACE   NAME       STATE       PODS            NODE     DEVICES"), "{text}");
    assert!(
        lines[1].starts_with("default     trainer    allocated   pod/trainer-0   node-b   gpu=gpu-0,gpu-1,"),
        "{text}"
    );
    assert!(lines[1].ends_with("   -"), "utilization unknown: {text}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "Warning: utilization on node node-b unknown: no node agent pod \
         (label app.kubernetes.io/name=gpu-dra-driver,app.kubernetes.io/component=kubelet-plugin) on the node\n"
    );
    let json = stdout_ok(&kubectl_gpu_in(&server, dir.path(), &["claims", "-o", "json"]));
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 3);
}

#[test]
fn fit_places_what_fits_and_explains_the_rest() {
    let server = cluster();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("claims.yaml");
    std::fs::write(
        &file,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: one}\nspec:\n  devices:\n    requests:\n    - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}\n---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: nine}\nspec:\n  devices:\n    requests:\n    - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 9}}\n",
    )
    .unwrap();
    let out = kubectl_gpu_in(&server, dir.path(), &["fit", "-f", file.to_str().unwrap(), "-o", "json"]);
    let v: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{v}");
    assert_eq!((results[0]["name"].as_str(), results[0]["allocated"].as_bool()), (Some("one"), Some(true)), "{v}");
    assert_eq!((results[1]["name"].as_str(), results[1]["allocated"].as_bool()), (Some("nine"), Some(false)), "{v}");
    assert!(results[1]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{v}");
}

#[test]
fn errors_read_like_kubectls() {
    let server = cluster();
    let dir = tempfile::tempdir().unwrap();
    let out = kubectl_gpu_in(&server, dir.path(), &["why", "resourceclaim/missing"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: resourceclaims \"missing\" not found in namespace \"default\"\n"
    );
    let out = kubectl_gpu_in(&server, dir.path(), &["nodes", "-o", "wide"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: invalid value 'wide' for '--output <OUTPUT>'"), "{stderr}");
    let out = run(kubectl_gpu(), &["--kubeconfig", "/nonexistent/kubeconfig", "nodes"], None);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: --kubeconfig /nonexistent/kubeconfig"), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// A node agent's pod as the chart makes it (its labels, the `metrics`
/// container port) on `node`, at `ip`.
fn plugin_pod(name: &str, node: &str, ip: &str, port: u16) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "gpu-dra-driver", "labels": {
            "app.kubernetes.io/name": "gpu-dra-driver", "app.kubernetes.io/component": "kubelet-plugin"}},
        "spec": {"nodeName": node, "containers": [{"name": "plugin", "image": "gpu-dra-driver",
            "ports": [{"name": "metrics", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIPs": [{"ip": ip}]}
    }))
    .unwrap()
}

/// `default/name` allocated `device` of `node`, reserved for pod `pod`.
fn store_allocated(server: &ApiServer, name: &str, node: &str, device: &str, pod: &str) -> String {
    let mut object = allocated_claim("default", name, &[Allocated::new("gpu", node, device)], vec![]);
    if let Some(status) = object.status.as_mut() {
        status.reserved_for = Some(vec![ResourceClaimConsumerReference {
            api_group: None,
            resource: "pods".into(),
            name: pod.into(),
            uid: format!("uid-{pod}"),
        }]);
    }
    claim_fixtures::store(server, &object).unwrap()
}

/// `kubectl gpu claims` reads each claim's utilization from its node
/// agent's `/metrics` through the API server's pod proxy: the real plugin
/// on the mock NVML (gpu-0 at 37 %) on node-a; on the other nodes what
/// goes wrong in clusters: no agent pod (node-b), a pod the API server
/// refuses to proxy to (loopback, node-c), an agent that never answers
/// (node-d). Each gets "-" and a warning saying why, within the timeout.
#[test]
fn claims_shows_utilization_from_the_node_agents_metrics_or_why_not() {
    let host = HostAddress::acquire();
    let gpus = MockNvmlNode::new(
        "driverVersion: \"580.82.07\"\ncudaDriverVersion: \"13.0\"\ngpus:\n  - model: H100-80GB\n    count: 2\n",
    );
    gpus.set_loads(&[(&gpus.uuid("gpu-0"), Load::gpu(37)), (&gpus.uuid("gpu-1"), Load::gpu(90))]);
    let mut extra_args = gpus.args();
    extra_args.extend(["--telemetry-interval-ms", "200"].map(String::from));
    let options = PluginOptions {
        fake_inventory: false,
        metrics_addr: format!("{}:0", host.ip()),
        extra_args,
        env: gpus.env(),
        ..PluginOptions::default()
    };
    let mut node = RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), options);
    let line = node.process.wait_for_log("serving /metrics", WAIT).unwrap_or_else(|| panic!("{}", node.process.log()));
    let addr = line.split_whitespace().find_map(|w| w.strip_prefix("addr=")).unwrap_or_else(|| panic!("{line}"));
    let port: u16 = addr.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{addr}"));
    let server = &node.server;
    server.create_with_status(&plugin_pod("plugin-a", NODE, &host.ip().to_string(), port)).unwrap();
    server.create_with_status(&plugin_pod("plugin-c", "node-c", "127.0.0.1", port)).unwrap();
    // Accepts connections and never answers.
    let silent = std::net::TcpListener::bind((host.ip(), 0)).unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    server.create_with_status(&plugin_pod("plugin-d", "node-d", &host.ip().to_string(), silent_port)).unwrap();

    let uid = store_allocated(server, "notebook-gpu", NODE, "gpu-0", "notebook");
    let answers = node.prepare(&[kubelet_standin::claim("default", "notebook-gpu", &uid)]);
    assert!(answers[&uid].is_ok(), "{answers:?}");
    for (claim, on, pod) in
        [("llm-serve", "node-b", "llm-0"), ("batch", "node-c", "batch-0"), ("render", "node-d", "render-0")]
    {
        store_allocated(server, claim, on, "gpu-0", pod);
    }

    let dir = tempfile::tempdir().unwrap();
    let claims = |args: &[&str]| {
        let mut all = vec!["claims", "--metrics-timeout", "1s"];
        all.extend_from_slice(args);
        kubectl_gpu_in(server, dir.path(), &all)
    };
    let utilization = || {
        let started = Instant::now();
        let out = claims(&[]);
        let took = started.elapsed();
        let text = stdout_ok(&out);
        let shown = text.lines().any(|l| l.starts_with("default     notebook-gpu") && l.ends_with("37%"));
        shown.then(|| (text, String::from_utf8_lossy(&out.stderr).into_owned(), took))
    };
    let context = || format!("{}\n{}", stdout_ok(&claims(&[])), node.process.log());
    let (text, stderr, took) = wait::until_some("notebook-gpu's utilization", WAIT, utilization, context);
    // As docs/operating.md shows it.
    let expected = "\
NAMESPACE   NAME           STATE       PODS           NODE     DEVICES     UTILIZATION
default     batch          allocated   pod/batch-0    node-c   gpu=gpu-0   -
default     llm-serve      allocated   pod/llm-0      node-b   gpu=gpu-0   -
default     notebook-gpu   allocated   pod/notebook   node-a   gpu=gpu-0   37%
default     render         allocated   pod/render-0   node-d   gpu=gpu-0   -
";
    assert_eq!(text, expected);
    // As docs/operating.md shows them.
    assert_eq!(
        stderr,
        "Warning: utilization on node node-b unknown: no node agent pod \
         (label app.kubernetes.io/name=gpu-dra-driver,app.kubernetes.io/component=kubelet-plugin) on the node\n\
         Warning: utilization on node node-c unknown: its node agent gpu-dra-driver/plugin-c did not answer: \
         address not allowed (400 BadRequest)\n\
         Warning: utilization on node node-d unknown: its node agent gpu-dra-driver/plugin-d: no answer within 1s\n"
    );
    assert!(took < Duration::from_secs(10), "the timeout bounds the command: {took:?}");

    let json = stdout_ok(&claims(&["-o", "json"]));
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[2]["utilization"], json!({"percent": {"mean": 37.0, "devices": {"gpu-0": 37.0}}}), "{v}");
    assert!(v[1]["utilization"]["unavailable"].as_str().is_some_and(|r| r.starts_with("node node-b: ")), "{v}");

    // 0s skips the node agents: no utilization, no warnings, no wait for the silent one.
    let started = Instant::now();
    let out = kubectl_gpu_in(server, dir.path(), &["claims", "--metrics-timeout", "0s"]);
    assert_eq!(stdout_ok(&out), expected.replace("37%", "-"));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    drop(silent);
}

/// The chart's roles for `kubectl gpu`'s users grant exactly what its four
/// commands call: the rules of the ClusterRole `*-gpu-viewer` and the Role
/// `*-gpu-metrics-reader` against the stand-in's record of the requests
/// sent with the `kubectl-gpu/` User-Agent.
#[test]
fn the_charts_viewer_roles_are_exactly_what_it_calls() {
    use integration_tests::apiserver::audit::calls_by;
    use integration_tests::helm::{one, render_all, rendered};
    use integration_tests::rbac::{Grant, allows, role_grants};
    use std::collections::BTreeSet;

    let server = cluster();
    server.create_with_status(&plugin_pod("plugin-b", H100_NODE, "127.0.0.1", 9)).unwrap();
    let trainer: Pod = serde_json::from_value(json!({
        "metadata": {"name": "trainer-0", "namespace": "default"},
        "spec": {"nodeName": H100_NODE, "containers": [{"name": "train", "image": "busybox"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "trainer"}]},
    }))
    .unwrap();
    server.create(&trainer).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let claims_file = dir.path().join("claims.yaml");
    std::fs::write(
        &claims_file,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: one, namespace: default}\n\
         spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}\n",
    )
    .unwrap();
    let file = claims_file.to_str().unwrap();
    for args in [
        &["nodes"][..],
        &["claims", "-A", "--metrics-timeout", "2s"],
        &["claims"],
        &["why", "typo"],
        &["why", "pod/trainer-0"],
        &["fit", "-f", file],
    ] {
        stdout_ok(&kubectl_gpu_in(&server, dir.path(), args));
    }
    let calls = calls_by(&server.faults().requests(), "kubectl-gpu/");

    let outcomes = render_all(Path::new(env!("CARGO_TARGET_TMPDIR")), &[("default", json!({}))]);
    let (objects, _) = rendered(&outcomes, "default");
    let grants: BTreeSet<Grant> =
        [one(&objects, "ClusterRole", "-gpu-viewer"), one(&objects, "Role", "-gpu-metrics-reader")]
            .into_iter()
            .flat_map(role_grants)
            .collect();
    let denied: Vec<_> = calls.iter().filter(|c| !allows(&grants, c)).collect();
    assert!(denied.is_empty(), "kubectl gpu makes calls its roles do not allow: {denied:#?}");
    let unused: Vec<_> = grants
        .iter()
        .filter(|(v, g, r, _)| !calls.iter().any(|c| c.verb == v && c.group == *g && c.resource == *r))
        .collect();
    assert!(unused.is_empty(), "the roles grant what kubectl gpu never does: {unused:#?}");
    assert!(calls.iter().any(|c| c.resource == "pods/proxy" && c.namespace.as_deref() == Some("gpu-dra-driver")));
}

/// An administrator's DeviceTaintRule (`resource.k8s.io/v1`, as 1.37
/// serves it) taints the one free H100: `nodes` shows it with the rule's
/// name, and `why` says the claim that would have had that GPU is kept out
/// by the taint, as the scheduler would.
#[test]
fn device_taint_rules_are_shown_and_honoured() {
    let server = cluster();
    server
        .create(&pending_claim(
            "one-h100",
            "gpu.nvidia.com",
            1,
            Some(r#"device.attributes["gpu.nvidia.com"].productName.contains("H100")"#),
        ))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let why = |server: &ApiServer| -> Value {
        serde_json::from_str(&stdout_ok(&kubectl_gpu_in(server, dir.path(), &["why", "one-h100", "-o", "json"])))
            .unwrap()
    };
    assert_eq!(why(&server)["results"][0]["allocated"], true, "without the rule, gpu-7 is free");
    // The cluster has not allocated it: that is said, apart from what would fit.
    let text = stdout_ok(&kubectl_gpu_in(&server, dir.path(), &["why", "one-h100"]));
    assert!(text.contains("not allocated yet: it would fit now on"), "{text}");
    assert_eq!(why(&server)["pending"], json!(["default/one-h100"]));
    let rule: k8s_openapi::api::resource::v1::DeviceTaintRule = serde_json::from_value(json!({
        "metadata": {"name": "drain-gpu-7"},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": H100_NODE, "device": "gpu-7"},
                 "taint": {"key": "example.com/maintenance", "value": "fan", "effect": "NoSchedule"}}
    }))
    .unwrap();
    server.create(&rule).unwrap();
    let nodes = stdout_ok(&kubectl_gpu_in(&server, dir.path(), &["nodes"]));
    let h100 = nodes.lines().find(|l| l.starts_with(H100_NODE)).unwrap_or_else(|| panic!("{nodes}"));
    assert!(h100.contains("example.com/maintenance=fan:NoSchedule (DeviceTaintRule drain-gpu-7) (1)"), "{nodes}");
    let result = why(&server);
    assert_eq!(result["results"][0]["allocated"], false, "{result}");
    let reason = result["results"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("example.com/maintenance=fan:NoSchedule"), "{reason}");
}

/// A claim naming a class the cluster lacks: `why` says the cluster has no
/// such class and how to fix that there, not to pass a file with `-f`
/// (which `why` does not take).
#[test]
fn why_says_the_cluster_lacks_a_class_not_to_pass_a_file() {
    let server = cluster();
    server.create(&pending_claim("on-tpu", "tpu.example.com", 1, None)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = kubectl_gpu_in(&server, dir.path(), &["why", "on-tpu"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("the cluster has no DeviceClass \"tpu.example.com\""), "{text}");
    assert!(text.contains("fix: correct deviceClassName, or create the DeviceClass in the cluster"), "{text}");
    assert!(!text.contains("-f"), "{text}");
}

/// `fit` cannot read the driver's feature gates from the cluster, so it
/// judges a claim's opaque config with all of them on; it says so, since
/// the webhook may deny the config where its gate is off.
#[test]
fn fit_says_it_assumed_the_drivers_gates_for_an_opaque_config() {
    let server = cluster();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mps.yaml");
    std::fs::write(
        &file,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: mps-one}\n\
         spec:\n  devices:\n    requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]\n\
         \x20   config:\n    - opaque:\n        driver: gpu.nvidia.com\n        parameters:\n\
         \x20         apiVersion: resource.nvidia.com/v1beta1\n          kind: GpuConfig\n\
         \x20         sharing: {strategy: MPS}\n",
    )
    .unwrap();
    let out = kubectl_gpu_in(&server, dir.path(), &["fit", "-f", file.to_str().unwrap()]);
    stdout_ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "Warning: ResourceClaim mps-one carries a gpu.nvidia.com config: fit judged it with every feature gate"
        ),
        "{stderr}"
    );
    let plain = dir.path().join("plain.yaml");
    std::fs::write(
        &plain,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: plain}\n\
         spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n",
    )
    .unwrap();
    let out = kubectl_gpu_in(&server, dir.path(), &["fit", "-f", plain.to_str().unwrap()]);
    stdout_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}
