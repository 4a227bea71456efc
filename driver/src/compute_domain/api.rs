//! `computedomains.resource.nvidia.com/v1beta1` and the opaque configs of
//! the `compute-domain.nvidia.com` driver, field for field NVIDIA's
//! (`api/nvidia.com/resource/v1beta1/computedomain.go`,
//! `computedomainconfig.go`), so that their manifests and the claims their
//! controller wrote decode here unchanged.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// API group of the custom resource and of the opaque configs.
pub const GROUP: &str = "resource.nvidia.com";
pub const VERSION: &str = "v1beta1";
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";
pub const KIND: &str = "ComputeDomain";
pub const PLURAL: &str = "computedomains";
pub const CHANNEL_CONFIG_KIND: &str = "ComputeDomainChannelConfig";
pub const DAEMON_CONFIG_KIND: &str = "ComputeDomainDaemonConfig";
/// What to do about a domain the driver cannot read (a field past the
/// bound of its type, stored before the chart's CRD had the bound).
pub const UNDECODABLE_FIX: &str = "A ComputeDomain's spec cannot change: delete it and create it again \
     with values in range (spec.numNodes: 0 to 4294967295), which the chart's CRD also enforces";

/// A set of nodes prepared to run one multi-node workload: an IMEX daemon
/// on each, sharing one NVLink clique, and a channel for each workload pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomain {
    #[serde(default = "api_version")]
    pub api_version: String,
    #[serde(default = "kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ComputeDomainSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ComputeDomainStatus>,
}

fn api_version() -> String {
    API_VERSION.to_owned()
}

fn kind() -> String {
    KIND.to_owned()
}

impl ComputeDomain {
    pub fn new(namespace: &str, name: &str, spec: ComputeDomainSpec) -> Self {
        Self {
            api_version: api_version(),
            kind: kind(),
            metadata: ObjectMeta {
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }
}

impl k8s_openapi::Resource for ComputeDomain {
    const API_VERSION: &'static str = API_VERSION;
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = KIND;
    const VERSION: &'static str = VERSION;
    const URL_PATH_SEGMENT: &'static str = PLURAL;
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::ListableResource for ComputeDomain {
    const LIST_KIND: &'static str = "ComputeDomainList";
}

impl k8s_openapi::Metadata for ComputeDomain {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainSpec {
    /// Nodes expected; 0 (the default) means "as many as the workload
    /// lands on". Only the overall status uses it (NVIDIA deprecates it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub num_nodes: u32,
    pub channel: Option<ChannelSpec>,
}

impl ComputeDomainSpec {
    /// `numNodes` and the workload template's name, channel mode left to
    /// its default: the shape of NVIDIA's examples.
    pub fn with_template(num_nodes: u32, template: &str) -> Self {
        Self {
            num_nodes,
            channel: Some(ChannelSpec {
                resource_claim_template: TemplateName { name: template.to_owned() },
                allocation_mode: None,
            }),
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelSpec {
    pub resource_claim_template: TemplateName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<AllocationMode>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TemplateName {
    pub name: String,
}

/// How many IMEX channels a workload claim gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocationMode {
    /// Channel 0 only.
    #[default]
    Single,
    /// Every channel the driver offers (`/dev/nvidia-caps-imex-channels/channel0..N-1`).
    All,
}

impl AllocationMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Single => "Single",
            Self::All => "All",
        }
    }
}

/// Ready or NotReady, for the domain and for each node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Readiness {
    Ready,
    #[default]
    NotReady,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ComputeDomainStatus {
    pub status: Readiness,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<ComputeDomainNode>,
}

/// One node of a domain: where its IMEX daemon listens and whether it is
/// ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainNode {
    pub name: String,
    #[serde(rename = "ipAddress")]
    pub ip_address: String,
    #[serde(rename = "cliqueID")]
    pub clique_id: String,
    /// Stable per (clique, node) while the node stays in the domain.
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub status: Readiness,
}

/// `opaque.parameters` of a workload's channel request (NVIDIA's
/// `ComputeDomainChannelConfig`): which domain the channel belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelConfig {
    pub api_version: String,
    pub kind: String,
    #[serde(rename = "domainID")]
    pub domain_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<AllocationMode>,
}

impl ChannelConfig {
    pub fn new(domain_id: &str, allocation_mode: AllocationMode) -> Self {
        Self {
            api_version: api_version(),
            kind: CHANNEL_CONFIG_KIND.to_owned(),
            domain_id: domain_id.to_owned(),
            allocation_mode: Some(allocation_mode),
        }
    }
}

/// `opaque.parameters` of a daemon request (NVIDIA's
/// `ComputeDomainDaemonConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonConfig {
    pub api_version: String,
    pub kind: String,
    #[serde(rename = "domainID")]
    pub domain_id: String,
}

/// A decoded `compute-domain.nvidia.com` opaque config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainConfig {
    Channel(ChannelConfig),
    Daemon(DaemonConfig),
}

impl DomainConfig {
    pub fn domain_id(&self) -> &str {
        match self {
            Self::Channel(c) => &c.domain_id,
            Self::Daemon(d) => &d.domain_id,
        }
    }
}

