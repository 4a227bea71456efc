//! The GPU DRA driver's pure core: the node's GPU inventory, the
//! ResourceSlices that publish it, and the CDI specs that hand devices to
//! containers. No async runtime and no network here; the binaries are the
//! edges.

pub mod allocator;
pub mod cdi;
pub mod driver_root;
pub mod inventory;
pub mod k8s_format;
pub mod names;
pub mod nesting;
pub mod opaque_config;
pub mod quantity;
pub mod selector;
pub mod slices;
pub mod version;
