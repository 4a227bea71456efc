//! The fleet's devices in compact form: each ResourceSlice is converted once
//! and the k8s-openapi object dropped.
//!
//! Names, string values, whole attribute maps, capacity maps and counter
//! consumptions are interned: the devices of a fleet repeat the same
//! `productName`, `driverVersion`, device names and MIG layouts on every
//! node, so a device costs a few pointers plus what is really its own
//! (`uuid`, `pciBusID`). A k8s `Device` is several KiB; a [`DeviceRecord`]
//! is under 100 bytes plus its share of the interned maps.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

use k8s_openapi::api::core::v1::NodeSelector;

use super::amount::Amount;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceTaint, ResourceSlice,
};

/// A typed attribute value. Versions keep their text: constraints compare
/// them as strings and CEL parses them when it builds the device value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum AttrValue {
    Bool(bool),
    Int(i64),
    Str(Arc<str>),
    Version(Arc<str>),
    /// List-typed attributes (1.36 alpha): kept whole, they never match a
    /// constraint and CEL builds them as lists.
    List(Arc<ListValue>),
    /// None of the value fields set (the apiserver refuses it; a CEL runtime
    /// error when a selector reads it).
    Empty,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ListValue {
    Bools(Vec<bool>),
    Ints(Vec<i64>),
    Strings(Vec<String>),
    Versions(Vec<String>),
}

/// A device's attributes, sorted by (qualified or bare) name as published.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Attributes(pub(crate) Box<[(Arc<str>, AttrValue)]>);

impl Attributes {
    pub(crate) fn get(&self, name: &str) -> Option<&AttrValue> {
        let i = self.0.binary_search_by(|(k, _)| (**k).cmp(name)).ok()?;
        self.0.get(i).map(|(_, v)| v)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &AttrValue)> {
        self.0.iter().map(|(k, v)| (&**k, v))
    }
}

/// One capacity: its quantity as published and its request policy.
#[derive(Debug, PartialEq)]
pub(crate) struct CapacityEntry {
    pub(crate) value: Arc<str>,
    pub(crate) request_policy: Option<CapacityRequestPolicy>,
}

impl Eq for CapacityEntry {}

impl Hash for CapacityEntry {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Policies are rare and equal ones land in one bucket anyway.
        self.value.hash(state);
        self.request_policy.is_some().hash(state);
    }
}

/// A device's capacities, sorted by name.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Capacities(pub(crate) Box<[(Arc<str>, CapacityEntry)]>);

impl Capacities {
    pub(crate) fn get(&self, name: &str) -> Option<&CapacityEntry> {
        let i = self.0.binary_search_by(|(k, _)| (**k).cmp(name)).ok()?;
        self.0.get(i).map(|(_, v)| v)
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &CapacityEntry)> {
        self.0.iter().map(|(k, v)| (&**k, v))
    }
}

/// What a device draws from one counter set: (counter, quantity as
/// published, its amount when it parses). Equality and hashing look at the
/// text only (the amount follows from it), so a draw is interned before
/// its quantities are parsed, and parsed once.
#[derive(Debug)]
pub(crate) struct CounterDraw {
    pub(crate) set: Arc<str>,
    pub(crate) counters: Box<[CounterAmount]>,
}

/// One counter of a draw: name, quantity as published, amount if it parses.
pub(crate) type CounterAmount = (Arc<str>, Arc<str>, Option<Amount>);

impl PartialEq for CounterDraw {
    fn eq(&self, other: &Self) -> bool {
        self.set == other.set
            && self.counters.len() == other.counters.len()
            && self.counters.iter().zip(other.counters.iter()).all(|(a, b)| a.0 == b.0 && a.1 == b.1)
    }
}

impl Eq for CounterDraw {}

impl Hash for CounterDraw {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.set.hash(state);
        for (name, value, _) in self.counters.iter() {
            name.hash(state);
            value.hash(state);
        }
    }
}

/// The rarely set parts of a device, boxed so most devices pay one pointer.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct DeviceExtra {
    pub(crate) taints: Vec<DeviceTaint>,
    pub(crate) binding_conditions: Option<Vec<String>>,
    pub(crate) binding_failure_conditions: Option<Vec<String>>,
    pub(crate) binds_to_node: Option<bool>,
    /// Per-device node selection (`perDeviceNodeSelection` slices).
    pub(crate) node_name: Option<String>,
    pub(crate) all_nodes: Option<bool>,
    pub(crate) node_selector: Option<NodeSelector>,
}

/// One device of a slice, compact.
#[derive(Debug, Clone)]
pub(crate) struct DeviceRecord {
    pub(crate) name: Arc<str>,
    pub(crate) attributes: Arc<Attributes>,
    pub(crate) capacity: Arc<Capacities>,
    pub(crate) consumes: Arc<[CounterDraw]>,
    pub(crate) allow_multiple_allocations: bool,
    pub(crate) extra: Option<Box<DeviceExtra>>,
}

