//! The ownership ledger: what the plugin made through NVML, written
//! durably at the moment it made it, one file per claim,
//! `<state-dir>/mig-ledger/<claimUID>.json` (the name derived from the
//! validated UID, never read from the file).
//!
//! The checkpoint record says what a claim *wants*; the ledger says what
//! the plugin *did*: for each instance, "about to create" (before the
//! call), the GPU-instance id NVML returned (right after it returned,
//! before anything else), then the compute-instance id and `MIG-` UUID;
//! for each whole GPU, that its MIG mode was turned off for this claim
//! (before the switch, on a GPU that was dynamic then). Ownership, and so
//! every destroy and every MIG mode switch back on, comes from here and
//! from NVML agreeing with it ([`super::ownership`]), never from a record:
//! a record naming an instance the ledger does not hold for that claim is
//! damaged, and nothing it names is destroyed or made.
//!
//! An entry outlives what it describes until the claim's record is gone
//! (an instance destroyed is marked so, the claim still entitled to its
//! placement), so an unprepare killed half-way finds its claim whole again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gpu_dra_driver::bounded_file::{self, Links};
use gpu_dra_driver::names::ClaimUid;
use serde_json::Value;

use super::error::Error;
use crate::state::checkpoint::MigIntent;
use crate::state::checkpoint::envelope::checksum;
use crate::state::durable;

/// The format version this build writes and the newest it reads.
const FORMAT_VERSION: u64 = 1;
/// A claim has at most 32 devices; an entry is well under 1 KiB.
const MAX_LEDGER_BYTES: u64 = 256 << 10;
const SUFFIX: &str = ".json";
/// Suffix given to a ledger file that cannot be read: kept, never read again.
pub const DAMAGED_SUFFIX: &str = ".damaged";

/// What the plugin did about one instance of a claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Made {
    /// Written before the create call: an instance at this placement may
    /// exist without the plugin knowing its identity. It is never
    /// destroyed on this entry's word (see [`super::ownership`]).
    Creating,
    /// The GPU instance NVML returned; no compute instance yet.
    GpuInstance { gpu_instance_id: u32 },
    /// The whole MIG device.
    #[serde(rename_all = "camelCase")]
    Complete { gpu_instance_id: u32, compute_instance_id: u32, mig_uuid: String },
    /// Destroyed by the plugin; the claim is still entitled to the placement.
    Destroyed,
}

/// One instance of a claim, by its GPU, profile and placement.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnedInstance {
    pub gpu_uuid: String,
    pub profile_id: u32,
    pub placement_start: u32,
    pub placement_size: u32,
    pub made: Made,
}

impl OwnedInstance {
    /// The instance as an intent (what unmaking it needs), on the GPU of
    /// minor `gpu_minor`; the profile is named by its id.
    pub fn intent(&self, gpu_minor: u32) -> MigIntent {
        MigIntent {
            gpu_uuid: self.gpu_uuid.clone(),
            gpu_minor,
            profile: format!("profile {}", self.profile_id),
            profile_id: self.profile_id,
            compute_profile_index: 0,
            placement_start: self.placement_start,
            placement_size: self.placement_size,
        }
    }

    /// Whether this entry is about the instance `intent` describes.
    pub fn is_for(&self, intent: &MigIntent) -> bool {
        self.gpu_uuid == intent.gpu_uuid
            && self.profile_id == intent.profile_id
            && self.placement_start == intent.placement_start
            && self.placement_size == intent.placement_size
    }
}

/// Everything the plugin made for one claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLedger {
    pub uid: String,
    /// The boot the instances were made in: after a reboot none exists.
    pub boot_id: String,
    #[serde(default)]
    pub instances: Vec<OwnedInstance>,
    /// GPUs (UUIDs) whose MIG mode the plugin turned off for this claim.
    #[serde(default)]
    pub mig_mode_off: Vec<String>,
}

impl ClaimLedger {
    pub fn new(uid: &str, boot_id: &str) -> Self {
        Self { uid: uid.into(), boot_id: boot_id.into(), instances: Vec::new(), mig_mode_off: Vec::new() }
    }

