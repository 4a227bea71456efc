//! The fleet's devices in compact form: each ResourceSlice is converted once
//! and the k8s-openapi object dropped.
//!
//! Names, string values, whole attribute maps, capacity maps and counter
//! consumptions are interned: the devices of a fleet repeat the same
//! `productName`, `driverVersion`, device names and MIG layouts on every
//! node, so a device costs a few pointers plus what is really its own
//! (`uuid`, `pciBusID`). A k8s `Device` is several KiB; a [`DeviceRecord`]
//! is under 100 bytes plus its share of the interned maps.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use dra_cel::quantity::Quantity;
use hashbrown::HashTable;
use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint,
    ResourceSlice,
};

use super::decode::{BadQuantity, decode_quantity};

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

/// An attribute: name and value.
pub(crate) type AttrEntry = (Arc<str>, AttrValue);

/// A device's attributes, in two interned parts split by name (see
/// [`is_identity`]): its identity (`uuid`, `parentUUID`), which no device of
/// another GPU shares, and the rest, which the same GPU model has alike on
/// every node. At fleet scale the rest is one allocation for thousands of
/// devices and a device pays for its identity alone (a whole map per device
/// made `kubectl gpu why` hold 460 bytes per device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attributes {
    common: Arc<[AttrEntry]>,
    identity: Arc<[AttrEntry]>,
}

impl Default for Attributes {
    fn default() -> Self {
        Attributes { common: Arc::from(Vec::new()), identity: Arc::from(Vec::new()) }
    }
}

/// Whether an attribute names what identifies one device (its bare name,
/// after any domain, ends in `uuid`, as `uuid` and `parentUUID` do): kept
/// apart so that the rest of the map is shared. Only sharing depends on
/// this rule, never what a device's attributes are.
fn is_identity(name: &str) -> bool {
    let bare = name.rsplit_once('/').map_or(name, |(_, id)| id);
    bare.len() >= 4 && bare.get(bare.len() - 4..).is_some_and(|tail| tail.eq_ignore_ascii_case("uuid"))
}

impl Attributes {
    /// The allocations' addresses: equal for equal maps of one compactor.
    pub(crate) fn addr(&self) -> (usize, usize) {
        (addr(&self.common), addr(&self.identity))
    }

    /// The same interned map.
    #[cfg(test)]
    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.common, &other.common) && Arc::ptr_eq(&self.identity, &other.identity)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&AttrValue> {
        let part = if is_identity(name) { &self.identity } else { &self.common };
        let i = part.binary_search_by(|(k, _)| (**k).cmp(name)).ok()?;
        part.get(i).map(|(_, v)| v)
    }

    /// All entries, sorted by name (the two parts merged).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &AttrValue)> {
        self.entries().map(|(k, v)| (&**k, v))
    }

    fn len(&self) -> usize {
        self.common.len() + self.identity.len()
    }

    fn entries(&self) -> impl Iterator<Item = &AttrEntry> {
        let (mut common, mut identity) = (self.common.iter().peekable(), self.identity.iter().peekable());
        std::iter::from_fn(move || match (common.peek(), identity.peek()) {
            (Some((c, _)), Some((i, _))) if **i < **c => identity.next(),
            (Some(_), _) => common.next(),
            (None, _) => identity.next(),
        })
    }
}

/// One capacity: its quantity as published and its request policy.
#[derive(Debug, PartialEq)]
pub(crate) struct CapacityEntry {
    pub(crate) value: Arc<str>,
    pub(crate) request_policy: Option<CapacityRequestPolicy>,
}

impl Eq for CapacityEntry {}

/// A capacity: name and entry.
pub(crate) type CapacityPair = (Arc<str>, CapacityEntry);

/// A device's capacities, sorted by name: one allocation, shared by the
/// devices that have the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Capacities(Arc<[CapacityPair]>);

