//! Dynamic MIG GPUs as partitionable devices (KEP-4815): each GPU's
//! counter set, what each of its devices consumes, and how counter sets
//! and devices are laid out in slices for the server's release.
//!
//! # Layout, and what it costs the scheduler
//!
//! * 1.35 and later (counters in slices of their own): the node's counter
//!   sets packed 8 to a slice (the API's limit), then every device packed
//!   64 to a slice. An 8-GPU node of dynamic H100s is 1 counter slice and
//!   4 device slices (8 × 26 devices), the fewest the API allows.
//! * 1.34 (a device consumes only from sets in its own slice; 32 counters
//!   per slice over all sets): whole GPUs packed together, set and
//!   devices, as many as the limits take (2 GPUs of 13-14 counters and
//!   26 devices each): 4 slices for 8 GPUs.
//!
//! The scheduler walks a pool's slices and, for every device it tries,
//! checks each counter it consumes against what the pool's allocated
//! devices already took. Its work therefore grows with the number of
//! devices (fixed: one per profile and placement) and with the counters
//! each consumes. The layout adds the per-slice overhead only, so the
//! fewest slices are the fastest (the real kube-scheduler agrees: a
//! counter or device slice per GPU took 25-35 % more of its CPU per pod
//! on 1.37, 74 % more on 1.34 at 1,000 nodes; `cargo bench -p
//! integration-tests --bench real_scheduler_mig`, docs/mig.md "Dynamic MIG");
//! we keep consumption small as well (7-13
//! counters per device: its memory slices, compute slices and the engine
//! kinds it takes, never `multiprocessors` or `memory`, which the slices
//! already decide).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Counter, CounterSet, Device, DeviceCounterConsumption};

use super::validation::{
    self, MAX_DEVICE_COUNTERS_PER_SLICE_134, MAX_DEVICES_WITH_TAINTS_OR_COUNTERS, MAX_SHARED_COUNTERS_134, ServerRules,
};
use crate::inventory::MigCapabilities;
use crate::inventory::dynamic_mig::{CounterName, counter_set_name};
use crate::inventory::{Gpu, PublishedDevice};
use dra_cel::quantity;

/// Most counter sets in one slice (1.35+).
const MAX_COUNTER_SETS: usize = 8;

fn counters(map: BTreeMap<CounterName, u64>) -> BTreeMap<String, Counter> {
    map.into_iter().map(|(name, n)| (name.to_string(), Counter { value: quantity::count(n) })).collect()
}

/// The counter set of a dynamic GPU.
pub fn counter_set(gpu: &Gpu, caps: &MigCapabilities) -> CounterSet {
    CounterSet { name: counter_set_name(gpu.minor), counters: counters(caps.counters()) }
}

/// What `device` of a dynamic GPU consumes: a MIG device its placement's
/// memory slices, its compute slices and engines; the whole GPU
/// everything. `None` for devices of other GPUs.
pub fn consumption(device: &PublishedDevice<'_>) -> Option<DeviceCounterConsumption> {
    let (caps, _) = device.gpu().dynamic_mig()?;
    let used = match device {
        PublishedDevice::DynamicMig { profile, placement, .. } => caps.consumption(profile, *placement),
        PublishedDevice::Gpu(_) => caps.counters(),
        PublishedDevice::Mig { .. } | PublishedDevice::Vfio(_) => return None,
    };
    Some(DeviceCounterConsumption {
        counter_set: counter_set_name(device.gpu().minor),
        counters: counters(used),
        compatibility_groups: None,
    })
}

/// The one counter of a GPU offered for passthrough: the whole GPU and
/// its VFIO device each take it, so the scheduler gives the GPU one way.
const WHOLE_GPU: &str = "gpu";

/// The counter set of a GPU offered for passthrough (`PassthroughSupport`,
/// which excludes dynamic MIG, so the set's name is free).
pub fn passthrough_counter_set(gpu: &Gpu) -> CounterSet {
    CounterSet {
        name: counter_set_name(gpu.minor),
        counters: BTreeMap::from([(WHOLE_GPU.to_string(), Counter { value: quantity::count(1) })]),
    }
}

