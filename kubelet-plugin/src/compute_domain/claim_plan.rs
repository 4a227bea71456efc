//! What a `compute-domain.nvidia.com` claim asks of this node, read from
//! the claim alone (pure): which domain, channel or daemon, which channels,
//! and the CDI spec that gives them to the containers.

use gpu_dra_driver::cdi::spec::{ContainerEdits, Device, DeviceNode, Spec, minimum_version};
use gpu_dra_driver::cdi::{CLAIM_CLASS, vendor};
use gpu_dra_driver::compute_domain::api::{AllocationMode, ConfigError, DomainConfig, decode_config};
use gpu_dra_driver::compute_domain::devices::{CHANNEL_DEVICE, DAEMON_DEVICE};
use gpu_dra_driver::compute_domain::imex::{CHANNEL_COUNT, channel_path};
use gpu_dra_driver::names::{ClaimUid, DomainUid, DriverName, InvalidName};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::prepared::PreparedDevice;
use crate::state::checkpoint::{DomainClaim, DomainClaimKind};

/// Why a claim cannot be prepared as it is: the field and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("the claim is not allocated (status.allocation is empty)")]
    NotAllocated,
    #[error("status.allocation has no {driver} device of node {node}")]
    NoDeviceHere { driver: String, node: String },
    #[error(
        "status.allocation.devices.results: {devices:?} on node {node}; a claim holds one {CHANNEL_DEVICE} or one \
         {DAEMON_DEVICE}"
    )]
    NotOneDevice { devices: Vec<String>, node: String },
    #[error(
        "no opaque config for driver {driver} applies to request {request}: a {} claim needs a {} naming its \
         ComputeDomain (the domain's ResourceClaimTemplate has one)",
        kind.as_str(),
        config_kind(*kind)
    )]
    NoConfig { driver: String, request: String, kind: DomainClaimKind },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "{path}: a {config} config for a {} device: channels take ComputeDomainChannelConfig, daemons \
         ComputeDomainDaemonConfig",
        kind.as_str()
    )]
    ConfigKind { path: &'static str, config: &'static str, kind: DomainClaimKind },
    #[error("{path}.domainID: {source}")]
    DomainId { path: &'static str, source: InvalidName },
    #[error(
        "/proc/devices has no nvidia-caps-imex-channels entry: the NVIDIA driver on this node offers no IMEX channels \
         (driver 550 or newer, loaded with NVreg_CreateImexChannel0=1 or channels created by nvidia-modprobe)"
    )]
    NoChannelMajor,
}

/// The config a claim of `kind` needs.
fn config_kind(kind: DomainClaimKind) -> &'static str {
    if kind == DomainClaimKind::Channel { "ComputeDomainChannelConfig" } else { "ComputeDomainDaemonConfig" }
}

/// A claim's devices on this node and what they are for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPlan {
    pub domain: DomainClaim,
    /// (request, device) of each allocated device on this node.
    pub devices: Vec<(String, String)>,
}

