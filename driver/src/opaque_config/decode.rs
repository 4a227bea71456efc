//! Strict decoding and validation of one `opaque.parameters` object of
//! NVIDIA's config API (`resource.nvidia.com/v1beta1`), with errors that
//! name the JSON path.

use serde::Deserialize;
use serde_json::Value;

use super::error::ConfigError;
use crate::feature_gates::{FeatureGates, Gate};
use dra_cel::quantity::Quantity;

/// Which config kind a device takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Gpu,
    Mig,
    /// A GPU for passthrough (`gpu-vfio-<minor>`).
    Vfio,
}

impl DeviceKind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Mig => "mig",
            Self::Vfio => "vfio",
        }
    }
}

/// The API group/version of NVIDIA's opaque device configuration.
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// `GpuConfig`: parameters for a whole GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuConfig {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub sharing: Option<Sharing>,
}

/// `MigDeviceConfig`: parameters for a MIG device (no time-slicing
/// settings; NVIDIA's `MigDeviceSharing` has no `timeSlicingConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigDeviceConfig {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub sharing: Option<MigSharing>,
}

/// `VfioDeviceConfig`: parameters for a GPU passed through (NVIDIA's
/// `iommu` block). Every VFIO claim here gets the legacy container
/// `/dev/vfio/vfio` and its groups' nodes; `PreferIommuFD` falls back to
/// that, as NVIDIA's does on a node without `/dev/iommu`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VfioDeviceConfig {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub iommu: Option<IommuConfig>,
}

/// NVIDIA's `IOMMUConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IommuConfig {
    #[serde(default)]
    pub backend_policy: String,
    #[serde(default, rename = "enableAPIDevice")]
    pub enable_api_device: Option<bool>,
}

/// `GpuSharing`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sharing {
    pub strategy: String,
    #[serde(default)]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    #[serde(default)]
    pub mps_config: Option<MpsConfig>,
}

/// `MigDeviceSharing`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigSharing {
    pub strategy: String,
    #[serde(default)]
    pub mps_config: Option<MpsConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeSlicingConfig {
    #[serde(default)]
    pub interval: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsConfig {
    #[serde(default)]
    pub default_active_thread_percentage: Option<i64>,
    #[serde(default)]
    pub default_pinned_device_memory_limit: Option<String>,
    #[serde(default)]
    pub default_per_device_pinned_memory_limit: Option<std::collections::BTreeMap<String, String>>,
}

/// A decoded, validated config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceConfig {
    Gpu(GpuConfig),
    Mig(MigDeviceConfig),
    Vfio(VfioDeviceConfig),
}

impl DeviceConfig {
    /// NVIDIA's defaults: no sharing (whole devices, exclusive).
    pub fn default_for(kind: DeviceKind) -> Self {
        match kind {
            DeviceKind::Gpu => {
                Self::Gpu(GpuConfig { api_version: API_VERSION.into(), kind: "GpuConfig".into(), sharing: None })
            }
            DeviceKind::Mig => Self::Mig(MigDeviceConfig {
                api_version: API_VERSION.into(),
                kind: "MigDeviceConfig".into(),
                sharing: None,
            }),
            DeviceKind::Vfio => Self::Vfio(VfioDeviceConfig {
                api_version: API_VERSION.into(),
                kind: "VfioDeviceConfig".into(),
                iommu: None,
            }),
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Gpu(_) => "GpuConfig",
            Self::Mig(_) => "MigDeviceConfig",
            Self::Vfio(_) => "VfioDeviceConfig",
        }
    }

    /// The device kind this config may be applied to.
    pub fn applies_to(&self) -> DeviceKind {
        match self {
            Self::Gpu(_) => DeviceKind::Gpu,
            Self::Mig(_) => DeviceKind::Mig,
            Self::Vfio(_) => DeviceKind::Vfio,
        }
    }
}