    pub fn instance(&self, intent: &MigIntent) -> Option<&OwnedInstance> {
        self.instances.iter().find(|o| o.is_for(intent))
    }

    fn set(&mut self, intent: &MigIntent, made: Made) {
        match self.instances.iter_mut().find(|o| o.is_for(intent)) {
            Some(entry) => entry.made = made,
            None => self.instances.push(OwnedInstance {
                gpu_uuid: intent.gpu_uuid.clone(),
                profile_id: intent.profile_id,
                placement_start: intent.placement_start,
                placement_size: intent.placement_size,
                made,
            }),
        }
    }
}

/// A ledger file that could not be used, renamed aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedLedger {
    pub path: PathBuf,
    pub reason: String,
}

/// The ledger directory, with every claim's ledger in memory (loaded once
/// at start-up, then kept in step with every write).
#[derive(Debug)]
pub struct Ledger {
    dir: PathBuf,
    claims: Mutex<BTreeMap<String, ClaimLedger>>,
}

impl Ledger {
    /// The ledger at `dir` (created at the first write), nothing loaded.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), claims: Mutex::new(BTreeMap::new()) }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ClaimLedger>> {
        self.claims.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads every claim's ledger into memory. A file that is not a
    /// regular file of at most [`MAX_LEDGER_BYTES`] named `<claimUID>.json`,
    /// whose checksum fails or that names another claim, is renamed aside
    /// (`.damaged`) and reported: what it described is then proven by
    /// nothing, so left alone.
    pub fn load(&self) -> Vec<DamagedLedger> {
        self.read_all(true)
    }

    /// [`Self::load`] without setting anything aside or deleting leftover
    /// temporary files (a look before start-up proper).
    pub fn peek(&self) -> Vec<DamagedLedger> {
        self.read_all(false)
    }

    fn read_all(&self, tidy: bool) -> Vec<DamagedLedger> {
        let mut damaged = Vec::new();
        let mut loaded = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            *self.claims() = loaded;
            return damaged;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(durable::TEMP_SUFFIX) {
                if tidy {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            let Some(uid) = name.strip_suffix(SUFFIX) else { continue };
            match read(&entry.path(), uid) {
                Ok(ledger) => {
                    loaded.insert(uid.to_owned(), ledger);
                }
                Err(reason) => {
                    let path = entry.path();
                    let mut aside = path.clone().into_os_string();
                    aside.push(DAMAGED_SUFFIX);
                    if !tidy {
                        damaged.push(DamagedLedger { path, reason });
                        continue;
                    }
                    if let Err(error) = std::fs::rename(&path, &aside) {
                        tracing::error!(file = %path.display(), %error, "cannot set a damaged MIG ledger file aside");
                    }
                    damaged.push(DamagedLedger { path, reason });
                }
            }
        }
        *self.claims() = loaded;
        damaged
    }

    /// A copy of `uid`'s ledger, if any.
    pub fn get(&self, uid: &str) -> Option<ClaimLedger> {
        self.claims().get(uid).cloned()
    }

    /// A copy of every claim's ledger.
    pub fn all(&self) -> Vec<ClaimLedger> {
        self.claims().values().cloned().collect()
    }

    /// Writes `ledger` atomically and durably (fsync), then keeps it.
    pub fn write(&self, ledger: &ClaimLedger) -> Result<(), Error> {
        let uid = ClaimUid::new(ledger.uid.as_str()).map_err(Error::LedgerUid)?;
        let encoding = |source| Error::EncodeLedger { uid: uid.clone(), source };
        let claim = serde_json::to_value(ledger).map_err(encoding)?;
        let envelope = serde_json::json!({"version": FORMAT_VERSION, "checksum": checksum(&claim), "ledger": claim});
        let bytes = serde_json::to_vec(&envelope).map_err(encoding)?;
        durable::create_dir(&self.dir, 0o700)
            .and_then(|()| durable::write(&self.dir, &format!("{uid}{SUFFIX}"), &bytes, 0o600))
            .map_err(|source| Error::WriteLedger { path: self.dir.join(format!("{uid}{SUFFIX}")), source })?;
        self.claims().insert(ledger.uid.clone(), ledger.clone());
        Ok(())
    }

    /// Removes `uid`'s ledger durably; a missing one is fine.
    pub fn remove(&self, uid: &str) -> Result<(), Error> {
        let uid = ClaimUid::new(uid).map_err(Error::LedgerUid)?;
        let name = format!("{uid}{SUFFIX}");
        match durable::remove(&self.dir, &name) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::RemoveLedger { path: self.dir.join(&name), source }),
        }
        self.claims().remove(uid.as_str());
        Ok(())
    }

    /// A handle that records one claim's steps (its ledger so far, or a
    /// new one of `boot_id`).
    pub fn claim(&self, uid: &str, boot_id: &str) -> ClaimOwnership<'_> {
        let entry = self.get(uid).unwrap_or_else(|| ClaimLedger::new(uid, boot_id));
        ClaimOwnership { ledger: self, entry }
    }
}

