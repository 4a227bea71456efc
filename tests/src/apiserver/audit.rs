//! What a request asks to do, in the terms RBAC authorizes: verb, API
//! group, resource and subresource, as the real server's
//! `RequestInfoFactory` (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`)
//! derives them: GET on an object is `get`, on a collection `list`, with
//! `watch=true` `watch`; POST `create`; PUT `update`; PATCH `patch`;
//! DELETE on an object `delete`, on a collection `deletecollection`.

use std::collections::BTreeSet;

use super::faults::RequestRecord;
use super::kinds;

/// One authorization request, as an RBAC rule would have to allow it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiCall {
    pub verb: &'static str,
    /// Empty for the core group.
    pub group: String,
    /// `resourceclaims` or `resourceclaims/status`.
    pub resource: String,
    /// `None` for cluster-scoped requests and requests across namespaces.
    pub namespace: Option<String>,
}

/// The authorization attributes of a recorded request; `None` for
/// non-resource URLs (`/version`, discovery), which every authenticated
/// user may read (the `system:discovery` ClusterRole).
pub fn api_call(record: &RequestRecord) -> Option<ApiCall> {
    if let Some(call) = pod_proxy_call(record) {
        return Some(call);
    }
    let target = kinds::parse_path(&record.path)?;
    let verb = match (record.method.as_str(), target.name.is_some()) {
        ("GET", _) if record.watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    let resource =
        if target.status { format!("{}/status", target.kind.plural) } else { target.kind.plural.to_string() };
    Some(ApiCall { verb, group: target.kind.group.to_string(), resource, namespace: target.namespace })
}

/// A request through a pod's proxy (`/api/v1/namespaces/NS/pods/NAME[:PORT]/proxy/...`),
/// which Kubernetes authorizes as the request's method, lowercased, on
/// `pods/proxy` (`RequestInfoFactory` in apiserver's `request/requestinfo.go`).
fn pod_proxy_call(record: &RequestRecord) -> Option<ApiCall> {
    let path = record.path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let ["api", "v1", "namespaces", namespace, "pods", _, "proxy", ..] = segments.as_slice() else { return None };
    let verb = match record.method.as_str() {
        "GET" => "get",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => return None,
    };
    Some(ApiCall {
        verb,
        group: String::new(),
        resource: "pods/proxy".into(),
        namespace: Some((*namespace).to_string()),
    })
}

/// The distinct calls made by clients whose `User-Agent` starts with
/// `agent` (e.g. `gpu-kubelet-plugin/`).
pub fn calls_by(records: &[RequestRecord], agent: &str) -> BTreeSet<ApiCall> {
    records.iter().filter(|r| r.user_agent.starts_with(agent)).filter_map(api_call).collect()
}
