//! The controller as a library: the binary is argument parsing and
//! wiring, and other tools of the driver reuse the same code (`kubectl gpu`
//! runs `simulate` on objects read from a live cluster, so its explanations
//! are simulate's, word for word).

pub mod compute_domain;
pub mod manifests;
pub mod service;
pub mod simulate;
pub mod validate;
