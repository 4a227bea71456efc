//! `kubectl gpu` against the API server stand-in: slices built by the
//! plugin's slice builder from the example inventories, the shipped
//! DeviceClasses, claims allocated and pending. `why` must say what
//! `gpu-dra-controller simulate` says for the same objects.

use std::path::Path;

use gpu_dra_driver::inventory::fake;
use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_dra_driver::slices::SliceBuilder;
use integration_tests::apiserver::ApiServer;
use integration_tests::{controller, kubectl_gpu, run, stdout_ok, workspace_root};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
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

fn claim(name: &str, class: &str, count: u32, selector: Option<&str>) -> ResourceClaim {
    let mut exactly = json!({"deviceClassName": class, "count": count});
    if let Some(cel) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": cel}}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    }))
    .unwrap()
}

/// A claim holding `devices` of `node`, reserved for pod `pod`.
fn allocated(name: &str, node: &str, devices: &[&str], pod: &str) -> ResourceClaim {
    let mut c = claim(name, "gpu.nvidia.com", u32::try_from(devices.len()).unwrap(), None);
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
        .create(&claim(
            "two-h100",
            "gpu.nvidia.com",
            2,
            Some(r#"device.attributes["gpu.nvidia.com"].productName.contains("H100")"#),
        ))
        .unwrap();
    server
        .create(&claim(
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
    let text = stdout_ok(&kubectl_gpu_in(&server, dir.path(), &["claims", "-A"]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].starts_with("NAMESPACE   NAME       STATE       PODS            NODE     DEVICES"), "{text}");
    assert!(
        lines[1].starts_with("default     trainer    allocated   pod/trainer-0   node-b   gpu=gpu-0,gpu-1,"),
        "{text}"
    );
    assert!(lines[1].ends_with("   -"), "utilization unknown: {text}");
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
