//! What is allocated already, and to whom.
//!
//! As the scheduler's allocated-device tracking: results with
//! `adminAccess: true` do not make a device busy; results with a `shareID`
//! consume capacity of a shareable device instead of taking it; anything
//! else takes the device.
//!
//! Upstream recomputes the allocated set from all claims for every
//! scheduling cycle, by device ID (driver, pool, name). We keep it
//! incrementally: by device number for the search, and by ID for devices
//! the fleet does not hold right now (a claim seen before its slice, a
//! slice being replaced), which attach again when their pool has them.
//! A release (claim deallocated or deleted) gives devices, capacity and
//! counters back; the first-fit memo is dropped then (it relies on
//! allocations only accumulating between releases).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{AllocationResult, DeviceRequestAllocationResult, ResourceClaim};

use super::capacity::Consumed;
use super::counters::CounterUse;
use super::decode::decode_quantity;
use super::error::InputError;
use super::index::{Fleet, PoolChange};

/// A device ID: driver, pool, device name.
type DeviceId = (String, String, String);

/// What claims hold of one device.
#[derive(Debug, Default, Clone, PartialEq)]
struct Holding {
    exclusive: Option<String>,
    shared: Option<(Consumed, Vec<String>)>,
}

#[derive(Debug, Default)]
pub(crate) struct AllocatedState {
    exclusive: HashMap<u32, String, foldhash::fast::RandomState>,
    shared: HashMap<u32, (Consumed, Vec<String>), foldhash::fast::RandomState>,
    /// Held devices the fleet does not have right now.
    detached: HashMap<DeviceId, Holding>,
    pub(crate) counters: CounterUse,
    /// Bumped on every change.
    pub(crate) version: u64,
}

impl AllocatedState {
    pub(crate) fn record(&mut self, fleet: &Fleet, owner: &str, result: &AllocationResult) -> Result<(), InputError> {
        for held in holdings(result, owner) {
            let (r, consumed) = held?;
            let Some(d) = fleet.lookup(&r.driver, &r.pool, &r.device) else {
                let holding = self.detached.entry((r.driver.clone(), r.pool.clone(), r.device.clone())).or_default();
                match consumed {
                    Some(c) => add_share(holding.shared.get_or_insert_with(Default::default), c, owner),
                    None => holding.exclusive = Some(owner.to_string()),
                }
                continue;
            };
            let first_use = !self.is_allocated(d);
            match consumed {
                Some(c) => add_share(self.shared.entry(d).or_default(), c, owner),
                None => {
                    self.exclusive.insert(d, owner.to_string());
                }
            }
            if first_use && let Some(r) = fleet.device_ref(d) {
                self.counters.add(r.pool, fleet.consumption(d));
            }
        }
        self.version += 1;
        Ok(())
    }

    /// Other owners that hold a device of `result` exclusively: a double
    /// allocation if `result` is recorded too.
    pub(crate) fn other_holders(&self, fleet: &Fleet, owner: &str, result: &AllocationResult) -> Vec<String> {
        let mut others: Vec<String> = Vec::new();
        for (r, consumed) in holdings(result, owner).flatten() {
            let Some(d) = fleet.lookup(&r.driver, &r.pool, &r.device) else { continue };
            let holders: Vec<&str> = match consumed {
                // A share conflicts only with a dedicated holder.
                Some(_) => self.exclusive.get(&d).map(String::as_str).into_iter().collect(),
                None => self.owners(d),
            };
            for holder in holders {
                if holder != owner && !others.iter().any(|o| o == holder) {
                    others.push(holder.to_owned());
                }
            }
        }
        others
    }

    /// Gives back what `owner` holds through `result`: devices, capacity
    /// and, when a device is no longer in use at all, its counters.
    pub(crate) fn release(&mut self, fleet: &Fleet, owner: &str, result: &AllocationResult) -> Result<(), InputError> {
        for held in holdings(result, owner) {
            let (r, consumed) = held?;
            let Some(d) = fleet.lookup(&r.driver, &r.pool, &r.device) else {
                let id = (r.driver.clone(), r.pool.clone(), r.device.clone());
                if let Some(holding) = self.detached.get_mut(&id) {
                    release_holding(holding, consumed.as_ref(), owner);
                    if holding.exclusive.is_none() && holding.shared.is_none() {
                        self.detached.remove(&id);
                    }
                }
                continue;
            };
            let was_used = self.is_allocated(d);
            let mut holding = Holding { exclusive: self.exclusive.remove(&d), shared: self.shared.remove(&d) };
            release_holding(&mut holding, consumed.as_ref(), owner);
            if let Some(o) = holding.exclusive {
                self.exclusive.insert(d, o);
            }
            if let Some(s) = holding.shared {
                self.shared.insert(d, s);
            }
            if was_used
                && !self.is_allocated(d)
                && let Some(r) = fleet.device_ref(d)
            {
                self.counters.sub(r.pool, fleet.consumption(d));
            }
        }
        self.version += 1;
        Ok(())
    }

