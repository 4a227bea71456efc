//! `simulate` with fractional GPUs: the shipped fleet whose plugins run
//! with ConsumableCapacity and the shipped memory-share claims. Several
//! shares land on one H100, each with its own share ID and what it
//! consumes; the one that would exceed the GPU is refused with a reason
//! naming the memory it asked for and what is left.

use integration_tests::{controller, run, simulate_shipped, stdout_ok, workspace_root};
use serde_json::{Value, json};

fn simulate(format: &str) -> String {
    stdout_ok(&simulate_shipped("examples/sharing/memory-shares.yaml", "examples/fleets/fractional.yaml", format))
}

#[test]
fn memory_shares_fill_one_h100_and_the_one_too_many_is_refused() {
    let doc: Value = serde_json::from_str(&simulate("json")).unwrap();
    let results = doc["results"].as_array().unwrap();
    let names: Vec<&str> = results.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["llm-a", "llm-b", "llm-c", "llm-too-big", "embedder"]);

    let mut share_ids = Vec::new();
    for (name, consumed) in [
        ("llm-a", json!({"memory": "20Gi", "smPercent": "0"})),
        ("llm-b", json!({"memory": "20Gi", "smPercent": "0"})),
        ("llm-c", json!({"memory": "20Gi", "smPercent": "50"})),
        // 9500Mi rounds up to the 1Gi step.
        ("embedder", json!({"memory": "10Gi", "smPercent": "30"})),
    ] {
        let r = results.iter().find(|r| r["name"] == name).unwrap();
        assert_eq!((r["allocated"].as_bool(), r["node"].as_str()), (Some(true), Some("h100-shared")), "{r}");
        let device = &r["allocation"]["devices"]["results"][0];
        assert_eq!(device["device"], "gpu-0", "{name}: one H100 for all");
        assert_eq!(device["consumedCapacity"], consumed, "{name}");
        share_ids.push(device["shareID"].as_str().unwrap().to_string());
    }
    share_ids.sort();
    share_ids.dedup();
    assert_eq!(share_ids.len(), 4, "each share has its own ID");

    let refused = results.iter().find(|r| r["name"] == "llm-too-big").unwrap();
    assert_eq!((refused["allocated"].as_bool(), refused["error"].as_bool()), (Some(false), Some(false)));
    let reason = refused["reason"].as_str().unwrap();
    assert!(
        reason.contains(
            "1 device without enough capacity left: gpu.nvidia.com/h100-shared/gpu-0 (memory: 30Gi requested, 20Gi of 80Gi left)"
        ),
        "{reason}"
    );
}

#[test]
fn the_table_shows_each_share() {
    let text = simulate("table");
    let row = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {text}"));
    assert!(row("default/llm-c ").contains("gpu=gpu-0[memory=20Gi,smPercent=50]"), "{text}");
    assert!(row("default/llm-a ").contains("gpu=gpu-0[memory=20Gi] "), "zero amounts are left out: {text}");
    assert!(text.trim_end().ends_with("4 of 5 claims allocated"), "{text}");
}

/// Without the gate the same claims get dedicated GPUs: the fleet's
/// `featureGates` is what makes the H100 shareable.
#[test]
fn without_the_gate_one_claim_takes_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    let text = std::fs::read_to_string(workspace_root().join("examples/fleets/fractional.yaml")).unwrap();
    std::fs::write(&fleet, text.replace("featureGates: ConsumableCapacity=true,MPSSupport=true", "featureGates: ''"))
        .unwrap();
    let root = workspace_root();
    let args = [
        "simulate",
        "-f",
        root.join("deviceclasses").to_str().unwrap(),
        "-f",
        root.join("examples/sharing").to_str().unwrap(),
        "--fleet",
        fleet.to_str().unwrap(),
        "-o",
        "json",
    ]
    .map(str::to_owned);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let doc: Value = serde_json::from_str(&stdout_ok(&run(controller(), &args, None))).unwrap();
    let allocated: Vec<&str> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["allocated"] == true)
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(allocated, ["llm-a"]);
}
