//! The fleet as an index: every usable device gets a number, and each node
//! gets the list of devices it can see, in upstream's search order (pools
//! by driver and name, pools with binding conditions last, slices by name,
//! devices in slice order).
//!
//! Incremental: slices are kept per pool in compact form (`compact`), and a
//! slice added, changed or deleted re-assembles only its pool and recomputes
//! only the views of the nodes that pool touches, and only the changed
//! slice's devices get new numbers. Retired numbers are reused: selector
//! results are cached per device signature, not per number, and what is
//! cached per number (candidate lists, allocations) is brought up to date
//! for the nodes a change touches.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;

use super::compact::{CompactSlice, Compactor, DeviceRecord};
use super::counters::{Consumption, PoolCounters};
use super::explain::PoolProblem;
use super::node_selection::{NodeInfo, Reach};
use super::pools::{self, Pool};

/// A device's place in the fleet: pool, kept slice of the pool, index.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceRef {
    pub(crate) pool: u32,
    pub(crate) slice: u32,
    pub(crate) index: u32,
}

const DEAD: u32 = u32::MAX;

/// Maps rebuilt on slice events, keyed by interned names and numbers.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// What one node can see.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeView {
    /// Usable devices (complete, valid pools), in search order.
    pub(crate) devices: Vec<u32>,
    /// Pools the node can see that are incomplete or invalid.
    pub(crate) problem_pools: Vec<u32>,
    /// A node selector in a slice or device that cannot be evaluated.
    pub(crate) error: Option<String>,
}

/// One pool and everything derived from it.
#[derive(Debug)]
struct PoolSlot {
    pool: Pool,
    /// The newest generation's slices, by name.
    kept: Vec<CompactSlice>,
    /// Slices of other generations (a driver mid-update), kept for when
    /// the newest ones go away.
    other: Vec<CompactSlice>,
    counters: PoolCounters,
    /// Kept device slice name → its devices' numbers (valid pools only).
    numbers: FastMap<Arc<str>, Vec<u32>>,
    /// Device name → number (valid pools only).
    device_ids: FastMap<Arc<str>, u32>,
    /// Nodes named by kept device slices' `nodeName`.
    local_nodes: BTreeSet<String>,
    /// Nodes named by devices of kept `perDeviceNodeSelection` slices.
    device_node_names: Vec<String>,
    checked: pools::CheckedDraws,
    /// Interned draws (by address, held) → their consumption of this
    /// pool's counters; cleared when the counters change.
    consumptions: FastMap<usize, (Arc<[super::compact::CounterDraw]>, Consumption)>,
    /// Some kept device slice is not pinned by `nodeName`.
    shared: bool,
}

/// The slice an event added, replaced or deleted.
struct Changed<'a> {
    name: &'a str,
    /// The slice it replaced, if any.
    replaced: Option<&'a CompactSlice>,
}

impl Changed<'_> {
    /// The replaced slice had these devices, by name and in this order.
    fn same_devices(&self, devices: &[DeviceRecord]) -> bool {
        self.replaced.is_some_and(|old| {
            old.devices.len() == devices.len()
                && old.devices.iter().zip(devices).all(|(a, b)| Arc::ptr_eq(&a.name, &b.name))
        })
    }
}

impl PoolSlot {
    /// What `d` consumes of this pool's counters, shared by the devices
    /// with the same (interned) draws.
    fn consumption_of(&mut self, d: &DeviceRecord) -> Consumption {
        let counters = &self.counters;
        let entry = self
            .consumptions
            .entry(Arc::as_ptr(&d.consumes).cast::<u8>() as usize)
            .or_insert_with(|| (Arc::clone(&d.consumes), Arc::from(counters.consumption(&d.consumes))));
        Arc::clone(&entry.1)
    }
}

/// What a selector can see of a device: driver, attributes, capacities and
/// `allowMultipleAllocations`. Devices with equal signatures get equal
/// answers from every selector (seven placements of one MIG profile on a
/// GPU, say), so selector results are cached per signature. Holding the
/// interned maps keeps their addresses, the key, from being reused while
/// any device has the signature; when the last one goes, the number is
/// released (and the allocator forgets what it cached for it).
#[derive(Debug)]
struct Signature {
    /// Live devices with this signature.
    users: u32,
    driver: Arc<str>,
    attributes: super::compact::Attributes,
    capacity: super::compact::Capacities,
    allow_multiple_allocations: bool,
}

impl Signature {
    fn key(&self) -> SignatureKey {
        (addr(&self.driver), self.attributes.addr(), self.capacity.addr(), self.allow_multiple_allocations)
    }
}

/// Addresses of the interned driver, attributes and capacities, and
/// `allowMultipleAllocations`.
type SignatureKey = (usize, (usize, usize), usize, bool);

fn addr(a: &Arc<str>) -> usize {
    Arc::as_ptr(a).cast::<u8>() as usize
}

/// Signatures by number, counted by their devices; numbers of signatures no
/// device has any more are reused. Where devices carry their own identity
/// (a GPU's `uuid`) there is one signature per device, so the index holds
/// numbers only and finds a key through the signature it numbers.
#[derive(Debug, Default)]
struct Signatures {
    by_number: Vec<Option<Signature>>,
    ids: hashbrown::HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    free: Vec<u32>,
}