impl Default for Capacities {
    fn default() -> Self {
        Capacities(Arc::from(Vec::new()))
    }
}

impl Capacities {
    /// The allocation's address: equal for equal maps of one compactor.
    pub(crate) fn addr(&self) -> usize {
        addr(&self.0)
    }

    /// The same interned map.
    #[cfg(test)]
    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

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
/// published, its amount when it parses). Interned by text (see
/// `draws_hash` / `draws_match`): the amount follows from it, so it is
/// parsed once, when a draw is first seen.
#[derive(Debug)]
pub(crate) struct CounterDraw {
    pub(crate) set: Arc<str>,
    pub(crate) counters: Box<[CounterAmount]>,
}

/// One counter of a draw: name, quantity as published, amount if it parses.
pub(crate) type CounterAmount = (Arc<str>, Arc<str>, Option<Quantity>);

/// Devices converted before that a new one is likely to resemble.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Like<'a> {
    /// The device converted just before (same slice).
    pub(crate) before: Option<&'a DeviceRecord>,
    /// The device at the same position in the slice being replaced.
    pub(crate) replaced: Option<&'a DeviceRecord>,
}

impl<'a> Like<'a> {
    /// The same part of both, the one before first (it is in cache).
    fn map<T>(self, part: impl Fn(&'a DeviceRecord) -> &'a T) -> [Option<&'a T>; 2] {
        [self.before.map(&part), self.replaced.map(&part)]
    }
}

/// The rarely set parts of a device, boxed so most devices pay one pointer.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct DeviceExtra {
    /// The slice's own taints, then those of the DeviceTaintRules that
    /// name the device (added by the fleet, see `own_taints`).
    pub(crate) taints: Vec<DeviceTaint>,
    /// How many of `taints` are the slice's own: the rest come from rules
    /// and are replaced when the rules change.
    pub(crate) own_taints: usize,
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
    pub(crate) attributes: Attributes,
    pub(crate) capacity: Capacities,
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
    /// The slice's counter sets, parsed (empty for device-only slices).
    pub(crate) counter_sets: SliceCounterSets,
    /// Some device has binding conditions.
    pub(crate) binding_conditions: bool,
    pub(crate) devices: Vec<DeviceRecord>,
}

impl CompactSlice {
    /// Carries counters and no devices (1.35+: one or the other).
    pub(crate) fn is_counter_slice(&self) -> bool {
        self.has_counters() && self.devices.is_empty()
    }

    /// Defines counter sets: a counter slice, or (1.34) a slice with both
    /// counter sets and the devices consuming them.
    pub(crate) fn has_counters(&self) -> bool {
        !self.counter_sets.is_empty()
    }
}

/// Interned values of one kind, in a table the caller hashes and compares
/// into: a lookup can hash a value still in its k8s form (counter draws)
/// or by the addresses of its already interned parts (attribute and
/// capacity maps), so a hit allocates nothing. Keys are short strings and
/// small maps hashed on every slice event: a fast hasher matters more than
/// DoS resistance (slices come from the API server, written by drivers).
///
/// A fleet's table holds hundreds of thousands of values, so a lookup in it
/// is a cache miss; a slice repeats the same names and values device after
/// device, so a small direct-mapped table of recent values (which stays in
/// cache) answers most lookups first.
#[derive(Debug)]
struct Table<T: ?Sized> {
    /// With each value its hash: growing the table rehashes without
    /// reading the values (each read would be a cache miss).
    all: HashTable<(u64, Arc<T>)>,
    recent: Vec<Option<(u64, Arc<T>)>>,
}

const RECENT: usize = 1024;

impl<T: ?Sized> Default for Table<T> {
    fn default() -> Self {
        Table { all: HashTable::new(), recent: vec![None; RECENT] }
    }
}

