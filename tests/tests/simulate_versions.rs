//! `simulate` reads `resource.k8s.io/v1beta1` and `v1beta2` manifests as
//! the apiserver converts them: the shipped classes, claims and a fleet's
//! slices, rewritten in each older version, allocate exactly as in `v1`.

use std::path::{Path, PathBuf};

use integration_tests::{controller, kubelet_plugin, run, stdout_ok, workspace_root};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Every object of the YAML files under `dir` (or of one file).
fn objects(path: &Path) -> Vec<Value> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut f: Vec<PathBuf> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        f.sort();
        f
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap();
            if !v.is_null() {
                out.push(v);
            }
        }
    }
    out
}

/// The slices a node with this inventory publishes, as v1 objects.
fn slices(node: &str, inventory: &str) -> Vec<Value> {
    let file = workspace_root().join("examples/inventories").join(inventory);
    let out = run(
        kubelet_plugin(),
        &["print-slices", "--node-name", node, "--fake-inventory", file.to_str().unwrap(), "-o", "json"],
        None,
    );
    let list: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// The object as a `v1beta1` manifest: request fields inline, device
/// fields under `basic` (the inverse of the apiserver's conversion).
fn to_v1beta1(mut v: Value) -> Value {
    let requests = match v["kind"].as_str() {
        Some("ResourceClaim") => v.pointer_mut("/spec/devices/requests"),
        Some("ResourceClaimTemplate") => v.pointer_mut("/spec/spec/devices/requests"),
        _ => None,
    };
    for r in requests.and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(Value::Object(exactly)) = r.as_object_mut().and_then(|m| m.remove("exactly")) {
            r.as_object_mut().unwrap().extend(exactly);
        }
    }
    if v["kind"] == "ResourceSlice" {
        for d in v.pointer_mut("/spec/devices").and_then(Value::as_array_mut).into_iter().flatten() {
            let map = d.as_object_mut().unwrap();
            let name = map.remove("name").unwrap();
            let basic: Map<String, Value> = std::mem::take(map);
            *map = Map::from_iter([("name".to_string(), name), ("basic".to_string(), Value::Object(basic))]);
        }
    }
    with_version(v, "resource.k8s.io/v1beta1")
}

fn with_version(mut v: Value, version: &str) -> Value {
    if v["apiVersion"] == "resource.k8s.io/v1" {
        v["apiVersion"] = json!(version);
    }
    v
}

fn simulate(dir: &Path, objects: &[Value]) -> Value {
    let file = dir.join("all.json");
    std::fs::write(&file, serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": objects})).unwrap())
        .unwrap();
    let out = run(controller(), &["simulate", "-f", file.to_str().unwrap(), "-o", "json"], None);
    serde_json::from_str(&stdout_ok(&out)).unwrap()
}

#[test]
fn older_versions_allocate_as_v1() {
    let root = workspace_root();
    let mut v1 = objects(&root.join("deviceclasses"));
    v1.extend(objects(&root.join("examples/claims")));
    v1.extend(slices("node-a", "dgx-h100.yaml"));
    v1.extend(slices("node-b", "a100-mig.yaml"));
    v1.extend(slices("node-c", "pcie-nvlink-pairs.yaml"));
    let dir = tempfile::tempdir().unwrap();
    let expected = simulate(dir.path(), &v1);
    let allocated = expected["results"].as_array().unwrap().iter().filter(|r| r["allocated"] == true).count();
    assert!(allocated >= 6, "the examples allocate on this fleet: {expected}");

    let beta1: Vec<Value> = v1.iter().cloned().map(to_v1beta1).collect();
    assert!(beta1.iter().any(|o| o["spec"]["devices"][0]["basic"].is_object()), "slices really are v1beta1");
    assert_eq!(simulate(dir.path(), &beta1), expected, "v1beta1");
    let beta2: Vec<Value> = v1.iter().cloned().map(|o| with_version(o, "resource.k8s.io/v1beta2")).collect();
    assert_eq!(simulate(dir.path(), &beta2), expected, "v1beta2");
}
