//! From an inventory, the ResourceSlices a node publishes.
//!
//! One pool per node, named after the node, with `spec.nodeName` set. Devices
//! are split across as many slices as the API's per-slice limit needs; every
//! slice of a pool carries the same generation and the pool's slice count, so
//! consumers know when they have seen the whole pool. With `DynamicMIG`, the
//! dynamic GPUs' counter sets join them, laid out as the server's release
//! requires ([`partitionable`]).

pub mod attributes;
pub mod consumable_shares;
mod field_error;
pub mod partitionable;
mod request_policy;
pub mod served;
pub mod shares;
pub mod validation;

use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::feature_gates::{FeatureGates, Gate};
use crate::inventory::{Inventory, PublishedDevice};
use crate::k8s_format::DNS1123_SUBDOMAIN_MAX;
use crate::names::{DriverName, InvalidName, NodeName};
pub use attributes::TaintPolicy;
pub use field_error::FieldError;
pub use validation::{ServerRules, validate_slice, validate_slice_for, validate_slice_with_list_attributes};

/// Builds a node's slices for one driver.
#[derive(Debug, Clone)]
pub struct SliceBuilder {
    driver: DriverName,
    node: NodeName,
    taints: TaintPolicy,
    rules: ServerRules,
    /// Whole GPUs are published shareable by memory ([`shares`]).
    shares: bool,
    /// GPUs and MIG devices are published as NVIDIA's `ConsumableShares`
    /// does ([`consumable_shares`]).
    consumable_shares: consumable_shares::SharesMode,
    /// Dynamic MIG GPUs are published as partitionable devices
    /// (`DynamicMIG`); without the gate they publish nothing.
    dynamic_mig: bool,
    /// The gated fields the server drops ([`served`]).
    not_served: served::NotServed,
    /// The cluster has DRAListTypeAttributes (`DRAListTypeAttributes`):
    /// `resource.kubernetes.io/numaNode` is published as a list.
    list_attributes: bool,
    /// `PassthroughSupport`: each capable GPU also as `gpu-vfio-<minor>`.
    passthrough: bool,
}

/// Why slices could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SliceError {
    #[error(transparent)]
    DeviceName(#[from] InvalidName),
    #[error("ResourceSlice {slice} would be rejected by the apiserver: {}", join(.errors))]
    Invalid { slice: String, errors: Vec<FieldError> },
}