impl<T: ?Sized> Table<T> {
    /// Without the recent cache: for values the caller mostly finds by
    /// comparing with devices it has at hand (attribute maps), where
    /// evicting a cold entry costs more than the cache saves.
    fn without_recent() -> Self {
        Table { all: HashTable::new(), recent: Vec::new() }
    }

    fn find(&mut self, hash: u64, eq: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        let slot = (hash as usize) % RECENT;
        if let Some(Some((h, hit))) = self.recent.get(slot)
            && *h == hash
            && eq(hit)
        {
            return Some(Arc::clone(hit));
        }
        let found = Arc::clone(&self.all.find(hash, |(h, v)| *h == hash && eq(v))?.1);
        if let Some(entry) = self.recent.get_mut(slot) {
            *entry = Some((hash, Arc::clone(&found)));
        }
        Some(found)
    }

    /// Adds a value `find` did not find.
    fn insert(&mut self, hash: u64, value: Arc<T>) -> Arc<T> {
        if let Some(entry) = self.recent.get_mut((hash as usize) % RECENT) {
            *entry = Some((hash, Arc::clone(&value)));
        }
        self.all.insert_unique(hash, (hash, Arc::clone(&value)), |(h, _)| *h);
        value
    }

    /// Drops `value` (hashed `hash`) from the table when nothing else holds
    /// it: the caller's reference, the table's and the recent cache's are
    /// all there are.
    fn release(&mut self, hash: u64, value: Arc<T>) {
        let slot = (hash as usize) % RECENT;
        let in_recent = matches!(self.recent.get(slot), Some(Some((_, v))) if Arc::ptr_eq(v, &value));
        if Arc::strong_count(&value) != 2 + usize::from(in_recent) {
            return;
        }
        if let (true, Some(entry)) = (in_recent, self.recent.get_mut(slot)) {
            *entry = None;
        }
        if let Ok(entry) = self.all.find_entry(hash, |(_, v)| Arc::ptr_eq(v, &value)) {
            entry.remove();
        }
    }

    /// Forgets values nothing else holds any more.
    fn prune(&mut self) {
        self.recent.iter_mut().for_each(|e| *e = None);
        self.all.retain(|(_, v)| Arc::strong_count(v) > 1);
    }
}

/// Converts slices to compact form, sharing what repeats.
///
/// Invariant the maps' hashing relies on: every `Arc<str>` inside an
/// interned attribute or capacity map came from `strings`, so equal text
/// means the same address and those maps hash and compare by address.
#[derive(Debug)]
pub(crate) struct Compactor {
    hasher: foldhash::fast::RandomState,
    strings: Table<str>,
    attributes: Table<[AttrEntry]>,
    capacities: Table<[CapacityPair]>,
    draws: Table<[CounterDraw]>,
}

impl Default for Compactor {
    fn default() -> Self {
        Compactor {
            hasher: Default::default(),
            strings: Table::default(),
            attributes: Table::without_recent(),
            capacities: Table::default(),
            draws: Table::default(),
        }
    }
}

impl Compactor {
    pub(crate) fn str(&mut self, s: &str) -> Arc<str> {
        let hash = self.hasher.hash_one(s);
        if let Some(found) = self.strings.find(hash, |v| v == s) {
            return found;
        }
        self.strings.insert(hash, Arc::from(s))
    }

