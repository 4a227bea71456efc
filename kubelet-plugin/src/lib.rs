//! The node agent of the GPU DRA driver, as a library so that the binary is
//! only wiring and the integration suite can reach the same code.
//!
//! Grouped by concern: what the kubelet talks to (`kubelet_api`), what the
//! cluster is told (`publish`), what a claim does to the node (`prepare`),
//! what survives a crash (`state`), the node's driver installation
//! (`host`), what an operator reads (`observe`), dynamic MIG (`mig`),
//! ComputeDomains (`compute_domain`), VFIO passthrough (`vfio`), which
//! program a process runs (`process`, for the daemons the agent starts)
//! and the process's own heap (`heap`). The commands (`run`, `inspect`
//! for `print-slices` / `print-cdi`) sit on top, with the command line
//! (`cli`); the flag groups several parts read (`flags`), a kubelet
//! call's deadline (`deadline`) and what a prepared claim's devices are
//! (`prepared`) are on the ground floor.

pub mod claim_status;
pub mod cli;
pub mod compute_domain;
pub mod deadline;
pub mod flags;
pub mod heap;
pub mod host;
pub mod inspect;
pub mod kubelet_api;
pub mod mig;
pub mod observe;
pub mod prepare;
pub mod prepared;
pub mod process;
pub mod publish;
pub mod run;
pub mod state;
pub mod vfio;
