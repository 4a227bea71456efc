//! Small builders for the allocator's tests: hand-made API objects with
//! just the fields a case needs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CELDeviceSelector, Counter, CounterSet, Device, DeviceAllocationResult, DeviceAttribute,
    DeviceCapacity, DeviceClaim, DeviceClass, DeviceClassSpec, DeviceConstraint, DeviceCounterConsumption,
    DeviceRequest, DeviceRequestAllocationResult, DeviceSelector, DeviceSubRequest, DeviceTaint, DeviceToleration,
    ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub const DRIVER: &str = "gpu.nvidia.com";

pub fn q(s: &str) -> Quantity {
    Quantity(s.to_string())
}

/// The compact form of a test device.
#[cfg(test)]
pub(crate) fn rec(d: Device) -> super::compact::DeviceRecord {
    super::compact::Compactor::default().device(&d, super::compact::Like::default())
}

pub fn device(name: &str) -> Device {
    Device { name: name.into(), ..Default::default() }
}

/// Chainable setters for test devices.
pub trait DeviceExt {
    fn string(self, key: &str, v: &str) -> Self;
    fn int(self, key: &str, v: i64) -> Self;
    fn version(self, key: &str, v: &str) -> Self;
    fn cap(self, key: &str, v: &str) -> Self;
    fn taint(self, key: &str, value: Option<&str>, effect: &str) -> Self;
    fn consumes(self, set: &str, counters: &[(&str, &str)]) -> Self;
    fn shareable(self) -> Self;
}

fn attrs(d: &mut Device) -> &mut BTreeMap<String, DeviceAttribute> {
    d.attributes.get_or_insert_with(BTreeMap::new)
}

impl DeviceExt for Device {
    fn string(mut self, key: &str, v: &str) -> Self {
        attrs(&mut self).insert(key.into(), DeviceAttribute { string: Some(v.into()), ..Default::default() });
        self
    }
    fn int(mut self, key: &str, v: i64) -> Self {
        attrs(&mut self).insert(key.into(), DeviceAttribute { int: Some(v), ..Default::default() });
        self
    }
    fn version(mut self, key: &str, v: &str) -> Self {
        attrs(&mut self).insert(key.into(), DeviceAttribute { version: Some(v.into()), ..Default::default() });
        self
    }
    fn cap(mut self, key: &str, v: &str) -> Self {
        self.capacity
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), DeviceCapacity { value: q(v), request_policy: None });
        self
    }
    fn taint(mut self, key: &str, value: Option<&str>, effect: &str) -> Self {
        self.taints.get_or_insert_with(Vec::new).push(DeviceTaint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        });
        self
    }
    fn consumes(mut self, set: &str, counters: &[(&str, &str)]) -> Self {
        self.consumes_counters.get_or_insert_with(Vec::new).push(consumes(set, counters));
        self
    }
    fn shareable(mut self) -> Self {
        self.allow_multiple_allocations = Some(true);
        self
    }
}

pub fn consumes(set: &str, counters: &[(&str, &str)]) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: set.into(),
        compatibility_groups: None,
        counters: counters.iter().map(|(k, v)| (k.to_string(), Counter { value: q(v) })).collect(),
    }
}

pub fn counter_set(name: &str, counters: &[(&str, &str)]) -> CounterSet {
    CounterSet {
        name: name.into(),
        counters: counters.iter().map(|(k, v)| (k.to_string(), Counter { value: q(v) })).collect(),
    }
}

/// A node-local slice of `DRIVER`.
pub fn slice(name: &str, node: &str, pool: &str, generation: i64, count: i64, devices: Vec<Device>) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool { name: pool.into(), generation, resource_slice_count: count },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

/// A one-slice pool on `node`, named after it.
pub fn node_slice(node: &str, devices: Vec<Device>) -> ResourceSlice {
    slice(&format!("{node}-slice"), node, node, 1, 1, devices)
}

/// A slice with only counter sets, for partitionable devices.
pub fn counter_slice(name: &str, node: &str, pool: &str, count: i64, sets: Vec<CounterSet>) -> ResourceSlice {
    let mut s = slice(name, node, pool, 1, count, vec![]);
    s.spec.devices = None;
    s.spec.shared_counters = Some(sets);
    s
}

