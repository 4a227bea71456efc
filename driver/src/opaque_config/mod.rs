//! NVIDIA's opaque device configuration (`resource.nvidia.com/v1beta1`
//! `GpuConfig` / `MigDeviceConfig`), decoded and resolved the way NVIDIA's
//! kubelet plugin does it, so claims written for that driver behave the
//! same here: class configs first, then claim configs, the later entry
//! winning; entries for other drivers ignored; every entry for this driver
//! decoded strictly, used or not; the chosen config must fit the device.

mod decode;
mod error;

pub use decode::{
    API_VERSION, DeviceConfig, DeviceKind, GpuConfig, INTERVALS, IommuConfig, MigDeviceConfig, VfioDeviceConfig, decode,
};
pub use error::ConfigError;

use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaimSpec};

use crate::feature_gates::FeatureGates;
use crate::names::{DeviceName, DriverName};

/// One allocation result to configure.
#[derive(Debug, Clone, Copy)]
pub struct ResultToConfigure<'a> {
    /// As in the allocation result: `req` or `req/sub`.
    pub request: &'a str,
    pub device: &'a DeviceName,
    pub kind: DeviceKind,
}

/// Where a device's config came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// No entry applied: NVIDIA's default for the device kind.
    Default,
    /// `status.allocation.devices.config[i]`, copied from the DeviceClass.
    Class(usize),
    /// `status.allocation.devices.config[i]`, from the claim.
    Claim(usize),
}

/// The config a device gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedConfig {
    pub config: DeviceConfig,
    pub source: ConfigSource,
}

const CONFIG_PATH: &str = "status.allocation.devices.config";

