//! Strict decoding and validation of one `opaque.parameters` object of
//! NVIDIA's config API (`resource.nvidia.com/v1beta1`), with errors that
//! name the JSON path.

use serde::Deserialize;
use serde_json::Value;

use super::{ConfigError, DeviceKind};

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
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Gpu(_) => "GpuConfig",
            Self::Mig(_) => "MigDeviceConfig",
        }
    }

    /// The device kind this config may be applied to.
    pub fn applies_to(&self) -> DeviceKind {
        match self {
            Self::Gpu(_) => DeviceKind::Gpu,
            Self::Mig(_) => DeviceKind::Mig,
        }
    }
}

/// Decodes `parameters` (found at `path`) strictly and validates it.
pub fn decode(parameters: &Value, path: &str) -> Result<DeviceConfig, ConfigError> {
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
        "VfioDeviceConfig" | "ComputeDomainChannelConfig" | "ComputeDomainDaemonConfig" => {
            return Err(ConfigError::new(
                field("kind"),
                format!(
                    "{kind} is not supported by this driver: it publishes no VFIO or ComputeDomain devices; \
                     use GpuConfig or MigDeviceConfig"
                ),
            ));
        }
        other => {
            return Err(ConfigError::new(
                field("kind"),
                format!("unknown kind {other:?}: use GpuConfig or MigDeviceConfig"),
            ));
        }
    };
    validate(&config, path)?;
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

/// NVIDIA's `Validate`: a sharing strategy needs its feature gate
/// (`TimeSlicingSettings`, `MPSSupport`), which are off there by default.
/// This driver does not implement GPU sharing, so the gates are off here
/// for good and any strategy is refused, before its settings are looked at,
/// exactly as NVIDIA's driver does with the gates off.
fn validate(config: &DeviceConfig, path: &str) -> Result<(), ConfigError> {
    let strategy = match config {
        DeviceConfig::Gpu(c) => c.sharing.as_ref().map(|s| s.strategy.as_str()),
        DeviceConfig::Mig(c) => c.sharing.as_ref().map(|s| s.strategy.as_str()),
    };
    let Some(strategy) = strategy else { return Ok(()) };
    let gate = match strategy {
        "TimeSlicing" => "TimeSlicingSettings",
        "MPS" => "MPSSupport",
        "Fabric" => {
            return Err(ConfigError::new(
                format!("{path}.sharing.strategy"),
                "fabric GPU sharing strategy is not enabled: remove `sharing`",
            ));
        }
        other => {
            return Err(ConfigError::new(
                format!("{path}.sharing.strategy"),
                format!(
                    "unknown GPU sharing strategy: {other} (TimeSlicing or MPS); remove `sharing` for exclusive devices"
                ),
            ));
        }
    };
    Err(ConfigError::new(
        format!("{path}.sharing.strategy"),
        format!(
            "{strategy:?} is selected as the GPU sharing strategy, but the {gate:?} feature gate is not enabled: \
             this driver gives each claim whole devices; remove `sharing`, or share a device through \
             consumable capacity instead"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const AT: &str = "status.allocation.devices.config[0].opaque.parameters";

    fn message(value: Value) -> String {
        decode(&value, AT).unwrap_err().to_string()
    }

    #[test]
    fn both_kinds_decode_without_sharing() {
        let gpu = decode(&json!({"apiVersion": API_VERSION, "kind": "GpuConfig"}), AT).unwrap();
        assert_eq!(gpu, DeviceConfig::default_for(DeviceKind::Gpu));
        let mig = decode(&json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig"}), AT).unwrap();
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
        assert!(m.contains(".kind: VfioDeviceConfig is not supported"), "{m}");
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
