//! Start-up for dynamic MIG, beside [`super::reconcile`], and the release
//! of what a claim made, shared with unprepare. Everything destroyed or
//! switched back is what the ownership ledger proves the plugin's
//! ([`crate::mig::ownership`]); a record only says what a claim wants.
//! - a completed record that names what its claim's ledger does not hold
//!   is damaged: set aside (with its spec, its claim may be in use), and
//!   nothing it names is destroyed or made; its ledger is kept until the
//!   kubelet unprepares the claim, which then releases what the plugin
//!   provably made for it;
//! - an interrupted prepare's instances are destroyed (those the ledger
//!   proves, so a half-made one too) and its whole GPUs put back in MIG
//!   mode, *before* its record goes, so a crash during start-up repeats
//!   this; its ledger goes after the record;
//! - a ledger whose claim has no record left (a roll-back killed after
//!   the record went) is released the same way;
//! - on every GPU managed dynamically, an instance of the plugin's that no
//!   kept claim holds is destroyed, and a kept claim's instance that
//!   vanished (or lost its compute instance) is made again at its
//!   placement, its new identity in the ledger and the record and its spec
//!   rewritten, before the kubelet is served; a whole GPU a kept claim
//!   holds is taken out of MIG mode again if it is back in it;
//! - an instance nothing proves the plugin's is never destroyed: on a
//!   dynamic GPU it is kept (with its placement withheld from the published
//!   devices when the ledger shows the plugin was about to create it there).
//!
//! A GPU not managed dynamically (an administrator's MIG layout, or MIG
//! off) never has an instance touched, whatever a record says, and MIG
//! mode is turned on only where the ledger says the plugin turned it off.

use std::collections::{HashMap, HashSet};

use gpu_dra_driver::cdi;
use gpu_dra_driver::inventory::Inventory;
use gpu_dra_driver::names::ClaimUid;

use super::config::PreparerConfig;
use super::dynamic_mig::{is_dynamic, overlay_record};
use super::files::CDI_FILE_MODE;
use crate::mig::ledger::{ClaimLedger, Made};
use crate::mig::lifecycle::{self, MigHost};
use crate::mig::ownership::{self, Proof};
use crate::mig::{self, ObservedInstance, order};
use crate::state::checkpoint::MigIntent;
use crate::state::checkpoint::{CheckpointDir, ClaimRecord, PrepareState};
use crate::state::durable;

/// What start-up did to dynamic MIG instances, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MigReport {
    /// Instances destroyed because they are the plugin's and no kept claim
    /// holds them.
    pub destroyed: usize,
    /// Claims whose vanished instances were made again.
    pub remade: Vec<String>,
    /// Instances on dynamic GPUs nothing proves the plugin's: kept.
    pub kept_unproven: usize,
    /// Ledger files that could not be read, set aside.
    pub damaged_ledgers: usize,
}

/// Reads the ownership ledger (before any record is judged against it);
/// how many of its files were damaged and set aside.
pub(super) fn load_ledger(config: &PreparerConfig) -> usize {
    let Some(host) = &config.mig else { return 0 };
    let damaged = host.ledger.load();
    for d in &damaged {
        tracing::error!(file = %d.path.display(), reason = %d.reason, "damaged MIG ledger file set aside (.damaged): what it recorded is proven by nothing now, so left alone; remove those MIG devices by hand if no claim uses them");
    }
    damaged.len()
}

/// Whether a record may be acted on: a completed record of this boot that
/// names dynamic MIG devices or whole GPUs must agree with its claim's
/// ledger (see [`ownership::check_record`]).
pub(super) fn check(config: &PreparerConfig, record: &ClaimRecord) -> Result<(), ownership::LedgerDisagrees> {
    if record.boot_id != config.boot_id
        || record.state != PrepareState::PrepareCompleted
        || !ownership::touches_mig(record)
    {
        return Ok(());
    }
    let Some(host) = &config.mig else { return Ok(()) };
    ownership::check_record(record, host.ledger.get(&record.uid).as_ref())
}

/// Undoes what an interrupted (or pre-reboot) record's claim made.
/// `Err` leaves the record for the kubelet's next call to roll back.
pub(super) fn roll_back(
    config: &PreparerConfig,
    inventory: &Inventory,
    record: &ClaimRecord,
) -> Result<(), mig::Error> {
    let Some(host) = &config.mig else { return Ok(()) };
    release(host, inventory, &record.uid, &config.boot_id)
}

