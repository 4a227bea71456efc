//! The node's GPUs from NVML, the NVIDIA Management Library.
//!
//! nvml-wrapper's safe API reports identity, memory, PCI, NVLink state and
//! MIG mode; [`ext`] adds what it lacks or gets wrong (MIG instance ids,
//! placements and profile names, the NVLink remote type, fabric cliques).
//! Files under `/proc` and `/sys` ([`procfs`]) add what NVML does not know:
//! dynamic device majors, MIG capability minors, PCIe root and NUMA node.
//!
//! Discovery fails only when NVML cannot be loaded or cannot report
//! node-wide facts (driver version, GPU count). Per GPU it is forgiving: a
//! GPU whose identity cannot be read is skipped with a warning, a lost GPU
//! is kept with [`Fault::Lost`](super::Fault::Lost), and optional facts
//! (NUMA node, PCIe root, NVLink group, clique) degrade to `None`.
//!
//! nvml-wrapper's MIG and minor-number calls exist only on Linux; elsewhere
//! discovery reports the library as unavailable.

mod error;
#[cfg(target_os = "linux")]
pub mod ext;
#[cfg(target_os = "linux")]
mod gpus;
#[cfg(target_os = "linux")]
mod mig;
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub mod names;
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub mod procfs;

use std::path::{Path, PathBuf};

pub use error::NvmlDiscoveryError;

use super::model::Inventory;

/// Discovers the node's GPUs through NVML, reading `/proc` and `/sys` under
/// configurable roots (defaults `/proc` and `/sys`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlSource {
    proc_root: PathBuf,
    sys_root: PathBuf,
    /// `libnvidia-ml.so.1` to load instead of the loader's search (the one
    /// under the driver root).
    library: Option<PathBuf>,
}

impl Default for NvmlSource {
    fn default() -> Self {
        Self::new()
    }
}

impl NvmlSource {
    pub fn new() -> Self {
        Self { proc_root: PathBuf::from("/proc"), sys_root: PathBuf::from("/sys"), library: None }
    }

    /// Loads NVML from this file (the driver root's `libnvidia-ml.so.1`).
    pub fn with_library(mut self, path: impl Into<PathBuf>) -> Self {
        self.library = Some(path.into());
        self
    }

    /// Initializes NVML from the configured library, else the loader's.
    pub fn init_nvml(&self) -> Result<nvml_wrapper::Nvml, nvml_wrapper::error::NvmlError> {
        match &self.library {
            Some(path) => nvml_wrapper::Nvml::builder().lib_path(path.as_os_str()).init(),
            None => nvml_wrapper::Nvml::init(),
        }
    }

    /// Reads `devices` and `driver/nvidia-caps/mig-minors` under `root`
    /// instead of `/proc` (e.g. a host's `/proc` mounted elsewhere).
    pub fn with_proc_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.proc_root = root.into();
        self
    }

    /// Reads `bus/pci/devices/<bdf>` under `root` instead of `/sys`.
    pub fn with_sys_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.sys_root = root.into();
        self
    }

    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    pub fn sys_root(&self) -> &Path {
        &self.sys_root
    }

    #[cfg(target_os = "linux")]
    pub(super) fn discover_nvml(&self) -> Result<Inventory, NvmlDiscoveryError> {
        let nvml = self.init_nvml().map_err(|e| NvmlDiscoveryError::LibraryUnavailable(e.to_string()))?;
        gpus::inventory(&nvml, &self.proc_root, &self.sys_root)
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn discover_nvml(&self) -> Result<Inventory, NvmlDiscoveryError> {
        Err(NvmlDiscoveryError::LibraryUnavailable("NVML discovery is implemented for Linux only".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{DiscoveryError, InventorySource};

    #[test]
    fn roots_default_to_the_host_and_can_move() {
        let source = NvmlSource::new();
        assert_eq!((source.proc_root(), source.sys_root()), (Path::new("/proc"), Path::new("/sys")));
        assert_eq!(NvmlSource::default(), source);
        let moved = source.with_proc_root("/host/proc").with_sys_root("/host/sys");
        assert_eq!((moved.proc_root(), moved.sys_root()), (Path::new("/host/proc"), Path::new("/host/sys")));
    }

    #[test]
    fn without_nvml_discovery_says_how_to_proceed() {
        match NvmlSource::new().discover() {
            Err(DiscoveryError::Nvml(error @ NvmlDiscoveryError::LibraryUnavailable(_))) => {
                let message = error.to_string();
                assert!(message.contains("--fake-inventory"), "{message}");
                assert!(message.contains("NVIDIA driver"), "{message}");
            }
            // A GPU node (or one with the library but no driver loaded
            // reports LibraryUnavailable above): nothing to assert.
            other => {
                #[cfg(target_os = "linux")]
                assert!(nvml_wrapper::Nvml::init().is_ok(), "NVML does not initialize, yet discovery gave {other:?}");
                #[cfg(not(target_os = "linux"))]
                panic!("expected LibraryUnavailable, got {other:?}");
            }
        }
    }
}
