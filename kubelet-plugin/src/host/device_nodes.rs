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

use gpu_dra_driver::cdi::DeviceNode;
use rustix::fs::{FileType, Mode, makedev, mknodat};

/// Creates the missing ones of `nodes` under `dev_root` (the directory the
/// host's `/` is at, for the plugin; node paths are absolute `/dev/...`).
/// Returns the paths created; a node that cannot be created (no
/// `CAP_MKNOD`, a read-only `/dev`) is logged and skipped: the container
/// runtime still creates it inside the container from the spec.
pub fn create_missing<'a>(dev_root: &Path, nodes: impl IntoIterator<Item = &'a DeviceNode>) -> Vec<PathBuf> {
    let mut created = Vec::new();
    for node in nodes {
        if node.node_type != "c" || !node.path.starts_with("/dev/") || node.path.contains("..") {
            continue;
        }
        let local = dev_root.join(node.path.trim_start_matches('/'));
        if std::fs::symlink_metadata(&local).is_ok() {
            continue;
        }
        let (Ok(major), Ok(minor)) = (u32::try_from(node.major), u32::try_from(node.minor)) else { continue };
        match make(&local, major, minor) {
            Ok(()) => {
                tracing::info!(path = %local.display(), major, minor, "created a missing device node");
                created.push(local);
            }
            Err(error) => {
                tracing::warn!(path = %local.display(), %error, "cannot create a missing device node; the container runtime will create it in the container");
            }
        }
    }
    created
}

fn make(path: &Path, major: u32, minor: u32) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    mknodat(rustix::fs::CWD, path, FileType::CharacterDevice, Mode::from_raw_mode(0o666), makedev(major, minor))?;
    // The umask narrowed it: set what nvidia-modprobe sets.
    rustix::fs::chmod(path, Mode::from_raw_mode(0o666))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

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
}