impl DeviceRecord {
    pub(crate) fn taints(&self) -> &[DeviceTaint] {
        self.extra.as_deref().map(|e| &e.taints[..]).unwrap_or_default()
    }

    pub(crate) fn has_binding_conditions(&self) -> bool {
        self.extra.as_deref().is_some_and(|e| e.binding_conditions.is_some())
    }
}

/// A slice, compact: where it applies, and its devices or counter sets.
#[derive(Debug, Clone)]
pub(crate) struct CompactSlice {
    pub(crate) name: Arc<str>,
    pub(crate) driver: Arc<str>,
    pub(crate) pool: Arc<str>,
    pub(crate) generation: i64,
    pub(crate) resource_slice_count: i64,
    pub(crate) node_name: Option<String>,
    pub(crate) all_nodes: Option<bool>,
    pub(crate) node_selector: Option<NodeSelector>,
    pub(crate) per_device_node_selection: bool,
    pub(crate) shared_counters: Vec<CounterSet>,
    pub(crate) devices: Vec<DeviceRecord>,
}

impl CompactSlice {
    /// Carries counters rather than devices (1.35+: one or the other).
    pub(crate) fn is_counter_slice(&self) -> bool {
        !self.shared_counters.is_empty()
    }
}

/// Interned values of one kind. Keys are short strings and small maps,
/// hashed on every slice event: a fast hasher matters more than DoS
/// resistance (slices come from the API server, written by drivers).
///
/// A fleet's table holds hundreds of thousands of values, so a lookup in it
/// is a cache miss; a slice repeats the same names and values device after
/// device, so a small direct-mapped table of recent values (which stays in
/// cache) answers most lookups first.
#[derive(Debug)]
struct Pool<T: ?Sized> {
    all: HashSet<Arc<T>, foldhash::fast::RandomState>,
    recent: Vec<Option<Arc<T>>>,
}

const RECENT: usize = 1024;

impl<T: ?Sized> Default for Pool<T> {
    fn default() -> Self {
        Pool { all: HashSet::default(), recent: vec![None; RECENT] }
    }
}

impl<T: ?Sized + Hash + Eq> Pool<T> {
    fn slot(&self, value: &T) -> usize {
        use std::hash::BuildHasher;
        (self.all.hasher().hash_one(value) as usize) % RECENT
    }

    fn get(&mut self, value: &T) -> Option<Arc<T>> {
        let slot = self.slot(value);
        if let Some(Some(hit)) = self.recent.get(slot)
            && **hit == *value
        {
            return Some(Arc::clone(hit));
        }
        let found = Arc::clone(self.all.get(value)?);
        if let Some(entry) = self.recent.get_mut(slot) {
            *entry = Some(Arc::clone(&found));
        }
        Some(found)
    }

    fn intern(&mut self, value: Arc<T>) -> Arc<T> {
        if let Some(found) = self.get(&value) {
            return found;
        }
        let slot = self.slot(&value);
        if let Some(entry) = self.recent.get_mut(slot) {
            *entry = Some(Arc::clone(&value));
        }
        self.all.insert(Arc::clone(&value));
        value
    }

    /// Forgets values nothing else holds any more.
    fn prune(&mut self) {
        self.recent.iter_mut().for_each(|e| *e = None);
        self.all.retain(|v| Arc::strong_count(v) > 1);
    }
}

impl Pool<str> {
    fn str(&mut self, s: &str) -> Arc<str> {
        match self.get(s) {
            Some(found) => found,
            None => self.intern(Arc::from(s)),
        }
    }
}

/// Converts slices to compact form, sharing what repeats.
#[derive(Debug, Default)]
pub(crate) struct Compactor {
    strings: Pool<str>,
    attributes: Pool<Attributes>,
    capacities: Pool<Capacities>,
    draws: Pool<[CounterDraw]>,
}

impl Compactor {
    pub(crate) fn str(&mut self, s: &str) -> Arc<str> {
        self.strings.str(s)
    }

    pub(crate) fn slice(&mut self, s: &ResourceSlice) -> CompactSlice {
        CompactSlice {
            name: self.str(s.metadata.name.as_deref().unwrap_or_default()),
            driver: self.str(&s.spec.driver),
            pool: self.str(&s.spec.pool.name),
            generation: s.spec.pool.generation,
            resource_slice_count: s.spec.pool.resource_slice_count,
            node_name: s.spec.node_name.clone(),
            all_nodes: s.spec.all_nodes,
            node_selector: s.spec.node_selector.clone(),
            per_device_node_selection: s.spec.per_device_node_selection == Some(true),
            shared_counters: s.spec.shared_counters.clone().unwrap_or_default(),
            devices: s.spec.devices.as_deref().unwrap_or_default().iter().map(|d| self.device(d)).collect(),
        }
    }

