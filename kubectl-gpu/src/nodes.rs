//! `kubectl gpu nodes`: per node, the GPUs by model, the MIG layout, how
//! many devices are allocated, shared and free, and device taints; from
//! the driver's ResourceSlices and the claims' allocations.

use std::collections::{BTreeMap, HashMap};

use dra_allocator::{TaintRule, describe_taint as describe};
use gpu_dra_driver::slices::attributes::name;
use k8s_openapi::api::resource::v1::{Device, ResourceClaim, ResourceSlice};
use serde::Serialize;

use crate::output::Cell;

/// The driver whose devices are summarized.
pub const DRIVER: &str = "gpu.nvidia.com";

/// One node's summary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    pub node: String,
    /// Whole GPUs per product name.
    pub gpus: BTreeMap<String, usize>,
    /// MIG devices per profile.
    pub mig: BTreeMap<String, usize>,
    pub devices: usize,
    /// Held by exactly one claim, whole.
    pub allocated: usize,
    /// Held by several claims, or as a share.
    pub shared: usize,
    pub free: usize,
    /// `key=value:Effect` with how many devices carry it.
    pub taints: BTreeMap<String, usize>,
}

fn string_attr(device: &Device, key: &str) -> Option<String> {
    device.attributes.as_ref()?.get(key)?.string.clone()
}

/// How claims hold one device.
#[derive(Debug, Default)]
struct Holders {
    claims: usize,
    as_share: bool,
}

/// (pool, device) of this driver -> who holds it: what `nodes` keeps of
/// the claims, read page by page.
#[derive(Debug, Default)]
pub struct Holdings(HashMap<(String, String), Holders>);

impl Holdings {
    /// Adds one page of claims' allocations.
    pub fn add(&mut self, claims: &[ResourceClaim]) {
        for c in claims {
            let results = c
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref());
            for r in results.into_iter().flatten().filter(|r| r.driver == DRIVER) {
                let h = self.0.entry((r.pool.clone(), r.device.clone())).or_default();
                h.claims += 1;
                h.as_share |= r.share_id.is_some() || r.consumed_capacity.as_ref().is_some_and(|c| !c.is_empty());
            }
        }
    }
}

/// The node summaries, built from the slices page by page (each page can
/// be dropped once added).
#[derive(Debug)]
pub struct Summaries {
    held: Holdings,
    /// The cluster's DeviceTaintRules: their taints count as the devices'.
    rules: Vec<TaintRule>,
    nodes: BTreeMap<String, NodeSummary>,
}

impl Summaries {
    pub fn new(held: Holdings, rules: Vec<TaintRule>) -> Self {
        Summaries { held, rules, nodes: BTreeMap::new() }
    }

    /// Counts one page of slices' devices.
    pub fn add(&mut self, slices: &[ResourceSlice]) {
        for s in slices.iter().filter(|s| s.spec.driver == DRIVER) {
            let node = s.spec.node_name.clone().unwrap_or_else(|| s.spec.pool.name.clone());
            let summary =
                self.nodes.entry(node.clone()).or_insert_with(|| NodeSummary { node, ..NodeSummary::default() });
            for d in s.spec.devices.iter().flatten() {
                let kind = string_attr(d, name::TYPE).unwrap_or_default();
                if kind == name::TYPE_MIG {
                    let profile = string_attr(d, name::PROFILE).unwrap_or_else(|| "?".into());
                    *summary.mig.entry(profile).or_default() += 1;
                } else {
                    let model = string_attr(d, name::PRODUCT_NAME).unwrap_or_else(|| "unknown".into());
                    *summary.gpus.entry(model).or_default() += 1;
                }
                summary.devices += 1;
                match self.held.0.get(&(s.spec.pool.name.clone(), d.name.clone())) {
                    None => summary.free += 1,
                    Some(h) if h.claims > 1 || h.as_share => summary.shared += 1,
                    Some(_) => summary.allocated += 1,
                }
                for t in d.taints.iter().flatten() {
                    *summary.taints.entry(describe(t)).or_default() += 1;
                }
                for rule in self.rules.iter().filter(|r| r.matches(DRIVER, &s.spec.pool.name, &d.name)) {
                    let shown = format!("{} (DeviceTaintRule {})", describe(&rule.taint), rule.name);
                    *summary.taints.entry(shown).or_default() += 1;
                }
            }
        }
    }

    /// Summaries in node name order.
    pub fn finish(self) -> Vec<NodeSummary> {
        self.nodes.into_values().collect()
    }
}

