//! The driver installation's edits for every claim's CDI spec, found once
//! at start from the driver-root flags.

use anyhow::Result;
use gpu_dra_driver::cdi::DriverEdits;
use gpu_dra_driver::driver_root::{self, DriverRoot};
use gpu_dra_driver::inventory::Inventory;

use crate::cli::{DriverRootArgs, NodeArgs};

/// Discovers the driver's files for `inventory`'s driver version. A fake
/// inventory without an explicit --driver-root has no driver: no edits.
pub fn driver_edits(args: &DriverRootArgs, node: &NodeArgs, inventory: &Inventory) -> Result<DriverEdits> {
    let root = match (&args.driver_root, &node.fake_inventory) {
        (Some(root), _) => root.clone(),
        (None, Some(_)) => return Ok(DriverEdits::default()),
        (None, None) => "/".into(),
    };
    let root = DriverRoot::new(root, args.host_driver_root.clone());
    let files = driver_root::discover(&root, &inventory.driver_version.to_string())?;
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
        "driver files found"
    );
    Ok(DriverEdits::new(&files, hook.as_deref()))
}
