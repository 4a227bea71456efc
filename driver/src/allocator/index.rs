//! The fleet as an index: every usable device gets a dense number, and each
//! node gets the list of devices it can see, in upstream's search order
//! (pools by driver and name, pools with binding conditions last, slices by
//! name, devices in slice order).
//!
//! Built once per snapshot; node views are computed eagerly for the known
//! nodes (and on demand for others) so a claim only walks one node's
//! devices, never the fleet.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};

use super::counters::{Consumption, PoolCounters};
use super::explain::PoolProblem;
use super::node_selection::{NodeInfo, Reach};
use super::pools::{self, Pool};

/// A device's place in the fleet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceRef {
    pub(crate) pool: u32,
    pub(crate) slice: u32,
    pub(crate) index: u32,
}

/// What one node can see.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeView {
    /// Usable devices (complete, valid pools), in search order.
    pub(crate) devices: Vec<u32>,
    /// Pools the node can see that are incomplete or invalid.
    pub(crate) problem_pools: Vec<u32>,
    /// A node selector in a slice or device that cannot be evaluated.
    pub(crate) error: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Fleet {
    slices: Vec<ResourceSlice>,
    pools: Vec<Pool>,
    devices: Vec<DeviceRef>,
    by_id: HashMap<(String, String, String), u32>,
    node_names: Vec<String>,
    node_infos: HashMap<String, NodeInfo>,
    node_index: HashMap<String, usize>,
    views: Vec<NodeView>,
    /// Slices that are not pinned to one node by `nodeName`.
    shared_slices: Vec<usize>,
    /// node name → its node-local slices.
    local_slices: HashMap<String, Vec<usize>>,
    /// slice → its pool.
    slice_pool: Vec<u32>,
    /// slice → index of its first device in `devices` (valid pools only).
    slice_first_device: Vec<Option<u32>>,
    /// Numbered counters per pool, and each device's parsed consumption.
    pool_counters: Vec<PoolCounters>,
    consumption: Vec<Consumption>,
}

impl Fleet {
    pub(crate) fn build(all: &[ResourceSlice], nodes: &[Node]) -> Self {
        let (slices, pools) = pools::build(all);
        let mut devices = Vec::new();
        let mut consumption = Vec::new();
        let pool_counters: Vec<PoolCounters> = pools.iter().map(|p| PoolCounters::new(&p.counter_sets)).collect();
        let mut by_id = HashMap::new();
        let mut slice_pool = vec![0; slices.len()];
        let mut slice_first_device = vec![None; slices.len()];
        for (p, pool) in pools.iter().enumerate() {
            for &s in &pool.slices {
                if let Some(sp) = slice_pool.get_mut(s) {
                    *sp = p as u32;
                }
            }
            if pool.problem.is_some() {
                continue;
            }
            for &s in &pool.slices {
                let Some(slice) = slices.get(s) else { continue };
                if pools::is_counter_slice(slice) {
                    continue;
                }
                if let Some(first) = slice_first_device.get_mut(s) {
                    *first = Some(devices.len() as u32);
                }
                for (i, d) in slice.spec.devices.as_deref().unwrap_or_default().iter().enumerate() {
                    let idx = devices.len() as u32;
                    devices.push(DeviceRef { pool: p as u32, slice: s as u32, index: i as u32 });
                    consumption.push(pool_counters.get(p).map(|pc| pc.consumption(d)).unwrap_or_default());
                    by_id.insert((pool.driver.clone(), pool.name.clone(), d.name.clone()), idx);
                }
            }
        }
        let mut node_infos: HashMap<String, NodeInfo> = HashMap::new();
        for n in nodes {
            let Some(name) = n.metadata.name.clone() else { continue };
            let labels = n.metadata.labels.clone().unwrap_or_default();
            node_infos.insert(name.clone(), NodeInfo { name, labels });
        }
        let mut shared_slices = Vec::new();
        let mut local_slices: HashMap<String, Vec<usize>> = HashMap::new();
        let mut names: BTreeSet<String> = node_infos.keys().cloned().collect();
        for (i, s) in slices.iter().enumerate() {
            match s.spec.node_name.as_ref().filter(|n| !n.is_empty()) {
                Some(n) if !pools::is_counter_slice(s) => {
                    names.insert(n.clone());
                    local_slices.entry(n.clone()).or_default().push(i);
                }
                _ => shared_slices.push(i),
            }
            if s.spec.per_device_node_selection == Some(true) {
                for d in s.spec.devices.as_deref().unwrap_or_default() {
                    if let Some(n) = d.node_name.as_ref().filter(|n| !n.is_empty()) {
                        names.insert(n.clone());
                    }
                }
            }
        }
        for name in &names {
            node_infos
                .entry(name.clone())
                .or_insert_with(|| NodeInfo { name: name.clone(), labels: Default::default() });
        }
        let node_names: Vec<String> = names.into_iter().collect();
        let node_index = node_names.iter().enumerate().map(|(i, n)| (n.clone(), i)).collect();
        let mut fleet = Fleet {
            slices,
            pools,
            devices,
            by_id,
            node_names,
            node_infos,
            node_index,
            views: Vec::new(),
            shared_slices,
            local_slices,
            slice_pool,
            slice_first_device,
            pool_counters,
            consumption,
        };
        let views = fleet.node_names.iter().map(|n| fleet.compute_view(&fleet.node_infos[n])).collect();
        fleet.views = views;
        fleet
    }