/// Once a rolled-back record is gone: forgets its claim's ledger.
pub(super) fn forget_after(config: &PreparerConfig, uid: &str) {
    let Some(host) = &config.mig else { return };
    if let Err(error) = forget(host, uid) {
        tracing::error!(claim_uid = %uid, %error, "removing a released claim's MIG ledger failed; start-up retries");
    }
}

fn minor_of(inventory: &Inventory, gpu: &str) -> u32 {
    inventory.gpus.iter().find(|g| g.uuid == gpu).map_or(0, |g| g.minor)
}

/// Releases what the plugin made for claim `uid`, as its ledger says:
/// destroys the instances NVML still shows as the ones it made (this boot
/// only: a reboot took them), on GPUs managed dynamically now, in reverse
/// creation order; turns MIG mode on again on the GPUs the ledger says it
/// turned off for the claim. The ledger itself stays (see [`forget`]).
pub(super) fn release(host: &MigHost, inventory: &Inventory, uid: &str, boot_id: &str) -> Result<(), mig::Error> {
    let Some(entry) = host.ledger.get(uid) else { return Ok(()) };
    let mut own = host.ledger.claim(uid, &entry.boot_id);
    if entry.boot_id == boot_id {
        let intents: Vec<MigIntent> = entry
            .instances
            .iter()
            .filter(|o| o.made != Made::Destroyed)
            .map(|o| o.intent(minor_of(inventory, &o.gpu_uuid)))
            .collect();
        let (ours, elsewhere): (Vec<&MigIntent>, Vec<&MigIntent>) =
            intents.iter().partition(|i| is_dynamic(inventory, &i.gpu_uuid));
        if !elsewhere.is_empty() {
            tracing::warn!(claim_uid = %uid, devices = elsewhere.len(), "the claim's MIG devices are on GPUs not managed dynamically now; their instances are left alone");
        }
        lifecycle::unmake_all(host, &mut own, &ours)?;
        if !ours.is_empty() {
            tracing::info!(claim_uid = %uid, devices = ours.len(), "released the MIG devices the plugin made for a claim");
        }
    }
    for gpu in &entry.mig_mode_off {
        if inventory.gpus.iter().any(|g| &g.uuid == gpu) {
            lifecycle::switch_mig_mode(host, gpu, true)?;
        }
    }
    Ok(())
}

/// Forgets claim `uid`'s ledger once its record is gone, but for the
/// instances it was about to create that exist: nothing proves them ours,
/// so they stay, and the entry keeps their placements withheld until
/// someone removes them.
pub(super) fn forget(host: &MigHost, uid: &str) -> Result<(), mig::Error> {
    let Some(mut entry) = host.ledger.get(uid) else { return Ok(()) };
    entry.mig_mode_off.clear();
    entry.instances.retain(|o| {
        o.made == Made::Creating
            && host.control.instances(&o.gpu_uuid).is_ok_and(|observed| {
                observed.iter().any(|i| i.profile_id == o.profile_id && i.placement.start == o.placement_start)
            })
    });
    if entry.instances.is_empty() {
        return host.ledger.remove(uid);
    }
    for o in &entry.instances {
        tracing::warn!(claim_uid = %uid, gpu = %o.gpu_uuid, profile_id = o.profile_id, start = o.placement_start, size = o.placement_size, "a MIG instance sits where the plugin was about to create one when it stopped; nothing proves it is the plugin's, so it is kept and its placement withheld: if no one uses it, remove it with nvidia-smi mig -dci and -dgi, and the placement is offered again");
    }
    host.ledger.write(&entry)
}

/// Releases and forgets the ledgers of claims with no record at all (not
/// kept, not set aside): a roll-back or unprepare killed after the
/// record went.
pub(super) fn release_orphans(
    config: &PreparerConfig,
    inventory: &Inventory,
    kept: &HashMap<String, ClaimRecord>,
    owners: &HashSet<String>,
) {
    let Some(host) = &config.mig else { return };
    for ledger in host.ledger.all() {
        if kept.contains_key(&ledger.uid) || owners.contains(&ledger.uid) {
            continue;
        }
        let released = release(host, inventory, &ledger.uid, &config.boot_id).and_then(|()| forget(host, &ledger.uid));
        if let Err(error) = released {
            tracing::error!(claim_uid = %ledger.uid, %error, "releasing what the plugin made for a claim with no record failed; the next start-up retries");
        }
    }
}

