//! `simulate` explaining a selector that matches no device: clause by
//! clause, with the values the fleet has and what to write instead.

use integration_tests::{controller, run, workspace_root};
use serde_json::Value;

fn reason_for(claim_yaml: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let claim = dir.path().join("claim.yaml");
    std::fs::write(&claim, claim_yaml).unwrap();
    let root = workspace_root();
    let classes = root.join("deviceclasses");
    let fleet = root.join("examples/fleets/mixed.yaml");
    let out = run(
        controller(),
        &[
            "simulate",
            "-f",
            classes.to_str().unwrap(),
            "-f",
            claim.to_str().unwrap(),
            "--fleet",
            fleet.to_str().unwrap(),
            "-o",
            "json",
        ],
        None,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &v["results"][0];
    r["reason"].as_str().or(r["error"].as_str()).unwrap_or_default().to_string()
}

fn claim(selector: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: c, namespace: default}}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly:\n        deviceClassName: gpu.nvidia.com\n        selectors:\n        - cel:\n            expression: '{selector}'\n"
    )
}

/// The seeds' own example: `productName == "H100"` (ours say "NVIDIA H100
/// 80GB HBM3") and `memory` read as an attribute (it is a capacity).
#[test]
fn the_seeds_example_names_both_problems() {
    let reason = reason_for(&claim(
        r#"device.attributes["gpu.nvidia.com"].productName == "H100" && device.attributes["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))"#,
    ));
    assert!(reason.contains("selector #0 matches 0 (clause 1 `device.attributes[\"gpu.nvidia.com\"].productName == \"H100\"` is true for 0 of 28"), "{reason}");
    assert!(
        reason.contains("no device has productName \"H100\"; the values here are \"NVIDIA H100 80GB HBM3\""),
        "{reason}"
    );
    assert!(
        reason.contains("\"memory\" is a capacity, not an attribute: write device.capacity[\"gpu.nvidia.com\"].memory"),
        "{reason}"
    );
}

#[test]
fn a_typo_gets_a_did_you_mean() {
    let reason = reason_for(&claim(r#"device.attributes["gpu.nvidia.com"].architecure == "Hopper""#));
    // A missing attribute is a CEL runtime error in Kubernetes too; the
    // error says what was meant.
    assert!(reason.contains(r#"No such key: architecure; did you mean "architecture"?"#), "{reason}");
}
