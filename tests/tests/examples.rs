//! Every file in `examples/` is exercised: the claims, the shares, the demo's workload
//! and each fleet through `simulate` here (each fleet's inventories are
//! files of `examples/inventories/`, which `print_slices.rs` checks one by
//! one, and the demo runs the workload for real in `demo.rs`). Directories
//! are read whole, so a new example is exercised without a new test.

use std::path::PathBuf;

use integration_tests::{controller, run, stdout_ok, workspace_root};
use serde_json::Value;

fn files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(workspace_root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json"))
        .collect();
    files.sort();
    files
}

/// The claims and the demo workload on every example fleet: every input is
/// understood (exit 0) and every claim gets an answer, an allocation or a
/// reason.
#[test]
fn every_example_claim_and_workload_simulates_on_every_example_fleet() {
    let root = workspace_root();
    let fleets = files("examples/fleets");
    assert!(!fleets.is_empty());
    // The demo's workload is a separate cluster's (its pod names overlap
    // the claims'), so it is simulated on its own.
    for workload in ["examples/claims", "examples/demo", "examples/sharing"] {
        for fleet in &fleets {
            let out = simulate(fleet, &[root.join("deviceclasses"), root.join(workload)]);
            let results = out["results"].as_array().unwrap();
            let inputs = files(workload).len();
            assert!(
                results.len() >= inputs,
                "{workload} on {}: {} results for {inputs} files",
                fleet.display(),
                results.len()
            );
            for result in results {
                let answered = result["allocated"] == true || result["reason"].as_str().is_some_and(|r| !r.is_empty());
                assert!(answered, "{workload} on {}: no allocation and no reason: {result}", fleet.display());
            }
        }
    }
}

fn simulate(fleet: &std::path::Path, inputs: &[PathBuf]) -> Value {
    let mut args =
        vec!["simulate".to_string(), "-o".into(), "json".into(), "--fleet".into(), fleet.display().to_string()];
    for input in inputs {
        args.extend(["-f".to_string(), input.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    serde_json::from_str(&stdout_ok(&run(controller(), &args, None))).unwrap()
}

/// Every example inventory loads in the plugin (`print_slices.rs` checks
/// what each publishes).
#[test]
fn every_example_inventory_loads() {
    for inventory in files("examples/inventories") {
        let path = inventory.display().to_string();
        let out = run(
            integration_tests::kubelet_plugin(),
            &["print-slices", "--node-name", "n", "--fake-inventory", &path],
            None,
        );
        assert!(stdout_ok(&out).contains("ResourceSlice"), "{path}");
    }
}

/// Every pod (or workload's pod template) in `examples/` that declares
/// `resourceClaims` has a container that uses each of them
/// (`resources.claims`): a pod whose containers use none gets no device
/// (the kubelet hands a claim's CDI devices only to the containers naming
/// it). The demo's pods once lacked it.
#[test]
fn every_example_pod_uses_its_claims_from_a_container() {
    fn pod_specs(v: &Value, out: &mut Vec<Value>) {
        match v {
            Value::Object(map) => {
                if map.contains_key("containers") && map.contains_key("resourceClaims") {
                    out.push(v.clone());
                }
                map.values().for_each(|child| pod_specs(child, out));
            }
            Value::Array(items) => items.iter().for_each(|child| pod_specs(child, out)),
            _ => {}
        }
    }
    let mut checked = 0;
    for dir in
        ["examples/claims", "examples/demo", "examples/sharing", "examples/dynamic-mig", "examples/compute-domain"]
    {
        for file in files(dir) {
            let text = std::fs::read_to_string(&file).unwrap();
            for doc in serde_yaml_ng::Deserializer::from_str(&text) {
                let v: Value = serde::Deserialize::deserialize(doc).unwrap();
                let mut specs = Vec::new();
                pod_specs(&v, &mut specs);
                for spec in specs {
                    let used: Vec<String> = spec["containers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .chain(spec["initContainers"].as_array().into_iter().flatten())
                        .flat_map(|c| c["resources"]["claims"].as_array().cloned().unwrap_or_default())
                        .filter_map(|c| c["name"].as_str().map(str::to_owned))
                        .collect();
                    for claim in spec["resourceClaims"].as_array().into_iter().flatten() {
                        let name = claim["name"].as_str().unwrap_or_default();
                        assert!(
                            used.iter().any(|u| u == name),
                            "{}: no container uses the claim {name:?}",
                            file.display()
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked >= 4, "the demo's four pods at least: {checked}");
}
