//! NVML inventory source (placeholder while being written).

use super::{DiscoveryError, Inventory, InventorySource};

/// Why NVML discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum NvmlDiscoveryError {
    #[error(
        "NVML is unavailable ({0}): run on a node with the NVIDIA driver installed, or pass --fake-inventory FILE to use a fake GPU inventory"
    )]
    LibraryUnavailable(String),
}

/// Discovers GPUs through NVML.
#[derive(Debug, Default)]
pub struct NvmlSource {}

impl InventorySource for NvmlSource {
    fn discover(&self) -> Result<Inventory, DiscoveryError> {
        Err(NvmlDiscoveryError::LibraryUnavailable("not yet implemented".into()).into())
    }
}

impl NvmlSource {
    pub fn new() -> Self {
        Self {}
    }
}
