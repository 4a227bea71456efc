//! The flag groups more than one part of the agent reads (which node, the
//! driver root, the host's /proc and /sys) and the errors of flags that do
//! not go together. Ground floor: imports nothing of this crate, so `host`
//! and the commands can read them without reaching up to [`crate::cli`].

use std::path::PathBuf;

use clap::Args;
use gpu_dra_driver::names::{DriverName, NodeName};

/// Which node and which GPUs.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Name of this node; also the name of its device pool.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: NodeName,
    /// DRA driver name: the ResourceSlices' driver, the attribute domain and
    /// the CDI vendor suffix. Keep NVIDIA's default for claims to port unchanged.
    #[arg(long, env = "DRIVER_NAME", default_value_t = DriverName::nvidia_default())]
    pub driver_name: DriverName,
    /// Read GPUs from this fake inventory YAML file instead of NVML (for
    /// nodes without GPUs; see examples/inventories/).
    #[arg(long, env = "FAKE_INVENTORY", value_name = "FILE")]
    pub fake_inventory: Option<PathBuf>,
    /// XIDs that leave a GPU allocatable, besides the ones NVIDIA attributes
    /// to applications (13, 31, 43, 45, 68, 109); comma-separated. On
    /// Kubernetes 1.35+ they are published with taint effect None, on 1.34
    /// not at all; every other XID taints its GPU NoSchedule.
    #[arg(long, env = "ADDITIONAL_XIDS_TO_IGNORE", value_delimiter = ',', value_name = "XID,...")]
    pub additional_xids_to_ignore: Vec<u32>,
    /// With the ConsumableShares gate (NVIDIA's): how GPUs and MIG devices
    /// are shared between claims, none of it enforced: `memory` (a claim
    /// takes the memory it asks for, all by default), `unlimited` (none by
    /// default), or a number N (at most N claims per device); `disabled`
    /// by default.
    #[arg(long, env = "CONSUMABLE_SHARES", default_value = "disabled", value_name = "MODE")]
    pub consumable_shares: gpu_dra_driver::slices::consumable_shares::SharesMode,
    /// With the DynamicMIG gate: which GPUs in MIG mode get their MIG
    /// devices made per claim. `auto`: those with no MIG instances (or only
    /// the plugin's own); `none`; or a comma-separated list of minor numbers
    /// and `GPU-` UUIDs. A GPU with instances an administrator made always
    /// stays as configured.
    #[arg(long, env = "DYNAMIC_MIG_GPUS", default_value = "auto", value_name = "auto|none|GPUS")]
    pub dynamic_mig_gpus: gpu_dra_driver::inventory::dynamic_mig::DynamicMigGpus,
}

impl NodeArgs {
    /// `--consumable-shares` and the ConsumableShares gate go together:
    /// either without the other is refused, where NVIDIA's plugin ignores
    /// the mode without the gate and publishes nothing shared.
    pub fn check_consumable_shares(&self, gates: gpu_dra_driver::feature_gates::FeatureGates) -> Result<(), ArgsError> {
        use gpu_dra_driver::feature_gates::Gate;
        use gpu_dra_driver::slices::consumable_shares::SharesMode;
        match (gates.enabled(Gate::ConsumableShares), self.consumable_shares) {
            (true, SharesMode::Disabled) => Err(ArgsError::SharesDisabled),
            (false, mode) if mode != SharesMode::Disabled => Err(ArgsError::SharesWithoutGate(mode)),
            _ => Ok(()),
        }
    }
}

/// Flags that parse one by one but do not go together, or a path that
/// must be absolute; each message says the fix.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error(
        "the ConsumableShares feature gate is on but --consumable-shares is disabled: set --consumable-shares to \
         memory, unlimited or a number of shares per device"
    )]
    SharesDisabled,
    #[error("--consumable-shares {0} needs --feature-gates ConsumableShares=true (NVIDIA's gate for it)")]
    SharesWithoutGate(gpu_dra_driver::slices::consumable_shares::SharesMode),
    #[error(
        "--gpus=false without --compute-domains serves no driver; fix: drop --gpus=false, or add --compute-domains to \
         serve ComputeDomains only"
    )]
    NoDriver,
    #[error("{flag} {} is not an absolute path; fix: pass an absolute path", dir.display())]
    RelativePath { flag: &'static str, dir: PathBuf },
}

/// Where the NVIDIA driver is installed, for what containers get from it.
#[derive(Debug, Clone, Args)]
pub struct DriverRootArgs {
    /// The NVIDIA driver's installation as this process sees it: `/` on a
    /// host install, `/run/nvidia/driver` where the GPU Operator installs a
    /// containerized driver (mounted e.g. at `/driver-root`). Its
    /// libraries, firmware, binaries and sockets are mounted into every
    /// prepared container. Default: `/` with NVML; none with
    /// --fake-inventory (a fake node has no driver to give).
    #[arg(long, env = "NVIDIA_DRIVER_ROOT", value_name = "DIR")]
    pub driver_root: Option<PathBuf>,
    /// The same directory as the host sees it, when this process sees it
    /// mounted elsewhere (specs name host paths) [default: --driver-root].
    #[arg(long, env = "HOST_DRIVER_ROOT", value_name = "DIR")]
    pub host_driver_root: Option<PathBuf>,
    /// Host path of NVIDIA's `nvidia-cdi-hook`, run by the container
    /// runtime to link the libraries' sonames and update the container's
    /// ld cache. Without it no hooks are written (a warning at start).
    #[arg(long, env = "NVIDIA_CDI_HOOK_PATH", value_name = "FILE")]
    pub nvidia_cdi_hook_path: Option<PathBuf>,
    /// `nvidia-cdi-hook` subcommands to leave out of specs, comma-separated
    /// (`enable-cuda-compat` for a hook binary older than NVIDIA Container
    /// Toolkit 1.17.5, which fails on subcommands it does not know).
    #[arg(long, env = "DISABLE_CDI_HOOKS", value_name = "NAMES", value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(gpu_dra_driver::cdi::HOOK_NAMES))]
    pub disable_cdi_hooks: Vec<String>,
    /// The driver's file sets every container gets, as
    /// `NVIDIA_DRIVER_CAPABILITIES` names them: `all`, or a comma-separated
    /// list of compute, utility, video and graphics. NVIDIA's driver gives
    /// all of them.
    #[arg(long, env = "DRIVER_CAPABILITIES", default_value = "all", value_name = "LIST")]
    pub driver_capabilities: gpu_dra_driver::driver_root::Capabilities,
}

/// Where the host's /proc and /sys are, for NVML discovery.
#[derive(Debug, Clone, Args)]
pub struct HostRootsArgs {
    /// Root of the host's /proc (device majors, MIG capability minors, boot id).
    #[arg(long, env = "PROC_ROOT", default_value = "/proc", value_name = "DIR")]
    pub proc_root: PathBuf,
    /// Root of the host's /sys (PCI topology, NUMA nodes).
    #[arg(long, env = "SYS_ROOT", default_value = "/sys", value_name = "DIR")]
    pub sys_root: PathBuf,
}
