//! Start-up: takes over the claims NVIDIA's DRA kubelet plugin prepared on
//! this node, so that a cluster switches drivers with its pods running.
//!
//! Both plugins register `gpu.nvidia.com`, name devices alike and give
//! containers the same CDI ids (`k8s.gpu.nvidia.com/claim=<uid>-<device>`),
//! so the kubelet's view of a running pod stays true. What only NVIDIA's
//! plugin knew is its checkpoint (see [`crate::state::nvidia_checkpoint`])
//! and its spec files (`k8s.gpu.nvidia.com-claim_<uid>.yaml`). Each claim
//! of their checkpoint becomes a record of ours that names their spec file:
//! - a completed claim on devices this plugin publishes alike (the same
//!   GPU UUID, or a MIG device that exists on its own) is served: a
//!   repeated prepare answers its CDI ids, unprepare removes their spec;
//! - a completed claim with something only their plugin can undo (an MPS
//!   daemon, a GPU passed through, a MIG device their DynamicMIG made, a
//!   device not published here now) is kept but not served: its devices
//!   stay taken, a prepare is refused naming why, and unprepare removes
//!   its spec and record and logs what stays behind;
//! - an interrupted prepare becomes an interrupted record of ours, which
//!   start-up rolls back (the kubelet was never told its devices);
//! - a claim whose entry names a pool other than this node's, a device id
//!   other than the one derived from its UID, or is not theirs in some
//!   other way, is refused: no record, nothing of it deleted.
//!
//! Their checkpoint from another boot (`nodeBootID`) is void.
//!
//! Once every record is written their file is renamed
//! `checkpoint.json.adopted-<unix seconds>` (kept for people, never read
//! again), so an unprepared claim is never adopted twice. A crash in
//! between adopts again: a claim that has a record already keeps it. A
//! file that cannot be read is left as it is and reported at every start.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use gpu_dra_driver::bounded_file::{self, Links};
use gpu_dra_driver::cdi;
use gpu_dra_driver::inventory::{Inventory, PublishedDevice};
use gpu_dra_driver::names::{ClaimUid, DeviceName, DriverName, NodeName};

use super::error::OpenError;
use crate::prepared::PreparedDevice;
use crate::state::checkpoint::{Adopted, CheckpointDevice, CheckpointDir, ClaimRecord, PrepareState};
use crate::state::durable;
use crate::state::nvidia_checkpoint::{self, NvidiaCheckpoint, NvidiaClaim, NvidiaDevice, NvidiaDeviceKind};

/// What adoption found and did, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AdoptReport {
    /// Claims taken over and served.
    pub served: Vec<String>,
    /// Claims taken over but not served: (UID, why).
    pub not_served: Vec<(String, String)>,
    /// Interrupted prepares, rolled back by start-up.
    pub interrupted: Vec<String>,
    /// Claims with a record of ours already (an adoption cut short).
    pub had_record: Vec<String>,
    /// Entries refused: (UID or key, why).
    pub refused: Vec<(String, String)>,
    /// Claims of another boot, void.
    pub other_boot: usize,
    /// Their file could not be read, and why; left as it is.
    pub unreadable: Option<String>,
    /// Where their file went once adopted.
    pub renamed_to: Option<PathBuf>,
}

/// Logs what adoption did: a line per claim not served or refused (each
/// names the fix), one summary otherwise.
pub fn log(report: &AdoptReport) {
    if let Some(error) = &report.unreadable {
        tracing::error!(error = ?error, "NVIDIA's DRA plugin checkpoint cannot be read; its claims are not adopted: their pods keep running, their specs stay until the kubelet unprepares them. Move the file aside to silence this");
    }
    for (uid, why) in &report.not_served {
        tracing::warn!(claim_uid = %uid, reason = ?why, "adopted a claim NVIDIA's DRA plugin prepared, but this plugin does not serve it");
    }
    for (uid, why) in &report.refused {
        tracing::error!(claim_uid = ?uid, reason = ?why, "an entry of NVIDIA's DRA plugin checkpoint is not adopted (nothing of it is deleted)");
    }
    if let Some(file) = &report.renamed_to {
        tracing::info!(
            served = report.served.len(),
            not_served = report.not_served.len(),
            interrupted = report.interrupted.len(),
            had_record = report.had_record.len(),
            refused = report.refused.len(),
            other_boot = report.other_boot,
            moved_to = %file.display(),
            "adopted the claims NVIDIA's DRA plugin prepared on this node"
        );
    }
}