impl Signatures {
    /// Room for `more` signatures (a fleet built at once knows its size,
    /// and growing by doubling would hold both copies at the peak).
    fn reserve(&mut self, more: usize) {
        self.by_number.reserve(more);
        let (by_number, hasher) = (&self.by_number, &self.hasher);
        self.ids.reserve(more, |&sig| Self::hash_of(hasher, by_number, sig));
    }

    fn hash_of(hasher: &foldhash::fast::RandomState, by_number: &[Option<Signature>], sig: u32) -> u64 {
        by_number.get(sig as usize).and_then(Option::as_ref).map_or(0, |s| hasher.hash_one(s.key()))
    }

    /// The signature of `d` (of `driver`), counted once more.
    fn acquire(&mut self, driver: &Arc<str>, d: &DeviceRecord) -> u32 {
        let key = (addr(driver), d.attributes.addr(), d.capacity.addr(), d.allow_multiple_allocations);
        let hash = self.hasher.hash_one(key);
        let by_number = &self.by_number;
        let found = self
            .ids
            .find(hash, |&sig| by_number.get(sig as usize).and_then(Option::as_ref).is_some_and(|s| s.key() == key));
        let sig = match found {
            Some(&sig) => sig,
            None => {
                let signature = Signature {
                    users: 0,
                    driver: Arc::clone(driver),
                    attributes: d.attributes.clone(),
                    capacity: d.capacity.clone(),
                    allow_multiple_allocations: d.allow_multiple_allocations,
                };
                let sig = match self.free.pop() {
                    Some(sig) => {
                        if let Some(s) = self.by_number.get_mut(sig as usize) {
                            *s = Some(signature);
                        }
                        sig
                    }
                    None => {
                        self.by_number.push(Some(signature));
                        (self.by_number.len() - 1) as u32
                    }
                };
                let (by_number, hasher) = (&self.by_number, &self.hasher);
                self.ids.insert_unique(hash, sig, |&sig| Self::hash_of(hasher, by_number, sig));
                sig
            }
        };
        if let Some(Some(s)) = self.by_number.get_mut(sig as usize) {
            s.users += 1;
        }
        sig
    }

    /// Counts one device less for `sig`; true when no device has it any
    /// more (its number is then free for reuse).
    fn release(&mut self, sig: u32) -> bool {
        let Some(Some(s)) = self.by_number.get_mut(sig as usize) else { return false };
        s.users = s.users.saturating_sub(1);
        if s.users > 0 {
            return false;
        }
        let hash = self.hasher.hash_one(s.key());
        if let Ok(entry) = self.ids.find_entry(hash, |&other| other == sig) {
            entry.remove();
        }
        if let Some(entry) = self.by_number.get_mut(sig as usize) {
            *entry = None;
        }
        self.free.push(sig);
        true
    }
}

/// Which device numbers a pool change retired and which nodes it touched;
/// the allocator uses it to move allocations and drop cached answers.
#[derive(Debug, Default)]
pub(crate) struct PoolChange {
    pub(crate) pool: u32,
    /// Signature numbers no device has any more (free for reuse).
    pub(crate) released_signatures: Vec<u32>,
    /// (old number, device name) of the devices the pool had.
    pub(crate) retired: Vec<(u32, Arc<str>)>,
    /// Views changed for these nodes; `None`: possibly every node.
    pub(crate) nodes: Option<Vec<String>>,
    /// The list of node names changed (positions moved).
    pub(crate) node_set_changed: bool,
    /// Devices came, went or draw differently on the pool's counters (or
    /// the counters changed): what is in use must be summed again.
    pub(crate) consumption_changed: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Fleet {
    compactor: Compactor,
    slots: Vec<PoolSlot>,
    /// driver → pool → slot number (stable while the fleet lives).
    pool_ids: HashMap<Arc<str>, HashMap<Arc<str>, u32>>,
    /// slice name → the pool that holds it.
    slice_home: HashMap<Arc<str>, u32>,
    devices: Vec<DeviceRef>,
    consumption: Vec<Consumption>,
    /// By device number: its signature (see [`Signature`]).
    device_signature: Vec<u32>,
    signatures: Signatures,
    /// Retired device numbers, reused for new devices. Nothing is cached
    /// per device number beyond what a pool change invalidates (selector
    /// results are per signature), so reuse is safe.
    free: Vec<u32>,
    /// Nodes known from Node objects (labels).
    known_nodes: BTreeMap<String, NodeInfo>,
    /// Node names mentioned by kept slices, with how many mention them.
    mentioned: BTreeMap<String, usize>,
    node_names: Vec<String>,
    node_index: HashMap<String, usize>,
    views: HashMap<String, NodeView>,
    /// node → pools with kept slices local to it.
    local_pools: HashMap<String, BTreeSet<u32>>,
    /// Pools with kept slices not pinned to one node.
    shared_pools: BTreeSet<u32>,
    /// Devices retired since interned values were last pruned.
    garbage: usize,
    /// A name appeared in or left `known_nodes` or `mentioned`.
    names_dirty: bool,
    /// The DeviceTaintRules, whose taints are on the devices they name.
    taint_rules: Vec<super::taint_rules::TaintRule>,
}

/// A fleet built from slices handed over one at a time: each is compacted
/// as it arrives (so a snapshot never has to be held as k8s objects) and
/// the pools are assembled once, at the end.
#[derive(Debug, Default)]
pub(crate) struct FleetBuilder {
    fleet: Fleet,
    grouped: BTreeMap<(Arc<str>, Arc<str>), Vec<CompactSlice>>,
    taint_rules: Vec<super::taint_rules::TaintRule>,
}

impl FleetBuilder {
    pub(crate) fn add_node(&mut self, node: &Node) {
        self.fleet.set_node(node);
    }