/// What `gpu-<minor>` and `gpu-vfio-<minor>` of a GPU offered for
/// passthrough consume: the GPU's one counter.
pub fn passthrough_consumption(gpu: &Gpu) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: counter_set_name(gpu.minor),
        counters: BTreeMap::from([(WHOLE_GPU.to_string(), Counter { value: quantity::count(1) })]),
        compatibility_groups: None,
    }
}

/// A device to publish, and the dynamic GPU whose counters it consumes.
pub struct Entry {
    pub device: Device,
    pub counter_gpu: Option<u32>,
}

/// One slice's content: devices, or counter sets, or (1.34) both.
#[derive(Debug, Default)]
pub struct SliceContent {
    pub devices: Option<Vec<Device>>,
    pub counter_sets: Option<Vec<CounterSet>>,
}

/// The node's slices for `rules`: `entries` in order, `sets` by GPU minor.
pub fn layout(rules: ServerRules, entries: Vec<Entry>, sets: Vec<(u32, CounterSet)>) -> Vec<SliceContent> {
    if rules.counters_in_own_slices() { apart(entries, sets) } else { together(entries, sets) }
}

/// 1.35+: counter slices, then device slices.
fn apart(entries: Vec<Entry>, sets: Vec<(u32, CounterSet)>) -> Vec<SliceContent> {
    let mut out: Vec<SliceContent> = Vec::new();
    let mut sets = sets.into_iter().map(|(_, s)| s).peekable();
    while sets.peek().is_some() {
        out.push(SliceContent { counter_sets: Some(sets.by_ref().take(MAX_COUNTER_SETS).collect()), devices: None });
    }
    out.extend(
        chunk_devices(entries.into_iter().map(|e| e.device).collect())
            .into_iter()
            .map(|devices| SliceContent { devices: Some(devices), counter_sets: None }),
    );
    out
}

/// 1.34: devices without counters as before, then each dynamic GPU's set
/// with its devices, several GPUs to a slice while the limits allow.
fn together(entries: Vec<Entry>, sets: Vec<(u32, CounterSet)>) -> Vec<SliceContent> {
    let mut plain = Vec::new();
    let mut by_gpu: BTreeMap<u32, Vec<Device>> = BTreeMap::new();
    for e in entries {
        match e.counter_gpu {
            Some(minor) => by_gpu.entry(minor).or_default().push(e.device),
            None => plain.push(e.device),
        }
    }
    let mut out: Vec<SliceContent> = chunk_devices(plain)
        .into_iter()
        .map(|devices| SliceContent { devices: Some(devices), counter_sets: None })
        .collect();
    let mut current = SliceContent::default();
    let (mut counters, mut consumed) = (0, 0);
    for (minor, set) in sets {
        let devices = by_gpu.remove(&minor).unwrap_or_default();
        let set_counters = set.counters.len();
        let device_counters: usize =
            devices.iter().flat_map(|d| d.consumes_counters.iter().flatten()).map(|c| c.counters.len()).sum();
        let held = current.devices.as_ref().map_or(0, Vec::len);
        let fits = counters + set_counters <= MAX_SHARED_COUNTERS_134
            && held + devices.len() <= MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
            && consumed + device_counters <= MAX_DEVICE_COUNTERS_PER_SLICE_134;
        if !fits && current.counter_sets.is_some() {
            out.push(std::mem::take(&mut current));
            (counters, consumed) = (0, 0);
        }
        counters += set_counters;
        consumed += device_counters;
        current.counter_sets.get_or_insert_with(Vec::new).push(set);
        current.devices.get_or_insert_with(Vec::new).extend(devices);
    }
    if current.counter_sets.is_some() {
        out.push(current);
    }
    out
}

/// Devices in slices of the API's size: 64 when any has taints or
/// consumes counters, else 128.
fn chunk_devices(devices: Vec<Device>) -> Vec<Vec<Device>> {
    let advanced = devices.iter().any(|d| {
        d.taints.as_ref().is_some_and(|t| !t.is_empty()) || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
    });
    let per_slice = if advanced { MAX_DEVICES_WITH_TAINTS_OR_COUNTERS } else { validation::MAX_DEVICES };
    let mut out = Vec::new();
    let mut devices = devices.into_iter().peekable();
    while devices.peek().is_some() {
        out.push(devices.by_ref().take(per_slice).collect());
    }
    out
}
