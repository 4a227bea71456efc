//! Dynamic MIG in a prepare: which of a claim's devices are made here (MIG
//! devices of dynamic GPUs) and which whole dynamic GPUs leave MIG mode,
//! what conflicts with other claims, and the inventory a prepared claim
//! sees (its instances as ordinary MIG devices), so that CDI, MPS and
//! time-slicing work on them unchanged. Pure; the side effects are in
//! [`crate::mig::lifecycle`], driven by the preparer.

use gpu_dra_driver::inventory::{Inventory, MigCapMinors, MigDevice, MigMode, MigProfile, PublishedDevice};

use super::plan::PlannedDevice;
use crate::state::checkpoint::{ClaimRecord, MigModeOff};
use crate::state::checkpoint::{MadeInstance, MigIntent};

/// Why a claim's dynamic MIG devices cannot be made: each names the
/// devices and what to do.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "devices {a} and {b} of the claim would overlap on GPU {gpu}: the allocation is damaged (the scheduler never \
         allocates overlapping placements); re-create the claim"
    )]
    Overlap { a: String, b: String, gpu: String },
    #[error(
        "device {0} is made for the claim that gets it (dynamic MIG): admin access to it is not supported; use a \
         claim without adminAccess"
    )]
    AdminAccess(String),
    #[error("device {0} is made for one claim (dynamic MIG) and cannot be shared")]
    Shared(String),
    #[error(
        "the claim's MIG layout conflicts with device {device} of ResourceClaim {namespace}/{name} ({uid}), prepared \
         on the same GPU: wait for that claim to be unprepared"
    )]
    Conflict { device: String, namespace: String, name: String, uid: String },
}

/// The dynamic MIG part of one claim, by index in its planned devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DynamicPlan {
    /// MIG devices to make.
    pub devices: Vec<(usize, MigIntent)>,
    /// Whole dynamic GPUs to take out of MIG mode.
    pub whole_gpus: Vec<(usize, MigModeOff)>,
}

impl DynamicPlan {
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty() && self.whole_gpus.is_empty()
    }

    /// The GPUs it touches (for the per-GPU locks).
    pub fn gpus(&self) -> impl Iterator<Item = &str> {
        self.devices
            .iter()
            .map(|(_, i)| i.gpu_uuid.as_str())
            .chain(self.whole_gpus.iter().map(|(_, w)| w.gpu_uuid.as_str()))
    }
}

/// Finds the claim's dynamic devices. A dynamic MIG device is made for one
/// claim: admin access (which watches a device another claim holds) and
/// shares are refused, as are overlapping placements within the claim.
pub fn plan(planned: &[PlannedDevice], inventory: &Inventory) -> Result<DynamicPlan, PlanError> {
    let mut out = DynamicPlan::default();
    for (index, device) in planned.iter().enumerate() {
        let intent = match inventory.find_device(&device.device) {
            Some(PublishedDevice::DynamicMig { parent, profile, placement }) => MigIntent {
                gpu_uuid: parent.uuid.clone(),
                gpu_minor: parent.minor,
                profile: profile.profile.name.clone(),
                profile_id: profile.profile.gi_profile_id,
                compute_profile_index: profile.compute_instance_profile_index,
                placement_start: placement.start,
                placement_size: placement.size,
            },
            Some(PublishedDevice::Gpu(gpu)) if gpu.dynamic_mig().is_some() => {
                refuse_shared(device)?;
                out.whole_gpus.push((index, MigModeOff { gpu_uuid: gpu.uuid.clone(), gpu_minor: gpu.minor }));
                continue;
            }
            _ => continue,
        };
        refuse_shared(device)?;
        out.devices.push((index, intent));
    }
    let intents: Vec<&MigIntent> = out.devices.iter().map(|(_, i)| i).collect();
    if let Some((a, b)) = crate::mig::order::overlap_within(&intents) {
        return Err(PlanError::Overlap {
            a: planned[out.devices[a].0].device.to_string(),
            b: planned[out.devices[b].0].device.to_string(),
            gpu: intents[a].gpu_uuid.clone(),
        });
    }
    Ok(out)
}

fn refuse_shared(device: &PlannedDevice) -> Result<(), PlanError> {
    if device.admin_access {
        return Err(PlanError::AdminAccess(device.device.to_string()));
    }
    if device.share_id.is_some() {
        return Err(PlanError::Shared(device.device.to_string()));
    }
    Ok(())
}

