//! Prepare and unprepare: turn an allocated ResourceClaim into a CDI spec
//! the container runtime reads, and take it away again, so that a SIGKILL
//! at any instant loses nothing and doubles nothing.
//!
//! The protocol for one claim (under the claim's lock and its devices'
//! locks):
//! 1. a completed record answers at once (idempotent repeat), its spec
//!    written again first if it went missing (kubernetes#141433);
//! 2. read the claim, check UID, allocation, pool, inventory, configs;
//!    refuse a device another claim holds exclusively;
//! 3. record `PrepareStarted` with the devices and the spec file name (and
//!    what sharing will change: time-slices, the MPS daemon), then make
//!    those changes;
//! 4. write the CDI spec (atomic);
//! 5. record `PrepareCompleted`; answer.
//!
//! A failure after step 3 rolls back (spec file, then record). A kill
//! leaves a `PrepareStarted` record, which start-up rolls back
//! ([`reconcile`]); the kubelet then retries and gets a fresh prepare. A
//! spec file is never written without a record that names it, so start-up
//! can delete any spec file no record owns.
//!
//! Where each part is: the preparer and its batches in `preparer.rs`, one
//! claim's prepare in `prepare_claim.rs` (its dynamic MIG devices in
//! `with_mig.rs`), its unprepare and roll-back in `unprepare_claim.rs`, a
//! claim's failure in `failure.rs`; this file only declares the modules
//! and re-exports what callers outside name.

pub mod adopt;
pub mod claims;
mod config;
pub mod configs;
pub mod dynamic_mig;
mod error;
pub mod failure;
mod files;
pub mod locks;
pub mod mps;
mod offload;
pub mod passthrough;
pub mod plan;
mod prepare_claim;
mod preparer;
pub mod reconcile;
mod reconcile_mig;
pub mod sharing;
pub mod types;
mod unprepare_claim;
mod with_mig;

pub use config::PreparerConfig;
pub use error::{OpenError, TaskError, UndoError};
pub use preparer::Preparer;
pub use reconcile::ReconcileReport;

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_mig;
#[cfg(test)]
mod tests_mps;
#[cfg(test)]
mod tests_vfio;
