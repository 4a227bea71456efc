//! Opaque configs for our driver, checked as the webhook checks them: a
//! claim or template the webhook would deny is refused with the webhook's
//! message (the same code, `service::webhook::review::check_configs`), and a
//! class's configs are decoded by the same decoder, as the kubelet plugin
//! would fail them at prepare time.

use anyhow::{Result, anyhow};
use gpu_dra_driver::feature_gates::FeatureGates;
use gpu_dra_driver::names::DriverName;
use gpu_dra_driver::opaque_config;
use k8s_openapi::api::resource::v1::DeviceClass;

use super::inputs::{Inputs, key};
use crate::service::webhook::review::check_configs;

/// Checks every claim's, template's and class's opaque configs for our
/// driver with `gates` (the webhook's `--feature-gates`).
pub fn check(inputs: &Inputs, gates: &FeatureGates) -> Result<()> {
    let driver = DriverName::nvidia_default();
    let driver = driver.as_str();
    for c in &inputs.claims {
        let meta = &c.object.metadata;
        let spec = c.object.spec.clone().unwrap_or_default();
        check_configs(&spec, "spec", driver, gates).map_err(|e| {
            anyhow!(
                "{}: ResourceClaim {}: the webhook denies it: {e}",
                c.origin,
                key(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default())
            )
        })?;
    }
    for t in &inputs.templates {
        let meta = &t.object.metadata;
        let spec = t.object.spec.as_ref().and_then(|s| s.spec.clone()).unwrap_or_default();
        check_configs(&spec, "spec.spec", driver, gates).map_err(|e| {
            anyhow!(
                "{}: ResourceClaimTemplate {}: the webhook denies it: {e}",
                t.origin,
                key(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default())
            )
        })?;
    }
    for c in &inputs.classes {
        check_class(&c.object, driver, gates).map_err(|e| {
            anyhow!(
                "{}: DeviceClass {}: its config cannot be used: {e}",
                c.origin,
                c.object.metadata.name.as_deref().unwrap_or_default()
            )
        })?;
    }
    Ok(())
}

fn check_class(class: &DeviceClass, driver: &str, gates: &FeatureGates) -> Result<(), opaque_config::ConfigError> {
    for (i, config) in class.spec.iter().flat_map(|s| s.config.iter().flatten()).enumerate() {
        let Some(opaque) = config.opaque.as_ref().filter(|o| o.driver == driver) else { continue };
        opaque_config::decode(&opaque.parameters.0, &format!("spec.config[{i}].opaque.parameters"), gates)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use serde_json::{Value, json};

    use super::*;
    use crate::service::webhook::review::{Fleet, review, selector_env};

    struct NoFleet;

    impl Fleet for NoFleet {
        fn warnings(&self, _: &ResourceClaim) -> Vec<String> {
            Vec::new()
        }
    }

    fn claim(percentage: i64) -> Value {
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
        let (response, allowed) =
            review(body.to_string().as_bytes(), "gpu.nvidia.com", gates, &selector_env(37, gates), &NoFleet);
        (!allowed).then(|| response["response"]["status"]["message"].as_str().unwrap_or_default().to_string())
    }

    fn simulate_check(object: &Value, gates: &FeatureGates) -> Result<()> {
        let mut inputs = Inputs::default();
        let claim: ResourceClaim = serde_json::from_value(object.clone()).unwrap();
        inputs.claims.push(super::super::inputs::Located { origin: "c.yaml".into(), object: claim });
        check(&inputs, gates)
    }

    #[test]
    fn claims_are_refused_exactly_when_and_as_the_webhook_denies_them() {
        for gates in ["", "MPSSupport=true"] {
            let gates: FeatureGates = gates.parse().unwrap();
            for percentage in [50, 150] {
                let object = claim(percentage);
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
        assert!(webhook_denial(&claim(150), &on).unwrap().ends_with("between 0 and 100, not 150"));
    }

    #[test]
    fn class_configs_are_decoded_with_their_path() {
        let class: DeviceClass = serde_json::from_value(json!({"metadata": {"name": "mps"}, "spec": {"config": [
            {"opaque": {"driver": "other.example.com", "parameters": {"x": 1}}},
            {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"apiVersion": "v0", "kind": "GpuConfig"}}}]}}))
        .unwrap();
        let mut inputs = Inputs::default();
        inputs.classes.push(super::super::inputs::Located { origin: "k.yaml".into(), object: class });
        let err = check(&inputs, &FeatureGates::default()).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "k.yaml: DeviceClass mps: its config cannot be used: spec.config[1].opaque.parameters.apiVersion:"
            ),
            "{err}"
        );
    }
}
