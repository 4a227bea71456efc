//! Opaque configs for our driver, checked as the webhook checks them: a
//! claim or template the webhook would deny is refused with the webhook's
//! message (the same code, `gpu_dra_driver::opaque_config::check_spec`), and
//! a class's configs are decoded by the same decoder, as the kubelet plugin
//! would fail them at prepare time.

use gpu_dra_driver::feature_gates::FeatureGates;
use gpu_dra_driver::names::DriverName;
use gpu_dra_driver::opaque_config;
use k8s_openapi::api::resource::v1::DeviceClass;

use super::inputs::Inputs;
use super::keys::key;

/// An object whose opaque config for our driver the webhook denies (a
/// claim, a template) or the plugin could not use (a class): where it was
/// read, which object, and the config's error.
#[derive(Debug, thiserror::Error)]
pub enum DeniedConfig {
    #[error("{origin}: ResourceClaim {key}: the webhook denies it: {error}")]
    Claim { origin: String, key: String, error: opaque_config::ConfigError },
    #[error("{origin}: ResourceClaimTemplate {key}: the webhook denies it: {error}")]
    Template { origin: String, key: String, error: opaque_config::ConfigError },
    #[error("{origin}: DeviceClass {name}: its config cannot be used: {error}")]
    Class { origin: String, name: String, error: opaque_config::ConfigError },
}

/// Checks every claim's, template's and class's opaque configs for our
/// driver with `gates` (the webhook's `--feature-gates`).
pub fn check(inputs: &Inputs, gates: &FeatureGates) -> Result<(), DeniedConfig> {
    let driver = DriverName::nvidia_default();
    let driver = driver.as_str();
    for c in &inputs.claims {
        let meta = &c.object.metadata;
        let spec = c.object.spec.clone().unwrap_or_default();
        opaque_config::check_spec(&spec, "spec", driver, gates).map_err(|error| DeniedConfig::Claim {
            origin: c.origin.clone(),
            key: key(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default()),
            error,
        })?;
    }
    for t in &inputs.templates {
        let meta = &t.object.metadata;
        let spec = t.object.spec.as_ref().and_then(|s| s.spec.clone()).unwrap_or_default();
        opaque_config::check_spec(&spec, "spec.spec", driver, gates).map_err(|error| DeniedConfig::Template {
            origin: t.origin.clone(),
            key: key(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default()),
            error,
        })?;
    }
    for c in &inputs.classes {
        check_class(&c.object, driver, gates).map_err(|error| DeniedConfig::Class {
            origin: c.origin.clone(),
            name: c.object.metadata.name.clone().unwrap_or_default(),
            error,
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
    use serde_json::json;

    use super::*;

    #[test]
    fn class_configs_are_decoded_with_their_path() {
        let class: DeviceClass = serde_json::from_value(json!({"metadata": {"name": "mps"}, "spec": {"config": [
            {"opaque": {"driver": "other.example.com", "parameters": {"x": 1}}},
            {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"apiVersion": "v0", "kind": "GpuConfig"}}}]}}))
        .unwrap();
        let mut inputs = Inputs::default();
        inputs.classes.push(crate::inputs::Located { origin: "k.yaml".into(), object: class });
        let err = check(&inputs, &FeatureGates::default()).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "k.yaml: DeviceClass mps: its config cannot be used: spec.config[1].opaque.parameters.apiVersion:"
            ),
            "{err}"
        );
    }
}