pub fn label_selector(key: &str, values: &[&str]) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: "In".into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            match_fields: None,
        }],
    }
}

pub fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn selectors(exprs: &[&str]) -> Option<Vec<DeviceSelector>> {
    (!exprs.is_empty()).then(|| {
        exprs.iter().map(|e| DeviceSelector { cel: Some(CELDeviceSelector { expression: e.to_string() }) }).collect()
    })
}

pub fn class(name: &str, exprs: &[&str]) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(DeviceClassSpec { selectors: selectors(exprs), ..Default::default() }),
    }
}

/// The class every test uses unless it needs another: all of `DRIVER`'s devices.
pub fn gpu_class() -> DeviceClass {
    class("gpu", &[r#"device.driver == "gpu.nvidia.com""#])
}

pub fn exact(class: &str, count: i64) -> ExactDeviceRequest {
    ExactDeviceRequest {
        device_class_name: class.into(),
        allocation_mode: Some("ExactCount".into()),
        count: Some(count),
        ..Default::default()
    }
}

pub fn request(name: &str, class: &str, count: i64) -> DeviceRequest {
    DeviceRequest { name: name.into(), exactly: Some(exact(class, count)), first_available: None }
}

pub fn request_with(name: &str, exactly: ExactDeviceRequest) -> DeviceRequest {
    DeviceRequest { name: name.into(), exactly: Some(exactly), first_available: None }
}

pub fn all_request(name: &str, class: &str) -> DeviceRequest {
    request_with(
        name,
        ExactDeviceRequest {
            device_class_name: class.into(),
            allocation_mode: Some("All".into()),
            ..Default::default()
        },
    )
}

pub fn with_selectors(mut r: DeviceRequest, exprs: &[&str]) -> DeviceRequest {
    if let Some(e) = r.exactly.as_mut() {
        e.selectors = selectors(exprs);
    }
    r
}

pub fn with_tolerations(mut r: DeviceRequest, tolerations: Vec<DeviceToleration>) -> DeviceRequest {
    if let Some(e) = r.exactly.as_mut() {
        e.tolerations = Some(tolerations);
    }
    r
}

pub fn sub(name: &str, class: &str, count: i64, exprs: &[&str]) -> DeviceSubRequest {
    DeviceSubRequest {
        name: name.into(),
        device_class_name: class.into(),
        allocation_mode: Some("ExactCount".into()),
        count: Some(count),
        selectors: selectors(exprs),
        ..Default::default()
    }
}

pub fn first_available(name: &str, subs: Vec<DeviceSubRequest>) -> DeviceRequest {
    DeviceRequest { name: name.into(), exactly: None, first_available: Some(subs) }
}

pub fn match_attr(attribute: &str, requests: &[&str]) -> DeviceConstraint {
    DeviceConstraint {
        match_attribute: Some(attribute.into()),
        requests: (!requests.is_empty()).then(|| requests.iter().map(|r| r.to_string()).collect()),
        ..Default::default()
    }
}

pub fn distinct_attr(attribute: &str, requests: &[&str]) -> DeviceConstraint {
    DeviceConstraint {
        distinct_attribute: Some(attribute.into()),
        requests: (!requests.is_empty()).then(|| requests.iter().map(|r| r.to_string()).collect()),
        ..Default::default()
    }
}

pub fn claim(name: &str, requests: Vec<DeviceRequest>) -> ResourceClaim {
    claim_with(name, requests, vec![])
}

pub fn claim_with(name: &str, requests: Vec<DeviceRequest>, constraints: Vec<DeviceConstraint>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some("default".into()), ..Default::default() },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                constraints: (!constraints.is_empty()).then_some(constraints),
                config: None,
            }),
        }),
        status: None,
    }
}

/// Request `r`'s result on `device` of node `n1`'s pool, as the scheduler
/// records it; a case adds share id or capacity with `..`.
pub fn device_result(device: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: "r".into(),
        driver: DRIVER.into(),
        pool: "n1".into(),
        device: device.into(),
        ..Default::default()
    }
}

/// An allocation of `results`, with no config and no node selector.
pub fn allocation(results: Vec<DeviceRequestAllocationResult>) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult { results: Some(results), config: None }),
        ..Default::default()
    }
}