    pub(crate) fn add_slice(&mut self, slice: &ResourceSlice) {
        let mut c = self.fleet.compactor.slice(slice, None);
        for rule in &self.taint_rules {
            taint(&mut c, rule);
        }
        self.grouped.entry((Arc::clone(&c.driver), Arc::clone(&c.pool))).or_default().push(c);
    }

    pub(crate) fn add_taint_rule(&mut self, rule: super::taint_rules::TaintRule) {
        for slice in self.grouped.values_mut().flatten() {
            taint(slice, &rule);
        }
        self.taint_rules.push(rule);
    }

    pub(crate) fn finish(self) -> Fleet {
        let FleetBuilder { mut fleet, grouped, taint_rules } = self;
        // Slices applied later get the rules' taints too.
        fleet.taint_rules = taint_rules;
        let devices: usize = grouped.values().flatten().map(|s| s.devices.len()).sum();
        fleet.signatures.reserve(devices);
        fleet.devices.reserve(devices);
        fleet.consumption.reserve(devices);
        fleet.device_signature.reserve(devices);
        for ((driver, pool), slices) in grouped {
            let p = fleet.slot_for(&driver, &pool);
            fleet.reassemble(p, slices, None, false);
        }
        fleet.refresh_node_names();
        fleet.recompute_views(None);
        fleet
    }
}

/// Adds `rule`'s taint to the devices of `slice` it names.
fn taint(slice: &mut CompactSlice, rule: &super::taint_rules::TaintRule) {
    for d in &mut slice.devices {
        if rule.matches(&slice.driver, &slice.pool, &d.name) {
            d.extra.get_or_insert_with(Default::default).taints.push(rule.taint.clone());
        }
    }
}

/// Takes the rules' taints off `slice`'s devices (their own stay).
fn untaint(slice: &mut CompactSlice) {
    for d in &mut slice.devices {
        if let Some(extra) = d.extra.as_deref_mut() {
            extra.taints.truncate(extra.own_taints);
        }
        if d.extra.as_deref().is_some_and(|e| *e == super::compact::DeviceExtra::default()) {
            d.extra = None;
        }
    }
}

impl Fleet {
    /// The fleet of these slices and nodes, built in one pass.
    pub(crate) fn build(all: &[ResourceSlice], nodes: &[Node]) -> Self {
        let mut builder = FleetBuilder::default();
        for n in nodes {
            builder.add_node(n);
        }
        for s in all {
            builder.add_slice(s);
        }
        builder.finish()
    }

    /// Adds or replaces one slice (by name) and updates its pool.
    pub(crate) fn apply_slice(&mut self, slice: &ResourceSlice) -> Vec<PoolChange> {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        let previous = self
            .slice_home
            .get(name)
            .and_then(|&p| self.slots.get(p as usize))
            .and_then(|slot| slot.kept.iter().chain(&slot.other).find(|s| &*s.name == name));
        let mut c = self.compactor.slice(slice, previous);
        for rule in &self.taint_rules {
            taint(&mut c, rule);
        }
        let mut changes = Vec::new();
        // A slice that moved to another pool leaves its old one first.
        if let Some(&old) = self.slice_home.get(&c.name)
            && self.slots.get(old as usize).is_some_and(|s| s.pool.driver != c.driver || s.pool.name != c.pool)
        {
            changes.extend(self.remove_slice(&c.name.clone()));
        }
        let p = self.slot_for(&c.driver.clone(), &c.pool.clone());
        let Some(slot) = self.slots.get_mut(p as usize) else { return changes };
        let mut slices: Vec<CompactSlice> =
            std::mem::take(&mut slot.kept).into_iter().chain(std::mem::take(&mut slot.other)).collect();
        let replaced = slices.iter().position(|s| s.name == c.name).map(|i| slices.swap_remove(i));
        let name = Arc::clone(&c.name);
        slices.push(c);
        let changed = Changed { name: &name, replaced: replaced.as_ref() };
        changes.push(self.reassemble(p, slices, Some(changed), true));
        if let Some(r) = replaced {
            self.compactor.release(r.devices);
        }
        changes
    }

    /// Deletes one slice by name; nothing happens for an unknown name.
    pub(crate) fn remove_slice(&mut self, name: &str) -> Option<PoolChange> {
        let p = self.slice_home.remove(name)?;
        let slot = self.slots.get_mut(p as usize)?;
        let slices: Vec<CompactSlice> = std::mem::take(&mut slot.kept)
            .into_iter()
            .chain(std::mem::take(&mut slot.other))
            .filter(|s| &*s.name != name)
            .collect();
        Some(self.reassemble(p, slices, Some(Changed { name, replaced: None }), true))
    }

