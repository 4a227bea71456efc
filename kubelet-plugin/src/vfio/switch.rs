//! The driver switch of a GPU's IOMMU group: plan (read only), bind to
//! `vfio-pci`, give back; see [`super`] for the order and why it is safe
//! to stop anywhere.

use std::time::{Duration, Instant};

use gpu_dra_driver::bounded_file::is_plain_name;
use gpu_dra_driver::inventory::{Inventory, PciBusId};

use super::sysfs::{PciBinding, SysfsError, VFIO_PCI};
use crate::state::checkpoint::{MemberError, VfioMember, VfioSwitch};
use crate::state::kill_point::Step;

/// The driver a GPU must be bound to before it is passed through.
pub const NVIDIA: &str = "nvidia";

/// How long a switch may take, and how often it looks.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub timeout: Duration,
    pub poll: Duration,
}

impl Default for Timing {
    /// NVIDIA's driver waits up to 60 s for a GPU to be free; binding is
    /// quicker: 10 s, looking every 50 ms.
    fn default() -> Self {
        Self { timeout: Duration::from_secs(10), poll: Duration::from_millis(50) }
    }
}

/// Why a switch stopped.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    TimedOut(String),
    /// A test's stand-in for SIGKILL at a kill point: nothing after it ran.
    #[error("killed at {}", .0.name())]
    Killed(Step),
}

/// Why a recorded switch is not one the plugin could have made on this
/// node: forged or damaged, so nothing it names is written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Member(#[from] MemberError),
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
    Sysfs(#[from] SysfsError),
    #[error("field `vfio.members` names {stranger}, which is not in IOMMU group {group} of GPU {gpu}")]
    Stranger { stranger: PciBusId, group: u32, gpu: String },
    #[error("field `vfio.members` does not name GPU {0} itself")]
    GpuNotMember(String),
    #[error("field `vfio.members` names driver {0:?}, which is no plain driver name")]
    NotPlainDriver(String),
}

/// Called at each kill point; the plugin's kills the process when a crash
/// test asks ([`crate::state::kill_point::reached`]).
pub type At<'a> = &'a mut dyn FnMut(Step) -> Result<(), SwitchError>;

/// The plugin's [`At`]: the crash tests' SIGKILL, else nothing.
pub fn kill_points(step: Step) -> Result<(), SwitchError> {
    crate::state::kill_point::reached(step);
    Ok(())
}

/// What passing `gpu` through would switch, read without writing: its
/// group's members and their drivers. Refused when the GPU is bound to
/// neither `nvidia` nor `vfio-pci` (as NVIDIA's driver refuses), or when
/// the group holds another GPU of the node (`other_gpus`): that GPU would
/// leave its driver with this claim while the scheduler thinks it free.
pub fn plan(
    binding: &dyn PciBinding,
    gpu: &PciBusId,
    group: u32,
    other_gpus: &[PciBusId],
) -> Result<VfioSwitch, SwitchError> {
    let members = binding.group_members(gpu, group)?;
    if let Some(other) = members.iter().find(|m| *m != gpu && other_gpus.contains(m)) {
        return Err(SwitchError::Refused(format!(
            "GPU {gpu} shares IOMMU group {group} with GPU {other}: a group passes through whole, so both would \
             leave the nvidia driver; give the node ACS (or separate slots) so each GPU has its own group"
        )));
    }
    let mut out = Vec::new();
    for member in &members {
        let driver = binding.driver(member)?;
        if member == gpu && !matches!(driver.as_deref(), Some(NVIDIA | VFIO_PCI)) {
            return Err(SwitchError::Refused(format!(
                "GPU {gpu} is bound to {}, expected {NVIDIA} or {VFIO_PCI}",
                driver.as_deref().unwrap_or("no driver")
            )));
        }
        out.push(VfioMember { pci_bus_id: member.to_string(), original_driver: driver });
    }
    Ok(VfioSwitch { pci_bus_id: gpu.to_string(), iommu_group: group, members: out })
}

