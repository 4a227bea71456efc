//! ResourceSlice fields that a feature gate of the API server controls.
//!
//! With the gate off, the server drops such a field from a slice on create
//! and update, unless the stored slice already uses it, and answers with the
//! slice as stored (`dropDisabledFields` in
//! `pkg/registry/resource/resourceslice/strategy.go`, run by
//! `PrepareForCreate` and `PrepareForUpdate`). A publisher that compares what
//! it wrote with what the server holds must leave those fields out, or it
//! sees a difference after every write and writes forever; and what the
//! field meant (a taint that keeps a faulty GPU from being allocated) must
//! be had another way.

use std::fmt;

use k8s_openapi::api::resource::v1::{Device, ResourceSliceSpec};

/// A field (or fields dropped together) behind one of the API server's
/// feature gates, on Kubernetes 1.34 to 1.37.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GatedField {
    /// `devices[].taints` (`DRADeviceTaints`).
    Taints,
    /// `devices[].allowMultipleAllocations` (`DRAConsumableCapacity`).
    AllowMultipleAllocations,
    /// `devices[].capacity[].requestPolicy` (`DRAConsumableCapacity`).
    RequestPolicy,
    /// `devices[].bindsToNode`, `bindingConditions`,
    /// `bindingFailureConditions` (`DRADeviceBindingConditions` with
    /// `DRAResourceClaimDeviceStatus`).
    BindingConditions,
    /// `sharedCounters`, `perDeviceNodeSelection`, `devices[].consumesCounters`
    /// and a device's own `nodeName`/`nodeSelector`/`allNodes`
    /// (`DRAPartitionableDevices`).
    SharedCounters,
    /// List-typed attribute values `ints`/`bools`/`strings`/`versions`
    /// (`DRAListTypeAttributes`).
    ListAttributes,
    /// `devices[].nodeAllocatableResources` (`DRANodeAllocatableResources`).
    NodeAllocatableResources,
}

impl GatedField {
    pub const ALL: [GatedField; 7] = [
        GatedField::Taints,
        GatedField::AllowMultipleAllocations,
        GatedField::RequestPolicy,
        GatedField::BindingConditions,
        GatedField::SharedCounters,
        GatedField::ListAttributes,
        GatedField::NodeAllocatableResources,
    ];