/// Reads the claim's allocation on `node` and its config; the error names
/// the field and what is allowed.
pub fn plan(claim: &ResourceClaim, driver: &str, node: &str) -> Result<ClaimPlan, PlanError> {
    let allocation = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).ok_or(PlanError::NotAllocated)?;
    let devices: Vec<(String, String)> = allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.driver == driver && r.pool == node)
        .map(|r| (r.request.clone(), r.device.clone()))
        .collect();
    if devices.is_empty() {
        return Err(PlanError::NoDeviceHere { driver: driver.to_owned(), node: node.to_owned() });
    }
    let kind = match devices.iter().map(|(_, d)| d.as_str()).collect::<Vec<_>>().as_slice() {
        [CHANNEL_DEVICE] => DomainClaimKind::Channel,
        [DAEMON_DEVICE] => DomainClaimKind::Daemon,
        other => {
            return Err(PlanError::NotOneDevice {
                devices: other.iter().map(|d| (*d).to_owned()).collect(),
                node: node.to_owned(),
            });
        }
    };
    // The config the scheduler copied into the allocation (the claim's own
    // and its classes'), else the claim's spec.
    let allocated = allocation.devices.iter().flat_map(|d| d.config.iter().flatten()).filter_map(|c| {
        let opaque = c.opaque.as_ref().filter(|o| o.driver == driver)?;
        Some(("status.allocation.devices.config", c.requests.clone(), opaque.parameters.0.clone()))
    });
    let spec =
        claim.spec.iter().flat_map(|s| s.devices.iter()).flat_map(|d| d.config.iter().flatten()).filter_map(|c| {
            let opaque = c.opaque.as_ref().filter(|o| o.driver == driver)?;
            Some(("spec.devices.config", c.requests.clone(), opaque.parameters.0.clone()))
        });
    let request = &devices[0].0;
    let mut configs = allocated.chain(spec).filter(|(_, requests, _)| {
        requests.as_ref().is_none_or(|r| r.is_empty() || r.iter().any(|name| name == request))
    });
    let (path, _, parameters) = configs.next().ok_or_else(|| PlanError::NoConfig {
        driver: driver.to_owned(),
        request: request.clone(),
        kind,
    })?;
    let config = decode_config(path, &parameters)?;
    let (domain_uid, channels) = match (&config, kind) {
        (DomainConfig::Channel(c), DomainClaimKind::Channel) => {
            let all = c.allocation_mode == Some(AllocationMode::All);
            (c.domain_id.clone(), if all { (0..CHANNEL_COUNT).collect() } else { vec![0] })
        }
        (DomainConfig::Daemon(d), DomainClaimKind::Daemon) => (d.domain_id.clone(), Vec::new()),
        _ => {
            return Err(PlanError::ConfigKind {
                path,
                config: match config {
                    DomainConfig::Channel(_) => "ComputeDomainChannelConfig",
                    DomainConfig::Daemon(_) => "ComputeDomainDaemonConfig",
                },
                kind,
            });
        }
    };
    // The UID names the domain's daemon directory: checked here, where it
    // enters, so no path ever reaches the state directory.
    let domain_uid = DomainUid::new(domain_uid).map_err(|source| PlanError::DomainId { path, source })?;
    Ok(ClaimPlan {
        domain: DomainClaim {
            domain_uid,
            namespace: claim.metadata.namespace.clone().unwrap_or_default(),
            kind,
            channels,
        },
        devices,
    })
}

