//! The model: a node's GPUs, their MIG devices and what they can hold,
//! plain data that both discovery sources fill.

use std::fmt;

use serde::Serialize;

use super::pci::PciBusId;
use crate::names::{DeviceName, InvalidName};
use crate::version::Semver;

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
    pub mig_capabilities: Option<MigCapabilities>,
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

/// What a MIG-capable GPU can hold, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigCapabilities {
    /// Memory slices of the GPU: the end of the furthest placement (8 on
    /// A100/H100/H200/B200, 4 on A30).
    pub memory_slices: u32,
    /// Compute slices: the largest profile's (7 on A100/H100, 4 on A30).
    pub compute_slices: u32,
    /// MIG mode can be turned off and on again without a GPU reset
    /// (Hopper and later, with no process on the GPU): only then is the
    /// whole GPU offered beside its MIG devices. An A100 or A30 needs a
    /// reset, so while in MIG mode it offers MIG devices only.
    pub mig_mode_switchable: bool,
    /// By profile id, ascending.
    pub profiles: Vec<MigCapableProfile>,
}

/// One GPU-instance profile with every placement NVML offers for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigCapableProfile {
    /// Name, NVML profile id (`nvidia-smi mig -cgi <id>`), SMs, engines, memory.
    pub profile: MigProfile,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index the profile was read with
    /// (`nvmlDeviceGetGpuInstanceProfileInfo` takes it). Placements and
    /// instance creation (`nvmlDeviceCreateGpuInstanceWithPlacement`, via
    /// the profile info) use the profile id, `profile.gi_profile_id`.
    pub profile_index: u32,
    /// The `NVML_COMPUTE_INSTANCE_PROFILE_*` index of a compute instance
    /// spanning the whole GPU instance (the only shape published).
    pub compute_instance_profile_index: u32,
    /// NVML's `sliceCount`: the `G` of `<G>g.<N>gb`.
    pub compute_slices: u32,
    /// The size of every placement.
    pub memory_slices: u32,
    /// NVML's `instanceCount`: most instances of this profile at once.
    pub max_count: u32,
    /// By start, ascending.
    pub placements: Vec<Placement>,
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
}

/// What every VFIO device's name starts with.
pub const VFIO_PREFIX: &str = "gpu-vfio-";