/// Reads `path` as the ledger of `uid`.
fn read(path: &Path, uid: &str) -> Result<ClaimLedger, String> {
    ClaimUid::new(uid).map_err(|e| format!("the file name is not <claimUID>{SUFFIX}: {e}"))?;
    let bytes = bounded_file::read(path, MAX_LEDGER_BYTES, Links::Refuse).map_err(|e| e.problem.to_string())?;
    let envelope: Value = serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))?;
    let version = envelope.get("version").and_then(Value::as_u64).ok_or("field `version` is missing")?;
    if version > FORMAT_VERSION {
        return Err(format!(
            "format version {version} was written by a newer plugin (this one reads {FORMAT_VERSION})"
        ));
    }
    let stored = envelope.get("checksum").and_then(Value::as_str).ok_or("field `checksum` is missing")?;
    let claim = envelope.get("ledger").ok_or("field `ledger` is missing")?;
    let computed = checksum(claim);
    if stored != computed {
        return Err(format!("checksum mismatch (stored {stored}, computed {computed}): the file is damaged"));
    }
    let ledger: ClaimLedger = serde_json::from_value(claim.clone()).map_err(|e| format!("field `ledger`: {e}"))?;
    if ledger.uid != uid {
        return Err(format!(
            "holds claim {} but is named after {uid}",
            crate::state::checkpoint::derived::quoted(&ledger.uid)
        ));
    }
    Ok(ledger)
}

/// One claim's ledger as its steps happen: each method writes durably
/// before it returns, so the caller acts only on what is recorded.
#[derive(Debug)]
pub struct ClaimOwnership<'a> {
    ledger: &'a Ledger,
    entry: ClaimLedger,
}

