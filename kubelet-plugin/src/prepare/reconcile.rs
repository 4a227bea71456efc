//! Start-up: make the checkpoint and the CDI directory agree before the
//! first claim is served.
//!
//! - the claims NVIDIA's plugin prepared are adopted first (see
//!   [`super::adopt`]), then treated as below like our own;
//! - a record from another boot is void (no container survived the reboot):
//!   its spec and record go;
//! - a `PrepareStarted` record is an interrupted prepare: rolled back, and
//!   the kubelet's retry prepares afresh;
//! - a `PrepareCompleted` record is kept, and its spec file rewritten if it
//!   went missing (`/var/run/cdi` is a tmpfs someone may have cleaned; a
//!   repeated prepare does the same while the plugin runs, see
//!   [`restore_missing_spec`]);
//! - a damaged record is set aside (`*.damaged`) and its spec file kept, as
//!   the claim may be in use; unprepare removes that spec later. A record
//!   that names a spec file or MPS directory other than the ones derived
//!   from its UID (see [`crate::state::checkpoint::derived`]) is damaged too:
//!   start-up acts only on names it made; so is a record naming dynamic MIG
//!   devices or whole GPUs its claim's MIG ledger does not hold (see
//!   [`super::reconcile_mig`]): start-up acts only on instances it made;
//!   so is a record naming a VFIO switch of devices that are not in the
//!   IOMMU group of the node's GPU it names ([`super::passthrough`]);
//! - an interrupted prepare that passed GPUs through gives them back to
//!   their drivers before its record goes; a completed one keeps them (a
//!   group an interrupted unprepare half gave back is bound again);
//! - a spec file of ours that no record owns is deleted, as are leftover
//!   temporary files.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use gpu_dra_driver::cdi;
use gpu_dra_driver::inventory::Inventory;
use gpu_dra_driver::names::{ClaimUid, DeviceName};

use super::config::PreparerConfig;
use super::error::OpenError;
use super::error::UndoError;
use super::files::CDI_FILE_MODE;
use crate::state::checkpoint::{CheckpointDir, ClaimRecord, DamagedRecord, PrepareState, derived};
use crate::state::durable;

/// What start-up found and did, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Completed claims kept.
    pub kept: usize,
    /// Interrupted prepares rolled back.
    pub rolled_back: Vec<String>,
    /// Claims dropped because they were prepared before a reboot.
    pub other_boot: Vec<String>,
    /// Damaged records set aside.
    pub damaged: Vec<PathBuf>,
    /// Spec files of completed claims that were missing and rewritten.
    pub rewritten: Vec<String>,
    /// Spec files no record owned, deleted.
    pub orphans: Vec<PathBuf>,
    /// Leftover temporary files deleted.
    pub temp_files: usize,
    /// Dynamic MIG instances destroyed and made again.
    pub mig: super::reconcile_mig::MigReport,
    /// Interrupted prepares whose MIG instances could not be removed (or
    /// whose GPUs could not be given back from vfio-pci): their
    /// records stay `PrepareStarted` for the kubelet's next call.
    pub mig_pending: Vec<String>,
    /// Claims taken over from NVIDIA's plugin first.
    pub adopted: super::adopt::AdoptReport,
}

type Records = HashMap<String, ClaimRecord>;

