//! `simulate` with list-typed attributes (Kubernetes' DRAListTypeAttributes,
//! alpha in 1.36 and 1.37): a fleet whose plugin has the driver's gate of
//! that name publishes `resource.kubernetes.io/numaNode` as a list, claims
//! co-place GPUs on a NUMA node with `matchAttribute` over it and select by
//! a comprehension over it; raw slices with string lists reproduce two of
//! Kubernetes' own allocator cases (`allocator_testing.go`, v0.37.2).

use std::path::Path;

use integration_tests::{controller, run, stdout_ok, workspace_root};
use serde_json::{Value, json};

/// A node of four GPUs: gpu-0 and gpu-1 on NUMA node 0, gpu-2 and gpu-3 on 1.
fn fleet(gates: &str) -> String {
    format!(
        "featureGates: {gates}\nnodes:\n  - name: numa-node\n    inventory:\n      driverVersion: \"580.82.07\"\n      \
         cudaDriverVersion: \"13.0\"\n      gpus:\n        - model: H100-80GB\n          count: 4\n"
    )
}

fn claim(name: &str, count: i64, selector: Option<&str>, constraint: Option<Value>) -> Value {
    let mut exactly = json!({"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count});
    if let Some(s) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": s}}]);
    }
    let mut devices = json!({"requests": [{"name": "gpus", "exactly": exactly}]});
    if let Some(c) = constraint {
        devices["constraints"] = json!([c]);
    }
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name, "namespace": "default"}, "spec": {"devices": devices}})
}

fn simulate(dir: &Path, objects: &[Value], extra: &[&str]) -> Value {
    let file = dir.join("objects.json");
    std::fs::write(&file, serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": objects})).unwrap())
        .unwrap();
    let class = workspace_root().join("deviceclasses/gpu.nvidia.com.yaml");
    let mut args = vec!["simulate", "-f", class.to_str().unwrap(), "-f", file.to_str().unwrap(), "-o", "json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&stdout_ok(&run(controller(), &args, None))).unwrap()
}

/// name → (allocated, devices, error, reason).
fn outcome(results: &Value, name: &str) -> (bool, Vec<String>, bool, String) {
    let r = results["results"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap();
    let devices = r["allocation"]["devices"]["results"]
        .as_array()
        .map(|rs| rs.iter().map(|d| d["device"].as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    (r["allocated"] == true, devices, r["error"] == true, r["reason"].as_str().unwrap_or_default().to_string())
}

fn numa_claims() -> Vec<Value> {
    let same_numa = json!({"matchAttribute": "resource.kubernetes.io/numaNode"});
    vec![
        claim("three-on-one-numa", 3, None, Some(same_numa.clone())),
        claim("pair-on-one-numa", 2, None, Some(same_numa)),
        claim("on-numa-1", 1, Some(r#"device.attributes["resource.kubernetes.io"].numaNode.exists(n, n == 1)"#), None),
    ]
}

#[test]
fn numa_node_lists_co_place_and_select_with_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let fleet_file = dir.path().join("fleet.yaml");
    std::fs::write(&fleet_file, fleet("DRAListTypeAttributes=true")).unwrap();
    let results = simulate(dir.path(), &numa_claims(), &["--fleet", fleet_file.to_str().unwrap()]);
    let (ok, _, error, _) = outcome(&results, "three-on-one-numa");
    assert!(!ok && !error, "no NUMA node has three GPUs: {results}");
    assert_eq!(outcome(&results, "pair-on-one-numa").1, ["gpu-0", "gpu-1"], "{results}");
    assert_eq!(outcome(&results, "on-numa-1").1, ["gpu-2"], "{results}");
}

/// Without the gate numaNode is a scalar: `matchAttribute` still works,
/// and a selector ranging over it is a runtime error on every device (an
/// int is not iterable), reported, never a silent "no match".
#[test]
fn without_the_gate_numa_node_is_a_scalar() {
    let dir = tempfile::tempdir().unwrap();
    let fleet_file = dir.path().join("fleet.yaml");
    std::fs::write(&fleet_file, fleet("DynamicMIG=false")).unwrap();
    let results = simulate(dir.path(), &numa_claims(), &["--fleet", fleet_file.to_str().unwrap()]);
    assert_eq!(outcome(&results, "pair-on-one-numa").1, ["gpu-0", "gpu-1"], "{results}");
    let (ok, _, error, reason) = outcome(&results, "on-numa-1");
    assert!(!ok && error, "{results}");
    assert!(reason.contains("iterable"), "{reason}");
}

/// Raw slices of string lists, as upstream's cases publish them.
fn list_slice(devices: &[(&str, &[&str])]) -> Value {
    let devices: Vec<Value> = devices
        .iter()
        .map(|(name, values)| {
            json!({"name": name, "attributes": {"type": {"string": "gpu"}, "stringAttribute": {"strings": values}}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "list-node-slice"},
           "spec": {"driver": "gpu.nvidia.com", "nodeName": "list-node",
                    "pool": {"name": "list-node", "generation": 1, "resourceSliceCount": 1}, "devices": devices}})
}

/// "list-attributes-match-constraint-backtrack-needs-intersection-restore":
/// the first pick narrows the common values, a dead end restores them.
#[test]
fn match_attribute_intersects_lists_as_kubernetes_does() {
    let slice = list_slice(&[
        ("device-1", &["value1", "value2"]),
        ("device-2", &["value1"]),
        ("device-3", &["value2"]),
        ("device-4", &["value2"]),
    ]);
    let claim = claim("three", 3, None, Some(json!({"matchAttribute": "gpu.nvidia.com/stringAttribute"})));
    let dir = tempfile::tempdir().unwrap();
    let gated =
        simulate(dir.path(), &[slice.clone(), claim.clone()], &["--feature-gates", "DRAListTypeAttributes=true"]);
    assert_eq!(outcome(&gated, "three").1, ["device-1", "device-3", "device-4"], "{gated}");
    // Gate off: a list matches nothing after the first device.
    let off = simulate(dir.path(), &[slice, claim], &[]);
    let (ok, _, error, _) = outcome(&off, "three");
    assert!(!ok && !error, "{off}");
}

/// "list-attributes-distinct-constraint-backtrack-needs-remove": pairwise
/// disjoint lists across three requests.
#[test]
fn distinct_attribute_wants_disjoint_lists() {
    let slice = list_slice(&[
        ("device-1", &["value1", "value2", "value3"]),
        ("device-2", &["value3", "value4", "value5"]),
        ("device-3", &["value1", "value2"]),
        ("device-4", &["value3", "value4"]),
        ("device-0", &["value5", "value6"]),
    ]);
    let request = |name: &str| json!({"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}});
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "spread", "namespace": "default"},
        "spec": {"devices": {"requests": [request("req-0"), request("req-1"), request("req-2")],
                 "constraints": [{"requests": ["req-0", "req-1", "req-2"], "distinctAttribute": "gpu.nvidia.com/stringAttribute"}]}}});
    let dir = tempfile::tempdir().unwrap();
    let results = simulate(dir.path(), &[slice, claim], &["--feature-gates", "DRAListTypeAttributes=true"]);
    assert_eq!(outcome(&results, "spread").1, ["device-3", "device-4", "device-0"], "{results}");
}