/// What start-up needs to decide about one claim.
pub(super) struct Node<'a> {
    pub driver: &'a DriverName,
    pub node: &'a NodeName,
    pub boot_id: &'a str,
    pub inventory: &'a Inventory,
}

/// Why an entry of their checkpoint is refused (not adopted at all).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum Refusal {
    #[error("its key is not a claim UID: {0}")]
    Uid(String),
    #[error("device {device:?}: {error}")]
    DeviceName { device: String, error: String },
    #[error("device {device} is in pool {pool:?}, but this node's pool is {node:?}")]
    Pool { device: String, pool: String, node: String },
    #[error(
        "device {device} has CDI ids {ids:?}; NVIDIA's plugin gives {claim:?}, before v25.12 {standard:?} and \
         possibly {claim:?}, each once"
    )]
    CdiIds { device: String, ids: Vec<String>, claim: String, standard: String },
    #[error("device {device} has a shareID that is not a Kubernetes UID: {share_id:?}")]
    ShareId { device: String, share_id: String },
    #[error("device {device} has a request name that is not one: {request:?}")]
    Request { device: String, request: String },
    #[error("it is prepared, with no devices")]
    NoDevices,
}

/// Reads NVIDIA's checkpoint in `dir` (if any) and writes a record of ours
/// for each claim in it, before [`super::reconcile`] loads the records.
/// `Err` only when a record or the rename cannot be written: the plugin
/// must not serve claims it half adopted.
pub(super) fn adopt(dir: &Path, checkpoint: &CheckpointDir, node: &Node<'_>) -> Result<AdoptReport, OpenError> {
    let mut report = AdoptReport::default();
    let path = dir.join(nvidia_checkpoint::FILE_NAME);
    let bytes = match bounded_file::read(&path, nvidia_checkpoint::MAX_BYTES, Links::Refuse) {
        Ok(bytes) => bytes,
        Err(error) if error.is_not_found() => return Ok(report),
        Err(error) => {
            report.unreadable = Some(error.to_string());
            return Ok(report);
        }
    };
    let file = match nvidia_checkpoint::decode(&bytes) {
        Ok(file) => file,
        Err(error) => {
            report.unreadable = Some(format!("{}: {error}", path.display()));
            return Ok(report);
        }
    };
    report.refused.extend(file.undecodable.iter().map(|(uid, why)| (uid.clone(), why.to_string())));
    for (uid, record) in decide_all(&file, node, &mut report) {
        if checkpoint.record_path(uid.as_str()).exists() {
            report.had_record.push(uid.to_string());
            continue;
        }
        checkpoint.write(&uid, &record)?;
        match (&record.state, record.adopted.as_ref().and_then(|a| a.not_served.clone())) {
            (PrepareState::PrepareStarted, _) => report.interrupted.push(uid.to_string()),
            (PrepareState::PrepareCompleted, Some(why)) => report.not_served.push((uid.to_string(), why)),
            (PrepareState::PrepareCompleted, None) => report.served.push(uid.to_string()),
        }
    }
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let renamed = dir.join(format!("{}.adopted-{seconds}", nvidia_checkpoint::FILE_NAME));
    std::fs::rename(&path, &renamed)
        .and_then(|()| durable::sync_dir(dir))
        .map_err(|error| OpenError::Adopt { path: path.clone(), error })?;
    report.renamed_to = Some(renamed);
    Ok(report)
}

