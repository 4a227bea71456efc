//! One `admission.k8s.io/v1` AdmissionReview of a ResourceClaim or
//! ResourceClaimTemplate, answered without I/O.
//!
//! Rejected: opaque configuration for our driver that does not decode
//! strictly (the message names the JSON path, as NVIDIA's plugin would fail
//! it at prepare time, too late). Admitted with warnings: selectors the
//! apiserver's own CEL checks would refuse, and requests that no device in
//! the cluster matches today (with the explainer's reasons). A warning is
//! never a rejection: the fleet changes, and the apiserver owns CEL
//! validation.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimSpec};
use serde_json::{Value, json};

use dra_cel::{CelEnvironment, SelectorEnv};
use gpu_dra_driver::feature_gates::FeatureGates;
use gpu_dra_driver::opaque_config;

/// What a review may look at beyond the request.
pub trait Fleet {
    /// Warnings about where the claim could go in the cluster today.
    fn warnings(&self, claim: &ResourceClaim) -> Vec<String>;
}

/// Kubernetes caps an admission warning at 256 characters.
const WARNING_MAX_CHARS: usize = 256;

/// The AdmissionReview to send back for `body`, and whether it allowed.
pub fn review(body: &[u8], driver: &str, gates: &FeatureGates, cel: &SelectorEnv, fleet: &dyn Fleet) -> (Value, bool) {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(error) => {
            return (error_review("", &format!("the request body is not an AdmissionReview: {error}")), false);
        }
    };
    let uid = request.pointer("/request/uid").and_then(Value::as_str).unwrap_or_default().to_owned();
    if request.get("apiVersion").and_then(Value::as_str) != Some("admission.k8s.io/v1")
        || request.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
    {
        return (error_review(&uid, "expected apiVersion admission.k8s.io/v1, kind AdmissionReview"), false);
    }
    let kind = request.pointer("/request/kind/kind").and_then(Value::as_str).unwrap_or_default();
    let operation = request.pointer("/request/operation").and_then(Value::as_str).unwrap_or_default();
    let Some(object) = request.pointer("/request/object") else {
        // DELETE carries no object: nothing to check.
        return (allowed(&uid, Vec::new()), true);
    };
    if operation == "DELETE" {
        return (allowed(&uid, Vec::new()), true);
    }
    let (spec_path, spec) = match kind {
        "ResourceClaim" => ("spec", object.get("spec")),
        "ResourceClaimTemplate" => ("spec.spec", object.pointer("/spec/spec")),
        other => {
            return (
                error_review(
                    &uid,
                    &format!("this webhook reviews ResourceClaims and ResourceClaimTemplates, not {other}"),
                ),
                false,
            );
        }
    };
    let spec: ResourceClaimSpec = match spec.cloned().map(serde_json::from_value).transpose() {
        Ok(spec) => spec.unwrap_or_default(),
        Err(error) => return (denied(&uid, 400, &format!("{spec_path}: {error}")), false),
    };
    if let Err(error) = opaque_config::check_spec(&spec, spec_path, driver, gates) {
        return (denied(&uid, 422, &error.to_string()), false);
    }
    let mut warnings = selector_warnings(&spec, spec_path, cel);
    if warnings.is_empty() {
        let claim = ResourceClaim {
            metadata: serde_json::from_value(object.get("metadata").cloned().unwrap_or(json!({}))).unwrap_or_default(),
            spec: Some(spec),
            status: None,
        };
        warnings.extend(fleet.warnings(&claim));
    }
    let warnings = warnings.into_iter().map(|w| truncate(&w)).collect();
    (allowed(&uid, warnings), true)
}

/// CEL problems, as the apiserver checks a new claim's selectors.
fn selector_warnings(spec: &ResourceClaimSpec, spec_path: &str, cel: &SelectorEnv) -> Vec<String> {
    let mut warnings = Vec::new();
    let requests = spec.devices.as_ref().and_then(|d| d.requests.as_ref());
    for (i, request) in requests.into_iter().flatten().enumerate() {
        let at = format!("{spec_path}.devices.requests[{i}]");
        let exact = request.exactly.as_ref().map(|e| (format!("{at}.exactly"), e.selectors.as_deref()));
        let subrequests = request
            .first_available
            .iter()
            .flatten()
            .enumerate()
            .map(|(j, s)| (format!("{at}.firstAvailable[{j}]"), s.selectors.as_deref()));
        for (path, selectors) in exact.into_iter().chain(subrequests) {
            for (k, selector) in selectors.into_iter().flatten().enumerate() {
                let Some(expression) = selector.cel.as_ref().map(|c| c.expression.as_str()) else { continue };
                if let Err(error) = cel.compile(expression) {
                    warnings.push(format!("{path}.selectors[{k}].cel.expression: {error}"));
                }
            }
        }
    }
    warnings
}

