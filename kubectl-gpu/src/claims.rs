//! `kubectl gpu claims`: each claim with the pods reserving it, its node
//! and its devices. Utilization needs the node agents' metrics, which this
//! command does not read yet: the column says "-" rather than a guess.

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::Serialize;

use crate::explain;

/// One claim's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSummary {
    pub namespace: String,
    pub name: String,
    pub state: String,
    pub pods: Vec<String>,
    pub node: Option<String>,
    pub devices: String,
    /// `None` until per-claim metrics are read.
    pub utilization: Option<String>,
}

/// The node an allocation is bound to: its node selector's
/// `metadata.name` field, else the pool of its first device.
fn node_of(claim: &ResourceClaim) -> Option<String> {
    let allocation = claim.status.as_ref()?.allocation.as_ref()?;
    let by_selector = allocation.node_selector.as_ref().and_then(|s| {
        s.node_selector_terms.iter().flat_map(|t| t.match_fields.iter().flatten()).find_map(|f| {
            (f.key == "metadata.name" && f.operator == "In").then(|| f.values.as_ref()?.first().cloned()).flatten()
        })
    });
    by_selector.or_else(|| allocation.devices.as_ref()?.results.as_ref()?.first().map(|r| r.pool.clone()))
}

/// Rows in namespace/name order.
pub fn summarize(claims: &[ResourceClaim]) -> Vec<ClaimSummary> {
    let mut rows: Vec<ClaimSummary> = claims
        .iter()
        .map(|c| {
            let status = c.status.as_ref();
            let allocation = status.and_then(|s| s.allocation.as_ref());
            let node = node_of(c);
            let allocation_json = allocation.and_then(|a| serde_json::to_value(a).ok());
            ClaimSummary {
                namespace: c.metadata.namespace.clone().unwrap_or_default(),
                name: c.metadata.name.clone().unwrap_or_default(),
                state: if allocation.is_some() { "allocated" } else { "pending" }.to_string(),
                pods: status
                    .and_then(|s| s.reserved_for.as_ref())
                    .map(|r| r.iter().map(|p| format!("{}/{}", p.resource.trim_end_matches('s'), p.name)).collect())
                    .unwrap_or_default(),
                devices: explain::devices(allocation_json.as_ref(), node.as_deref()),
                node,
                utilization: None,
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

pub const HEADERS: [&str; 7] = ["NAMESPACE", "NAME", "STATE", "PODS", "NODE", "DEVICES", "UTILIZATION"];

pub fn rows(summaries: &[ClaimSummary], paint: &crate::output::Paint) -> Vec<Vec<String>> {
    summaries
        .iter()
        .map(|s| {
            vec![
                s.namespace.clone(),
                s.name.clone(),
                if s.state == "pending" { paint.red(&s.state) } else { s.state.clone() },
                if s.pods.is_empty() { "-".into() } else { s.pods.join(",") },
                s.node.clone().unwrap_or_else(|| "-".into()),
                s.devices.clone(),
                s.utilization.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Paint;
    use serde_json::json;

    #[test]
    fn rows_show_pods_node_and_devices() {
        let allocated: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml"}, "spec": {},
            "status": {
                "allocation": {
                    "devices": {"results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"}]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
                "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "u1"}]}
        }))
        .unwrap();
        let pending: ResourceClaim =
            serde_json::from_value(json!({"metadata": {"name": "big", "namespace": "default"}, "spec": {}})).unwrap();
        let got = summarize(&[allocated, pending]);
        assert_eq!(
            rows(&got, &Paint::default()),
            [
                ["default", "big", "pending", "-", "-", "-", "-"],
                ["ml", "train", "allocated", "pod/trainer-0", "node-a", "gpu=gpu-0,gpu-1", "-"],
            ]
        );
    }
}
