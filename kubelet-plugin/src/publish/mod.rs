//! What the cluster is told: ResourceSlices kept equal to the inventory,
//! and the watch that notices when the inventory changes.

pub mod inventory_watch;
pub mod publisher;
