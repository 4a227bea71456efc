//! VFIO passthrough in a prepare: which of a claim's devices are GPUs to
//! hand to a VM, what of other claims they clash with, and how a record's
//! switch is judged and undone at unprepare and start-up. The sysfs
//! switch itself is [`crate::vfio`]; the preparer records each group's
//! devices and drivers (`PrepareStarted`) before the first write, as it
//! does for every side effect (see [`super`]).

use gpu_dra_driver::inventory::{Inventory, PciBusId, PublishedDevice};

use super::config::PreparerConfig;
use super::plan::PlannedDevice;
use crate::state::checkpoint::ClaimRecord;
use crate::vfio::VfioHost;
use crate::vfio::switch::{self, RecordError};

/// Why a claim's passthrough devices cannot be prepared, or its GPUs not
/// given back: each names the device, claim or GPU.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("device {0} is a GPU passed through to one VM (vfio-pci): it cannot be shared or held with admin access")]
    NotExclusive(String),
    #[error("device {0}: the GPU's PCI address or IOMMU group is unknown")]
    UnknownPlacement(String),
    #[error(transparent)]
    DeviceName(#[from] gpu_dra_driver::names::InvalidName),
    #[error(
        "device {device} and device {theirs} of ResourceClaim {namespace}/{name} ({uid}) are the same GPU, one of them \
         passed through with vfio-pci: a GPU is on one driver at a time; wait for that claim to be unprepared"
    )]
    SameGpu { device: String, theirs: String, namespace: String, name: String, uid: String },
    #[error("device {0} is recorded passed through, but this plugin has no sysfs (a fake inventory)")]
    NoSysfs(String),
    #[error("device {device}: {source}")]
    Record { device: String, source: RecordError },
    #[error("claim {0} passed GPUs through, but this plugin has no sysfs to give them back")]
    NoSysfsToGiveBack(String),
    #[error("giving GPU {gpu} back: {source}")]
    GiveBack { gpu: String, source: switch::SwitchError },
}

/// A `gpu-vfio-<minor>` device of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its index in the claim's planned devices.
    pub index: usize,
    pub gpu: PciBusId,
    /// The GPU's minor: `/dev/nvidia<minor>` must be open nowhere.
    pub minor: u32,
    pub group: u32,
    /// The same GPU's `gpu-<minor>`, locked with it: a claim for either
    /// name waits for the other's call.
    pub plain_name: String,
    /// Every other GPU of the node: a group holding one is refused.
    pub other_gpus: Vec<PciBusId>,
}

/// Finds the claim's passthrough devices. A GPU bound to `vfio-pci` is one
/// VM's: admin access and shares are refused.
pub fn plan(planned: &[PlannedDevice], inventory: &Inventory) -> Result<Vec<Target>, Error> {
    let mut out = Vec::new();
    for (index, device) in planned.iter().enumerate() {
        let Some(PublishedDevice::Vfio(gpu)) = inventory.find_device(&device.device) else { continue };
        if !device.is_exclusive() {
            return Err(Error::NotExclusive(device.device.to_string()));
        }
        let (Some(id), Some(group)) = (gpu.pci_bus_id, gpu.iommu_group) else {
            return Err(Error::UnknownPlacement(device.device.to_string()));
        };
        out.push(Target {
            index,
            gpu: id,
            minor: gpu.minor,
            group,
            plain_name: gpu.device_name()?.to_string(),
            other_gpus: inventory.gpus.iter().filter_map(|g| g.pci_bus_id).filter(|g| *g != id).collect(),
        });
    }
    Ok(out)
}

/// The GPU minor a device name of ours is on, and whether it is the GPU's
/// passthrough device: `gpu-vfio-<n>`, `gpu-<n>` and `gpu-<n>-mig-…`.
fn gpu_of(name: &str) -> Option<(u32, bool)> {
    if let Some(minor) = name.strip_prefix(gpu_dra_driver::inventory::VFIO_PREFIX) {
        return Some((minor.parse().ok()?, true));
    }
    let rest = name.strip_prefix("gpu-")?;
    let minor = rest.split('-').next()?;
    Some((minor.parse().ok()?, false))
}

