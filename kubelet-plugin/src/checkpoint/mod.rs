//! The preparer's checkpoint: one small file per claim under
//! `<state-dir>/checkpoint/<claimUID>.json`.
//!
//! One file per claim (NVIDIA keeps one file for all claims) means a write
//! touches only its own claim: concurrent prepares do not serialize on a
//! shared file, and a damaged file costs one claim, not the node.
//! Records are written before any side effect (`PrepareStarted`) and after
//! all of them (`PrepareCompleted`), and removed on unprepare; see
//! [`crate::prepare`] for the protocol and [`envelope`] for the format.

pub mod envelope;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use gpu_dra_driver::names::ClaimUid;

use crate::durable;
use crate::prepare::types::PreparedDevice;

/// Where a claim is in its prepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PrepareState {
    /// Side effects may have started; roll back unless completed.
    PrepareStarted,
    /// Everything is in place; `devices` is what the kubelet was told.
    PrepareCompleted,
}

/// One device of a checkpointed claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Admin access does not make the device busy for other claims.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
    /// The time-slice this claim set on the GPU (absent: none), so that the
    /// last claim to let go resets it, whatever crashed in between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slice: Option<TimeSlice>,
}

/// A GPU's time-slice interval as set through `nvidia-smi compute-policy`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlice {
    pub gpu_uuid: String,
    /// `--set-timeslice` value: 0 Default, 1 Short, 2 Medium, 3 Long.
    pub interval: u8,
}

/// One claim's MPS control daemon: where it lives, what it serves, the
/// limits it enforces, and (once started) which process it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemon {
    /// `<state-dir>/mps/<claimUID>`: holds `pipe/`, `log/` and `shm/` (a
    /// tmpfs), all created by prepare and removed by unprepare.
    pub root: PathBuf,
    /// The claim's devices (names) whose containers talk to the daemon.
    pub devices: Vec<String>,
    /// `CUDA_VISIBLE_DEVICES`: the GPU or MIG UUIDs the daemon serves.
    pub visible: Vec<String>,
    /// Whole GPUs set to `EXCLUSIVE_PROCESS` for the daemon (a MIG
    /// device's parent).
    pub gpus: Vec<String>,
    /// `set_default_active_thread_percentage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u8>,
    /// `set_default_device_pinned_mem_limit <uuid> <mib>M`, per device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned_limits: Vec<PinnedLimit>,
    /// The daemon process, once it answered; `None` before (start-up then
    /// finds it through the pid file in the pipe directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<DaemonProcess>,
}

/// A pinned device memory limit for one device of an MPS daemon.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinnedLimit {
    pub uuid: String,
    pub mib: u64,
}

/// A process as identified across restarts of the plugin: its pid and its
/// start time (field 22 of `/proc/<pid>/stat`), so that a recycled pid is
/// never mistaken for the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonProcess {
    pub pid: i32,
    pub start_time: u64,
}

impl MpsDaemon {
    pub fn pipe_dir(&self) -> PathBuf {
        self.root.join("pipe")
    }

    pub fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }

    pub fn shm_dir(&self) -> PathBuf {
        self.root.join("shm")
    }
}

impl CheckpointDevice {
    /// Whether no other claim may hold this device at the same time.
    pub fn is_exclusive(&self) -> bool {
        !self.admin_access && self.share_id.is_none()
    }

    pub fn prepared(&self) -> PreparedDevice {
        PreparedDevice {
            request_names: self.request_names.clone(),
            pool_name: self.pool_name.clone(),
            device_name: self.device_name.clone(),
            cdi_device_ids: self.cdi_device_ids.clone(),
            share_id: self.share_id.clone(),
        }
    }
}

/// What the checkpoint knows about one claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub state: PrepareState,
    /// `/proc/sys/kernel/random/boot_id` when written: after a reboot no
    /// container holds the devices any more, so the record is void.
    pub boot_id: String,
    /// The claim's CDI spec file name in the CDI directory, once chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdi_spec_file: Option<String>,
    #[serde(default)]
    pub devices: Vec<CheckpointDevice>,
    /// The claim's MPS control daemon, recorded (with everything it is
    /// made of) before any of it is created, so start-up can undo it or
    /// start it again whatever the crash interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsDaemon>,
}