/// Decodes `parameters` (found at `path`) strictly and validates it with
/// the gates on.
pub fn decode(parameters: &Value, path: &str, gates: &FeatureGates) -> Result<DeviceConfig, ConfigError> {
    let field = |name: &str| format!("{path}.{name}");
    let Some(object) = parameters.as_object() else {
        return Err(ConfigError::new(path, "must be an object with apiVersion and kind"));
    };
    let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    if api_version != API_VERSION {
        return Err(ConfigError::new(
            field("apiVersion"),
            format!("{api_version:?} is not supported: use {API_VERSION:?}"),
        ));
    }
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
    let config = match kind {
        "GpuConfig" => DeviceConfig::Gpu(strict(parameters, path)?),
        "MigDeviceConfig" => DeviceConfig::Mig(strict(parameters, path)?),
        "VfioDeviceConfig" if gates.enabled(Gate::Passthrough) => DeviceConfig::Vfio(strict(parameters, path)?),
        "VfioDeviceConfig" => {
            return Err(ConfigError::new(
                field("kind"),
                "VfioDeviceConfig needs the PassthroughSupport feature gate (off here): no GPU is published for \
                 passthrough; turn the gate on, or use GpuConfig",
            ));
        }
        "ComputeDomainChannelConfig" | "ComputeDomainDaemonConfig" => {
            return Err(ConfigError::new(
                field("kind"),
                format!(
                    "{kind} configures a ComputeDomain's devices (driver compute-domain.nvidia.com), not a GPU: \
                     move it to a config whose opaque.driver is compute-domain.nvidia.com"
                ),
            ));
        }
        other => {
            return Err(ConfigError::new(
                field("kind"),
                format!("unknown kind {other:?}: use GpuConfig, MigDeviceConfig or VfioDeviceConfig"),
            ));
        }
    };
    validate(&config, path, gates)?;
    Ok(config)
}

/// Serde with unknown fields refused, the error naming the JSON path (as
/// NVIDIA's strict decoder does for user input).
fn strict<T: serde::de::DeserializeOwned>(parameters: &Value, path: &str) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(parameters).map_err(|e| {
        let inner = e.path().to_string();
        let at = if inner == "." { path.to_string() } else { format!("{path}.{inner}") };
        ConfigError::new(at, format!("{}: remove or correct the field", e.inner()))
    })
}