    /// `previous`: the slice this one replaces, if any. Each device is
    /// compared with the one converted before it (MIG devices repeat most
    /// of theirs, and it is still in cache) and with the previous slice's
    /// device at the same position (a driver republishing a slice changes a
    /// few values, not the layout); what is equal is reused without being
    /// hashed or looked up again.
    pub(crate) fn slice(&mut self, s: &ResourceSlice, previous: Option<&CompactSlice>) -> CompactSlice {
        let k8s_devices = s.spec.devices.as_deref().unwrap_or_default();
        let mut devices: Vec<DeviceRecord> = Vec::with_capacity(k8s_devices.len());
        for (i, d) in k8s_devices.iter().enumerate() {
            let like = Like { before: devices.last(), replaced: previous.and_then(|p| p.devices.get(i)) };
            let record = self.device(d, like);
            devices.push(record);
        }
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
            counter_sets: parse_counter_sets(s.spec.shared_counters.as_deref().unwrap_or_default()),
            binding_conditions: devices.iter().any(DeviceRecord::has_binding_conditions),
            devices,
        }
    }

    /// One device; what equals that of a device in `like` is taken from it.
    pub(crate) fn device(&mut self, d: &Device, like: Like<'_>) -> DeviceRecord {
        let taints = d.taints.clone().unwrap_or_default();
        let extra = DeviceExtra {
            own_taints: taints.len(),
            taints,
            binding_conditions: d.binding_conditions.clone(),
            binding_failure_conditions: d.binding_failure_conditions.clone(),
            binds_to_node: d.binds_to_node,
            node_name: d.node_name.clone(),
            all_nodes: d.all_nodes,
            node_selector: d.node_selector.clone(),
        };
        let name = match like.replaced {
            Some(l) if *l.name == *d.name => Arc::clone(&l.name),
            _ => self.str(&d.name),
        };
        let attributes = self.attributes(d.attributes.as_ref(), like.map(|l| &l.attributes));
        let capacity = self.capacities(d.capacity.as_ref(), like.map(|l| &l.capacity));
        let consumes = self.draws(d.consumes_counters.as_deref().unwrap_or_default(), like.map(|l| &l.consumes));
        DeviceRecord {
            name,
            attributes,
            capacity,
            consumes,
            allow_multiple_allocations: d.allow_multiple_allocations == Some(true),
            extra: (extra != DeviceExtra::default()).then(|| Box::new(extra)),
        }
    }

    fn attributes(
        &mut self,
        map: Option<&BTreeMap<String, DeviceAttribute>>,
        like: [Option<&Attributes>; 2],
    ) -> Attributes {
        let empty = BTreeMap::new();
        let map = map.unwrap_or(&empty);
        if let Some(same) = first_equal(like, |l| {
            map.len() == l.len() && map.iter().zip(l.entries()).all(|((n, a), (ln, lv))| *n == **ln && attr_is(a, lv))
        }) {
            return same;
        }
        let like = like[0].or(like[1]);
        let mut walk_common = SortedWalk::new(like.map(|l| &l.common[..]).unwrap_or_default());
        let mut walk_identity = SortedWalk::new(like.map(|l| &l.identity[..]).unwrap_or_default());
        let (mut common, mut identity) = (Vec::with_capacity(map.len()), Vec::new());
        for (n, a) in map {
            let (walk, part) =
                if is_identity(n) { (&mut walk_identity, &mut identity) } else { (&mut walk_common, &mut common) };
            part.push(match walk.entry(n) {
                Some((ln, lv)) => (Arc::clone(ln), if attr_is(a, lv) { lv.clone() } else { self.attr(a) }),
                None => (self.str(n), self.attr(a)),
            });
        }
        Attributes { common: self.attribute_part(common), identity: self.attribute_part(identity) }
    }

    /// One part of an attribute map, interned.
    fn attribute_part(&mut self, entries: Vec<AttrEntry>) -> Arc<[AttrEntry]> {
        let hash = attributes_hash(&self.hasher, &entries);
        if let Some(found) = self.attributes.find(hash, |a| same_attributes(a, &entries)) {
            return found;
        }
        self.attributes.insert(hash, Arc::from(entries))
    }

    fn capacities(
        &mut self,
        map: Option<&BTreeMap<String, DeviceCapacity>>,
        like: [Option<&Capacities>; 2],
    ) -> Capacities {
        let empty = BTreeMap::new();
        let map = map.unwrap_or(&empty);
        let equal =
            |c: &DeviceCapacity, e: &CapacityEntry| c.value.0 == *e.value && c.request_policy == e.request_policy;
        if let Some(same) = first_equal(like, |l| same_map(map, &l.0, equal)) {
            return same;
        }
        let like: &[CapacityPair] = like[0].or(like[1]).map(|l| &l.0[..]).unwrap_or_default();
        let mut walk = SortedWalk::new(like);
        let mut entries = Vec::with_capacity(map.len());
        for (n, c) in map {
            let (name, value) = match walk.entry(n) {
                Some((ln, e)) => {
                    (Arc::clone(ln), if c.value.0 == *e.value { Arc::clone(&e.value) } else { self.str(&c.value.0) })
                }
                None => (self.str(n), self.str(&c.value.0)),
            };
            entries.push((name, CapacityEntry { value, request_policy: c.request_policy.clone() }));
        }
        let hash = capacities_hash(&self.hasher, &entries);
        if let Some(found) = self.capacities.find(hash, |c| same_capacities(c, &entries)) {
            return Capacities(found);
        }
        Capacities(self.capacities.insert(hash, Arc::from(entries)))
    }

    /// Interns a device's draws, looked up in their k8s form; new ones get
    /// their quantities parsed.
    fn draws(
        &mut self,
        k8s: &[DeviceCounterConsumption],
        like: [Option<&Arc<[CounterDraw]>>; 2],
    ) -> Arc<[CounterDraw]> {
        if let Some(same) = first_equal(like, |l| draws_match(k8s, l)) {
            return same;
        }
        let hash = draws_hash(
            &self.hasher,
            k8s.iter().map(|c| (&*c.counter_set, c.counters.iter().map(|(n, v)| (&**n, &*v.value.0)))),
        );
        if let Some(found) = self.draws.find(hash, |d| draws_match(k8s, d)) {
            return found;
        }
        let draws: Vec<CounterDraw> = k8s
            .iter()
            .map(|c| CounterDraw {
                set: self.str(&c.counter_set),
                counters: c
                    .counters
                    .iter()
                    .map(|(k, v)| (self.str(k), self.str(&v.value.0), Quantity::try_from(&v.value).ok()))
                    .collect(),
            })
            .collect();
        self.draws.insert(hash, Arc::from(draws))
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

    /// Drops the maps of replaced devices that no other device uses, at
    /// once: a republished slice's old maps are still in cache (they were
    /// just compared), where a later [`Compactor::prune`] would find them
    /// cold. Strings are left to pruning.
    pub(crate) fn release(&mut self, devices: Vec<DeviceRecord>) {
        // More holders than a device, the table and the recent cache: a
        // shared map, not worth hashing.
        const MAYBE_LAST: usize = 3;
        for d in devices {
            let DeviceRecord { attributes, capacity, consumes, .. } = d;
            for part in [attributes.common, attributes.identity] {
                if Arc::strong_count(&part) <= MAYBE_LAST {
                    let hash = attributes_hash(&self.hasher, &part);
                    self.attributes.release(hash, part);
                }
            }
            if Arc::strong_count(&capacity.0) <= MAYBE_LAST {
                let hash = capacities_hash(&self.hasher, &capacity.0);
                self.capacities.release(hash, capacity.0);
            }
            if Arc::strong_count(&consumes) <= MAYBE_LAST {
                let hash = draws_hash(
                    &self.hasher,
                    consumes.iter().map(|c| (&*c.set, c.counters.iter().map(|(n, v, _)| (&**n, &**v)))),
                );
                self.draws.release(hash, consumes);
            }
        }
    }

    /// Attribute maps interned (tests check that replaced ones go).
    #[cfg(test)]
    pub(crate) fn attribute_maps(&self) -> usize {
        self.attributes.all.len()
    }

    /// Drops interned values no device uses any more (after slices went away).
    pub(crate) fn prune(&mut self) {
        self.attributes.prune();
        self.capacities.prune();
        self.draws.prune();
        self.strings.prune();
    }
}

