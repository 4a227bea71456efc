//! The defaulting the real server applies to `resource.k8s.io/v1` bodies
//! on every write (`pkg/apis/resource/v1/defaults.go`), found different
//! from the stand-in by the real-cluster tests: a device taint without
//! `timeAdded` gets the time of the write (whole seconds), an exact request
//! or subrequest without `allocationMode` gets `ExactCount`, and an
//! `ExactCount` one without `count` gets 1.

use serde_json::{Value, json};

use super::kinds::Kind;
use super::store::now;

pub fn apply(kind: &Kind, object: &mut Value) {
    match kind.kind {
        "ResourceSlice" => {
            let devices = object.pointer_mut("/spec/devices").and_then(Value::as_array_mut).into_iter().flatten();
            for device in devices {
                let taints = device.get_mut("taints").and_then(Value::as_array_mut).into_iter().flatten();
                for taint in taints.filter_map(Value::as_object_mut) {
                    if taint.get("timeAdded").is_none_or(Value::is_null) {
                        taint.insert("timeAdded".into(), json!(now()));
                    }
                }
            }
        }
        "ResourceClaim" => requests(object.pointer_mut("/spec/devices/requests")),
        "ResourceClaimTemplate" => requests(object.pointer_mut("/spec/spec/devices/requests")),
        _ => {}
    }
}

fn requests(requests: Option<&mut Value>) {
    for request in requests.and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(exact) = request.get_mut("exactly") {
            exact_count(exact);
        }
        let subrequests = request.get_mut("firstAvailable").and_then(Value::as_array_mut).into_iter().flatten();
        for subrequest in subrequests {
            exact_count(subrequest);
        }
    }
}

fn exact_count(request: &mut Value) {
    let Some(map) = request.as_object_mut() else { return };
    if map.get("allocationMode").and_then(Value::as_str).is_none_or(str::is_empty) {
        map.insert("allocationMode".into(), json!("ExactCount"));
    }
    let count_unset = map.get("count").and_then(Value::as_i64).is_none_or(|c| c == 0);
    if map.get("allocationMode").and_then(Value::as_str) == Some("ExactCount") && count_unset {
        map.insert("count".into(), json!(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::kinds::by_kind;

    #[test]
    fn taints_get_their_time_and_requests_their_count() {
        let mut slice =
            json!({"spec": {"devices": [{"name": "gpu-0", "taints": [{"key": "k", "effect": "NoSchedule"}]}]}});
        apply(by_kind("ResourceSlice").unwrap(), &mut slice);
        assert!(slice.pointer("/spec/devices/0/taints/0/timeAdded").and_then(Value::as_str).is_some(), "{slice}");

        let mut claim = json!({"spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "c"}},
            {"name": "b", "exactly": {"deviceClassName": "c", "allocationMode": "All"}},
            {"name": "c", "firstAvailable": [{"name": "x", "deviceClassName": "c", "count": 2}]},
        ]}}});
        apply(by_kind("ResourceClaim").unwrap(), &mut claim);
        let requests = &claim["spec"]["devices"]["requests"];
        assert_eq!(requests[0]["exactly"], json!({"deviceClassName": "c", "allocationMode": "ExactCount", "count": 1}));
        assert_eq!(requests[1]["exactly"], json!({"deviceClassName": "c", "allocationMode": "All"}));
        assert_eq!(requests[2]["firstAvailable"][0]["count"], json!(2));
    }
}
