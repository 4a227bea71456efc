//! The apiserver's validation of a `resource.k8s.io/v1` ResourceSlice
//! (`pkg/apis/resource/validation/validation.go`), run before we send one,
//! so a bad slice fails here with the rule and field instead of as a 422.
//!
//! Where servers 1.34 to 1.37 differ we apply the strictest (4 taints per
//! device as in 1.34; no `None` taint effect before 1.35), and we reject
//! fields older servers do not know, or 1.37 has only as alpha (off by
//! default), since a server without them drops them silently.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice, ResourceSliceSpec};

use super::field_error::FieldError;
use crate::k8s_format as fmtchk;

/// Most devices in one slice.
pub const MAX_DEVICES: usize = 128;
/// Most devices in one slice when any device has taints or consumes counters.
pub const MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: usize = 64;
/// Most attributes plus capacities per device.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Most taints per device on a 1.34 server (1.35 raised it to 16).
pub const MAX_TAINTS_PER_DEVICE: usize = 4;
const MAX_VALUE_LEN: usize = 64;
const MAX_POOL_NAME: usize = 253;
const MAX_COUNTER_SETS: usize = 8;
const MAX_COUNTERS_PER_SET: usize = 32;
const MAX_COUNTER_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// 1.34: counters in all sets of a slice together.
pub const MAX_SHARED_COUNTERS_134: usize = 32;
/// 1.34: counters a device consumes, over all its consumptions.
pub const MAX_COUNTERS_PER_DEVICE_134: usize = 32;
/// 1.34: counters consumed by all devices of a slice together.
pub const MAX_DEVICE_COUNTERS_PER_SLICE_134: usize = 1024;
const MAX_BINDING_CONDITIONS: usize = 4;

/// The errors found, and the rules of the server they are found for.
struct Errors {
    rules: ServerRules,
    /// The server has DRAListTypeAttributes on (alpha, 1.36 and 1.37).
    lists: bool,
    errors: Vec<FieldError>,
}

impl Errors {
    fn add(&mut self, field: impl Into<String>, rule: impl Into<String>) {
        self.errors.push(FieldError { field: field.into(), rule: rule.into() });
    }

    fn check(&mut self, field: impl Into<String>, result: Result<(), impl std::fmt::Display>) {
        if let Err(rule) = result {
            self.add(field, rule.to_string());
        }
    }
}

/// What differs between the servers we support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerRules {
    /// The server's minor version (1.`minor`).
    pub minor: u32,
}

impl ServerRules {
    /// The strictest: Kubernetes 1.34.
    pub const STRICTEST: ServerRules = ServerRules { minor: 34 };

    /// Taint effect `None` (1.35+).
    pub fn taint_effect_none(self) -> bool {
        self.minor >= 35
    }

    /// Most taints per device: 4 on 1.34, 16 from 1.35.
    pub fn max_taints(self) -> usize {
        if self.minor >= 35 { 16 } else { MAX_TAINTS_PER_DEVICE }
    }

    /// Counter sets live in slices of their own (1.35+), referenced from
    /// the pool's device slices; on 1.34 a device consumes only from sets
    /// in its own slice.
    pub fn counters_in_own_slices(self) -> bool {
        self.minor >= 35
    }
}

/// All rules `slice` breaks on the strictest server (1.34); empty when
/// every supported apiserver would accept it.
pub fn validate_slice(slice: &ResourceSlice) -> Vec<FieldError> {
    validate_slice_for(slice, ServerRules::STRICTEST)
}

/// All rules `slice` breaks on a server with `rules`.
pub fn validate_slice_for(slice: &ResourceSlice, rules: ServerRules) -> Vec<FieldError> {
    validate(slice, rules, false)
}

/// All rules `slice` breaks on a server with `rules` and Kubernetes'
/// DRAListTypeAttributes gate on (1.36+): list-valued attributes allowed.
pub fn validate_slice_with_list_attributes(slice: &ResourceSlice, rules: ServerRules) -> Vec<FieldError> {
    validate(slice, ServerRules { minor: rules.minor.max(36) }, true)
}