/// The time-slice intervals of `timeSlicingConfig.interval`, and the
/// value `nvidia-smi compute-policy --set-timeslice` takes for each.
pub const INTERVALS: [(&str, u8); 4] = [("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)];

/// The smallest pinned-memory limit NVIDIA accepts.
const MIN_PINNED_BYTES: i128 = 1024 * 1024;

/// NVIDIA's `Validate`: a sharing strategy needs its feature gate
/// (`TimeSlicingSettings`, `MPSSupport`; off by default, as there); the
/// settings must belong to the strategy and be in range.
fn validate(config: &DeviceConfig, path: &str, gates: &FeatureGates) -> Result<(), ConfigError> {
    let (strategy, time_slicing, mps) = match config {
        DeviceConfig::Gpu(c) => match &c.sharing {
            Some(s) => (s.strategy.as_str(), s.time_slicing_config.as_ref(), s.mps_config.as_ref()),
            None => return Ok(()),
        },
        DeviceConfig::Mig(c) => match &c.sharing {
            Some(s) => (s.strategy.as_str(), None, s.mps_config.as_ref()),
            None => return Ok(()),
        },
        DeviceConfig::Vfio(c) => {
            let policy = c.iommu.as_ref().map_or("", |i| i.backend_policy.as_str());
            return match policy {
                "" | "LegacyOnly" | "PreferIommuFD" => Ok(()),
                other => Err(ConfigError::new(
                    format!("{path}.iommu.backendPolicy"),
                    format!(
                        "unknown IOMMU backend policy: {other}, supported IOMMU backend policies: LegacyOnly, PreferIommuFD"
                    ),
                )),
            };
        }
    };
    let at = |field: &str| format!("{path}.sharing.{field}");
    let gate = match strategy {
        "TimeSlicing" => Gate::TimeSlicingSettings,
        "MPS" => Gate::MpsSupport,
        "Fabric" => {
            return Err(ConfigError::new(
                at("strategy"),
                "fabric GPU sharing strategy is not enabled: remove `sharing`",
            ));
        }
        other => {
            return Err(ConfigError::new(
                at("strategy"),
                format!(
                    "unknown GPU sharing strategy: {other} (TimeSlicing or MPS); remove `sharing` for exclusive devices"
                ),
            ));
        }
    };
    if !gates.enabled(gate) {
        return Err(ConfigError::new(
            at("strategy"),
            format!(
                "{strategy:?} is selected as the GPU sharing strategy, but the {:?} feature gate is not enabled: \
                 remove `sharing` for whole, unshared devices",
                gate.name()
            ),
        ));
    }
    match gate {
        Gate::TimeSlicingSettings => {
            if mps.is_some() {
                return Err(ConfigError::new(at("mpsConfig"), "cannot use MpsConfig with the 'TimeSlicing' strategy"));
            }
            if let Some(interval) = time_slicing.and_then(|t| t.interval.as_deref())
                && !INTERVALS.iter().any(|(name, _)| *name == interval)
            {
                return Err(ConfigError::new(
                    at("timeSlicingConfig.interval"),
                    format!("unknown time-slice interval {interval:?}: use Default, Short, Medium or Long"),
                ));
            }
        }
        _ => {
            if time_slicing.is_some() {
                return Err(ConfigError::new(
                    at("timeSlicingConfig"),
                    "cannot use TimeSlicingConfig with the 'MPS' strategy",
                ));
            }
            if let Some(mps) = mps {
                validate_mps(mps, &at("mpsConfig"))?;
            }
        }
    }
    Ok(())
}

fn validate_mps(mps: &MpsConfig, path: &str) -> Result<(), ConfigError> {
    if let Some(p) = mps.default_active_thread_percentage
        && !(0..=100).contains(&p)
    {
        return Err(ConfigError::new(
            format!("{path}.defaultActiveThreadPercentage"),
            format!("active thread percentage must be between 0 and 100, not {p}"),
        ));
    }
    let limit = |field: String, text: &str| -> Result<(), ConfigError> {
        let bytes =
            Quantity::parse(text).map_err(|e| ConfigError::new(&field, format!("{e}; write a size such as 10Gi")))?;
        if bytes.nanos() / 1_000_000_000 < MIN_PINNED_BYTES {
            return Err(ConfigError::new(field, format!("{text} is less than the minimum of 1Mi")));
        }
        Ok(())
    };
    if let Some(text) = &mps.default_pinned_device_memory_limit {
        limit(format!("{path}.defaultPinnedDeviceMemoryLimit"), text)?;
    }
    for (device, text) in mps.default_per_device_pinned_memory_limit.iter().flatten() {
        limit(format!("{path}.defaultPerDevicePinnedMemoryLimit.{device}"), text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const AT: &str = "status.allocation.devices.config[0].opaque.parameters";

    fn message(value: Value) -> String {
        decode(&value, AT, &FeatureGates::default()).unwrap_err().to_string()
    }

    fn gated(value: Value, gates: &str) -> Result<DeviceConfig, ConfigError> {
        decode(&value, AT, &gates.parse().unwrap())
    }

    /// NVIDIA's `Validate` with the gates on: each strategy's own settings,
    /// in range, named by their path.
    #[test]
    fn with_the_gates_on_sharing_settings_are_checked() {
        let on = "TimeSlicingSettings=true,MPSSupport=true";
        let ts = |sharing: Value| json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": sharing});
        assert!(gated(ts(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})), on).is_ok());
        let err = gated(ts(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}})), on)
            .unwrap_err();
        assert_eq!(err.field, format!("{AT}.sharing.timeSlicingConfig.interval"));
        let err = gated(ts(json!({"strategy": "TimeSlicing", "mpsConfig": {}})), on).unwrap_err();
        assert_eq!(err.message, "cannot use MpsConfig with the 'TimeSlicing' strategy");
        let mps = |config: Value| ts(json!({"strategy": "MPS", "mpsConfig": config}));
        assert!(
            gated(mps(json!({"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"})), on)
                .is_ok()
        );
        let err = gated(mps(json!({"defaultActiveThreadPercentage": 101})), on).unwrap_err();
        assert_eq!(err.field, format!("{AT}.sharing.mpsConfig.defaultActiveThreadPercentage"));
        let err = gated(mps(json!({"defaultPinnedDeviceMemoryLimit": "512Ki"})), on).unwrap_err();
        assert!(err.message.contains("minimum of 1Mi"), "{err}");
        let err = gated(mps(json!({"defaultPerDevicePinnedMemoryLimit": {"0": "lots"}})), on).unwrap_err();
        assert_eq!(err.field, format!("{AT}.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.0"));
        // One gate does not open the other.
        let err = gated(mps(json!({})), "TimeSlicingSettings=true").unwrap_err();
        assert!(err.message.contains(r#"the "MPSSupport" feature gate is not enabled"#), "{err}");
        let mig = json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}});
        assert!(gated(mig, on).is_ok());
    }

    #[test]
    fn both_kinds_decode_without_sharing() {
        let gpu =
            decode(&json!({"apiVersion": API_VERSION, "kind": "GpuConfig"}), AT, &FeatureGates::default()).unwrap();
        assert_eq!(gpu, DeviceConfig::default_for(DeviceKind::Gpu));
        let mig = decode(&json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig"}), AT, &FeatureGates::default())
            .unwrap();
        assert_eq!(mig.applies_to(), DeviceKind::Mig);
    }

    #[test]
    fn unknown_and_mistyped_fields_name_their_path() {
        let m = message(json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharingg": {}}));
        assert!(m.starts_with(&format!("{AT}.sharingg: unknown field `sharingg`")), "{m}");
        let m = message(json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "half"}}}));
        assert!(m.starts_with(&format!("{AT}.sharing.mpsConfig.defaultActiveThreadPercentage: invalid type")), "{m}");
        let m = message(json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}}));
        assert!(m.contains("sharing.timeSlicingConfig: unknown field"), "MIG sharing has no time slicing: {m}");
    }

    #[test]
    fn api_version_and_kind_are_checked() {
        let m = message(json!({"apiVersion": "resource.nvidia.com/v1alpha1", "kind": "GpuConfig"}));
        assert!(m.starts_with(&format!("{AT}.apiVersion:")) && m.contains(API_VERSION), "{m}");
        let m = message(json!({"apiVersion": API_VERSION, "kind": "VfioDeviceConfig"}));
        assert!(m.contains(".kind: VfioDeviceConfig needs the PassthroughSupport feature gate"), "{m}");
        let m = message(json!({"apiVersion": API_VERSION, "kind": "ComputeDomainChannelConfig"}));
        assert!(m.contains("configures a ComputeDomain's devices") && !m.contains("VFIO"), "{m}");
        let on: FeatureGates = "PassthroughSupport=true".parse().unwrap();
        let vfio = json!({"apiVersion": API_VERSION, "kind": "VfioDeviceConfig",
            "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": true}});
        assert!(matches!(decode(&vfio, "p", &on), Ok(DeviceConfig::Vfio(_))));
        let bad = json!({"apiVersion": API_VERSION, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "Any"}});
        assert!(decode(&bad, "p", &on).unwrap_err().to_string().contains("p.iommu.backendPolicy: unknown IOMMU"));
        let m = message(json!({"apiVersion": API_VERSION, "kind": "TpuConfig"}));
        assert!(m.contains("unknown kind \"TpuConfig\""), "{m}");
        assert!(message(json!("GpuConfig")).contains("must be an object"));
    }

    #[test]
    fn sharing_strategies_are_refused_as_nvidia_does_with_its_gates_off() {
        let m = message(json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}));
        assert!(
            m.contains(r#"sharing.strategy: "TimeSlicing" is selected as the GPU sharing strategy, but the "TimeSlicingSettings" feature gate is not enabled"#),
            "{m}"
        );
        let m = message(json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}));
        assert!(m.contains(r#"the "MPSSupport" feature gate"#), "{m}");
        assert!(
            message(json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "Fabric"}}))
                .contains("fabric GPU sharing strategy is not enabled")
        );
        assert!(
            message(json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "Spatial"}}))
                .contains("unknown GPU sharing strategy: Spatial")
        );
    }
}