fn counts(map: &BTreeMap<String, usize>) -> String {
    if map.is_empty() {
        return "-".to_string();
    }
    map.iter().map(|(k, n)| format!("{n}x {k}")).collect::<Vec<_>>().join(", ")
}

/// Table rows: NODE, GPUS, MIG, DEVICES, ALLOCATED, SHARED, FREE, TAINTS.
pub const HEADERS: [&str; 8] = ["NODE", "GPUS", "MIG", "DEVICES", "ALLOCATED", "SHARED", "FREE", "TAINTS"];

pub fn rows(summaries: &[NodeSummary]) -> Vec<Vec<Cell>> {
    summaries
        .iter()
        .map(|s| {
            let taints = if s.taints.is_empty() {
                "-".into()
            } else {
                s.taints.iter().map(|(t, n)| format!("{t} ({n})")).collect::<Vec<_>>().join(", ")
            };
            [
                s.node.clone(),
                counts(&s.gpus),
                counts(&s.mig),
                s.devices.to_string(),
                s.allocated.to_string(),
                s.shared.to_string(),
                s.free.to_string(),
                taints,
            ]
            .into_iter()
            .map(Cell::from)
            .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn device(name: &str, kind: &str, extra: (&str, &str)) -> serde_json::Value {
        json!({"name": name, "attributes": {"type": {"string": kind}, extra.0: {"string": extra.1}}})
    }

    fn allocated(name: &str, pool: &str, devices: &[&str], share: bool) -> ResourceClaim {
        let results: Vec<_> = devices
            .iter()
            .map(|d| {
                let mut r = json!({"request": "gpu", "driver": DRIVER, "pool": pool, "device": d});
                if share {
                    r["shareID"] = json!("8f7a2c1e-0000-4000-8000-000000000001");
                }
                r
            })
            .collect();
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {},
            "status": {"allocation": {"devices": {"results": results}}}}))
        .unwrap()
    }

    #[test]
    fn counts_models_mig_profiles_holders_and_taints() {
        let mut tainted = device("gpu-1", "gpu", ("productName", "NVIDIA A100-SXM4-80GB"));
        tainted["taints"] = json!([{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]);
        let slice: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "node-a-gpu"},
            "spec": {"driver": DRIVER, "nodeName": "node-a", "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "devices": [device("gpu-0", "gpu", ("productName", "NVIDIA A100-SXM4-80GB")), tainted,
                    device("gpu-2-mig-0", "mig", ("profile", "1g.10gb")), device("gpu-2-mig-1", "mig", ("profile", "1g.10gb")),
                    device("gpu-2-mig-2", "mig", ("profile", "3g.40gb"))]}
        }))
        .unwrap();
        let other: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "cpu"},
            "spec": {"driver": "example.com/cpu", "nodeName": "node-a", "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "cpu-0"}]}
        }))
        .unwrap();
        let claims = [
            allocated("whole", "node-a", &["gpu-0"], false),
            allocated("s1", "node-a", &["gpu-2-mig-0"], true),
            allocated("s2", "node-a", &["gpu-2-mig-0"], true),
            allocated("elsewhere", "node-b", &["gpu-1"], false),
        ];
        let mut held = Holdings::default();
        held.add(&claims[..2]);
        held.add(&claims[2..]);
        let rule: k8s_openapi::api::resource::v1::DeviceTaintRule = serde_json::from_value(json!({
            "metadata": {"name": "drain-gpu-0"},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
                     "taint": {"key": "example.com/maintenance", "effect": "NoExecute"}}
        }))
        .unwrap();
        let mut summaries = Summaries::new(held, vec![TaintRule::from_api(&rule).unwrap()]);
        summaries.add(&[slice]);
        summaries.add(&[other]);
        let got = summaries.finish();
        assert_eq!(got.len(), 1);
        let a = &got[0];
        assert_eq!((a.devices, a.allocated, a.shared, a.free), (5, 1, 1, 3));
        assert_eq!(
            rows(&got),
            [[
                "node-a",
                "2x NVIDIA A100-SXM4-80GB",
                "2x 1g.10gb, 1x 3g.40gb",
                "5",
                "1",
                "1",
                "3",
                "example.com/maintenance:NoExecute (DeviceTaintRule drain-gpu-0) (1), gpu.nvidia.com/xid=79:NoSchedule (1)"
            ]]
        );
    }
}