fn validate(slice: &ResourceSlice, rules: ServerRules, lists: bool) -> Vec<FieldError> {
    let mut errs = Errors { rules, lists, errors: Vec::new() };
    match slice.metadata.name.as_deref() {
        None | Some("") if slice.metadata.generate_name.is_none() => {
            errs.add("metadata.name", "Required value: name or generateName is required")
        }
        Some(name) if !name.is_empty() => errs.check("metadata.name", fmtchk::check_dns1123_subdomain(name)),
        _ => {}
    }
    validate_spec(&slice.spec, &mut errs);
    errs.errors
}

fn validate_spec(spec: &ResourceSliceSpec, errs: &mut Errors) {
    errs.check("spec.driver", fmtchk::check_driver_name(&spec.driver));

    let pool = &spec.pool;
    if pool.name.is_empty() {
        errs.add("spec.pool.name", "Required value");
    } else if pool.name.len() > MAX_POOL_NAME {
        errs.add("spec.pool.name", format!("Too long: may not be more than {MAX_POOL_NAME} bytes"));
    } else {
        for part in pool.name.split('/') {
            errs.check("spec.pool.name", fmtchk::check_dns1123_subdomain(part));
        }
    }
    if pool.resource_slice_count <= 0 {
        errs.add(
            "spec.pool.resourceSliceCount",
            format!("Invalid value: {}: must be greater than zero", pool.resource_slice_count),
        );
    }
    if pool.generation < 0 {
        errs.add(
            "spec.pool.generation",
            format!("Invalid value: {}: must be greater than or equal to zero", pool.generation),
        );
    }

    let mut access = Vec::new();
    if let Some(node) = &spec.node_name {
        if node.is_empty() {
            errs.add("spec.nodeName", "must be either unset or set to a non-empty string");
        } else {
            access.push("`nodeName`");
            errs.check("spec.nodeName", fmtchk::check_dns1123_subdomain(node));
        }
    }
    if let Some(selector) = &spec.node_selector {
        access.push("`nodeSelector`");
        if selector.node_selector_terms.len() != 1 {
            errs.add("spec.nodeSelector.nodeSelectorTerms", "must have exactly one node selector term");
        }
    }
    match spec.all_nodes {
        Some(true) => access.push("`allNodes`"),
        Some(false) => errs.add("spec.allNodes", "must be either unset or set to true"),
        None => {}
    }
    match spec.per_device_node_selection {
        Some(true) => access.push("`perDeviceNodeSelection`"),
        Some(false) => errs.add("spec.perDeviceNodeSelection", "must be either unset or set to true"),
        None => {}
    }
    match access.len() {
        0 => errs.add("spec", "Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"),
        1 => {}
        _ => errs.add("spec", format!("exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set: {}", access.join(", "))),
    }

    if errs.rules.counters_in_own_slices() && spec.shared_counters.is_some() && spec.devices.is_some() {
        errs.add("spec", "only one of `sharedCounters` or `devices` is allowed");
    }
    // Fields newer than the servers we support would be dropped silently.
    if spec.partition_type_attribute.is_some() {
        errs.add(
            "spec.partitionTypeAttribute",
            "alpha in Kubernetes 1.37 (DRAPartitionableDevicesType, off by default) and unknown before; leave unset",
        );
    }
    if spec.skip_node_operations.is_some() {
        errs.add(
            "spec.skipNodeOperations",
            "alpha in Kubernetes 1.37 (DRAOptionalNodeOperations, off by default) and unknown before; leave unset",
        );
    }

    if let Some(sets) = &spec.shared_counters {
        let total: usize = sets.iter().map(|s| s.counters.len()).sum();
        if !errs.rules.counters_in_own_slices() && total > MAX_SHARED_COUNTERS_134 {
            errs.add(
                "spec.sharedCounters",
                format!(
                    "Invalid value: {total}: the total number of shared counters must not exceed {MAX_SHARED_COUNTERS_134}"
                ),
            );
        }
        if errs.rules.counters_in_own_slices() && sets.len() > MAX_COUNTER_SETS {
            errs.add(
                "spec.sharedCounters",
                format!("Too many: {}: must have at most {MAX_COUNTER_SETS} items", sets.len()),
            );
        }
        let mut names = BTreeSet::new();
        for (i, set) in sets.iter().enumerate() {
            let at = format!("spec.sharedCounters[{i}]");
            errs.check(format!("{at}.name"), fmtchk::check_dns1123_label(&set.name));
            if !names.insert(set.name.as_str()) {
                errs.add(format!("{at}.name"), format!("Duplicate value: {:?}", set.name));
            }
            if set.counters.is_empty() {
                errs.add(format!("{at}.counters"), "Required value");
            } else if errs.rules.counters_in_own_slices() && set.counters.len() > MAX_COUNTERS_PER_SET {
                errs.add(
                    format!("{at}.counters"),
                    format!("Too many: {}: must have at most {MAX_COUNTERS_PER_SET} items", set.counters.len()),
                );
            }
            for key in set.counters.keys() {
                errs.check(format!("{at}.counters[{key}]"), fmtchk::check_dns1123_label(key));
            }
        }
    }

    let Some(devices) = &spec.devices else { return };
    let advanced = devices.iter().any(|d| {
        d.taints.as_ref().is_some_and(|t| !t.is_empty()) || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
    });
    let max = if advanced { MAX_DEVICES_WITH_TAINTS_OR_COUNTERS } else { MAX_DEVICES };
    if devices.len() > max {
        let why = if advanced { " (a device has taints or consumes counters)" } else { "" };
        errs.add("spec.devices", format!("Too many: {}: must have at most {max} items{why}", devices.len()));
        return;
    }
    let mut names = BTreeSet::new();
    let per_device = spec.per_device_node_selection == Some(true);
    for (i, device) in devices.iter().enumerate() {
        let at = format!("spec.devices[{i}]");
        if !names.insert(device.name.as_str()) {
            errs.add(&at, format!("Duplicate value: {:?}", device.name));
        }
        validate_device(device, &at, per_device, errs);
    }
    if !errs.rules.counters_in_own_slices() {
        validate_counters_134(spec, devices, errs);
    }
}

