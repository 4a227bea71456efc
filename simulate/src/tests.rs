//! In-process tests of the whole `simulate` path on small fleets. Classes
//! use plain equality selectors only.

use std::path::PathBuf;

use super::*;
use dra_cel::CelEnvironment;

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

fn simulate(docs: &[String], gpus: u32, format: Format) -> (Result<(), SimulateError>, String, String) {
    simulate_in(docs, gpus, format, CelEnvironment::default())
}

fn simulate_in(
    docs: &[String],
    gpus: u32,
    format: Format,
    cel: CelEnvironment,
) -> (Result<(), SimulateError>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.yaml");
    std::fs::write(&input, format!("{CLASS}---\n{}", docs.join("---\n"))).unwrap();
    let fleet_file = dir.path().join("fleet.yaml");
    std::fs::write(&fleet_file, fleet(gpus)).unwrap();
    let (mut out, mut note) = (Vec::new(), Vec::new());
    let files: Vec<PathBuf> = vec![input];
    let options = Options { fleet: Some(&fleet_file), format, timings: false, cel, ..Options::default() };
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

/// `run` prints what `evaluate` returns: `-o json` is `{"results": outcomes}`.
#[test]
fn run_prints_the_outcomes_evaluate_returns() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.yaml");
    std::fs::write(&input, format!("{CLASS}---\n{}---\n{}", claim("one", 1), claim("two", 9))).unwrap();
    let fleet_file = dir.path().join("fleet.yaml");
    std::fs::write(&fleet_file, fleet(1)).unwrap();
    let files = vec![input];
    let options = Options { fleet: Some(&fleet_file), format: Format::Json, ..Options::default() };
    let outcomes = evaluate(&files, &options, &mut std::io::sink()).unwrap();
    assert_eq!(
        outcomes.iter().map(|o| (o.key.as_str(), o.allocated)).collect::<Vec<_>>(),
        [("default/one", true), ("default/two", false)]
    );
    assert!(outcomes[1].reason.is_some());
    let mut printed = Vec::new();
    run(&files, &options, &mut printed, &mut std::io::sink()).unwrap();
    let printed: serde_json::Value = serde_json::from_slice(&printed).unwrap();
    assert_eq!(printed, serde_json::json!({ "results": outcomes }));
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
    let daemons = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: web}\n".to_string();
    let (result, _, note) = simulate(&[daemons], 1, Format::Json);
    result.unwrap();
    assert!(note.contains("skipping DaemonSet \"web\""), "{note}");
    let node = "apiVersion: v1\nkind: Node\nmetadata: {name: a-node}\n".to_string();
    let (result, out, _) = simulate(&[node], 1, Format::Json);
    let err = result.unwrap_err().to_string();
    assert!(err.contains("node a-node is also defined in"), "{err}");
    assert!(out.is_empty());
}

/// A claim for one GPU whose request carries `expression` as its selector.
fn claim_with_selector(name: &str, expression: &str) -> String {
    let quoted = serde_json::to_string(expression).unwrap();
    claim(name, 1).replace("count: 1}", &format!("count: 1, selectors: [{{cel: {{expression: {quoted}}}}}]}}"))
}