impl ClaimRecord {
    /// Serde with unknown fields ignored (the derive's default), as a
    /// function so the intent is visible at the call site.
    fn deserialize_lenient(value: &serde_json::Value) -> Result<Self, String> {
        Self::deserialize(value).map_err(|e| e.to_string())
    }

    pub fn prepared_devices(&self) -> Vec<PreparedDevice> {
        self.devices.iter().map(CheckpointDevice::prepared).collect()
    }
}

use serde::Deserialize as _;

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint directory {path}: {error}")]
    Dir { path: PathBuf, error: io::Error },
    #[error("writing checkpoint file {path}: {error}")]
    Write { path: PathBuf, error: io::Error },
    #[error("removing checkpoint file {path}: {error}")]
    Remove { path: PathBuf, error: io::Error },
    #[error("encoding the checkpoint record of claim {uid}: {error}")]
    Encode { uid: String, error: serde_json::Error },
}

/// A record file that could not be used, kept aside for a person to look at.
#[derive(Debug)]
pub struct DamagedRecord {
    pub uid: String,
    pub path: PathBuf,
    pub reason: String,
}

/// What the checkpoint directory held at start.
#[derive(Debug, Default)]
pub struct Loaded {
    pub records: Vec<ClaimRecord>,
    pub damaged: Vec<DamagedRecord>,
    /// Leftover temporary files (a write killed half-way); safe to delete.
    pub temp_files: Vec<PathBuf>,
}

/// The checkpoint directory.
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    dir: PathBuf,
}

const RECORD_SUFFIX: &str = ".json";
/// Suffix given to a damaged record: kept, never read again.
pub const DAMAGED_SUFFIX: &str = ".damaged";

impl CheckpointDir {
    /// Opens (creating, mode 0700) `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        durable::create_dir(&dir, 0o700).map_err(|error| CheckpointError::Dir { path: dir.clone(), error })?;
        Ok(Self { dir })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn file_name(uid: &ClaimUid) -> String {
        format!("{uid}{RECORD_SUFFIX}")
    }

    /// Writes `record` atomically and durably.
    pub fn write(&self, uid: &ClaimUid, record: &ClaimRecord) -> Result<(), CheckpointError> {
        let bytes =
            envelope::encode(record).map_err(|error| CheckpointError::Encode { uid: uid.to_string(), error })?;
        let name = Self::file_name(uid);
        durable::write(&self.dir, &name, &bytes, 0o600)
            .map_err(|error| CheckpointError::Write { path: self.dir.join(&name), error })
    }

    /// Removes a claim's record durably; a missing one is fine.
    pub fn remove(&self, uid: &ClaimUid) -> Result<(), CheckpointError> {
        let name = Self::file_name(uid);
        durable::remove(&self.dir, &name)
            .map(|_| ())
            .map_err(|error| CheckpointError::Remove { path: self.dir.join(&name), error })
    }

    /// Reads every record. Unreadable ones are reported in `damaged`; a
    /// record whose `uid` does not match its file name counts as damaged.
    pub fn load(&self) -> Result<Loaded, CheckpointError> {
        let dir_error = |error| CheckpointError::Dir { path: self.dir.clone(), error };
        let mut loaded = Loaded::default();
        for entry in fs::read_dir(&self.dir).map_err(dir_error)? {
            let entry = entry.map_err(dir_error)?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else { continue };
            let path = entry.path();
            if name.starts_with('.') && name.ends_with(durable::TEMP_SUFFIX) {
                loaded.temp_files.push(path);
                continue;
            }
            let Some(uid) = name.strip_suffix(RECORD_SUFFIX) else { continue };
            let result = fs::read(&path)
                .map_err(|e| format!("reading: {e}"))
                .and_then(|bytes| envelope::decode(&bytes).map_err(|e| e.to_string()))
                .and_then(|record| {
                    if record.uid == uid {
                        Ok(record)
                    } else {
                        Err(format!("holds claim {} but is named after {uid}", record.uid))
                    }
                });
            match result {
                Ok(record) => loaded.records.push(record),
                Err(reason) => loaded.damaged.push(DamagedRecord { uid: uid.to_string(), path, reason }),
            }
        }
        loaded.records.sort_by(|a, b| a.uid.cmp(&b.uid));
        Ok(loaded)
    }

