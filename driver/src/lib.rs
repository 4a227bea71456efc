//! The GPU DRA driver's GPU model: the node's GPU inventory, the
//! ResourceSlices that publish it, the opaque configs claims carry, and the
//! CDI specs that hand devices to containers. No async runtime and no
//! network here; the binaries are the edges. The one exception is behind
//! the `service` feature: the plumbing both binaries' services share (the
//! Kubernetes client, the health and metrics port), so that it is written
//! once. Kubernetes' DRA CEL environment (`dra_cel`, whose `Quantity` this
//! crate prints and reads) and the structured allocator (`dra_allocator`)
//! are crates of their own, with nothing GPU-specific in them.

pub mod bounded_file;
pub mod cdi;
pub mod claim_status;
pub mod compute_domain;
pub mod driver_root;
pub mod duration;
pub mod echo;
pub mod feature_gates;
pub mod inventory;
pub mod json_escapes;
pub mod k8s_format;
pub mod names;
pub mod nesting;
pub mod opaque_config;
pub mod printable;
pub mod safe_yaml;
#[cfg(feature = "service")]
pub mod service;
pub mod slices;
pub mod version;
