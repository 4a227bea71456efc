//! The checkpoint's record types: what one claim's file holds. Apart from
//! [`super`]'s reading and writing so that the format modules
//! ([`super::envelope`], [`super::derived`]) read them without reaching
//! back up to the directory code.

use std::path::PathBuf;

use gpu_dra_driver::inventory::PciBusId;
use gpu_dra_driver::names::DomainUid;

use super::mig_records::{MadeInstance, MigIntent};
use crate::prepared::PreparedDevice;

/// Where a claim is in its prepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PrepareState {
    /// Side effects may have started; roll back unless completed.
    PrepareStarted,
    /// Everything is in place; `devices` is what the kubelet was told.
    PrepareCompleted,
}

/// One device of a checkpointed claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Admin access does not make the device busy for other claims.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
    /// The time-slice this claim set on the GPU (absent: none), so that the
    /// last claim to let go resets it, whatever crashed in between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slice: Option<TimeSlice>,
    /// A dynamic MIG device: recorded with its placement before it is made,
    /// with its instance once made (absent: a device that exists on its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_mig: Option<DynamicMigDevice>,
    /// A whole dynamic GPU whose MIG mode this claim turned off (recorded
    /// before the switch), to be turned on again when the claim goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode_off: Option<MigModeOff>,
    /// A GPU passed through (`gpu-vfio-<minor>`): its IOMMU group's devices
    /// and their drivers, recorded before the first sysfs write so that
    /// unprepare and start-up give each back from the record alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio: Option<VfioSwitch>,
}

/// A dynamic MIG device of a claim: what to make (recorded first), and what
/// was made (recorded with the completion).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DynamicMigDevice {
    #[serde(flatten)]
    pub intent: MigIntent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<MadeInstance>,
}

/// A whole GPU taken out of MIG mode for a claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigModeOff {
    pub gpu_uuid: String,
    pub gpu_minor: u32,
}

/// A GPU's time-slice interval as set through `nvidia-smi compute-policy`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlice {
    pub gpu_uuid: String,
    /// `--set-timeslice` value: 0 Default, 1 Short, 2 Medium, 3 Long.
    pub interval: u8,
}

/// One claim's MPS control daemon: where it lives, what it serves, the
/// limits it enforces, and (once started) which process it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemon {
    /// `<state-dir>/mps/<claimUID>`: holds `pipe/`, `log/` and `shm/` (a
    /// tmpfs), all created by prepare and removed by unprepare.
    pub root: PathBuf,
    /// The claim's devices (names) whose containers talk to the daemon.
    pub devices: Vec<String>,
    /// `CUDA_VISIBLE_DEVICES`: the GPU or MIG UUIDs the daemon serves.
    pub visible: Vec<String>,
    /// Whole GPUs set to `EXCLUSIVE_PROCESS` for the daemon (a MIG
    /// device's parent).
    pub gpus: Vec<String>,
    /// `set_default_active_thread_percentage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u8>,
    /// `set_default_device_pinned_mem_limit <uuid> <mib>M`, per device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned_limits: Vec<PinnedLimit>,
    /// The daemon process, once it answered; `None` before (start-up then
    /// finds it through the pid file in the pipe directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<DaemonProcess>,
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
    pub fn member_ids(&self) -> Result<Vec<PciBusId>, MemberError> {
        self.members
            .iter()
            .map(|m| {
                let id = PciBusId::parse(&m.pci_bus_id).map_err(MemberError::BadAddress)?;
                if id.to_string() != m.pci_bus_id {
                    return Err(MemberError::NotCanonical(m.pci_bus_id.clone()));
                }
                Ok(id)
            })
            .collect()
    }
}

/// A recorded group member whose address is not a canonical PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    #[error("checkpoint: {0}")]
    BadAddress(#[source] gpu_dra_driver::inventory::InvalidPciBusId),
    #[error("checkpoint: {0:?} is not a canonical PCI address")]
    NotCanonical(String),
}

/// A pinned device memory limit for one device of an MPS daemon.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinnedLimit {
    pub uuid: String,
    pub mib: u64,
}

/// A process as identified across restarts of the plugin: its pid and its
/// start time (field 22 of `/proc/<pid>/stat`), so that a recycled pid is
/// never mistaken for the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonProcess {
    pub pid: i32,
    pub start_time: u64,
}