fn truncate(text: &str) -> String {
    if text.chars().count() <= WARNING_MAX_CHARS {
        return text.to_owned();
    }
    let cut: String = text.chars().take(WARNING_MAX_CHARS - 3).collect();
    format!("{cut}...")
}

fn envelope(response: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

fn allowed(uid: &str, warnings: Vec<String>) -> Value {
    let mut response = json!({"uid": uid, "allowed": true});
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    envelope(response)
}

fn denied(uid: &str, code: u16, message: &str) -> Value {
    envelope(json!({"uid": uid, "allowed": false, "status": {"code": code, "message": message}}))
}

/// An admission with one warning, e.g. for a review that did not finish in
/// time (a warning is advice: a late check never refuses a claim).
pub fn admitted_with_warning(uid: &str, warning: &str) -> Value {
    allowed(uid, vec![truncate(warning)])
}

/// The request's uid, read before the review runs so that even a review
/// that does not finish answers for its request ("" when not there).
pub fn request_uid(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Review {
        request: Option<Uid>,
    }
    #[derive(serde::Deserialize)]
    struct Uid {
        uid: Option<String>,
    }
    serde_json::from_slice::<Review>(body).ok().and_then(|r| r.request?.uid).unwrap_or_default()
}

/// An answer to a request that is not a well-formed review. `uid` is
/// echoed when known.
pub fn error_review(uid: &str, message: &str) -> Value {
    denied(uid, 400, message)
}

/// The environment a webhook checks selectors in: the apiserver's for new
/// expressions of its version, with Kubernetes' DRAListTypeAttributes as
/// the driver's gate of that name says the cluster has it.
pub fn selector_env(server_minor: u32, gates: &FeatureGates) -> SelectorEnv {
    let lists = gates.enabled(gpu_dra_driver::feature_gates::Gate::ListTypeAttributes);
    SelectorEnv::for_environment(CelEnvironment {
        list_type_attributes: lists,
        ..CelEnvironment::new_expressions(server_minor)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoFleet(Vec<String>);

    impl Fleet for NoFleet {
        fn warnings(&self, _: &ResourceClaim) -> Vec<String> {
            self.0.clone()
        }
    }

    fn review_of(object: Value, kind: &str) -> (Value, bool) {
        let body = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
                        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
                        "operation": "CREATE", "object": object},
        });
        let gates = FeatureGates::default();
        review(
            body.to_string().as_bytes(),
            "gpu.nvidia.com",
            &gates,
            &selector_env(36, &FeatureGates::default()),
            &NoFleet(vec!["no H100 today".into()]),
        )
    }

    fn claim_with(config: Value, selector: &str) -> Value {
        json!({"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": selector}}]}}],
            "config": [config]}}})
    }

    #[test]
    fn bad_opaque_config_is_denied_with_its_json_path() {
        let config = json!({"opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "bogus": 1}}}});
        let (response, ok) = review_of(claim_with(config, "true"), "ResourceClaim");
        assert!(!ok);
        assert_eq!(response["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["response"]["allowed"], false);
        let message = response["response"]["status"]["message"].as_str().unwrap();
        assert!(message.starts_with("spec.devices.config[0].opaque.parameters.sharing"), "{message}");
        // Another driver's config is not ours to judge.
        let theirs = json!({"opaque": {"driver": "other.example.com", "parameters": {"anything": true}}});
        assert!(review_of(claim_with(theirs, "true"), "ResourceClaim").1);
    }

    #[test]
    fn selector_problems_are_warnings_never_denials() {
        let config = json!({"opaque": {"driver": "other.example.com", "parameters": {}}});
        let (response, ok) = review_of(claim_with(config.clone(), "device.driver > 1"), "ResourceClaim");
        assert!(ok);
        let warnings = response["response"]["warnings"].as_array().unwrap();
        let first = warnings[0].as_str().unwrap();
        assert!(first.starts_with("spec.devices.requests[0].exactly.selectors[0].cel.expression: "), "{first}");
        assert!(first.chars().count() <= WARNING_MAX_CHARS);
        // A clean selector gets the fleet's warnings.
        let (response, ok) = review_of(claim_with(config, "true"), "ResourceClaim");
        assert!(ok);
        assert_eq!(response["response"]["warnings"], json!(["no H100 today"]));
    }

    /// A selector that ranges over an attribute is valid for a new claim
    /// only with DRAListTypeAttributes: with the driver's gate of that name
    /// (the cluster has it) it is admitted clean; without, the warning says
    /// which gate to turn on.
    #[test]
    fn list_attribute_selectors_follow_the_list_type_attributes_gate() {
        let selector = r#"device.attributes["resource.kubernetes.io"].numaNode.exists(n, n == 0)"#;
        let claim = json!({"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                          "selectors": [{"cel": {"expression": selector}}]}}]}}});
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                        "operation": "CREATE", "object": claim}});
        let off = FeatureGates::default();
        let (response, ok) =
            review(body.to_string().as_bytes(), "gpu.nvidia.com", &off, &selector_env(37, &off), &NoFleet(vec![]));
        assert!(ok, "selector problems are warnings");
        let warning = response["response"]["warnings"][0].as_str().unwrap_or_default();
        assert!(warning.contains("cannot be range of a comprehension"), "{warning}");
        assert!(warning.contains("DRAListTypeAttributes=true"), "{warning}");
        let on: FeatureGates = "DRAListTypeAttributes=true".parse().unwrap();
        let (response, ok) =
            review(body.to_string().as_bytes(), "gpu.nvidia.com", &on, &selector_env(37, &on), &NoFleet(vec![]));
        assert!(ok);
        assert!(response["response"]["warnings"].is_null(), "{response}");
    }

    #[test]
    fn a_late_review_is_admitted_for_its_request() {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                          "request": {"uid": "u-17", "object": {"spec": {}}}});
        let uid = request_uid(body.to_string().as_bytes());
        assert_eq!(uid, "u-17");
        assert_eq!(request_uid(b"{not json"), "");
        let answer = admitted_with_warning(&uid, "not checked in time");
        assert_eq!(answer["response"], json!({"uid": "u-17", "allowed": true, "warnings": ["not checked in time"]}));
    }

    #[test]
    fn templates_are_reviewed_at_spec_spec_and_garbage_is_an_error() {
        let template = json!({"metadata": {"name": "t", "namespace": "ns"}, "spec": {"spec": {"devices": {"config": [
            {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"apiVersion": "v0", "kind": "GpuConfig"}}}]}}}});
        let (response, ok) = review_of(template, "ResourceClaimTemplate");
        assert!(!ok);
        assert!(response["response"]["status"]["message"].as_str().unwrap().starts_with("spec.spec.devices.config[0]"));
        let (response, ok) = review(
            b"{not json",
            "gpu.nvidia.com",
            &FeatureGates::default(),
            &selector_env(36, &FeatureGates::default()),
            &NoFleet(vec![]),
        );
        assert!(!ok && response["response"]["status"]["code"] == 400);
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let (_, ok) = review(
            deep.as_bytes(),
            "gpu.nvidia.com",
            &FeatureGates::default(),
            &selector_env(36, &FeatureGates::default()),
            &NoFleet(vec![]),
        );
        assert!(!ok, "serde_json's recursion limit bounds the depth");
    }

    fn mps_claim(percentage: i64) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "mps", "namespace": "ml"}, "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": percentage}}}}}]}}})
    }

    /// What the webhook answers for `object`: its denial message, if any.
    fn webhook_denial(object: &Value, gates: &FeatureGates) -> Option<String> {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                        "operation": "CREATE", "object": object}});
        let (response, allowed) = review(
            body.to_string().as_bytes(),
            "gpu.nvidia.com",
            gates,
            &selector_env(37, gates),
            &NoFleet(Vec::new()),
        );
        (!allowed).then(|| response["response"]["status"]["message"].as_str().unwrap_or_default().to_string())
    }

    /// `simulate` on `object` (read from `c.yaml`) and the shipped classes.
    fn simulate_check(object: &Value, gates: &FeatureGates) -> anyhow::Result<()> {
        let classes = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deviceclasses"));
        let mut manifests = Vec::new();
        gpu_dra_simulate::manifests::read_each::<anyhow::Error>(&[classes], &mut |m| {
            manifests.push(m);
            Ok(())
        })
        .unwrap();
        manifests.push(gpu_dra_simulate::manifests::Manifest::tree("c.yaml".into(), object.clone()));
        let options = gpu_dra_simulate::Options { gates: Some(*gates), ..Default::default() };
        Ok(gpu_dra_simulate::run_manifests(manifests, &options, &mut std::io::sink(), &mut std::io::sink())?)
    }

    #[test]
    fn simulate_refuses_claims_exactly_when_and_as_the_webhook_denies_them() {
        for gates in ["", "MPSSupport=true"] {
            let gates: FeatureGates = gates.parse().unwrap();
            for percentage in [50, 150] {
                let object = mps_claim(percentage);
                let denial = webhook_denial(&object, &gates);
                match (simulate_check(&object, &gates), denial) {
                    (Ok(()), None) => {}
                    (Err(e), Some(message)) => assert_eq!(
                        e.to_string(),
                        format!("c.yaml: ResourceClaim ml/mps: the webhook denies it: {message}")
                    ),
                    (ours, theirs) => panic!("{gates:?} {percentage}: simulate {ours:?}, webhook {theirs:?}"),
                }
            }
        }
        let on: FeatureGates = "MPSSupport=true".parse().unwrap();
        assert!(webhook_denial(&mps_claim(150), &on).unwrap().ends_with("between 0 and 100, not 150"));
    }
}
