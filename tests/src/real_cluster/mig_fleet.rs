//! A fleet of dynamic-MIG nodes for the real kube-scheduler: each node's
//! slices are what our plugin publishes (the driver's own [`SliceBuilder`]
//! with `DynamicMIG`, for the node's name and the server's release), or
//! the same counter sets and devices laid out in another way the API
//! allows ([`Layout`]), to compare what each layout costs the scheduler.

use std::collections::BTreeMap;

use gpu_dra_driver::feature_gates::FeatureGates;
use gpu_dra_driver::inventory::dynamic_mig::DynamicMigGpus;
use gpu_dra_driver::inventory::fake;
use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_dra_driver::slices::partitionable::SliceContent;
use gpu_dra_driver::slices::{ServerRules, SliceBuilder, validate_slice_for};
use gpu_kubelet_plugin::mig::selection::DynamicMigSelection;
use k8s_openapi::api::resource::v1::{CounterSet, Device, ResourceSlice};

/// Eight H100-80GB in MIG mode without instances: 8 counter sets and 208
/// devices (every profile at every placement, and the whole GPU).
pub const H100_NODE: &str = "gpus: [{model: H100-80GB, count: 8, mig: [{dynamic: true}]}]";

/// How a node's counter sets and devices are spread over its slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// What the plugin publishes ([`SliceBuilder`]): from 1.35 one slice of
    /// up to 8 counter sets, then devices 64 to a slice; on 1.34 sets with
    /// their devices, two GPUs to a slice.
    Plugin,
    /// One slice per GPU for its counter set and one for its devices
    /// (1.35+); on 1.34 one slice per GPU holding both.
    PerGpu,
    /// One slice of all counter sets, then one device slice per GPU (1.35+).
    SetsTogetherDevicesPerGpu,
}

impl Layout {
    pub const ALL: [Layout; 3] = [Layout::Plugin, Layout::PerGpu, Layout::SetsTogetherDevicesPerGpu];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Plugin => "plugin",
            Layout::PerGpu => "per-gpu",
            Layout::SetsTogetherDevicesPerGpu => "sets-together",
        }
    }

    /// Whether the API of release `rules` accepts this layout.
    pub fn allowed(self, rules: ServerRules) -> bool {
        self != Layout::SetsTogetherDevicesPerGpu || rules.counters_in_own_slices()
    }

    /// What a node's slices are in this layout for `rules`.
    pub fn describe(self, rules: ServerRules) -> &'static str {
        match (self, rules.counters_in_own_slices()) {
            (Layout::Plugin, true) => "1 slice of 8 counter sets + 4 device slices (64, 64, 64, 16)",
            (Layout::Plugin, false) => "4 slices, each 2 GPUs' sets and devices",
            (Layout::PerGpu, true) => "8 counter-set slices + 8 device slices (26 each)",
            (Layout::PerGpu, false) => "8 slices, each 1 GPU's set and devices",
            (Layout::SetsTogetherDevicesPerGpu, _) => "1 slice of 8 counter sets + 8 device slices (26 each)",
        }
    }
}

/// Why a node's slices could not be made.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("node {node}: {problem}")]
    Node { node: String, problem: String },
    #[error("layout {layout} is not allowed on 1.{minor}")]
    NotAllowed { layout: &'static str, minor: u32 },
}

/// Node `n`'s name.
pub fn node_name(n: usize) -> String {
    format!("mig-node-{n:04}")
}

/// Node `node`'s slices: the plugin's for `rules`, laid out as `layout`;
/// every slice passes our validation for `rules`.
pub fn node_slices(node: &str, rules: ServerRules, layout: Layout) -> Result<Vec<ResourceSlice>, FleetError> {
    let fail = |problem: String| FleetError::Node { node: node.to_string(), problem };
    if !layout.allowed(rules) {
        return Err(FleetError::NotAllowed { layout: layout.name(), minor: rules.minor });
    }
    let name = NodeName::new(node).map_err(|e| fail(e.to_string()))?;
    let mut inventory =
        fake::parse(H100_NODE, &name).map_err(|(field, problem, _)| fail(format!("{field}: {problem}")))?;
    let gates: FeatureGates = "DynamicMIG=true".parse().map_err(|e| fail(format!("{e}")))?;
    // As the plugin does at start-up: MIG-mode GPUs without instances are dynamic.
    DynamicMigSelection::new(gates, DynamicMigGpus::Auto).apply(&mut inventory);
    let builder = SliceBuilder::new(DriverName::nvidia_default(), name).with_gates(gates).for_server(rules);
    let published = builder.build(&inventory, 1).map_err(|e| fail(e.to_string()))?;
    let slices = match layout {
        Layout::Plugin => published,
        Layout::PerGpu | Layout::SetsTogetherDevicesPerGpu => relayout(&builder, published, rules, layout),
    };
    for slice in &slices {
        let errors = validate_slice_for(slice, rules);
        if !errors.is_empty() {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            return Err(fail(format!("{}: {}", slice.metadata.name.clone().unwrap_or_default(), errors.join("; "))));
        }
    }
    Ok(slices)
}

