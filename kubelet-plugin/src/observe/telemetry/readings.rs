//! The telemetry data itself: a device's identity and sample, who holds
//! it, and the snapshot they are joined into. Apart from `mod.rs` so the
//! modules that build and read snapshots take it as a sibling.

use std::collections::BTreeSet;
use std::sync::Arc;

/// A published device as an operator names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceIdentity {
    /// The DRA device name (`gpu-3`, `gpu-0-mig-1g10gb-19-0`).
    pub device: String,
    /// `GPU-…` for a whole GPU, `MIG-…` for a MIG device.
    pub uuid: String,
    /// The (parent) GPU's minor number: `/dev/nvidia<minor>`.
    pub gpu_minor: u32,
    /// NVML's product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    pub pci_bus_id: Option<String>,
    pub mig: Option<MigIdentity>,
}

/// What makes a MIG device one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigIdentity {
    /// NVIDIA's profile name, `1g.10gb`.
    pub profile: String,
    pub gpu_instance_id: u32,
    pub parent_uuid: String,
}

/// One device's readings at one instant; `None` where NVML has no number.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceSample {
    /// Percent of the last sample period a kernel ran.
    pub gpu_utilization_percent: Option<f64>,
    /// Percent of the period device memory was read or written.
    pub memory_utilization_percent: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub power_watts: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub sm_clock_mhz: Option<f64>,
    /// Volatile (since the driver loaded) corrected ECC errors.
    pub ecc_corrected_errors: Option<u64>,
    /// Volatile uncorrected ECC errors.
    pub ecc_uncorrected_errors: Option<u64>,
}

/// A prepared claim and the pods its `reservedFor` names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimHolder {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The pods of its `reservedFor` (in the claim's namespace), sorted by
    /// name; empty until read.
    pub pods: Vec<PodRef>,
}

impl ClaimHolder {
    /// The pods' names, comma-separated.
    pub fn pod_names(&self) -> String {
        self.pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(",")
    }
}

/// A pod reserving a claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub name: String,
    pub uid: String,
}

/// One device in a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReading {
    pub identity: DeviceIdentity,
    pub sample: DeviceSample,
    /// Critical XIDs the driver reported for the device (from the inventory).
    pub xids: Vec<u32>,
    /// Whether the device has any fault (XID, lost): the publisher taints it.
    pub faulty: bool,
    /// The prepared claims holding the device (several when shared).
    pub holders: Vec<Arc<ClaimHolder>>,
}

/// A claim flagged idle (see [`idle`]).
#[derive(Debug, Clone, PartialEq)]
pub struct IdleReport {
    pub claim: Arc<ClaimHolder>,
    pub devices: Vec<String>,
    pub average_percent: f64,
    pub window_seconds: u64,
}

/// Everything `/metrics` shows of telemetry, as of the last sampling pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Devices of the inventory, in its order.
    pub devices: Vec<DeviceReading>,
    pub prepared_claims: usize,
    pub idle: Vec<IdleReport>,
    /// How long the last NVML pass took; `None` before the first.
    pub sample_seconds: Option<f64>,
    /// UIDs of the claims refused series by the cap ([`super::series_cap`]): their
    /// devices' series carry no claim labels for them.
    pub unlabelled_claims: BTreeSet<String>,
}
