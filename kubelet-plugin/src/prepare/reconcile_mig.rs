//! Start-up for dynamic MIG, beside [`super::reconcile`]:
//! - an interrupted prepare's instances are destroyed (by placement, so a
//!   half-made one too) and its whole GPUs put back in MIG mode, *before*
//!   its record goes, so a crash during start-up repeats this;
//! - on every GPU managed dynamically, an instance no completed record
//!   owns is destroyed, and a completed record's instance that vanished
//!   (or lost its compute instance) is made again at its placement, its
//!   new UUID and caps recorded and its spec rewritten, before the kubelet
//!   is served (so before the claim's containers start); a whole GPU a
//!   completed record holds is taken out of MIG mode again if it is back
//!   in it.
//!
//! A GPU not managed dynamically (an administrator's MIG layout, or MIG
//! off) is never touched, whatever a record says.

use std::collections::HashMap;

use gpu_dra_driver::cdi;
use gpu_dra_driver::inventory::Inventory;
use gpu_dra_driver::names::ClaimUid;

use super::dynamic_mig::{is_dynamic, overlay_record};
use super::{CDI_FILE_MODE, PreparerConfig};
use crate::mig::{MigIntent, lifecycle, order};
use crate::state::checkpoint::{CheckpointDir, ClaimRecord, PrepareState};
use crate::state::durable;

/// What start-up did to dynamic MIG instances, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MigReport {
    /// Instances destroyed because no completed record owns them.
    pub destroyed: usize,
    /// Claims whose vanished instances were made again.
    pub remade: Vec<String>,
}

fn intents(record: &ClaimRecord) -> Vec<&MigIntent> {
    record.devices.iter().filter_map(|d| d.dynamic_mig.as_ref()).map(|m| &m.intent).collect()
}

fn touches_mig(record: &ClaimRecord) -> bool {
    record.devices.iter().any(|d| d.dynamic_mig.is_some() || d.mig_mode_off.is_some())
}

/// Undoes what an interrupted (or pre-reboot) record may have made.
/// `Err` leaves the record for the kubelet's next call to roll back.
pub(super) fn roll_back(config: &PreparerConfig, inventory: &Inventory, record: &ClaimRecord) -> Result<(), String> {
    if !touches_mig(record) {
        return Ok(());
    }
    let Some(host) = &config.mig else { return Ok(()) };
    let (ours, elsewhere): (Vec<&MigIntent>, Vec<&MigIntent>) =
        intents(record).into_iter().partition(|i| is_dynamic(inventory, &i.gpu_uuid));
    if !elsewhere.is_empty() {
        tracing::warn!(claim_uid = %record.uid, devices = elsewhere.len(), "the record names MIG devices on GPUs not managed dynamically; their instances are left alone");
    }
    lifecycle::unmake_all(host, &ours)?;
    tracing::info!(claim_uid = %record.uid, devices = ours.len(), "removed the MIG devices of an interrupted prepare");
    for off in record.devices.iter().filter_map(|d| d.mig_mode_off.as_ref()) {
        if inventory.gpus.iter().any(|g| g.uuid == off.gpu_uuid) {
            lifecycle::switch_mig_mode(host, &off.gpu_uuid, true)?;
        }
    }
    Ok(())
}

/// Settles every dynamic GPU against the completed records kept.
pub(super) fn settle(
    config: &PreparerConfig,
    checkpoint: &CheckpointDir,
    inventory: &Inventory,
    kept: &mut HashMap<String, ClaimRecord>,
) -> MigReport {
    let mut report = MigReport::default();
    let Some(host) = &config.mig else { return report };
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
        let settlement = order::settle(&observed, &owned);
        for instance in &settlement.destroy {
            match lifecycle::destroy_observed(&*host.control, &gpu.uuid, instance) {
                Ok(()) => {
                    report.destroyed += 1;
                    tracing::warn!(gpu = %gpu.uuid, gpu_instance = instance.gpu_instance_id, start = instance.placement.start, size = instance.placement.size, "destroyed a MIG instance on a dynamic GPU that no prepared claim owns");
                }
                Err(error) => {
                    tracing::error!(gpu = %gpu.uuid, gpu_instance = instance.gpu_instance_id, %error, "destroying a MIG instance no claim owns failed")
                }
            }
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
/// that is dynamic (so in MIG mode, without foreign instances) again: an
/// unprepare stopped after its switch, or a GPU reset.
fn whole_gpus_back_in_mig_mode(inventory: &Inventory, kept: &HashMap<String, ClaimRecord>) -> Vec<(String, String)> {
    kept.values()
        .filter(|r| r.state == PrepareState::PrepareCompleted)
        .flat_map(|r| r.devices.iter().filter_map(|d| d.mig_mode_off.as_ref()).map(|off| (r.uid.clone(), off)))
        .filter(|(_, off)| inventory.gpus.iter().any(|g| g.uuid == off.gpu_uuid && g.dynamic_mig().is_some()))
        .map(|(uid, off)| (uid, off.gpu_uuid.clone()))
        .collect()
}

/// Makes a prepared claim's vanished device again and records it.
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
    let Some(mig) = record.devices[device].dynamic_mig.as_mut() else { return false };
    let made = match lifecycle::make(host, &mig.intent) {
        Ok(made) => made,
        Err(error) => {
            tracing::error!(claim_uid = %uid, %error, "making a prepared claim's MIG device again failed; its containers will not find it");
            return false;
        }
    };
    mig.made = Some(made);
    let Ok(claim_uid) = ClaimUid::new(uid) else { return false };
    if let Err(error) = checkpoint.write(&claim_uid, record) {
        tracing::error!(claim_uid = %uid, %error, "recording a remade MIG device failed; the next start-up finds it unowned");
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