pub(super) fn reconcile(
    config: &PreparerConfig,
    checkpoint: &CheckpointDir,
    inventory: &Inventory,
) -> Result<(Records, ReconcileReport), OpenError> {
    let mut report = ReconcileReport::default();
    if let Some(dir) = &config.nvidia_dir {
        let node =
            super::adopt::Node { driver: &config.driver, node: &config.node, boot_id: &config.boot_id, inventory };
        report.adopted = super::adopt::adopt(dir, checkpoint, &node)?;
    }
    let loaded = checkpoint.load()?;
    for temp in &loaded.temp_files {
        remove_file(temp);
        report.temp_files += 1;
    }
    let damaged_ledgers = super::reconcile_mig::load_ledger(config);
    let mut owners: HashSet<String> = loaded.set_aside_owners.iter().cloned().collect();
    let mut damaged = loaded.damaged;
    let mut valid = Vec::new();
    for record in loaded.records {
        let checked = derived::check(&record, &config.driver, &config.mps_dir)
            .map_err(|e| e.to_string())
            .and_then(|uid| super::reconcile_mig::check(config, &record).map(|()| uid).map_err(|e| e.to_string()))
            .and_then(|uid| {
                super::passthrough::check(config, inventory, &record).map(|()| uid).map_err(|e| e.to_string())
            });
        match checked {
            Ok(uid) => valid.push((uid, record)),
            Err(reason) => damaged.push(DamagedRecord {
                path: checkpoint.record_path(&record.uid),
                uid: record.uid,
                reason,
                names_other: None,
            }),
        }
    }
    for damaged in &damaged {
        tracing::error!(file = %damaged.path.display(), reason = %damaged.reason, "damaged checkpoint record; set aside, its CDI spec is kept");
        owners.insert(damaged.uid.clone());
        owners.extend(damaged.names_other.clone());
        report.damaged.push(checkpoint.set_aside(damaged)?);
    }
    let mut records = Records::new();
    let mut interrupted: Vec<ClaimRecord> = Vec::new();
    let mut from_other_boot: Vec<ClaimRecord> = Vec::new();
    for (uid, record) in valid {
        let spec_file = derived::spec_file(&record, &config.driver, &uid);
        if record.boot_id != config.boot_id || record.state == PrepareState::PrepareStarted {
            // Instances and bindings first: the record must outlive them. A
            // reboot gave every GPU back to its driver already.
            let same_boot = record.boot_id == config.boot_id;
            let undone =
                super::reconcile_mig::roll_back(config, inventory, &record).map_err(UndoError::from).and_then(|()| {
                    if same_boot {
                        super::passthrough::give_back(config.vfio.as_ref(), &record).map_err(UndoError::from)
                    } else {
                        Ok(())
                    }
                });
            if let Err(error) = undone {
                tracing::error!(claim_uid = %record.uid, %error, "undoing an interrupted prepare (its MIG devices, its GPUs on vfio-pci) failed; kept for the next attempt");
                if record.boot_id == config.boot_id {
                    report.mig_pending.push(record.uid.clone());
                    owners.insert(record.uid.clone());
                    records.insert(record.uid.clone(), record);
                    continue;
                }
            }
            remove_cdi(&config.cdi_dir, &spec_file)?;
            checkpoint.remove(&uid)?;
            super::reconcile_mig::forget_after(config, &record.uid);
            if record.boot_id != config.boot_id {
                // A reboot reset the GPUs too.
                report.other_boot.push(record.uid.clone());
                from_other_boot.push(record);
            } else {
                report.rolled_back.push(record.uid.clone());
                interrupted.push(record);
            }
            continue;
        }
        match restore_missing_spec(config, inventory, &uid, &record) {
            Ok(true) => report.rewritten.push(record.uid.clone()),
            Ok(false) => {}
            Err(error) => {
                tracing::error!(claim_uid = %uid, %error, "the CDI spec of a prepared claim is missing and cannot be rewritten")
            }
        }
        super::passthrough::settle(config, &record);
        owners.insert(record.uid.clone());
        report.kept += 1;
        records.insert(record.uid.clone(), record);
    }
    super::reconcile_mig::release_orphans(config, inventory, &records, &owners);
    report.mig = super::reconcile_mig::settle(config, checkpoint, inventory, &mut records, &owners);
    report.mig.damaged_ledgers = damaged_ledgers;
    report.temp_files += sweep_cdi_dir(config, &owners, &mut report.orphans)?;
    settle_time_slices(config, &interrupted, &records);
    settle_mps(config, checkpoint, &interrupted, &from_other_boot, &mut records, &owners);
    Ok((records, report))
}

