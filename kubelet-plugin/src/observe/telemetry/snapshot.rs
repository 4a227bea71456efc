//! Inventory + samples + prepared claims → device readings and per-claim
//! loads, pure.

use std::collections::HashMap;
use std::sync::Arc;

use gpu_dra_driver::inventory::{Fault, Inventory, PublishedDevice};

use super::idle::ClaimLoad;
use super::readings::{ClaimHolder, DeviceIdentity, DeviceReading, DeviceSample, MigIdentity, PodRef};
use crate::state::checkpoint::ClaimRecord;

/// A claim prepared on this node (from the preparer's checkpoint mirror).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedClaim {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// Its device names on this node.
    pub devices: Vec<String>,
    /// The dynamic MIG devices prepare made for it (DynamicMIG gate): they
    /// exist, and have a UUID NVML answers to, only while it is prepared.
    pub made_mig: Vec<MadeMigDevice>,
}

/// A dynamic MIG device as made for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeMigDevice {
    /// Its DRA device name (`gpu-0-mig-1g10gb-19-6`).
    pub device: String,
    /// `MIG-…`.
    pub uuid: String,
    pub gpu_instance_id: u32,
}

impl PreparedClaim {
    /// A completed record's claim: its devices' names, and the dynamic MIG
    /// devices prepare made for it.
    pub fn of_record(record: &ClaimRecord) -> Self {
        PreparedClaim {
            uid: record.uid.clone(),
            namespace: record.namespace.clone(),
            name: record.name.clone(),
            devices: record.devices.iter().map(|d| d.device_name.clone()).collect(),
            made_mig: record
                .devices
                .iter()
                .filter_map(|d| {
                    let made = d.dynamic_mig.as_ref()?.made.as_ref()?;
                    Some(MadeMigDevice {
                        device: d.device_name.clone(),
                        uuid: made.uuid.clone(),
                        gpu_instance_id: made.gpu_instance_id,
                    })
                })
                .collect(),
        }
    }
}

/// A published device's identity and faults. A dynamic MIG device is
/// there only while `claims` made it (its UUID is theirs).
pub fn identities(inventory: &Inventory, claims: &[PreparedClaim]) -> Vec<(DeviceIdentity, Vec<u32>, bool)> {
    let made: HashMap<&str, &MadeMigDevice> =
        claims.iter().flat_map(|c| &c.made_mig).map(|m| (m.device.as_str(), m)).collect();
    inventory
        .published_devices()
        .into_iter()
        .filter_map(|d| {
            let name = d.name().ok()?.to_string();
            let gpu = d.gpu();
            let (uuid, mig, faults): (String, Option<MigIdentity>, Vec<&Fault>) = match d {
                PublishedDevice::Gpu(gpu) => (gpu.uuid.clone(), None, gpu.faults.iter().collect()),
                // Not in published_devices(): the GPU's own line serves.
                PublishedDevice::Vfio(_) => return None,
                PublishedDevice::Mig { parent, mig } => (
                    mig.uuid.clone(),
                    Some(MigIdentity {
                        profile: mig.profile.name.clone(),
                        gpu_instance_id: mig.gpu_instance_id,
                        parent_uuid: parent.uuid.clone(),
                    }),
                    parent.faults.iter().chain(&mig.faults).collect(),
                ),
                // A dynamic MIG device has no UUID until a claim makes it;
                // until then its GPU's own line carries the numbers.
                PublishedDevice::DynamicMig { parent, profile, .. } => {
                    let made = made.get(name.as_str())?;
                    (
                        made.uuid.clone(),
                        Some(MigIdentity {
                            profile: profile.profile.name.clone(),
                            gpu_instance_id: made.gpu_instance_id,
                            parent_uuid: parent.uuid.clone(),
                        }),
                        parent.faults.iter().collect(),
                    )
                }
            };
            let xids = faults
                .iter()
                .filter_map(|f| match f {
                    Fault::Xid(x) => Some(*x),
                    Fault::Lost => None,
                })
                .collect();
            let identity = DeviceIdentity {
                device: name,
                uuid,
                gpu_minor: gpu.minor,
                model: gpu.product_name.clone(),
                pci_bus_id: gpu.pci_bus_id.map(|b| b.to_string()),
                mig,
            };
            Some((identity, xids, !faults.is_empty()))
        })
        .collect()
}

