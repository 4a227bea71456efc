//! Older `resource.k8s.io` versions, converted to `v1` as the apiserver
//! converts them (`pkg/apis/resource/v1beta1/conversion.go`, `v1beta2`), so
//! manifests written for 1.32–1.33 servers (NVIDIA's examples are partly
//! `v1beta1`) simulate unchanged.
//!
//! - `v1beta2` has the shapes of `v1`: only the version changes.
//! - `v1beta1` puts a request's fields inline (`deviceClassName`,
//!   `selectors`, `allocationMode`, `count`, `adminAccess`, `tolerations`,
//!   `capacity`) where `v1` nests them under `exactly`, unless the request
//!   has `firstAvailable`; and it wraps a device's fields in `basic`.
//!   Everything else (classes, allocation results, subrequests, counters)
//!   has one shape in all three.

use serde_json::{Map, Value};

pub const V1: &str = "resource.k8s.io/v1";
const V1BETA1: &str = "resource.k8s.io/v1beta1";
const V1BETA2: &str = "resource.k8s.io/v1beta2";

/// The request fields `v1beta1` has inline and `v1` under `exactly`.
const EXACT_FIELDS: [&str; 7] =
    ["deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations", "capacity"];

/// Whether `api_version` is one this module converts to `v1`.
pub fn convertible(api_version: &str) -> bool {
    matches!(api_version, V1BETA1 | V1BETA2)
}

/// Converts a `v1beta1` or `v1beta2` object of `kind` to `v1` in place; a
/// `v1` object (or any other) is left as it is.
pub fn to_v1(kind: &str, object: &mut Value) {
    let Some(api) = object.get("apiVersion").and_then(Value::as_str).map(str::to_string) else { return };
    if !convertible(&api) {
        return;
    }
    if api == V1BETA1 {
        match kind {
            "ResourceClaim" => requests_to_v1(object.pointer_mut("/spec/devices/requests")),
            "ResourceClaimTemplate" => requests_to_v1(object.pointer_mut("/spec/spec/devices/requests")),
            "ResourceSlice" => devices_to_v1(object.pointer_mut("/spec/devices")),
            _ => {}
        }
    }
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".to_string(), Value::String(V1.to_string()));
    }
}

fn requests_to_v1(requests: Option<&mut Value>) {
    for request in requests.and_then(Value::as_array_mut).into_iter().flatten() {
        let Some(map) = request.as_object_mut() else { continue };
        let first_available = map.get("firstAvailable").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        let mut exactly = Map::new();
        for field in EXACT_FIELDS {
            if let Some(v) = map.remove(field) {
                exactly.insert(field.to_string(), v);
            }
        }
        if !first_available {
            map.insert("exactly".to_string(), Value::Object(exactly));
        }
    }
}

fn devices_to_v1(devices: Option<&mut Value>) {
    for device in devices.and_then(Value::as_array_mut).into_iter().flatten() {
        let Some(map) = device.as_object_mut() else { continue };
        if let Some(Value::Object(basic)) = map.remove("basic") {
            for (k, v) in basic {
                map.entry(k).or_insert(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn v1beta1_requests_move_under_exactly_unless_first_available() {
        let mut claim = json!({
            "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
            "spec": {"devices": {"requests": [
                {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2,
                 "selectors": [{"cel": {"expression": "true"}}]},
                {"name": "any", "firstAvailable": [{"name": "h100", "deviceClassName": "gpu.nvidia.com"}]}
            ]}}
        });
        to_v1("ResourceClaim", &mut claim);
        assert_eq!(
            claim,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2,
                     "selectors": [{"cel": {"expression": "true"}}]}},
                    {"name": "any", "firstAvailable": [{"name": "h100", "deviceClassName": "gpu.nvidia.com"}]}
                ]}}
            })
        );
    }

    #[test]
    fn v1beta1_templates_and_slices() {
        let mut template = json!({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaimTemplate",
            "spec": {"spec": {"devices": {"requests": [{"name": "mig", "deviceClassName": "mig.nvidia.com"}]}}}});
        to_v1("ResourceClaimTemplate", &mut template);
        assert_eq!(template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"], "mig.nvidia.com");
        let mut slice = json!({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice",
            "spec": {"devices": [{"name": "gpu-0", "basic": {"attributes": {"type": {"string": "gpu"}},
                                                            "capacity": {"memory": {"value": "80Gi"}}}}]}});
        to_v1("ResourceSlice", &mut slice);
        assert_eq!(
            slice["spec"]["devices"][0],
            json!({"name": "gpu-0",
            "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "80Gi"}}})
        );
    }

    #[test]
    fn v1beta2_only_changes_the_version() {
        let original = json!({"apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceClaim",
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}});
        let mut claim = original.clone();
        to_v1("ResourceClaim", &mut claim);
        assert_eq!(claim["apiVersion"], V1);
        assert_eq!(claim["spec"], original["spec"]);
        let mut other = json!({"apiVersion": "resource.k8s.io/v1alpha3", "kind": "ResourceClaim"});
        to_v1("ResourceClaim", &mut other);
        assert_eq!(
            other["apiVersion"], "resource.k8s.io/v1alpha3",
            "unknown versions are left for the caller to refuse"
        );
    }
}