    /// The field's name in the API (the metric's `field` label).
    pub fn name(self) -> &'static str {
        match self {
            GatedField::Taints => "taints",
            GatedField::AllowMultipleAllocations => "allowMultipleAllocations",
            GatedField::RequestPolicy => "requestPolicy",
            GatedField::BindingConditions => "bindingConditions",
            GatedField::SharedCounters => "sharedCounters",
            GatedField::ListAttributes => "listAttributes",
            GatedField::NodeAllocatableResources => "nodeAllocatableResources",
        }
    }

    /// The API server's gate that serves it (on the scheduler too, which
    /// ignores the field without it).
    pub fn gate(self) -> &'static str {
        match self {
            GatedField::Taints => "DRADeviceTaints",
            GatedField::AllowMultipleAllocations | GatedField::RequestPolicy => "DRAConsumableCapacity",
            GatedField::BindingConditions => "DRADeviceBindingConditions",
            GatedField::SharedCounters => "DRAPartitionableDevices",
            GatedField::ListAttributes => "DRAListTypeAttributes",
            GatedField::NodeAllocatableResources => "DRANodeAllocatableResources",
        }
    }

    /// The first release whose default gates serve it (`None`: no release
    /// up to 1.37 does; the gate is alpha there).
    pub fn served_by_default_from(self) -> Option<u32> {
        match self {
            // Beta and on in 1.36 (taints GA in 1.37).
            GatedField::Taints
            | GatedField::AllowMultipleAllocations
            | GatedField::RequestPolicy
            | GatedField::BindingConditions
            | GatedField::SharedCounters => Some(36),
            GatedField::ListAttributes | GatedField::NodeAllocatableResources => None,
        }
    }

    /// Whether `spec` uses the field anywhere.
    pub fn used_in(self, spec: &ResourceSliceSpec) -> bool {
        let mut devices = spec.devices.iter().flatten();
        match self {
            GatedField::Taints => devices.any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty())),
            GatedField::AllowMultipleAllocations => devices.any(|d| d.allow_multiple_allocations.is_some()),
            GatedField::RequestPolicy => {
                devices.any(|d| d.capacity.iter().flatten().any(|(_, c)| c.request_policy.is_some()))
            }
            GatedField::BindingConditions => devices.any(|d| {
                d.binds_to_node.is_some()
                    || d.binding_conditions.as_ref().is_some_and(|c| !c.is_empty())
                    || d.binding_failure_conditions.as_ref().is_some_and(|c| !c.is_empty())
            }),
            GatedField::SharedCounters => {
                spec.shared_counters.as_ref().is_some_and(|s| !s.is_empty())
                    || spec.per_device_node_selection.is_some()
                    || devices.any(|d| {
                        d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
                            || d.node_name.is_some()
                            || d.node_selector.is_some()
                            || d.all_nodes.is_some()
                    })
            }
            GatedField::ListAttributes => devices.any(|d| {
                d.attributes
                    .iter()
                    .flatten()
                    .any(|(_, a)| a.ints.is_some() || a.bools.is_some() || a.strings.is_some() || a.versions.is_some())
            }),
            GatedField::NodeAllocatableResources => {
                devices.any(|d| d.node_allocatable_resources.as_ref().is_some_and(|m| !m.is_empty()))
            }
        }
    }

    /// Removes the field from `spec` as a server with the gate off does.
    fn drop_from(self, spec: &mut ResourceSliceSpec) {
        if self == GatedField::SharedCounters {
            spec.shared_counters = None;
            spec.per_device_node_selection = None;
        }
        for device in spec.devices.iter_mut().flatten() {
            self.drop_from_device(device);
        }
    }

    fn drop_from_device(self, d: &mut Device) {
        match self {
            GatedField::Taints => d.taints = None,
            GatedField::AllowMultipleAllocations => d.allow_multiple_allocations = None,
            GatedField::RequestPolicy => {
                for capacity in d.capacity.iter_mut().flat_map(|c| c.values_mut()) {
                    capacity.request_policy = None;
                }
            }
            GatedField::BindingConditions => {
                d.binds_to_node = None;
                d.binding_conditions = None;
                d.binding_failure_conditions = None;
            }
            GatedField::SharedCounters => {
                d.consumes_counters = None;
                d.node_name = None;
                d.node_selector = None;
                d.all_nodes = None;
            }
            GatedField::ListAttributes => {
                for a in d.attributes.iter_mut().flat_map(|a| a.values_mut()) {
                    a.ints = None;
                    a.bools = None;
                    a.strings = None;
                    a.versions = None;
                }
            }
            GatedField::NodeAllocatableResources => d.node_allocatable_resources = None,
        }
    }
}

impl fmt::Display for GatedField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A cluster gate [`NotServed::on_release`] cannot use, with the gates it
/// can.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterGateError {
    #[error("{name}={value}: a gate is true or false")]
    BadValue { name: String, value: String },
    /// No gated field hangs on `name`; `known` lists the gates that decide one.
    #[error("{name:?} is not a gate that decides which ResourceSlice fields are served; use one of {known}")]
    Unknown { name: String, known: String },
}

/// The gated fields a server drops: learned from its answers, or assumed
/// from a release's gates. A set of [`GatedField::ALL`] as bits, so that it
/// is `Copy` like the options that carry it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotServed(u16);

impl NotServed {
    /// Everything is served (the fields' gates are on).
    pub fn none() -> Self {
        Self::default()
    }

    /// What Kubernetes 1.`minor` with its default gates drops.
    pub fn by_default_on(minor: u32) -> Self {
        let mut out = Self::none();
        for f in GatedField::ALL.into_iter().filter(|f| f.served_by_default_from().is_none_or(|from| minor < from)) {
            out.insert(f);
        }
        out
    }

