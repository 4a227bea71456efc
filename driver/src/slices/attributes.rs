//! One published device as a `resource.k8s.io/v1` Device: NVIDIA's attribute
//! and capacity names (so claims written for NVIDIA's driver port unchanged)
//! plus ours (`nvlinkGroup`, `cliqueID`), and taints from health.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity, DeviceTaint};

use crate::inventory::{Fault, Gpu, Inventory, MigDevice, MigProfile, PublishedDevice};
use crate::names::{DriverName, InvalidName};
use dra_cel::quantity;

/// Attribute and capacity names. Bare names live in the driver's domain
/// (`device.attributes['gpu.nvidia.com'].productName` in CEL).
pub mod name {
    pub const TYPE: &str = "type";
    pub const UUID: &str = "uuid";
    pub const PARENT_UUID: &str = "parentUUID";
    pub const PROFILE: &str = "profile";
    pub const PRODUCT_NAME: &str = "productName";
    pub const BRAND: &str = "brand";
    pub const ARCHITECTURE: &str = "architecture";
    pub const CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
    pub const DRIVER_VERSION: &str = "driverVersion";
    pub const CUDA_DRIVER_VERSION: &str = "cudaDriverVersion";
    pub const NVLINK_GROUP: &str = "nvlinkGroup";
    pub const CLIQUE_ID: &str = "cliqueID";
    /// NVIDIA's: `HMM`, `ATS` or `None` (GPUs and MIG devices' parents).
    pub const ADDRESSING_MODE: &str = "addressingMode";
    /// Standard attributes defined by Kubernetes (`k8s.io/dynamic-resource-allocation/deviceattribute`).
    pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
    pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
    pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

    pub const MEMORY: &str = "memory";
    /// A share's limit on the GPU's streaming multiprocessors, in percent
    /// (published with `ConsumableCapacity` only; see `slices::shares`).
    pub const SM_PERCENT: &str = "smPercent";
    pub const MULTIPROCESSORS: &str = "multiprocessors";
    pub const COPY_ENGINES: &str = "copyEngines";
    pub const DECODERS: &str = "decoders";
    pub const ENCODERS: &str = "encoders";
    pub const JPEG_ENGINES: &str = "jpegEngines";
    pub const OFA_ENGINES: &str = "ofaEngines";
    /// Prefix of the per-memory-slice capacities of a MIG device.
    pub const MEMORY_SLICE_PREFIX: &str = "memorySlice";

    /// Values of `type`.
    pub const TYPE_GPU: &str = "gpu";
    pub const TYPE_MIG: &str = "mig";
    /// A whole GPU for VFIO passthrough (NVIDIA's `vfio` type).
    pub const TYPE_VFIO: &str = "vfio";
    /// Ours: the VFIO device's IOMMU group (`/dev/vfio/<group>`).
    pub const IOMMU_GROUP: &str = "iommuGroup";
}

/// Taint keys, in the driver's domain (`gpu.nvidia.com/xid`).
pub mod taint {
    pub const XID: &str = "xid";
    pub const GPU_LOST: &str = "gpu-lost";
    pub const NO_SCHEDULE: &str = "NoSchedule";
    pub const NO_EXECUTE: &str = "NoExecute";
    /// Informational (1.35+): tolerated by everything, blocks nothing.
    pub const NONE: &str = "None";

    /// Whether a taint with `effect` keeps new claims off the device.
    pub fn blocks(effect: &str) -> bool {
        effect == NO_SCHEDULE || effect == NO_EXECUTE
    }
}

/// The apiserver's limit on string attribute values.
const MAX_STRING_VALUE: usize = 64;

fn string(v: impl Into<String>) -> DeviceAttribute {
    let mut v = v.into();
    // Free text from NVML (product names) could exceed the apiserver's limit
    // and make the whole slice invalid; cut at a character boundary instead.
    if v.len() > MAX_STRING_VALUE {
        let mut end = MAX_STRING_VALUE;
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        v.truncate(end);
    }
    DeviceAttribute { string: Some(v), ..Default::default() }
}

