//! The preparer's checkpoint: one small file per claim under
//! `<state-dir>/checkpoint/<claimUID>.json`.
//!
//! One file per claim (NVIDIA keeps one file for all claims) means a write
//! touches only its own claim: concurrent prepares do not serialize on a
//! shared file, and a damaged file costs one claim, not the node.
//! Records are written before any side effect (`PrepareStarted`) and after
//! all of them (`PrepareCompleted`), and removed on unprepare; see
//! [`crate::prepare`] for the protocol and [`envelope`] for the format.

pub mod derived;
pub mod envelope;
mod mig_records;
mod records;

pub use mig_records::{MadeInstance, MigIntent};
pub use records::{
    Adopted, CheckpointDevice, ClaimRecord, DaemonProcess, DomainClaim, DomainClaimKind, DynamicMigDevice, MemberError,
    MigModeOff, MpsDaemon, PinnedLimit, PrepareState, TimeSlice, VfioMember, VfioSwitch,
};

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use gpu_dra_driver::bounded_file::{self, Links};
use gpu_dra_driver::names::ClaimUid;

use crate::state::durable;

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
    #[error(
        "the checkpoint record of claim {uid} would be {len} bytes, more than the {MAX_RECORD_BYTES} a record may \
         hold: refused (start-up could not read it back)"
    )]
    TooLarge { uid: String, len: usize },
}

/// A record file that could not be used, kept aside for a person to look at.
#[derive(Debug)]
pub struct DamagedRecord {
    /// The UID in the file's name.
    pub uid: String,
    pub path: PathBuf,
    pub reason: String,
    /// Another claim's UID found inside (a record renamed to the wrong
    /// file): that claim's files are kept too.
    pub names_other: Option<String>,
}

/// What the checkpoint directory held at start.
#[derive(Debug, Default)]
pub struct Loaded {
    pub records: Vec<ClaimRecord>,
    pub damaged: Vec<DamagedRecord>,
    /// Leftover temporary files (a write killed half-way); safe to delete.
    pub temp_files: Vec<PathBuf>,
    /// Claims named by records set aside earlier (by file name, and by the
    /// UID inside when it can be read): their files are kept until the
    /// kubelet unprepares them.
    pub set_aside_owners: Vec<String>,
}

/// The checkpoint directory.
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    dir: PathBuf,
}

const RECORD_SUFFIX: &str = ".json";
/// Suffix given to a damaged record: kept, never read again.
pub const DAMAGED_SUFFIX: &str = ".damaged";
/// The largest record read or written. A claim has at most 32 devices (the
/// API's limit on allocation results); each takes well under 2 KiB in a
/// record (names of at most 253 bytes, its CDI ids, share and time-slice),
/// the MPS daemon less than that again per device: a real record stays
/// below 128 KiB. 1 MiB leaves room for what later versions add while a
/// forged or runaway file (`/dev/zero` behind a symlink) is refused.
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

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
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(CheckpointError::TooLarge { uid: uid.to_string(), len: bytes.len() });
        }
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

    /// A directory opened elsewhere (the MPS supervisor reads the plugin's
    /// checkpoint, never creating or writing it).
    pub fn existing(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Where `uid`'s record is (`uid` need not be valid: for messages).
    pub fn record_path(&self, uid: &str) -> PathBuf {
        self.dir.join(format!("{uid}{RECORD_SUFFIX}"))
    }

    /// The record of `uid`, if there is a usable one.
    pub fn read_one(&self, uid: &ClaimUid) -> Result<Option<ClaimRecord>, Damaged> {
        match read_record(&self.record_path(uid.as_str()), uid.as_str()) {
            Ok(record) => Ok(Some(record)),
            Err(RecordProblem::Missing) => Ok(None),
            Err(RecordProblem::Damaged { reason, .. }) => Err(Damaged { reason }),
        }
    }

    /// Reads every record. Unreadable ones are reported in `damaged`: a
    /// file not named `<claimUID>.json`, not a regular file (a symlink, a
    /// FIFO), larger than [`MAX_RECORD_BYTES`], failing its checksum, or
    /// whose `uid` does not match its file name.
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
            if let Some(at) = name.find(&format!("{RECORD_SUFFIX}{DAMAGED_SUFFIX}")) {
                loaded.set_aside_owners.push(name[..at].to_owned());
                loaded.set_aside_owners.extend(uid_inside(&path));
                continue;
            }
            let Some(uid) = name.strip_suffix(RECORD_SUFFIX) else { continue };
            let damaged = |reason: String, names_other| DamagedRecord {
                uid: uid.to_string(),
                path: path.clone(),
                reason,
                names_other,
            };
            if let Err(e) = ClaimUid::new(uid) {
                loaded.damaged.push(damaged(format!("the file name is not <claimUID>{RECORD_SUFFIX}: {e}"), None));
                continue;
            }
            match read_record(&path, uid) {
                Ok(record) => loaded.records.push(record),
                Err(RecordProblem::Missing) => {}
                Err(RecordProblem::Damaged { reason, names_other }) => {
                    loaded.damaged.push(damaged(reason, names_other))
                }
            }
        }
        loaded.records.sort_by(|a, b| a.uid.cmp(&b.uid));
        Ok(loaded)
    }

    /// Moves a damaged record aside (`<uid>.json.damaged`) so it is kept for
    /// inspection but no longer read.
    /// An earlier damaged file of the same name is kept too (`.damaged.2`,
    /// ...). A symlink is moved itself, never what it names.
    pub fn set_aside(&self, damaged: &DamagedRecord) -> Result<PathBuf, CheckpointError> {
        set_aside_file(&self.dir, &damaged.path)
    }
}

