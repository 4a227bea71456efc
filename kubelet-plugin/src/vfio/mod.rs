//! VFIO passthrough (`PassthroughSupport`): a claimed `gpu-vfio-<minor>`
//! is bound, with every device of its IOMMU group, to `vfio-pci` at
//! prepare and given back at unprepare, so that a VM (KubeVirt) can own it.
//!
//! The switch, in the discipline of [`crate::prepare`]:
//! 0. wait, bounded, until no process holds the GPU open ([`holders`]), as
//!    NVIDIA's driver waits for `fuser`; else fail, having changed nothing;
//! 1. the `PrepareStarted` record names the GPU, its group and each
//!    member's driver before anything is written
//!    ([`crate::state::checkpoint::VfioSwitch`]);
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
