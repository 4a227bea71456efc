//! A fake inventory from a YAML file, for nodes without GPUs: tests, demos,
//! `simulate` and trying the driver on a laptop.
//!
//! ```yaml
//! driverVersion: "580.82.07"        # optional
//! cudaDriverVersion: "13.0"         # optional
//! gpus:
//!   - model: H100-80GB              # a key of the embedded model table
//!     count: 8
//!     nvlinkGroups: [[0, 1, 2, 3, 4, 5, 6, 7]]   # indices within this entry
//!     clique: {clusterUuid: "9b3e...", cliqueId: 1}
//!     mig:
//!       - gpus: [0]                 # which GPUs of this entry (default: all)
//!         instances: [3g.40gb, {profile: 1g.10gb, start: 6}]
//!       - gpus: [1, 2]              # MIG mode on, no instances: made by the
//!         dynamic: true             # driver at prepare (gate DynamicMIG)
//!     faults:
//!       - {gpu: 3, xid: 79}
//!       - {gpu: 0, migInstance: 1, xid: 94}
//!       - {gpu: 5, lost: true}
//! ```
//!
//! GPUs are numbered across entries in order; minor numbers equal that index.
//! UUIDs derive from the node name and index, so every node of a fleet gets
//! distinct, stable UUIDs; PCI addresses derive from the index, as identical
//! machines have identical PCI layouts.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::catalog::{Catalog, GpuModel};
use super::mig_layout::{self, RequestedInstance};
use super::model::MigCapabilities;
use super::model::{
    AddressingMode, CliqueId, DeviceMajors, Fault, Gpu, Inventory, MigCapMinors, MigDevice, MigMode, MigProfile,
};
use super::pci::PciBusId;
use crate::names::NodeName;
use crate::version::Semver;

/// Default driver version of a fake node (R580, the CUDA 13.0 branch).
pub const DEFAULT_DRIVER_VERSION: &str = "580.82.07";
/// Default CUDA driver version of a fake node.
pub const DEFAULT_CUDA_DRIVER_VERSION: &str = "13.0";
/// Default `/proc/devices` majors of a fake node.
pub const DEFAULT_UVM_MAJOR: u32 = 235;
pub const DEFAULT_CAPS_MAJOR: u32 = 236;

/// Namespace for fake UUIDs (v5), so they never collide with real ones.
const FAKE_UUID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6a1c_2f0e_8d4b_4f5a_9e3c_7b21_d0a4_c9e1);

/// A problem with a fake inventory file: where, what, and how to fix it.
/// Displays as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FakeInventoryError {
    pub file: PathBuf,
    /// Path of the offending field, e.g. `gpus[1].mig[0].instances[2]`.
    pub field: String,
    pub problem: String,
    pub fix: String,
}

impl fmt::Display for FakeInventoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file.display())?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{}; fix: {}", self.problem, self.fix)
    }
}

/// Reads a fake inventory file for one node.
#[derive(Debug, Clone)]
pub struct FakeSource {
    path: PathBuf,
    node: NodeName,
}

impl FakeSource {
    pub fn new(path: impl Into<PathBuf>, node: NodeName) -> Self {
        Self { path: path.into(), node }
    }

    /// Reads and validates the file.
    pub(super) fn read(&self) -> Result<Inventory, FakeInventoryError> {
        load(&self.path, &self.node)
    }
}

/// Reads and validates `path` as the inventory of `node`.
pub fn load(path: &Path, node: &NodeName) -> Result<Inventory, FakeInventoryError> {
    FakeInventory::load(path)?.for_node(node)
}

/// The largest fake inventory file read: a node of many GPUs with every
/// MIG layout spelled out is a few KiB; a ConfigMap holds at most 1 MiB.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// A fake inventory file read and parsed once, for any number of nodes
/// (`simulate` fleets list one file for many nodes).
#[derive(Debug)]
pub struct FakeInventory {
    file: std::path::PathBuf,
    parsed: FakeInventoryFile,
}

