//! VFIO passthrough (`PassthroughSupport`): a claimed `gpu-vfio-<minor>`
//! is bound, with every device of its IOMMU group, to `vfio-pci` at
//! prepare and given back at unprepare, so that a VM (KubeVirt) can own it.
//!
//! The switch, in the discipline of [`crate::prepare`]:
//! 0. wait, bounded, until no process holds the GPU open ([`holders`]), as
//!    NVIDIA's driver waits for `fuser`; else fail, having changed nothing;
//! 1. the `PrepareStarted` record names the GPU, its group and each
//!    member's driver before anything is written ([`VfioSwitch`]);
//! 2. per member: `driver_override` ← `vfio-pci`, unbind from its driver,
//!    `drivers_probe` (a kill point after each write);
//! 3. wait, bounded, until every member is bound to `vfio-pci` and
//!    `/dev/vfio/<group>` exists; else give back (below) and fail;
//! 4. the CDI spec (`/dev/vfio/vfio`, `/dev/vfio/<group>`), then
//!    `PrepareCompleted`.
//!
//! Giving back (unprepare, a failed or timed-out prepare, start-up finding
//! a `PrepareStarted` record): per member, clear `driver_override`, unbind
//! from `vfio-pci` if bound to it, `drivers_probe` (the kernel binds the
//! driver that matches the device: `nvidia` for the GPU); then wait until
//! each member that had a driver has one again. Every step reads the
//! device's state first, so giving back after a kill at any step (or
//! twice) ends with each device bound to one driver.

#[cfg(test)]
pub(crate) mod fake_kernel;
pub mod holders;
pub mod switch;
pub mod sysfs;

use std::sync::Arc;

use gpu_dra_driver::inventory::PciBusId;

/// What the preparer switches drivers with: the node's sysfs (an emulator
/// in tests) and how long a switch may take.
#[derive(Clone)]
pub struct VfioHost {
    pub binding: Arc<dyn sysfs::PciBinding>,
    /// Who holds a GPU open: a GPU in use is not switched.
    pub holders: Arc<dyn holders::GpuHolders>,
    pub timing: switch::Timing,
}

impl std::fmt::Debug for VfioHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioHost").field("timing", &self.timing).finish_non_exhaustive()
    }
}

/// What a claim's record says of a GPU it passes through: written before
/// the first sysfs write, so that start-up can give everything back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfioSwitch {
    /// The GPU's PCI address (the inventory's; checked against it again
    /// before any write).
    pub pci_bus_id: String,
    pub iommu_group: u32,
    /// Every device of the group and the driver it had before.
    pub members: Vec<VfioMember>,
}

/// One device of the group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfioMember {
    pub pci_bus_id: String,
    /// `None`: no driver was bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_driver: Option<String>,
}

impl VfioSwitch {
    /// The members' addresses, each validated (a record is data, not trust).
    pub fn member_ids(&self) -> Result<Vec<PciBusId>, RecordError> {
        self.members
            .iter()
            .map(|m| {
                let id = PciBusId::parse(&m.pci_bus_id).map_err(RecordError::BadAddress)?;
                if id.to_string() != m.pci_bus_id {
                    return Err(RecordError::NotCanonical(m.pci_bus_id.clone()));
                }
                Ok(id)
            })
            .collect()
    }
}

/// Why a recorded switch is not one the plugin could have made on this
/// node: forged or damaged, so nothing it names is written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("checkpoint: {0}")]
    BadAddress(#[source] gpu_dra_driver::inventory::pci::InvalidPciBusId),
    #[error("checkpoint: {0:?} is not a canonical PCI address")]
    NotCanonical(String),
    #[error("field `vfio.pciBusId` {0:?} is no GPU of this node")]
    NoSuchGpu(String),
    #[error(transparent)]
    DeviceName(#[from] gpu_dra_driver::names::InvalidName),
    #[error("device {device:?} is not the passthrough device of GPU {gpu}")]
    NotPassthroughDevice { device: String, gpu: String },
    #[error("field `vfio.iommuGroup` is {recorded}, but GPU {gpu} is in IOMMU group {actual:?}")]
    OtherGroup { recorded: u32, gpu: String, actual: Option<u32> },
    #[error("GPU {0} has no PCI address")]
    NoAddress(String),
    #[error(transparent)]
    Sysfs(#[from] sysfs::SysfsError),
    #[error("field `vfio.members` names {stranger}, which is not in IOMMU group {group} of GPU {gpu}")]
    Stranger { stranger: PciBusId, group: u32, gpu: String },
    #[error("field `vfio.members` does not name GPU {0} itself")]
    GpuNotMember(String),
    #[error("field `vfio.members` names driver {0:?}, which is no plain driver name")]
    NotPlainDriver(String),
}
