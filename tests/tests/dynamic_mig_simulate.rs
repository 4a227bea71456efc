//! `gpu-dra-controller simulate` on the dynamic MIG examples: the fleet's
//! slices come from the plugin's slice builder with `DynamicMIG`, so the
//! allocator sees the devices and counters the plugin publishes.

use gpu_dra_driver::inventory::dynamic_mig::{ParsedDeviceName, parse_device_name};
use integration_tests::{controller, run, stdout_ok, workspace_root};
use serde_json::Value;

fn simulate() -> Value {
    let root = workspace_root();
    let out = run(
        controller(),
        &[
            "simulate",
            "-f",
            root.join("deviceclasses").to_str().unwrap(),
            "-f",
            root.join("examples/dynamic-mig/claims.yaml").to_str().unwrap(),
            "--fleet",
            root.join("examples/dynamic-mig/fleet.yaml").to_str().unwrap(),
            "-o",
            "json",
        ],
        None,
    );
    serde_json::from_str(&stdout_ok(&out)).unwrap()
}

fn result<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["results"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no {name}"))
}

fn devices(entry: &Value) -> Vec<(String, String)> {
    entry["allocation"]["devices"]["results"]
        .as_array()
        .unwrap_or_else(|| panic!("not allocated: {entry}"))
        .iter()
        .map(|r| (r["request"].as_str().unwrap().to_string(), r["device"].as_str().unwrap().to_string()))
        .collect()
}

/// (GPU minor, profile label, placement start) of a dynamic MIG device.
fn mig(name: &str) -> (u32, String, u32) {
    match parse_device_name(name) {
        Some(ParsedDeviceName::Mig { parent_minor, profile_label, placement_start, .. }) => {
            (parent_minor, profile_label, placement_start)
        }
        other => panic!("{name} is not a MIG device name: {other:?}"),
    }
}

#[test]
fn dynamic_mig_claims_get_profiles_at_placements_that_fit_together() {
    let doc = simulate();

    // 4g + 2g + 1g on one GPU (matchAttribute parentUUID), placements disjoint.
    let three = devices(result(&doc, "four-two-one"));
    let parts: Vec<_> = three.iter().map(|(_, d)| mig(d)).collect();
    assert!(parts.iter().all(|p| p.0 == parts[0].0), "one GPU: {three:?}");
    let labels: Vec<&str> = parts.iter().map(|p| p.1.as_str()).collect();
    assert_eq!(labels, ["4g40gb", "2g20gb", "1g10gb"]);
    // Memory slices [start, start + size): 4g takes 4, 2g 2, 1g 1.
    let spans: Vec<(u32, u32)> = parts.iter().zip([4, 2, 1]).map(|(p, size)| (p.2, p.2 + size)).collect();
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            assert!(a.1 <= b.0 || b.1 <= a.0, "overlapping placements {three:?}");
        }
    }

    // 7g on the A100 takes it whole; a 1g on it afterwards is refused,
    // naming the counter the 7g used up.
    let seven = result(&doc, "a100-7g");
    assert_eq!(seven["node"], "a100-dynamic");
    assert_eq!(devices(seven), [("mig".to_string(), "gpu-0-mig-7g40gb-0-0".to_string())]);
    let refused = result(&doc, "a100-1g-after-7g");
    assert_eq!(refused["allocated"], false);
    let reason = refused["reason"].as_str().unwrap();
    assert!(reason.contains("7 devices blocked by shared counters"), "{reason}");
    assert!(reason.contains("(gpu-0-counter-set/") && reason.contains(" used up)"), "{reason}");

    // A profile by name, by memory (the smallest with 16 GiB), "2g or bigger"
    // (the smallest such), and a whole H100 (MIG mode switchable).
    assert_eq!(mig(&devices(result(&doc, "by-profile"))[0].1).1, "3g40gb");
    assert_eq!(mig(&devices(result(&doc, "by-memory"))[0].1).1, "1g20gb");
    assert_eq!(mig(&devices(result(&doc, "two-g-or-bigger"))[0].1).1, "2g20gb");
    let whole = devices(result(&doc, "whole-h100"));
    assert!(matches!(parse_device_name(&whole[0].1), Some(ParsedDeviceName::WholeGpu { .. })), "{whole:?}");
}