impl FakeInventory {
    pub fn load(path: &Path) -> Result<Self, FakeInventoryError> {
        let at = |(field, problem, fix): Located| FakeInventoryError { file: path.to_path_buf(), field, problem, fix };
        // A ConfigMap's file is a symlink (the chart mounts one): followed,
        // but only to a regular file of bounded size.
        let text = crate::bounded_file::read_to_string(path, MAX_FILE_BYTES, crate::bounded_file::Links::Follow)
            .map_err(|e| {
                at((
                    String::new(),
                    format!("cannot read the file: {}", e.problem),
                    "pass the path of an existing fake inventory YAML file (see examples/inventories/)".to_string(),
                ))
            })?;
        Ok(FakeInventory { file: path.to_path_buf(), parsed: parse_file(&text).map_err(at)? })
    }

    /// The inventory of `node` (UUIDs and PCI addresses derive from its name).
    pub fn for_node(&self, node: &NodeName) -> Result<Inventory, FakeInventoryError> {
        build(&self.parsed, node).map_err(|(field, problem, fix)| FakeInventoryError {
            file: self.file.clone(),
            field,
            problem,
            fix,
        })
    }
}

/// (field, problem, fix): a located error before the file name is attached.
type Located = (String, String, String);

/// Parses inventory YAML for `node`.
pub fn parse(text: &str, node: &NodeName) -> Result<Inventory, Located> {
    build(&parse_file(text)?, node)
}

fn parse_file(text: &str) -> Result<FakeInventoryFile, Located> {
    let text = crate::safe_yaml::prepare(text).map_err(|e| {
        ("document".to_string(), e.to_string(), "write the inventory as in examples/inventories/".to_string())
    })?;
    serde_yaml_ng::from_str(&text).map_err(yaml_error)
}

