//! What is allocated already, and to whom.
//!
//! As the scheduler's allocated-device tracking: results with
//! `adminAccess: true` do not make a device busy; results with a `shareID`
//! consume capacity of a shareable device instead of taking it; anything
//! else takes the device. Devices the fleet does not know (other
//! generations, gone slices) are ignored, as upstream ignores IDs it never
//! meets. Allocations only accumulate here, which the first-fit memo relies
//! on (a node that failed a claim shape keeps failing it).

use std::collections::HashMap;

use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};

use super::amount::Amount;
use super::capacity::Consumed;
use super::counters::CounterUse;
use super::error::InputError;
use super::index::Fleet;

#[derive(Debug, Default)]
pub(crate) struct AllocatedState {
    exclusive: HashMap<u32, String>,
    shared: HashMap<u32, (Consumed, Vec<String>)>,
    pub(crate) counters: CounterUse,
    /// Bumped on every change.
    pub(crate) version: u64,
}

impl AllocatedState {
    pub(crate) fn record(&mut self, fleet: &Fleet, owner: &str, result: &AllocationResult) -> Result<(), InputError> {
        let results = result.devices.as_ref().and_then(|d| d.results.as_deref()).unwrap_or_default();
        for (index, r) in results.iter().enumerate() {
            if r.admin_access == Some(true) {
                continue;
            }
            let Some(d) = fleet.lookup(&r.driver, &r.pool, &r.device) else { continue };
            let first_use = !self.is_allocated(d);
            if r.share_id.is_some() {
                let mut consumed = Consumed::new();
                for (name, q) in r.consumed_capacity.iter().flatten() {
                    let amount = Amount::parse(q).map_err(|e| InputError::BadResult {
                        claim: owner.to_string(),
                        index,
                        field: "consumedCapacity",
                        reason: e.to_string(),
                    })?;
                    consumed.insert(name.clone(), amount);
                }
                let entry = self.shared.entry(d).or_default();
                for (name, amount) in consumed {
                    let e = entry.0.entry(name).or_default();
                    *e = e.saturating_add(amount);
                }
                if !entry.1.iter().any(|o| o == owner) {
                    entry.1.push(owner.to_string());
                }
            } else {
                self.exclusive.insert(d, owner.to_string());
            }
            if first_use && let Some(r) = fleet.device_ref(d) {
                self.counters.add(r.pool, fleet.consumption(d));
            }
        }
        self.version += 1;
        Ok(())
    }

    /// Taken by a dedicated allocation.
    pub(crate) fn is_taken(&self, d: u32) -> bool {
        self.exclusive.contains_key(&d)
    }

    /// Taken or partly consumed.
    pub(crate) fn is_allocated(&self, d: u32) -> bool {
        self.exclusive.contains_key(&d) || self.shared.contains_key(&d)
    }

    /// Capacity consumed on a shareable device.
    pub(crate) fn consumed(&self, d: u32) -> Option<&Consumed> {
        self.shared.get(&d).map(|(c, _)| c)
    }

    /// Who holds a device: the dedicated owner, else the sharing claims.
    pub(crate) fn owners(&self, d: u32) -> Vec<&str> {
        match (self.exclusive.get(&d), self.shared.get(&d)) {
            (Some(o), _) => vec![o.as_str()],
            (None, Some((_, owners))) => owners.iter().map(String::as_str).collect(),
            (None, None) => vec![],
        }
    }
}

/// `namespace/name` of a claim.
pub(crate) fn owner_of(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}
