//! What to prepare for a claim, decided from the ResourceClaim alone: pure,
//! so every refusal is tested without files or servers.

use std::collections::BTreeMap;

use std::collections::HashSet;

use gpu_dra_driver::echo;
use gpu_dra_driver::inventory::{Inventory, PublishedDevice};
use gpu_dra_driver::names::{DeviceName, DriverName, NodeName};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};

use super::types::ValidClaim;

/// The most results an allocation may hold: `AllocationResultsMaxSize` in
/// `k8s.io/api/resource/v1` (the API server refuses more). A claim with
/// more came from a faulty server and is refused before any work.
pub const MAX_RESULTS: usize = 32;

/// One allocation result for our driver, checked against this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedDevice {
    /// As in the allocation result: `req` or `req/sub`.
    pub request: String,
    pub pool: String,
    pub device: DeviceName,
    pub is_mig: bool,
    pub admin_access: bool,
    pub share_id: Option<String>,
    /// `consumedCapacity` of a share (name → quantity text): what the
    /// scheduler counted against the device, enforced through MPS.
    pub consumed_capacity: BTreeMap<String, String>,
}

impl PlannedDevice {
    /// Whether another claim may hold the device at the same time as this
    /// one (admin access, or a share of a multi-allocatable device).
    pub fn is_exclusive(&self) -> bool {
        !self.admin_access && self.share_id.is_none()
    }
}

/// Why a claim cannot be prepared on this node. The texts go to the
/// kubelet, which shows them in the pod's events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "ResourceClaim {namespace}/{name} has UID {found}, but the kubelet asked for {expected}: \
         the claim was deleted and re-created; the pod must be re-created to use the new claim"
    )]
    UidMismatch { namespace: String, name: String, expected: String, found: String },
    #[error("ResourceClaim {0} is not allocated (status.allocation is empty): wait for the scheduler to allocate it")]
    NotAllocated(String),
    #[error(
        "status.allocation.devices.results[{index}] of ResourceClaim {claim} is device {} in pool {}, \
         but this plugin serves only pool {node} (the node's own name): the claim was allocated for another node",
        echo::quoted(device),
        echo::quoted(pool)
    )]
    OtherPool { claim: String, index: usize, device: String, pool: String, node: String },
    #[error(
        "status.allocation.devices.results[{index}] of ResourceClaim {claim} names device {}, \
         which is not in this node's GPU inventory: the device disappeared or the slice was stale; \
         re-create the claim so it is allocated again",
        echo::quoted(device)
    )]
    UnknownDevice { claim: String, index: usize, device: String },
    #[error(
        "status.allocation.devices.results of ResourceClaim {claim} has {found} entries, more than the \
         {MAX_RESULTS} the API allows: the API server sent a damaged claim; nothing was prepared"
    )]
    TooManyResults { claim: String, found: usize },
    #[error(
        "status.allocation.devices.results[{index}] of ResourceClaim {claim} repeats results[{first}] \
         (device {} in pool {}, same share): a device is allocated once per claim (or once per share); \
         the API server sent a damaged claim; nothing was prepared",
        echo::quoted(device),
        echo::quoted(pool)
    )]
    DuplicateResult { claim: String, index: usize, first: usize, device: String, pool: String },
}

/// Checks `claim` against what the kubelet asked for and returns our
/// results in allocation order.
pub fn plan(
    claim: &ResourceClaim,
    expected: &ValidClaim,
    driver: &DriverName,
    node: &NodeName,
    inventory: &Inventory,
) -> Result<Vec<PlannedDevice>, PlanError> {
    let found = claim.metadata.uid.as_deref().unwrap_or_default();
    if found != expected.uid.as_str() {
        return Err(PlanError::UidMismatch {
            namespace: expected.namespace.clone(),
            name: expected.name.clone(),
            expected: expected.uid.to_string(),
            found: found.to_string(),
        });
    }
    let id = format!("{}/{}", expected.namespace, expected.name);
    let allocation =
        claim.status.as_ref().and_then(|s| s.allocation.as_ref()).ok_or_else(|| PlanError::NotAllocated(id.clone()))?;
    let results = allocation.devices.as_ref().and_then(|d| d.results.as_deref()).unwrap_or_default();
    check_results(results, &id)?;
    results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.driver == driver.as_str())
        .map(|(index, r)| planned(r, index, &id, node, inventory))
        .collect()
}