    /// What Kubernetes 1.`minor` drops with its default gates but for
    /// `gates` (the API server's `--feature-gates`, e.g.
    /// `DRADeviceTaints=true`); a gate that no field hangs on is refused,
    /// naming those that do.
    pub fn on_release(minor: u32, gates: &str) -> Result<Self, ClusterGateError> {
        let mut out = Self::by_default_on(minor);
        for item in gates.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item.split_once('=').unwrap_or((item, "true"));
            let on = match value.trim() {
                "true" => true,
                "false" => false,
                other => return Err(ClusterGateError::BadValue { name: name.to_owned(), value: other.to_owned() }),
            };
            let fields: Vec<GatedField> = GatedField::ALL.into_iter().filter(|f| f.gate() == name.trim()).collect();
            if fields.is_empty() {
                let mut known: Vec<&str> = GatedField::ALL.iter().map(|f| f.gate()).collect();
                known.dedup();
                return Err(ClusterGateError::Unknown { name: name.to_owned(), known: known.join(", ") });
            }
            for f in fields {
                if on {
                    out.remove(f);
                } else {
                    out.insert(f);
                }
            }
        }
        Ok(out)
    }

    fn bit(field: GatedField) -> u16 {
        let i = GatedField::ALL.iter().position(|f| *f == field).unwrap_or_default();
        1 << i
    }

    pub fn contains(&self, field: GatedField) -> bool {
        self.0 & Self::bit(field) != 0
    }

    pub fn iter(&self) -> impl Iterator<Item = GatedField> + '_ {
        GatedField::ALL.into_iter().filter(|f| self.contains(*f))
    }

    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }

    /// Records a field as dropped; whether that is news.
    pub fn insert(&mut self, field: GatedField) -> bool {
        let news = !self.contains(field);
        self.0 |= Self::bit(field);
        news
    }

    /// Records a field as served again (the gate was turned on); whether
    /// that is news.
    pub fn remove(&mut self, field: GatedField) -> bool {
        let news = self.contains(field);
        self.0 &= !Self::bit(field);
        news
    }

    /// `spec` as such a server stores it when it does not yet use the
    /// fields: the fields removed.
    pub fn strip(&self, spec: &ResourceSliceSpec) -> ResourceSliceSpec {
        let mut out = spec.clone();
        for field in self.iter().filter(|f| f.used_in(spec)) {
            field.drop_from(&mut out);
        }
        out
    }
}

/// What a server's answer to a write says about the fields: those `sent`
/// used and `stored` lacks were dropped; those both use are served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteVerdict {
    pub dropped: Vec<GatedField>,
    pub served: Vec<GatedField>,
}