    /// Replaces the DeviceTaintRules: each pool with a device that the old
    /// or the new rules name is derived again with the new rules' taints.
    pub(crate) fn set_taint_rules(&mut self, rules: Vec<super::taint_rules::TaintRule>) -> Vec<PoolChange> {
        let old = std::mem::replace(&mut self.taint_rules, rules);
        let mut changes = Vec::new();
        for (p, slot) in (0u32..).zip(0..self.slots.len()) {
            let names = |s: &CompactSlice| {
                s.devices
                    .iter()
                    .any(|d| old.iter().chain(&self.taint_rules).any(|r| r.matches(&s.driver, &s.pool, &d.name)))
            };
            let touched = self.slots[slot].kept.iter().chain(&self.slots[slot].other).any(names);
            if !touched {
                continue;
            }
            let slot = &mut self.slots[slot];
            let mut slices: Vec<CompactSlice> =
                std::mem::take(&mut slot.kept).into_iter().chain(std::mem::take(&mut slot.other)).collect();
            for s in &mut slices {
                untaint(s);
                for rule in &self.taint_rules {
                    taint(s, rule);
                }
            }
            changes.push(self.reassemble(p, slices, None, true));
        }
        changes
    }

    /// Adds or updates a node's labels. Returns whether anything changed.
    pub(crate) fn set_node(&mut self, node: &Node) -> bool {
        let Some(name) = node.metadata.name.clone() else { return false };
        let info = NodeInfo { name: name.clone(), labels: node.metadata.labels.clone().unwrap_or_default() };
        if self.known_nodes.get(&name) == Some(&info) {
            return false;
        }
        if self.known_nodes.insert(name.clone(), info).is_none() {
            self.names_dirty = true;
        }
        true
    }

    /// Forgets a node's labels (it stays known while slices name it).
    pub(crate) fn remove_node(&mut self, name: &str) -> bool {
        let removed = self.known_nodes.remove(name).is_some();
        self.names_dirty |= removed;
        removed
    }

    /// After [`Fleet::set_node`] / [`Fleet::remove_node`]: the node's view
    /// and the node list are brought up to date.
    pub(crate) fn node_changed(&mut self, name: &str) -> bool {
        let set_changed = self.refresh_node_names();
        self.recompute_views(Some(&[name.to_string()]));
        set_changed
    }

    /// Drops interned values no device uses since slices went away; cheap
    /// to call after a batch of removals.
    pub(crate) fn prune_if_needed(&mut self) {
        if self.garbage > 4096 && self.garbage > self.device_count() {
            self.compactor.prune();
            self.garbage = 0;
        }
    }

    fn slot_for(&mut self, driver: &Arc<str>, pool: &Arc<str>) -> u32 {
        if let Some(&p) = self.pool_ids.get(&**driver).and_then(|m| m.get(&**pool)) {
            return p;
        }
        let p = self.slots.len() as u32;
        let (empty, _, _) = pools::assemble(
            Arc::clone(driver),
            Arc::clone(pool),
            Vec::new(),
            &mut pools::CheckedDraws::default(),
            None,
        );
        self.slots.push(PoolSlot {
            pool: empty,
            kept: Vec::new(),
            other: Vec::new(),
            counters: PoolCounters::default(),
            numbers: FastMap::default(),
            device_ids: FastMap::default(),
            local_nodes: BTreeSet::new(),
            device_node_names: Vec::new(),
            checked: pools::CheckedDraws::default(),
            consumptions: FastMap::default(),
            shared: false,
        });
        self.pool_ids.entry(Arc::clone(driver)).or_default().insert(Arc::clone(pool), p);
        p
    }

