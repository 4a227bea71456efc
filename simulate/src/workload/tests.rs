use super::*;
use crate::inputs;
use crate::manifests::parse_into;

const CLASS: &str = "gpu.nvidia.com";

fn template(name: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {{name: {name}}}\n\
         spec:\n  metadata: {{labels: {{team: ml}}, annotations: {{note: x}}}}\n  \
         spec: {{devices: {{requests: [{{name: gpu, exactly: {{deviceClassName: {CLASS}}}}}]}}}}\n"
    )
}

fn claim(name: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}}}\n\
         spec: {{devices: {{requests: [{{name: gpu, exactly: {{deviceClassName: {CLASS}}}}}]}}}}\n"
    )
}

fn pod(name: &str, entries: &[(&str, &str, &str)]) -> String {
    let entries: Vec<String> =
        entries.iter().map(|(e, field, target)| format!("{{name: {e}, {field}: {target}}}")).collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec: {{containers: [], resourceClaims: [{}]}}\n",
        entries.join(", ")
    )
}

fn build_docs(docs: &[String]) -> Result<Workload, WorkloadError> {
    let mut manifests = Vec::new();
    parse_into("w.yaml", &docs.join("---\n"), &mut manifests).unwrap();
    let inputs = inputs::sort(manifests, &mut Vec::new()).unwrap();
    build(
        &inputs,
        &|c| (c != CLASS).then(|| format!("DeviceClass {c:?} is missing")),
        &ExtendedResources::default(),
        crate::options::Source::Files,
    )
}

fn keys(w: &Workload) -> Vec<&str> {
    w.claims.iter().map(|c| c.key.as_str()).collect()
}

#[test]
fn templates_become_one_claim_per_pod_entry() {
    let w = build_docs(&[
        template("tpl"),
        pod("p1", &[("gpu", "resourceClaimTemplateName", "tpl")]),
        pod("p2", &[("gpu", "resourceClaimTemplateName", "tpl")]),
    ])
    .unwrap();
    assert_eq!(keys(&w), ["default/p1-gpu", "default/p2-gpu"]);
    let c = &w.claims[0].claim;
    assert_eq!(c.metadata.labels.as_ref().unwrap().get("team").map(String::as_str), Some("ml"));
    let annotations = c.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations.get("note").map(String::as_str), Some("x"));
    assert_eq!(annotations.get(POD_CLAIM_NAME_ANNOTATION).map(String::as_str), Some("gpu"));
    let owner = &c.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("Pod", "p1", Some(true)));
    assert!(c.spec.is_some());
    // Deterministic, distinct UIDs.
    let again = build_docs(&[template("tpl"), pod("p1", &[("gpu", "resourceClaimTemplateName", "tpl")])]).unwrap();
    assert_eq!(again.claims[0].claim.metadata.uid, c.metadata.uid);
    assert_ne!(w.claims[1].claim.metadata.uid, c.metadata.uid);
    assert_eq!(w.units.len(), 2);
}

#[test]
fn unreferenced_templates_and_claims_are_allocated_alone_in_input_order() {
    let w = build_docs(&[claim("c1"), template("lonely"), pod("p", &[("a", "resourceClaimName", "c2")]), claim("c2")])
        .unwrap();
    // c2 is allocated with the pod, at the pod's position.
    assert_eq!(keys(&w), ["default/c1", "default/lonely", "default/c2"]);
    let units: Vec<(Option<&str>, &[usize])> =
        w.units.iter().map(|u| (u.pod.as_deref(), u.claims.as_slice())).collect();
    assert_eq!(units, [(None, &[0][..]), (None, &[1][..]), (Some("default/p"), &[2][..])]);
    assert!(w.claims[1].claim.metadata.owner_references.is_none());
}

#[test]
fn a_pods_claims_form_one_unit_and_shared_claims_bind_later_pods() {
    let w = build_docs(&[
        claim("shared"),
        template("tpl"),
        pod("p1", &[("s", "resourceClaimName", "shared"), ("own", "resourceClaimTemplateName", "tpl")]),
        pod("p2", &[("own", "resourceClaimTemplateName", "tpl"), ("s", "resourceClaimName", "shared")]),
    ])
    .unwrap();
    assert_eq!(keys(&w), ["default/shared", "default/p1-own", "default/p2-own"]);
    assert_eq!(w.units.len(), 2);
    assert_eq!(w.units[0], Unit { pod: Some("default/p1".into()), claims: vec![0, 1], bound: vec![] });
    assert_eq!(w.units[1], Unit { pod: Some("default/p2".into()), claims: vec![2], bound: vec![0] });
}

#[test]
fn preallocated_claims_are_bound_not_allocated() {
    let allocated = format!(
        "{}status: {{allocation: {{devices: {{results: [{{request: gpu, driver: d, pool: n, device: gpu-0}}]}}}}}}\n",
        claim("done")
    );
    let w = build_docs(&[allocated, pod("p", &[("x", "resourceClaimName", "done")])]).unwrap();
    assert!(w.claims[0].preallocated);
    assert_eq!(w.units, [Unit { pod: Some("default/p".into()), claims: vec![], bound: vec![0] }]);
}

#[test]
fn bad_references_name_file_pod_and_entry() {
    let err = build_docs(&[pod("p", &[("x", "resourceClaimName", "missing")])]).unwrap_err().to_string();
    assert!(
        err.contains(
            "w.yaml: Pod default/p: spec.resourceClaims[0]: ResourceClaim default/missing is not among the inputs"
        ),
        "{err}"
    );
    let err = build_docs(&[pod("p", &[("x", "resourceClaimTemplateName", "nope")])]).unwrap_err().to_string();
    assert!(err.contains("ResourceClaimTemplate default/nope is not among the inputs"), "{err}");
    let err = build_docs(&[
        template("t"),
        pod("p", &[("a", "resourceClaimTemplateName", "t"), ("a", "resourceClaimTemplateName", "t")]),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("spec.resourceClaims[1].name: duplicate entry \"a\""), "{err}");
    // A generated claim may not clash with a claim of the inputs.
    let err = build_docs(&[claim("p-gpu"), template("t"), pod("p", &[("gpu", "resourceClaimTemplateName", "t")])])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ResourceClaim default/p-gpu would exist twice"), "{err}");
}

#[test]
fn invalid_claim_specs_and_unknown_classes_are_input_errors() {
    let bad = claim("c").replace("exactly: {", "exactly: {count: -2, ");
    let err = build_docs(&[bad]).unwrap_err().to_string();
    assert!(err.starts_with("w.yaml: ResourceClaim default/c: spec.devices.requests[0].exactly.count: -2"), "{err}");
    let bad = template("t").replace(CLASS, "tpu.example.com");
    let err = build_docs(&[bad]).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "w.yaml: ResourceClaimTemplate default/t: spec.spec.devices.requests[0].exactly.deviceClassName"
        ),
        "{err}"
    );
}
