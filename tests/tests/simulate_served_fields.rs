//! `simulate --kubernetes-version` models what that release's API server
//! serves with its default gates (or `--cluster-feature-gates`): a field
//! whose gate is off is dropped from every slice, as the server drops it
//! (`dropDisabledFields` in the ResourceSlice strategy), and the plugins'
//! answer to that (a faulty GPU withheld where taints are not served) is
//! simulated too. Before, 1.34 "with its default gates" put NVIDIA's four
//! replicas on one GPU, which a stock 1.34 cluster never does.

use std::process::Output;

use integration_tests::{controller, run, workspace_root};

fn simulate(args: &[&str]) -> (Output, String, String) {
    let root = workspace_root();
    let classes = root.join("deviceclasses");
    let mut all = vec!["simulate", "-f", classes.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run(controller(), &all, None);
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    (out, stdout, stderr)
}

fn four_replicas(extra: &[&str]) -> (String, String) {
    let root = workspace_root();
    let example = root.join("examples/sharing/nvidia-integer-sharing.yaml");
    let fleet = root.join("examples/fleets/consumable-shares.yaml");
    let mut args = vec!["-f", example.to_str().unwrap(), "--fleet", fleet.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (out, stdout, stderr) = simulate(&args);
    assert!(out.status.success(), "{stderr}");
    (stdout, stderr)
}

#[test]
fn stock_1_34_gives_each_replica_a_gpu_of_its_own() {
    let (stdout, stderr) = four_replicas(&["--kubernetes-version", "1.34"]);
    assert!(stdout.contains("1 of 4 claims allocated"), "{stdout}");
    assert!(stdout.contains("it is allocated to gpu-share-integer/"), "{stdout}");
    let notes: Vec<&str> = stderr.lines().filter(|l| l.starts_with("note:")).collect();
    assert_eq!(notes.len(), 1, "one note for the gate: {stderr}");
    assert!(notes[0].contains("allowMultipleAllocations, requestPolicy (DRAConsumableCapacity off)"), "{stderr}");
    assert!(notes[0].contains("--cluster-feature-gates DRAConsumableCapacity=true"), "{stderr}");
}

#[test]
fn the_cluster_gates_or_a_newer_release_share_the_gpu() {
    for args in [&["--kubernetes-version", "1.34", "--cluster-feature-gates", "DRAConsumableCapacity=true"][..], &[]] {
        let (stdout, stderr) = four_replicas(args);
        assert!(stdout.contains("4 of 4 claims allocated"), "{args:?}: {stdout}");
        assert!(!stderr.contains("note: this release"), "{args:?}: {stderr}");
    }
}

/// A fleet file in `dir` of one node `node` with the example inventory
/// `inventory`.
fn one_node_fleet(dir: &std::path::Path, node: &str, inventory: &str) -> std::path::PathBuf {
    let inventory = workspace_root().join("examples/inventories").join(inventory);
    let fleet = dir.join("fleet.yaml");
    std::fs::write(&fleet, format!("nodes:\n  - name: {node}\n    inventory: {}\n", inventory.display())).unwrap();
    fleet
}

#[test]
fn a_faulty_gpu_is_never_given_on_stock_1_34() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = one_node_fleet(dir.path(), "faulty", "faulty-node.yaml");
    let claims = dir.path().join("claims.yaml");
    let claim = |name: &str, count: u32| {
        format!(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: default}}\n\
             spec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}\n"
        )
    };
    std::fs::write(&claims, [claim("two", 2), claim("one", 1)].join("---\n")).unwrap();
    let args = ["-f", claims.to_str().unwrap(), "--fleet", fleet.to_str().unwrap(), "-o", "json"];
    for version in ["1.34", "1.37"] {
        let (out, stdout, stderr) = simulate(&[&args[..], &["--kubernetes-version", version]].concat());
        assert!(out.status.success(), "{stderr}");
        let results: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let given: Vec<String> = results["results"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["allocation"]["devices"]["results"].as_array().cloned().unwrap_or_default())
            .map(|d| d["device"].as_str().unwrap().to_owned())
            .collect();
        // GPU 0 is in MIG mode, GPU 2 fell off the bus (XID 79), GPU 3 is
        // lost: of the whole GPUs only GPU 1 may be given, on 1.34 (faulty
        // ones withheld) as on 1.37 (faulty ones tainted).
        assert_eq!(given, ["gpu-1"], "{version}: {stdout}");
        assert_eq!(stderr.contains("drops the ResourceSlice field taints"), version == "1.34", "{version}: {stderr}");
    }
}

/// A DeviceTaintRule among the manifests (after the slices it names, as
/// files come) keeps a claim off the device it taints.
#[test]
fn a_device_taint_rule_in_the_input_taints_what_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = one_node_fleet(dir.path(), "dgx", "dgx-h100.yaml");
    let objects = dir.path().join("objects.yaml");
    std::fs::write(
        &objects,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: eight, namespace: default}\n\
         spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 8}}]}}\n---\n\
         apiVersion: resource.k8s.io/v1\nkind: DeviceTaintRule\nmetadata: {name: drain-gpu-3}\n\
         spec: {deviceSelector: {pool: dgx, device: gpu-3}, taint: {key: example.com/maintenance, effect: NoSchedule}}\n",
    )
    .unwrap();
    let (out, stdout, stderr) =
        simulate(&["-f", objects.to_str().unwrap(), "--fleet", fleet.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{stderr}");
    let results: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(results["results"][0]["allocated"], false, "{results}");
    let reason = results["results"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("example.com/maintenance:NoSchedule"), "{reason}");
}
