//! What rendered RBAC rules grant, to hold a chart's roles to the API
//! calls a binary makes against the stand-in (`apiserver::audit`).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::apiserver::audit::ApiCall;

/// (verb, group, resource) a rule allows, and the namespace it is limited
/// to (a Role's) or none (a ClusterRole's).
pub type Grant = (String, String, String, Option<String>);

/// Every grant of a rendered Role or ClusterRole.
pub fn role_grants(role: &Value) -> BTreeSet<Grant> {
    let namespace = role["metadata"]["namespace"].as_str().map(String::from);
    let strings = |rule: &Value, field: &str| -> Vec<String> {
        rule[field].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect()
    };
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        for group in strings(rule, "apiGroups") {
            for resource in strings(rule, "resources") {
                for verb in strings(rule, "verbs") {
                    out.insert((verb, group.clone(), resource.clone(), namespace.clone()));
                }
            }
        }
    }
    out
}

/// Whether `grants` allow `call`.
pub fn allows(grants: &BTreeSet<Grant>, call: &ApiCall) -> bool {
    grants.iter().any(|(verb, group, resource, namespace)| {
        verb == call.verb
            && *group == call.group
            && *resource == call.resource
            && namespace.as_ref().is_none_or(|ns| call.namespace.as_ref() == Some(ns))
    })
}