fn yaml_error(e: serde_yaml_ng::Error) -> Located {
    let msg = e.to_string().replace('\n', " ");
    // serde_yaml reports the field path as a prefix ("gpus[0]: unknown field ...").
    let (field, problem) = match msg.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') && !path.is_empty() => (path.to_string(), rest.to_string()),
        _ => (String::new(), msg),
    };
    let fix = if problem.contains("unknown field") {
        "remove or correct that field (fields: driverVersion, cudaDriverVersion, deviceMajors, gpus; per GPU entry: model, count, numaNode, nvlinkGroups, clique, addressingMode, mig (gpus, instances, dynamic), faults)"
    } else {
        "correct the YAML there; examples/inventories/ has files in the expected format"
    };
    (field, format!("malformed inventory: {problem}"), fix.to_string())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FakeInventoryFile {
    driver_version: Option<String>,
    cuda_driver_version: Option<String>,
    #[serde(default)]
    device_majors: Option<FakeMajors>,
    gpus: Vec<FakeGpuEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FakeMajors {
    nvidia_uvm: Option<u32>,
    nvidia_caps: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FakeGpuEntry {
    model: String,
    #[serde(default = "one")]
    count: u32,
    numa_node: Option<u32>,
    #[serde(default)]
    nvlink_groups: Vec<Vec<u32>>,
    clique: Option<FakeClique>,
    /// `HMM`, `ATS` or `None`, as NVML reports it (absent: not reported).
    addressing_mode: Option<AddressingMode>,
    #[serde(default)]
    mig: Vec<FakeMigLayout>,
    #[serde(default)]
    faults: Vec<FakeFault>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FakeClique {
    cluster_uuid: String,
    clique_id: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FakeMigLayout {
    gpus: Option<Vec<u32>>,
    #[serde(default)]
    instances: Vec<FakeMigInstance>,
    /// MIG mode on with no instances, for dynamic MIG ([`super::dynamic_mig`]).
    #[serde(default)]
    dynamic: bool,
}

/// `1g.10gb` or `{profile: 1g.10gb, start: 6}`, told apart by shape (an
/// untagged enum would only say that neither matched).
#[derive(Debug)]
enum FakeMigInstance {
    Profile(String),
    Placed(PlacedInstanceSpec),
}

impl<'de> Deserialize<'de> for FakeMigInstance {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Shape;
        impl<'de> serde::de::Visitor<'de> for Shape {
            type Value = FakeMigInstance;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a MIG profile such as 1g.10gb, or {profile: 1g.10gb, start: 6}")
            }
            fn visit_str<E: serde::de::Error>(self, profile: &str) -> Result<FakeMigInstance, E> {
                Ok(FakeMigInstance::Profile(profile.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<FakeMigInstance, A::Error> {
                PlacedInstanceSpec::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(FakeMigInstance::Placed)
            }
        }
        deserializer.deserialize_any(Shape)
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PlacedInstanceSpec {
    profile: String,
    start: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FakeFault {
    gpu: u32,
    mig_instance: Option<u32>,
    xid: Option<u32>,
    #[serde(default)]
    lost: bool,
}

/// Most GPUs one node may hold: minor numbers 0..=247 are regular GPUs.
const MAX_GPUS: u32 = 248;

fn build(file: &FakeInventoryFile, node: &NodeName) -> Result<Inventory, Located> {
    let catalog = Catalog::embedded().map_err(|e| (String::new(), e.to_string(), "rebuild the binary".to_string()))?;
    let version = |field: &str, raw: Option<&str>, default: &str| {
        let raw = raw.unwrap_or(default);
        Semver::normalize(raw)
            .map_err(|e| (field.to_string(), e.to_string(), format!("write a version such as \"{default}\"")))
    };
    let driver_version = version("driverVersion", file.driver_version.as_deref(), DEFAULT_DRIVER_VERSION)?;
    let cuda_driver_version =
        version("cudaDriverVersion", file.cuda_driver_version.as_deref(), DEFAULT_CUDA_DRIVER_VERSION)?;
    let device_majors = DeviceMajors {
        nvidia_uvm: Some(file.device_majors.as_ref().and_then(|m| m.nvidia_uvm).unwrap_or(DEFAULT_UVM_MAJOR)),
        nvidia_caps: Some(file.device_majors.as_ref().and_then(|m| m.nvidia_caps).unwrap_or(DEFAULT_CAPS_MAJOR)),
    };
    if file.gpus.is_empty() {
        return Err((
            "gpus".into(),
            "lists no GPUs".into(),
            "add at least one entry such as {model: H100-80GB, count: 1}".into(),
        ));
    }
    // Summed in u64: hostile counts such as 4294967295 + 2 must not wrap
    // around to a small total (in u32 they built billions of GPUs).
    let total: u64 = file.gpus.iter().map(|e| u64::from(e.count)).sum();
    if total > u64::from(MAX_GPUS) {
        return Err((
            "gpus".into(),
            format!("describes {total} GPUs but a node has at most {MAX_GPUS} (minor numbers 0-247)"),
            "lower the counts".into(),
        ));
    }
    let total = u32::try_from(total).unwrap_or(MAX_GPUS);

    let mut gpus = Vec::new();
    for (e, entry) in file.gpus.iter().enumerate() {
        let at = |field: &str| format!("gpus[{e}].{field}");
        let model = catalog.model(&entry.model).ok_or_else(|| {
            (
                at("model"),
                format!("unknown GPU model {:?}", entry.model),
                format!("use one of: {}", catalog.model_keys().join(", ")),
            )
        })?;
        if entry.count == 0 {
            return Err((
                at("count"),
                "must be at least 1".into(),
                "set count to the number of GPUs of this model".into(),
            ));
        }
        let groups = entry_nvlink_groups(entry, &at)?;
        let clique = entry
            .clique
            .as_ref()
            .map(|c| {
                let cluster_uuid = uuid::Uuid::parse_str(&c.cluster_uuid).map_err(|err| {
                    (
                        at("clique.clusterUuid"),
                        format!("{:?} is not a UUID: {err}", c.cluster_uuid),
                        "write a UUID such as 9b3e4c1a-0d2f-4e5b-8a6c-7d9e0f1a2b3c".into(),
                    )
                })?;
                Ok::<_, Located>(CliqueId { cluster_uuid, clique: c.clique_id })
            })
            .transpose()?;
        let mig_by_gpu = entry_mig_layouts(entry, model, &at)?;

        let first_index = gpus.len() as u32;
        for local in 0..entry.count {
            let index = first_index + local;
            let mut gpu = fake_gpu(node, index, total, model, entry.numa_node);
            gpu.nvlink_group = groups.get(&local).map(|&g| first_index + g);
            gpu.clique = clique;
            gpu.addressing_mode = entry.addressing_mode;
            if let Some(instances) = mig_by_gpu.get(&local) {
                gpu.mig = MigMode::Enabled(fake_mig_devices(node, &gpu, instances));
                gpu.mig_capabilities = MigCapabilities::from_model(model);
            }
            gpus.push(gpu);
        }
        apply_faults(entry, &mut gpus[first_index as usize..], &at)?;
    }
    Ok(Inventory { driver_version, cuda_driver_version, device_majors, gpus })
}

/// NVLink groups of an entry, as local index -> lowest local index in group.
fn entry_nvlink_groups(entry: &FakeGpuEntry, at: &dyn Fn(&str) -> String) -> Result<BTreeMap<u32, u32>, Located> {
    let mut out = BTreeMap::new();
    for (g, group) in entry.nvlink_groups.iter().enumerate() {
        let field = at(&format!("nvlinkGroups[{g}]"));
        if group.len() < 2 {
            return Err((
                field,
                "an NVLink group needs at least two GPUs".into(),
                "list two or more GPU indices or drop the group".into(),
            ));
        }
        let lowest = *group.iter().min().unwrap_or(&0);
        for &i in group {
            if i >= entry.count {
                return Err((
                    field,
                    format!("GPU index {i} is beyond this entry's count of {}", entry.count),
                    format!("use indices 0 to {}", entry.count - 1),
                ));
            }
            if out.insert(i, lowest).is_some() {
                return Err((
                    field,
                    format!("GPU {i} is in more than one NVLink group"),
                    "merge the groups that share it".into(),
                ));
            }
        }
    }
    Ok(out)
}

/// MIG layouts of an entry by local GPU index, validated against the model.
fn entry_mig_layouts<'m>(
    entry: &FakeGpuEntry,
    model: &'m GpuModel,
    at: &dyn Fn(&str) -> String,
) -> Result<BTreeMap<u32, Vec<mig_layout::PlacedInstance<'m>>>, Located> {
    let mut requested: BTreeMap<u32, (usize, Vec<RequestedInstance>)> = BTreeMap::new();
    for (l, layout) in entry.mig.iter().enumerate() {
        if model.mig_profiles.is_empty() {
            return Err((
                at(&format!("mig[{l}]")),
                format!("{} does not support MIG", model.product_name),
                "remove the mig section for this model".into(),
            ));
        }
        if layout.dynamic && !layout.instances.is_empty() {
            return Err((
                at(&format!("mig[{l}].instances")),
                "a dynamic layout has no instances: the driver makes them when claims are prepared".into(),
                "drop instances, or drop dynamic: true to cut these instances once".into(),
            ));
        }
        let targets: Vec<u32> = layout.gpus.clone().unwrap_or_else(|| (0..entry.count).collect());
        for &g in &targets {
            if g >= entry.count {
                return Err((
                    at(&format!("mig[{l}].gpus")),
                    format!("GPU index {g} is beyond this entry's count of {}", entry.count),
                    format!("use indices 0 to {}", entry.count - 1),
                ));
            }
            let instances = layout
                .instances
                .iter()
                .map(|inst| match inst {
                    FakeMigInstance::Profile(p) => RequestedInstance { profile: p.clone(), start: None },
                    FakeMigInstance::Placed(p) => RequestedInstance { profile: p.profile.clone(), start: p.start },
                })
                .collect();
            if requested.insert(g, (l, instances)).is_some() {
                return Err((
                    at(&format!("mig[{l}].gpus")),
                    format!("GPU {g} already has a MIG layout"),
                    "give each GPU at most one layout".into(),
                ));
            }
        }
    }
    let mut out = BTreeMap::new();
    for (g, (l, instances)) in requested {
        let placed = mig_layout::place(model, &instances).map_err(|err| {
            (
                at(&format!("mig[{l}].instances[{}]", err.instance)),
                format!("GPU {g} ({}), MIG profile {}: {}", entry.model, err.profile, err.problem),
                err.fix,
            )
        })?;
        out.insert(g, placed);
    }
    Ok(out)
}

fn apply_faults(entry: &FakeGpuEntry, gpus: &mut [Gpu], at: &dyn Fn(&str) -> String) -> Result<(), Located> {
    for (f, fault) in entry.faults.iter().enumerate() {
        let field = at(&format!("faults[{f}]"));
        let Some(gpu) = gpus.get_mut(fault.gpu as usize) else {
            return Err((
                field,
                format!("GPU index {} is beyond this entry's count of {}", fault.gpu, entry.count),
                format!("use indices 0 to {}", entry.count - 1),
            ));
        };
        let kind = match (fault.xid, fault.lost) {
            (Some(xid), false) => Fault::Xid(xid),
            (None, true) => Fault::Lost,
            _ => {
                return Err((
                    field,
                    "a fault is either an xid or lost: true".into(),
                    "set exactly one of xid and lost".into(),
                ));
            }
        };
        match fault.mig_instance {
            None => gpu.faults.push(kind),
            Some(i) => {
                let MigMode::Enabled(migs) = &mut gpu.mig else {
                    return Err((
                        field,
                        format!("GPU {} has no MIG instances", fault.gpu),
                        "drop migInstance or give the GPU a MIG layout".into(),
                    ));
                };
                let Some(mig) = migs.get_mut(i as usize) else {
                    return Err((
                        field,
                        format!("GPU {} has {} MIG instance(s), not {}", fault.gpu, migs.len(), u64::from(i) + 1),
                        "use an index into that GPU's instances list".into(),
                    ));
                };
                mig.faults.push(kind);
            }
        }
    }
    Ok(())
}

fn fake_uuid(node: &NodeName, what: &str) -> uuid::Uuid {
    uuid::Uuid::new_v5(&FAKE_UUID_NAMESPACE, format!("{node}/{what}").as_bytes())
}

fn fake_gpu(node: &NodeName, index: u32, total: u32, model: &GpuModel, numa: Option<u32>) -> Gpu {
    // Buses 0x18, 0x28, ... per domain; two GPUs per PCIe root, like a
    // dual-GPU PCIe switch; the first half on NUMA node 0, the rest on 1.
    let per_domain = 14;
    let domain = index / per_domain;
    let slot = index % per_domain;
    let bus = (0x18 + 0x10 * slot) as u8;
    let root_bus = 0x17 + 0x20 * (slot / 2);
    let (cc_major, cc_minor) = model.cuda_compute_capability.split_once('.').unwrap_or(("0", "0"));
    let uuid = format!("GPU-{}", fake_uuid(node, &format!("gpu/{index}")));
    Gpu {
        product_name: model.product_name.clone(),
        brand: "Nvidia".to_string(),
        architecture: model.architecture_name(),
        cuda_compute_capability: Semver::from_major_minor(cc_major.parse().unwrap_or(0), cc_minor.parse().unwrap_or(0)),
        pci_bus_id: Some(PciBusId { domain, bus, device: 0, function: 0 }),
        pcie_root: Some(format!("pci{domain:04x}:{root_bus:02x}")),
        // One group per GPU, as on servers with ACS (fake nodes have an IOMMU).
        iommu_group: Some(0x20 + index),
        numa_node: Some(numa.unwrap_or(if total >= 2 && index >= total / 2 { 1 } else { 0 })),
        memory_bytes: model.memory_mib << 20,
        ..Gpu::new(index, index, uuid)
    }
}

/// MIG devices for placed instances. GPU instance ids count from 1 in layout
/// order with one compute instance (id 0) each; cap minors follow the
/// driver's `/proc/driver/nvidia-caps/mig-minors` numbering.
fn fake_mig_devices(node: &NodeName, gpu: &Gpu, placed: &[mig_layout::PlacedInstance]) -> Vec<MigDevice> {
    placed
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let gi = i as u32 + 1;
            let ci = 0;
            let gi_minor = 3 + 135 * gpu.minor + 9 * gi;
            MigDevice {
                uuid: format!("MIG-{}", fake_uuid(node, &format!("gpu/{}/gi/{gi}/ci/{ci}", gpu.index))),
                profile: MigProfile {
                    name: p.profile.name.clone(),
                    gi_profile_id: p.profile.gi_profile_id,
                    multiprocessors: p.profile.multiprocessors,
                    copy_engines: p.profile.copy_engines,
                    decoders: p.profile.decoders,
                    encoders: p.profile.encoders,
                    jpeg_engines: p.profile.jpeg_engines,
                    ofa_engines: p.profile.ofa_engines,
                    memory_bytes: p.profile.memory_mib << 20,
                },
                placement: p.placement,
                gpu_instance_id: gi,
                compute_instance_id: ci,
                caps: Some(MigCapMinors { gpu_instance: gi_minor, compute_instance: gi_minor + 1 + ci }),
                faults: Vec::new(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn node() -> NodeName {
        NodeName::new("node-a").unwrap()
    }

    fn ok(yaml: &str) -> Inventory {
        parse(yaml, &node()).unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn err(yaml: &str) -> Located {
        parse(yaml, &node()).unwrap_err()
    }

    #[test]
    fn dgx_like_node() {
        let inv = ok("gpus: [{model: H100-80GB, count: 8, nvlinkGroups: [[0,1,2,3,4,5,6,7]]}]");
        assert_eq!(inv.gpus.len(), 8);
        assert_eq!(inv.driver_version.as_str(), "580.82.7");
        assert_eq!(inv.cuda_driver_version.as_str(), "13.0.0");
        let g = &inv.gpus[5];
        assert_eq!((g.index, g.minor), (5, 5));
        assert_eq!(g.product_name, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.architecture, "Hopper");
        assert_eq!(g.cuda_compute_capability.as_str(), "9.0.0");
        assert_eq!(g.memory_bytes, 80 << 30);
        assert_eq!(g.nvlink_group, Some(0));
        assert_eq!(g.numa_node, Some(1));
        assert_eq!(inv.gpus[0].numa_node, Some(0));
        assert!(g.uuid.starts_with("GPU-"));
        let ids: BTreeSet<_> = inv.gpus.iter().map(|g| g.pci_bus_id).collect();
        assert_eq!(ids.len(), 8, "PCI ids are distinct");
    }

    #[test]
    fn identity_is_deterministic_per_node() {
        let yaml = "gpus: [{model: A30-24GB, count: 2}]";
        let a = ok(yaml);
        assert_eq!(a, ok(yaml));
        let b = parse(yaml, &NodeName::new("node-b").unwrap()).unwrap();
        assert_ne!(a.gpus[0].uuid, b.gpus[0].uuid, "UUIDs differ across nodes");
        assert_eq!(a.gpus[0].pci_bus_id, b.gpus[0].pci_bus_id, "PCI layout is per machine type");
    }

    #[test]
    fn entries_number_gpus_in_order_and_groups_are_per_entry() {
        let inv = ok(
            "gpus: [{model: A30-24GB, count: 2, nvlinkGroups: [[0,1]]}, {model: A30-24GB, count: 2, nvlinkGroups: [[0,1]]}]",
        );
        let groups: Vec<_> = inv.gpus.iter().map(|g| g.nvlink_group).collect();
        assert_eq!(groups, [Some(0), Some(0), Some(2), Some(2)]);
    }

    #[test]
    fn mig_layouts_become_devices() {
        let inv = ok(
            "gpus: [{model: A100-SXM4-80GB, count: 2, mig: [{gpus: [1], instances: [3g.40gb, 2g.20gb, {profile: 1g.10gb, start: 6}]}]}]",
        );
        assert_eq!(inv.gpus[0].mig, MigMode::Disabled);
        let MigMode::Enabled(migs) = &inv.gpus[1].mig else { panic!("gpu 1 is partitioned") };
        let summary: Vec<_> =
            migs.iter().map(|m| (m.profile.name.as_str(), m.placement.start, m.gpu_instance_id)).collect();
        assert_eq!(summary, [("3g.40gb", 0, 1), ("2g.20gb", 4, 2), ("1g.10gb", 6, 3)]);
        assert_eq!(migs[0].profile.memory_bytes, 40192 << 20);
        assert_eq!(migs[0].caps, Some(MigCapMinors { gpu_instance: 3 + 135 + 9, compute_instance: 3 + 135 + 10 }));
        assert!(migs[0].uuid.starts_with("MIG-"));
    }

    #[test]
    fn dynamic_layouts_are_mig_gpus_without_instances_and_with_the_profile_table() {
        let inv = ok("gpus: [{model: A100-SXM4-40GB, count: 3, mig: [{gpus: [1, 2], dynamic: true}]}]");
        assert_eq!(inv.gpus[0].mig, MigMode::Disabled);
        assert_eq!(inv.gpus[0].mig_capabilities, None);
        assert_eq!(inv.gpus[1].mig, MigMode::Enabled(vec![]), "dynamic once selected (gate DynamicMIG)");
        let caps = inv.gpus[2].mig_capabilities.as_ref().expect("profile table");
        assert_eq!(caps.devices().count(), 25);
        let (field, problem, _) = err("gpus: [{model: H100-80GB, mig: [{dynamic: true, instances: [1g.10gb]}]}]");
        assert_eq!(field, "gpus[0].mig[0].instances");
        assert!(problem.contains("a dynamic layout has no instances"), "{problem}");
        let (field, problem, _) = err("gpus: [{model: L4-24GB, mig: [{dynamic: true}]}]");
        assert_eq!(field, "gpus[0].mig[0]");
        assert!(problem.contains("does not support MIG"), "{problem}");
    }

    #[test]
    fn clique_and_faults() {
        let inv = ok("gpus: [{model: B200-180GB, count: 4, clique: {clusterUuid: 9b3e4c1a-0d2f-4e5b-8a6c-7d9e0f1a2b3c, cliqueId: 7},
                      mig: [{gpus: [0], instances: [1g.23gb, 1g.23gb]}],
                      faults: [{gpu: 2, xid: 79}, {gpu: 3, lost: true}, {gpu: 0, migInstance: 1, xid: 94}]}]");
        assert_eq!(inv.gpus[1].clique.unwrap().to_string(), "9b3e4c1a-0d2f-4e5b-8a6c-7d9e0f1a2b3c.7");
        assert_eq!(inv.gpus[2].faults, [Fault::Xid(79)]);
        assert_eq!(inv.gpus[3].faults, [Fault::Lost]);
        let MigMode::Enabled(migs) = &inv.gpus[0].mig else { panic!() };
        assert_eq!(migs[1].faults, [Fault::Xid(94)]);
    }

    #[test]
    fn unknown_model_lists_the_choices() {
        let (field, problem, fix) = err("gpus: [{model: H100, count: 1}]");
        assert_eq!(field, "gpus[0].model");
        assert!(problem.contains("unknown GPU model \"H100\""), "{problem}");
        assert!(fix.contains("H100-80GB") && fix.contains("A30-24GB"), "{fix}");
    }

    #[test]
    fn impossible_mig_layout_names_gpu_and_profile() {
        let (field, problem, _) = err("gpus: [{model: H100-80GB, count: 2, mig: [{instances: [4g.40gb, 4g.40gb]}]}]");
        assert_eq!(field, "gpus[0].mig[0].instances[1]");
        assert!(problem.contains("GPU 0 (H100-80GB), MIG profile 4g.40gb: at most 1 instance(s)"), "{problem}");
    }

    #[test]
    fn malformed_yaml_and_unknown_fields_are_located() {
        let (field, problem, fix) = err("gpus: [{modle: H100-80GB}]");
        assert_eq!(field, "gpus[0]");
        assert!(problem.contains("unknown field `modle`"), "{problem}");
        assert!(fix.contains("model"), "{fix}");
        let (field, problem, _) = err("gpus: [{model: H100-80GB, mig: [{instances: [3]}]}]");
        assert_eq!(field, "gpus[0].mig[0].instances[0]");
        assert!(
            problem.starts_with(
                "malformed inventory: invalid type: integer `3`, expected a MIG profile such as 1g.10gb, or {profile: 1g.10gb, start: 6}"
            ),
            "{problem}"
        );
        let (field, problem, _) = err("gpus: [{model: H100-80GB, mig: [{instances: [{profile: 1g.10gb, strat: 1}]}]}]");
        assert_eq!(field, "gpus[0].mig[0].instances[0]");
        assert!(
            problem.starts_with("malformed inventory: unknown field `strat`, expected `profile` or `start`"),
            "{problem}"
        );
        let (_, problem, _) = err("gpus: [{model: H100-80GB, count: [}");
        assert!(problem.contains("malformed inventory"), "{problem}");
        let (field, _, _) = err("gpus: [{model: H100-80GB, count: -1}]");
        assert_eq!(field, "gpus[0].count");
        // 4294967295 + 2 wrapped to 1 in u32 and built billions of GPUs.
        let (field, problem, _) = err("gpus: [{model: H100-80GB, count: 4294967295}, {model: H100-80GB, count: 2}]");
        assert_eq!(field, "gpus");
        assert!(problem.contains("describes 4294967297 GPUs but a node has at most 248"), "{problem}");
        let (field, problem, _) = err("gpus: [{model: H100-80GB, count: 200}, {model: H100-80GB, count: 200}]");
        assert_eq!(field, "gpus");
        assert!(problem.contains("describes 400 GPUs"), "{problem}");
        let (field, problem, _) = err(
            "gpus: [{model: A100-SXM4-80GB, count: 1, mig: [{instances: [7g.80gb]}], faults: [{gpu: 0, migInstance: 4294967295, xid: 94}]}]",
        );
        assert_eq!(field, "gpus[0].faults[0]");
        assert!(problem.contains("not 4294967296"), "{problem}");
    }

    #[test]
    fn bad_references_are_rejected() {
        for (yaml, field) in [
            ("gpus: [{model: H100-80GB, count: 2, nvlinkGroups: [[0, 2]]}]", "gpus[0].nvlinkGroups[0]"),
            ("gpus: [{model: H100-80GB, count: 2, nvlinkGroups: [[0]]}]", "gpus[0].nvlinkGroups[0]"),
            ("gpus: [{model: H100-80GB, count: 3, nvlinkGroups: [[0, 1], [1, 2]]}]", "gpus[0].nvlinkGroups[1]"),
            ("gpus: [{model: H100-80GB, faults: [{gpu: 1, xid: 79}]}]", "gpus[0].faults[0]"),
            ("gpus: [{model: H100-80GB, faults: [{gpu: 0}]}]", "gpus[0].faults[0]"),
            ("gpus: [{model: H100-80GB, faults: [{gpu: 0, migInstance: 0, xid: 1}]}]", "gpus[0].faults[0]"),
            ("gpus: [{model: H100-80GB, mig: [{gpus: [3], instances: []}]}]", "gpus[0].mig[0].gpus"),
            ("gpus: [{model: H100-80GB, mig: [{instances: []}, {instances: []}]}]", "gpus[0].mig[1].gpus"),
            ("gpus: [{model: H100-80GB, count: 0}]", "gpus[0].count"),
            ("gpus: [{model: H100-80GB, count: 300}]", "gpus"),
            ("gpus: []", "gpus"),
            ("driverVersion: abc\ngpus: [{model: H100-80GB}]", "driverVersion"),
            ("gpus: [{model: H100-80GB, clique: {clusterUuid: nope, cliqueId: 1}}]", "gpus[0].clique.clusterUuid"),
            ("gpus: [{model: GH200-96GB, addressingMode: HMMM}]", "gpus[0].addressingMode"),
        ] {
            let (f, problem, fix) = err(yaml);
            assert_eq!(f, field, "{yaml}: {problem}");
            assert!(!fix.is_empty());
        }
    }

    #[test]
    fn load_reports_the_file() {
        let e = load(Path::new("/nonexistent/inv.yaml"), &node()).unwrap_err();
        let line = e.to_string();
        assert!(line.starts_with("/nonexistent/inv.yaml: cannot read the file"), "{line}");
        assert!(!line.contains('\n'));
    }

    /// A FIFO or a device is refused at once (no hang, no unbounded read);
    /// a symlink (a ConfigMap's file) to a regular file is followed.
    #[test]
    fn only_a_regular_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.yaml");
        let mode = rustix::fs::Mode::from_raw_mode(0o600);
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, mode, 0).unwrap();
        for (path, found) in [(fifo.as_path(), "FIFO"), (Path::new("/dev/zero"), "character device")] {
            let line = load(path, &node()).unwrap_err().to_string();
            assert!(line.contains(&format!("cannot read the file: is a {found}")), "{line}");
        }
        let file = dir.path().join("inv.yaml");
        std::fs::write(&file, "gpus: [{model: H100-80GB}]").unwrap();
        std::os::unix::fs::symlink(&file, dir.path().join("link.yaml")).unwrap();
        assert!(load(&dir.path().join("link.yaml"), &node()).is_ok());
    }

    #[test]
    fn addressing_mode_reaches_gpus_and_their_mig_devices() {
        let inv =
            ok("gpus: [{model: GH200-96GB, count: 2, addressingMode: ATS, mig: [{gpus: [1], instances: [7g.96gb]}]}]");
        assert!(inv.gpus.iter().all(|g| g.addressing_mode == Some(super::super::AddressingMode::Ats)));
        let none = ok("gpus: [{model: H100-80GB}]");
        assert_eq!(none.gpus[0].addressing_mode, None, "not reported unless given");
    }
}