fn int(v: impl Into<i64>) -> DeviceAttribute {
    DeviceAttribute { int: Some(v.into()), ..Default::default() }
}

fn version(v: &crate::version::Semver) -> DeviceAttribute {
    DeviceAttribute { version: Some(v.to_string()), ..Default::default() }
}

fn capacity(q: k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> DeviceCapacity {
    DeviceCapacity { value: q, request_policy: None }
}

/// Attributes shared by a GPU and its MIG devices.
fn gpu_common_attributes(inv: &Inventory, gpu: &Gpu, attrs: &mut BTreeMap<String, DeviceAttribute>) {
    // A GPU lost during discovery may lack these; publish none rather than "".
    for (key, value) in
        [(name::PRODUCT_NAME, &gpu.product_name), (name::BRAND, &gpu.brand), (name::ARCHITECTURE, &gpu.architecture)]
    {
        if !value.is_empty() {
            attrs.insert(key.into(), string(value));
        }
    }
    attrs.insert(name::CUDA_COMPUTE_CAPABILITY.into(), version(&gpu.cuda_compute_capability));
    attrs.insert(name::DRIVER_VERSION.into(), version(&inv.driver_version));
    attrs.insert(name::CUDA_DRIVER_VERSION.into(), version(&inv.cuda_driver_version));
    if let Some(bus_id) = gpu.pci_bus_id.and_then(|id| id.standard_attribute()) {
        attrs.insert(name::PCI_BUS_ID.into(), string(bus_id));
    }
    if let Some(root) = &gpu.pcie_root {
        attrs.insert(name::PCIE_ROOT.into(), string(root));
    }
    if let Some(numa) = gpu.numa_node {
        attrs.insert(name::NUMA_NODE.into(), int(numa));
    }
    if let Some(mode) = gpu.addressing_mode {
        attrs.insert(name::ADDRESSING_MODE.into(), string(mode.as_str()));
    }
}

/// `resource.kubernetes.io/numaNode` in upstream's list form
/// (`deviceattribute.ListAttribute`): the GPU's node first, then the nodes
/// at the same minimum distance on its socket. The inventory knows no SLIT
/// distances, so the list is the node alone, as upstream falls back to;
/// `matchAttribute` over it still co-places with devices whose lists hold
/// that node.
pub fn numa_node_as_list(device: &mut k8s_openapi::api::resource::v1::Device) {
    if let Some(a) = device.attributes.as_mut().and_then(|a| a.get_mut(name::NUMA_NODE))
        && let Some(node) = a.int.take()
    {
        a.ints = Some(vec![node]);
    }
}

fn gpu_device(inv: &Inventory, gpu: &Gpu) -> (BTreeMap<String, DeviceAttribute>, BTreeMap<String, DeviceCapacity>) {
    let mut attrs = BTreeMap::new();
    attrs.insert(name::TYPE.into(), string(name::TYPE_GPU));
    attrs.insert(name::UUID.into(), string(&gpu.uuid));
    gpu_common_attributes(inv, gpu, &mut attrs);
    if let Some(group) = gpu.nvlink_group {
        attrs.insert(name::NVLINK_GROUP.into(), int(group));
    }
    if let Some(clique) = gpu.clique {
        attrs.insert(name::CLIQUE_ID.into(), string(clique.to_string()));
    }
    let caps = BTreeMap::from([(name::MEMORY.to_string(), capacity(quantity::bytes(gpu.memory_bytes)))]);
    (attrs, caps)
}

/// A GPU for passthrough: the GPU's own attributes (KubeVirt finds the
/// device by `resource.kubernetes.io/pciBusID`) under `type: vfio`, and
/// its IOMMU group. No NVLink or clique: a VM sees the GPU, not its fabric.
fn vfio_device(inv: &Inventory, gpu: &Gpu) -> (BTreeMap<String, DeviceAttribute>, BTreeMap<String, DeviceCapacity>) {
    let mut attrs = BTreeMap::new();
    attrs.insert(name::TYPE.into(), string(name::TYPE_VFIO));
    attrs.insert(name::UUID.into(), string(&gpu.uuid));
    gpu_common_attributes(inv, gpu, &mut attrs);
    if let Some(group) = gpu.iommu_group {
        attrs.insert(name::IOMMU_GROUP.into(), int(group));
    }
    let caps = BTreeMap::from([(name::MEMORY.to_string(), capacity(quantity::bytes(gpu.memory_bytes)))]);
    (attrs, caps)
}

fn mig_device(
    inv: &Inventory,
    parent: &Gpu,
    mig: &MigDevice,
) -> (BTreeMap<String, DeviceAttribute>, BTreeMap<String, DeviceCapacity>) {
    let (mut attrs, mut caps) = mig_profile_device(inv, parent, &mig.profile);
    attrs.insert(name::UUID.into(), string(&mig.uuid));
    // Which memory slices the instance occupies, as NVIDIA's static MIG
    // devices publish them.
    for slice in mig.placement.slices() {
        caps.insert(format!("{}{slice}", name::MEMORY_SLICE_PREFIX), capacity(quantity::count(1)));
    }
    (attrs, caps)
}

/// What a MIG device of `profile` on `parent` publishes whether or not it
/// exists yet: a dynamic MIG device has no `uuid` before it is prepared,
/// and, as in NVIDIA's driver, says its placement only through the
/// counters it consumes (no `memorySlice<N>` capacities).
fn mig_profile_device(
    inv: &Inventory,
    parent: &Gpu,
    p: &MigProfile,
) -> (BTreeMap<String, DeviceAttribute>, BTreeMap<String, DeviceCapacity>) {
    let mut attrs = BTreeMap::new();
    attrs.insert(name::TYPE.into(), string(name::TYPE_MIG));
    attrs.insert(name::PARENT_UUID.into(), string(&parent.uuid));
    attrs.insert(name::PROFILE.into(), string(&p.name));
    gpu_common_attributes(inv, parent, &mut attrs);
    let caps = BTreeMap::from([
        (name::MULTIPROCESSORS.to_string(), capacity(quantity::count(p.multiprocessors.into()))),
        (name::COPY_ENGINES.to_string(), capacity(quantity::count(p.copy_engines.into()))),
        (name::DECODERS.to_string(), capacity(quantity::count(p.decoders.into()))),
        (name::ENCODERS.to_string(), capacity(quantity::count(p.encoders.into()))),
        (name::JPEG_ENGINES.to_string(), capacity(quantity::count(p.jpeg_engines.into()))),
        (name::OFA_ENGINES.to_string(), capacity(quantity::count(p.ofa_engines.into()))),
        (name::MEMORY.to_string(), capacity(quantity::bytes(p.memory_bytes))),
    ]);
    (attrs, caps)
}

/// XIDs NVIDIA attributes to the application, not the GPU (13 graphics
/// engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
/// 45 preemptive cleanup, 68 video processor exception, 109 context switch
/// timeout): a user's kernel faulted, the GPU is fine. NVIDIA's driver
/// gives them effect `None`.
pub const APPLICATION_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];