/// Kubernetes' own CEL cases (dynamic-resource-allocation's
/// `cel/compile_test.go`, the apiserver's library tests), restated, run
/// through `simulate`: what matches allocates, what Kubernetes refuses is
/// the claim's error, in Kubernetes' words.
#[test]
fn kubernetes_cel_cases_through_simulate() {
    let nested = |levels: usize| {
        let mut e = "int('1'.find('[0-9]*')) < 100".to_owned();
        for l in 0..levels {
            e = format!("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x{l}, {e})");
        }
        e
    };
    let allocates = [
        r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")"#.to_owned(),
        r#"device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))"#.to_owned(),
        r#"device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("1.0.0"))"#.to_owned(),
        r#"cel.bind(gpu, device.attributes["gpu.nvidia.com"], gpu.architecture == "Hopper" && has(gpu.uuid))"#
            .to_owned(),
        r#"device.attributes["gpu.nvidia.com"].exists(k, v, k == "uuid" && v.startsWith("GPU-"))"#.to_owned(),
        r#"["b", "c", "a"].sort() == ["a", "b", "c"] && sets.contains([1, 2], [2])"#.to_owned(),
        r#"cidr("10.0.0.0/8").containsIP("10.1.2.3") && url("https://example.com/x").getHost() == "example.com""#
            .to_owned(),
        r#"!format.dns1123Label().validate(device.driver.replace(".", "-")).hasValue()"#.to_owned(),
        nested(5),
    ];
    let refused = [
        ("true || device.driver > 1", "found no matching overload for '_>_' applied to '(string, int)'"),
        ("1 == 1.0", "found no matching overload for '_==_' applied to '(int, double)'"),
        ("[1, 2.0].size() == 2", "expected type 'int' but found 'double'"),
        ("sets.contains([1], [1.0])", "'sets.contains' applied to '(list(int), list(double))'"),
        ("1", "must evaluate to bool or the unknown type, not int"),
        (r#""gums".reverse() == "smug""#, "'reverse' applied to 'string.()'"),
    ];
    let mut docs: Vec<String> =
        allocates.iter().enumerate().map(|(i, e)| claim_with_selector(&format!("ok-{i}"), e)).collect();
    docs.extend(refused.iter().enumerate().map(|(i, (e, _))| claim_with_selector(&format!("bad-{i}"), e)));
    let (result, out, _) = simulate_in(&docs, 8, Format::Json, CelEnvironment::stored_expressions(36));
    result.unwrap();
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let results = doc["results"].as_array().unwrap();
    for (i, expression) in allocates.iter().enumerate() {
        assert_eq!(results[i]["allocated"].as_bool(), Some(true), "{expression}: {}", results[i]);
    }
    for (i, (expression, message)) in refused.iter().enumerate() {
        let r = &results[allocates.len() + i];
        assert_eq!(r["error"].as_bool(), Some(true), "{expression}: {r}");
        assert!(r["reason"].as_str().unwrap().contains(message), "{expression}: {r}");
    }

    // The version and the kind of expression: a 1.34 apiserver refuses the
    // lists extension in a new claim and the cost estimate above the limit;
    // a 1.35 one admits the former; the scheduler meters the latter.
    let sort = claim_with_selector("sorts", "[3, 1].sort() == [1, 3]");
    let seven = claim_with_selector("seven", &nested(7));
    let run = |cel: CelEnvironment| {
        let (result, out, _) = simulate_in(&[sort.clone(), seven.clone()], 1, Format::Json, cel);
        result.unwrap();
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        doc["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["reason"].as_str().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    };
    let new_134 = run(CelEnvironment::new_expressions(34));
    assert!(new_134[0].contains("undeclared reference to 'sort'"), "{new_134:?}");
    assert!(new_134[1].contains("too complex, exceeds cost limit"), "{new_134:?}");
    let new_135 = run(CelEnvironment::new_expressions(35));
    assert!(!new_135[0].contains("undeclared"), "{new_135:?}");
    let stored = run(CelEnvironment::stored_expressions(34));
    assert!(stored[0].is_empty() || stored[0] == "-", "{stored:?}");
    assert!(stored[1].contains("cost budget"), "{stored:?}");
}

#[test]
fn single_quoted_literals_get_the_values_devices_have() {
    let r = results(&[claim_with_selector("c", "device.attributes['gpu.nvidia.com'].productName == 'H100'")], 1);
    let reason = r[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains(r#"no device has productName "H100"; the values here are "NVIDIA H100 80GB HBM3" (2)"#),
        "{reason}"
    );
}

#[test]
fn a_domain_typo_names_the_domain_devices_publish() {
    let r = results(&[claim_with_selector("c", "device.attributes['gpu.nvidia.con'].productName == 'x'")], 1);
    assert_eq!(r[0]["error"], true);
    let reason = r[0]["reason"].as_str().unwrap();
    assert!(
        reason.ends_with(
            r#"No such key: productName; no device publishes the domain "gpu.nvidia.con"; did you mean "gpu.nvidia.com"?"#
        ),
        "{reason}"
    );
    // A name read from the wrong map keeps its own hint.
    let r = results(
        &[claim_with_selector("c", "device.capacity['gpu.nvidia.com'].productName.isGreaterThan(quantity('1'))")],
        1,
    );
    let reason = r[0]["reason"].as_str().unwrap();
    assert!(reason.contains(r#"No such key: productName; "productName" is an attribute"#), "{reason}");
}

#[test]
fn closest_is_the_node_that_came_nearest_for_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let fleet_file = dir.path().join("fleet.yaml");
    // `a-h100` is tried first and has no MIG device at all.
    std::fs::write(
        &fleet_file,
        "nodes:\n- {name: a-h100, inventory: {gpus: [{model: H100-80GB, count: 2}]}}\n\
         - {name: b-mig, inventory: {gpus: [{model: A100-SXM4-80GB, count: 1, mig: [{instances: [3g.40gb]}]}]}}\n\
         - {name: c-mig, inventory: {gpus: [{model: A100-SXM4-80GB, count: 1, mig: [{instances: [1g.10gb, 1g.10gb]}]}]}}\n",
    )
    .unwrap();
    let mig_class = CLASS.replace("name: gpu.nvidia.com", "name: mig.nvidia.com").replace(
        "device.driver == \"gpu.nvidia.com\"",
        "device.driver == \"gpu.nvidia.com\" && device.attributes[\"gpu.nvidia.com\"].type == \"mig\"",
    );
    let claim = claim_with_selector("m", "device.attributes['gpu.nvidia.com'].profile == '7g.80gb'")
        .replace("deviceClassName: gpu.nvidia.com", "deviceClassName: mig.nvidia.com");
    let input = dir.path().join("in.yaml");
    std::fs::write(&input, format!("{mig_class}---\n{claim}")).unwrap();
    let (mut out, mut note) = (Vec::new(), Vec::new());
    let options = Options { fleet: Some(&fleet_file), format: Format::Json, ..Options::default() };
    run(&[input], &options, &mut out, &mut note).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let reason = doc["results"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("cannot be allocated on any of 3 nodes (closest: c-mig)"), "{reason}");
}
