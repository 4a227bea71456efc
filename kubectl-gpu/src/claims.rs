//! `kubectl gpu claims`: each claim with the pods reserving it, its node,
//! its devices and, when its node agent's metrics are reachable, its GPU
//! utilization ([`crate::utilization`]); otherwise "-" and the reason.

use std::collections::{BTreeMap, BTreeSet};

use gpu_dra_driver::k8s_format::RESERVED_FOR_MAX;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimConsumerReference};
use serde::Serialize;

use crate::explain;
use crate::node_metrics::Unavailable;
use crate::output::Cell;
use crate::utilization::{self, ClaimKey, Sample, Utilization};

/// One claim's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSummary {
    pub namespace: String,
    pub name: String,
    pub state: String,
    pub pods: Vec<String>,
    pub node: Option<String>,
    pub devices: String,
    /// For an allocated claim: its utilization, or why it is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utilization: Option<Utilization>,
    #[serde(skip)]
    pub uid: String,
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

/// `pod/<name>` for each consumer, up to the API's maximum
/// ([`RESERVED_FOR_MAX`]); more (a forged answer) end in `+<n> more`.
fn consumers(reserved_for: &[ResourceClaimConsumerReference]) -> Vec<String> {
    let mut shown: Vec<String> = reserved_for
        .iter()
        .take(RESERVED_FOR_MAX)
        .map(|p| format!("{}/{}", p.resource.trim_end_matches('s'), p.name))
        .collect();
    if reserved_for.len() > RESERVED_FOR_MAX {
        shown.push(format!("+{} more", reserved_for.len() - RESERVED_FOR_MAX));
    }
    shown
}

/// Rows in namespace/name order.
pub fn summarize(claims: &[ResourceClaim]) -> Vec<ClaimSummary> {
    let mut rows: Vec<ClaimSummary> = claims
        .iter()
        .map(|c| {
            let status = c.status.as_ref();
            let allocation = status.and_then(|s| s.allocation.as_ref());
            let node = node_of(c);
            ClaimSummary {
                namespace: c.metadata.namespace.clone().unwrap_or_default(),
                name: c.metadata.name.clone().unwrap_or_default(),
                state: if allocation.is_some() { "allocated" } else { "pending" }.to_string(),
                pods: status.and_then(|s| s.reserved_for.as_deref()).map(consumers).unwrap_or_default(),
                devices: explain::devices(allocation, node.as_deref()),
                node,
                utilization: None,
                uid: c.metadata.uid.clone().unwrap_or_default(),
            }
        })
        .collect();
    sort(&mut rows);
    rows
}

/// In namespace/name order (the pages' rows together).
pub fn sort(rows: &mut [ClaimSummary]) {
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
}

/// The nodes whose agents know the allocated claims' utilization.
pub fn nodes(summaries: &[ClaimSummary]) -> BTreeSet<String> {
    summaries.iter().filter(|s| s.state == "allocated").filter_map(|s| s.node.clone()).collect()
}

/// Fills each allocated claim's utilization from its node's samples;
/// returns one warning per node whose samples could not be had.
pub fn attach_utilization(
    summaries: &mut [ClaimSummary],
    per_node: &BTreeMap<String, Result<Vec<Sample>, Unavailable>>,
) -> Vec<String> {
    for s in summaries.iter_mut().filter(|s| s.state == "allocated") {
        let Some(node) = &s.node else { continue };
        s.utilization = per_node.get(node).map(|samples| match samples {
            Ok(samples) => {
                utilization::of_claim(samples, ClaimKey { namespace: &s.namespace, name: &s.name, uid: &s.uid }, node)
            }
            Err(why) => Utilization::Unavailable(format!("node {node}: {why}")),
        });
    }
    per_node
        .iter()
        .filter_map(|(node, result)| {
            result.as_ref().err().map(|why| format!("utilization on node {node} unknown: {why}"))
        })
        .collect()
}

pub const HEADERS: [&str; 7] = ["NAMESPACE", "NAME", "STATE", "PODS", "NODE", "DEVICES", "UTILIZATION"];

pub fn rows(summaries: &[ClaimSummary]) -> Vec<Vec<Cell>> {
    summaries
        .iter()
        .map(|s| {
            vec![
                s.namespace.clone().into(),
                s.name.clone().into(),
                if s.state == "pending" { Cell::red(s.state.clone()) } else { s.state.clone().into() },
                if s.pods.is_empty() { "-".into() } else { s.pods.join(",").into() },
                s.node.clone().unwrap_or_else(|| "-".into()).into(),
                s.devices.clone().into(),
                s.utilization.as_ref().map_or_else(|| "-".into(), Utilization::cell).into(),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A forged answer with 10,000 consumers: the API's 256 shown, and how
    /// many more there were.
    #[test]
    fn reserved_for_is_shown_up_to_the_apis_maximum() {
        let reserved: Vec<serde_json::Value> = (0..10_000)
            .map(|i| json!({"resource": "pods", "name": format!("p-{i}"), "uid": format!("u-{i}")}))
            .collect();
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns"}, "spec": {},
            "status": {"reservedFor": reserved}
        }))
        .unwrap();
        let pods = &summarize(&[claim])[0].pods;
        assert_eq!(pods.len(), RESERVED_FOR_MAX + 1);
        assert_eq!(pods[RESERVED_FOR_MAX - 1], "pod/p-255");
        assert_eq!(pods[RESERVED_FOR_MAX], "+9744 more");
    }

    #[test]
    fn rows_show_pods_node_devices_and_what_the_agents_say() {
        let allocated: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "u-1"}, "spec": {},
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
        let mut got = summarize(&[allocated.clone(), pending]);
        assert_eq!(nodes(&got), BTreeSet::from(["node-a".to_string()]));
        assert_eq!(
            rows(&got),
            [
                ["default", "big", "pending", "-", "-", "-", "-"],
                ["ml", "train", "allocated", "pod/trainer-0", "node-a", "gpu=gpu-0,gpu-1", "-"],
            ]
        );
        let samples = utilization::parse(
            "gpu_dra_device_gpu_utilization_percent{device=\"gpu-0\",claim_uid=\"u-1\"} 10\n\
             gpu_dra_device_gpu_utilization_percent{device=\"gpu-1\",claim_uid=\"u-1\"} 20\n",
        );
        let warnings = attach_utilization(&mut got, &BTreeMap::from([("node-a".to_string(), Ok(samples))]));
        assert!(warnings.is_empty());
        assert_eq!(rows(&got)[1][6], "15%");
        assert_eq!(got[0].utilization, None, "a pending claim has none");

        let mut got = summarize(&[allocated]);
        let down = BTreeMap::from([("node-a".to_string(), Err(Unavailable::Listing("timed out".to_string())))]);
        assert_eq!(attach_utilization(&mut got, &down), ["utilization on node node-a unknown: timed out"]);
        assert_eq!(rows(&got)[0][6], "-", "never a made-up number");
        assert_eq!(got[0].utilization, Some(Utilization::Unavailable("node node-a: timed out".into())));
    }
}