    /// Moves a damaged record aside (`<uid>.json.damaged`) so it is kept for
    /// inspection but no longer read.
    pub fn set_aside(&self, damaged: &DamagedRecord) -> Result<PathBuf, CheckpointError> {
        let mut target = damaged.path.clone().into_os_string();
        target.push(DAMAGED_SUFFIX);
        let target = PathBuf::from(target);
        fs::rename(&damaged.path, &target)
            .and_then(|()| durable::sync_dir(&self.dir))
            .map_err(|error| CheckpointError::Write { path: target.clone(), error })?;
        Ok(target)
    }
}

/// The node's boot id, `<proc-root>/sys/kernel/random/boot_id`.
pub fn boot_id(proc_root: &Path) -> io::Result<String> {
    let text = fs::read_to_string(proc_root.join("sys/kernel/random/boot_id"))?;
    Ok(text.trim().to_string())
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub fn record(uid: &str, devices: &[&str]) -> ClaimRecord {
        ClaimRecord {
            uid: uid.to_string(),
            namespace: "default".into(),
            name: "claim".into(),
            state: PrepareState::PrepareCompleted,
            boot_id: "boot-1".into(),
            cdi_spec_file: Some(format!("k8s.gpu.nvidia.com-claim_{uid}.json")),
            devices: devices
                .iter()
                .map(|d| CheckpointDevice {
                    request_names: vec!["gpu".into()],
                    pool_name: "node-a".into(),
                    device_name: d.to_string(),
                    cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={uid}-{d}")],
                    share_id: None,
                    admin_access: false,
                    time_slice: None,
                })
                .collect(),
            mps: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::record;
    use super::*;

    const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    #[test]
    fn write_load_remove() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(tmp.path().join("checkpoint")).unwrap();
        let uid = ClaimUid::new(UID).unwrap();
        let r = record(UID, &["gpu-0", "gpu-1"]);
        dir.write(&uid, &r).unwrap();
        let loaded = dir.load().unwrap();
        assert_eq!(loaded.records, vec![r]);
        assert!(loaded.damaged.is_empty());
        dir.remove(&uid).unwrap();
        dir.remove(&uid).unwrap();
        assert!(dir.load().unwrap().records.is_empty());
    }

    #[test]
    fn damaged_and_misnamed_records_are_reported_and_set_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(tmp.path()).unwrap();
        fs::write(tmp.path().join(format!("{UID}.json")), b"{\"version\":1,").unwrap();
        let other = "1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
        let bytes = envelope::encode(&record(UID, &["gpu-0"])).unwrap();
        fs::write(tmp.path().join(format!("{other}.json")), bytes).unwrap();
        fs::write(tmp.path().join(format!(".{UID}.json.1-0.tmp")), b"half").unwrap();
        let loaded = dir.load().unwrap();
        assert!(loaded.records.is_empty());
        assert_eq!(loaded.damaged.len(), 2);
        let misnamed = loaded.damaged.iter().find(|d| d.uid == other).unwrap();
        assert!(misnamed.reason.contains("is named after"), "{}", misnamed.reason);
        assert_eq!(loaded.temp_files.len(), 1);
        for d in &loaded.damaged {
            assert!(dir.set_aside(d).unwrap().exists());
        }
        let again = dir.load().unwrap();
        assert!(again.damaged.is_empty() && again.records.is_empty());
    }

    #[test]
    fn exclusivity() {
        let mut d = record(UID, &["gpu-0"]).devices.remove(0);
        assert!(d.is_exclusive());
        d.admin_access = true;
        assert!(!d.is_exclusive());
        d.admin_access = false;
        d.share_id = Some("s".into());
        assert!(!d.is_exclusive());
    }

    #[test]
    fn boot_id_is_trimmed() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("sys/kernel/random")).unwrap();
        fs::write(tmp.path().join("sys/kernel/random/boot_id"), "abc\n").unwrap();
        assert_eq!(boot_id(tmp.path()).unwrap(), "abc");
    }
}