/// 1.34's rules on consumed counters: a device consumes from the sets of
/// its own slice, counters those sets define, at most 32 counters per
/// device and 1024 per slice.
fn validate_counters_134(spec: &ResourceSliceSpec, devices: &[Device], errs: &mut Errors) {
    let sets = spec.shared_counters.as_deref().unwrap_or_default();
    let mut slice_total = 0;
    for (i, device) in devices.iter().enumerate() {
        let Some(consumes) = &device.consumes_counters else { continue };
        let at = format!("spec.devices[{i}]");
        let device_total: usize = consumes.iter().map(|c| c.counters.len()).sum();
        slice_total += device_total;
        if device_total > MAX_COUNTERS_PER_DEVICE_134 {
            errs.add(
                &at,
                format!(
                    "Invalid value: {device_total}: the total number of counters must not exceed {MAX_COUNTERS_PER_DEVICE_134}"
                ),
            );
        }
        for (c, consumption) in consumes.iter().enumerate() {
            let cat = format!("{at}.consumesCounters[{c}]");
            let Some(set) = sets.iter().find(|s| s.name == consumption.counter_set) else {
                errs.add(
                    format!("{cat}.counterSet"),
                    format!(
                        "Invalid value: {:?}: must reference a counterSet defined in the ResourceSlice sharedCounters",
                        consumption.counter_set
                    ),
                );
                continue;
            };
            for key in consumption.counters.keys().filter(|k| !set.counters.contains_key(*k)) {
                errs.add(
                    format!("{cat}.counters"),
                    format!(
                        "Invalid value: {key:?}: must reference a counter defined in the ResourceSlice sharedCounters"
                    ),
                );
            }
        }
    }
    if slice_total > MAX_DEVICE_COUNTERS_PER_SLICE_134 {
        errs.add(
            "spec.devices",
            format!(
                "Invalid value: {slice_total}: the total number of counters in devices must not exceed {MAX_DEVICE_COUNTERS_PER_SLICE_134}"
            ),
        );
    }
}

