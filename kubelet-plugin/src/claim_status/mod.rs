//! A claim's `status.devices` as the node agent writes it: the pure edits
//! (shared with the controller, [`gpu_dra_driver::claim_status`]), the
//! entries a prepare and an unprepare want ([`claim`]) and the write
//! ([`write`]). The pure edits keep their one path in the driver crate.

pub mod claim;
pub mod queue;
pub mod refusal;
pub mod write;
