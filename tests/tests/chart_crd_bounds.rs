//! Every numeric field of every CRD the chart ships has the bounds of the
//! Rust type that reads it: the API server then refuses at admission what
//! the driver could not decode (one undecodable object in a list used to
//! stop the whole watch). Checked by decoding an object with the field at
//! the schema's `minimum` and `maximum` (must decode) and one past each
//! (must not). Read from the templates as written (the CRD documents have
//! no logic but their labels), so no Helm is needed.

use std::path::Path;

use gpu_dra_driver::compute_domain::api::{
    ComputeDomain, ComputeDomainNode, ComputeDomainSpec, ComputeDomainStatus, Readiness,
};
use integration_tests::workspace_root;
use serde_json::Value;

/// How each shipped CRD's objects are read by our code: a full object of
/// it (every optional part present, one item in each list) and whether a
/// value decodes as the Rust type.
struct Reader {
    sample: Value,
    decodes: fn(&Value) -> bool,
}

fn reader(crd: &str) -> Reader {
    match crd {
        "computedomains.resource.nvidia.com" => {
            let mut domain = ComputeDomain::new("ns", "d", ComputeDomainSpec::with_template(1, "t"));
            domain.status = Some(ComputeDomainStatus {
                status: Readiness::Ready,
                nodes: vec![ComputeDomainNode {
                    name: "n".into(),
                    ip_address: "10.0.0.1".into(),
                    clique_id: "c.1".into(),
                    index: 1,
                    status: Readiness::Ready,
                }],
            });
            Reader {
                sample: serde_json::to_value(&domain).unwrap(),
                decodes: |v| serde_json::from_value::<ComputeDomain>(v.clone()).is_ok(),
            }
        }
        other => panic!("the chart ships CRD {other}: add the Rust type that reads it here"),
    }
}

/// The CRD documents of the chart's templates (and `crds/`, if any).
fn shipped_crds() -> Vec<Value> {
    let chart = workspace_root().join("charts/gpu-dra-driver");
    let mut crds = Vec::new();
    for dir in ["templates", "crds"] {
        let Ok(entries) = std::fs::read_dir(chart.join(dir)) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                crds.extend(crds_in(&path));
            }
        }
    }
    crds
}

fn crds_in(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.split("\n---\n")
        .filter(|doc| doc.lines().any(|l| l.trim() == "kind: CustomResourceDefinition"))
        .map(|doc| {
            let plain: String = doc.lines().filter(|l| !l.contains("{{")).map(|l| format!("{l}\n")).collect();
            serde_yaml_ng::from_str(&plain).unwrap_or_else(|e| panic!("{}: {e}\n{plain}", path.display()))
        })
        .collect()
}

/// Every numeric field of `schema` under `path` (`[]` for a list's items).
fn numeric_fields(schema: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, Value)>) {
    if matches!(schema["type"].as_str(), Some("integer" | "number")) {
        out.push((path.clone(), schema.clone()));
    }
    if let Some(properties) = schema["properties"].as_object() {
        for (name, child) in properties {
            path.push(name.clone());
            numeric_fields(child, path, out);
            path.pop();
        }
    }
    if schema["items"].is_object() {
        path.push("[]".into());
        numeric_fields(&schema["items"], path, out);
        path.pop();
    }
}

/// `sample` with the field at `path` set to `value` (a list's first item).
fn with_field(sample: &Value, path: &[String], value: i128) -> Value {
    let mut object = sample.clone();
    let mut at = &mut object;
    for step in path {
        at = if step == "[]" { &mut at[0] } else { &mut at[step.as_str()] };
    }
    *at = serde_json::from_str(&value.to_string()).unwrap();
    object
}

#[test]
fn every_numeric_field_of_every_shipped_crd_has_the_bounds_of_its_rust_type() {
    let crds = shipped_crds();
    assert!(!crds.is_empty(), "no CRD found in the chart");
    let mut checked = Vec::new();
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap();
        let reader = reader(name);
        assert!((reader.decodes)(&reader.sample), "{name}: the sample must decode");
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let mut fields = Vec::new();
            numeric_fields(&version["schema"]["openAPIV3Schema"], &mut Vec::new(), &mut fields);
            for (path, schema) in fields {
                let field = format!("{name} {}: {}", version["name"].as_str().unwrap(), path.join("."));
                assert_eq!(schema["type"], "integer", "{field}: a number field needs its check here");
                let (Some(min), Some(max)) = (schema["minimum"].as_i64(), schema["maximum"].as_i64()) else {
                    panic!("{field}: no minimum and maximum in {schema}");
                };
                let (min, max) = (i128::from(min), i128::from(max));
                for (value, decodes) in [(min, true), (max, true), (min - 1, false), (max + 1, false)] {
                    let object = with_field(&reader.sample, &path, value);
                    assert_eq!(
                        (reader.decodes)(&object),
                        decodes,
                        "{field}: {value} (schema {min}..={max}) must {}decode",
                        if decodes { "" } else { "not " }
                    );
                }
                checked.push(field);
            }
        }
    }
    assert!(checked.iter().any(|f| f.ends_with("spec.numNodes")), "{checked:?}");
    assert!(checked.iter().any(|f| f.ends_with("status.nodes.[].index")), "{checked:?}");
}