impl ClaimOwnership<'_> {
    pub fn entry(&self) -> &ClaimLedger {
        &self.entry
    }

    fn save(&mut self, change: impl FnOnce(&mut ClaimLedger)) -> Result<(), Error> {
        let mut next = self.entry.clone();
        change(&mut next);
        self.ledger.write(&next)?;
        self.entry = next;
        Ok(())
    }

    /// Before `intent`'s create call.
    pub fn creating(&mut self, intent: &MigIntent) -> Result<(), Error> {
        self.creating_all(&[intent])
    }

    /// Before the create calls of `intents`, in one write (a claim's
    /// devices are made one after the other right after it); those already
    /// marked so are not written again.
    pub fn creating_all(&mut self, intents: &[&MigIntent]) -> Result<(), Error> {
        let fresh: Vec<&MigIntent> = intents
            .iter()
            .copied()
            .filter(|i| self.entry.instance(i).is_none_or(|o| o.made != Made::Creating))
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        self.save(|l| fresh.iter().for_each(|i| l.set(i, Made::Creating)))
    }

    /// Right after the create call returned GPU instance `gi`.
    pub fn made_gpu_instance(&mut self, intent: &MigIntent, gi: u32) -> Result<(), Error> {
        self.save(|l| l.set(intent, Made::GpuInstance { gpu_instance_id: gi }))
    }

    /// Right after its compute instance was made.
    pub fn made_compute_instance(&mut self, intent: &MigIntent, gi: u32, ci: u32, uuid: &str) -> Result<(), Error> {
        let made = Made::Complete { gpu_instance_id: gi, compute_instance_id: ci, mig_uuid: uuid.to_owned() };
        self.save(|l| l.set(intent, made))
    }

    /// Drops the `Creating` mark of `intents` whose create was never
    /// called (a claim's earlier device failed): nothing of theirs exists.
    pub fn never_made(&mut self, intents: &[&MigIntent]) -> Result<(), Error> {
        let marked: Vec<&MigIntent> = intents
            .iter()
            .copied()
            .filter(|i| self.entry.instance(i).is_some_and(|o| o.made == Made::Creating))
            .collect();
        if marked.is_empty() {
            return Ok(());
        }
        self.save(|l| marked.iter().for_each(|i| l.set(i, Made::Destroyed)))
    }

    /// After the plugin destroyed it.
    pub fn destroyed(&mut self, intent: &MigIntent) -> Result<(), Error> {
        if self.entry.instance(intent).is_none_or(|o| o.made == Made::Destroyed) {
            return Ok(());
        }
        self.save(|l| l.set(intent, Made::Destroyed))
    }

    /// Before turning MIG mode off on `gpu` (dynamic then) for the claim.
    pub fn mig_mode_off(&mut self, gpu: &str) -> Result<(), Error> {
        if self.entry.mig_mode_off.iter().any(|g| g == gpu) {
            return Ok(());
        }
        self.save(|l| l.mig_mode_off.push(gpu.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::intent;
    use super::*;

    const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    #[test]
    fn each_step_is_on_disk_before_it_returns_and_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(tmp.path().join("mig-ledger"));
        let mut own = ledger.claim(UID, "boot");
        own.creating(&intent(3)).unwrap();
        own.made_gpu_instance(&intent(3), 7).unwrap();
        own.made_compute_instance(&intent(3), 7, 0, "MIG-x").unwrap();
        own.mig_mode_off("GPU-b").unwrap();
        let again = Ledger::new(tmp.path().join("mig-ledger"));
        assert!(again.load().is_empty());
        let read = again.get(UID).unwrap();
        assert_eq!(read, *own.entry());
        assert_eq!(
            read.instance(&intent(3)).unwrap().made,
            Made::Complete { gpu_instance_id: 7, compute_instance_id: 0, mig_uuid: "MIG-x".into() }
        );
        own.destroyed(&intent(3)).unwrap();
        assert_eq!(ledger.get(UID).unwrap().instances[0].made, Made::Destroyed);
        ledger.remove(UID).unwrap();
        ledger.remove(UID).unwrap();
        assert!(ledger.get(UID).is_none());
    }

    #[test]
    fn damaged_forged_and_misnamed_files_are_set_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("mig-ledger");
        let ledger = Ledger::new(&dir);
        ledger.claim(UID, "boot").creating(&intent(0)).unwrap();
        let other = "1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
        let text = std::fs::read_to_string(dir.join(format!("{UID}.json"))).unwrap();
        // A copy under another claim's name; an edited entry (checksum); a symlink.
        std::fs::write(dir.join(format!("{other}.json")), &text).unwrap();
        let third = "2b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
        let edited = text.replace(UID, third).replace("creating", "destroyed");
        std::fs::write(dir.join(format!("{third}.json")), edited).unwrap();
        let fourth = "3b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
        std::os::unix::fs::symlink(dir.join(format!("{UID}.json")), dir.join(format!("{fourth}.json"))).unwrap();
        let damaged = ledger.load();
        let reasons: Vec<&str> = damaged.iter().map(|d| d.reason.as_str()).collect();
        assert_eq!(damaged.len(), 3, "{reasons:?}");
        assert!(reasons.iter().any(|r| r.contains("is named after")), "{reasons:?}");
        assert!(reasons.iter().any(|r| r.contains("checksum mismatch")), "{reasons:?}");
        assert!(reasons.iter().any(|r| r.contains("symbolic link")), "{reasons:?}");
        assert_eq!(ledger.all().len(), 1);
        assert!(dir.join(format!("{other}.json.damaged")).exists());
    }
}