/// The effective config of each of `results`, in order, with `gates` on.
pub fn resolve(
    driver: &DriverName,
    configs: &[DeviceAllocationConfiguration],
    results: &[ResultToConfigure<'_>],
    gates: &FeatureGates,
) -> Result<Vec<ResolvedConfig>, ConfigError> {
    let mut ours: Vec<(ConfigSource, Option<&[String]>, DeviceConfig)> = Vec::new();
    for (index, entry) in configs.iter().enumerate() {
        let Some(opaque) = entry.opaque.as_ref().filter(|o| o.driver == driver.as_str()) else { continue };
        let source = match entry.source.as_str() {
            "FromClass" => ConfigSource::Class(index),
            "FromClaim" => ConfigSource::Claim(index),
            other => {
                return Err(ConfigError::new(
                    format!("{CONFIG_PATH}[{index}].source"),
                    format!("{other:?} is neither FromClass nor FromClaim"),
                ));
            }
        };
        let config = decode(&opaque.parameters.0, &format!("{CONFIG_PATH}[{index}].opaque.parameters"), gates)?;
        ours.push((source, entry.requests.as_deref(), config));
    }
    // Class entries take effect before claim entries, whatever their order.
    ours.sort_by_key(|(source, _, _)| matches!(source, ConfigSource::Claim(_)));

    results
        .iter()
        .map(|result| {
            let chosen =
                ours.iter().rev().find(|(_, requests, _)| applies(requests.unwrap_or_default(), result.request));
            let Some((source, _, config)) = chosen else {
                return Ok(ResolvedConfig {
                    config: DeviceConfig::default_for(result.kind),
                    source: ConfigSource::Default,
                });
            };
            if config.applies_to() != result.kind {
                let index = match source {
                    ConfigSource::Class(i) | ConfigSource::Claim(i) => *i,
                    ConfigSource::Default => 0,
                };
                return Err(ConfigError::new(
                    format!("{CONFIG_PATH}[{index}].opaque.parameters.kind"),
                    format!(
                        "cannot apply {} to device {} of type {}: use {} for it, or list only the requests it is for",
                        config.kind_name(),
                        result.device,
                        result.kind.as_str(),
                        DeviceConfig::default_for(result.kind).kind_name()
                    ),
                ));
            }
            Ok(ResolvedConfig { config: config.clone(), source: *source })
        })
        .collect()
}

/// Every opaque config entry for `driver` in a claim's spec must decode
/// strictly: the webhook denies the claim otherwise, and `simulate` refuses
/// it with the same message (one check, so the two cannot disagree).
/// `spec_path` roots the error's JSON path (`spec`, or `spec.spec` in a
/// template).
pub fn check_spec(
    spec: &ResourceClaimSpec,
    spec_path: &str,
    driver: &str,
    gates: &FeatureGates,
) -> Result<(), ConfigError> {
    let configs = spec.devices.as_ref().and_then(|d| d.config.as_ref());
    for (i, config) in configs.into_iter().flatten().enumerate() {
        let Some(opaque) = config.opaque.as_ref() else { continue };
        if opaque.driver != driver {
            continue;
        }
        let path = format!("{spec_path}.devices.config[{i}].opaque.parameters");
        decode(&opaque.parameters.0, &path, gates)?;
    }
    Ok(())
}

/// An entry without requests applies to every result; one naming `req`
/// applies to `req` and its subrequests `req/sub`.
fn applies(requests: &[String], result_request: &str) -> bool {
    let base = result_request.split_once('/').map_or(result_request, |(base, _)| base);
    requests.is_empty() || requests.iter().any(|r| r == result_request || r == base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration;
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::json;

    fn entry(source: &str, requests: &[&str], driver: &str, kind: &str) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: source.into(),
            requests: (!requests.is_empty()).then(|| requests.iter().map(|r| r.to_string()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.into(),
                parameters: RawExtension(json!({"apiVersion": API_VERSION, "kind": kind})),
            }),
        }
    }

    fn names() -> (DeviceName, DeviceName) {
        (DeviceName::new("gpu-0").unwrap(), DeviceName::new("gpu-1-mig-1g10gb-19-0").unwrap())
    }

    fn sources(configs: &[DeviceAllocationConfiguration], results: &[ResultToConfigure<'_>]) -> Vec<ConfigSource> {
        resolve(&DriverName::nvidia_default(), configs, results, &FeatureGates::default())
            .unwrap()
            .into_iter()
            .map(|r| r.source)
            .collect()
    }

    #[test]
    fn claim_entries_win_over_class_entries_and_later_over_earlier() {
        let (gpu, _) = names();
        let result = [ResultToConfigure { request: "gpu", device: &gpu, kind: DeviceKind::Gpu }];
        let configs = vec![
            entry("FromClaim", &[], "gpu.nvidia.com", "GpuConfig"),
            entry("FromClass", &[], "gpu.nvidia.com", "GpuConfig"),
            entry("FromClaim", &["gpu"], "gpu.nvidia.com", "GpuConfig"),
        ];
        assert_eq!(sources(&configs, &result), [ConfigSource::Claim(2)]);
        assert_eq!(sources(&configs[..2], &result), [ConfigSource::Claim(0)], "claim beats class whatever the order");
        assert_eq!(sources(&configs[1..2], &result), [ConfigSource::Class(0)], "indices are the entry's own");
        assert_eq!(sources(&[], &result), [ConfigSource::Default]);
    }

    #[test]
    fn requests_filter_and_match_subrequests() {
        let (gpu, mig) = names();
        let results = [
            ResultToConfigure { request: "big/h100", device: &gpu, kind: DeviceKind::Gpu },
            ResultToConfigure { request: "small", device: &mig, kind: DeviceKind::Mig },
        ];
        let configs = vec![
            entry("FromClaim", &["big"], "gpu.nvidia.com", "GpuConfig"),
            entry("FromClaim", &["small"], "gpu.nvidia.com", "MigDeviceConfig"),
            entry("FromClaim", &[], "other.example.com", "Anything"),
        ];
        assert_eq!(sources(&configs, &results), [ConfigSource::Claim(0), ConfigSource::Claim(1)]);
    }

    #[test]
    fn a_config_of_the_wrong_kind_is_refused() {
        let (_, mig) = names();
        let result = [ResultToConfigure { request: "small", device: &mig, kind: DeviceKind::Mig }];
        let configs = vec![entry("FromClass", &[], "gpu.nvidia.com", "GpuConfig")];
        let err = resolve(&DriverName::nvidia_default(), &configs, &result, &FeatureGates::default()).unwrap_err();
        assert_eq!(err.field, "status.allocation.devices.config[0].opaque.parameters.kind");
        assert!(err.message.starts_with("cannot apply GpuConfig to device gpu-1-mig-1g10gb-19-0 of type mig"), "{err}");
    }

    #[test]
    fn every_entry_for_us_is_decoded_even_if_unused() {
        let (gpu, _) = names();
        let result = [ResultToConfigure { request: "gpu", device: &gpu, kind: DeviceKind::Gpu }];
        let mut bad = entry("FromClaim", &["other"], "gpu.nvidia.com", "GpuConfig");
        if let Some(o) = bad.opaque.as_mut() {
            o.parameters.0["extra"] = json!(1);
        }
        let err = resolve(&DriverName::nvidia_default(), &[bad], &result, &FeatureGates::default()).unwrap_err();
        assert!(err.to_string().starts_with("status.allocation.devices.config[0].opaque.parameters.extra"), "{err}");
        let mut odd = entry("FromClaim", &[], "gpu.nvidia.com", "GpuConfig");
        odd.source = "FromNowhere".into();
        let err = resolve(&DriverName::nvidia_default(), &[odd], &result, &FeatureGates::default()).unwrap_err();
        assert_eq!(err.field, "status.allocation.devices.config[0].source");
    }

    /// A claim spec's configs for this driver are decoded with their path
    /// under `spec_path`; other drivers' are not ours to judge.
    #[test]
    fn a_specs_configs_are_checked_with_their_path() {
        let spec: ResourceClaimSpec = serde_json::from_value(json!({"devices": {"config": [
            {"opaque": {"driver": "other.example.com", "parameters": {"anything": true}}},
            {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"apiVersion": API_VERSION, "kind": "GpuConfig"}}},
            {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"apiVersion": "v0", "kind": "GpuConfig"}}}]}}))
        .unwrap();
        let gates = FeatureGates::default();
        let error = check_spec(&spec, "spec.spec", "gpu.nvidia.com", &gates).unwrap_err();
        assert_eq!(error.field, "spec.spec.devices.config[2].opaque.parameters.apiVersion");
        let mut valid = spec.clone();
        valid.devices.as_mut().and_then(|d| d.config.as_mut()).unwrap().truncate(2);
        assert_eq!(check_spec(&valid, "spec", "gpu.nvidia.com", &gates), Ok(()));
    }
}