/// The first of `like` that `equal` accepts, shared.
fn first_equal<T: Clone>(like: [Option<&T>; 2], equal: impl Fn(&T) -> bool) -> Option<T> {
    like.into_iter().flatten().find(|l| equal(l)).cloned()
}

/// A k8s map (name → value) equals a compact one entry for entry.
fn same_map<K, C>(map: &BTreeMap<String, K>, compact: &[(Arc<str>, C)], equal: impl Fn(&K, &C) -> bool) -> bool {
    map.len() == compact.len() && map.iter().zip(compact).all(|((n, k), (cn, c))| *n == **cn && equal(k, c))
}

/// Walks a compact map alongside a k8s map: both are sorted by name (a
/// BTreeMap's order is the strings'), so one pass pairs equal names.
struct SortedWalk<'a, C> {
    entries: &'a [(Arc<str>, C)],
    at: usize,
}

impl<'a, C> SortedWalk<'a, C> {
    fn new(entries: &'a [(Arc<str>, C)]) -> Self {
        SortedWalk { entries, at: 0 }
    }

    /// The entry named `name`, if any; names must come in ascending order.
    fn entry(&mut self, name: &str) -> Option<&'a (Arc<str>, C)> {
        while self.entries.get(self.at).is_some_and(|(n, _)| **n < *name) {
            self.at += 1;
        }
        self.entries.get(self.at).filter(|(n, _)| **n == *name)
    }
}