/// Which faults take a device out of service, and how it is said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintPolicy {
    /// XIDs that leave the device allocatable.
    pub ignored_xids: std::collections::BTreeSet<u32>,
    /// The server accepts effect `None` (1.35+): an ignored XID is still
    /// published, with that effect; on 1.34 it is not published at all.
    pub none_effect: bool,
}

impl Default for TaintPolicy {
    fn default() -> Self {
        TaintPolicy { ignored_xids: APPLICATION_XIDS.into_iter().collect(), none_effect: false }
    }
}

/// Taints for a device's faults: the most recent XID that is not ignored
/// as `<driver>/xid=<code>:NoSchedule`; else, where the server takes it,
/// the most recent ignored one as `<driver>/xid=<code>:None` (visible, not
/// blocking); a lost GPU as `<driver>/gpu-lost:NoExecute` (running
/// workloads cannot use a lost GPU either).
pub fn taints(driver: &DriverName, faults: &[Fault], policy: &TaintPolicy) -> Vec<DeviceTaint> {
    let mut out = Vec::new();
    let xids = || {
        faults.iter().rev().filter_map(|f| match f {
            Fault::Xid(code) => Some(*code),
            Fault::Lost => None,
        })
    };
    let blocking = xids().find(|x| !policy.ignored_xids.contains(x));
    let xid = match blocking {
        Some(code) => Some((code, taint::NO_SCHEDULE)),
        None if policy.none_effect => xids().next().map(|code| (code, taint::NONE)),
        None => None,
    };
    if let Some((code, effect)) = xid {
        out.push(DeviceTaint {
            key: format!("{driver}/{}", taint::XID),
            value: Some(code.to_string()),
            effect: effect.into(),
            time_added: None,
        });
    }
    if faults.contains(&Fault::Lost) {
        out.push(DeviceTaint {
            key: format!("{driver}/{}", taint::GPU_LOST),
            value: None,
            effect: taint::NO_EXECUTE.into(),
            time_added: None,
        });
    }
    out
}