    pub(crate) fn node_names(&self) -> &[String] {
        &self.node_names
    }

    pub(crate) fn node_position(&self, node: &str) -> Option<usize> {
        self.node_index.get(node).copied()
    }

    pub(crate) fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// The view of any node: precomputed when known, else computed for a
    /// node without labels.
    pub(crate) fn view(&self, node: &str) -> std::borrow::Cow<'_, NodeView> {
        match self.node_position(node).and_then(|p| self.views.get(p)) {
            Some(v) => std::borrow::Cow::Borrowed(v),
            None => std::borrow::Cow::Owned(
                self.compute_view(&NodeInfo { name: node.to_string(), labels: Default::default() }),
            ),
        }
    }

    pub(crate) fn pool(&self, p: u32) -> Option<&Pool> {
        self.pools.get(p as usize)
    }

    pub(crate) fn device_ref(&self, d: u32) -> Option<DeviceRef> {
        self.devices.get(d as usize).copied()
    }

    pub(crate) fn slice_of(&self, d: u32) -> Option<&ResourceSlice> {
        self.device_ref(d).and_then(|r| self.slices.get(r.slice as usize))
    }

    pub(crate) fn device(&self, d: u32) -> Option<&Device> {
        let r = self.device_ref(d)?;
        self.slices.get(r.slice as usize)?.spec.devices.as_ref()?.get(r.index as usize)
    }

    /// A device's counter consumption (empty when it consumes none).
    pub(crate) fn consumption(&self, d: u32) -> &[(u32, super::amount::Amount)] {
        self.consumption.get(d as usize).map(|c| &c[..]).unwrap_or_default()
    }

    pub(crate) fn pool_counters(&self, p: u32) -> Option<&PoolCounters> {
        self.pool_counters.get(p as usize)
    }

    pub(crate) fn pool_of(&self, d: u32) -> Option<&Pool> {
        self.device_ref(d).and_then(|r| self.pool(r.pool))
    }

    /// `driver`, `pool`, `device` of a device.
    pub(crate) fn id(&self, d: u32) -> (&str, &str, &str) {
        match (self.pool_of(d), self.device(d)) {
            (Some(p), Some(dev)) => (&p.driver, &p.name, &dev.name),
            _ => ("", "", ""),
        }
    }

    /// `driver/pool/device`, for messages.
    pub(crate) fn describe(&self, d: u32) -> String {
        let (driver, pool, device) = self.id(d);
        format!("{driver}/{pool}/{device}")
    }

    pub(crate) fn lookup(&self, driver: &str, pool: &str, device: &str) -> Option<u32> {
        self.by_id.get(&(driver.to_string(), pool.to_string(), device.to_string())).copied()
    }

    /// Where a device may be used: the device's own selection when its slice
    /// uses `perDeviceNodeSelection`, else the slice's.
    pub(crate) fn reach(&self, d: u32) -> Reach<'_> {
        match (self.slice_of(d), self.device(d)) {
            (Some(s), Some(dev)) if s.spec.per_device_node_selection == Some(true) => {
                Reach::of(dev.node_name.as_ref(), dev.all_nodes, dev.node_selector.as_ref())
            }
            (Some(s), _) => Reach::of(s.spec.node_name.as_ref(), s.spec.all_nodes, s.spec.node_selector.as_ref()),
            _ => Reach::Unknown,
        }
    }

    fn compute_view(&self, node: &NodeInfo) -> NodeView {
        let mut slices: Vec<usize> = self.local_slices.get(&node.name).cloned().unwrap_or_default();
        let mut error = None;
        for &i in &self.shared_slices {
            let Some(s) = self.slices.get(i) else { continue };
            let relevant = if pools::is_counter_slice(s) {
                // Counter slices matter to every node that uses the pool, not on their own.
                false
            } else if s.spec.per_device_node_selection == Some(true) {
                s.spec.devices.as_deref().unwrap_or_default().iter().any(|d| {
                    Reach::of(d.node_name.as_ref(), d.all_nodes, d.node_selector.as_ref()).matches(node).unwrap_or_else(
                        |e| {
                            error.get_or_insert_with(|| format!("slice {}: device {}: {e}", name(s), d.name));
                            false
                        },
                    )
                })
            } else {
                Reach::of(s.spec.node_name.as_ref(), s.spec.all_nodes, s.spec.node_selector.as_ref())
                    .matches(node)
                    .unwrap_or_else(|e| {
                        error.get_or_insert_with(|| format!("slice {}: {e}", name(s)));
                        false
                    })
            };
            if relevant {
                slices.push(i);
            }
        }
        // Kept slices are stored pool by pool in (driver, pool, name) order,
        // so slice index order is search order.
        slices.sort_unstable();
        slices.dedup();
        let mut pools_seen: Vec<u32> = Vec::new();
        let mut by_pool: Vec<(bool, u32, Vec<u32>)> = Vec::new();
        for &si in &slices {
            let Some(s) = self.slices.get(si) else { continue };
            let Some(&p) = self.slice_pool.get(si) else { continue };
            if !pools_seen.contains(&p) {
                pools_seen.push(p);
                let binding = self.pool(p).is_some_and(|pool| pool.binding_conditions);
                by_pool.push((binding, p, Vec::new()));
            }
            if self.pool(p).is_some_and(|pool| pool.problem.is_some()) {
                continue;
            }
            let per_device = s.spec.per_device_node_selection == Some(true);
            let Some(entry) = by_pool.iter_mut().find(|e| e.1 == p) else { continue };
            for (i, dev) in s.spec.devices.as_deref().unwrap_or_default().iter().enumerate() {
                if per_device
                    && !Reach::of(dev.node_name.as_ref(), dev.all_nodes, dev.node_selector.as_ref())
                        .matches(node)
                        .unwrap_or(false)
                {
                    continue;
                }
                if let Some(Some(first)) = self.slice_first_device.get(si) {
                    entry.2.push(first + i as u32);
                }
            }
        }
        // Pools with binding conditions go last (stable, so name order stays).
        by_pool.sort_by_key(|e| (e.0, e.1));
        let mut view = NodeView { error, ..Default::default() };
        for (_, p, devices) in by_pool {
            if self.pool(p).is_some_and(|pool| pool.problem.is_some()) {
                view.problem_pools.push(p);
            }
            view.devices.extend(devices);
        }
        view
    }

    /// The problem of a pool, if any.
    pub(crate) fn pool_problem(&self, p: u32) -> Option<&PoolProblem> {
        self.pool(p).and_then(|pool| pool.problem.as_ref())
    }
}