/// A counter slice's sets, parsed once when the slice is converted: (set
/// name, its counters or why one of them does not parse), in slice order.
pub(crate) type SliceCounterSets = Arc<[(String, Result<BTreeMap<String, Quantity>, BadCounter>)]>;

/// A counter whose value does not parse; the pool that has it is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("counter set {set}: counter {counter}: {reason}")]
pub(crate) struct BadCounter {
    set: String,
    counter: String,
    reason: BadQuantity,
}

fn parse_counter_sets(sets: &[CounterSet]) -> SliceCounterSets {
    sets.iter()
        .map(|set| {
            let counters = set
                .counters
                .iter()
                .map(|(name, c)| {
                    decode_quantity(&c.value.0).map(|a| (name.clone(), a)).map_err(|reason| BadCounter {
                        set: set.name.clone(),
                        counter: name.clone(),
                        reason,
                    })
                })
                .collect();
            (set.name.clone(), counters)
        })
        .collect()
}

/// What [`Compactor::attr`] would make of `a` is `v` (compared as text,
/// without interning anything).
fn attr_is(a: &DeviceAttribute, v: &AttrValue) -> bool {
    let none_before_string = a.int.is_none() && a.bool.is_none();
    match v {
        AttrValue::Int(i) => a.int == Some(*i),
        AttrValue::Bool(b) => a.int.is_none() && a.bool == Some(*b),
        AttrValue::Str(s) => none_before_string && a.string.as_deref() == Some(&**s),
        AttrValue::Version(s) => none_before_string && a.string.is_none() && a.version.as_deref() == Some(&**s),
        AttrValue::List(_) | AttrValue::Empty => false,
    }
}

fn addr<T: ?Sized>(a: &Arc<T>) -> usize {
    Arc::as_ptr(a).cast::<u8>() as usize
}

fn attributes_hash(hasher: &foldhash::fast::RandomState, a: &[AttrEntry]) -> u64 {
    let mut h = hasher.build_hasher();
    for (name, value) in a {
        h.write_usize(addr(name));
        match value {
            AttrValue::Bool(b) => h.write_u64(u64::from(*b)),
            AttrValue::Int(i) => h.write_i64(*i),
            AttrValue::Str(s) | AttrValue::Version(s) => h.write_usize(addr(s)),
            AttrValue::List(l) => l.hash(&mut h),
            AttrValue::Empty => h.write_u8(0),
        }
    }
    h.finish()
}