/// Joins one pass: `samples[i]` belongs to `devices[i]`; `pods` by claim
/// UID. Returns the readings and each prepared claim's load (the mean GPU
/// utilization of its devices here, `None` when one has none).
pub fn join(
    devices: Vec<(DeviceIdentity, Vec<u32>, bool)>,
    samples: Vec<DeviceSample>,
    claims: &[PreparedClaim],
    pods: &HashMap<String, Vec<PodRef>>,
) -> (Vec<DeviceReading>, Vec<ClaimLoad>) {
    let holders: Vec<Arc<ClaimHolder>> = claims
        .iter()
        .map(|c| {
            Arc::new(ClaimHolder {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                uid: c.uid.clone(),
                pods: pods.get(&c.uid).cloned().unwrap_or_default(),
            })
        })
        .collect();
    let readings: Vec<DeviceReading> = devices
        .into_iter()
        .zip(samples.into_iter().chain(std::iter::repeat_with(DeviceSample::default)))
        .map(|((identity, xids, faulty), sample)| {
            let holders = claims
                .iter()
                .zip(&holders)
                .filter(|(c, _)| c.devices.contains(&identity.device))
                .map(|(_, h)| h.clone())
                .collect();
            DeviceReading { identity, sample, xids, faulty, holders }
        })
        .collect();
    let by_name: HashMap<&str, &DeviceReading> = readings.iter().map(|r| (r.identity.device.as_str(), r)).collect();
    let loads = claims
        .iter()
        .zip(&holders)
        .map(|(c, h)| {
            let utilization: Option<Vec<f64>> = c
                .devices
                .iter()
                .map(|d| by_name.get(d.as_str()).and_then(|r| r.sample.gpu_utilization_percent))
                .collect();
            #[allow(clippy::cast_precision_loss)]
            let mean = utilization.filter(|u| !u.is_empty()).map(|u| u.iter().sum::<f64>() / u.len() as f64);
            ClaimLoad { claim: h.clone(), devices: c.devices.clone(), utilization_percent: mean }
        })
        .collect();
    (readings, loads)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inventory(yaml: &str) -> Inventory {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inv.yaml");
        std::fs::write(&path, yaml).unwrap();
        gpu_dra_driver::inventory::fake::load(&path, &gpu_dra_driver::names::NodeName::new("n").unwrap()).unwrap()
    }

    fn util(u: f64) -> DeviceSample {
        DeviceSample { gpu_utilization_percent: Some(u), ..DeviceSample::default() }
    }

    #[test]
    fn devices_get_their_holders_and_claims_their_mean_load() {
        let inv = inventory("gpus:\n  - model: H100-80GB\n    count: 3\n    faults:\n      - {gpu: 2, xid: 79}\n");
        let ids = identities(&inv, &[]);
        assert_eq!(ids.iter().map(|(i, ..)| i.device.as_str()).collect::<Vec<_>>(), ["gpu-0", "gpu-1", "gpu-2"]);
        assert_eq!((ids[2].1.clone(), ids[2].2), (vec![79], true));
        let claims = [
            PreparedClaim {
                uid: "u1".into(),
                namespace: "ns".into(),
                name: "a".into(),
                devices: vec!["gpu-0".into(), "gpu-1".into()],
                made_mig: vec![],
            },
            PreparedClaim {
                uid: "u2".into(),
                namespace: "ns".into(),
                name: "b".into(),
                devices: vec!["gpu-1".into()],
                made_mig: vec![],
            },
        ];
        let pods = HashMap::from([("u1".to_string(), vec![PodRef { name: "p1".into(), uid: "pu1".into() }])]);
        let (readings, loads) = join(ids, vec![util(10.0), util(30.0), util(0.0)], &claims, &pods);
        assert_eq!(readings[0].holders[0].pod_names(), "p1");
        assert_eq!(readings[1].holders.len(), 2, "a shared device has both claims");
        assert!(readings[2].holders.is_empty());
        assert_eq!(loads[0].utilization_percent, Some(20.0));
        assert_eq!(loads[1].utilization_percent, Some(30.0));
    }

    #[test]
    fn a_mig_device_has_its_profile_and_no_load() {
        let inv = inventory(
            "gpus:\n  - model: A100-SXM4-80GB\n    count: 1\n    mig:\n      - gpus: [0]\n        instances: [1g.10gb]\n",
        );
        let ids = identities(&inv, &[]);
        let (id, ..) = &ids[0];
        let mig = id.mig.as_ref().unwrap();
        assert_eq!(mig.profile, "1g.10gb");
        assert!(id.uuid.starts_with("MIG-"));
        assert!(mig.parent_uuid.starts_with("GPU-"));
        let claims = [PreparedClaim {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "m".into(),
            devices: vec![id.device.clone()],
            made_mig: vec![],
        }];
        let (_, loads) = join(ids.clone(), vec![DeviceSample::default()], &claims, &HashMap::new());
        assert_eq!(loads[0].utilization_percent, None, "no reading, no load");
    }

    #[test]
    fn a_dynamic_mig_device_is_there_while_a_claim_has_made_it() {
        let mut inv = inventory(
            "gpus:\n  - model: H100-80GB\n    count: 1\n    mig:\n      - gpus: [0]\n        dynamic: true\n",
        );
        use gpu_dra_driver::inventory::dynamic_mig::{DynamicMigGpus, select};
        assert!(select(&mut inv, &DynamicMigGpus::Auto, &|_| true).is_empty(), "GPU 0 is dynamic");
        let device = "gpu-0-mig-1g10gb-19-6";
        let names = |ids: &[(DeviceIdentity, Vec<u32>, bool)]| -> Vec<String> {
            ids.iter().map(|(i, ..)| i.device.clone()).collect()
        };
        let unprepared = identities(&inv, &[]);
        assert!(!names(&unprepared).iter().any(|n| n.contains("-mig-")), "no MIG device before a claim makes one");
        let claim = PreparedClaim {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "tiny".into(),
            devices: vec![device.into()],
            made_mig: vec![MadeMigDevice { device: device.into(), uuid: "MIG-made".into(), gpu_instance_id: 13 }],
        };
        let ids = identities(&inv, std::slice::from_ref(&claim));
        let mig: Vec<&DeviceIdentity> = ids.iter().map(|(i, ..)| i).filter(|i| i.mig.is_some()).collect();
        assert_eq!(mig.len(), 1, "{:?}", names(&ids));
        assert_eq!((mig[0].device.as_str(), mig[0].uuid.as_str()), (device, "MIG-made"));
        let identity = mig[0].mig.as_ref().unwrap();
        assert_eq!((identity.profile.as_str(), identity.gpu_instance_id), ("1g.10gb", 13));
        assert_eq!(identity.parent_uuid, inv.gpus[0].uuid);
        assert_eq!(mig[0].model, inv.gpus[0].product_name);
    }
}
