//! In-process tests of the whole `simulate` path on small fleets. Classes
//! use plain equality selectors only.

use std::path::PathBuf;

use super::*;

const CLASS: &str = "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: gpu.nvidia.com}\n\
spec: {selectors: [{cel: {expression: 'device.driver == \"gpu.nvidia.com\"'}}]}\n";

/// Two nodes with `gpus` H100s each, named so that `a-node` is tried first.
fn fleet(gpus: u32) -> String {
    format!(
        "nodes:\n- name: b-node\n  labels: {{zone: b}}\n  inventory: {{gpus: [{{model: H100-80GB, count: {gpus}}}]}}\n\
         - name: a-node\n  labels: {{zone: a}}\n  inventory: {{gpus: [{{model: H100-80GB, count: {gpus}}}]}}\n"
    )
}

fn claim(name: &str, count: u32) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}}}\n\
         spec: {{devices: {{requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}}}]}}}}\n"
    )
}

fn simulate(docs: &[String], gpus: u32, format: Format) -> (Result<()>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.yaml");
    std::fs::write(&input, format!("{CLASS}---\n{}", docs.join("---\n"))).unwrap();
    let fleet_file = dir.path().join("fleet.yaml");
    std::fs::write(&fleet_file, fleet(gpus)).unwrap();
    let (mut out, mut note) = (Vec::new(), Vec::new());
    let files: Vec<PathBuf> = vec![input];
    let options = Options { fleet: Some(&fleet_file), format, timings: false };
    let result = run(&files, &options, &mut out, &mut note);
    (result, String::from_utf8(out).unwrap(), String::from_utf8(note).unwrap())
}

fn results(docs: &[String], gpus: u32) -> Vec<serde_json::Value> {
    let (result, out, _) = simulate(docs, gpus, Format::Json);
    result.unwrap();
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    doc["results"].as_array().unwrap().clone()
}

fn nodes(results: &[serde_json::Value]) -> Vec<Option<&str>> {
    results.iter().map(|r| r["node"].as_str()).collect()
}

#[test]
fn claims_in_order_each_seeing_the_ones_before() {
    let r = results(&[claim("first", 2), claim("second", 2), claim("third", 1)], 2);
    assert_eq!(nodes(&r), [Some("a-node"), Some("b-node"), None]);
    assert_eq!(r[2]["allocated"], false);
    assert_eq!(r[2]["error"], false);
    let reason = r[2]["reason"].as_str().unwrap();
    assert!(reason.starts_with("claim default/third cannot be allocated on any of 2 nodes"), "{reason}");
    // Counts are over all nodes tried.
    assert!(reason.contains("4 allocated (2 to default/first, 2 to default/second); 0 available"), "{reason}");
}

#[test]
fn output_entries_have_the_documented_shape() {
    let (result, out, _) = simulate(&[claim("one", 1)], 1, Format::Json);
    result.unwrap();
    // Field order as documented, not alphabetical.
    let order = ["\"namespace\"", "\"name\"", "\"allocated\"", "\"node\"", "\"allocation\"", "\"error\"", "\"reason\""];
    let positions: Vec<usize> = order.iter().map(|k| out.find(k).unwrap()).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{out}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entry = &doc["results"][0];
    assert_eq!(entry["namespace"], "default");
    assert_eq!(entry["name"], "one");
    assert_eq!(entry["allocated"], true);
    assert_eq!(entry["reason"], serde_json::Value::Null);
    let result = &entry["allocation"]["devices"]["results"][0];
    assert_eq!((result["request"].as_str(), result["pool"].as_str()), (Some("gpu"), Some("a-node")));
    let selector = &entry["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0];
    assert_eq!(selector["values"][0], "a-node");
    // YAML carries the same document.
    let (result, yaml, _) = simulate(&[claim("one", 1)], 1, Format::Yaml);
    result.unwrap();
    let from_yaml: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_eq!(from_yaml, doc);
}

#[test]
fn a_pods_claims_land_on_one_node() {
    let tpl = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: one-gpu}\n\
               spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}\n";
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [], resourceClaims: [\
               {name: big, resourceClaimName: big}, {name: small, resourceClaimTemplateName: one-gpu}]}\n";
    // a-node has one GPU free after `filler`; the pod needs 1 + 1, so both go to b-node.
    let r = results(&[claim("filler", 1), tpl.to_string(), claim("big", 1), pod.to_string()], 2);
    let names: Vec<&str> = r.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["filler", "big", "p-small"]);
    assert_eq!(nodes(&r), [Some("a-node"), Some("b-node"), Some("b-node")]);
}