/// MPS daemons after a restart: an interrupted prepare's is torn down
/// (and its GPUs set back to `DEFAULT` unless a kept claim's daemon uses
/// them); a kept claim's is left running if it answers, else started again
/// with the same limits; a daemon directory no record owns is torn down;
/// before a reboot's, only the directories are left. Failures are logged:
/// unprepare tears down again.
fn settle_mps(
    config: &PreparerConfig,
    checkpoint: &CheckpointDir,
    interrupted: &[ClaimRecord],
    other_boot: &[ClaimRecord],
    kept: &mut Records,
    owners: &HashSet<String>,
) {
    use super::mps::lifecycle;
    use super::sharing::ComputeMode;
    let Some(host) = config.mps_host.as_deref() else {
        if interrupted.iter().chain(other_boot.iter()).chain(kept.values()).any(|r| r.mps.is_some()) {
            tracing::error!(
                "claims have MPS daemons but there is no nvidia-cuda-mps-control: they are left as they are"
            );
        }
        return;
    };
    for daemon in other_boot.iter().filter_map(|r| r.mps.as_ref()) {
        if let Err(error) = lifecycle::remove_leftovers(host, daemon) {
            tracing::error!(dir = %daemon.root.display(), %error, "removing an MPS daemon's directories from before the reboot failed");
        }
    }
    for record in interrupted {
        let Some(daemon) = &record.mps else { continue };
        if let Err(error) = lifecycle::tear_down(host, daemon, config.mps_timeouts) {
            tracing::error!(claim_uid = %record.uid, %error, "tearing down the MPS daemon of an interrupted prepare failed");
        }
        if let Some(control) = &config.gpu_control {
            for gpu in super::mps::gpus_to_reset(record, kept.values()) {
                if let Err(error) = control.set_compute_mode(&gpu, ComputeMode::Default) {
                    tracing::error!(%gpu, %error, "resetting the compute mode an interrupted prepare set failed");
                }
            }
        }
    }
    sweep_mps_dir(config, host, kept, owners);
    let Some(control) = config.gpu_control.as_deref() else { return };
    for record in kept.values_mut() {
        let Some(mut daemon) = record.mps.clone() else { continue };
        if lifecycle::is_healthy(host, &daemon) {
            tracing::info!(claim_uid = %record.uid, "the MPS daemon of a prepared claim is still running; kept");
            continue;
        }
        tracing::warn!(claim_uid = %record.uid, "the MPS daemon of a prepared claim is gone; starting it again");
        let Ok(uid) = ClaimUid::new(record.uid.as_str()) else { continue };
        let mut progress = record.clone();
        let mut save = |d: &crate::state::checkpoint::MpsDaemon| {
            progress.mps = Some(d.clone());
            checkpoint.write(&uid, &progress)
        };
        let restarted = lifecycle::tear_down(host, &daemon, config.mps_timeouts)
            .and_then(|()| lifecycle::bring_up(host, control, &mut daemon, config.mps_timeouts, &mut save));
        match restarted {
            Ok(()) => record.mps = Some(daemon),
            Err(error) => {
                tracing::error!(claim_uid = %record.uid, %error, "starting a prepared claim's MPS daemon again failed")
            }
        }
    }
}

/// Tears down daemon directories under `<state-dir>/mps` that no record
/// owns (a damaged record's are kept: its claim may be in use). Only real
/// directories named by a claim UID are ours: anything else there is left
/// alone, with one log line.
fn sweep_mps_dir(
    config: &PreparerConfig,
    host: &dyn super::mps::host::MpsHost,
    kept: &Records,
    owners: &HashSet<String>,
) {
    let Ok(entries) = fs::read_dir(&config.mps_dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if kept.contains_key(&name) || owners.contains(&name) {
            continue;
        }
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || ClaimUid::new(name.as_str()).is_err() {
            tracing::warn!(path = %entry.path().display(), "not an MPS daemon directory the plugin made (a directory named by a claim UID); left alone");
            continue;
        }
        let orphan = crate::state::checkpoint::MpsDaemon::at(config.mps_dir.join(&name));
        match super::mps::lifecycle::tear_down(host, &orphan, config.mps_timeouts) {
            Ok(()) => tracing::warn!(dir = %orphan.root.display(), "removed an MPS daemon directory no claim owns"),
            Err(error) => {
                tracing::error!(dir = %orphan.root.display(), %error, "removing an orphaned MPS daemon failed")
            }
        }
    }
}

