//! The node's GPUs as plain data, and where that data comes from.
//!
//! Two sources fill the same model: NVML on a GPU node ([`nvml`]) and a YAML
//! file for tests, demos and `simulate` ([`fake`]). Everything downstream
//! (slices, CDI, health) reads only this model.

pub mod catalog;
pub mod dynamic_mig;
pub mod fake;
pub mod mig_layout;
pub mod nvlink;
pub mod nvml;
pub mod pci;

use std::fmt;

use serde::Serialize;

use crate::names::{DeviceName, InvalidName};
use crate::version::Semver;
pub use pci::PciBusId;

/// Everything the driver knows about one node's GPUs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// Kernel driver version, e.g. `580.82.7`.
    pub driver_version: Semver,
    /// Highest CUDA version the driver supports, e.g. `13.0.0`.
    pub cuda_driver_version: Semver,
    /// Majors of the character devices whose major the kernel assigns at load.
    pub device_majors: DeviceMajors,
    /// GPUs ordered by minor number.
    pub gpus: Vec<Gpu>,
}

/// Dynamic character-device majors from `/proc/devices`. `None` means the
/// kernel module is not loaded (nvidia-uvm loads lazily on some hosts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceMajors {
    pub nvidia_uvm: Option<u32>,
    pub nvidia_caps: Option<u32>,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// NVML index: enumeration order, not stable across reboots.
    pub index: u32,
    /// Minor number: `/dev/nvidia<minor>` and our device name `gpu-<minor>`.
    pub minor: u32,
    /// `GPU-<uuid>`, stable for the board's life.
    pub uuid: String,
    pub product_name: String,
    pub brand: String,
    /// NVIDIA's spelling: `Ampere`, `Hopper`, `Blackwell`, ...
    pub architecture: String,
    pub cuda_compute_capability: Semver,
    /// `None` only for a GPU lost before its PCI address could be read.
    pub pci_bus_id: Option<PciBusId>,
    /// Root complex of the GPU's PCIe hierarchy, e.g. `pci0000:64`.
    pub pcie_root: Option<String>,
    /// The IOMMU group the kernel put the GPU in (`<sys>/bus/pci/devices/
    /// <bdf>/iommu_group`); `None` when the IOMMU is off or not read. A GPU
    /// with one can be passed through with VFIO ([`PublishedDevice::Vfio`]).
    pub iommu_group: Option<u32>,
    pub numa_node: Option<u32>,
    pub memory_bytes: u64,
    pub mig: MigMode,
    /// The MIG profiles and placements the GPU supports, read for GPUs in
    /// MIG mode (dynamic MIG publishes them); `None` otherwise.
    pub mig_capabilities: Option<dynamic_mig::MigCapabilities>,
    /// GPUs that reach each other over NVLink share a group; the value is the
    /// lowest minor number in the group. `None` without active NVLink peers.
    pub nvlink_group: Option<u32>,
    /// NVLink fabric clique (multi-node NVLink, e.g. GB200 NVL72).
    pub clique: Option<CliqueId>,
    /// How the GPU addresses system memory, where NVML says (R570+).
    pub addressing_mode: Option<AddressingMode>,
    pub faults: Vec<Fault>,
}

/// How a GPU reaches system memory: NVIDIA's `addressingMode` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum AddressingMode {
    /// Heterogeneous Memory Management (system memory through page faults).
    #[serde(rename = "HMM")]
    Hmm,
    /// Address Translation Services (coherent CPU-GPU systems: Grace Hopper).
    #[serde(rename = "ATS")]
    Ats,
    None,
}

impl AddressingMode {
    /// As NVIDIA publishes it.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressingMode::Hmm => "HMM",
            AddressingMode::Ats => "ATS",
            AddressingMode::None => "None",
        }
    }

    /// From `nvmlDeviceAddressingModeType_t` (0 none, 1 HMM, 2 ATS).
    pub fn from_nvml(code: u32) -> Option<Self> {
        match code {
            0 => Some(AddressingMode::None),
            1 => Some(AddressingMode::Hmm),
            2 => Some(AddressingMode::Ats),
            _ => None,
        }
    }
}

