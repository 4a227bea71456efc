//! Dynamic MIG on the node: MIG devices made at prepare and removed at
//! unprepare, on the GPUs the plugin manages dynamically.
//!
//! - [`order`] is pure: which instances a claim makes and in what order,
//!   what conflicts, what start-up must destroy or make again;
//! - [`control`] is the NVML side ([`MigControl`]; [`nvml`] on a node,
//!   through NVML calls nvml-wrapper 0.13 lacks, written by hand);
//! - [`caps`] reads the new instance's `/dev/nvidia-caps` minors;
//! - [`lifecycle`] runs the steps with the checkpoint discipline of
//!   [`crate::prepare`]: record the intent, make, record the result;
//! - [`kill_point`] lets the crash tests stop the process between steps;
//! - [`ledger`] records, durably and as it happens, what the plugin made
//!   (and which GPUs it took out of MIG mode), per claim;
//! - [`ownership`] decides from the ledger and NVML, never from a record,
//!   which instances are the plugin's (the only ones ever destroyed) and
//!   whether a record agrees with what was made;
//! - [`selection`] decides which MIG-mode GPUs are dynamic (used by
//!   publishing and prepare alike), from the instances the ledger holds.
//!
//! A dynamic MIG device is identified by its GPU and placement: no two GPU
//! instances of one GPU overlap, so (GPU, profile, placement) names exactly
//! one instance, before and after it exists. Records hold that identity
//! first and the instance's ids, UUID and caps minors once made.

pub mod caps;
pub mod control;
mod error;
/// The crash tests' kill points, shared with the other prepares
/// ([`crate::state::kill_point`]); re-exported so MIG's steps keep their path.
pub use crate::state::kill_point;
pub mod ledger;
pub mod lifecycle;
#[cfg(target_os = "linux")]
pub mod nvml;
pub mod order;
pub mod ownership;
pub mod selection;

pub use control::{MigControl, MigControlError, ObservedInstance};
pub use error::{CapFileError, Error};

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

    /// Whether an instance NVML reports is this one.
    pub fn is(&self, observed: &ObservedInstance) -> bool {
        observed.profile_id == self.profile_id && observed.placement == self.placement()
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
