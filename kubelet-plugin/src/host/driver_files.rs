//! The driver installation's edits for every claim's CDI spec, found once
//! at start from the driver-root flags.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use anyhow::Result;
use gpu_dra_driver::cdi::DriverEdits;
use gpu_dra_driver::driver_root::{self, DriverRoot};
use gpu_dra_driver::inventory::Inventory;

use gpu_dra_driver::inventory::nvml::NvmlSource;

use crate::flags::{DriverRootArgs, HostRootsArgs, NodeArgs};

/// NVML discovery on the host's /proc and /sys, from the driver root's
/// `libnvidia-ml` when `--driver-root` is given and has one (a
/// containerized driver's library matches its kernel module).
pub fn nvml_source(args: &DriverRootArgs, host: &HostRootsArgs) -> NvmlSource {
    let source = NvmlSource::new().with_proc_root(&host.proc_root).with_sys_root(&host.sys_root);
    let library = args
        .driver_root
        .as_ref()
        .and_then(|root| driver_root::local_library(&DriverRoot::new(root, None), "libnvidia-ml.so"));
    match library {
        Some(library) => {
            tracing::info!(library = %library.display(), "loading NVML from the driver root");
            source.with_library(library)
        }
        None => source,
    }
}

/// A binary of the driver root and the root's library directory, which
/// goes on its `LD_LIBRARY_PATH` (the plugin's own image lacks the
/// driver's libraries when the root is mounted elsewhere). Host resolves
/// the paths; `prepare` builds what runs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverTool {
    pub binary: PathBuf,
    pub library_dir: Option<PathBuf>,
}

/// `nvidia-smi` of the driver root, to set GPUs' time-slices and compute
/// modes, with the directory of the root's `libnvidia-ml`; none on a fake
/// inventory without an explicit --driver-root.
pub fn nvidia_smi(args: &DriverRootArgs, node: &NodeArgs) -> Option<DriverTool> {
    let root = match (&args.driver_root, &node.fake_inventory) {
        (Some(root), _) => root.clone(),
        (None, Some(_)) => return None,
        (None, None) => "/".into(),
    };
    let root = DriverRoot::new(root, None);
    let smi = driver_root::local_binary(&root, "nvidia-smi");
    if smi.is_none() {
        tracing::warn!("no nvidia-smi in the driver root: claims asking for time-slicing will fail");
    }
    let library_dir = driver_root::local_library(&root, "libnvidia-ml.so")
        .and_then(|lib| lib.parent().map(std::path::Path::to_path_buf));
    smi.map(|binary| DriverTool { binary, library_dir })
}

/// `nvidia-cuda-mps-control` of the driver root; none on a fake inventory
/// without an explicit --driver-root, or when the root has no MPS.
/// Found whatever the gates: claims prepared with MPS before a restart
/// with the gates off must still be torn down. `warn`: say so when
/// missing (a gate wants it).
pub fn mps_control(args: &DriverRootArgs, node: &NodeArgs, warn: bool) -> Option<DriverTool> {
    let root = match (&args.driver_root, &node.fake_inventory) {
        (Some(root), _) => root.clone(),
        (None, Some(_)) => return None,
        (None, None) => "/".into(),
    };
    local_mps_control(root, warn)
}

/// `nvidia-cuda-mps-control` of the driver root at `root`, with the
/// directory of the root's `libcuda`.
pub fn local_mps_control(root: PathBuf, warn: bool) -> Option<DriverTool> {
    let root = DriverRoot::new(root, None);
    let Some(binary) = driver_root::local_binary(&root, "nvidia-cuda-mps-control") else {
        if warn {
            tracing::warn!("no nvidia-cuda-mps-control in the driver root: claims asking for MPS will fail");
        }
        return None;
    };
    let library_dir =
        driver_root::local_library(&root, "libcuda.so").and_then(|lib| lib.parent().map(std::path::Path::to_path_buf));
    Some(DriverTool { binary, library_dir })
}

/// Discovers the driver's files for `inventory`'s driver version. A fake
/// inventory without an explicit --driver-root has no driver: no edits.
pub fn driver_edits(args: &DriverRootArgs, node: &NodeArgs, inventory: &Inventory) -> Result<DriverEdits> {
    let root = match (&args.driver_root, &node.fake_inventory) {
        (Some(root), _) => root.clone(),
        (None, Some(_)) => return Ok(DriverEdits::default()),
        (None, None) => "/".into(),
    };
    let root = DriverRoot::new(root, args.host_driver_root.clone());
    let files = driver_root::discover(&root, &inventory.driver_version.to_string(), args.driver_capabilities)?;
    let hook = args.nvidia_cdi_hook_path.as_ref().map(|p| p.to_string_lossy().into_owned());
    if hook.is_none() {
        tracing::warn!(
            "no --nvidia-cdi-hook-path: specs mount the driver's files but create no soname links and do not update the container's ld cache"
        );
    }
    tracing::info!(
        root = %root.root.display(),
        host_root = %root.host_root.display(),
        mounts = files.mounts.len(),
        links = files.links.len(),
        capabilities = %args.driver_capabilities,
        "driver files found"
    );
    Ok(DriverEdits::new(&files, hook.as_deref()).without_hooks(&args.disable_cdi_hooks))
}

/// The driver edits specs are written with, replaced when the driver
/// version changes (see [`follow_driver_version`]); readers take a snapshot.
#[derive(Debug, Clone, Default)]
pub struct SharedDriverEdits(Arc<RwLock<Arc<DriverEdits>>>);

impl SharedDriverEdits {
    pub fn new(edits: DriverEdits) -> Self {
        SharedDriverEdits(Arc::new(RwLock::new(Arc::new(edits))))
    }

    /// The current edits.
    pub fn get(&self) -> Arc<DriverEdits> {
        match self.0.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn set(&self, edits: DriverEdits) {
        match self.0.write() {
            Ok(mut guard) => *guard = Arc::new(edits),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(edits),
        }
    }
}

/// Discovers the driver's files again whenever the inventory reports a new
/// driver version (an upgrade under a running plugin), off the prepare
/// path: prepares keep the last good edits until the new ones are found. A
/// failed discovery is logged and the old edits stay.
pub async fn follow_driver_version(
    args: DriverRootArgs,
    node: NodeArgs,
    mut inventory: tokio::sync::watch::Receiver<Arc<Inventory>>,
    shared: SharedDriverEdits,
) {
    let mut version = inventory.borrow().driver_version.clone();
    while inventory.changed().await.is_ok() {
        let snapshot = Arc::clone(&inventory.borrow_and_update());
        if snapshot.driver_version == version {
            continue;
        }
        version = snapshot.driver_version.clone();
        let (args, node) = (args.clone(), node.clone());
        match tokio::task::spawn_blocking(move || driver_edits(&args, &node, &snapshot)).await {
            Ok(Ok(edits)) => {
                tracing::info!(%version, "driver version changed: driver files found again");
                shared.set(edits);
            }
            Ok(Err(error)) => {
                tracing::warn!(%version, error = %format!("{error:#}"), "driver version changed but its files were not found; specs keep the previous ones")
            }
            Err(error) => tracing::warn!(%error, "driver discovery did not finish"),
        }
    }
}