/// The claim's spec: each channel's character device (major from
/// `/proc/devices`), plus the domain's identity in the environment.
pub fn cdi_spec(
    driver: &DriverName,
    uid: &ClaimUid,
    plan: &ClaimPlan,
    channel_major: Option<u32>,
    domain_name: &str,
) -> Result<(Spec, Vec<PreparedDevice>), PlanError> {
    let device_nodes = if plan.domain.channels.is_empty() {
        Vec::new()
    } else {
        let major = channel_major.ok_or(PlanError::NoChannelMajor)?;
        plan.domain.channels.iter().map(|id| DeviceNode::char(channel_path(*id), major, *id)).collect()
    };
    let kind = format!("{}/{CLAIM_CLASS}", vendor(driver));
    let mut spec_devices = Vec::new();
    let mut prepared = Vec::new();
    for (request, device) in &plan.devices {
        let name = format!("{uid}-{device}");
        prepared.push(PreparedDevice {
            request_names: vec![request.clone()],
            pool_name: String::new(),
            device_name: device.clone(),
            cdi_device_ids: vec![format!("{kind}={name}")],
            share_id: None,
        });
        spec_devices.push(Device {
            name,
            container_edits: ContainerEdits {
                env: vec![
                    format!("COMPUTE_DOMAIN_UUID={}", plan.domain.domain_uid),
                    format!("COMPUTE_DOMAIN_NAME={domain_name}"),
                    format!("COMPUTE_DOMAIN_NAMESPACE={}", plan.domain.namespace),
                ],
                device_nodes: device_nodes.clone(),
                ..ContainerEdits::default()
            },
        });
    }
    let mut spec =
        Spec { cdi_version: String::new(), kind, devices: spec_devices, container_edits: Default::default() };
    spec.cdi_version = minimum_version(&spec).to_owned();
    Ok((spec, prepared))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DOMAIN: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    fn claim(device: &str, kind: &str, mode: Option<&str>) -> ResourceClaim {
        let mut parameters = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "domainID": DOMAIN});
        if let Some(mode) = mode {
            parameters["allocationMode"] = json!(mode);
        }
        serde_json::from_value(json!({
            "metadata": {"namespace": "team", "name": "c"},
            "spec": {"devices": {"requests": [{"name": "channel", "exactly": {"deviceClassName": "x"}}],
                                  "config": [{"requests": ["channel"], "opaque": {"driver": "compute-domain.nvidia.com", "parameters": parameters}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "channel", "driver": "compute-domain.nvidia.com", "pool": "n1", "device": device}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn a_channel_claim_gets_channel_0_or_all() {
        let p =
            plan(&claim("channel-0", "ComputeDomainChannelConfig", None), "compute-domain.nvidia.com", "n1").unwrap();
        assert_eq!(p.domain.kind, DomainClaimKind::Channel);
        assert_eq!(p.domain.channels, [0]);
        assert_eq!(p.domain.domain_uid.as_str(), DOMAIN);
        let all =
            plan(&claim("channel-0", "ComputeDomainChannelConfig", Some("All")), "compute-domain.nvidia.com", "n1");
        assert_eq!(all.unwrap().domain.channels.len(), CHANNEL_COUNT as usize);
        let uid = ClaimUid::new("11111111-2222-4333-8444-555555555555").unwrap();
        let driver = DriverName::new("compute-domain.nvidia.com").unwrap();
        let (spec, prepared) = cdi_spec(&driver, &uid, &p, Some(236), "job").unwrap();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["kind"], "k8s.compute-domain.nvidia.com/claim");
        assert_eq!(
            json["devices"][0]["containerEdits"]["deviceNodes"],
            json!([{"path": "/dev/nvidia-caps-imex-channels/channel0", "type": "c", "major": 236, "minor": 0}])
        );
        assert_eq!(prepared[0].cdi_device_ids, [format!("k8s.compute-domain.nvidia.com/claim={uid}-channel-0")]);
        let error = cdi_spec(&driver, &uid, &p, None, "job").unwrap_err().to_string();
        assert!(error.starts_with("/proc/devices has no nvidia-caps-imex-channels entry"), "{error}");
    }

    #[test]
    fn mismatches_are_named() {
        let error = plan(&claim("daemon-0", "ComputeDomainChannelConfig", None), "compute-domain.nvidia.com", "n1")
            .unwrap_err()
            .to_string();
        assert!(error.contains("a ComputeDomainChannelConfig config for a daemon device"), "{error}");
        let error = plan(&claim("channel-0", "ComputeDomainChannelConfig", None), "compute-domain.nvidia.com", "n2")
            .unwrap_err()
            .to_string();
        assert!(error.contains("no compute-domain.nvidia.com device of node n2"), "{error}");
        let mut unconfigured = claim("channel-0", "ComputeDomainChannelConfig", None);
        unconfigured.spec.as_mut().unwrap().devices.as_mut().unwrap().config = None;
        let error = plan(&unconfigured, "compute-domain.nvidia.com", "n1").unwrap_err().to_string();
        assert!(error.contains("needs a ComputeDomainChannelConfig"), "{error}");
    }

    /// The domain's UID names a directory: a path in its place is refused
    /// where it enters, naming the field.
    #[test]
    fn a_domain_id_that_is_no_uid_is_refused() {
        for bad in ["/outside/dom", "../../..", "job"] {
            let mut forged = claim("channel-0", "ComputeDomainChannelConfig", None);
            let devices = forged.spec.as_mut().unwrap().devices.as_mut().unwrap();
            devices.config.as_mut().unwrap()[0].opaque.as_mut().unwrap().parameters.0["domainID"] = json!(bad);
            let error = plan(&forged, "compute-domain.nvidia.com", "n1").unwrap_err().to_string();
            assert!(error.starts_with("spec.devices.config.domainID: ") && error.contains("UID"), "{bad}: {error}");
        }
    }
}
