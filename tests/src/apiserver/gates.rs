//! The API server's DRA feature gates, as far as they change what a
//! ResourceSlice write stores: with a gate off, the real server drops the
//! gate's fields from the new object on create and update unless the stored
//! (old) object already uses them, and answers with what it stored
//! (`dropDisabledFields` in `pkg/registry/resource/resourceslice/strategy.go`,
//! called by the strategy's `PrepareForCreate` and `PrepareForUpdate`;
//! `PrepareForUpdate` bumps `metadata.generation` on the spec as sent,
//! before dropping, so a write that differs only in dropped fields still
//! stores a new generation).
//!
//! Every gate is on unless a test turns it off ([`GatesOff`]), so the
//! stand-in serves every field by default.

use std::collections::BTreeSet;

use serde_json::Value;

/// `DRADeviceTaints`: `devices[].taints`.
pub const DEVICE_TAINTS: &str = "DRADeviceTaints";
/// `DRAPartitionableDevices`: `sharedCounters`, `perDeviceNodeSelection`,
/// `devices[].consumesCounters`, a device's `nodeName`/`nodeSelector`/`allNodes`.
pub const PARTITIONABLE_DEVICES: &str = "DRAPartitionableDevices";
/// `DRADeviceBindingConditions` (with `DRAResourceClaimDeviceStatus`):
/// `devices[].bindingConditions`, `bindingFailureConditions`, `bindsToNode`.
pub const BINDING_CONDITIONS: &str = "DRADeviceBindingConditions";
/// `DRAConsumableCapacity`: `devices[].allowMultipleAllocations` and
/// `devices[].capacity[].requestPolicy`.
pub const CONSUMABLE_CAPACITY: &str = "DRAConsumableCapacity";
/// `DRAListTypeAttributes`: attribute values `ints`/`bools`/`strings`/`versions`.
pub const LIST_TYPE_ATTRIBUTES: &str = "DRAListTypeAttributes";
/// `DRANodeAllocatableResources`: `devices[].nodeAllocatableResources`.
pub const NODE_ALLOCATABLE_RESOURCES: &str = "DRANodeAllocatableResources";

/// The ResourceSlice gates that are off by default on Kubernetes 1.`minor`
/// (`pkg/features/kube_features.go`: taints, partitionable devices,
/// binding conditions and consumable capacity alpha in 1.34–1.35, beta and
/// on from 1.36; list-typed attributes and node allocatable resources alpha).
pub fn off_by_default(minor: u32) -> Vec<&'static str> {
    let mut off = vec![LIST_TYPE_ATTRIBUTES, NODE_ALLOCATABLE_RESOURCES];
    if minor < 36 {
        off.extend([DEVICE_TAINTS, PARTITIONABLE_DEVICES, BINDING_CONDITIONS, CONSUMABLE_CAPACITY]);
    }
    off
}

/// The gates a test turned off.
pub type GatesOff = BTreeSet<String>;