/// The API object for one published device.
pub fn to_api_device(
    driver: &DriverName,
    inv: &Inventory,
    device: &PublishedDevice<'_>,
    policy: &TaintPolicy,
) -> Result<Device, InvalidName> {
    let (attributes, capacity) = match device {
        PublishedDevice::Gpu(gpu) => gpu_device(inv, gpu),
        PublishedDevice::Mig { parent, mig } => mig_device(inv, parent, mig),
        PublishedDevice::DynamicMig { parent, profile, .. } => mig_profile_device(inv, parent, &profile.profile),
        PublishedDevice::Vfio(gpu) => vfio_device(inv, gpu),
    };
    let taints = taints(driver, &device.faults(), policy);
    Ok(Device {
        name: device.name()?.to_string(),
        attributes: Some(attributes),
        capacity: Some(capacity),
        taints: (!taints.is_empty()).then_some(taints),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::test_support::{gpu, inventory, mig};
    use crate::inventory::{CliqueId, MigMode};

    fn attr<'a>(d: &'a Device, key: &str) -> &'a DeviceAttribute {
        d.attributes.as_ref().unwrap().get(key).unwrap_or_else(|| panic!("no attribute {key}"))
    }

    #[test]
    fn gpu_attributes_match_nvidia_and_add_topology() {
        let mut g = gpu(0);
        g.nvlink_group = Some(0);
        g.clique = Some(CliqueId { cluster_uuid: uuid::Uuid::from_u128(1), clique: 3 });
        let inv = inventory(vec![g]);
        let d =
            to_api_device(&DriverName::nvidia_default(), &inv, &inv.published_devices()[0], &TaintPolicy::default())
                .unwrap();
        assert_eq!(d.name, "gpu-0");
        assert_eq!(attr(&d, "type").string.as_deref(), Some("gpu"));
        assert_eq!(attr(&d, "productName").string.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(attr(&d, "cudaComputeCapability").version.as_deref(), Some("9.0.0"));
        assert_eq!(attr(&d, "driverVersion").version.as_deref(), Some("580.82.7"));
        assert_eq!(attr(&d, "cudaDriverVersion").version.as_deref(), Some("13.0.0"));
        assert_eq!(attr(&d, "resource.kubernetes.io/pciBusID").string.as_deref(), Some("0000:18:00.0"));
        assert_eq!(attr(&d, "resource.kubernetes.io/pcieRoot").string.as_deref(), Some("pci0000:17"));
        assert_eq!(attr(&d, "resource.kubernetes.io/numaNode").int, Some(0));
        assert_eq!(attr(&d, "nvlinkGroup").int, Some(0));
        assert_eq!(attr(&d, "cliqueID").string.as_deref(), Some("00000000-0000-0000-0000-000000000001.3"));
        assert_eq!(d.capacity.as_ref().unwrap()["memory"].value.0, "80Gi");
        assert!(d.taints.is_none());
    }

    #[test]
    fn mig_attributes_and_capacities() {
        let mut parent = gpu(2);
        parent.mig = MigMode::Enabled(vec![mig("1g.10gb", 19, 5, 1)]);
        let inv = inventory(vec![parent]);
        let d =
            to_api_device(&DriverName::nvidia_default(), &inv, &inv.published_devices()[0], &TaintPolicy::default())
                .unwrap();
        assert_eq!(d.name, "gpu-2-mig-1g10gb-19-5");
        assert_eq!(attr(&d, "type").string.as_deref(), Some("mig"));
        assert_eq!(attr(&d, "profile").string.as_deref(), Some("1g.10gb"));
        assert!(attr(&d, "parentUUID").string.as_deref().unwrap().starts_with("GPU-"));
        assert!(d.attributes.as_ref().unwrap().get("nvlinkGroup").is_none());
        let caps = d.capacity.as_ref().unwrap();
        assert_eq!(caps["memory"].value.0, "9984Mi");
        assert_eq!(caps["multiprocessors"].value.0, "16");
        assert_eq!(caps["memorySlice5"].value.0, "1");
        assert!(!caps.contains_key("memorySlice4"));
    }

    #[test]
    fn long_free_text_is_cut_to_the_api_limit() {
        let mut g = gpu(0);
        g.product_name = "é".repeat(40);
        let inv = inventory(vec![g]);
        let d =
            to_api_device(&DriverName::nvidia_default(), &inv, &inv.published_devices()[0], &TaintPolicy::default())
                .unwrap();
        assert_eq!(attr(&d, "productName").string.as_ref().unwrap().len(), 64);
    }

    #[test]
    fn unknown_facts_of_a_lost_gpu_are_left_out() {
        let mut g = gpu(0);
        g.product_name.clear();
        g.pci_bus_id = None;
        g.faults = vec![Fault::Lost];
        let inv = inventory(vec![g]);
        let d =
            to_api_device(&DriverName::nvidia_default(), &inv, &inv.published_devices()[0], &TaintPolicy::default())
                .unwrap();
        let attrs = d.attributes.as_ref().unwrap();
        assert!(!attrs.contains_key("productName") && !attrs.contains_key("resource.kubernetes.io/pciBusID"));
        assert_eq!(d.taints.as_ref().unwrap()[0].key, "gpu.nvidia.com/gpu-lost");
    }

    #[test]
    fn faults_become_taints() {
        let driver = DriverName::nvidia_default();
        let policy = TaintPolicy::default();
        assert!(taints(&driver, &[], &policy).is_empty());
        let t = taints(&driver, &[Fault::Xid(48), Fault::Xid(79), Fault::Lost], &policy);
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].key.as_str(), t[0].value.as_deref(), t[0].effect.as_str()),
            ("gpu.nvidia.com/xid", Some("79"), "NoSchedule")
        );
        assert_eq!((t[1].key.as_str(), t[1].effect.as_str()), ("gpu.nvidia.com/gpu-lost", "NoExecute"));
    }

    #[test]
    fn application_xids_do_not_block() {
        let driver = DriverName::nvidia_default();
        let on_134 = TaintPolicy::default();
        assert!(taints(&driver, &[Fault::Xid(43)], &on_134).is_empty(), "1.34: not published");
        let on_135 = TaintPolicy { none_effect: true, ..TaintPolicy::default() };
        let t = taints(&driver, &[Fault::Xid(43)], &on_135);
        assert_eq!((t[0].value.as_deref(), t[0].effect.as_str()), (Some("43"), "None"));
        // A blocking XID wins over a later application one.
        let t = taints(&driver, &[Fault::Xid(79), Fault::Xid(43)], &on_135);
        assert_eq!((t[0].value.as_deref(), t[0].effect.as_str()), (Some("79"), "NoSchedule"));
        assert_eq!(t.len(), 1);
        // --additional-xids-to-ignore.
        let mut more = TaintPolicy::default();
        more.ignored_xids.insert(79);
        assert!(taints(&driver, &[Fault::Xid(79)], &more).is_empty());
    }
}