/// Checks a record's switch against the node before anything of it is
/// touched: `device` is `gpu-vfio-<minor>` of the inventory's GPU at the
/// recorded address, the group is that GPU's, and every recorded member is
/// in the group as sysfs lists it now (membership does not change with
/// binding). A record that says otherwise names devices the plugin never
/// switched: it is forged or damaged, and nothing it names may be written.
pub fn check_recorded(
    binding: &dyn PciBinding,
    inventory: &Inventory,
    device: &str,
    switch: &VfioSwitch,
) -> Result<(), RecordError> {
    let gpu = inventory
        .gpus
        .iter()
        .find(|g| g.pci_bus_id.is_some_and(|id| id.to_string() == switch.pci_bus_id))
        .ok_or_else(|| RecordError::NoSuchGpu(switch.pci_bus_id.clone()))?;
    if gpu.vfio_device_name()?.as_str() != device {
        return Err(RecordError::NotPassthroughDevice { device: device.to_owned(), gpu: switch.pci_bus_id.clone() });
    }
    if gpu.iommu_group != Some(switch.iommu_group) {
        return Err(RecordError::OtherGroup {
            recorded: switch.iommu_group,
            gpu: switch.pci_bus_id.clone(),
            actual: gpu.iommu_group,
        });
    }
    let recorded = switch.member_ids()?;
    let id = gpu.pci_bus_id.ok_or_else(|| RecordError::NoAddress(switch.pci_bus_id.clone()))?;
    let members = binding.group_members(&id, switch.iommu_group)?;
    if let Some(stranger) = recorded.iter().find(|m| !members.contains(m)) {
        return Err(RecordError::Stranger {
            stranger: *stranger,
            group: switch.iommu_group,
            gpu: switch.pci_bus_id.clone(),
        });
    }
    if !recorded.contains(&id) {
        return Err(RecordError::GpuNotMember(switch.pci_bus_id.clone()));
    }
    if let Some(bad) = switch.members.iter().filter_map(|m| m.original_driver.as_deref()).find(|d| !is_plain_name(d)) {
        return Err(RecordError::NotPlainDriver(bad.to_owned()));
    }
    Ok(())
}

/// Binds every member to `vfio-pci` and waits for the group's node. On a
/// failure or timeout the caller gives back ([`give_back`]).
pub fn bind(binding: &dyn PciBinding, switch: &VfioSwitch, at: At<'_>, timing: Timing) -> Result<(), SwitchError> {
    let members = switch.member_ids().map_err(|e| SwitchError::Refused(e.to_string()))?;
    for member in &members {
        binding.set_override(member, Some(VFIO_PCI))?;
        at(Step::VfioOverride)?;
        match binding.driver(member)? {
            Some(driver) if driver == VFIO_PCI => continue,
            Some(driver) => {
                binding.unbind(member, &driver)?;
                at(Step::VfioUnbound)?;
            }
            None => {}
        }
        binding.probe(member)?;
        at(Step::VfioProbed)?;
    }
    wait(timing, || {
        let bound = members.iter().all(|m| binding.driver(m).ok().flatten().as_deref() == Some(VFIO_PCI));
        bound && binding.group_node_exists(switch.iommu_group)
    })
    .map_err(|waited| {
        SwitchError::TimedOut(format!(
            "IOMMU group {} of GPU {} was not bound to {VFIO_PCI} with /dev/vfio/{} after {waited:.1?}; the GPU \
             was given back to its driver (is the vfio-pci module loaded?)",
            switch.iommu_group, switch.pci_bus_id, switch.iommu_group
        ))
    })?;
    at(Step::VfioBound)
}

/// Gives every member back to the driver that matches it. Safe to repeat
/// and to start after a kill anywhere in [`bind`] or in itself.
pub fn give_back(binding: &dyn PciBinding, switch: &VfioSwitch, at: At<'_>, timing: Timing) -> Result<(), SwitchError> {
    let members = switch.member_ids().map_err(|e| SwitchError::Refused(e.to_string()))?;
    for (member, recorded) in members.iter().zip(&switch.members) {
        binding.set_override(member, None)?;
        let driver = binding.driver(member)?;
        if driver.as_deref() == Some(VFIO_PCI) && recorded.original_driver.as_deref() != Some(VFIO_PCI) {
            binding.unbind(member, VFIO_PCI)?;
            at(Step::VfioReleased)?;
        }
        if binding.driver(member)?.is_none() && recorded.original_driver.is_some() {
            binding.probe(member)?;
        }
    }
    wait(timing, || {
        members.iter().zip(&switch.members).all(|(m, r)| match &r.original_driver {
            Some(_) => binding
                .driver(m)
                .ok()
                .flatten()
                .is_some_and(|d| d != VFIO_PCI || r.original_driver.as_deref() == Some(VFIO_PCI)),
            None => true,
        })
    })
    .map_err(|waited| {
        SwitchError::TimedOut(format!(
            "IOMMU group {} of GPU {} did not return to its drivers after {waited:.1?}; the record stays and the \
             next unprepare or start-up retries",
            switch.iommu_group, switch.pci_bus_id
        ))
    })
}

/// Polls `done` until it holds or `timing.timeout` passes (`Err`: the time waited).
fn wait(timing: Timing, mut done: impl FnMut() -> bool) -> Result<(), Duration> {
    let started = Instant::now();
    loop {
        if done() {
            return Ok(());
        }
        if started.elapsed() >= timing.timeout {
            return Err(started.elapsed());
        }
        std::thread::sleep(timing.poll);
    }
}

#[cfg(test)]
#[path = "switch_tests.rs"]
mod tests;
