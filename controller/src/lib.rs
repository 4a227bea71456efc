//! The controller as a library: the binary is argument parsing and
//! wiring, and the services are tested without a process. `simulate` and
//! the manifest reader are a crate of their own (`gpu-dra-simulate`), which
//! `kubectl gpu` uses too.

// `args`, `events` and `leadership` are the ground floor: `service` and
// `compute_domain` both build on them, and they import neither.
pub mod args;
pub mod compute_domain;
pub(crate) mod events;
pub(crate) mod leadership;
pub mod service;
pub mod validate;
