//! Which processes hold a GPU open, so that a GPU in use is never taken
//! from its driver: NVIDIA's driver waits, before unbinding, until `fuser
//! /dev/nvidia<minor>` finds nobody (`waitForGPUFree` in their
//! `cmd/gpu-kubelet-plugin/vfio-device.go`); this reads what `fuser` reads,
//! each process's open files (`/proc/<pid>/fd/*`, proc(5)), without
//! running a program.

use std::fs;
use std::io;
use std::path::PathBuf;

/// Finds the processes that have a GPU's device node open.
pub trait GpuHolders: Send + Sync {
    /// The pids holding `/dev/nvidia<minor>` open.
    fn holders(&self, minor: u32) -> io::Result<Vec<u32>>;
}

/// The host's processes, under `--proc-root`.
#[derive(Debug, Clone)]
pub struct ProcHolders {
    pub proc_root: PathBuf,
}

impl GpuHolders for ProcHolders {
    fn holders(&self, minor: u32) -> io::Result<Vec<u32>> {
        let node = PathBuf::from(format!("/dev/nvidia{minor}"));
        let mut pids = Vec::new();
        for entry in fs::read_dir(&self.proc_root)? {
            let Ok(entry) = entry else { continue };
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            // A process that ended, or one we may not look into, holds
            // nothing we could see; fuser skips them alike.
            let Ok(fds) = fs::read_dir(entry.path().join("fd")) else { continue };
            let holds = fds.filter_map(Result::ok).any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == node));
            if holds {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        Ok(pids)
    }
}

/// Why a GPU was not taken from its driver.
#[derive(Debug, thiserror::Error)]
pub enum HeldError {
    #[error(
        "GPU gpu-{minor} (/dev/nvidia{minor}) is still open in process(es) {pids:?} after {waited:?}: a GPU in use is \
         never unbound from its driver; stop what uses it (a container of another claim, or a process on the host) \
         and the kubelet's retry passes it through"
    )]
    Held { minor: u32, pids: Vec<u32>, waited: std::time::Duration },
    #[error("looking for the processes that hold GPU gpu-{minor} open: {error}")]
    Io { minor: u32, error: io::Error },
}

/// Waits, polling within `timing`, until no process holds GPU `minor`.
pub fn wait_free(holders: &dyn GpuHolders, minor: u32, timing: super::switch::Timing) -> Result<(), HeldError> {
    let start = std::time::Instant::now();
    loop {
        let pids = holders.holders(minor).map_err(|error| HeldError::Io { minor, error })?;
        if pids.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= timing.timeout {
            return Err(HeldError::Held { minor, pids, waited: timing.timeout });
        }
        std::thread::sleep(timing.poll);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_processes_with_the_gpus_node_open_and_no_others() {
        let proc = tempfile::tempdir().unwrap();
        let open = |pid: &str, fd: &str, target: &str| {
            let dir = proc.path().join(pid).join("fd");
            fs::create_dir_all(&dir).unwrap();
            std::os::unix::fs::symlink(target, dir.join(fd)).unwrap();
        };
        open("41", "3", "/dev/nvidia0");
        open("41", "4", "/dev/nvidiactl");
        open("7", "9", "/dev/nvidia0");
        open("8", "9", "/dev/nvidia01");
        open("9", "1", "/dev/nvidia1");
        fs::create_dir_all(proc.path().join("self/fd")).unwrap();
        fs::create_dir_all(proc.path().join("12")).unwrap();
        let holders = ProcHolders { proc_root: proc.path().to_path_buf() };
        assert_eq!(holders.holders(0).unwrap(), [7, 41]);
        assert_eq!(holders.holders(1).unwrap(), [9]);
        assert!(holders.holders(2).unwrap().is_empty());
    }
}