/// The records for `file`'s claims (none from another boot); refusals go
/// to `report`.
fn decide_all(file: &NvidiaCheckpoint, node: &Node<'_>, report: &mut AdoptReport) -> Vec<(ClaimUid, ClaimRecord)> {
    if file.boot_id.as_deref().is_some_and(|b| b != node.boot_id) {
        report.other_boot = file.claims.len();
        return Vec::new();
    }
    let mut records = Vec::new();
    for claim in &file.claims {
        match decide(claim, file.layout.as_str(), node) {
            Ok(adopted) => records.push(adopted),
            Err(refusal) => report.refused.push((claim.uid.clone(), refusal.to_string())),
        }
    }
    records
}

/// One claim of their checkpoint as a record of ours.
pub(super) fn decide(claim: &NvidiaClaim, layout: &str, node: &Node<'_>) -> Result<(ClaimUid, ClaimRecord), Refusal> {
    let uid = ClaimUid::new(claim.uid.as_str()).map_err(|e| Refusal::Uid(e.to_string()))?;
    let mut devices = Vec::new();
    let mut not_served = Vec::new();
    for group in &claim.groups {
        if let Some(daemon) = &group.mps_daemon {
            not_served.push(format!(
                "its devices are shared through NVIDIA's MPS control daemon {daemon:?} (a Deployment of NVIDIA's \
                 driver), which this driver neither runs nor stops: delete that Deployment once the claim is gone"
            ));
        }
        for device in &group.devices {
            let admin = claim.admin_access.iter().any(|(p, d)| p == &device.pool && d == &device.device);
            let (recorded, why) = adopt_device(&uid, device, admin, node)?;
            devices.push(recorded);
            not_served.extend(why);
        }
    }
    // NVIDIA's plugin records an interrupted prepare without its devices.
    if devices.is_empty() && claim.completed {
        return Err(Refusal::NoDevices);
    }
    let record = ClaimRecord {
        uid: uid.to_string(),
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        state: if claim.completed { PrepareState::PrepareCompleted } else { PrepareState::PrepareStarted },
        boot_id: node.boot_id.to_owned(),
        cdi_spec_file: Some(cdi::nvidia_claim_spec_file_name(node.driver, &uid)),
        devices,
        mps: None,
        compute_domain: None,
        adopted: Some(Adopted {
            from: layout.to_owned(),
            not_served: (!not_served.is_empty()).then(|| not_served.join("; ")),
        }),
    };
    Ok((uid, record))
}

/// One device: checked against what NVIDIA's plugin writes, and against
/// what this node publishes now (why it is not served, if so).
fn adopt_device(
    uid: &ClaimUid,
    device: &NvidiaDevice,
    admin_access: bool,
    node: &Node<'_>,
) -> Result<(CheckpointDevice, Option<String>), Refusal> {
    let name = DeviceName::new(device.device.as_str())
        .map_err(|e| Refusal::DeviceName { device: device.device.clone(), error: e.to_string() })?;
    if device.pool != node.node.as_str() {
        return Err(Refusal::Pool { device: name.to_string(), pool: device.pool.clone(), node: node.node.to_string() });
    }
    check_cdi_ids(uid, &name, &device.cdi_device_ids, node.driver)?;
    if let Some(share_id) = &device.share_id
        && !is_uid(share_id)
    {
        return Err(Refusal::ShareId { device: name.to_string(), share_id: share_id.clone() });
    }
    if let Some(request) = device.requests.iter().find(|r| !is_request_name(r)) {
        return Err(Refusal::Request { device: name.to_string(), request: request.clone() });
    }
    let why = not_served(&name, &device.kind, node.inventory);
    let prepared = PreparedDevice {
        request_names: device.requests.clone(),
        pool_name: device.pool.clone(),
        device_name: name.to_string(),
        cdi_device_ids: device.cdi_device_ids.clone(),
        share_id: device.share_id.clone(),
    };
    let recorded = CheckpointDevice::new(prepared, admin_access);
    Ok((recorded, why))
}