/// Which kept claim's ledger proves `observed` (on `gpu`) the plugin's.
fn prover<'a>(
    ledgers: &'a [ClaimLedger],
    host: &MigHost,
    gpu: &str,
    observed: &ObservedInstance,
) -> Option<(&'a ClaimLedger, &'a crate::mig::ledger::OwnedInstance)> {
    let uuid_of = |gi: u32, ci: u32| host.control.mig_uuid(gpu, gi, ci).ok();
    ledgers.iter().find_map(|l| {
        l.instances
            .iter()
            .find(|o| o.gpu_uuid == gpu && ownership::judge(o, observed, &uuid_of) == Proof::Ours)
            .map(|o| (l, o))
    })
}

/// Settles every dynamic GPU against the completed records kept; the
/// instances of claims whose records were `set_aside` are kept too.
pub(super) fn settle(
    config: &PreparerConfig,
    checkpoint: &CheckpointDir,
    inventory: &Inventory,
    kept: &mut HashMap<String, ClaimRecord>,
    set_aside: &HashSet<String>,
) -> MigReport {
    let mut report = MigReport::default();
    let Some(host) = &config.mig else { return report };
    let (ledgers, aside): (Vec<ClaimLedger>, Vec<ClaimLedger>) = host
        .ledger
        .all()
        .into_iter()
        .filter(|l| l.boot_id == config.boot_id && (kept.contains_key(&l.uid) || set_aside.contains(&l.uid)))
        .partition(|l| kept.contains_key(&l.uid));
    for gpu in inventory.gpus.iter().filter(|g| g.dynamic_mig().is_some()) {
        let observed = match host.control.instances(&gpu.uuid) {
            Ok(observed) => observed,
            Err(error) => {
                tracing::error!(gpu = %gpu.uuid, %error, "cannot list the MIG instances of a dynamic GPU; left as they are");
                continue;
            }
        };
        // (claim uid, device index) of every recorded device on this GPU.
        let mut owners: Vec<(String, usize)> = Vec::new();
        let mut owned: Vec<(&MigIntent, Option<u32>)> = Vec::new();
        for record in kept.values().filter(|r| r.state == PrepareState::PrepareCompleted) {
            for (index, device) in record.devices.iter().enumerate() {
                if let Some(mig) = device.dynamic_mig.as_ref().filter(|m| m.intent.gpu_uuid == gpu.uuid) {
                    owners.push((record.uid.clone(), index));
                    owned.push((&mig.intent, mig.made.as_ref().map(|m| m.gpu_instance_id)));
                }
            }
        }
        let is_ours = |o: &ObservedInstance| prover(&ledgers, host, &gpu.uuid, o).is_some();
        let settlement = order::settle(&observed, &owned, &is_ours);
        for instance in &settlement.destroy {
            let Some((ledger, entry)) = prover(&ledgers, host, &gpu.uuid, instance) else { continue };
            let intent = entry.intent(gpu.minor);
            let destroyed = lifecycle::destroy_observed(&*host.control, &gpu.uuid, instance)
                .map_err(mig::Error::from)
                .and_then(|()| host.ledger.claim(&ledger.uid, &ledger.boot_id).destroyed(&intent));
            match destroyed {
                Ok(()) => {
                    report.destroyed += 1;
                    tracing::warn!(gpu = %gpu.uuid, gpu_instance = instance.gpu_instance_id, start = instance.placement.start, size = instance.placement.size, "destroyed a MIG instance the plugin made that no prepared claim holds");
                }
                Err(error) => {
                    tracing::error!(gpu = %gpu.uuid, gpu_instance = instance.gpu_instance_id, %error, "destroying a MIG instance no claim holds failed")
                }
            }
        }
        for instance in &settlement.kept {
            if prover(&aside, host, &gpu.uuid, instance).is_some() {
                tracing::warn!(gpu = %gpu.uuid, gpu_instance = instance.gpu_instance_id, "a MIG instance the plugin made for a claim whose record was set aside: kept until the kubelet unprepares that claim");
                continue;
            }
            report.kept_unproven += 1;
            tracing::warn!(gpu = %gpu.uuid, gpu_instance = instance.gpu_instance_id, start = instance.placement.start, size = instance.placement.size, "a MIG instance on a dynamic GPU that nothing proves the plugin made: left alone (if no one uses it, remove it with nvidia-smi mig -dci / -dgi -gi {} -i {})", instance.gpu_instance_id, gpu.minor);
        }
        for index in settlement.remake {
            let (uid, device) = owners[index].clone();
            if remake(config, checkpoint, inventory, kept, &uid, device) && !report.remade.contains(&uid) {
                report.remade.push(uid);
            }
        }
    }
    for (uid, gpu) in whole_gpus_back_in_mig_mode(inventory, kept) {
        tracing::warn!(claim_uid = %uid, %gpu, "a prepared claim holds this GPU whole but it is in MIG mode again; turning MIG mode off");
        match lifecycle::switch_mig_mode(host, &gpu, false) {
            Ok(()) if !report.remade.contains(&uid) => report.remade.push(uid),
            Ok(()) => {}
            Err(error) => {
                tracing::error!(claim_uid = %uid, %gpu, %error, "turning MIG mode off for a prepared claim failed; its containers get a GPU in MIG mode")
            }
        }
    }
    report
}

