//! ComputeDomains: an IMEX domain across the nodes of one multi-node NVLink
//! fabric clique (GB200/GB300 NVL72 racks), with NVIDIA's API so that its
//! manifests apply unchanged.
//!
//! Pure parts shared by the controller and the node agent: the custom
//! resource and the opaque configs ([`api`]), the devices the node agent
//! publishes under the `compute-domain.nvidia.com` driver ([`devices`]),
//! and the IMEX daemon's files and answers ([`imex`]).

pub mod api;
pub mod binding;
mod constants;
pub mod devices;
pub mod imex;

pub use constants::{CHANNEL_CLASS, DAEMON_CLASS, DOMAIN_LABEL, DRIVER_NAME, FINALIZER, MAX_NODES_PER_DOMAIN};
