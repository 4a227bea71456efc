//! The record format of a dynamic MIG device, as the checkpoint stores it:
//! what [`crate::mig`] makes and destroys, kept here so the checkpoint's
//! types depend on nothing above it.

use gpu_dra_driver::inventory::Placement;

/// What one dynamic MIG device is: enough to make it, find it and destroy
/// it again, whatever became of the process that made it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigIntent {
    /// The parent GPU (`GPU-...`).
    pub gpu_uuid: String,
    pub gpu_minor: u32,
    /// NVIDIA's profile name, e.g. `4g.40gb`.
    pub profile: String,
    /// NVML GPU-instance profile id.
    pub profile_id: u32,
    /// NVML `NVML_COMPUTE_INSTANCE_PROFILE_*` index of the compute instance
    /// spanning the GPU instance.
    pub compute_profile_index: u32,
    pub placement_start: u32,
    pub placement_size: u32,
}

impl MigIntent {
    pub fn placement(&self) -> Placement {
        Placement { start: self.placement_start, size: self.placement_size }
    }

    /// Whether `other` would occupy any memory slice this one does.
    pub fn overlaps(&self, other: &MigIntent) -> bool {
        self.gpu_uuid == other.gpu_uuid && self.placement().overlaps(other.placement())
    }
}

/// A MIG device as made: what the CDI spec and the MPS daemon need.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MadeInstance {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// `MIG-...`.
    pub uuid: String,
    /// Minors of `/dev/nvidia-caps/nvidia-cap<N>` for the GPU instance and
    /// the compute instance.
    pub gpu_instance_cap: u32,
    pub compute_instance_cap: u32,
}