/// The same counter sets and devices, in the same order, in `layout`.
fn relayout(
    builder: &SliceBuilder,
    published: Vec<ResourceSlice>,
    rules: ServerRules,
    layout: Layout,
) -> Vec<ResourceSlice> {
    let template = published[0].clone();
    let (mut sets, mut by_set): (Vec<CounterSet>, BTreeMap<String, Vec<Device>>) = (Vec::new(), BTreeMap::new());
    for slice in published {
        sets.extend(slice.spec.shared_counters.into_iter().flatten());
        for device in slice.spec.devices.into_iter().flatten() {
            let set = device.consumes_counters.iter().flatten().next().map(|c| c.counter_set.clone());
            by_set.entry(set.unwrap_or_default()).or_default().push(device);
        }
    }
    let mut contents: Vec<SliceContent> = Vec::new();
    match (layout, rules.counters_in_own_slices()) {
        (Layout::PerGpu, false) => {
            for set in sets {
                let devices = by_set.remove(&set.name).unwrap_or_default();
                contents.push(SliceContent { devices: Some(devices), counter_sets: Some(vec![set]) });
            }
        }
        (Layout::PerGpu, true) => {
            let names: Vec<String> = sets.iter().map(|s| s.name.clone()).collect();
            contents.extend(sets.into_iter().map(|s| SliceContent { devices: None, counter_sets: Some(vec![s]) }));
            contents.extend(names.iter().map(|n| SliceContent { devices: by_set.remove(n), counter_sets: None }));
        }
        _ => {
            let names: Vec<String> = sets.iter().map(|s| s.name.clone()).collect();
            contents.push(SliceContent { devices: None, counter_sets: Some(sets) });
            contents.extend(names.iter().map(|n| SliceContent { devices: by_set.remove(n), counter_sets: None }));
        }
    }
    let count = contents.len() as i64;
    contents
        .into_iter()
        .enumerate()
        .map(|(i, content)| {
            let mut slice = template.clone();
            slice.metadata.name = Some(builder.slice_name(i));
            slice.spec.pool.resource_slice_count = count;
            slice.spec.devices = content.devices;
            slice.spec.shared_counters = content.counter_sets;
            slice
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(slices: &[ResourceSlice]) -> Vec<(usize, usize)> {
        let len = |s: &ResourceSlice| {
            (s.spec.shared_counters.as_ref().map_or(0, Vec::len), s.spec.devices.as_ref().map_or(0, Vec::len))
        };
        slices.iter().map(len).collect()
    }

    fn devices(slices: &[ResourceSlice]) -> Vec<String> {
        slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone()).collect()
    }

    #[test]
    fn every_layout_holds_the_plugins_devices_and_passes_validation() {
        for minor in [34, 37] {
            let rules = ServerRules { minor };
            let plugin = node_slices("n", rules, Layout::Plugin).unwrap();
            for layout in Layout::ALL.into_iter().filter(|l| l.allowed(rules)) {
                let slices = node_slices("n", rules, layout).unwrap();
                assert_eq!(devices(&slices), devices(&plugin), "1.{minor} {layout:?}");
                assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == slices.len() as i64));
            }
        }
        let (v134, v137) = (ServerRules { minor: 34 }, ServerRules { minor: 37 });
        assert_eq!(
            shape(&node_slices("n", v137, Layout::Plugin).unwrap()),
            [(8, 0), (0, 64), (0, 64), (0, 64), (0, 16)]
        );
        assert_eq!(shape(&node_slices("n", v134, Layout::Plugin).unwrap()), [(2, 52); 4]);
        let per_gpu = shape(&node_slices("n", v137, Layout::PerGpu).unwrap());
        assert_eq!(per_gpu, [[(1, 0); 8], [(0, 26); 8]].concat());
        assert_eq!(shape(&node_slices("n", v134, Layout::PerGpu).unwrap()), [(1, 26); 8]);
        let together = shape(&node_slices("n", v137, Layout::SetsTogetherDevicesPerGpu).unwrap());
        assert_eq!(together, [vec![(8, 0)], vec![(0, 26); 8]].concat());
        assert!(matches!(
            node_slices("n", v134, Layout::SetsTogetherDevicesPerGpu),
            Err(FleetError::NotAllowed { minor: 34, .. })
        ));
    }
}
