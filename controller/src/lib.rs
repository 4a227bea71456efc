//! The controller as a library: the binary is argument parsing and
//! wiring, and the services are tested without a process. `simulate` and
//! the manifest reader are a crate of their own (`gpu-dra-simulate`), which
//! `kubectl gpu` uses too.

pub mod compute_domain;
pub mod service;
pub mod validate;
