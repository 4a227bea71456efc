//! The fleets and claims both allocators get, written as `v1` Lists in
//! JSON (`kubectl get ... -o json`), the slices one at a time.
//!
//! The H100 fleets are the allocation benchmark's
//! (`allocator/benches/common/fleets.rs`: whole GPUs, or every GPU published as
//! a partitionable device with all its MIG placements drawing on shared
//! counters) and so are its claims: whole H100s with a 3-clause selector
//! and, on the partitionable fleet, 3 in 10 MIG 1g.10gb slices. The A100
//! fleet is what the plugin's slice builder publishes for 8 A100 80GB of
//! which 4 are split 7 × 1g.10gb; its claims ask for a whole GPU with more
//! than 40Gi on a 575+ driver, or (3 in 10) a 1g.10gb slice.

use std::io::Write as _;
use std::path::Path;

use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_dra_driver::slices::SliceBuilder;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

use super::bench_fleets as bench;
use super::{Error, Inputs, Result, io, json};

/// How each node's GPUs are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// 8 whole H100.
    WholeH100,
    /// 8 A100 80GB, 4 of them split 7 × 1g.10gb (32 devices).
    A100HalfMig,
    /// 8 H100, each as a partitionable device: the whole GPU and every MIG
    /// placement on shared counters (208 devices).
    PartitionableH100,
}

impl Layout {
    pub fn describe(self) -> &'static str {
        match self {
            Layout::WholeH100 => "8 H100",
            Layout::A100HalfMig => "8 A100 (4 split 7 x 1g)",
            Layout::PartitionableH100 => "8 partitionable H100",
        }
    }

    /// Node `n`'s slices.
    pub fn node_slices(self, n: usize) -> Result<Vec<ResourceSlice>> {
        match self {
            Layout::WholeH100 => Ok(bench::node_slices(n, false, 1, bench::DRIVER_VERSION)),
            Layout::PartitionableH100 => Ok(bench::node_slices(n, true, 1, bench::DRIVER_VERSION)),
            Layout::A100HalfMig => {
                const INVENTORY: &str = "gpus: [{model: A100-SXM4-80GB, count: 8, mig: [{gpus: [0, 1, 2, 3], \
                    instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}]}]";
                let node = NodeName::new(bench::node_name(n)).map_err(|e| Error::Failed(e.to_string()))?;
                let inventory = gpu_dra_driver::inventory::fake::parse(INVENTORY, &node)
                    .map_err(|(field, problem, _)| Error::Failed(format!("A100 inventory: {field}: {problem}")))?;
                SliceBuilder::new(DriverName::nvidia_default(), node)
                    .build(&inventory, 1)
                    .map_err(|e| Error::Failed(format!("A100 slices: {e}")))
            }
        }
    }

    /// Whether claim `i` (from 1) asks for a MIG slice: 3 in 10 where the
    /// fleet has MIG devices, as the allocation benchmark mixes them.
    fn wants_mig(self, i: usize) -> bool {
        self != Layout::WholeH100 && i % 10 < 3
    }

    /// Claim `i` (from 1).
    pub fn claim(self, i: usize) -> ResourceClaim {
        /// The allocation benchmark's 3-clause selector.
        const H100: &str = r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3" && device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) > 0 && device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("575.0.0")) >= 0"#;
        const LARGE: &str = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) > 0 && device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("575.0.0")) >= 0"#;
        const MIG: &str = r#"device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#;
        let (class, expression) = match self {
            _ if self.wants_mig(i) => ("mig.nvidia.com", MIG),
            Layout::A100HalfMig => ("gpu.nvidia.com", LARGE),
            Layout::WholeH100 | Layout::PartitionableH100 => ("gpu.nvidia.com", H100),
        };
        bench::claim(i, class, expression, None)
    }
}

/// A fleet: `nodes` nodes of one layout, `claims` claims allocated in order.
#[derive(Debug, Clone, Copy)]
pub struct Fleet {
    pub layout: Layout,
    pub nodes: usize,
    pub claims: usize,
}