    /// Re-derives pool `p` from `slices`. Kept device slices other than
    /// `changed` keep their device numbers while the pool stays valid with
    /// the same counters; the others' numbers are retired (and reused
    /// later) and their devices numbered anew. When `update_views`, the
    /// views of the nodes the pool touched before or touches now are
    /// recomputed.
    fn reassemble(
        &mut self,
        p: u32,
        slices: Vec<CompactSlice>,
        changed: Option<Changed<'_>>,
        update_views: bool,
    ) -> PoolChange {
        let Some(slot) = self.slots.get_mut(p as usize) else { return PoolChange::default() };
        let mut change = PoolChange { pool: p, ..Default::default() };
        let old_local = std::mem::take(&mut slot.local_nodes);
        let old_shared = slot.shared;
        for n in &old_local {
            if let Some(set) = self.local_pools.get_mut(n) {
                set.remove(&p);
            }
        }
        // Names the old slices mentioned; forgotten after the new ones are
        // counted, so a name that stays never leaves the node list.
        let mut old_mentions: Vec<String> = old_local.iter().cloned().collect();
        old_mentions.append(&mut slot.device_node_names);
        // The changed slice replaced one with the same device names in the
        // same order: its devices keep their numbers. When it also kept its
        // generation and the pool was valid with it kept (it has numbers),
        // only that slice needs checking again.
        let new_slice = changed.as_ref().and_then(|c| slices.iter().find(|s| &*s.name == c.name));
        let same_devices = changed.as_ref().zip(new_slice).is_some_and(|(c, new)| c.same_devices(&new.devices));
        let only_changed = changed
            .as_ref()
            .zip(new_slice)
            .filter(|(c, new)| {
                same_devices
                    && c.replaced.is_some_and(|r| r.generation == new.generation)
                    && slot.pool.problem.is_none()
                    && slot.numbers.contains_key(c.name)
            })
            .map(|(c, _)| c.name);
        let (pool, kept, other) = pools::assemble(
            Arc::clone(&slot.pool.driver),
            Arc::clone(&slot.pool.name),
            slices,
            &mut slot.checked,
            only_changed,
        );
        for s in kept.iter().chain(&other) {
            self.slice_home.insert(Arc::clone(&s.name), p);
        }
        let same_counters =
            Arc::ptr_eq(&pool.counter_sets, &slot.pool.counter_sets) || pool.counter_sets == slot.pool.counter_sets;
        let keep_numbers = pool.problem.is_none() && slot.pool.problem.is_none() && same_counters;
        if !same_counters {
            slot.counters = PoolCounters::new(&pool.counter_sets);
            slot.consumptions.clear();
        }
        let mut old_numbers = std::mem::take(&mut slot.numbers);
        slot.shared = false;
        let mut retired: Vec<u32> = Vec::new();
        let mut fresh: Vec<(Arc<str>, u32)> = Vec::new();
        for (i, s) in kept.iter().enumerate() {
            if s.is_counter_slice() {
                continue;
            }
            match s.node_name.as_deref().filter(|n| !n.is_empty()) {
                Some(n) => {
                    slot.local_nodes.insert(n.to_string());
                }
                None => slot.shared = true,
            }
            if s.per_device_node_selection {
                for n in per_device_nodes(s) {
                    self.names_dirty |= mention(&mut self.mentioned, n);
                    slot.device_node_names.push(n.to_string());
                }
            }
            let previous = old_numbers.remove(&s.name);
            if pool.problem.is_some() {
                retired.extend(previous.into_iter().flatten());
                continue;
            }
            if let Some(numbers) = previous {
                let is_changed = changed.as_ref().is_some_and(|c| c.name == &*s.name);
                let in_place = is_changed && same_devices;
                if keep_numbers && numbers.len() == s.devices.len() && (!is_changed || in_place) {
                    for (j, &d) in numbers.iter().enumerate() {
                        if let Some(r) = self.devices.get_mut(d as usize) {
                            *r = DeviceRef { pool: p, slice: i as u32, index: j as u32 };
                        }
                        // The same devices with new contents: new
                        // signatures and consumption, the same numbers (so
                        // what is allocated stays attached).
                        if let (true, Some(dev)) = (in_place, s.devices.get(j)) {
                            let same_draws = changed
                                .as_ref()
                                .and_then(|c| c.replaced?.devices.get(j))
                                .is_some_and(|old| Arc::ptr_eq(&old.consumes, &dev.consumes));
                            if !same_draws {
                                change.consumption_changed = true;
                                let consumption = slot.consumption_of(dev);
                                if let Some(c) = self.consumption.get_mut(d as usize) {
                                    *c = consumption;
                                }
                            }
                            let sig = self.signatures.acquire(&slot.pool.driver, dev);
                            if let Some(g) = self.device_signature.get_mut(d as usize) {
                                let old = std::mem::replace(g, sig);
                                if self.signatures.release(old) {
                                    change.released_signatures.push(old);
                                }
                            }
                        }
                    }
                    slot.numbers.insert(Arc::clone(&s.name), numbers);
                    continue;
                }
                retired.extend(numbers);
            }
            let mut numbers = Vec::with_capacity(s.devices.len());
            for (j, d) in s.devices.iter().enumerate() {
                let place = DeviceRef { pool: p, slice: i as u32, index: j as u32 };
                let consumption = slot.consumption_of(d);
                let sig = self.signatures.acquire(&slot.pool.driver, d);
                let id = match self.free.pop() {
                    Some(id) => {
                        if let (Some(r), Some(c), Some(g)) = (
                            self.devices.get_mut(id as usize),
                            self.consumption.get_mut(id as usize),
                            self.device_signature.get_mut(id as usize),
                        ) {
                            *r = place;
                            *c = consumption;
                            *g = sig;
                        }
                        id
                    }
                    None => {
                        self.devices.push(place);
                        self.consumption.push(consumption);
                        self.device_signature.push(sig);
                        (self.devices.len() - 1) as u32
                    }
                };
                numbers.push(id);
                fresh.push((Arc::clone(&d.name), id));
            }
            slot.numbers.insert(Arc::clone(&s.name), numbers);
        }
        retired.extend(old_numbers.into_values().flatten());
        if !retired.is_empty() {
            let gone: std::collections::HashSet<u32, foldhash::fast::RandomState> = retired.iter().copied().collect();
            slot.device_ids.retain(|name, d| {
                let keep = !gone.contains(d);
                if !keep {
                    change.retired.push((*d, Arc::clone(name)));
                }
                keep
            });
        }
        let fresh_empty = fresh.is_empty();
        slot.device_ids.extend(fresh);
        if slot.consumptions.len() > 2 * slot.device_ids.len() + 64 {
            // Layouts come and go: forget the old ones' (the rest refill).
            slot.consumptions.clear();
        }
        self.garbage += retired.len();
        change.consumption_changed |= !same_counters || !retired.is_empty() || !fresh_empty;
        for d in retired {
            if let Some(r) = self.devices.get_mut(d as usize) {
                r.pool = DEAD;
            }
            self.free.push(d);
            let sig = self.device_signature.get(d as usize).copied().unwrap_or(u32::MAX);
            if self.signatures.release(sig) {
                change.released_signatures.push(sig);
            }
        }
        for n in &slot.local_nodes {
            self.names_dirty |= mention(&mut self.mentioned, n);
            self.local_pools.entry(n.clone()).or_default().insert(p);
        }
        for n in &old_mentions {
            self.names_dirty |= forget(&mut self.mentioned, n);
        }
        if slot.shared {
            self.shared_pools.insert(p);
        } else {
            self.shared_pools.remove(&p);
        }
        slot.pool = pool;
        slot.kept = kept;
        slot.other = other;
        let everywhere = old_shared || slot.shared;
        let mut touched: BTreeSet<String> = old_local;
        touched.extend(slot.local_nodes.iter().cloned());
        if update_views {
            change.node_set_changed = self.refresh_node_names();
            if everywhere {
                self.recompute_views(None);
            } else {
                let nodes: Vec<String> = touched.into_iter().collect();
                self.recompute_views(Some(&nodes));
                change.nodes = Some(nodes);
            }
        }
        change
    }

