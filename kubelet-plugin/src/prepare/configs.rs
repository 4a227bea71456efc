//! The claim's opaque configs for this driver, checked before anything is
//! written: a config this driver cannot honour fails the claim with the
//! field's path, instead of being ignored.

use gpu_dra_driver::feature_gates::FeatureGates;
use gpu_dra_driver::names::DriverName;
use gpu_dra_driver::opaque_config::{self, ConfigError, DeviceKind, ResolvedConfig, ResultToConfigure};
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::plan::PlannedDevice;

/// Each planned device's effective config, with `gates` on.
pub fn resolve(
    driver: &DriverName,
    claim: &ResourceClaim,
    planned: &[PlannedDevice],
    gates: &FeatureGates,
) -> Result<Vec<ResolvedConfig>, ConfigError> {
    let configs = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default();
    let results: Vec<ResultToConfigure<'_>> = planned
        .iter()
        .map(|d| ResultToConfigure {
            request: &d.request,
            device: &d.device,
            kind: match (d.is_mig, d.device.as_str().starts_with("gpu-vfio-")) {
                (true, _) => DeviceKind::Mig,
                (false, true) => DeviceKind::Vfio,
                (false, false) => DeviceKind::Gpu,
            },
        })
        .collect();
    opaque_config::resolve(driver, configs, &results, gates)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::test_support::allocated;
    use gpu_dra_driver::names::DeviceName;
    use gpu_dra_driver::opaque_config::ConfigSource;
    use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, OpaqueDeviceConfiguration};
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

    fn planned(device: &str, is_mig: bool) -> PlannedDevice {
        PlannedDevice {
            request: "gpu".into(),
            pool: "node-a".into(),
            device: DeviceName::new(device).unwrap(),
            is_mig,
            admin_access: false,
            share_id: None,
            consumed_capacity: Default::default(),
        }
    }

    #[test]
    fn configs_come_from_the_allocation() {
        let mut claim = allocated("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", "c", &["gpu-0"]);
        let devices = claim.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap();
        devices.config = Some(vec![DeviceAllocationConfiguration {
            source: "FromClaim".into(),
            requests: None,
            opaque: Some(OpaqueDeviceConfiguration {
                driver: "gpu.nvidia.com".into(),
                parameters: RawExtension(
                    serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}),
                ),
            }),
        }]);
        let driver = DriverName::nvidia_default();
        let resolved = resolve(&driver, &claim, &[planned("gpu-0", false)], &FeatureGates::default()).unwrap();
        assert_eq!(resolved[0].source, ConfigSource::Claim(0));
        let err =
            resolve(&driver, &claim, &[planned("gpu-1-mig-1g10gb-19-0", true)], &FeatureGates::default()).unwrap_err();
        assert!(err.message.contains("cannot apply GpuConfig"), "{err}");
    }
}
