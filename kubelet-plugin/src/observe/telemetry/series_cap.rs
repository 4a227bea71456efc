//! The cap on per-claim series (`--max-claim-series`), pure.
//!
//! Each claim holding a device adds a label set to every device family:
//! one per (device, claim) in native naming, one per (device, claim, pod)
//! in dcgm-exporter's. Unbounded, 2,000 claims sharing one device made
//! 22,000 series and doubled the agent's memory. Here at most `limit`
//! label sets carry claim labels, so at most `limit` series per family: a
//! claim keeps its series while it is prepared (in UID order for those
//! arriving together), one that would pass the limit gets none and is
//! counted once each time it goes without. A device whose claims all go
//! without keeps one series without claim labels.

use std::collections::{BTreeMap, BTreeSet};

use super::families::Naming;
use super::readings::Snapshot;

/// The default `--max-claim-series`.
pub const DEFAULT_MAX_CLAIM_SERIES: u32 = 256;

/// Which claims carry claim labels, kept from pass to pass.
#[derive(Debug, Clone, Default)]
pub struct ClaimSeriesCap {
    limit: usize,
    /// Claims given series in the last pass.
    labelled: BTreeSet<String>,
    /// Claims refused in the last pass.
    refused: BTreeSet<String>,
}

impl ClaimSeriesCap {
    pub fn new(limit: u32) -> Self {
        Self { limit: usize::try_from(limit).unwrap_or(usize::MAX), ..Self::default() }
    }

    /// Marks in `snapshot` the claims refused series; returns how many of
    /// them were not refused in the last pass.
    pub fn apply(&mut self, snapshot: &mut Snapshot, naming: Naming) -> u64 {
        let demand = label_sets(snapshot, naming);
        let mut used = 0usize;
        let mut labelled = BTreeSet::new();
        // Those labelled before first, so that a newcomer never takes a
        // claim's series away; then the rest in UID order.
        let (before, newcomers): (Vec<_>, Vec<_>) = demand.iter().partition(|(uid, _)| self.labelled.contains(*uid));
        for (uid, sets) in before.into_iter().chain(newcomers) {
            if used.saturating_add(*sets) <= self.limit {
                used += sets;
                labelled.insert(uid.clone());
            }
        }
        let refused: BTreeSet<String> = demand.keys().filter(|uid| !labelled.contains(*uid)).cloned().collect();
        let newly = refused.difference(&self.refused).count();
        snapshot.unlabelled_claims = refused.clone();
        self.labelled = labelled;
        self.refused = refused;
        u64::try_from(newly).unwrap_or(u64::MAX)
    }
}