impl Fleet {
    pub fn describe(&self) -> String {
        format!("{} x {}", thousands(self.nodes), self.layout.describe())
    }

    /// Writes the classes (the shipped ones in `classes_dir`), the slices
    /// and the claims into `dir`.
    pub fn write(&self, dir: &Path, classes_dir: &Path) -> Result<Inputs> {
        let classes = dir.join("classes.json");
        let items = shipped_classes(classes_dir)?;
        write_list(&classes, &items)?;

        let slices = dir.join("slices.json");
        let file = std::fs::File::create(&slices).map_err(io(format!("creating {}", slices.display())))?;
        let (mut devices, mut slice_count, mut failed) = (0usize, 0usize, None);
        let all = (0..self.nodes)
            .map_while(|n| match self.layout.node_slices(n) {
                Ok(s) => Some(s),
                Err(e) => {
                    failed = Some(e);
                    None
                }
            })
            .flatten()
            .inspect(|s| {
                devices += s.spec.devices.as_ref().map_or(0, Vec::len);
                slice_count += 1;
            });
        let slice_bytes = bench::write_list(file, all).map_err(io(format!("writing {}", slices.display())))?;
        if let Some(e) = failed {
            return Err(e);
        }

        let claims = dir.join("claims.json");
        let items: Vec<ResourceClaim> = (1..=self.claims).map(|i| self.layout.claim(i)).collect();
        write_list(&claims, &items)?;
        Ok(Inputs { classes, slices, claims, devices, slice_count, slice_bytes })
    }
}

/// `1,000` for 1000.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The DeviceClasses shipped in `dir` (its `*.yaml` files, not its
/// subfolders), in name order.
fn shipped_classes(dir: &Path) -> Result<Vec<DeviceClass>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(format!("reading {}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).map_err(io(format!("reading {}", p.display())))?;
            serde_yaml_ng::from_str(&text).map_err(|e| Error::Failed(format!("{}: {e}", p.display())))
        })
        .collect()
}

/// Writes `items` as one `v1` List.
fn write_list<T: serde::Serialize>(path: &Path, items: &[T]) -> Result<()> {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    let text = serde_json::to_vec(&list).map_err(json(format!("serializing {}", path.display())))?;
    let mut file = std::fs::File::create(path).map_err(io(format!("creating {}", path.display())))?;
    file.write_all(&text).map_err(io(format!("writing {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(7), "7");
        assert_eq!(thousands(100), "100");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(208_000), "208,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn the_a100_layout_publishes_four_whole_gpus_and_28_mig_slices() {
        let slices = Layout::A100HalfMig.node_slices(3).unwrap();
        let devices: Vec<_> = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
        let kind = |d: &&k8s_openapi::api::resource::v1::Device| {
            d.attributes.as_ref().and_then(|a| a.get("type")).and_then(|t| t.string.clone()).unwrap_or_default()
        };
        assert_eq!(devices.iter().filter(|d| kind(d) == "gpu").count(), 4);
        assert_eq!(devices.iter().filter(|d| kind(d) == "mig").count(), 28);
        assert!(slices.iter().all(|s| s.spec.node_name.as_deref() == Some("node-0003")));
    }

    #[test]
    fn claims_mix_mig_slices_where_the_fleet_has_them() {
        let class = |layout: Layout, i: usize| {
            layout.claim(i).spec.unwrap().devices.unwrap().requests.unwrap()[0]
                .exactly
                .as_ref()
                .unwrap()
                .device_class_name
                .clone()
        };
        let migs = |layout: Layout| (1..=100).filter(|&i| class(layout, i) == "mig.nvidia.com").count();
        assert_eq!(migs(Layout::WholeH100), 0);
        assert_eq!(migs(Layout::A100HalfMig), 30);
        assert_eq!(migs(Layout::PartitionableH100), 30);
    }
}