/// Whether a GPU is partitioned.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "mode", content = "devices")]
pub enum MigMode {
    /// The GPU is used whole.
    Disabled,
    /// MIG mode is on; only these instances are usable, never the whole GPU.
    /// An empty list is a stranded GPU: nothing to publish.
    Enabled(Vec<MigDevice>),
    /// MIG mode is on and the driver makes instances when claims are
    /// prepared ([`dynamic_mig`]): these exist now, all made by us. Set only
    /// by [`dynamic_mig::select`], for GPUs with `mig_capabilities`.
    Dynamic(Vec<MigDevice>),
}

/// One MIG device: a GPU instance with one compute instance spanning it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDevice {
    /// `MIG-<uuid>`.
    pub uuid: String,
    pub profile: MigProfile,
    pub placement: Placement,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// `/dev/nvidia-caps` minors for this instance; `None` when unknown.
    pub caps: Option<MigCapMinors>,
    pub faults: Vec<Fault>,
}

/// What a MIG profile provides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigProfile {
    /// NVIDIA's name, e.g. `1g.10gb`, `1g.10gb+me`.
    pub name: String,
    /// NVML GPU-instance profile id (`nvidia-smi mig -cgi <id>`).
    pub gi_profile_id: u32,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    pub memory_bytes: u64,
}

/// Memory slices a GPU instance occupies: `[start, start + size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

impl Placement {
    pub fn slices(self) -> std::ops::Range<u32> {
        self.start..self.start + self.size
    }

    pub fn overlaps(self, other: Placement) -> bool {
        self.start < other.start + other.size && other.start < self.start + self.size
    }
}

/// Minors of `/dev/nvidia-caps/nvidia-cap<N>` granting access to a MIG device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigCapMinors {
    pub gpu_instance: u32,
    pub compute_instance: u32,
}

/// Identity of an NVLink fabric clique: `<clusterUUID>.<cliqueId>`, the form
/// NVIDIA's ComputeDomain machinery uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CliqueId {
    pub cluster_uuid: uuid::Uuid,
    pub clique: u32,
}

impl fmt::Display for CliqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.cluster_uuid.hyphenated(), self.clique)
    }
}

/// Something wrong with a device, as health checking reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Fault {
    /// A critical XID error (e.g. 48 double-bit ECC, 79 fallen off the bus).
    Xid(u32),
    /// NVML reports the GPU as lost.
    Lost,
}