/// Drops from a ResourceSlice `new` the fields of the gates in `off` that
/// `old` (the stored object on update; `None` on create) does not use.
pub fn drop_disabled_slice_fields(off: &GatesOff, new: &mut Value, old: Option<&Value>) {
    let is_off = |gate: &str| off.contains(gate);
    let devices_of = |o: Option<&Value>| -> Vec<Value> {
        o.and_then(|o| o.pointer("/spec/devices")).and_then(Value::as_array).cloned().unwrap_or_default()
    };
    let old_devices = devices_of(old);
    let old_uses = |fields: &[&str]| old_devices.iter().any(|d| fields.iter().any(|f| used(d.get(*f))));
    let old_spec_uses = |field: &str| used(old.and_then(|o| o.pointer(&format!("/spec/{field}"))));

    let drop_taints = is_off(DEVICE_TAINTS) && !old_uses(&["taints"]);
    let drop_partitionable = is_off(PARTITIONABLE_DEVICES)
        && !old_uses(&["consumesCounters", "nodeName", "nodeSelector", "allNodes"])
        && !old_spec_uses("sharedCounters")
        && !old_spec_uses("perDeviceNodeSelection");
    let drop_binding =
        is_off(BINDING_CONDITIONS) && !old_uses(&["bindingConditions", "bindingFailureConditions", "bindsToNode"]);
    let old_request_policy = old_devices.iter().any(|d| {
        d.get("capacity").and_then(Value::as_object).is_some_and(|c| c.values().any(|v| used(v.get("requestPolicy"))))
    });
    let drop_capacity = is_off(CONSUMABLE_CAPACITY) && !old_uses(&["allowMultipleAllocations"]) && !old_request_policy;
    let list_fields = ["ints", "bools", "strings", "versions"];
    let old_lists = old_devices.iter().any(|d| {
        d.get("attributes")
            .and_then(Value::as_object)
            .is_some_and(|a| a.values().any(|v| list_fields.iter().any(|f| used(v.get(*f)))))
    });
    let drop_lists = is_off(LIST_TYPE_ATTRIBUTES) && !old_lists;
    let drop_allocatable = is_off(NODE_ALLOCATABLE_RESOURCES) && !old_uses(&["nodeAllocatableResources"]);

    if drop_partitionable && let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("sharedCounters");
        spec.remove("perDeviceNodeSelection");
    }
    let devices = new.pointer_mut("/spec/devices").and_then(Value::as_array_mut).into_iter().flatten();
    for device in devices.filter_map(Value::as_object_mut) {
        let mut remove = |fields: &[&str]| {
            for f in fields {
                device.remove(*f);
            }
        };
        if drop_taints {
            remove(&["taints"]);
        }
        if drop_partitionable {
            remove(&["consumesCounters", "nodeName", "nodeSelector", "allNodes"]);
        }
        if drop_binding {
            remove(&["bindingConditions", "bindingFailureConditions", "bindsToNode"]);
        }
        if drop_capacity {
            remove(&["allowMultipleAllocations"]);
        }
        if drop_allocatable {
            remove(&["nodeAllocatableResources"]);
        }
        if drop_capacity {
            let capacities =
                device.get_mut("capacity").and_then(Value::as_object_mut).into_iter().flat_map(|c| c.values_mut());
            for capacity in capacities.filter_map(Value::as_object_mut) {
                capacity.remove("requestPolicy");
            }
        }
        if drop_lists {
            let attributes =
                device.get_mut("attributes").and_then(Value::as_object_mut).into_iter().flat_map(|a| a.values_mut());
            for attribute in attributes.filter_map(Value::as_object_mut) {
                for f in list_fields {
                    attribute.remove(f);
                }
            }
        }
    }
}

/// Set and not empty (Go's `len(x) > 0` or `x != nil`).
fn used(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn off(gates: &[&str]) -> GatesOff {
        gates.iter().map(|g| g.to_string()).collect()
    }

    #[test]
    fn taints_are_dropped_unless_the_stored_slice_has_some() {
        let slice = |taints: bool| {
            let mut d = json!({"name": "gpu-0"});
            if taints {
                d["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
            }
            json!({"spec": {"devices": [d]}})
        };
        let mut new = slice(true);
        drop_disabled_slice_fields(&off(&[DEVICE_TAINTS]), &mut new, None);
        assert_eq!(new, slice(false));
        let mut new = slice(true);
        drop_disabled_slice_fields(&off(&[DEVICE_TAINTS]), &mut new, Some(&slice(false)));
        assert_eq!(new, slice(false));
        let mut new = slice(true);
        drop_disabled_slice_fields(&off(&[DEVICE_TAINTS]), &mut new, Some(&slice(true)));
        assert_eq!(new, slice(true), "in use: kept");
        let mut new = slice(true);
        drop_disabled_slice_fields(&off(&[]), &mut new, None);
        assert_eq!(new, slice(true));
    }

    #[test]
    fn consumable_capacity_and_counters() {
        let mut new = json!({"spec": {"sharedCounters": [{"name": "s", "counters": {}}], "devices": [{
            "name": "gpu-0", "allowMultipleAllocations": true, "consumesCounters": [{"counterSet": "s", "counters": {}}],
            "capacity": {"memory": {"value": "80Gi", "requestPolicy": {"default": "1Mi"}}}}]}});
        drop_disabled_slice_fields(&off(&off_by_default(34).into_iter().collect::<Vec<_>>()), &mut new, None);
        assert_eq!(new, json!({"spec": {"devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}}]}}));
        assert_eq!(off_by_default(36), [LIST_TYPE_ATTRIBUTES, NODE_ALLOCATABLE_RESOURCES]);
    }
}