/// Equal maps of interned names and values (see [`Compactor`]).
fn same_attributes(a: &[AttrEntry], b: &[AttrEntry]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((an, av), (bn, bv))| {
            Arc::ptr_eq(an, bn)
                && match (av, bv) {
                    (AttrValue::Str(x), AttrValue::Str(y)) | (AttrValue::Version(x), AttrValue::Version(y)) => {
                        Arc::ptr_eq(x, y)
                    }
                    _ => av == bv,
                }
        })
}

fn capacities_hash(hasher: &foldhash::fast::RandomState, c: &[CapacityPair]) -> u64 {
    let mut h = hasher.build_hasher();
    for (name, entry) in c {
        h.write_usize(addr(name));
        h.write_usize(addr(&entry.value));
        h.write_u8(u8::from(entry.request_policy.is_some()));
    }
    h.finish()
}

fn same_capacities(a: &[CapacityPair], b: &[CapacityPair]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((an, ae), (bn, be))| {
            Arc::ptr_eq(an, bn) && Arc::ptr_eq(&ae.value, &be.value) && ae.request_policy == be.request_policy
        })
}

/// Hashes draws as text, so their k8s form and their compact form hash
/// alike: (set, [(counter, quantity)]) in order.
fn draws_hash<'a, C>(hasher: &foldhash::fast::RandomState, draws: impl Iterator<Item = (&'a str, C)>) -> u64
where
    C: Iterator<Item = (&'a str, &'a str)>,
{
    let mut h = hasher.build_hasher();
    for (set, counters) in draws {
        set.hash(&mut h);
        for (name, value) in counters {
            name.hash(&mut h);
            value.hash(&mut h);
        }
        h.write_u8(0);
    }
    h.finish()
}

fn draws_match(k8s: &[DeviceCounterConsumption], d: &[CounterDraw]) -> bool {
    k8s.len() == d.len()
        && k8s.iter().zip(d).all(|(k, c)| {
            k.counter_set == *c.set
                && k.counters.len() == c.counters.len()
                && k.counters.iter().zip(c.counters.iter()).all(|((n, v), (cn, cv, _))| *n == **cn && v.value.0 == **cv)
        })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn repeated_maps_and_strings_are_shared() {
        let mut c = Compactor::default();
        let a = c.device(&device("gpu-0").string("productName", "H100").cap("memory", "80Gi"), Like::default());
        let b = c.device(&device("gpu-0").string("productName", "H100").cap("memory", "80Gi"), Like::default());
        assert!(a.attributes.same(&b.attributes));
        assert!(a.capacity.same(&b.capacity));
        assert!(Arc::ptr_eq(&a.name, &b.name));
        assert_eq!(a.attributes.get("productName"), Some(&AttrValue::Str("H100".into())));
        assert!(a.extra.is_none(), "no rare fields, no box");
    }

    #[test]
    fn devices_share_all_but_their_identity() {
        let mut c = Compactor::default();
        let gpu = |uuid: &str| {
            device("gpu-0")
                .string("gpu.nvidia.com/productName", "H100")
                .string("gpu.nvidia.com/uuid", uuid)
                .string("gpu.nvidia.com/parentUUID", "GPU-p")
                .int("gpu.nvidia.com/index", 0)
                .string("zz", "last")
        };
        let a = c.device(&gpu("GPU-a"), Like::default());
        let b = c.device(&gpu("GPU-b"), Like::default());
        assert!(Arc::ptr_eq(&a.attributes.common, &b.attributes.common), "one common part for both");
        assert!(!a.attributes.same(&b.attributes) && a.attributes.addr() != b.attributes.addr());
        assert_eq!(a.attributes.get("gpu.nvidia.com/uuid"), Some(&AttrValue::Str("GPU-a".into())));
        assert_eq!(b.attributes.get("gpu.nvidia.com/parentUUID"), Some(&AttrValue::Str("GPU-p".into())));
        assert_eq!(b.attributes.get("zz"), Some(&AttrValue::Str("last".into())));
        assert_eq!(b.attributes.get("uuid"), None);
        let names: Vec<&str> = a.attributes.iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "gpu.nvidia.com/index",
                "gpu.nvidia.com/parentUUID",
                "gpu.nvidia.com/productName",
                "gpu.nvidia.com/uuid",
                "zz"
            ],
            "merged in the published order"
        );
        let again = c.device(&gpu("GPU-a"), Like { before: Some(&b), replaced: None });
        assert!(again.attributes.same(&a.attributes), "an equal map is the same interned parts");
    }

    #[test]
    fn identity_names_end_in_uuid() {
        for name in ["uuid", "gpu.nvidia.com/uuid", "parentUUID", "example.com/gpuUuid"] {
            assert!(is_identity(name), "{name}");
        }
        for name in ["uuids", "uid", "productName", "uuid.example.com/index", ""] {
            assert!(!is_identity(name), "{name}");
        }
    }

    #[test]
    fn pruning_keeps_what_is_in_use() {
        let mut c = Compactor::default();
        let kept = c.device(&device("gpu-0").string("uuid", "GPU-a"), Like::default());
        drop(c.device(&device("gpu-1").string("uuid", "GPU-b"), Like::default()));
        c.prune();
        assert_eq!(c.attributes.all.len(), 2, "the kept device's identity and its (empty) common part");
        let strings: Vec<&str> = c.strings.all.iter().map(|(_, s)| &**s).collect();
        assert!(strings.contains(&"GPU-a") && !strings.contains(&"GPU-b"));
        drop(kept);
    }
}

