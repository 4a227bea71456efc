//! Device nodes a fresh node does not have yet.
//!
//! On a node whose driver was just loaded, `/dev/nvidia0`, `/dev/nvidiactl`
//! or `/dev/nvidia-uvm` may not exist until something runs `nvidia-smi` or
//! `nvidia-modprobe` (NVIDIA's DRA driver issue #1380: the first workload
//! on a new node fails). The plugin knows every node's major and minor
//! (from `/proc/devices` and NVML), so before a spec is written it creates
//! what is missing under the host's `/dev`: character devices, mode 0666,
//! as `nvidia-modprobe` makes them. Existing nodes are left as they are.

use std::path::{Path, PathBuf};

use gpu_dra_driver::bounded_file::Dir;
use gpu_dra_driver::cdi::DeviceNode;

/// Creates the missing ones of `nodes` under `dev_root` (the directory the
/// host's `/` is at, for the plugin; node paths are absolute `/dev/...`).
/// Returns the paths created; a node that cannot be created (no
/// `CAP_MKNOD`, a read-only `/dev`, a symlink on its way) is logged and
/// skipped: the container runtime still creates it inside the container
/// from the spec. Below `dev_root` no symlink is followed, so a forged link
/// (`/dev/nvidia-caps-imex-channels` -> `/etc`) cannot make a node elsewhere.
pub fn create_missing<'a>(dev_root: &Path, nodes: impl IntoIterator<Item = &'a DeviceNode>) -> Vec<PathBuf> {
    let mut created = Vec::new();
    for node in nodes {
        let Some(names) = node_names(node) else { continue };
        let local = names.iter().fold(dev_root.to_path_buf(), |path, name| path.join(name));
        let (Ok(major), Ok(minor)) = (u32::try_from(node.major), u32::try_from(node.minor)) else { continue };
        match make(dev_root, &names, major, minor) {
            Ok(true) => {
                tracing::info!(path = %local.display(), major, minor, "created a missing device node");
                created.push(local);
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(path = %local.display(), %error, "cannot create a missing device node; the container runtime will create it in the container");
            }
        }
    }
    created
}

/// The plain names of a character device's path under `/dev`, or `None`.
fn node_names(node: &DeviceNode) -> Option<Vec<&str>> {
    let rest = node.path.strip_prefix("/dev/")?;
    let names: Vec<&str> = std::iter::once("dev").chain(rest.split('/')).collect();
    let plain = names.iter().all(|n| !n.is_empty() && *n != "." && *n != "..");
    (node.node_type == "c" && plain).then_some(names)
}

/// Makes the node `names` (directories, then the node) below `root`;
/// `false` when something of that name is there already.
fn make(root: &Path, names: &[&str], major: u32, minor: u32) -> std::io::Result<bool> {
    let Some((node, dirs)) = names.split_last() else { return Ok(false) };
    let mut dir = Dir::open(root)?;
    for name in dirs {
        dir = dir.make_subdir(name, 0o755)?;
    }
    if dir.entry_stat(node)?.is_some() {
        return Ok(false);
    }
    dir.make_char_device(node, major, minor, 0o666)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    use rustix::fs::makedev;

    use super::*;

    #[test]
    fn missing_char_devices_are_created_and_existing_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        std::fs::write(root.path().join("dev/nvidiactl"), b"already here").unwrap();
        let nodes = [
            DeviceNode::char("/dev/nvidia3", 195, 3),
            DeviceNode::char("/dev/nvidiactl", 195, 255),
            DeviceNode::char("/dev/nvidia-caps/nvidia-cap12", 236, 12),
            DeviceNode::char("/dev/../etc/passwd", 1, 1),
        ];
        let created = create_missing(root.path(), &nodes);
        if rustix::process::geteuid().is_root() {
            assert_eq!(created.len(), 2, "{created:?}");
            let meta = std::fs::metadata(root.path().join("dev/nvidia3")).unwrap();
            assert!(meta.file_type().is_char_device());
            assert_eq!(meta.rdev(), makedev(195, 3));
            assert_eq!(meta.permissions().mode() & 0o777, 0o666);
            assert!(
                std::fs::metadata(root.path().join("dev/nvidia-caps/nvidia-cap12"))
                    .unwrap()
                    .file_type()
                    .is_char_device()
            );
        } else {
            assert!(created.is_empty(), "without CAP_MKNOD nothing is created, and nothing fails");
        }
        assert_eq!(std::fs::read(root.path().join("dev/nvidiactl")).unwrap(), b"already here");
        assert!(!root.path().join("etc/passwd").exists());
    }

    #[test]
    fn a_symlink_on_the_way_is_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dev/nvidia-caps-imex-channels")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("nvidia9"), root.path().join("dev/nvidia9")).unwrap();
        let nodes = [
            DeviceNode::char("/dev/nvidia-caps-imex-channels/channel0", 234, 0),
            DeviceNode::char("/dev/nvidia9", 195, 9),
        ];
        let created = create_missing(root.path(), &nodes);
        assert!(created.is_empty(), "{created:?}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "nothing made outside");
    }
}