/// A device the node publishes: a whole GPU, one MIG device of it, or
/// (dynamic MIG) one profile at one placement, which exists only once
/// prepared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PublishedDevice<'a> {
    Gpu(&'a Gpu),
    Mig {
        parent: &'a Gpu,
        mig: &'a MigDevice,
    },
    DynamicMig {
        parent: &'a Gpu,
        profile: &'a dynamic_mig::MigCapableProfile,
        placement: Placement,
    },
    /// The whole GPU for VFIO passthrough (`gpu-vfio-<minor>`), published
    /// beside `gpu-<minor>` with the `PassthroughSupport` gate only.
    Vfio(&'a Gpu),
}

impl Gpu {
    /// A GPU known so far by its index, minor and UUID only: nothing about
    /// it read yet, not partitioned, no topology, no faults. Discovery (NVML
    /// or a fake inventory) fills in what it knows.
    pub fn new(index: u32, minor: u32, uuid: String) -> Gpu {
        Gpu {
            index,
            minor,
            uuid,
            product_name: String::new(),
            brand: String::new(),
            architecture: String::new(),
            cuda_compute_capability: Semver::from_major_minor(0, 0),
            pci_bus_id: None,
            pcie_root: None,
            iommu_group: None,
            numa_node: None,
            memory_bytes: 0,
            mig: MigMode::Disabled,
            mig_capabilities: None,
            nvlink_group: None,
            clique: None,
            addressing_mode: None,
            faults: Vec::new(),
        }
    }

    /// `gpu-<minor>`, as NVIDIA names it.
    pub fn device_name(&self) -> Result<DeviceName, InvalidName> {
        DeviceName::new(format!("gpu-{}", self.minor))
    }

    /// `gpu-vfio-<minor>`: NVIDIA's `gpu-vfio-<n>` form, numbered by minor
    /// like every other name here.
    pub fn vfio_device_name(&self) -> Result<DeviceName, InvalidName> {
        DeviceName::new(format!("{VFIO_PREFIX}{}", self.minor))
    }

    /// Whether the GPU can be handed to a VM whole: MIG off, and the PCI
    /// address and IOMMU group known (the group is what VFIO opens).
    pub fn passthrough_capable(&self) -> bool {
        matches!(self.mig, MigMode::Disabled) && self.pci_bus_id.is_some() && self.iommu_group.is_some()
    }

    /// The devices this GPU offers, in [`Inventory::published_devices`]'
    /// order: the whole GPU when MIG is off, otherwise its MIG devices by
    /// placement; when dynamic, one device per profile and placement
    /// (smallest first), then the whole GPU where MIG mode can be switched.
    fn push_published<'a>(&'a self, out: &mut Vec<PublishedDevice<'a>>) {
        match &self.mig {
            MigMode::Disabled => out.push(PublishedDevice::Gpu(self)),
            MigMode::Enabled(migs) => {
                let mut migs: Vec<&MigDevice> = migs.iter().collect();
                migs.sort_by_key(|m| (m.placement.start, m.profile.gi_profile_id));
                out.extend(migs.into_iter().map(|mig| PublishedDevice::Mig { parent: self, mig }));
            }
            MigMode::Dynamic(_) => {
                // Without a profile table there is nothing to offer (`select` never does this).
                let Some(caps) = &self.mig_capabilities else { return };
                out.extend(caps.devices().map(|(profile, placement)| PublishedDevice::DynamicMig {
                    parent: self,
                    profile,
                    placement,
                }));
                if caps.mig_mode_switchable {
                    out.push(PublishedDevice::Gpu(self));
                }
            }
        }
    }
}

impl MigDevice {
    /// `gpu-<parentMinor>-mig-<profile>-<giProfileId>-<placementStart>`, with
    /// the profile lowered to a DNS label the way NVIDIA's driver does it
    /// (`1g.10gb+me` becomes `1g10gb-me`).
    pub fn device_name(&self, parent: &Gpu) -> Result<DeviceName, InvalidName> {
        dynamic_mig::mig_device_name(parent.minor, &self.profile.name, self.profile.gi_profile_id, self.placement.start)
    }
}

impl<'a> PublishedDevice<'a> {
    pub fn name(&self) -> Result<DeviceName, InvalidName> {
        match self {
            PublishedDevice::Gpu(gpu) => gpu.device_name(),
            PublishedDevice::Mig { parent, mig } => mig.device_name(parent),
            PublishedDevice::DynamicMig { parent, profile, placement } => dynamic_mig::mig_device_name(
                parent.minor,
                &profile.profile.name,
                profile.profile.gi_profile_id,
                placement.start,
            ),
            PublishedDevice::Vfio(gpu) => gpu.vfio_device_name(),
        }
    }

    /// The physical GPU this device lives on.
    pub fn gpu(&self) -> &'a Gpu {
        match self {
            PublishedDevice::Gpu(gpu) | PublishedDevice::Vfio(gpu) => gpu,
            PublishedDevice::Mig { parent, .. } | PublishedDevice::DynamicMig { parent, .. } => parent,
        }
    }

    /// Faults of the device itself and, for a MIG device, of its parent GPU.
    pub fn faults(&self) -> Vec<Fault> {
        match self {
            PublishedDevice::Gpu(gpu) | PublishedDevice::Vfio(gpu) => gpu.faults.clone(),
            PublishedDevice::Mig { parent, mig } => parent.faults.iter().chain(&mig.faults).copied().collect(),
            PublishedDevice::DynamicMig { parent, .. } => parent.faults.clone(),
        }
    }
}