fn validate_device(device: &Device, at: &str, per_device_node_selection: bool, errs: &mut Errors) {
    errs.check(format!("{at}.name"), fmtchk::check_dns1123_label(&device.name));
    let attributes = device.attributes.as_ref();
    let capacity = device.capacity.as_ref();
    let total = attributes.map_or(0, |a| a.len()) + capacity.map_or(0, |c| c.len());
    if total > MAX_ATTRIBUTES_AND_CAPACITIES {
        errs.add(at, format!("Invalid value: {total}: the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"));
    }
    for (key, value) in attributes.into_iter().flatten() {
        let field = format!("{at}.attributes[{key}]");
        errs.check(&field, fmtchk::check_qualified_name(key));
        validate_attribute(value, &field, errs);
    }
    let multi = device.allow_multiple_allocations == Some(true);
    for (key, value) in capacity.into_iter().flatten() {
        let field = format!("{at}.capacity[{key}]");
        errs.check(&field, fmtchk::check_qualified_name(key));
        match &value.request_policy {
            Some(_) if !multi => {
                errs.add(format!("{field}.requestPolicy"), "Forbidden: allowMultipleAllocations must be true")
            }
            Some(policy) => errs.errors.extend(super::request_policy::validate(
                &value.value,
                policy,
                &format!("{field}.requestPolicy"),
            )),
            None => {}
        }
    }
    if let Some(taints) = &device.taints {
        let max = errs.rules.max_taints();
        if taints.len() > max {
            errs.add(
                format!("{at}.taints"),
                format!(
                    "Too many: {}: must have at most {max} items (the limit of Kubernetes 1.{})",
                    taints.len(),
                    errs.rules.minor
                ),
            );
        }
        for (t, taint) in taints.iter().enumerate() {
            let tat = format!("{at}.taints[{t}]");
            errs.check(format!("{tat}.key"), fmtchk::check_label_name(&taint.key));
            if let Some(v) = taint.value.as_deref().filter(|v| !v.is_empty()) {
                errs.check(format!("{tat}.value"), fmtchk::check_label_value(v));
            }
            match taint.effect.as_str() {
                "NoSchedule" | "NoExecute" => {}
                "None" if errs.rules.taint_effect_none() => {}
                "" => errs.add(format!("{tat}.effect"), "Required value"),
                "None" => errs.add(
                    format!("{tat}.effect"),
                    "Unsupported value: \"None\" needs Kubernetes 1.35; use \"NoSchedule\" or \"NoExecute\"",
                ),
                other => errs.add(
                    format!("{tat}.effect"),
                    format!("Unsupported value: {other:?}: supported values: \"NoExecute\", \"NoSchedule\""),
                ),
            }
        }
    }
    if let Some(consumes) = &device.consumes_counters {
        if errs.rules.counters_in_own_slices() && consumes.len() > MAX_COUNTER_CONSUMPTIONS_PER_DEVICE {
            errs.add(
                format!("{at}.consumesCounters"),
                format!("Too many: {}: must have at most {MAX_COUNTER_CONSUMPTIONS_PER_DEVICE} items", consumes.len()),
            );
        }
        let mut sets = BTreeSet::new();
        for (c, consumption) in consumes.iter().enumerate() {
            let cat = format!("{at}.consumesCounters[{c}]");
            errs.check(format!("{cat}.counterSet"), fmtchk::check_dns1123_label(&consumption.counter_set));
            if !sets.insert(consumption.counter_set.as_str()) {
                errs.add(format!("{cat}.counterSet"), format!("Duplicate value: {:?}", consumption.counter_set));
            }
            if consumption.compatibility_groups.is_some() {
                errs.add(
                    format!("{cat}.compatibilityGroups"),
                    "alpha in Kubernetes 1.37 (DRADeviceCompatibilityGroups, off by default) and unknown before; leave unset",
                );
            }
            if consumption.counters.is_empty() {
                errs.add(format!("{cat}.counters"), "Required value");
            }
            for key in consumption.counters.keys() {
                errs.check(format!("{cat}.counters[{key}]"), fmtchk::check_dns1123_label(key));
            }
        }
    }
    let node_fields = [device.node_name.is_some(), device.node_selector.is_some(), device.all_nodes.is_some()];
    let set = node_fields.iter().filter(|&&b| b).count();
    if per_device_node_selection {
        if set != 1 {
            errs.add(at, "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec");
        }
        if device.all_nodes == Some(false) {
            errs.add(format!("{at}.allNodes"), "must be either unset or set to true");
        }
        if device.node_name.as_deref() == Some("") {
            errs.add(format!("{at}.nodeName"), "must not be empty");
        }
    } else if set > 0 {
        errs.add(at, "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec");
    }
    let conditions = device.binding_conditions.as_deref().unwrap_or_default();
    let failures = device.binding_failure_conditions.as_deref().unwrap_or_default();
    if conditions.len() > MAX_BINDING_CONDITIONS {
        errs.add(
            format!("{at}.bindingConditions"),
            format!("Too many: {}: must have at most {MAX_BINDING_CONDITIONS} items", conditions.len()),
        );
    }
    if failures.len() > MAX_BINDING_CONDITIONS {
        errs.add(
            format!("{at}.bindingFailureConditions"),
            format!("Too many: {}: must have at most {MAX_BINDING_CONDITIONS} items", failures.len()),
        );
    }
    if conditions.is_empty() != failures.is_empty() {
        errs.add(
            format!("{at}.bindingConditions"),
            "bindingConditions and bindingFailureConditions must be set together",
        );
    }
    if device.node_allocatable_resources.is_some() {
        errs.add(
            format!("{at}.nodeAllocatableResources"),
            "alpha in Kubernetes 1.37 (DRANodeAllocatableResources, off by default; 1.36 named it differently); leave unset",
        );
    }
}