    pub(crate) fn device(&mut self, d: &Device) -> DeviceRecord {
        let mut attributes: Vec<(Arc<str>, AttrValue)> =
            d.attributes.iter().flatten().map(|(name, a)| (self.str(name), self.attr(a))).collect();
        attributes.sort_by(|a, b| a.0.cmp(&b.0));
        let mut capacity: Vec<(Arc<str>, CapacityEntry)> =
            d.capacity.iter().flatten().map(|(name, c)| (self.str(name), self.capacity_entry(c))).collect();
        capacity.sort_by(|a, b| a.0.cmp(&b.0));
        let draws: Vec<CounterDraw> = d
            .consumes_counters
            .iter()
            .flatten()
            .map(|c| CounterDraw {
                set: self.str(&c.counter_set),
                counters: c.counters.iter().map(|(k, v)| (self.str(k), self.str(&v.value.0), None)).collect(),
            })
            .collect();
        let extra = DeviceExtra {
            taints: d.taints.clone().unwrap_or_default(),
            binding_conditions: d.binding_conditions.clone(),
            binding_failure_conditions: d.binding_failure_conditions.clone(),
            binds_to_node: d.binds_to_node,
            node_name: d.node_name.clone(),
            all_nodes: d.all_nodes,
            node_selector: d.node_selector.clone(),
        };
        DeviceRecord {
            name: self.str(&d.name),
            attributes: self.attributes.intern(Arc::new(Attributes(attributes.into_boxed_slice()))),
            capacity: self.capacities.intern(Arc::new(Capacities(capacity.into_boxed_slice()))),
            consumes: self.draws(draws),
            allow_multiple_allocations: d.allow_multiple_allocations == Some(true),
            extra: (extra != DeviceExtra::default()).then(|| Box::new(extra)),
        }
    }

    /// Interns a device's draws; new ones get their quantities parsed.
    fn draws(&mut self, mut draws: Vec<CounterDraw>) -> Arc<[CounterDraw]> {
        if let Some(found) = self.draws.get(&draws[..]) {
            return found;
        }
        for draw in &mut draws {
            for (_, value, amount) in draw.counters.iter_mut() {
                *amount = Amount::parse_str(value).ok();
            }
        }
        self.draws.intern(Arc::from(draws))
    }

    fn attr(&mut self, a: &DeviceAttribute) -> AttrValue {
        if let Some(i) = a.int {
            return AttrValue::Int(i);
        }
        if let Some(b) = a.bool {
            return AttrValue::Bool(b);
        }
        if let Some(s) = &a.string {
            return AttrValue::Str(self.str(s));
        }
        if let Some(v) = &a.version {
            return AttrValue::Version(self.str(v));
        }
        let list = match (&a.ints, &a.bools, &a.strings, &a.versions) {
            (Some(v), _, _, _) => ListValue::Ints(v.clone()),
            (_, Some(v), _, _) => ListValue::Bools(v.clone()),
            (_, _, Some(v), _) => ListValue::Strings(v.clone()),
            (_, _, _, Some(v)) => ListValue::Versions(v.clone()),
            _ => return AttrValue::Empty,
        };
        AttrValue::List(Arc::new(list))
    }

    fn capacity_entry(&mut self, c: &DeviceCapacity) -> CapacityEntry {
        CapacityEntry { value: self.str(&c.value.0), request_policy: c.request_policy.clone() }
    }

    /// Drops interned values no device uses any more (after slices went away).
    pub(crate) fn prune(&mut self) {
        self.attributes.prune();
        self.capacities.prune();
        self.draws.prune();
        self.strings.prune();
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn repeated_maps_and_strings_are_shared() {
        let mut c = Compactor::default();
        let a = c.device(&device("gpu-0").string("productName", "H100").cap("memory", "80Gi"));
        let b = c.device(&device("gpu-0").string("productName", "H100").cap("memory", "80Gi"));
        assert!(Arc::ptr_eq(&a.attributes, &b.attributes));
        assert!(Arc::ptr_eq(&a.capacity, &b.capacity));
        assert!(Arc::ptr_eq(&a.name, &b.name));
        assert_eq!(a.attributes.get("productName"), Some(&AttrValue::Str("H100".into())));
        assert!(a.extra.is_none(), "no rare fields, no box");
    }

    #[test]
    fn pruning_keeps_what_is_in_use() {
        let mut c = Compactor::default();
        let kept = c.device(&device("gpu-0").string("uuid", "GPU-a"));
        drop(c.device(&device("gpu-1").string("uuid", "GPU-b")));
        c.prune();
        assert_eq!(c.attributes.all.len(), 1);
        assert!(c.strings.all.contains("GPU-a") && !c.strings.all.contains("GPU-b"));
        drop(kept);
    }
}
