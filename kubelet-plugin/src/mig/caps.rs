//! The `/dev/nvidia-caps/nvidia-cap<N>` minors of a MIG device just made,
//! read as NVIDIA's toolkit and driver read them: the `DeviceFileMinor`
//! line of `<proc>/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access`
//! and `.../gi<G>/ci<C>/access`, which the kernel driver creates with the
//! instance. Where those files cannot be read, the driver's table
//! `<proc>/driver/nvidia-caps/mig-minors` (every possible instance) says
//! the same.

use std::path::{Path, PathBuf};

use gpu_dra_driver::bounded_file::{self, Links};
use gpu_dra_driver::inventory::nvml::procfs;

use super::error::{CapFileError, Error};

/// A capability file is a few short lines.
const MAX_CAP_FILE: u64 = 4096;

/// The `DeviceFileMinor` of a capability file's text.
pub fn parse_device_file_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "DeviceFileMinor").then(|| value.trim().parse().ok()).flatten()
    })
}

fn access_file(proc_root: &Path, gpu_minor: u32, gi: u32, ci: Option<u32>) -> PathBuf {
    let mut path = proc_root.join(format!("driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"));
    if let Some(ci) = ci {
        path.push(format!("ci{ci}"));
    }
    path.join("access")
}

fn read_minor(path: &Path) -> Result<u32, CapFileError> {
    let text = bounded_file::read_to_string(path, MAX_CAP_FILE, Links::Follow)?;
    parse_device_file_minor(&text).ok_or_else(|| CapFileError::NoMinor(path.to_path_buf()))
}

/// The minors of GPU instance `gi` and its compute instance `ci` on GPU
/// `gpu_minor`: from the capability files, else from `mig-minors`.
pub fn read(proc_root: &Path, gpu_minor: u32, gi: u32, ci: u32) -> Result<(u32, u32), Error> {
    let files = read_minor(&access_file(proc_root, gpu_minor, gi, None))
        .and_then(|g| read_minor(&access_file(proc_root, gpu_minor, gi, Some(ci))).map(|c| (g, c)));
    match files {
        Ok(minors) => Ok(minors),
        Err(cause) => procfs::read_mig_minors(proc_root)
            .lookup(gpu_minor, gi, ci)
            .map(|m| (m.gpu_instance, m.compute_instance))
            .ok_or_else(|| Error::Caps {
                gpu_minor,
                gi,
                ci,
                cause,
                table: proc_root.join("driver/nvidia-caps/mig-minors"),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_file_minor_is_read_from_the_capability_file() {
        assert_eq!(parse_device_file_minor("DeviceFileMinor: 48\nDeviceFileMode: 292\n"), Some(48));
        assert_eq!(parse_device_file_minor("DeviceFileMode: 292\n"), None);
        assert_eq!(parse_device_file_minor("DeviceFileMinor: x\n"), None);
    }

    #[test]
    fn files_first_then_the_minors_table() {
        let tmp = tempfile::tempdir().unwrap();
        let gi = tmp.path().join("driver/nvidia/capabilities/gpu1/mig/gi2");
        std::fs::create_dir_all(gi.join("ci0")).unwrap();
        std::fs::write(gi.join("access"), "DeviceFileMinor: 156\n").unwrap();
        std::fs::write(gi.join("ci0/access"), "DeviceFileMinor: 157\n").unwrap();
        assert_eq!(read(tmp.path(), 1, 2, 0).ok(), Some((156, 157)));
        let error = read(tmp.path(), 1, 3, 0).unwrap_err().to_string();
        assert!(error.contains("gi3/ci0") && error.contains("mig-minors"), "{error}");
        std::fs::create_dir_all(tmp.path().join("driver/nvidia-caps")).unwrap();
        std::fs::write(
            tmp.path().join("driver/nvidia-caps/mig-minors"),
            "gpu1/gi3/access 165\ngpu1/gi3/ci0/access 166\n",
        )
        .unwrap();
        assert_eq!(read(tmp.path(), 1, 3, 0).ok(), Some((165, 166)));
    }
}