fn join(errors: &[FieldError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl SliceBuilder {
    /// A builder for the strictest server (1.34), with NVIDIA's
    /// application XIDs ignored.
    pub fn new(driver: DriverName, node: NodeName) -> Self {
        Self {
            driver,
            node,
            taints: TaintPolicy::default(),
            rules: ServerRules::STRICTEST,
            shares: false,
            consumable_shares: consumable_shares::SharesMode::Disabled,
            dynamic_mig: false,
            not_served: served::NotServed::none(),
            list_attributes: false,
            passthrough: false,
        }
    }

    /// Slices as the plugin publishes them with `gates`: with
    /// `ConsumableCapacity`, whole GPUs are shareable ([`shares`]).
    pub fn with_gates(mut self, gates: FeatureGates) -> Self {
        self.shares = gates.enabled(Gate::ConsumableCapacity);
        self.dynamic_mig = gates.enabled(Gate::DynamicMig);
        self.list_attributes = gates.enabled(Gate::ListTypeAttributes);
        self.passthrough = gates.enabled(Gate::Passthrough);
        self
    }

    /// With the `ConsumableShares` gate on, devices published for sharing
    /// in `mode` (`--consumable-shares`); off, `mode` is ignored, as
    /// NVIDIA's plugin ignores it.
    pub fn with_consumable_shares(mut self, gates: FeatureGates, mode: consumable_shares::SharesMode) -> Self {
        if gates.enabled(Gate::ConsumableShares) {
            self.consumable_shares = mode;
        }
        self
    }

    /// Slices for a server with `rules` (1.35+ takes taint effect `None`).
    pub fn for_server(mut self, rules: ServerRules) -> Self {
        self.rules = rules;
        self.taints.none_effect = rules.taint_effect_none();
        self
    }

    /// Slices for a server that drops `not_served`: where a dropped field
    /// is what keeps a device from being misused, the device is left out
    /// instead. Without taints a faulty device (one a `NoSchedule` or
    /// `NoExecute` taint would mark) is withheld until it recovers; without
    /// counters, dynamic MIG devices (whose overlapping placements only the
    /// counters keep apart) are.
    pub fn serving(mut self, not_served: &served::NotServed) -> Self {
        self.not_served = *not_served;
        self
    }

    /// More XIDs that leave a device allocatable (`--additional-xids-to-ignore`).
    pub fn ignoring_xids(mut self, xids: impl IntoIterator<Item = u32>) -> Self {
        self.taints.ignored_xids.extend(xids);
        self
    }

    pub fn driver(&self) -> &DriverName {
        &self.driver
    }

    pub fn node(&self) -> &NodeName {
        &self.node
    }

    /// The slices for `inventory` at pool `generation`, validated against the
    /// apiserver's rules. A node without devices publishes one empty slice, so
    /// the pool exists and says "nothing here" rather than "not yet known".
    pub fn build(&self, inventory: &Inventory, generation: i64) -> Result<Vec<ResourceSlice>, SliceError> {
        let mut entries = Vec::new();
        let mut sets = Vec::new();
        let counters = !self.not_served.contains(served::GatedField::SharedCounters);
        let taints = !self.not_served.contains(served::GatedField::Taints);
        // VFIO devices only where counters keep them apart from their GPU.
        let passthrough = self.passthrough && counters;
        for gpu in &inventory.gpus {
            if let (true, true, Some((caps, _))) = (self.dynamic_mig, counters, gpu.dynamic_mig()) {
                sets.push((gpu.minor, partitionable::counter_set(gpu, caps)));
            }
            if passthrough && gpu.passthrough_capable() {
                sets.push((gpu.minor, partitionable::passthrough_counter_set(gpu)));
            }
        }
        let vfio = inventory.vfio_devices().filter(|_| passthrough);
        for d in inventory.published_devices().into_iter().chain(vfio) {
            let dynamic = d.gpu().dynamic_mig().is_some();
            if dynamic && !(self.dynamic_mig && counters) {
                // A dynamic GPU without the gate is a MIG GPU without
                // instances: nothing to offer. Without counters its
                // placements would overlap.
                continue;
            }
            let mut device = attributes::to_api_device(&self.driver, inventory, &d, &self.taints)?;
            if !taints && device.taints.iter().flatten().any(|t| attributes::taint::blocks(&t.effect)) {
                continue;
            }
            if self.list_attributes {
                attributes::numa_node_as_list(&mut device);
            }
            if dynamic {
                // Made per claim: never shared between claims.
                device.consumes_counters = partitionable::consumption(&d).map(|c| vec![c]);
                entries.push(partitionable::Entry { device, counter_gpu: Some(d.gpu().minor) });
                continue;
            }
            if passthrough
                && d.gpu().passthrough_capable()
                && let PublishedDevice::Gpu(gpu) | PublishedDevice::Vfio(gpu) = d
            {
                device.consumes_counters = Some(vec![partitionable::passthrough_consumption(gpu)]);
                entries.push(partitionable::Entry { device, counter_gpu: Some(gpu.minor) });
                continue;
            }
            if let (true, PublishedDevice::Gpu(gpu)) = (self.shares, &d) {
                shares::make_shareable(&mut device, gpu);
            }
            let memory = match d {
                PublishedDevice::Gpu(gpu) | PublishedDevice::Vfio(gpu) => gpu.memory_bytes,
                PublishedDevice::Mig { mig, .. } => mig.profile.memory_bytes,
                PublishedDevice::DynamicMig { profile, .. } => profile.profile.memory_bytes,
            };
            consumable_shares::apply(&mut device, memory, self.consumable_shares);
            entries.push(partitionable::Entry { device, counter_gpu: None });
        }
        let mut contents = partitionable::layout(self.rules, entries, sets);
        if contents.is_empty() {
            contents.push(partitionable::SliceContent { devices: Some(Vec::new()), counter_sets: None });
        }
        let count = contents.len() as i64;
        let slices: Vec<ResourceSlice> = contents
            .into_iter()
            .enumerate()
            .map(|(i, content)| ResourceSlice {
                metadata: ObjectMeta { name: Some(self.slice_name(i)), ..Default::default() },
                spec: ResourceSliceSpec {
                    driver: self.driver.to_string(),
                    node_name: Some(self.node.to_string()),
                    pool: ResourcePool { name: self.node.to_string(), generation, resource_slice_count: count },
                    devices: content.devices,
                    shared_counters: content.counter_sets,
                    ..Default::default()
                },
            })
            .collect();
        for slice in &slices {
            let errors = if self.list_attributes {
                validate_slice_with_list_attributes(slice, self.rules)
            } else {
                validate_slice_for(slice, self.rules)
            };
            if !errors.is_empty() {
                return Err(SliceError::Invalid { slice: slice.metadata.name.clone().unwrap_or_default(), errors });
            }
        }
        Ok(slices)
    }

    /// `<node>-<driver>-<index>`: deterministic, so a publisher can apply
    /// by name. Node names near the 253-character limit are shortened with
    /// a hash to keep the name unique and valid.
    pub fn slice_name(&self, index: usize) -> String {
        let full = format!("{}-{}-{index}", self.node, self.driver);
        if full.len() <= DNS1123_SUBDOMAIN_MAX {
            return full;
        }
        let hash = fnv1a(full.as_bytes());
        let suffix = format!("-{hash:016x}-{index}");
        let mut prefix: String = full.chars().take(DNS1123_SUBDOMAIN_MAX - suffix.len()).collect();
        // A subdomain label must end alphanumeric.
        while prefix.ends_with(['-', '.']) {
            prefix.pop();
        }
        format!("{prefix}{suffix}")
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Fault;
    use crate::inventory::test_support::{gpu, inventory};
    use crate::k8s_format::check_dns1123_subdomain;

    fn builder() -> SliceBuilder {
        SliceBuilder::new(DriverName::nvidia_default(), NodeName::new("node-a").unwrap())
    }

    fn sizes(slices: &[ResourceSlice]) -> Vec<usize> {
        slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).collect()
    }

    /// `DRAListTypeAttributes`: the standard numaNode attribute is a list
    /// (upstream's list form), valid for a server with the gate; without
    /// it, the scalar as before. A forged list attribute stays invalid for
    /// a server without the gate.
    #[test]
    fn numa_node_is_a_list_with_the_list_type_attributes_gate() {
        let mut g = gpu(0);
        g.numa_node = Some(1);
        let inv = inventory(vec![g]);
        let numa = |gates: &str| {
            let gates: FeatureGates = gates.parse().unwrap();
            let slices = builder().with_gates(gates).build(&inv, 1).expect("valid slices");
            let device = &slices[0].spec.devices.as_ref().unwrap()[0];
            device.attributes.as_ref().unwrap()["resource.kubernetes.io/numaNode"].clone()
        };
        let scalar = numa("");
        assert_eq!((scalar.int, scalar.ints), (Some(1), None));
        let list = numa("DRAListTypeAttributes=true");
        assert_eq!((list.int, list.ints), (None, Some(vec![1])));

        let gates: FeatureGates = "DRAListTypeAttributes=true".parse().unwrap();
        let slices = builder().with_gates(gates).build(&inv, 1).unwrap();
        let errors = validate_slice_for(&slices[0], ServerRules { minor: 37 });
        assert!(errors.iter().any(|e| e.rule.contains("list-valued attributes are alpha")), "{errors:?}");
        let mut empty = slices[0].clone();
        if let Some(a) = empty.spec.devices.as_mut().and_then(|d| d[0].attributes.as_mut()) {
            a.insert(
                "resource.kubernetes.io/numaNode".into(),
                k8s_openapi::api::resource::v1::DeviceAttribute { ints: Some(vec![]), ..Default::default() },
            );
        }
        let errors = validate_slice_with_list_attributes(&empty, ServerRules { minor: 37 });
        assert!(errors.iter().any(|e| e.rule.contains("at least one value")), "{errors:?}");
    }

    #[test]
    fn one_pool_per_node() {
        let slices = builder().build(&inventory((0..8).map(gpu).collect()), 3).unwrap();
        assert_eq!(slices.len(), 1);
        let s = &slices[0];
        assert_eq!(s.metadata.name.as_deref(), Some("node-a-gpu.nvidia.com-0"));
        assert_eq!(s.spec.driver, "gpu.nvidia.com");
        assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(
            (s.spec.pool.name.as_str(), s.spec.pool.generation, s.spec.pool.resource_slice_count),
            ("node-a", 3, 1)
        );
        assert_eq!(sizes(&slices), [8]);
    }

    #[test]
    fn more_than_128_devices_split() {
        let slices = builder().build(&inventory((0..200).map(gpu).collect()), 1).unwrap();
        assert_eq!(sizes(&slices), [128, 72]);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 2));
        let names: Vec<_> = slices.iter().filter_map(|s| s.metadata.name.clone()).collect();
        assert_eq!(names, ["node-a-gpu.nvidia.com-0", "node-a-gpu.nvidia.com-1"]);
    }

    #[test]
    fn taints_halve_the_slice_size() {
        let mut gpus: Vec<_> = (0..130).map(gpu).collect();
        gpus[7].faults.push(Fault::Xid(79));
        let slices = builder().build(&inventory(gpus), 1).unwrap();
        assert_eq!(sizes(&slices), [64, 64, 2]);
    }

    #[test]
    fn without_taints_served_a_faulty_gpu_is_withheld_until_it_recovers() {
        let names = |slices: &[ResourceSlice]| -> Vec<String> {
            slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone()).collect()
        };
        let mut gpus: Vec<_> = (0..4).map(gpu).collect();
        gpus[1].faults.push(Fault::Xid(79));
        gpus[2].faults.push(Fault::Lost);
        gpus[3].faults.push(Fault::Xid(43));
        let not_served = served::NotServed::by_default_on(35);
        let rules = ServerRules { minor: 35 };
        let slices = builder().for_server(rules).serving(&not_served).build(&inventory(gpus.clone()), 1).unwrap();
        assert_eq!(names(&slices), ["gpu-0", "gpu-3"], "an application XID does not withhold");
        let served = builder().for_server(rules).build(&inventory(gpus.clone()), 1).unwrap();
        assert_eq!(names(&served), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], "with taints served, they say it");
        for g in &mut gpus {
            g.faults.clear();
        }
        let healthy = builder().serving(&not_served).build(&inventory(gpus), 1).unwrap();
        assert_eq!(names(&healthy), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    }

    #[test]
    fn an_empty_node_publishes_an_empty_pool() {
        let slices = builder().build(&inventory(vec![]), 1).unwrap();
        assert_eq!(sizes(&slices), [0]);
        assert_eq!(slices[0].spec.pool.resource_slice_count, 1);
    }

    #[test]
    fn invalid_slices_fail_with_rule_and_field() {
        let err = builder().build(&inventory(vec![gpu(0)]), -1).unwrap_err().to_string();
        assert!(err.contains("node-a-gpu.nvidia.com-0"), "{err}");
        assert!(err.contains("spec.pool.generation: Invalid value: -1"), "{err}");
    }

    /// NVIDIA's `ConsumableShares`: GPUs and MIG devices alike, each mode
    /// valid for the strictest server; the mode does nothing without its gate.
    #[test]
    fn consumable_shares_publish_gpus_and_mig_devices_for_sharing() {
        use crate::inventory::MigMode;
        use crate::inventory::test_support::mig;
        let mut partitioned = gpu(1);
        partitioned.mig = MigMode::Enabled(vec![mig("1g.10gb", 19, 5, 1)]);
        let inv = inventory(vec![gpu(0), partitioned]);
        let gates: FeatureGates = "ConsumableShares=true".parse().unwrap();
        for mode in ["memory", "unlimited", "4"] {
            let slices =
                builder().with_consumable_shares(gates, mode.parse().unwrap()).build(&inv, 1).expect("valid slices");
            let devices = slices[0].spec.devices.clone().unwrap();
            assert_eq!(devices.len(), 2);
            for d in &devices {
                assert_eq!(d.allow_multiple_allocations, Some(true), "{mode}: {}", d.name);
                let caps = d.capacity.as_ref().unwrap();
                assert!(caps["memory"].request_policy.is_some(), "{mode}: {}", d.name);
                assert_eq!(caps.contains_key("shares"), mode == "4", "{mode}: {}", d.name);
            }
        }
        let off =
            builder().with_consumable_shares(FeatureGates::default(), "4".parse().unwrap()).build(&inv, 1).unwrap();
        assert!(off[0].spec.devices.as_ref().unwrap().iter().all(|d| d.allow_multiple_allocations.is_none()));
    }

    #[test]
    fn consumable_capacity_makes_whole_gpus_shareable_and_leaves_mig_alone() {
        use crate::inventory::MigMode;
        use crate::inventory::test_support::mig;
        let mut partitioned = gpu(1);
        partitioned.mig = MigMode::Enabled(vec![mig("1g.10gb", 19, 5, 1)]);
        let inv = inventory(vec![gpu(0), partitioned]);
        let devices = |gates: &str| {
            let gates: FeatureGates = gates.parse().unwrap();
            let slices = builder().with_gates(gates).build(&inv, 1).unwrap();
            slices[0].spec.devices.clone().unwrap()
        };
        let off = devices("");
        assert_eq!(off[0].allow_multiple_allocations, None);
        assert_eq!(
            serde_json::to_value(&off[0].capacity).unwrap(),
            serde_json::json!({"memory": {"value": "80Gi"}}),
            "without the gate a GPU is dedicated, as before"
        );
        let on = devices("ConsumableCapacity=true,MPSSupport=true");
        assert_eq!(on[0].allow_multiple_allocations, Some(true));
        assert_eq!(
            serde_json::to_value(&on[0].capacity).unwrap(),
            serde_json::json!({
                "memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}},
                "smPercent": {"value": "100", "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}}}
            })
        );
        assert_eq!(on[1], off[1], "a MIG device is published the same either way");
        assert_eq!(on[0].attributes, off[0].attributes);
    }

    #[test]
    fn long_node_names_still_give_valid_distinct_slice_names() {
        let node = NodeName::new(format!("{0}.{0}.{0}.{1}", "n".repeat(63), "n".repeat(50))).unwrap();
        let b = SliceBuilder::new(DriverName::nvidia_default(), node);
        let (a, c) = (b.slice_name(0), b.slice_name(1));
        assert!(a.len() <= 253 && check_dns1123_subdomain(&a).is_ok(), "{a}");
        assert_ne!(a, c);
    }
}
