//! GPU sharing applied at prepare: time-slicing, as NVIDIA's plugin sets
//! it (`nvidia-smi -i <uuid> -c DEFAULT`, then `nvidia-smi compute-policy
//! -i <uuid> --set-timeslice <0..3>`), and reset to the default when the
//! last claim that set it lets go.
//!
//! What is set is recorded in the claim's checkpoint record before it is
//! set, so a crash at any step is undone (interrupted prepare) or kept and
//! re-applied (completed claim) at start; see `reconcile`.

use std::fmt;
use std::path::PathBuf;
use std::process::Command;

use gpu_dra_driver::inventory::Inventory;
use gpu_dra_driver::opaque_config::{DeviceConfig, INTERVALS, ResolvedConfig};

use super::plan::PlannedDevice;
use crate::state::checkpoint::{ClaimRecord, TimeSlice};

/// What changes a GPU's scheduling: `nvidia-smi` on a node, a recorder in
/// tests.
pub trait GpuControl: Send + Sync + fmt::Debug {
    fn set_time_slice(&self, gpu_uuid: &str, interval: u8) -> Result<(), GpuControlError>;
    fn reset_time_slice(&self, gpu_uuid: &str) -> Result<(), GpuControlError> {
        self.set_time_slice(gpu_uuid, 0)
    }
    /// `nvidia-smi -i <uuid> -c <mode>`: `EXCLUSIVE_PROCESS` for an MPS
    /// daemon (only it talks to the GPU), `DEFAULT` again afterwards.
    fn set_compute_mode(&self, gpu_uuid: &str, mode: ComputeMode) -> Result<(), GpuControlError>;
}

/// Why `nvidia-smi` did not change a GPU's setting.
#[derive(Debug, thiserror::Error)]
pub enum GpuControlError {
    #[error("running {}: {source}", program.display())]
    Run { program: PathBuf, source: std::io::Error },
    /// `command` is the whole command line; `said` its output.
    #[error("{command} failed ({status}): {said}")]
    Failed { command: String, status: std::process::ExitStatus, said: String },
}

/// Why a claim's time-slicing cannot be applied as asked.
#[derive(Debug, thiserror::Error)]
pub enum TimeSliceError {
    #[error("device {0} is not on this node")]
    NotOnNode(String),
    /// Another prepared claim time-slices the GPU at another interval.
    #[error(
        "GPU {gpu} is time-sliced {} for ResourceClaim {their_claim} and {} for ResourceClaim {our_claim}: a GPU has \
         one time-slice; give both claims the same interval",
        interval_name(*theirs),
        interval_name(*ours)
    )]
    OtherInterval { gpu: String, theirs: u8, their_claim: String, ours: u8, our_claim: String },
}

/// The compute modes the plugin sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    Default,
    ExclusiveProcess,
}

impl ComputeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "DEFAULT",
            Self::ExclusiveProcess => "EXCLUSIVE_PROCESS",
        }
    }
}

/// `nvidia-smi` from the driver root.
#[derive(Debug, Clone)]
pub struct NvidiaSmi {
    path: PathBuf,
    /// The driver root's library directory, for `LD_LIBRARY_PATH`:
    /// `nvidia-smi` loads `libnvidia-ml.so.1`, which the plugin's own image
    /// does not have when the driver root is mounted elsewhere.
    library_dir: Option<PathBuf>,
}

impl NvidiaSmi {
    pub fn new(path: PathBuf, library_dir: Option<PathBuf>) -> Self {
        NvidiaSmi { path, library_dir }
    }

    /// The driver root's `nvidia-smi`, as [`crate::host::driver_files`]
    /// found it.
    pub fn from_driver(tool: crate::host::driver_files::DriverTool) -> Self {
        Self::new(tool.binary, tool.library_dir)
    }

    fn run(&self, args: &[&str]) -> Result<(), GpuControlError> {
        let mut command = Command::new(&self.path);
        if let Some(dir) = &self.library_dir {
            command.env("LD_LIBRARY_PATH", dir);
        }
        let output = command
            .args(args)
            .output()
            .map_err(|source| GpuControlError::Run { program: self.path.clone(), source })?;
        if output.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&output.stdout);
        let complained = String::from_utf8_lossy(&output.stderr);
        Err(GpuControlError::Failed {
            command: format!("{} {}", self.path.display(), args.join(" ")),
            status: output.status,
            said: format!("{said} {complained}").trim().to_owned(),
        })
    }
}

impl GpuControl for NvidiaSmi {
    fn set_time_slice(&self, gpu_uuid: &str, interval: u8) -> Result<(), GpuControlError> {
        self.run(&["-i", gpu_uuid, "-c", "DEFAULT"])?;
        self.run(&["compute-policy", "-i", gpu_uuid, "--set-timeslice", &interval.to_string()])
    }

    fn set_compute_mode(&self, gpu_uuid: &str, mode: ComputeMode) -> Result<(), GpuControlError> {
        self.run(&["-i", gpu_uuid, "-c", mode.as_str()])
    }
}