impl Inventory {
    /// The devices this node offers, in a stable order: per GPU (by minor),
    /// the whole GPU when MIG is off, otherwise its MIG devices by placement;
    /// for a dynamic GPU, one device per profile and placement (smallest
    /// first, see [`dynamic_mig::MigCapabilities::devices`]), then the
    /// whole GPU where MIG mode can be switched.
    pub fn published_devices(&self) -> Vec<PublishedDevice<'_>> {
        let mut out = Vec::new();
        for gpu in &self.gpus {
            gpu.push_published(&mut out);
        }
        out
    }

    /// The GPUs' VFIO devices (published with `PassthroughSupport`), by minor.
    pub fn vfio_devices(&self) -> impl Iterator<Item = PublishedDevice<'_>> {
        self.gpus.iter().filter(|g| g.passthrough_capable()).map(PublishedDevice::Vfio)
    }

    /// Looks a published device up by its device name.
    ///
    /// Every name starts with its GPU's `gpu-<minor>`, so only that GPU's
    /// devices are named and compared: a prepare looks each of its devices
    /// up several times, and a dynamic MIG GPU offers dozens.
    pub fn find_device(&self, name: &DeviceName) -> Option<PublishedDevice<'_>> {
        if let Some(minor) = name.as_str().strip_prefix(VFIO_PREFIX) {
            let gpu = self.gpus.iter().find(|g| g.minor.to_string() == minor)?;
            return gpu.passthrough_capable().then_some(PublishedDevice::Vfio(gpu));
        }
        let minor = gpu_minor_of(name.as_str());
        let mut candidates = Vec::new();
        for gpu in self.gpus.iter().filter(|g| minor.is_none_or(|m| g.minor == m)) {
            gpu.push_published(&mut candidates);
        }
        candidates.into_iter().find(|d| d.name().is_ok_and(|n| &n == name))
    }
}

/// What every VFIO device's name starts with.
pub const VFIO_PREFIX: &str = "gpu-vfio-";

/// The GPU minor a device name starts with (`gpu-3`, `gpu-3-mig-...`).
fn gpu_minor_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("gpu-")?;
    let digits = rest.split('-').next()?;
    digits.parse().ok()
}