/// The CDI ids NVIDIA's plugin gives a claim's device: from v25.12 on the
/// claim spec's `k8s.gpu.nvidia.com/claim=<uid>-<device>`; before, the
/// base spec's `k8s.gpu.nvidia.com/device=<device>` and, when the device's
/// config had edits, the claim spec's (`GetStandardDevice` and
/// `GetClaimDevice` in their v25.3 to v25.8 `cdi.go`). Nothing else is ever
/// answered to the kubelet for an adopted claim.
fn check_cdi_ids(uid: &ClaimUid, name: &DeviceName, ids: &[String], driver: &DriverName) -> Result<(), Refusal> {
    let claim = claim_cdi_id(driver, uid, name);
    let standard = format!("{}/device={name}", cdi::vendor(driver));
    let valid = match ids {
        [one] => *one == claim || *one == standard,
        [first, second] => *first == standard && *second == claim,
        _ => false,
    };
    if valid {
        return Ok(());
    }
    Err(Refusal::CdiIds { device: name.to_string(), ids: ids.to_vec(), claim, standard })
}

fn claim_cdi_id(driver: &DriverName, uid: &ClaimUid, name: &DeviceName) -> String {
    format!("{}/{}={uid}-{name}", cdi::vendor(driver), cdi::CLAIM_CLASS)
}

/// Whether a missing spec of `record` may be written again: for an adopted
/// claim only when its containers reference nothing but the claim spec
/// (v25.12 on). An older claim's devices come from NVIDIA's base spec,
/// which stays where their plugin wrote it, and its claim spec held only
/// config edits this plugin cannot know.
pub(super) fn spec_restorable(record: &ClaimRecord, driver: &DriverName, uid: &ClaimUid) -> bool {
    record.adopted.as_ref().is_none_or(|adopted| {
        adopted.not_served.is_none()
            && record.devices.iter().all(|d| {
                DeviceName::new(d.device_name.as_str())
                    .is_ok_and(|name| d.cdi_device_ids == [claim_cdi_id(driver, uid, &name)])
            })
    })
}

/// Why this plugin cannot serve `name` as NVIDIA's plugin prepared it, if
/// it cannot.
fn not_served(name: &DeviceName, kind: &NvidiaDeviceKind, inventory: &Inventory) -> Option<String> {
    let here = inventory.find_device(name);
    match (kind, here) {
        (NvidiaDeviceKind::Gpu { uuid }, Some(PublishedDevice::Gpu(gpu))) if &gpu.uuid == uuid => None,
        (NvidiaDeviceKind::Gpu { uuid }, Some(PublishedDevice::Gpu(gpu))) => {
            Some(format!("{name} is {} on this node now, but NVIDIA's checkpoint prepared it as {uuid}", gpu.uuid))
        }
        (NvidiaDeviceKind::Mig { uuid }, Some(PublishedDevice::Mig { mig, .. })) if &mig.uuid == uuid => None,
        (NvidiaDeviceKind::Mig { uuid }, Some(PublishedDevice::DynamicMig { .. }) | None) => Some(format!(
            "MIG device {name} ({uuid}) was made by NVIDIA's driver (DynamicMIG), and this driver destroys only MIG \
             devices it made: once the claim is gone, remove it with `nvidia-smi mig -dci` and `nvidia-smi mig -dgi`"
        )),
        (NvidiaDeviceKind::Vfio, _) => Some(format!(
            "{name} was passed through to a VM by NVIDIA's driver and stays bound to vfio-pci: once the claim is \
             gone, bind it to the nvidia driver again"
        )),
        (_, _) => Some(format!("{name} is not published by this node as NVIDIA's checkpoint prepared it")),
    }
}

/// A Kubernetes UID as the scheduler makes share IDs: short, and only
/// letters, digits and dashes.
fn is_uid(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A request name as the API allows it: a DNS label, or `<request>/<sub>`.
fn is_request_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 127
        && name.split('/').count() <= 2
        && name.split('/').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

#[cfg(test)]
#[path = "tests_adopt.rs"]
mod tests;