/// The time-slice each planned device gets from its config (`None`: no
/// time-slicing; MIG devices have no interval).
pub fn time_slices(
    planned: &[PlannedDevice],
    resolved: &[ResolvedConfig],
    inventory: &Inventory,
) -> Result<Vec<Option<TimeSlice>>, TimeSliceError> {
    planned
        .iter()
        .zip(resolved)
        .map(|(device, config)| {
            let DeviceConfig::Gpu(gpu) = &config.config else { return Ok(None) };
            let Some(sharing) = gpu.sharing.as_ref().filter(|s| s.strategy == "TimeSlicing") else {
                return Ok(None);
            };
            let name = sharing.time_slicing_config.as_ref().and_then(|t| t.interval.as_deref()).unwrap_or("Default");
            let interval = INTERVALS.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v);
            let gpu_uuid = inventory
                .find_device(&device.device)
                .map(|d| d.gpu().uuid.clone())
                .ok_or_else(|| TimeSliceError::NotOnNode(device.device.to_string()))?;
            Ok(Some(TimeSlice { gpu_uuid, interval }))
        })
        .collect()
}

fn interval_name(interval: u8) -> &'static str {
    INTERVALS.iter().find(|(_, v)| *v == interval).map_or("Default", |(n, _)| n)
}

/// Refuses to time-slice a GPU that another prepared claim time-slices at
/// another interval: one GPU has one setting.
pub fn check_agreement<'a>(
    uid: &str,
    namespace: &str,
    name: &str,
    slices: &[Option<TimeSlice>],
    others: impl Iterator<Item = &'a ClaimRecord>,
) -> Result<(), TimeSliceError> {
    for other in others.filter(|r| r.uid != uid) {
        for theirs in other.devices.iter().filter_map(|d| d.time_slice.as_ref()) {
            if let Some(ours) =
                slices.iter().flatten().find(|s| s.gpu_uuid == theirs.gpu_uuid && s.interval != theirs.interval)
            {
                return Err(TimeSliceError::OtherInterval {
                    gpu: theirs.gpu_uuid.clone(),
                    theirs: theirs.interval,
                    their_claim: format!("{}/{}", other.namespace, other.name),
                    ours: ours.interval,
                    our_claim: format!("{namespace}/{name}"),
                });
            }
        }
    }
    Ok(())
}

/// The GPUs of `record` whose time-slice no other record still needs:
/// those to reset when `record` goes.
pub fn to_reset<'a>(record: &ClaimRecord, others: impl Iterator<Item = &'a ClaimRecord> + Clone) -> Vec<String> {
    let mut gpus: Vec<String> = Vec::new();
    for slice in record.devices.iter().filter_map(|d| d.time_slice.as_ref()) {
        let still_needed = others
            .clone()
            .filter(|r| r.uid != record.uid)
            .any(|r| r.devices.iter().any(|d| d.time_slice.as_ref().is_some_and(|s| s.gpu_uuid == slice.gpu_uuid)));
        if !still_needed && !gpus.contains(&slice.gpu_uuid) {
            gpus.push(slice.gpu_uuid.clone());
        }
    }
    gpus
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Mutex;

    use crate::prepare::sharing::{ComputeMode, GpuControl, GpuControlError};

    /// Records every call, as `set <uuid> <interval>` or `mode <uuid>
    /// <MODE>`.
    #[derive(Debug, Default)]
    pub struct Recorder {
        pub calls: Mutex<Vec<String>>,
    }

    impl GpuControl for Recorder {
        fn set_time_slice(&self, gpu_uuid: &str, interval: u8) -> Result<(), GpuControlError> {
            self.calls.lock().unwrap().push(format!("set {gpu_uuid} {interval}"));
            Ok(())
        }

        fn set_compute_mode(&self, gpu_uuid: &str, mode: ComputeMode) -> Result<(), GpuControlError> {
            self.calls.lock().unwrap().push(format!("mode {gpu_uuid} {}", mode.as_str()));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::checkpoint::test_support::record;

    fn sliced(uid: &str, gpu: &str, interval: u8) -> ClaimRecord {
        let mut r = record(uid, &["gpu-0"]);
        r.devices[0].time_slice = Some(TimeSlice { gpu_uuid: gpu.into(), interval });
        r
    }

    #[test]
    fn one_gpu_has_one_time_slice() {
        let theirs = sliced("a", "GPU-0", 3);
        let same = [Some(TimeSlice { gpu_uuid: "GPU-0".into(), interval: 3 })];
        assert!(check_agreement("b", "ns", "b", &same, [&theirs].into_iter()).is_ok());
        let other = [Some(TimeSlice { gpu_uuid: "GPU-0".into(), interval: 1 })];
        let err = check_agreement("b", "ns", "b", &other, [&theirs].into_iter()).unwrap_err().to_string();
        assert!(err.contains("Long for ResourceClaim default/claim and Short for ResourceClaim ns/b"), "{err}");
    }

    #[test]
    fn the_last_claim_to_let_go_resets() {
        let a = sliced("a", "GPU-0", 2);
        let b = sliced("b", "GPU-0", 2);
        assert!(to_reset(&a, [&a, &b].into_iter()).is_empty());
        assert_eq!(to_reset(&a, [&a].into_iter()), vec!["GPU-0".to_owned()]);
    }
}
