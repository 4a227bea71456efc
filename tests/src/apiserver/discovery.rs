//! Legacy discovery documents (`/api`, `/apis`, `/api/v1`,
//! `/apis/<group>/<version>`) for the served kinds, so that kubectl can map
//! `kubectl get resourceslices` to its URL. kubectl asks for aggregated
//! discovery first and, given plain JSON, falls back to these, as with a
//! server before 1.26.

use serde_json::{Value, json};

use super::kinds::{KINDS, Kind};

/// The discovery document at `path`, if it is one.
pub fn document(path: &str) -> Option<Value> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api"] => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        })),
        ["apis"] => Some(group_list()),
        ["api", "v1"] => Some(resource_list("", "v1")),
        ["apis", group, version] if KINDS.iter().any(|k| k.group == *group && k.version == *version) => {
            Some(resource_list(group, version))
        }
        _ => None,
    }
}

fn group_list() -> Value {
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for kind in KINDS.iter().filter(|k| !k.group.is_empty()) {
        if !groups.contains(&(kind.group, kind.version)) {
            groups.push((kind.group, kind.version));
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(group, version)| {
            let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
            json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for kind in KINDS.iter().filter(|k| k.group == group && k.version == version) {
        resources.push(resource(kind));
        if kind.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", kind.plural),
                "singularName": "",
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

fn resource(kind: &Kind) -> Value {
    json!({
        "name": kind.plural,
        "singularName": kind.kind.to_lowercase(),
        "namespaced": kind.namespaced,
        "kind": kind.kind,
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    })
}