/// Refuses what another claim's record holds on the same GPUs: an
/// overlapping placement, a MIG device on a GPU taken out of MIG mode, or
/// such a GPU while MIG devices exist on it. The scheduler's counters never
/// allocate that way, but the kubelet may prepare a new claim before it
/// unprepared an old one (kubernetes#136269).
pub fn check_records<'a>(
    uid: &str,
    plan: &DynamicPlan,
    records: impl IntoIterator<Item = &'a ClaimRecord>,
) -> Result<(), PlanError> {
    for other in records.into_iter().filter(|r| r.uid != uid) {
        for theirs in &other.devices {
            let clash = if let Some(mig) = &theirs.dynamic_mig {
                plan.devices.iter().any(|(_, ours)| ours.overlaps(&mig.intent))
                    || plan.whole_gpus.iter().any(|(_, w)| w.gpu_uuid == mig.intent.gpu_uuid)
            } else if let Some(off) = &theirs.mig_mode_off {
                plan.gpus().any(|gpu| gpu == off.gpu_uuid)
            } else {
                false
            };
            if clash {
                return Err(PlanError::Conflict {
                    device: theirs.device_name.clone(),
                    namespace: other.namespace.clone(),
                    name: other.name.clone(),
                    uid: other.uid.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The inventory as the claim sees it once its devices are made: each
/// dynamic GPU it uses holds exactly its instances (as MIG devices), each
/// whole GPU it takes out of MIG mode is a plain GPU. `made` pairs each
/// intent with its instance; before anything is made, [`provisional`]
/// stands in.
pub fn overlay(inventory: &Inventory, made: &[(&MigIntent, &MadeInstance)], whole_gpus: &[&str]) -> Inventory {
    let mut out = inventory.clone();
    for gpu in &mut out.gpus {
        if whole_gpus.contains(&gpu.uuid.as_str()) {
            gpu.mig = MigMode::Disabled;
            continue;
        }
        let mine: Vec<MigDevice> = made
            .iter()
            .filter(|(intent, _)| intent.gpu_uuid == gpu.uuid)
            .map(|(intent, instance)| MigDevice {
                uuid: instance.uuid.clone(),
                profile: profile_of(gpu, intent),
                placement: intent.placement(),
                gpu_instance_id: instance.gpu_instance_id,
                compute_instance_id: instance.compute_instance_id,
                caps: Some(MigCapMinors {
                    gpu_instance: instance.gpu_instance_cap,
                    compute_instance: instance.compute_instance_cap,
                }),
                faults: Vec::new(),
            })
            .collect();
        if !mine.is_empty() {
            gpu.mig = MigMode::Enabled(mine);
        }
    }
    out
}

/// [`overlay`] with stand-ins for instances not made yet: every check of
/// a prepare (configs, sharing, the spec) runs on it before anything is
/// touched.
pub fn provisional(inventory: &Inventory, plan: &DynamicPlan) -> Inventory {
    let stand_ins: Vec<MadeInstance> = plan
        .devices
        .iter()
        .map(|(index, _)| MadeInstance {
            gpu_instance_id: 0,
            compute_instance_id: 0,
            uuid: format!("MIG-not-made-yet-{index}"),
            gpu_instance_cap: 0,
            compute_instance_cap: 0,
        })
        .collect();
    let made: Vec<(&MigIntent, &MadeInstance)> = plan.devices.iter().map(|(_, i)| i).zip(&stand_ins).collect();
    let whole: Vec<&str> = plan.whole_gpus.iter().map(|(_, w)| w.gpu_uuid.as_str()).collect();
    overlay(inventory, &made, &whole)
}

/// The overlay of a record's made devices (start-up rewriting a spec).
pub fn overlay_record(inventory: &Inventory, record: &ClaimRecord) -> Inventory {
    let made: Vec<(&MigIntent, &MadeInstance)> = record
        .devices
        .iter()
        .filter_map(|d| d.dynamic_mig.as_ref())
        .filter_map(|m| m.made.as_ref().map(|made| (&m.intent, made)))
        .collect();
    let whole: Vec<&str> =
        record.devices.iter().filter_map(|d| d.mig_mode_off.as_ref()).map(|w| w.gpu_uuid.as_str()).collect();
    if made.is_empty() && whole.is_empty() {
        return inventory.clone();
    }
    overlay(inventory, &made, &whole)
}

/// The profile as the GPU's capabilities describe it, else as recorded.
fn profile_of(gpu: &gpu_dra_driver::inventory::Gpu, intent: &MigIntent) -> MigProfile {
    gpu.mig_capabilities
        .as_ref()
        .and_then(|caps| caps.profile(intent.profile_id))
        .map(|p| p.profile.clone())
        .unwrap_or_else(|| MigProfile {
            name: intent.profile.clone(),
            gi_profile_id: intent.profile_id,
            multiprocessors: 0,
            copy_engines: 0,
            decoders: 0,
            encoders: 0,
            jpeg_engines: 0,
            ofa_engines: 0,
            memory_bytes: 0,
        })
}

/// Names each made MIG device's UUID in its CDI device's environment,
/// `GPU_DRA_MIG_UUID_<DEVICE>=MIG-...` (the device name upper-cased, `-`
/// as `_`): a dynamic device's UUID exists only once prepared, so the
/// container is told which instance it got (e.g. for
/// `CUDA_VISIBLE_DEVICES`, or to match `nvidia-smi -L`).
pub fn add_uuid_env(spec: &mut gpu_dra_driver::cdi::Spec, uid: &str, record: &ClaimRecord) {
    for device in &record.devices {
        let Some(made) = device.dynamic_mig.as_ref().and_then(|m| m.made.as_ref()) else { continue };
        let cdi_name = format!("{uid}-{}", device.device_name);
        if let Some(cdi) = spec.devices.iter_mut().find(|d| d.name == cdi_name) {
            let var = device.device_name.to_ascii_uppercase().replace('-', "_");
            cdi.container_edits.env.push(format!("GPU_DRA_MIG_UUID_{var}={}", made.uuid));
        }
    }
}

/// Whether `gpu_uuid` is a GPU the plugin manages dynamically now: only
/// there does it ever destroy or make an instance, whatever a record says.
pub fn is_dynamic(inventory: &Inventory, gpu_uuid: &str) -> bool {
    inventory.gpus.iter().any(|g| g.uuid == gpu_uuid && g.dynamic_mig().is_some())
}