/// Moves the damaged state file `path` (an entry of `dir`) aside to
/// `<path>.damaged` (`.damaged.2`, ... when earlier ones are kept): kept
/// for a person to look at, never read again. A symlink is moved itself,
/// never what it names.
pub fn set_aside_file(dir: &Path, path: &Path) -> Result<PathBuf, CheckpointError> {
    let target = (1..=1000)
        .map(|n| {
            let mut target = path.to_path_buf().into_os_string();
            target.push(DAMAGED_SUFFIX);
            if n > 1 {
                target.push(format!(".{n}"));
            }
            PathBuf::from(target)
        })
        .find(|t| fs::symlink_metadata(t).is_err())
        .ok_or_else(|| CheckpointError::Write {
            path: path.to_path_buf(),
            error: io::Error::other("1000 damaged copies of this file are kept already"),
        })?;
    fs::rename(path, &target)
        .and_then(|()| durable::sync_dir(dir))
        .map_err(|error| CheckpointError::Write { path: target.clone(), error })?;
    Ok(target)
}

/// A record file that cannot be used, and why (the reason names the
/// field or the check it failed, as the set-aside log line shows it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Damaged {
    pub reason: String,
}

/// Why a record file was not used.
enum RecordProblem {
    Missing,
    Damaged { reason: String, names_other: Option<String> },
}

/// Reads `path` (a regular file, not a symlink, at most
/// [`MAX_RECORD_BYTES`]) as the record of `uid`.
fn read_record(path: &Path, uid: &str) -> Result<ClaimRecord, RecordProblem> {
    let damaged = |reason: String| RecordProblem::Damaged { reason, names_other: None };
    let bytes = match bounded_file::read(path, MAX_RECORD_BYTES, Links::Refuse) {
        Ok(bytes) => bytes,
        Err(e) if e.is_not_found() => return Err(RecordProblem::Missing),
        Err(e) => return Err(damaged(e.problem.to_string())),
    };
    let record = envelope::decode(&bytes).map_err(|e| damaged(e.to_string()))?;
    if record.uid != uid {
        return Err(RecordProblem::Damaged {
            reason: format!("holds claim {} but is named after {uid}", derived::quoted(&record.uid)),
            names_other: Some(record.uid),
        });
    }
    Ok(record)
}

/// The claim UID a set-aside file holds, if it is readable enough to say
/// (no checksum needed: it is only used to keep that claim's files).
fn uid_inside(path: &Path) -> Option<String> {
    let bytes = bounded_file::read(path, MAX_RECORD_BYTES, Links::Refuse).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let uid = value.get("claim")?.get("uid")?.as_str()?;
    ClaimUid::new(uid).ok().map(|_| uid.to_owned())
}