/// GPU time-slices after a restart: an interrupted prepare may have set
/// one that no kept claim needs (reset it); a kept claim's is set again,
/// as an interrupted unprepare may have reset it already. Failures are
/// logged: a claim's prepare or unprepare sets them again.
fn settle_time_slices(config: &PreparerConfig, interrupted: &[ClaimRecord], kept: &Records) {
    let Some(control) = &config.gpu_control else { return };
    for record in interrupted {
        for gpu in super::sharing::to_reset(record, kept.values()) {
            if let Err(error) = control.reset_time_slice(&gpu) {
                tracing::error!(%gpu, %error, "resetting the time-slice an interrupted prepare set failed");
            }
        }
    }
    for record in kept.values() {
        for slice in record.devices.iter().filter_map(|d| d.time_slice.as_ref()) {
            if let Err(error) = control.set_time_slice(&slice.gpu_uuid, slice.interval) {
                tracing::error!(gpu = %slice.gpu_uuid, %error, "setting a prepared claim's time-slice again failed");
            }
        }
    }
}

/// Writes a completed claim's spec again from the inventory if it is
/// missing (true when it was); the device ids come out the same because
/// they are derived from the claim UID and device names only.
pub(super) fn restore_missing_spec(
    config: &PreparerConfig,
    inventory: &Inventory,
    uid: &ClaimUid,
    record: &ClaimRecord,
) -> Result<bool, RestoreError> {
    // An adopted claim's spec is written again under NVIDIA's name: JSON
    // is YAML, and the record keeps naming one file.
    let spec_file = derived::spec_file(record, &config.driver, uid);
    if config.cdi_dir.join(&spec_file).exists() || !super::adopt::spec_restorable(record, &config.driver, uid) {
        return Ok(false);
    }
    let names: Vec<DeviceName> =
        record.devices.iter().map(|d| DeviceName::new(d.device_name.as_str())).collect::<Result<_, _>>()?;
    let view = super::dynamic_mig::overlay_record(inventory, record);
    let mut spec = cdi::claim_spec(&config.driver, &view, &config.driver_edits.get(), uid, &names)?;
    if let Some(daemon) = &record.mps {
        super::mps::add_edits(&mut spec.spec, daemon, uid.as_str());
    }
    super::dynamic_mig::add_uuid_env(&mut spec.spec, uid.as_str(), record);
    let bytes = spec.to_json()?;
    durable::write(&config.cdi_dir, &spec_file, &bytes, CDI_FILE_MODE)
        .map_err(|source| RestoreError::Write { path: config.cdi_dir.join(&spec_file), source })?;
    Ok(true)
}

/// Why a completed claim's missing spec could not be written again.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// A recorded device name breaks the naming rules.
    #[error(transparent)]
    DeviceName(#[from] gpu_dra_driver::names::InvalidName),
    #[error(transparent)]
    Spec(#[from] cdi::CdiError),
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    #[error("writing CDI spec {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

/// Deletes our spec files that no record owns and our temporary files;
/// returns how many temporary files went.
fn sweep_cdi_dir(
    config: &PreparerConfig,
    owners: &HashSet<String>,
    orphans: &mut Vec<PathBuf>,
) -> Result<usize, OpenError> {
    let prefix = cdi::claim_spec_file_prefix(&config.driver);
    let dir_error = |error| OpenError::CdiDir { path: config.cdi_dir.clone(), error };
    let mut temp_files = 0;
    for entry in fs::read_dir(&config.cdi_dir).map_err(dir_error)? {
        let entry = entry.map_err(dir_error)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if durable::is_temp_for(name, &prefix) {
            remove_file(&entry.path());
            temp_files += 1;
            continue;
        }
        let Some(rest) = name.strip_prefix(&prefix) else { continue };
        // Ours only: a `.yaml` of that prefix is NVIDIA's plugin's, kept for
        // the pods it prepared (see `adopt`) and removed by their unprepare.
        let Some(uid) = rest.strip_suffix(".json") else { continue };
        if !owners.contains(uid) {
            remove_cdi(&config.cdi_dir, name)?;
            orphans.push(entry.path());
        }
    }
    Ok(temp_files)
}

fn remove_cdi(dir: &Path, name: &str) -> Result<(), OpenError> {
    durable::remove(dir, name).map(|_| ()).map_err(|error| OpenError::CdiDir { path: dir.join(name), error })
}

/// Best effort: a temporary file that cannot be deleted is harmless.
fn remove_file(path: &Path) {
    if let Err(error) = fs::remove_file(path) {
        tracing::warn!(file = %path.display(), %error, "cannot delete a leftover temporary file");
    }
}
