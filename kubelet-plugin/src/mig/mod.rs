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
//! - [`crate::state::kill_point`] lets the crash tests stop the process between steps;
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
//! first and the instance's ids, UUID and caps minors once made; those
//! record types ([`crate::state::checkpoint::MigIntent`],
//! [`crate::state::checkpoint::MadeInstance`]) live with the checkpoint
//! that stores them.

pub mod caps;
pub mod control;
mod error;
pub mod ledger;
pub mod lifecycle;
#[cfg(target_os = "linux")]
pub mod nvml;
pub mod order;
pub mod ownership;
pub mod selection;
#[cfg(test)]
mod test_support;

pub use control::{MigControl, MigControlError, ObservedInstance};
pub use error::{CapFileError, Error};
