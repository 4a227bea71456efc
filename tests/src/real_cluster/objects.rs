//! Creating manifests (the chart's rendering, the examples' YAML) in the
//! real API server as they are, whatever their kind: the kind is resolved
//! through the server's discovery, as `kubectl create -f` does.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::Value;

/// Creates each object in order; the first refusal is returned with the
/// object's kind and name and the server's message.
pub async fn create_all(client: &kube::Client, objects: &[Value]) -> Result<Vec<DynamicObject>, String> {
    let mut created = Vec::new();
    for object in objects {
        created.push(create(client, object).await?);
    }
    Ok(created)
}

/// Creates one object; its namespace defaults to `default` when the kind
/// is namespaced and the manifest names none.
pub async fn create(client: &kube::Client, object: &Value) -> Result<DynamicObject, String> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let what = format!("{kind} {name} ({api_version})");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) =
        kube::discovery::pinned_kind(client, &gvk).await.map_err(|e| format!("{what}: discovery: {e}"))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            let namespace = object["metadata"]["namespace"].as_str().unwrap_or("default");
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let typed: DynamicObject = serde_json::from_value(object.clone()).map_err(|e| format!("{what}: {e}"))?;
    api.create(&PostParams::default(), &typed).await.map_err(|e| format!("{what}: {e}"))
}
