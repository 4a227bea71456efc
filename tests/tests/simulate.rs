//! `gpu-dra-controller simulate` as a user runs it: on the shipped
//! examples (the seeds' claims on a mixed fleet) and on malformed input
//! (one `error:` line naming file and object, exit 1, never a panic).

use std::path::Path;
use std::process::Output;

use integration_tests::{controller, run, simulate_shipped, stdout_ok, workspace_root};
use serde_json::Value;

fn simulate(args: &[&str]) -> Output {
    let mut all = vec!["simulate"];
    all.extend_from_slice(args);
    run(controller(), &all, None)
}

fn examples(format: &str) -> Output {
    simulate_shipped("examples/claims", "examples/fleets/mixed.yaml", format)
}

fn by_name(results: &[Value], name: &str) -> Value {
    results.iter().find(|r| r["name"] == name).cloned().unwrap_or_else(|| panic!("no result for {name}"))
}

fn devices(entry: &Value) -> Vec<(String, String)> {
    entry["allocation"]["devices"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["request"].as_str().unwrap().to_string(), r["device"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn the_examples_allocate_the_seeds_claims_and_explain_the_rest() {
    let out = examples("json");
    let doc: Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    let results = doc["results"].as_array().unwrap();
    let names: Vec<&str> = results.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "h100-large-memory",
            "prefer-h100",
            "prefer-h200",
            "a30-nvlink-pair",
            "tiny-llm-mig",
            "shared-gpu",
            "trainer-gpus",
            "new-driver",
            "eight-b200",
            "a30-four"
        ]
    );

    let h100 = by_name(results, "h100-large-memory");
    assert_eq!((h100["allocated"].as_bool(), h100["node"].as_str()), (Some(true), Some("dgx-h100-a")));
    assert_eq!(h100["reason"], Value::Null);

    // firstAvailable: the H100 alternative where there is one, else the A100.
    assert_eq!(devices(&by_name(results, "prefer-h100"))[0].0, "gpu/h100");
    let h200 = by_name(results, "prefer-h200");
    assert_eq!((devices(&h200)[0].0.as_str(), h200["node"].as_str()), ("gpu/a100", Some("hgx-a100-mig")));

    // Two A30s of one NVLink pair.
    let pair = by_name(results, "a30-nvlink-pair");
    assert_eq!(pair["node"], "pcie-a30");
    let pair_devices: Vec<String> = devices(&pair).into_iter().map(|(_, d)| d).collect();
    assert!(pair_devices == ["gpu-0", "gpu-1"] || pair_devices == ["gpu-2", "gpu-3"], "{pair_devices:?}");

    // The MIG claim was generated for the pod, in its namespace.
    let mig = by_name(results, "tiny-llm-mig");
    assert_eq!(mig["namespace"], "inference");
    assert!(devices(&mig)[0].1.contains("-mig-1g"), "{mig}");

    // The shared claim appears once, allocated.
    assert_eq!(results.iter().filter(|r| r["name"] == "shared-gpu").count(), 1);
    assert_eq!(by_name(results, "shared-gpu")["allocated"], true);

    // All H100s of a node: the first node whose H100s are all free.
    let trainer = by_name(results, "trainer-gpus");
    assert_eq!((trainer["node"].as_str(), devices(&trainer).len()), (Some("dgx-h100-b"), 8));

    // The driver floor excludes the A100 (570) and A30 (550) nodes.
    let floor = by_name(results, "new-driver");
    assert!(floor["node"].as_str().unwrap().starts_with("dgx-h100"), "{floor}");

    for name in ["eight-b200", "a30-four"] {
        let r = by_name(results, name);
        assert_eq!(
            (r["allocated"].as_bool(), r["error"].as_bool(), r["node"].as_str()),
            (Some(false), Some(false), None)
        );
        assert_eq!(r["allocation"], Value::Null);
        let reason = r["reason"].as_str().unwrap();
        assert!(reason.starts_with(&format!("claim default/{name} cannot be allocated on any of 6 nodes")), "{reason}");
        assert!(reason.contains("request gpus wants"), "{reason}");
        assert!(reason.contains("selector #0 matches 4"), "{reason}");
    }
    assert!(by_name(results, "a30-four")["reason"].as_str().unwrap().contains("allocated to default/a30-nvlink-pair"));
}

#[test]
fn the_table_is_for_people() {
    let text = stdout_ok(&examples("table"));
    let lines: Vec<&str> = text.lines().collect();
    let header = lines[0];
    for column in ["NAMESPACE/NAME", "NODE", "DEVICES", "REASON"] {
        assert!(header.contains(column), "{header}");
    }
    let devices_at = header.find("DEVICES").unwrap();
    let trainer = lines.iter().find(|l| l.starts_with("default/trainer-gpus")).unwrap();
    assert_eq!(trainer.get(devices_at..devices_at + 10), Some("gpus=gpu-0"), "{text}");
    assert!(text.trim_end().ends_with("8 of 10 claims allocated"), "{text}");
}

#[test]
fn yaml_output_matches_json() {
    let json: Value = serde_json::from_str(&stdout_ok(&examples("json"))).unwrap();
    let yaml: Value = serde_yaml_ng::from_str(&stdout_ok(&examples("yaml"))).unwrap();
    assert_eq!(json, yaml);
}

/// Runs `simulate` on `yaml` (with the shipped classes and a one-node fleet)
/// and returns its single error line, checking exit code and output.
fn error_for(dir: &Path, yaml: &str) -> (String, String) {
    let file = dir.join("input.yaml");
    std::fs::write(&file, yaml).unwrap();
    let fleet = dir.join("fleet.yaml");
    std::fs::write(&fleet, "- name: n\n  inventory: {gpus: [{model: H100-80GB, count: 2}]}\n").unwrap();
    let classes = workspace_root().join("deviceclasses");
    let out =
        simulate(&["-f", classes.to_str().unwrap(), "-f", file.to_str().unwrap(), "--fleet", fleet.to_str().unwrap()]);
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout when failing");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    (lines[0].to_string(), file.display().to_string())
}

const CLAIM: &str = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\n\
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n";

#[test]
fn malformed_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let (line, file) = error_for(dir.path(), &format!("{CLAIM}---\nkind: [\n"));
    assert!(line.contains(&format!("{file}: document 2: malformed YAML")), "{line}");
}