/// Where an inventory comes from.
pub trait InventorySource {
    /// Reads the node's GPUs now. Called at start and whenever the plugin
    /// re-discovers (e.g. after a health event).
    fn discover(&self) -> Result<Inventory, DiscoveryError>;
}

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error(transparent)]
    Fake(#[from] fake::FakeInventoryError),
    #[error(transparent)]
    Nvml(#[from] nvml::NvmlDiscoveryError),
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A plain healthy GPU for unit tests elsewhere in the crate.
    pub fn gpu(minor: u32) -> Gpu {
        Gpu {
            index: minor,
            minor,
            uuid: format!("GPU-00000000-0000-0000-0000-{minor:012}"),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            brand: "Nvidia".into(),
            architecture: "Hopper".into(),
            cuda_compute_capability: Semver::from_major_minor(9, 0),
            pci_bus_id: Some(PciBusId::parse(&format!("0000:{:02x}:00.0", 0x18 + minor)).unwrap()),
            pcie_root: Some("pci0000:17".into()),
            iommu_group: None,
            numa_node: Some(0),
            memory_bytes: 80 << 30,
            mig: MigMode::Disabled,
            mig_capabilities: None,
            nvlink_group: None,
            clique: None,
            addressing_mode: None,
            faults: vec![],
        }
    }

    pub fn mig(profile: &str, gi_profile_id: u32, start: u32, size: u32) -> MigDevice {
        MigDevice {
            uuid: format!("MIG-00000000-0000-0000-0000-{start:012}"),
            profile: MigProfile {
                name: profile.into(),
                gi_profile_id,
                multiprocessors: 16,
                copy_engines: 1,
                decoders: 1,
                encoders: 0,
                jpeg_engines: 0,
                ofa_engines: 0,
                memory_bytes: 9984 << 20,
            },
            placement: Placement { start, size },
            gpu_instance_id: start + 1,
            compute_instance_id: 0,
            caps: Some(MigCapMinors { gpu_instance: 12, compute_instance: 13 }),
            faults: vec![],
        }
    }

    pub fn inventory(gpus: Vec<Gpu>) -> Inventory {
        Inventory {
            driver_version: Semver::normalize("580.82.07").unwrap(),
            cuda_driver_version: Semver::normalize("13.0").unwrap(),
            device_majors: DeviceMajors { nvidia_uvm: Some(235), nvidia_caps: Some(236) },
            gpus,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn device_names_follow_nvidia() {
        let parent = gpu(3);
        assert_eq!(parent.device_name().unwrap().as_str(), "gpu-3");
        assert_eq!(mig("1g.10gb", 19, 4, 1).device_name(&parent).unwrap().as_str(), "gpu-3-mig-1g10gb-19-4");
        assert_eq!(mig("1g.10gb+me", 20, 0, 1).device_name(&parent).unwrap().as_str(), "gpu-3-mig-1g10gb-me-20-0");
    }

    #[test]
    fn mig_enabled_gpus_publish_only_their_instances() {
        let mut partitioned = gpu(1);
        partitioned.mig = MigMode::Enabled(vec![mig("3g.40gb", 9, 4, 4), mig("3g.40gb", 9, 0, 4)]);
        let mut stranded = gpu(2);
        stranded.mig = MigMode::Enabled(vec![]);
        let inv = inventory(vec![gpu(0), partitioned, stranded]);
        let names: Vec<String> = inv.published_devices().iter().map(|d| d.name().unwrap().to_string()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4"]);
        let found = inv.find_device(&DeviceName::new("gpu-1-mig-3g40gb-9-4").unwrap()).unwrap();
        assert_eq!(found.gpu().minor, 1);
        assert!(inv.find_device(&DeviceName::new("gpu-2").unwrap()).is_none());
    }

    #[test]
    fn find_device_agrees_with_the_published_list() {
        let mut partitioned = gpu(1);
        partitioned.mig = MigMode::Enabled(vec![mig("3g.40gb", 9, 4, 4), mig("1g.10gb", 19, 0, 1)]);
        let inv = inventory(vec![gpu(0), partitioned, gpu(10), gpu(12)]);
        for device in inv.published_devices() {
            let name = device.name().unwrap();
            let found = inv.find_device(&name).unwrap();
            assert_eq!(found.name().unwrap(), name);
            assert_eq!(found.gpu().uuid, device.gpu().uuid);
        }
        for absent in ["gpu-01", "gpu-2", "gpu-1", "gpu-12-mig-1g10gb-19-0", "gpu-x", "mig-1", "gpu"] {
            assert!(inv.find_device(&DeviceName::new(absent).unwrap()).is_none(), "{absent}");
        }
    }

    #[test]
    fn mig_devices_inherit_parent_faults() {
        let mut parent = gpu(0);
        parent.faults = vec![Fault::Lost];
        let mut m = mig("1g.10gb", 19, 0, 1);
        m.faults = vec![Fault::Xid(94)];
        let d = PublishedDevice::Mig { parent: &parent, mig: &m };
        assert_eq!(d.faults(), vec![Fault::Lost, Fault::Xid(94)]);
    }

    #[test]
    fn clique_id_format() {
        let c = CliqueId { cluster_uuid: uuid::Uuid::from_u128(0xabc), clique: 7 };
        assert_eq!(c.to_string(), "00000000-0000-0000-0000-000000000abc.7");
    }

    #[test]
    fn placements_overlap() {
        let a = Placement { start: 0, size: 4 };
        assert!(a.overlaps(Placement { start: 3, size: 1 }));
        assert!(!a.overlaps(Placement { start: 4, size: 4 }));
        assert_eq!(a.slices().count(), 4);
    }
}