/// Why an opaque config is not one of ours.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{path}: apiVersion {found:?} is not {API_VERSION}")]
    ApiVersion { path: String, found: String },
    #[error(
        "{path}: kind {found:?} is not a compute-domain.nvidia.com config (allowed: {CHANNEL_CONFIG_KIND}, {DAEMON_CONFIG_KIND})"
    )]
    Kind { path: String, found: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}.domainID: empty; it names the ComputeDomain's UID")]
    NoDomain { path: String },
    #[error("{path}.domainID: {found:?} is not a UID (it names the ComputeDomain's metadata.uid)")]
    NotAUid { path: String, found: String },
}

/// Decodes strictly (unknown fields refused, as NVIDIA's strict decoder
/// does for user input); `path` names the field in errors.
pub fn decode_config(path: &str, parameters: &serde_json::Value) -> Result<DomainConfig, ConfigError> {
    let field = |name: &str| parameters.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    let found_version = field("apiVersion");
    if found_version != API_VERSION {
        return Err(ConfigError::ApiVersion { path: format!("{path}.apiVersion"), found: found_version });
    }
    let invalid = |e: serde_json::Error| ConfigError::Invalid { path: path.to_owned(), message: e.to_string() };
    let config = match field("kind").as_str() {
        CHANNEL_CONFIG_KIND => DomainConfig::Channel(strict(parameters).map_err(invalid)?),
        DAEMON_CONFIG_KIND => DomainConfig::Daemon(strict(parameters).map_err(invalid)?),
        other => return Err(ConfigError::Kind { path: format!("{path}.kind"), found: other.to_owned() }),
    };
    let id = config.domain_id();
    if id.is_empty() {
        return Err(ConfigError::NoDomain { path: path.to_owned() });
    }
    // It becomes a directory name on the node: a UID and nothing else.
    if uuid::Uuid::try_parse(id).is_err() || id.len() != 36 {
        return Err(ConfigError::NotAUid { path: path.to_owned(), found: id.chars().take(64).collect() });
    }
    Ok(config)
}

/// Deserializes refusing fields the type does not have.
fn strict<T: serde::de::DeserializeOwned + Serialize>(value: &serde_json::Value) -> Result<T, serde_json::Error> {
    let typed: T = serde_json::from_value(value.clone())?;
    let back = serde_json::to_value(&typed)?;
    if let (Some(given), Some(known)) = (value.as_object(), back.as_object())
        && let Some(unknown) = given.keys().find(|k| !known.contains_key(*k) && !given[*k].is_null())
    {
        return Err(serde::de::Error::custom(format_args!("unknown field `{unknown}`")));
    }
    Ok(typed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nvidias_example_decodes() {
        let yaml = "apiVersion: resource.nvidia.com/v1beta1\nkind: ComputeDomain\nmetadata:\n  name: imex-channel-injection\nspec:\n  numNodes: 1\n  channel:\n    resourceClaimTemplate:\n      name: imex-channel-0\n";
        let cd: ComputeDomain = serde_yaml_ng::from_str(yaml).unwrap();
        assert_eq!(cd.spec.num_nodes, 1);
        let channel = cd.spec.channel.unwrap();
        assert_eq!(channel.resource_claim_template.name, "imex-channel-0");
        assert_eq!(channel.allocation_mode, None);
    }

    #[test]
    fn status_has_nvidias_field_names() {
        let status = ComputeDomainStatus {
            status: Readiness::Ready,
            nodes: vec![ComputeDomainNode {
                name: "n1".into(),
                ip_address: "10.0.0.1".into(),
                clique_id: "u.1".into(),
                index: 0,
                status: Readiness::NotReady,
            }],
        };
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            json!({"status": "Ready", "nodes": [{"name": "n1", "ipAddress": "10.0.0.1", "cliqueID": "u.1", "index": 0, "status": "NotReady"}]})
        );
    }

    #[test]
    fn channel_config_round_trips_as_nvidias() {
        let config = ChannelConfig::new("0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", AllocationMode::All);
        let value = serde_json::to_value(&config).unwrap();
        assert_eq!(
            value,
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", "allocationMode": "All"})
        );
        assert_eq!(decode_config("p", &value).unwrap(), DomainConfig::Channel(config));
    }

    #[test]
    fn bad_configs_name_the_field() {
        let base = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainDaemonConfig", "domainID": "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a"});
        assert!(matches!(decode_config("p", &base), Ok(DomainConfig::Daemon(_))));
        let mut unknown = base.clone();
        unknown["domainId"] = json!("x");
        let error = decode_config("p", &unknown).unwrap_err().to_string();
        assert!(error.contains("unknown field `domainId`"), "{error}");
        let mut empty = base.clone();
        empty["domainID"] = json!("");
        assert_eq!(
            decode_config("p", &empty).unwrap_err().to_string(),
            "p.domainID: empty; it names the ComputeDomain's UID"
        );
        let mut traversal = base.clone();
        traversal["domainID"] = json!("../../etc");
        assert_eq!(
            decode_config("p", &traversal).unwrap_err().to_string(),
            "p.domainID: \"../../etc\" is not a UID (it names the ComputeDomain's metadata.uid)"
        );
        let mut kind = base;
        kind["kind"] = json!("GpuConfig");
        assert!(decode_config("p", &kind).unwrap_err().to_string().starts_with("p.kind: kind \"GpuConfig\""));
    }
}