/// Refuses, before any work, what the API server would never store: more
/// results than it allows, or one device listed twice for the same share.
fn check_results(results: &[DeviceRequestAllocationResult], claim: &str) -> Result<(), PlanError> {
    if results.len() > MAX_RESULTS {
        return Err(PlanError::TooManyResults { claim: claim.to_string(), found: results.len() });
    }
    let mut seen: HashSet<(&str, &str, &str, Option<&str>)> = HashSet::with_capacity(results.len());
    for (index, r) in results.iter().enumerate() {
        let key = (r.driver.as_str(), r.pool.as_str(), r.device.as_str(), r.share_id.as_deref());
        if !seen.insert(key) {
            let first = results
                .iter()
                .position(|o| (o.driver.as_str(), o.pool.as_str(), o.device.as_str(), o.share_id.as_deref()) == key);
            return Err(PlanError::DuplicateResult {
                claim: claim.to_string(),
                index,
                first: first.unwrap_or(0),
                device: r.device.clone(),
                pool: r.pool.clone(),
            });
        }
    }
    Ok(())
}

fn planned(
    result: &DeviceRequestAllocationResult,
    index: usize,
    claim: &str,
    node: &NodeName,
    inventory: &Inventory,
) -> Result<PlannedDevice, PlanError> {
    if result.pool != node.as_str() {
        return Err(PlanError::OtherPool {
            claim: claim.to_string(),
            index,
            device: result.device.clone(),
            pool: result.pool.clone(),
            node: node.to_string(),
        });
    }
    let unknown = || PlanError::UnknownDevice { claim: claim.to_string(), index, device: result.device.clone() };
    let device = DeviceName::new(result.device.as_str()).map_err(|_| unknown())?;
    let published = inventory.find_device(&device).ok_or_else(unknown)?;
    Ok(PlannedDevice {
        request: result.request.clone(),
        pool: result.pool.clone(),
        device,
        is_mig: matches!(published, PublishedDevice::Mig { .. } | PublishedDevice::DynamicMig { .. }),
        admin_access: result.admin_access.unwrap_or(false),
        share_id: result.share_id.clone(),
        consumed_capacity: result
            .consumed_capacity
            .iter()
            .flatten()
            .map(|(name, quantity)| (name.clone(), quantity.0.clone()))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::test_support::two_gpu_inventory;
    use k8s_openapi::api::resource::v1::{AllocationResult, DeviceAllocationResult, ResourceClaimStatus};

    const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    fn result(driver: &str, pool: &str, device: &str) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            request: "gpu".into(),
            ..Default::default()
        }
    }

    fn claim(uid: &str, results: Option<Vec<DeviceRequestAllocationResult>>) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.uid = Some(uid.into());
        c.status = results.map(|results| ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult { results: Some(results), config: None }),
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    }

    fn expected() -> ValidClaim {
        super::super::types::ClaimRef { namespace: "ns".into(), name: "c".into(), uid: UID.into() }.validate().unwrap()
    }

    fn run(c: &ResourceClaim) -> Result<Vec<PlannedDevice>, PlanError> {
        plan(c, &expected(), &DriverName::nvidia_default(), &NodeName::new("node-a").unwrap(), &two_gpu_inventory())
    }

    #[test]
    fn keeps_our_results_in_order() {
        let mut shared = result("gpu.nvidia.com", "node-a", "gpu-0");
        shared.share_id = Some("s-1".into());
        shared.request = "gpu/large".into();
        let c = claim(
            UID,
            Some(vec![
                result("gpu.nvidia.com", "node-a", "gpu-1-mig-1g10gb-19-0"),
                result("net.example.com", "elsewhere", "nic-0"),
                shared,
            ]),
        );
        let p = run(&c).unwrap();
        assert_eq!(p.len(), 2);
        assert!(p[0].is_mig && p[0].is_exclusive());
        assert_eq!(p[1].request, "gpu/large");
        assert!(!p[1].is_exclusive());
    }

    #[test]
    fn refusals_name_the_problem() {
        let e = run(&claim("1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", None)).unwrap_err();
        assert!(matches!(e, PlanError::UidMismatch { .. }), "{e}");
        let e = run(&claim(UID, None)).unwrap_err();
        assert_eq!(e, PlanError::NotAllocated("ns/c".into()));
        let e = run(&claim(UID, Some(vec![result("gpu.nvidia.com", "node-b", "gpu-0")]))).unwrap_err();
        assert!(e.to_string().contains("results[0]") && e.to_string().contains("pool \"node-b\""), "{e}");
        let e = run(&claim(UID, Some(vec![result("gpu.nvidia.com", "node-a", "gpu-7")]))).unwrap_err();
        assert!(e.to_string().contains("\"gpu-7\"") && e.to_string().contains("inventory"), "{e}");
        let e = run(&claim(UID, Some(vec![result("gpu.nvidia.com", "node-a", "GPU_0")]))).unwrap_err();
        assert!(matches!(e, PlanError::UnknownDevice { .. }));
    }

    #[test]
    fn duplicates_and_too_many_results_are_refused_at_once() {
        let gpu0 = || result("gpu.nvidia.com", "node-a", "gpu-0");
        let e = run(&claim(UID, Some(vec![gpu0(), result("gpu.nvidia.com", "node-a", "gpu-2"), gpu0()]))).unwrap_err();
        assert!(matches!(e, PlanError::DuplicateResult { index: 2, first: 0, .. }), "{e}");
        assert!(e.to_string().contains("results[2]") && e.to_string().contains("repeats results[0]"), "{e}");
        // Two shares of one device are two allocations, not a duplicate.
        let (mut a, mut b) = (gpu0(), gpu0());
        a.share_id = Some("s-1".into());
        b.share_id = Some("s-2".into());
        assert_eq!(run(&claim(UID, Some(vec![a, b]))).unwrap().len(), 2);

        let started = std::time::Instant::now();
        let many = vec![gpu0(); 10_000];
        let e = run(&claim(UID, Some(many))).unwrap_err();
        assert_eq!(e, PlanError::TooManyResults { claim: "ns/c".into(), found: 10_000 });
        assert!(e.to_string().contains("more than the 32 the API allows"), "{e}");
        let e = run(&claim(UID, Some(vec![gpu0(); 33]))).unwrap_err();
        assert!(matches!(e, PlanError::TooManyResults { found: 33, .. }));
        let distinct: Vec<_> = (0..32).map(|i| result("net.example.com", "node-a", &format!("nic-{i}"))).collect();
        assert_eq!(run(&claim(UID, Some(distinct))).unwrap(), vec![]);
        // Refused without quadratic work (a generous bound, not a benchmark).
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn a_huge_device_name_is_echoed_cut() {
        let huge = "g".repeat(1 << 20);
        let e = run(&claim(UID, Some(vec![result("gpu.nvidia.com", "node-a", &huge)]))).unwrap_err();
        let text = e.to_string();
        assert!(text.len() < 700 && text.contains("(1048576 bytes)"), "{}", &text[..text.len().min(700)]);
    }

    #[test]
    fn a_claim_with_nothing_for_us_plans_nothing() {
        let c = claim(UID, Some(vec![result("net.example.com", "node-a", "nic-0")]));
        assert_eq!(run(&c).unwrap(), vec![]);
    }
}