#[cfg(test)]
mod reuse_tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn a_republished_device_reuses_what_did_not_change() {
        let mut c = Compactor::default();
        let old = c.device(
            &device("gpu-0").string("productName", "H100").version("driverVersion", "1.0.0").cap("memory", "80Gi"),
            Like::default(),
        );
        let new = c.device(
            &device("gpu-0").string("productName", "H100").version("driverVersion", "2.0.0").cap("memory", "80Gi"),
            Like { before: None, replaced: Some(&old) },
        );
        assert!(old.capacity.same(&new.capacity) && Arc::ptr_eq(&old.name, &new.name));
        assert!(!old.attributes.same(&new.attributes));
        assert_eq!(new.attributes.get("driverVersion"), Some(&AttrValue::Version("2.0.0".into())));
        // A value of another type is not taken for the old one.
        let typed = c.device(
            &device("gpu-0").string("productName", "H100").string("driverVersion", "2.0.0").cap("memory", "80Gi"),
            Like { before: Some(&new), replaced: Some(&old) },
        );
        assert_eq!(typed.attributes.get("driverVersion"), Some(&AttrValue::Str("2.0.0".into())));
        // Built again without a reference, equal maps are the same map.
        let fresh = c.device(
            &device("gpu-0").string("productName", "H100").version("driverVersion", "2.0.0").cap("memory", "80Gi"),
            Like::default(),
        );
        assert!(fresh.attributes.same(&new.attributes));
    }

    #[test]
    fn draws_are_found_from_their_k8s_form() {
        let mut c = Compactor::default();
        let a = c.device(&device("a").consumes("gpu-0", &[("memory", "10Gi")]), Like::default());
        let b = c.device(&device("b").consumes("gpu-0", &[("memory", "10Gi")]), Like::default());
        let other = c.device(&device("c").consumes("gpu-0", &[("memory", "20Gi")]), Like::default());
        assert!(Arc::ptr_eq(&a.consumes, &b.consumes));
        assert!(!Arc::ptr_eq(&a.consumes, &other.consumes));
        assert_eq!(other.consumes[0].counters[0].2, Quantity::parse("20Gi").ok());
    }
}