fn name(s: &ResourceSlice) -> &str {
    s.metadata.name.as_deref().unwrap_or("<unnamed>")
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn nodes_see_their_own_and_matching_shared_devices() {
        let mut shared = slice("net", "", "fabric", 1, 1, vec![device("nic-0")]);
        shared.spec.node_name = None;
        shared.spec.node_selector = Some(label_selector("zone", &["a"]));
        let mut everywhere = slice("all", "", "global", 1, 1, vec![device("lic-0")]);
        everywhere.spec.node_name = None;
        everywhere.spec.all_nodes = Some(true);
        let fleet = Fleet::build(
            &[node_slice("n1", vec![device("gpu-0")]), node_slice("n2", vec![device("gpu-0")]), shared, everywhere],
            &[node("n1", &[("zone", "a")]), node("n2", &[("zone", "b")])],
        );
        assert_eq!(fleet.node_names(), ["n1", "n2"]);
        let names = |n: &str| -> Vec<String> { fleet.view(n).devices.iter().map(|&d| fleet.describe(d)).collect() };
        assert_eq!(
            names("n1"),
            ["gpu.nvidia.com/fabric/nic-0", "gpu.nvidia.com/global/lic-0", "gpu.nvidia.com/n1/gpu-0"]
        );
        assert_eq!(names("n2"), ["gpu.nvidia.com/global/lic-0", "gpu.nvidia.com/n2/gpu-0"]);
        assert_eq!(names("unknown"), ["gpu.nvidia.com/global/lic-0"]);
    }

    #[test]
    fn per_device_node_selection_filters_devices() {
        let mut s = slice("multi", "", "rack", 1, 1, vec![]);
        s.spec.node_name = None;
        s.spec.per_device_node_selection = Some(true);
        let mut a = device("a");
        a.node_name = Some("n1".into());
        let mut b = device("b");
        b.node_selector = Some(label_selector("zone", &["z"]));
        let mut c = device("c");
        c.all_nodes = Some(true);
        s.spec.devices = Some(vec![a, b, c]);
        let fleet = Fleet::build(&[s], &[node("n2", &[("zone", "z")])]);
        assert_eq!(fleet.node_names(), ["n1", "n2"], "per-device nodeName names a node");
        let names = |n: &str| -> Vec<&str> { fleet.view(n).devices.iter().map(|&d| fleet.id(d).2).collect() };
        assert_eq!(names("n1"), ["a", "c"]);
        assert_eq!(names("n2"), ["b", "c"]);
    }

    #[test]
    fn problem_pools_are_visible_but_have_no_devices() {
        let fleet = Fleet::build(&[slice("s", "n1", "p", 1, 2, vec![device("gpu-0")])], &[]);
        let view = fleet.view("n1");
        assert!(view.devices.is_empty());
        assert_eq!(view.problem_pools.len(), 1);
    }
}