#[test]
fn later_pods_follow_a_shared_claim_to_its_node() {
    let tpl = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: one-gpu}\n\
               spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}\n";
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec: {{containers: [], resourceClaims: [\
             {{name: s, resourceClaimName: shared}}, {{name: own, resourceClaimTemplateName: one-gpu}}]}}\n"
        )
    };
    let r = results(&[tpl.to_string(), claim("shared", 1), pod("p1"), pod("p2"), pod("p3")], 3);
    let names: Vec<&str> = r.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["shared", "p1-own", "p2-own", "p3-own"]);
    // a-node has 3 GPUs: shared + p1 + p2. p3 must not go to b-node.
    assert_eq!(nodes(&r), [Some("a-node"), Some("a-node"), Some("a-node"), None]);
    let reason = r[3]["reason"].as_str().unwrap();
    assert!(reason.contains("cannot be allocated on node a-node"), "{reason}");
}

#[test]
fn preallocated_claims_count_as_in_use() {
    let done = format!(
        "{}status:\n  allocation:\n    devices: {{results: [{{request: gpu, driver: gpu.nvidia.com, pool: a-node, device: gpu-0}}]}}\n    \
         nodeSelector: {{nodeSelectorTerms: [{{matchFields: [{{key: metadata.name, operator: In, values: [a-node]}}]}}]}}\n",
        claim("done", 1)
    );
    let r = results(&[done, claim("next", 1)], 1);
    assert_eq!(nodes(&r), [Some("a-node"), Some("b-node")]);
    assert_eq!(r[0]["allocated"], true);
    assert_eq!(r[0]["allocation"]["devices"]["results"][0]["device"], "gpu-0");
}

#[test]
fn selector_errors_are_fatal_results_not_input_errors() {
    let bad = claim("bad", 1).replace(
        "count: 1}",
        "count: 1, selectors: [{cel: {expression: 'device.attributes[\"gpu.nvidia.com\"].nosuch == \"x\"'}}]}",
    );
    let r = results(&[bad], 1);
    assert_eq!((r[0]["allocated"].as_bool(), r[0]["error"].as_bool()), (Some(false), Some(true)));
    let reason = r[0]["reason"].as_str().unwrap();
    assert!(reason.contains("claim default/bad") && reason.contains("selector #0"), "{reason}");
}

#[test]
fn table_is_aligned_with_a_summary() {
    let (result, out, _) = simulate(&[claim("a-claim", 2), claim("another-claim", 3)], 2, Format::Table);
    result.unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAMESPACE/NAME"), "{out}");
    let node_col = lines[0].find("NODE").unwrap();
    assert_eq!(lines[1].find("a-node"), Some(node_col), "{out}");
    assert!(lines[1].contains("gpu=gpu-0,gpu-1"), "{out}");
    assert_eq!(lines[2].get(node_col..node_col + 1), Some("-"), "{out}");
    assert!(lines[2].contains("cannot be allocated"), "{out}");
    assert_eq!(lines.last().copied(), Some("1 of 2 claims allocated"));
}

#[test]
fn other_kinds_are_noted_and_fleet_nodes_must_be_unique() {
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n".to_string();
    let (result, _, note) = simulate(&[deployment], 1, Format::Json);
    result.unwrap();
    assert!(note.contains("skipping Deployment \"web\""), "{note}");
    let node = "apiVersion: v1\nkind: Node\nmetadata: {name: a-node}\n".to_string();
    let (result, out, _) = simulate(&[node], 1, Format::Json);
    let err = result.unwrap_err().to_string();
    assert!(err.contains("node a-node is also defined in"), "{err}");
    assert!(out.is_empty());
}
