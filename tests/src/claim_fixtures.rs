//! ResourceClaims for the tests: pending ones as a user writes them, and
//! allocated ones as the scheduler leaves them, stored in the API-server
//! stand-in for the plugin to read.

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceRequestAllocationResult,
    OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use crate::apiserver::{ApiError, ApiServer};

/// A pending claim `default/<name>` as a user writes one: one request,
/// `gpu`, for `count` devices of `class`, with the CEL `selector` if any.
pub fn pending_claim(name: &str, class: &str, count: u32, selector: Option<&str>) -> ResourceClaim {
    let mut exactly = serde_json::json!({"deviceClassName": class, "count": count});
    if let Some(cel) = selector {
        exactly["selectors"] = serde_json::json!([{"cel": {"expression": cel}}]);
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    }))
    .expect("a valid claim")
}

/// One allocation result: `device` of pool `pool` for `request`.
#[derive(Debug, Clone)]
pub struct Allocated {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
    pub admin_access: bool,
    /// `consumedCapacity` of a share: (name, quantity).
    pub consumed_capacity: Vec<(String, String)>,
}

impl Allocated {
    /// A device of `gpu.nvidia.com` on pool `node` for request `request`.
    pub fn new(request: &str, node: &str, device: &str) -> Self {
        Self {
            request: request.into(),
            driver: "gpu.nvidia.com".into(),
            pool: node.into(),
            device: device.into(),
            share_id: None,
            admin_access: false,
            consumed_capacity: Vec::new(),
        }
    }

    /// A share `share_id` of the device that consumed `capacity`.
    pub fn share(mut self, share_id: &str, capacity: &[(&str, &str)]) -> Self {
        self.share_id = Some(share_id.into());
        self.consumed_capacity = capacity.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self
    }
}

/// A claim `namespace/name` allocated to `results`, with `config` copied
/// into the allocation as the scheduler does (class entries first).
pub fn allocated_claim(
    namespace: &str,
    name: &str,
    results: &[Allocated],
    config: Vec<DeviceAllocationConfiguration>,
) -> ResourceClaim {
    let results = results
        .iter()
        .map(|r| DeviceRequestAllocationResult {
            request: r.request.clone(),
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
            admin_access: r.admin_access.then_some(true),
            consumed_capacity: (!r.consumed_capacity.is_empty()).then(|| {
                r.consumed_capacity
                    .iter()
                    .map(|(k, v)| (k.clone(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone())))
                    .collect()
            }),
            ..Default::default()
        })
        .collect();
    let mut claim = ResourceClaim::default();
    claim.metadata.name = Some(name.into());
    claim.metadata.namespace = Some(namespace.into());
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult { results: Some(results), config: Some(config) }),
            ..Default::default()
        }),
        ..Default::default()
    });
    claim
}

/// An opaque config entry for `driver` from `source` (`FromClass` or
/// `FromClaim`) applying to `requests` (all when empty).
pub fn opaque_config(
    source: &str,
    requests: &[&str],
    driver: &str,
    parameters: serde_json::Value,
) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: source.into(),
        requests: (!requests.is_empty()).then(|| requests.iter().map(|r| r.to_string()).collect()),
        opaque: Some(OpaqueDeviceConfiguration { driver: driver.into(), parameters: RawExtension(parameters) }),
    }
}

/// Stores `claim` with its status and returns the UID the server gave it.
pub fn store(server: &ApiServer, claim: &ResourceClaim) -> Result<String, ApiError> {
    let stored = server.create_with_status(claim)?;
    Ok(stored.metadata.uid.unwrap_or_default())
}

/// A DeviceClass as shipped in `deviceclasses/<name>.yaml` (what the chart
/// installs), so that tests select devices as users' claims do.
pub fn shipped_device_class(name: &str) -> k8s_openapi::api::resource::v1::DeviceClass {
    let path = crate::workspace_root().join("deviceclasses").join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
