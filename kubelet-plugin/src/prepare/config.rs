//! What the preparer is configured with. Apart from `mod.rs` so the
//! prepare steps (passthrough, reconcile) read it as a sibling.

use std::path::PathBuf;
use std::sync::Arc;

use gpu_dra_driver::feature_gates::FeatureGates;
use gpu_dra_driver::names::{DriverName, NodeName};

use super::{mps, sharing};

/// Where the preparer keeps its files, and who it is.
#[derive(Debug, Clone)]
pub struct PreparerConfig {
    pub driver: DriverName,
    pub node: NodeName,
    /// The CDI spec directory the container runtime reads (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// `<state-dir>/checkpoint`.
    pub checkpoint_dir: PathBuf,
    /// The node's current boot id; records from another boot are void.
    pub boot_id: String,
    /// What every spec gets from the driver installation.
    pub driver_edits: crate::host::driver_files::SharedDriverEdits,
    /// Where the host's `/` is, to create device nodes a fresh node lacks;
    /// `None`: leave `/dev` alone (fake inventories).
    pub dev_root: Option<PathBuf>,
    /// Which sharing strategies claims may ask for.
    pub gates: FeatureGates,
    /// Sets GPUs' time-slices (`nvidia-smi` from the driver root); `None`
    /// when there is no driver root, and time-slicing is refused.
    pub gpu_control: Option<Arc<dyn sharing::GpuControl>>,
    /// Where claims' MPS daemons live: `<state-dir>/mps/<claimUID>`.
    pub mps_dir: PathBuf,
    /// Runs `nvidia-cuda-mps-control` from the driver root; `None` when
    /// there is none, and MPS is refused.
    pub mps_host: Option<Arc<dyn mps::host::MpsHost>>,
    pub mps_timeouts: mps::lifecycle::Timeouts,
    /// Makes and destroys dynamic MIG devices (NVML); `None` on a fake
    /// inventory, where dynamic MIG devices are refused at prepare.
    pub mig: Option<crate::mig::lifecycle::MigHost>,
    /// Told the MIG instances prepared claims own after every change, so a
    /// re-read inventory keeps their GPUs dynamic.
    pub selection: Option<Arc<crate::mig::selection::DynamicMigSelection>>,
    /// Switches passed-through GPUs between `nvidia` and `vfio-pci`
    /// (sysfs); `None` on a fake inventory, where they are refused.
    pub vfio: Option<crate::vfio::VfioHost>,
    /// NVIDIA's plugin directory (`<plugins-dir>/gpu.nvidia.com`), whose
    /// `checkpoint.json` start-up adopts (see [`super::adopt`]); `None`: none.
    pub nvidia_dir: Option<PathBuf>,
}