impl MpsDaemon {
    /// A daemon in `root` with nothing else known of it yet: prepare's plan
    /// fills in its devices, start-up tears down an orphan by its directory
    /// alone, the supervisor names the GPUs a launch request makes visible.
    pub fn at(root: PathBuf) -> Self {
        MpsDaemon {
            root,
            devices: Vec::new(),
            visible: Vec::new(),
            gpus: Vec::new(),
            active_thread_percentage: None,
            pinned_limits: Vec::new(),
            process: None,
        }
    }

    pub fn pipe_dir(&self) -> PathBuf {
        self.root.join("pipe")
    }

    pub fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }

    pub fn shm_dir(&self) -> PathBuf {
        self.root.join("shm")
    }
}

impl CheckpointDevice {
    /// The record of a device prepared for a claim, before anything else is
    /// known of it (its time-slice, MIG or passthrough work is added as it
    /// is planned); the one place a device's record is spelled out.
    pub fn new(device: PreparedDevice, admin_access: bool) -> Self {
        let PreparedDevice { request_names, pool_name, device_name, cdi_device_ids, share_id } = device;
        CheckpointDevice {
            request_names,
            pool_name,
            device_name,
            cdi_device_ids,
            share_id,
            admin_access,
            time_slice: None,
            dynamic_mig: None,
            mig_mode_off: None,
            vfio: None,
        }
    }

    /// The device as the kubelet was told of it.
    pub fn prepared(&self) -> PreparedDevice {
        PreparedDevice {
            request_names: self.request_names.clone(),
            pool_name: self.pool_name.clone(),
            device_name: self.device_name.clone(),
            cdi_device_ids: self.cdi_device_ids.clone(),
            share_id: self.share_id.clone(),
        }
    }

    /// Whether no other claim may hold this device at the same time.
    pub fn is_exclusive(&self) -> bool {
        !self.admin_access && self.share_id.is_none()
    }
}

/// What the checkpoint knows about one claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub state: PrepareState,
    /// `/proc/sys/kernel/random/boot_id` when written: after a reboot no
    /// container holds the devices any more, so the record is void.
    pub boot_id: String,
    /// The claim's CDI spec file name in the CDI directory, once chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdi_spec_file: Option<String>,
    #[serde(default)]
    pub devices: Vec<CheckpointDevice>,
    /// The claim's MPS control daemon, recorded (with everything it is
    /// made of) before any of it is created, so start-up can undo it or
    /// start it again whatever the crash interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsDaemon>,
    /// A `compute-domain.nvidia.com` claim: its domain (whose IMEX daemon
    /// runs while any claim of it is recorded) and its channels. Absent in
    /// records of the GPU driver and in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_domain: Option<DomainClaim>,
    /// A claim NVIDIA's plugin prepared, taken over at start-up (see
    /// [`crate::prepare::adopt`]); absent for the claims we prepared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted: Option<Adopted>,
}

impl ClaimRecord {
    /// The devices the record gave its claim, as the kubelet gets them again.
    pub fn prepared_devices(&self) -> Vec<PreparedDevice> {
        self.devices.iter().map(CheckpointDevice::prepared).collect()
    }
}

/// Where an adopted claim came from, and whether this plugin serves it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Adopted {
    /// The layout of NVIDIA's checkpoint it was read from (`v1`, `v2`).
    pub from: String,
    /// Why this plugin does not serve it (an MPS daemon, a VM or a MIG
    /// device NVIDIA's driver made): its devices stay taken and a repeated
    /// prepare is refused until the kubelet unprepares it, which removes
    /// its spec and record only. `None`: served like our own claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_served: Option<String>,
}

/// What a ComputeDomain claim holds on this node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainClaim {
    /// The ComputeDomain's UID (the config's `domainID`); a record holding
    /// anything else (a path) does not decode, so it is damaged.
    pub domain_uid: DomainUid,
    /// The claim's namespace, which is the domain's.
    pub namespace: String,
    pub kind: DomainClaimKind,
    /// IMEX channel ids given to the containers (empty for a daemon claim).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DomainClaimKind {
    Channel,
    Daemon,
}

impl DomainClaimKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Channel => "channel",
            Self::Daemon => "daemon",
        }
    }
}