    /// Recomputes the sorted node list; true when it changed.
    fn refresh_node_names(&mut self) -> bool {
        if !std::mem::take(&mut self.names_dirty) {
            return false;
        }
        let mut names: BTreeSet<&String> = self.known_nodes.keys().collect();
        names.extend(self.mentioned.keys());
        if names.len() == self.node_names.len() && names.iter().zip(&self.node_names).all(|(a, b)| *a == b) {
            return false;
        }
        self.node_names = names.into_iter().cloned().collect();
        self.node_index = self.node_names.iter().enumerate().map(|(i, n)| (n.clone(), i)).collect();
        self.views.retain(|n, _| self.node_index.contains_key(n));
        true
    }

    fn recompute_views(&mut self, nodes: Option<&[String]>) {
        let names: Vec<String> = match nodes {
            Some(n) => n.iter().filter(|n| self.node_index.contains_key(*n)).cloned().collect(),
            None => self.node_names.clone(),
        };
        for n in names {
            let info = self.node_info(&n);
            let view = self.compute_view(&info);
            self.views.insert(n, view);
        }
    }

    fn node_info(&self, name: &str) -> NodeInfo {
        self.known_nodes
            .get(name)
            .cloned()
            .unwrap_or_else(|| NodeInfo { name: name.to_string(), labels: Default::default() })
    }

    pub(crate) fn node_names(&self) -> &[String] {
        &self.node_names
    }

    pub(crate) fn node_position(&self, node: &str) -> Option<usize> {
        self.node_index.get(node).copied()
    }

    /// Live devices.
    pub(crate) fn device_count(&self) -> usize {
        self.devices.len() - self.free.len()
    }

    /// Device numbers handed out (live and retired).
    pub(crate) fn device_numbers(&self) -> usize {
        self.devices.len()
    }

    /// A device's signature number ([`Signature`]).
    pub(crate) fn signature(&self, d: u32) -> u32 {
        self.device_signature.get(d as usize).copied().unwrap_or(u32::MAX)
    }

    /// Signatures numbered so far: the size of per-signature caches.
    pub(crate) fn signature_count(&self) -> usize {
        self.signatures.by_number.len()
    }

    pub(crate) fn slice_count(&self) -> usize {
        self.slots.iter().map(|s| s.kept.len() + s.other.len()).sum()
    }

    /// The view of any node: precomputed when known, else computed for a
    /// node without labels.
    pub(crate) fn view(&self, node: &str) -> std::borrow::Cow<'_, NodeView> {
        match self.views.get(node) {
            Some(v) => std::borrow::Cow::Borrowed(v),
            None => std::borrow::Cow::Owned(self.compute_view(&self.node_info(node))),
        }
    }

    pub(crate) fn pool(&self, p: u32) -> Option<&Pool> {
        self.slots.get(p as usize).map(|s| &s.pool)
    }

    pub(crate) fn device_ref(&self, d: u32) -> Option<DeviceRef> {
        self.devices.get(d as usize).copied().filter(|r| r.pool != DEAD)
    }

    fn slice_of(&self, d: u32) -> Option<&CompactSlice> {
        let r = self.device_ref(d)?;
        self.slots.get(r.pool as usize)?.kept.get(r.slice as usize)
    }