fn validate_attribute(value: &DeviceAttribute, field: &str, errs: &mut Errors) {
    let mut set = 0;
    if value.bool.is_some() {
        set += 1;
    }
    if value.int.is_some() {
        set += 1;
    }
    if let Some(s) = &value.string {
        set += 1;
        if s.len() > MAX_VALUE_LEN {
            errs.add(format!("{field}.string"), format!("Too long: may not be more than {MAX_VALUE_LEN} bytes"));
        }
    }
    if let Some(v) = &value.version {
        set += 1;
        errs.check(
            format!("{field}.version"),
            fmtchk::check_semver(v).map_err(|m| format!("Invalid value: {v:?}: {m}")),
        );
        if v.len() > MAX_VALUE_LEN {
            errs.add(format!("{field}.version"), format!("Too long: may not be more than {MAX_VALUE_LEN} bytes"));
        }
    }
    let lists = value.bools.is_some() || value.ints.is_some() || value.strings.is_some() || value.versions.is_some();
    if lists && !errs.lists {
        errs.add(
            field,
            "list-valued attributes are alpha in Kubernetes 1.36 and 1.37 and unknown before; use a scalar value",
        );
    }
    if lists && errs.lists {
        set += validate_list_attribute(value, field, errs);
    }
    // A list refused above already has its error.
    let refused_list = lists && !errs.lists;
    if set != 1 && !refused_list {
        errs.add(field, "exactly one value must be specified");
    }
}

