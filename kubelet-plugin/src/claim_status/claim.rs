//! A prepared (or failed, or unprepared) claim's `status.devices` as the
//! node agent wants it: one entry per device the claim's allocation gives
//! this driver in this node's pool, and no other entry of ours.
//!
//! Entries come from the allocation, not from what prepare made, because
//! the API server accepts an entry only when it names a device allocated
//! to the claim (driver, pool, device, shareID).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use gpu_dra_driver::claim_status::{EntryKey, Readiness, allocation_results, entry_mut, remove_stale, set_ready};

/// The API server's cap on an entry's `data` (its raw JSON), 10 KiB.
pub const DATA_LIMIT: usize = 10 * 1024;

/// Who writes: the driver's name and the node (its pool's name).
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    pub driver: &'a str,
    pub node: &'a str,
}

/// The claim's allocated devices of `writer`'s driver in its pool.
fn ours(claim: &ResourceClaim, writer: Writer<'_>) -> Vec<(String, Option<String>)> {
    allocation_results(claim)
        .filter(|r| r.driver == writer.driver && r.pool == writer.node)
        .map(|r| (r.device.clone(), r.share_id.clone()))
        .collect()
}

/// The claim with each of our allocated devices' entry saying
/// `readiness`, its `data` set from `data` (by device name) when given
/// and within [`DATA_LIMIT`] (larger data is left out, not refused),
/// and our entries for devices no longer allocated dropped; `None` when
/// it already says all that.
pub fn prepared(
    claim: &ResourceClaim,
    writer: Writer<'_>,
    readiness: &Readiness,
    data: &BTreeMap<String, serde_json::Value>,
) -> Option<ResourceClaim> {
    let allocated = ours(claim, writer);
    let mut updated = claim.clone();
    let generation = updated.metadata.generation;
    let devices = updated.status.get_or_insert_default().devices.get_or_insert_default();
    remove_stale(devices, writer.driver, writer.node, |d| {
        allocated.iter().any(|(n, s)| *n == d.device && *s == d.share_id)
    });
    for (device, share) in &allocated {
        let key = EntryKey { driver: writer.driver, pool: writer.node, device, share_id: share.as_deref() };
        let entry = entry_mut(devices, &key);
        set_ready(entry, readiness, generation);
        if let Some(value) = data.get(device).filter(|v| serde_json::to_vec(v).is_ok_and(|raw| raw.len() <= DATA_LIMIT))
        {
            entry.data = Some(RawExtension(value.clone()));
        }
    }
    tidy(&mut updated);
    (updated.status != claim.status).then_some(updated)
}

/// The claim without any entry of ours in our pool (other drivers' and
/// other pools' entries kept); `None` when it has none.
pub fn unprepared(claim: &ResourceClaim, writer: Writer<'_>) -> Option<ResourceClaim> {
    let mut updated = claim.clone();
    let devices = updated.status.as_mut()?.devices.as_mut()?;
    remove_stale(devices, writer.driver, writer.node, |_| false).then(|| {
        tidy(&mut updated);
        updated
    })
}