/// The label sets each claim of `snapshot` would add, by claim UID.
fn label_sets(snapshot: &Snapshot, naming: Naming) -> BTreeMap<String, usize> {
    let mut demand: BTreeMap<String, usize> = BTreeMap::new();
    for holder in snapshot.devices.iter().flat_map(|d| &d.holders) {
        let sets = match naming {
            Naming::Native => 1,
            Naming::Dcgm => holder.pods.len().max(1),
        };
        *demand.entry(holder.uid.clone()).or_default() += sets;
    }
    demand
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::observe::telemetry::families::{Context, families};
    use crate::observe::telemetry::{ClaimHolder, DeviceIdentity, DeviceReading, DeviceSample, PodRef};

    fn holder(i: usize, pods: usize) -> Arc<ClaimHolder> {
        Arc::new(ClaimHolder {
            namespace: "ns".into(),
            name: format!("claim-{i:04}"),
            uid: format!("uid-{i:04}"),
            pods: (0..pods).map(|p| PodRef { name: format!("pod-{i}-{p}"), uid: format!("pu-{i}-{p}") }).collect(),
        })
    }

    /// `claims` claims sharing gpu-0, every reading present.
    fn shared_device(claims: usize, pods: usize) -> Snapshot {
        let sample = DeviceSample {
            gpu_utilization_percent: Some(50.0),
            memory_utilization_percent: Some(10.0),
            memory_used_bytes: Some(1 << 30),
            memory_total_bytes: Some(80 << 30),
            power_watts: Some(300.0),
            temperature_celsius: Some(60.0),
            sm_clock_mhz: Some(1980.0),
            ecc_corrected_errors: Some(0),
            ecc_uncorrected_errors: Some(0),
        };
        let identity = DeviceIdentity {
            device: "gpu-0".into(),
            uuid: "GPU-0".into(),
            gpu_minor: 0,
            model: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: None,
            mig: None,
        };
        Snapshot {
            devices: vec![DeviceReading {
                identity,
                sample,
                xids: vec![],
                faulty: false,
                holders: (0..claims).map(|i| holder(i, pods)).collect(),
            }],
            prepared_claims: claims,
            ..Snapshot::default()
        }
    }

    fn cx(naming: Naming) -> Context<'static> {
        Context { naming, hostname: "n", driver: "gpu.nvidia.com" }
    }

    /// Series carrying a claim label, and the most of one family.
    fn claim_series(snapshot: &Snapshot, naming: Naming) -> (usize, usize) {
        let key = match naming {
            Naming::Native => "claim_uid",
            Naming::Dcgm => "dra_claim_name",
        };
        let per_family: Vec<usize> = families(snapshot, &cx(naming))
            .iter()
            .map(|f| f.rows.iter().filter(|r| r.labels.iter().any(|(k, _)| k == key)).count())
            .collect();
        (per_family.iter().sum(), per_family.iter().copied().max().unwrap_or(0))
    }

    #[test]
    fn two_thousand_claims_on_one_device_give_at_most_the_caps_series_and_count_the_rest() {
        let mut snapshot = shared_device(2000, 1);
        let uncapped = claim_series(&snapshot, Naming::Native);
        let mut cap = ClaimSeriesCap::new(DEFAULT_MAX_CLAIM_SERIES);
        assert_eq!(cap.apply(&mut snapshot, Naming::Native), 1744, "2000 - 256 claims go without");
        let (total, most) = claim_series(&snapshot, Naming::Native);
        println!("2000 claims on one device: {} claim series uncapped, {total} with the cap of 256", uncapped.0);
        assert_eq!(most, 256, "at most the cap per family");
        assert_eq!(uncapped.1, 2000);
        assert_eq!(total, 256 * 11, "the ten readings and the XID count");
        // The node families still count every claim.
        let fams = families(&snapshot, &cx(Naming::Native));
        let util = fams.iter().find(|f| f.name == "gpu_dra_device_gpu_utilization_percent").unwrap();
        assert_eq!(util.rows.len(), 256);
        let prepared = fams.iter().find(|f| f.name == "gpu_dra_prepared_claims").unwrap();
        assert_eq!(prepared.rows[0].value, 2000.0);
        // The same claims next pass: nobody is counted again.
        let mut again = shared_device(2000, 1);
        assert_eq!(cap.apply(&mut again, Naming::Native), 0);
    }

    #[test]
    fn labelled_claims_keep_their_series_and_a_freed_place_is_taken() {
        let mut cap = ClaimSeriesCap::new(2);
        let mut first = shared_device(2, 1);
        // Claims 0 and 1 labelled.
        assert_eq!(cap.apply(&mut first, Naming::Native), 0);
        // Claim 0 goes; newcomers 2 and 3 (UIDs after 1): 1 stays, 2 joins,
        // 3 is refused.
        let mut next = shared_device(4, 1);
        next.devices[0].holders.remove(0);
        assert_eq!(cap.apply(&mut next, Naming::Native), 1);
        assert_eq!(next.unlabelled_claims, BTreeSet::from(["uid-0003".to_string()]));
        // dcgm naming: a claim's pods each take a place.
        let mut dcgm = ClaimSeriesCap::new(3);
        let mut pods = shared_device(2, 2);
        assert_eq!(dcgm.apply(&mut pods, Naming::Dcgm), 1);
        assert_eq!(claim_series(&pods, Naming::Dcgm).1, 2);
        // A cap of 0: no claim labels at all, every device still reported.
        let mut none = ClaimSeriesCap::new(0);
        let mut snapshot = shared_device(3, 1);
        assert_eq!(none.apply(&mut snapshot, Naming::Native), 3);
        assert_eq!(claim_series(&snapshot, Naming::Native).0, 0);
        let fams = families(&snapshot, &cx(Naming::Native));
        assert_eq!(fams.iter().find(|f| f.name == "gpu_dra_device_power_watts").unwrap().rows.len(), 1);
    }
}