/// The list fields of an attribute (DRAListTypeAttributes): each non-empty,
/// at most `ResourceSliceMaxAttributeValuesPerDevice` (48) values, strings
/// and versions within the scalar rules. Returns how many lists are set.
fn validate_list_attribute(value: &DeviceAttribute, field: &str, errs: &mut Errors) -> usize {
    const MAX_VALUES: usize = 48;
    let mut set = 0;
    let mut check_len = |name: &str, len: usize, errs: &mut Errors| {
        set += 1;
        if len == 0 {
            errs.add(format!("{field}.{name}"), "Required value: a list attribute needs at least one value");
        } else if len > MAX_VALUES {
            errs.add(format!("{field}.{name}"), format!("Too many: {len}: must have at most {MAX_VALUES} items"));
        }
    };
    if let Some(v) = &value.bools {
        check_len("bools", v.len(), errs);
    }
    if let Some(v) = &value.ints {
        check_len("ints", v.len(), errs);
    }
    if let Some(v) = &value.strings {
        check_len("strings", v.len(), errs);
        for (i, s) in v.iter().enumerate() {
            if s.len() > MAX_VALUE_LEN {
                errs.add(
                    format!("{field}.strings[{i}]"),
                    format!("Too long: may not be more than {MAX_VALUE_LEN} bytes"),
                );
            }
        }
    }
    if let Some(v) = &value.versions {
        check_len("versions", v.len(), errs);
        for (i, version) in v.iter().enumerate() {
            errs.check(
                format!("{field}.versions[{i}]"),
                fmtchk::check_semver(version).map_err(|m| format!("Invalid value: {version:?}: {m}")),
            );
        }
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{DeviceCapacity, DeviceTaint, ResourcePool};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn device(name: &str) -> Device {
        Device {
            name: name.into(),
            attributes: Some(BTreeMap::from([(
                "type".into(),
                DeviceAttribute { string: Some("gpu".into()), ..Default::default() },
            )])),
            capacity: Some(BTreeMap::from([(
                "memory".into(),
                DeviceCapacity { value: Quantity("80Gi".into()), request_policy: None },
            )])),
            ..Default::default()
        }
    }

    fn slice(devices: Vec<Device>) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta { name: Some("node-a-gpu.nvidia.com-0".into()), ..Default::default() },
            spec: ResourceSliceSpec {
                driver: "gpu.nvidia.com".into(),
                node_name: Some("node-a".into()),
                pool: ResourcePool { name: "node-a".into(), generation: 1, resource_slice_count: 1 },
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    fn fields(s: &ResourceSlice) -> Vec<String> {
        validate_slice(s).into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn a_good_slice_passes() {
        assert!(validate_slice(&slice(vec![device("gpu-0"), device("gpu-1")])).is_empty());
    }

    #[test]
    fn device_count_limits_depend_on_taints() {
        let many: Vec<Device> = (0..128).map(|i| device(&format!("gpu-{i}"))).collect();
        assert!(validate_slice(&slice(many.clone())).is_empty());
        let mut too_many = many.clone();
        too_many.push(device("gpu-128"));
        assert_eq!(fields(&slice(too_many)), ["spec.devices"]);

        let mut tainted: Vec<Device> = many[..65].to_vec();
        tainted[0].taints = Some(vec![DeviceTaint {
            key: "gpu.nvidia.com/xid".into(),
            value: Some("79".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]);
        let errs = validate_slice(&slice(tainted.clone()));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].rule.contains("at most 64"), "{}", errs[0]);
        tainted.pop();
        assert!(validate_slice(&slice(tainted)).is_empty());
    }

    /// Fields 1.37 has only as alpha gates (off by default) are refused:
    /// a server with the gate off drops them silently.
    #[test]
    fn fields_alpha_in_1_37_are_refused() {
        use k8s_openapi::api::resource::v1::{Counter, DeviceCounterConsumption};
        let mut d = device("gpu-0");
        d.consumes_counters = Some(vec![DeviceCounterConsumption {
            counter_set: "gpu-0".into(),
            counters: BTreeMap::from([("memory".into(), Counter { value: Quantity("1Gi".into()) })]),
            compatibility_groups: Some(vec!["full".into()]),
        }]);
        let mut s = slice(vec![d]);
        s.spec.partition_type_attribute = Some("gpu.nvidia.com/profile".into());
        s.spec.skip_node_operations = Some(vec!["*".into()]);
        let errs = validate_slice_for(&s, ServerRules { minor: 37 });
        let mut found: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        found.sort();
        assert_eq!(
            found,
            [
                "spec.devices[0].consumesCounters[0].compatibilityGroups",
                "spec.partitionTypeAttribute",
                "spec.skipNodeOperations"
            ],
            "{errs:?}"
        );
        assert!(errs.iter().all(|e| e.rule.contains("alpha in Kubernetes 1.37")), "{errs:?}");
    }

    /// 1.34 keeps a device's counter sets in its own slice and counts
    /// counters per slice; 1.35+ wants them in slices of their own.
    #[test]
    fn counter_rules_follow_the_server_release() {
        use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};
        let one = || Counter { value: Quantity("1".into()) };
        let set = |name: &str, n: usize| CounterSet {
            name: name.into(),
            counters: (0..n).map(|i| (format!("memory-slice-{i}"), one())).collect(),
        };
        let consuming = |name: &str, set: &str, n: usize| {
            let mut d = device(name);
            d.consumes_counters = Some(vec![DeviceCounterConsumption {
                counter_set: set.into(),
                counters: (0..n).map(|i| (format!("memory-slice-{i}"), one())).collect(),
                compatibility_groups: None,
            }]);
            d
        };
        let (v134, v137) = (ServerRules { minor: 34 }, ServerRules { minor: 37 });
        let field_rules = |s: &ResourceSlice, r| -> Vec<String> {
            validate_slice_for(s, r).iter().map(|e| format!("{}: {}", e.field, e.rule)).collect()
        };

        // Together in one slice: 1.34's layout.
        let mut together = slice(vec![consuming("gpu-0-mig-a", "gpu-0-counter-set", 2)]);
        together.spec.shared_counters = Some(vec![set("gpu-0-counter-set", 8)]);
        assert!(field_rules(&together, v134).is_empty());
        assert_eq!(field_rules(&together, v137), ["spec: only one of `sharedCounters` or `devices` is allowed"]);

        // Apart: 1.35's layout; on 1.34 the device's set is not in its slice.
        let devices = slice(vec![consuming("gpu-0-mig-a", "gpu-0-counter-set", 2)]);
        let mut counters = slice(vec![]);
        counters.spec.devices = None;
        counters.spec.shared_counters = Some(vec![set("gpu-0-counter-set", 8)]);
        assert!(field_rules(&devices, v137).is_empty() && field_rules(&counters, v137).is_empty());
        assert!(field_rules(&counters, v134).is_empty());
        assert_eq!(
            field_rules(&devices, v134),
            [
                "spec.devices[0].consumesCounters[0].counterSet: Invalid value: \"gpu-0-counter-set\": must reference a counterSet defined in the ResourceSlice sharedCounters"
            ]
        );

        // 1.34 counts counters over all sets of a slice (32); 1.35+ per set (32) with 8 sets.
        let mut three = slice(vec![]);
        three.spec.devices = None;
        three.spec.shared_counters = Some((0..3).map(|g| set(&format!("gpu-{g}-counter-set"), 14)).collect());
        assert_eq!(
            field_rules(&three, v134),
            ["spec.sharedCounters: Invalid value: 42: the total number of shared counters must not exceed 32"]
        );
        assert!(field_rules(&three, v137).is_empty());
        let mut nine = three.clone();
        nine.spec.shared_counters = Some((0..9).map(|g| set(&format!("gpu-{g}-counter-set"), 1)).collect());
        assert_eq!(field_rules(&nine, v137), ["spec.sharedCounters: Too many: 9: must have at most 8 items"]);

        // 1.34: an undefined counter, and the 1024 counters a slice's devices may consume.
        let mut unknown = together.clone();
        unknown.spec.shared_counters = Some(vec![set("gpu-0-counter-set", 1)]);
        assert_eq!(
            field_rules(&unknown, v134),
            [
                "spec.devices[0].consumesCounters[0].counters: Invalid value: \"memory-slice-1\": must reference a counter defined in the ResourceSlice sharedCounters"
            ]
        );
        let mut heavy = slice((0..33).map(|i| consuming(&format!("d{i}"), "s", 32)).collect());
        heavy.spec.shared_counters = Some(vec![set("s", 32)]);
        assert_eq!(
            field_rules(&heavy, v134),
            ["spec.devices: Invalid value: 1056: the total number of counters in devices must not exceed 1024"]
        );
    }

    #[test]
    fn attribute_rules() {
        let mut d = device("gpu-0");
        let attrs = d.attributes.as_mut().unwrap();
        attrs.insert(
            "driverVersion".into(),
            DeviceAttribute { version: Some("580.82.07".into()), ..Default::default() },
        );
        attrs.insert("productName".into(), DeviceAttribute { string: Some("x".repeat(65)), ..Default::default() });
        attrs.insert("bad-name".into(), DeviceAttribute { int: Some(1), ..Default::default() });
        attrs.insert("both".into(), DeviceAttribute { int: Some(1), bool: Some(true), ..Default::default() });
        attrs.insert("lists".into(), DeviceAttribute { ints: Some(vec![1]), ..Default::default() });
        let errs = validate_slice(&slice(vec![d]));
        let got: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            got,
            [
                "spec.devices[0].attributes[bad-name]",
                "spec.devices[0].attributes[both]",
                "spec.devices[0].attributes[driverVersion].version",
                "spec.devices[0].attributes[lists]",
                "spec.devices[0].attributes[productName].string",
            ]
        );
        assert!(errs[2].rule.contains("semver"), "{}", errs[2]);
    }

    #[test]
    fn attribute_count_limit() {
        let mut d = device("gpu-0");
        for i in 0..31 {
            d.attributes
                .as_mut()
                .unwrap()
                .insert(format!("a{i}"), DeviceAttribute { int: Some(i), ..Default::default() });
        }
        let errs = validate_slice(&slice(vec![d]));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].rule.contains("must not exceed 32"), "{}", errs[0]);
    }

    #[test]
    fn request_policies_need_multiple_allocations_and_must_be_valid() {
        use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, CapacityRequestPolicyRange};
        let policy = |min: &str| CapacityRequestPolicy {
            default: Some(Quantity("80Gi".into())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity(min.into()),
                max: None,
                step: Some(Quantity("1Gi".into())),
            }),
            valid_values: None,
        };
        let mut d = device("gpu-0");
        d.capacity.as_mut().unwrap().get_mut("memory").unwrap().request_policy = Some(policy("1Gi"));
        let errs = validate_slice(&slice(vec![d.clone()]));
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0].to_string(),
            "spec.devices[0].capacity[memory].requestPolicy: Forbidden: allowMultipleAllocations must be true"
        );
        d.allow_multiple_allocations = Some(true);
        assert!(validate_slice(&slice(vec![d.clone()])).is_empty());
        d.capacity.as_mut().unwrap().get_mut("memory").unwrap().request_policy = Some(policy("100Gi"));
        assert_eq!(
            fields(&slice(vec![d])),
            [
                "spec.devices[0].capacity[memory].requestPolicy.validRange.min",
                "spec.devices[0].capacity[memory].requestPolicy.validRange.min",
                "spec.devices[0].capacity[memory].requestPolicy.validRange.step",
            ]
        );
    }

    #[test]
    fn spec_rules() {
        let mut s = slice(vec![device("gpu-0"), device("gpu-0")]);
        s.spec.all_nodes = Some(true);
        s.spec.pool.resource_slice_count = 0;
        s.spec.driver = "GPU".into();
        s.metadata.name = Some("Bad_Name".into());
        assert_eq!(
            fields(&s),
            ["metadata.name", "spec.driver", "spec.pool.resourceSliceCount", "spec", "spec.devices[1]"]
        );
    }

    #[test]
    fn taint_rules_follow_the_oldest_supported_server() {
        let mut d = device("gpu-0");
        let taint = |key: &str, effect: &str| DeviceTaint {
            key: key.into(),
            value: None,
            effect: effect.into(),
            time_added: None,
        };
        d.taints = Some(vec![
            taint("gpu.nvidia.com/xid", "None"),
            taint("bad key", "NoSchedule"),
            taint("a", "Sometimes"),
            taint("b", "NoExecute"),
            taint("c", "NoExecute"),
        ]);
        let got = fields(&slice(vec![d]));
        assert_eq!(
            got,
            [
                "spec.devices[0].taints",
                "spec.devices[0].taints[0].effect",
                "spec.devices[0].taints[1].key",
                "spec.devices[0].taints[2].effect"
            ]
        );
    }

    #[test]
    fn a_135_server_accepts_none_effects_and_more_taints() {
        let mut d = device("gpu-0");
        let taint = |effect: &str| k8s_openapi::api::resource::v1::DeviceTaint {
            key: "gpu.nvidia.com/xid".into(),
            value: Some("43".into()),
            effect: effect.into(),
            time_added: None,
        };
        d.taints = Some(vec![taint("None"); 5]);
        let s = slice(vec![d]);
        assert_eq!(validate_slice(&s).len(), 6, "1.34: too many, and five None effects");
        assert!(validate_slice_for(&s, ServerRules { minor: 35 }).is_empty());
    }
}