/// An emptied list is written as absent, as the claim had it before.
fn tidy(claim: &mut ResourceClaim) {
    if let Some(status) = claim.status.as_mut()
        && status.devices.as_ref().is_some_and(Vec::is_empty)
    {
        status.devices = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocatedDeviceStatus, AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };

    const OURS: &str = "gpu.nvidia.com";
    const WRITER: Writer<'static> = Writer { driver: OURS, node: "node-a" };

    fn result(driver: &str, pool: &str, device: &str, share: Option<&str>) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            share_id: share.map(Into::into),
            request: "gpu".into(),
            ..DeviceRequestAllocationResult::default()
        }
    }

    fn claim(results: Vec<DeviceRequestAllocationResult>, devices: Vec<AllocatedDeviceStatus>) -> ResourceClaim {
        let mut claim = ResourceClaim::default();
        claim.metadata.generation = Some(3);
        claim.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult { results: Some(results), ..DeviceAllocationResult::default() }),
                ..AllocationResult::default()
            }),
            devices: (!devices.is_empty()).then_some(devices),
            ..ResourceClaimStatus::default()
        });
        claim
    }

    fn theirs() -> AllocatedDeviceStatus {
        AllocatedDeviceStatus {
            driver: "nic.example.com".into(),
            pool: "node-a".into(),
            device: "nic-0".into(),
            ..AllocatedDeviceStatus::default()
        }
    }

    fn ready() -> Readiness {
        Readiness { ready: true, reason: "Prepared", message: "prepared on node-a".into() }
    }

    #[test]
    fn each_allocated_device_of_ours_gets_its_condition_and_data_and_others_are_kept() {
        let claim = claim(
            vec![
                result(OURS, "node-a", "gpu-0-mig-1g.10gb-0", None),
                result(OURS, "node-a", "gpu-1", Some("share-1")),
                result(OURS, "node-b", "gpu-0", None),
                result("nic.example.com", "node-a", "nic-0", None),
            ],
            vec![theirs()],
        );
        let uuid = serde_json::json!({"uuids": ["MIG-0e2b8a5c-3f5e-5d0e-9c4b-6b8f0f1d2a3e"]});
        let data = BTreeMap::from([("gpu-0-mig-1g.10gb-0".to_owned(), uuid.clone())]);
        let updated = prepared(&claim, WRITER, &ready(), &data).unwrap();
        let devices = updated.status.as_ref().unwrap().devices.as_ref().unwrap();
        assert_eq!(devices.len(), 3, "{devices:?}");
        assert_eq!(devices[0], theirs());
        assert_eq!(devices[1].data, Some(RawExtension(uuid)));
        assert_eq!(devices[2].share_id.as_deref(), Some("share-1"));
        for entry in &devices[1..] {
            let condition = &entry.conditions.as_ref().unwrap()[0];
            assert_eq!((condition.status.as_str(), condition.observed_generation), ("True", Some(3)));
        }
        assert!(prepared(&updated, WRITER, &ready(), &data).is_none(), "written once");
    }

    #[test]
    fn data_over_the_api_servers_limit_is_left_out() {
        let claim = claim(vec![result(OURS, "node-a", "gpu-0", None)], vec![]);
        let data = BTreeMap::from([("gpu-0".to_owned(), serde_json::json!({"uuids": ["x".repeat(DATA_LIMIT)]}))]);
        let updated = prepared(&claim, WRITER, &ready(), &data).unwrap();
        let entry = &updated.status.unwrap().devices.unwrap()[0];
        assert_eq!((entry.data.as_ref(), entry.conditions.as_ref().map(Vec::len)), (None, Some(1)));
    }

    #[test]
    fn our_entries_for_devices_no_longer_allocated_are_dropped() {
        let stale = AllocatedDeviceStatus {
            driver: OURS.into(),
            pool: "node-a".into(),
            device: "gpu-7".into(),
            ..AllocatedDeviceStatus::default()
        };
        let claim = claim(vec![result(OURS, "node-a", "gpu-0", None)], vec![stale, theirs()]);
        let updated = prepared(&claim, WRITER, &ready(), &BTreeMap::new()).unwrap();
        let names: Vec<_> = updated.status.unwrap().devices.unwrap().into_iter().map(|d| d.device).collect();
        assert_eq!(names, ["nic-0", "gpu-0"]);
    }

    #[test]
    fn a_failure_is_a_false_condition_with_its_bounded_message() {
        let claim = claim(vec![result(OURS, "node-a", "gpu-0", None)], vec![]);
        let failed =
            Readiness { ready: false, reason: "PrepareFailed", message: format!("no GPU\n{}", "x".repeat(5000)) };
        let updated = prepared(&claim, WRITER, &failed, &BTreeMap::new()).unwrap();
        let condition = updated.status.unwrap().devices.unwrap()[0].conditions.clone().unwrap().remove(0);
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "PrepareFailed"));
        assert!(
            condition.message.starts_with("no GPU\\nxx")
                && condition.message.chars().count() <= gpu_dra_driver::claim_status::MESSAGE_LIMIT
        );
    }

    #[test]
    fn unprepare_removes_only_our_entries_in_our_pool() {
        let claim = claim(vec![result(OURS, "node-a", "gpu-0", None)], vec![theirs()]);
        let with_ours = prepared(&claim, WRITER, &ready(), &BTreeMap::new()).unwrap();
        let removed = unprepared(&with_ours, WRITER).unwrap();
        assert_eq!(removed.status.unwrap().devices.unwrap(), [theirs()]);
        assert!(unprepared(&claim, WRITER).is_none(), "nothing of ours: nothing to write");
        let only_ours = prepared(
            &self::claim(vec![result(OURS, "node-a", "gpu-0", None)], vec![]),
            WRITER,
            &ready(),
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(unprepared(&only_ours, WRITER).unwrap().status.unwrap().devices, None);
    }
}