    /// After a pool changed in the fleet: what was held by the old device
    /// numbers moves to the new ones (by device name), what the pool no
    /// longer has is kept aside by ID, what it has again attaches, and the
    /// pool's counters in use are summed again.
    pub(crate) fn pool_changed(&mut self, fleet: &Fleet, change: &PoolChange) {
        self.version += 1;
        if !change.consumption_changed {
            // The same devices under the same numbers, drawing the same.
            return;
        }
        let Some(pool) = fleet.pool(change.pool) else { return };
        let (driver, pool_name) = (Arc::clone(&pool.driver), Arc::clone(&pool.name));
        let mut moved: Vec<(String, Holding)> = Vec::new();
        for (old, name) in &change.retired {
            let holding = Holding { exclusive: self.exclusive.remove(old), shared: self.shared.remove(old) };
            if holding != Holding::default() {
                moved.push((name.to_string(), holding));
            }
        }
        for (name, holding) in moved {
            self.detached.insert((driver.to_string(), pool_name.to_string(), name), holding);
        }
        let returning: Vec<DeviceId> = self
            .detached
            .keys()
            .filter(|(d, p, n)| **d == *driver && **p == *pool_name && fleet.lookup(d, p, n).is_some())
            .cloned()
            .collect();
        for id in returning {
            let (Some(holding), Some(d)) = (self.detached.remove(&id), fleet.lookup(&id.0, &id.1, &id.2)) else {
                continue;
            };
            if let Some(o) = holding.exclusive {
                self.exclusive.insert(d, o);
            }
            if let Some(s) = holding.shared {
                self.shared.insert(d, s);
            }
        }
        self.counters.reset(change.pool);
        let used: Vec<u32> =
            fleet.pool_devices(change.pool).map(|(_, d)| d).filter(|&d| self.is_allocated(d)).collect();
        for d in used {
            self.counters.add(change.pool, fleet.consumption(d));
        }
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

/// The results of an allocation that hold something (admin access holds
/// nothing), each with the capacity it consumed when it is a share.
fn holdings<'a>(
    result: &'a AllocationResult,
    owner: &'a str,
) -> impl Iterator<Item = Result<(&'a DeviceRequestAllocationResult, Option<Consumed>), InputError>> + 'a {
    let results = result.devices.as_ref().and_then(|d| d.results.as_deref()).unwrap_or_default();
    results.iter().enumerate().filter(|(_, r)| r.admin_access != Some(true)).map(move |(index, r)| {
        let consumed = match r.share_id {
            Some(_) => Some(consumed_of(r.consumed_capacity.as_ref(), owner, index)?),
            None => None,
        };
        Ok((r, consumed))
    })
}

fn consumed_of(
    capacity: Option<&std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    owner: &str,
    index: usize,
) -> Result<Consumed, InputError> {
    let mut consumed = Consumed::new();
    for (name, q) in capacity.into_iter().flatten() {
        let amount = decode_quantity(&q.0).map_err(|e| InputError::BadResult {
            claim: owner.to_string(),
            index,
            field: "consumedCapacity",
            reason: e.to_string(),
        })?;
        consumed.insert(name.clone(), amount);
    }
    Ok(consumed)
}

fn add_share(entry: &mut (Consumed, Vec<String>), consumed: Consumed, owner: &str) {
    for (name, amount) in consumed {
        let e = entry.0.entry(name).or_default();
        *e = e.saturating_add(amount);
    }
    if !entry.1.iter().any(|o| o == owner) {
        entry.1.push(owner.to_string());
    }
}

/// Removes `owner`'s part of a holding.
fn release_holding(holding: &mut Holding, consumed: Option<&Consumed>, owner: &str) {
    match consumed {
        Some(c) => {
            if let Some((total, owners)) = holding.shared.as_mut()
                && owners.iter().any(|o| o == owner)
            {
                for (name, amount) in c {
                    if let Some(e) = total.get_mut(name) {
                        *e = e.saturating_sub(*amount);
                    }
                }
                owners.retain(|o| o != owner);
                if owners.is_empty() {
                    holding.shared = None;
                }
            }
        }
        None => {
            if holding.exclusive.as_deref() == Some(owner) {
                holding.exclusive = None;
            }
        }
    }
}