    pub(crate) fn device(&self, d: u32) -> Option<&DeviceRecord> {
        let r = self.device_ref(d)?;
        self.slots.get(r.pool as usize)?.kept.get(r.slice as usize)?.devices.get(r.index as usize)
    }

    /// A device's counter consumption (empty when it consumes none).
    pub(crate) fn consumption(&self, d: u32) -> &[(u32, dra_cel::quantity::Quantity)] {
        self.consumption.get(d as usize).map(|c| &c[..]).unwrap_or_default()
    }

    pub(crate) fn pool_counters(&self, p: u32) -> Option<&PoolCounters> {
        self.slots.get(p as usize).map(|s| &s.counters)
    }

    pub(crate) fn pool_of(&self, d: u32) -> Option<&Pool> {
        self.device_ref(d).and_then(|r| self.pool(r.pool))
    }

    /// The live devices of pool `p`, by number.
    pub(crate) fn pool_devices(&self, p: u32) -> impl Iterator<Item = (&Arc<str>, u32)> {
        self.slots.get(p as usize).into_iter().flat_map(|s| s.device_ids.iter().map(|(n, &d)| (n, d)))
    }

    /// `driver`, `pool`, `device` of a device.
    pub(crate) fn id(&self, d: u32) -> (&str, &str, &str) {
        match (self.pool_of(d), self.device(d)) {
            (Some(p), Some(dev)) => (&p.driver, &p.name, &dev.name),
            _ => ("", "", ""),
        }
    }

    /// `driver/pool/device`, for messages.
    pub(crate) fn describe(&self, d: u32) -> String {
        let (driver, pool, device) = self.id(d);
        format!("{driver}/{pool}/{device}")
    }

    pub(crate) fn lookup(&self, driver: &str, pool: &str, device: &str) -> Option<u32> {
        let p = *self.pool_ids.get(driver)?.get(pool)?;
        self.slots.get(p as usize)?.device_ids.get(device).copied()
    }

    /// Where a device may be used: the device's own selection when its slice
    /// uses `perDeviceNodeSelection`, else the slice's.
    pub(crate) fn reach(&self, d: u32) -> Reach<'_> {
        match (self.slice_of(d), self.device(d)) {
            (Some(s), Some(dev)) if s.per_device_node_selection => device_reach(dev),
            (Some(s), _) => Reach::of(s.node_name.as_ref(), s.all_nodes, s.node_selector.as_ref()),
            _ => Reach::Unknown,
        }
    }

    fn compute_view(&self, node: &NodeInfo) -> NodeView {
        let mut pools: Vec<u32> =
            self.local_pools.get(&node.name).map(|s| s.iter().copied().collect()).unwrap_or_default();
        pools.extend(self.shared_pools.iter().copied());
        pools.sort_unstable();
        pools.dedup();
        let mut error = None;
        let mut by_pool: Vec<(bool, &str, &str, u32, Vec<u32>)> = Vec::new();
        for p in pools {
            let Some(slot) = self.slots.get(p as usize) else { continue };
            let mut relevant_any = false;
            let mut devices = Vec::new();
            for s in &slot.kept {
                if s.is_counter_slice() {
                    // Counter slices matter to every node that uses the pool, not on their own.
                    continue;
                }
                let local = s.node_name.as_deref().filter(|n| !n.is_empty());
                let relevant = match local {
                    Some(n) => n == node.name,
                    None if s.per_device_node_selection => s.devices.iter().any(|d| {
                        device_reach(d).matches(node).unwrap_or_else(|e| {
                            error.get_or_insert_with(|| format!("slice {}: device {}: {e}", s.name, d.name));
                            false
                        })
                    }),
                    None => Reach::of(None, s.all_nodes, s.node_selector.as_ref()).matches(node).unwrap_or_else(|e| {
                        error.get_or_insert_with(|| format!("slice {}: {e}", s.name));
                        false
                    }),
                };
                if !relevant {
                    continue;
                }
                relevant_any = true;
                if slot.pool.problem.is_some() {
                    continue;
                }
                let Some(numbers) = slot.numbers.get(&s.name) else { continue };
                for (&d, dev) in numbers.iter().zip(&s.devices) {
                    if s.per_device_node_selection
                        && local.is_none()
                        && !device_reach(dev).matches(node).unwrap_or(false)
                    {
                        continue;
                    }
                    devices.push(d);
                }
            }
            if relevant_any {
                by_pool.push((slot.pool.binding_conditions, &slot.pool.driver, &slot.pool.name, p, devices));
            }
        }
        // Pools by (driver, name), those with binding conditions last.
        by_pool.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
        let mut view = NodeView { error, ..Default::default() };
        for (_, _, _, p, devices) in by_pool {
            if self.pool_problem(p).is_some() {
                view.problem_pools.push(p);
            }
            view.devices.extend(devices);
        }
        view
    }

    /// The problem of a pool, if any.
    pub(crate) fn pool_problem(&self, p: u32) -> Option<&PoolProblem> {
        self.pool(p).and_then(|pool| pool.problem.as_ref())
    }
}

/// The per-device `nodeName`s of a `perDeviceNodeSelection` slice.
fn per_device_nodes(s: &CompactSlice) -> impl Iterator<Item = &str> {
    s.devices.iter().filter_map(|d| d.extra.as_deref().and_then(|e| e.node_name.as_deref())).filter(|n| !n.is_empty())
}