/// Compares a slice as sent with the slice the server answered with.
pub fn judge_write(sent: &ResourceSliceSpec, stored: &ResourceSliceSpec) -> WriteVerdict {
    let mut verdict = WriteVerdict::default();
    for field in GatedField::ALL.into_iter().filter(|f| f.used_in(sent)) {
        if field.used_in(stored) {
            verdict.served.push(field);
        } else {
            verdict.dropped.push(field);
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::resource::v1::{
        CapacityRequestPolicy, CounterSet, DeviceAttribute, DeviceCapacity, DeviceTaint,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn spec(devices: Vec<Device>) -> ResourceSliceSpec {
        ResourceSliceSpec { devices: Some(devices), ..Default::default() }
    }

    fn tainted(name: &str) -> Device {
        Device {
            name: name.into(),
            taints: Some(vec![DeviceTaint {
                key: "gpu.nvidia.com/xid".into(),
                value: Some("79".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn a_dropped_taint_is_told_from_a_kept_one() {
        let sent = spec(vec![tainted("gpu-0"), Device { name: "gpu-1".into(), ..Default::default() }]);
        let mut taints = NotServed::none();
        taints.insert(GatedField::Taints);
        let stored = taints.strip(&sent);
        assert!(stored.devices.iter().flatten().all(|d| d.taints.is_none()));
        assert_eq!(judge_write(&sent, &stored), WriteVerdict { dropped: vec![GatedField::Taints], served: vec![] });
        assert_eq!(judge_write(&sent, &sent), WriteVerdict { dropped: vec![], served: vec![GatedField::Taints] });
        let plain = spec(vec![Device { name: "gpu-0".into(), ..Default::default() }]);
        assert_eq!(judge_write(&plain, &plain), WriteVerdict::default(), "a field not sent says nothing");
    }

    #[test]
    fn consumable_capacity_drops_both_of_its_fields() {
        let shared = Device {
            name: "gpu-0".into(),
            allow_multiple_allocations: Some(true),
            capacity: Some(BTreeMap::from([(
                "memory".to_string(),
                DeviceCapacity {
                    value: Quantity("80Gi".into()),
                    request_policy: Some(CapacityRequestPolicy {
                        default: Some(Quantity("1Mi".into())),
                        ..Default::default()
                    }),
                },
            )])),
            ..Default::default()
        };
        let sent = spec(vec![shared]);
        let stored = NotServed::by_default_on(34).strip(&sent);
        let device = &stored.devices.as_ref().unwrap()[0];
        assert_eq!(device.allow_multiple_allocations, None);
        assert_eq!(device.capacity.as_ref().unwrap()["memory"].value, Quantity("80Gi".into()), "the value stays");
        assert_eq!(
            judge_write(&sent, &stored).dropped,
            [GatedField::AllowMultipleAllocations, GatedField::RequestPolicy]
        );
        assert_eq!(NotServed::by_default_on(36).strip(&sent), sent);
    }

    #[test]
    fn counters_and_list_attributes_are_dropped_as_the_server_does() {
        let sent = ResourceSliceSpec {
            shared_counters: Some(vec![CounterSet { name: "gpu-0-counter-set".into(), counters: BTreeMap::new() }]),
            devices: Some(vec![Device {
                name: "gpu-0".into(),
                attributes: Some(BTreeMap::from([(
                    "ids".to_string(),
                    DeviceAttribute { ints: Some(vec![1, 2]), ..Default::default() },
                )])),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let stored = NotServed::by_default_on(37).strip(&sent);
        assert_eq!(
            stored.shared_counters,
            Some(vec![CounterSet { name: "gpu-0-counter-set".into(), counters: BTreeMap::new() }]),
            "1.37 serves counters"
        );
        assert_eq!(stored.devices.as_ref().unwrap()[0].attributes.as_ref().unwrap()["ids"].ints, None);
        let on_134 = NotServed::by_default_on(34).strip(&sent);
        assert_eq!(on_134.shared_counters, None);
        assert_eq!(judge_write(&sent, &on_134).dropped, [GatedField::SharedCounters, GatedField::ListAttributes]);
    }

    #[test]
    fn release_defaults() {
        let on = |minor| NotServed::by_default_on(minor).iter().map(GatedField::name).collect::<Vec<_>>();
        assert_eq!(
            on(34),
            [
                "taints",
                "allowMultipleAllocations",
                "requestPolicy",
                "bindingConditions",
                "sharedCounters",
                "listAttributes",
                "nodeAllocatableResources"
            ]
        );
        assert_eq!(on(35), on(34));
        assert_eq!(on(36), ["listAttributes", "nodeAllocatableResources"]);
        assert_eq!(on(37), on(36));
        assert_eq!(GatedField::Taints.gate(), "DRADeviceTaints");
    }

    #[test]
    fn a_release_with_gates_turned_on_or_off() {
        let stock = NotServed::on_release(34, "").unwrap();
        assert_eq!(stock, NotServed::by_default_on(34));
        assert!(stock.contains(GatedField::Taints) && stock.contains(GatedField::AllowMultipleAllocations));
        let on = NotServed::on_release(34, "DRADeviceTaints=true, DRAConsumableCapacity").unwrap();
        assert!(!on.contains(GatedField::Taints));
        assert!(!on.contains(GatedField::AllowMultipleAllocations) && !on.contains(GatedField::RequestPolicy));
        assert!(on.contains(GatedField::SharedCounters));
        let off = NotServed::on_release(37, "DRADeviceTaints=false").unwrap();
        assert_eq!(
            off.iter().collect::<Vec<_>>(),
            [GatedField::Taints, GatedField::ListAttributes, GatedField::NodeAllocatableResources]
        );
        let unknown = NotServed::on_release(34, "DynamicResourceAllocation=true").unwrap_err().to_string();
        assert!(unknown.contains("DRADeviceTaints") && unknown.contains("DynamicResourceAllocation"), "{unknown}");
        assert!(NotServed::on_release(34, "DRADeviceTaints=yes").unwrap_err().to_string().contains("true or false"));
    }
}