#[test]
fn unknown_class() {
    let dir = tempfile::tempdir().unwrap();
    let (line, file) =
        error_for(dir.path(), &CLAIM.replace("deviceClassName: gpu.nvidia.com", "deviceClassName: tpu.example.com"));
    assert!(
        line.contains(&format!("{file}: ResourceClaim default/c: spec.devices.requests[0].exactly.deviceClassName")),
        "{line}"
    );
    assert!(line.contains("DeviceClass \"tpu.example.com\" is not among the inputs"), "{line}");
}

#[test]
fn invalid_claim_specs() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (CLAIM.replace("name: gpu,", "name: GPU_0,"), "spec.devices.requests[0].name: \"GPU_0\""),
        (
            CLAIM.replace("gpu.nvidia.com}", "gpu.nvidia.com, count: -1}"),
            "exactly.count: -1: must be greater than zero",
        ),
        (
            CLAIM.replace("gpu.nvidia.com}", "gpu.nvidia.com, allocationMode: Most}"),
            "exactly.allocationMode: Unsupported value: \"Most\"",
        ),
        (
            CLAIM.replace("gpu.nvidia.com}", "gpu.nvidia.com, allocationMode: All, count: 2}"),
            "must not be specified when allocationMode is 'All'",
        ),
    ];
    for (yaml, want) in cases {
        let (line, file) = error_for(dir.path(), &yaml);
        assert!(line.contains(&format!("{file}: ResourceClaim default/c: ")), "{line}");
        assert!(line.contains(want), "{want}: {line}");
    }
}

#[test]
fn missing_referenced_claim_or_template() {
    let dir = tempfile::tempdir().unwrap();
    let pod = |entry: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: ml}}\nspec: {{containers: [], resourceClaims: [{{name: g, {entry}}}]}}\n"
        )
    };
    let (line, file) = error_for(dir.path(), &pod("resourceClaimName: nope"));
    assert!(
        line.contains(&format!(
            "{file}: Pod ml/p: spec.resourceClaims[0]: ResourceClaim ml/nope is not among the inputs"
        )),
        "{line}"
    );
    let (line, _) = error_for(dir.path(), &pod("resourceClaimTemplateName: tpl"));
    assert!(
        line.contains("Pod ml/p: spec.resourceClaims[0]: ResourceClaimTemplate ml/tpl is not among the inputs"),
        "{line}"
    );
}

#[test]
fn unreadable_object_and_bad_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let (line, file) = error_for(
        dir.path(),
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec: {devices: 7}\n",
    );
    assert!(line.contains(&format!("{file}: ResourceClaim \"c\": cannot be read as resource.k8s.io/v1")), "{line}");

    let fleet = dir.path().join("bad-fleet.yaml");
    std::fs::write(
        &fleet,
        "- name: n\n  inventory: {gpus: [{model: H100-80GB, count: 2, mig: [{instances: [9g.99gb]}]}]}\n",
    )
    .unwrap();
    let classes = workspace_root().join("deviceclasses");
    let out = simulate(&["-f", classes.to_str().unwrap(), "--fleet", fleet.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("{}: nodes[0] (n): inventory: gpus[0].mig[0].instances[0]", fleet.display())),
        "{stderr}"
    );
}