fn device_reach(d: &DeviceRecord) -> Reach<'_> {
    match d.extra.as_deref() {
        Some(e) => Reach::of(e.node_name.as_ref(), e.all_nodes, e.node_selector.as_ref()),
        None => Reach::Unknown,
    }
}

/// Counts one more mention; true when the name is new.
fn mention(counts: &mut BTreeMap<String, usize>, name: &str) -> bool {
    match counts.get_mut(name) {
        Some(c) => {
            *c += 1;
            false
        }
        None => {
            counts.insert(name.to_string(), 1);
            true
        }
    }
}

/// Counts one mention less; true when the name is gone.
fn forget(counts: &mut BTreeMap<String, usize>, name: &str) -> bool {
    if let Some(c) = counts.get_mut(name) {
        *c -= 1;
        if *c == 0 {
            counts.remove(name);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn nodes_see_their_own_and_matching_shared_devices() {
        let mut shared = slice("net", "", "fabric", 1, 1, vec![device("nic-0")]);
        shared.spec.node_name = None;
        shared.spec.node_selector = Some(label_selector("zone", &["a"]));
        let mut everywhere = slice("all", "", "global", 1, 1, vec![device("lic-0")]);
        everywhere.spec.node_name = None;
        everywhere.spec.all_nodes = Some(true);
        let fleet = Fleet::build(
            &[node_slice("n1", vec![device("gpu-0")]), node_slice("n2", vec![device("gpu-0")]), shared, everywhere],
            &[node("n1", &[("zone", "a")]), node("n2", &[("zone", "b")])],
        );
        assert_eq!(fleet.node_names(), ["n1", "n2"]);
        let names = |n: &str| -> Vec<String> { fleet.view(n).devices.iter().map(|&d| fleet.describe(d)).collect() };
        assert_eq!(
            names("n1"),
            ["gpu.nvidia.com/fabric/nic-0", "gpu.nvidia.com/global/lic-0", "gpu.nvidia.com/n1/gpu-0"]
        );
        assert_eq!(names("n2"), ["gpu.nvidia.com/global/lic-0", "gpu.nvidia.com/n2/gpu-0"]);
        assert_eq!(names("unknown"), ["gpu.nvidia.com/global/lic-0"]);
    }

    #[test]
    fn per_device_node_selection_filters_devices() {
        let mut s = slice("multi", "", "rack", 1, 1, vec![]);
        s.spec.node_name = None;
        s.spec.per_device_node_selection = Some(true);
        let mut a = device("a");
        a.node_name = Some("n1".into());
        let mut b = device("b");
        b.node_selector = Some(label_selector("zone", &["z"]));
        let mut c = device("c");
        c.all_nodes = Some(true);
        s.spec.devices = Some(vec![a, b, c]);
        let fleet = Fleet::build(&[s], &[node("n2", &[("zone", "z")])]);
        assert_eq!(fleet.node_names(), ["n1", "n2"], "per-device nodeName names a node");
        let names = |n: &str| -> Vec<&str> { fleet.view(n).devices.iter().map(|&d| fleet.id(d).2).collect() };
        assert_eq!(names("n1"), ["a", "c"]);
        assert_eq!(names("n2"), ["b", "c"]);
    }

    #[test]
    fn problem_pools_are_visible_but_have_no_devices() {
        let fleet = Fleet::build(&[slice("s", "n1", "p", 1, 2, vec![device("gpu-0")])], &[]);
        let view = fleet.view("n1");
        assert!(view.devices.is_empty());
        assert_eq!(view.problem_pools.len(), 1);
    }
}

#[cfg(test)]
mod update_tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn republishing_a_slice_keeps_the_node_list() {
        let mut fleet = Fleet::build(
            &[node_slice("n1", vec![device("gpu-0")]), node_slice("n2", vec![device("gpu-0")])],
            &[node("n1", &[])],
        );
        assert!(!fleet.names_dirty);
        let changes = fleet.apply_slice(&node_slice("n2", vec![device("gpu-0").string("driverVersion", "2")]));
        assert!(!fleet.names_dirty, "the same nodes are mentioned");
        assert!(changes.iter().all(|c| !c.node_set_changed));
        assert_eq!(fleet.mentioned.get("n2"), Some(&1));
    }

    #[test]
    fn republished_maps_do_not_pile_up() {
        let slice = |v: &str| {
            node_slice(
                "n1",
                (0..4)
                    .map(|g| {
                        device(&format!("gpu-{g}"))
                            .string("uuid", &format!("GPU-{g}"))
                            .int("v", v.len() as i64)
                            .string("ver", v)
                    })
                    .collect(),
            )
        };
        let mut fleet = Fleet::build(&[slice("a")], &[]);
        for i in 0..50 {
            fleet.apply_slice(&slice(&"b".repeat(i + 1)));
        }
        assert_eq!(
            fleet.compactor.attribute_maps(),
            5,
            "only the live devices' maps are kept: four identities, one common part"
        );
        assert_eq!(fleet.device_count(), 4);
    }
}