/// The node's boot id, `<proc-root>/sys/kernel/random/boot_id`.
pub fn boot_id(proc_root: &Path) -> io::Result<String> {
    // Bounded: `--proc-root` may point at a directory someone else made.
    let text = bounded_file::read_to_string(&proc_root.join("sys/kernel/random/boot_id"), 4096, Links::Follow)
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(text.trim().to_string())
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::prepared::PreparedDevice;

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
                .map(|d| {
                    let prepared = PreparedDevice {
                        request_names: vec!["gpu".into()],
                        pool_name: "node-a".into(),
                        device_name: d.to_string(),
                        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={uid}-{d}")],
                        share_id: None,
                    };
                    CheckpointDevice::new(prepared, false)
                })
                .collect(),
            mps: None,
            compute_domain: None,
            adopted: None,
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
        assert_eq!(misnamed.names_other.as_deref(), Some(UID));
        assert_eq!(loaded.temp_files.len(), 1);
        for d in &loaded.damaged {
            assert!(dir.set_aside(d).unwrap().exists());
        }
        let again = dir.load().unwrap();
        assert!(again.damaged.is_empty() && again.records.is_empty());
        let mut owners = again.set_aside_owners;
        owners.sort();
        assert_eq!(owners, [UID, UID, other], "set-aside records still name their claims (and the one inside)");
    }

    /// Files that are not records: symlinks (to a record, to /dev/zero, to
    /// a FIFO), a FIFO, an oversized file, a name that is not a UID. Each
    /// is reported damaged at once (no hang, no unbounded read), and
    /// setting aside moves the entry itself, keeping what a link names and
    /// an earlier damaged copy.
    #[test]
    fn files_that_are_not_records_are_damaged_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(tmp.path().join("checkpoint")).unwrap();
        let good = tmp.path().join("good.json");
        fs::write(&good, envelope::encode(&record(UID, &["gpu-0"])).unwrap()).unwrap();
        let fifo = tmp.path().join("fifo");
        let mode = rustix::fs::Mode::from_raw_mode(0o600);
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, mode, 0).unwrap();
        let uids: Vec<String> = (0..6).map(|i| format!("{i}b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a")).collect();
        let at = |i: usize| dir.path().join(format!("{}.json", uids[i]));
        std::os::unix::fs::symlink(&good, at(0)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", at(1)).unwrap();
        std::os::unix::fs::symlink(&fifo, at(2)).unwrap();
        rustix::fs::mknodat(rustix::fs::CWD, at(3), rustix::fs::FileType::Fifo, mode, 0).unwrap();
        fs::File::create(at(4)).unwrap().set_len(MAX_RECORD_BYTES + 1).unwrap();
        fs::write(dir.path().join("not-a-uid.json"), b"{}").unwrap();
        fs::write(dir.path().join(format!("{}.json.damaged", uids[4])), b"earlier").unwrap();
        let loaded = dir.load().unwrap();
        assert!(loaded.records.is_empty());
        let reason = |uid: &str| loaded.damaged.iter().find(|d| d.uid == uid).map(|d| d.reason.clone()).unwrap();
        for uid in &uids[..3] {
            assert!(reason(uid).contains("is a symbolic link"), "{}", reason(uid));
        }
        assert!(reason(&uids[3]).contains("is a FIFO"), "{}", reason(&uids[3]));
        assert!(reason(&uids[4]).contains("the most such a file may hold"), "{}", reason(&uids[4]));
        assert!(reason("not-a-uid").contains("the file name is not <claimUID>.json"), "{}", reason("not-a-uid"));
        for d in &loaded.damaged {
            dir.set_aside(d).unwrap();
        }
        assert!(dir.load().unwrap().damaged.is_empty());
        assert!(good.exists() && fifo.exists(), "what the links named is kept");
        let earlier = dir.path().join(format!("{}.json.damaged", uids[4]));
        assert_eq!(fs::read(&earlier).unwrap(), b"earlier", "an earlier damaged copy is kept");
        assert!(dir.path().join(format!("{}.json.damaged.2", uids[4])).exists());
    }

    #[test]
    fn a_record_too_large_to_read_back_is_not_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(tmp.path()).unwrap();
        let mut r = record(UID, &["gpu-0"]);
        r.name = "x".repeat(MAX_RECORD_BYTES as usize);
        let error = dir.write(&ClaimUid::new(UID).unwrap(), &r).unwrap_err();
        assert!(matches!(error, CheckpointError::TooLarge { .. }), "{error}");
        assert!(dir.load().unwrap().records.is_empty());
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