/// Refuses a GPU another claim's record holds under its other name: a GPU
/// passed through leaves the `nvidia` driver under every container of a
/// claim holding it as `gpu-<minor>` (or a MIG device of it), and a GPU on
/// `vfio-pci` is no use to such a claim. The counter the two names share
/// keeps the scheduler from it, but the kubelet may prepare a new claim
/// before it unprepared an old one (kubernetes#136269). Admin access and
/// shares count: the GPU still leaves its driver under them.
pub fn check_records<'a>(
    uid: &str,
    planned: &[PlannedDevice],
    records: impl IntoIterator<Item = &'a ClaimRecord>,
) -> Result<(), Error> {
    let ours: Vec<(&PlannedDevice, (u32, bool))> =
        planned.iter().filter_map(|d| Some((d, gpu_of(d.device.as_str())?))).collect();
    for other in records.into_iter().filter(|r| r.uid != uid) {
        for theirs in &other.devices {
            let Some((minor, vfio)) = gpu_of(&theirs.device_name) else { continue };
            let clash = ours.iter().find(|(_, (m, v))| *m == minor && *v != vfio);
            if let Some((device, _)) = clash {
                return Err(Error::SameGpu {
                    device: device.device.to_string(),
                    theirs: theirs.device_name.clone(),
                    namespace: other.namespace.clone(),
                    name: other.name.clone(),
                    uid: other.uid.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Start-up's judgement of a record of this boot: every switch it names
/// must be one the plugin could have made on this node (see
/// [`switch::check_recorded`]); else the record is set aside and nothing
/// it names is written.
pub(super) fn check(config: &PreparerConfig, inventory: &Inventory, record: &ClaimRecord) -> Result<(), Error> {
    if record.boot_id != config.boot_id {
        return Ok(());
    }
    for device in &record.devices {
        let Some(recorded) = &device.vfio else { continue };
        let Some(host) = &config.vfio else {
            return Err(Error::NoSysfs(device.device_name.clone()));
        };
        switch::check_recorded(&*host.binding, inventory, &device.device_name, recorded)
            .map_err(|source| Error::Record { device: device.device_name.clone(), source })?;
    }
    Ok(())
}

/// Gives every group the record passed through back to its drivers, last
/// first, from the record alone; repeatable after a kill anywhere.
pub(super) fn give_back(host: Option<&VfioHost>, record: &ClaimRecord) -> Result<(), Error> {
    let mut switches = record.devices.iter().filter_map(|d| d.vfio.as_ref()).rev().peekable();
    if switches.peek().is_none() {
        return Ok(());
    }
    let host = host.ok_or_else(|| Error::NoSysfsToGiveBack(record.uid.clone()))?;
    for recorded in switches {
        switch::give_back(&*host.binding, recorded, &mut switch::kill_points, host.timing)
            .map_err(|source| Error::GiveBack { gpu: recorded.pci_bus_id.clone(), source })?;
    }
    Ok(())
}

/// Start-up, for a kept (completed) record: a group that is not wholly on
/// `vfio-pci` (an unprepare killed half-way through giving it back, which
/// the kubelet retries) is bound again, so the claim is whole until its
/// unprepare. Failures are logged: the unprepare gives back either way.
pub(super) fn settle(config: &PreparerConfig, record: &ClaimRecord) {
    let Some(host) = &config.vfio else { return };
    for recorded in record.devices.iter().filter_map(|d| d.vfio.as_ref()) {
        let Ok(members) = recorded.member_ids() else { continue };
        let on_vfio =
            |m: &PciBusId| host.binding.driver(m).ok().flatten().as_deref() == Some(crate::vfio::sysfs::VFIO_PCI);
        if members.iter().all(on_vfio) {
            continue;
        }
        tracing::warn!(claim_uid = %record.uid, gpu = %recorded.pci_bus_id, "a prepared claim's IOMMU group is not on vfio-pci; binding it again");
        if let Err(error) = switch::bind(&*host.binding, recorded, &mut switch::kill_points, host.timing) {
            tracing::error!(claim_uid = %record.uid, gpu = %recorded.pci_bus_id, %error, "binding a prepared claim's group to vfio-pci again failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_their_gpu() {
        assert_eq!(gpu_of("gpu-vfio-3"), Some((3, true)));
        assert_eq!(gpu_of("gpu-3"), Some((3, false)));
        assert_eq!(gpu_of("gpu-12-mig-1g10gb-19-0"), Some((12, false)));
        assert_eq!(gpu_of("channel-0"), None);
        assert_eq!(gpu_of("gpu-vfio-x"), None);
    }
}