/// (claim, GPU) of every whole GPU a completed record took out of MIG mode
/// (which its ledger confirms, see [`check`]) that is dynamic (so in MIG
/// mode, without foreign instances) again: an unprepare stopped after its
/// switch, or a GPU reset.
fn whole_gpus_back_in_mig_mode(inventory: &Inventory, kept: &HashMap<String, ClaimRecord>) -> Vec<(String, String)> {
    kept.values()
        .filter(|r| r.state == PrepareState::PrepareCompleted)
        .flat_map(|r| r.devices.iter().filter_map(|d| d.mig_mode_off.as_ref()).map(|off| (r.uid.clone(), off)))
        .filter(|(_, off)| inventory.gpus.iter().any(|g| g.uuid == off.gpu_uuid && g.dynamic_mig().is_some()))
        .map(|(uid, off)| (uid, off.gpu_uuid.clone()))
        .collect()
}

/// Makes a prepared claim's vanished device again (recording each step in
/// its ledger, which [`check`] showed holds it) and records it.
fn remake(
    config: &PreparerConfig,
    checkpoint: &CheckpointDir,
    inventory: &Inventory,
    kept: &mut HashMap<String, ClaimRecord>,
    uid: &str,
    device: usize,
) -> bool {
    let (Some(host), Some(record)) = (&config.mig, kept.get_mut(uid)) else { return false };
    tracing::warn!(claim_uid = %uid, device = %record.devices[device].device_name, "the MIG device of a prepared claim is gone; making it again");
    let boot_id = record.boot_id.clone();
    let Some(mig) = record.devices[device].dynamic_mig.as_mut() else { return false };
    let mut own = host.ledger.claim(uid, &boot_id);
    let made = match lifecycle::make(host, &mut own, &mig.intent) {
        Ok(made) => made,
        Err(error) => {
            tracing::error!(claim_uid = %uid, %error, "making a prepared claim's MIG device again failed; its containers will not find it");
            return false;
        }
    };
    mig.made = Some(made);
    let Ok(claim_uid) = ClaimUid::new(uid) else { return false };
    if let Err(error) = checkpoint.write(&claim_uid, record) {
        tracing::error!(claim_uid = %uid, %error, "recording a remade MIG device failed; the next start-up finds its record behind its ledger");
        return false;
    }
    let names: Result<Vec<_>, _> =
        record.devices.iter().map(|d| gpu_dra_driver::names::DeviceName::new(d.device_name.as_str())).collect();
    let view = overlay_record(inventory, record);
    let spec_file = cdi::claim_spec_file_name(&config.driver, &claim_uid);
    let written = names
        .map_err(|e| e.to_string())
        .and_then(|names| {
            cdi::claim_spec(&config.driver, &view, &config.driver_edits.get(), &claim_uid, &names)
                .map_err(|e| e.to_string())
        })
        .map(|mut spec| {
            if let Some(daemon) = &record.mps {
                super::mps::add_edits(&mut spec.spec, daemon, uid);
            }
            super::dynamic_mig::add_uuid_env(&mut spec.spec, uid, record);
            spec
        })
        .and_then(|spec| spec.to_json().map_err(|e| e.to_string()))
        .and_then(|bytes| {
            durable::write(&config.cdi_dir, &spec_file, &bytes, CDI_FILE_MODE).map_err(|e| e.to_string())
        });
    if let Err(error) = written {
        tracing::error!(claim_uid = %uid, %error, "rewriting the CDI spec of a remade MIG device failed");
        return false;
    }
    true
}
