//! Which MIG instances and MIG mode switches are the plugin's: only what
//! the ownership ledger ([`super::ledger`]) recorded when the plugin made
//! it, *and* NVML still shows as that same instance. A checkpoint record
//! never proves anything: it says what a claim wants, and a record naming
//! what the ledger does not hold for its claim is damaged.
//!
//! - An instance is ours when NVML shows, at the ledger entry's GPU,
//!   profile and placement, a GPU instance with the id NVML returned to our
//!   create call and, once recorded, the compute instance id and `MIG-`
//!   UUID read back after creation (or no compute instance any more: our
//!   unprepare destroyed it). Only such an instance is ever destroyed.
//! - An instance at a placement the ledger says the plugin was *about* to
//!   create (killed between the call and the write after it) cannot be
//!   told from one someone else made there: it is kept, its placement
//!   withheld from the GPU's published devices, and the GPU stays dynamic
//!   (the entry proves the plugin was making instances on it).
//! - MIG mode is turned on again only where the ledger says the plugin
//!   turned it off for that claim (on a GPU dynamic at the time).

use std::collections::BTreeSet;

use gpu_dra_driver::inventory::Placement;

use super::control::MigControl;
use super::control::ObservedInstance;
use super::ledger::{ClaimLedger, Made, OwnedInstance};
use crate::state::checkpoint::{ClaimRecord, MigIntent};

/// What NVML shows at a ledger entry's placement, judged against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// The instance is the one the plugin made: it may be destroyed.
    Ours,
    /// An instance is there but nothing proves it is the plugin's: kept.
    Unproven,
}

/// Judges `observed` (at `entry`'s exact profile and placement) against
/// the entry; `uuid_of` reads the MIG UUID of a compute instance.
pub fn judge(
    entry: &OwnedInstance,
    observed: &ObservedInstance,
    uuid_of: &dyn Fn(u32, u32) -> Option<String>,
) -> Proof {
    let at = observed.profile_id == entry.profile_id
        && observed.placement == Placement { start: entry.placement_start, size: entry.placement_size };
    let proven = at
        && match &entry.made {
            Made::GpuInstance { gpu_instance_id } => {
                observed.gpu_instance_id == *gpu_instance_id && observed.compute_instances.is_empty()
            }
            Made::Complete { gpu_instance_id, compute_instance_id, mig_uuid } => {
                observed.gpu_instance_id == *gpu_instance_id
                    && match observed.compute_instances.as_slice() {
                        [] => true,
                        [ci] => {
                            ci == compute_instance_id
                                && uuid_of(observed.gpu_instance_id, *ci).as_deref() == Some(mig_uuid.as_str())
                        }
                        _ => false,
                    }
            }
            Made::Creating | Made::Destroyed => false,
        };
    if proven { Proof::Ours } else { Proof::Unproven }
}

/// The `MIG-` UUIDs of complete instances in the ledgers of `boot_id`:
/// what keeps a GPU holding them dynamic after a restart.
pub fn owned_uuids<'a>(ledgers: impl IntoIterator<Item = &'a ClaimLedger>, boot_id: &str) -> BTreeSet<String> {
    ledgers
        .into_iter()
        .filter(|l| l.boot_id == boot_id)
        .flat_map(|l| &l.instances)
        .filter_map(|o| match &o.made {
            Made::Complete { mig_uuid, .. } => Some(mig_uuid.clone()),
            _ => None,
        })
        .collect()
}

/// An instance kept because the plugin may have made it but cannot prove
/// it: its GPU stays dynamic, its placement is not offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    pub gpu_uuid: String,
    pub gpu_instance_id: u32,
    pub placement: Placement,
    /// Its MIG UUID, when it has a compute instance (so it is in the
    /// inventory, where it must not make the GPU an administrator's).
    pub mig_uuid: Option<String>,
}

/// The instances NVML shows at placements the ledgers of `boot_id` were
/// about to create (`Creating`) and cannot prove theirs.
pub fn withheld<'a>(
    ledgers: impl IntoIterator<Item = &'a ClaimLedger>,
    boot_id: &str,
    control: &dyn MigControl,
) -> Vec<Withheld> {
    let mut out: Vec<Withheld> = Vec::new();
    for entry in ledgers.into_iter().filter(|l| l.boot_id == boot_id).flat_map(|l| &l.instances) {
        if entry.made != Made::Creating {
            continue;
        }
        let Ok(observed) = control.instances(&entry.gpu_uuid) else { continue };
        let placement = Placement { start: entry.placement_start, size: entry.placement_size };
        for o in observed.iter().filter(|o| o.profile_id == entry.profile_id && o.placement == placement) {
            if out.iter().any(|w| w.gpu_uuid == entry.gpu_uuid && w.gpu_instance_id == o.gpu_instance_id) {
                continue;
            }
            let mig_uuid = o
                .compute_instances
                .first()
                .and_then(|&ci| control.mig_uuid(&entry.gpu_uuid, o.gpu_instance_id, ci).ok());
            out.push(Withheld {
                gpu_uuid: entry.gpu_uuid.clone(),
                gpu_instance_id: o.gpu_instance_id,
                placement,
                mig_uuid,
            });
        }
    }
    out
}

/// Whether a completed record agrees with its claim's ledger: every
/// dynamic MIG device it names is one the plugin started making for this
/// claim (and, where the ledger holds the made instance, that same
/// instance), every whole GPU one whose MIG mode the plugin turned off for
/// it. `Err` says which field does not, and what to do: the record is then
/// set aside, and nothing it names is destroyed or made.
pub fn check_record(record: &ClaimRecord, ledger: Option<&ClaimLedger>) -> Result<(), LedgerDisagrees> {
    for (index, device) in record.devices.iter().enumerate() {
        if let Some(mig) = &device.dynamic_mig {
            let entry = ledger.and_then(|l| l.instance(&mig.intent));
            let Some(entry) = entry else {
                return Err(LedgerDisagrees::NotMade { index, intent: Box::new(mig.intent.clone()) });
            };
            if let (Some(made), Made::Complete { gpu_instance_id, compute_instance_id, mig_uuid }) =
                (&mig.made, &entry.made)
                && (made.uuid != *mig_uuid
                    || made.gpu_instance_id != *gpu_instance_id
                    || made.compute_instance_id != *compute_instance_id)
            {
                return Err(LedgerDisagrees::OtherInstance {
                    index,
                    recorded_uuid: made.uuid.clone(),
                    recorded_gpu_instance: made.gpu_instance_id,
                    made_uuid: mig_uuid.clone(),
                    made_gpu_instance: *gpu_instance_id,
                });
            }
        }
        if let Some(off) = &device.mig_mode_off
            && !ledger.is_some_and(|l| l.mig_mode_off.contains(&off.gpu_uuid))
        {
            return Err(LedgerDisagrees::ModeNotTurnedOff { index, gpu_uuid: off.gpu_uuid.clone() });
        }
    }
    Ok(())
}

/// Which field of a completed record its claim's MIG ledger contradicts,
/// and what becomes of the record (set aside) and of what it names (left
/// alone).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerDisagrees {
    #[error(
        "field `devices[{index}].dynamicMig` names {} at memory slices {}..{} of GPU {}: the plugin did not make it \
         for this claim (its MIG ledger has no such entry); the record is set aside and the instance left alone: if \
         the claim is not in use, remove the MIG device by hand (nvidia-smi mig -dci / -dgi)",
        quoted(&intent.profile),
        intent.placement_start,
        intent.placement_start + intent.placement_size,
        quoted(&intent.gpu_uuid)
    )]
    NotMade { index: usize, intent: Box<MigIntent> },
    #[error(
        "field `devices[{index}].dynamicMig.made` names MIG device {} (GPU instance {recorded_gpu_instance}), but the \
         plugin made {made_uuid} (GPU instance {made_gpu_instance}) there for this claim: the record is set aside and \
         neither instance is destroyed on its word",
        quoted(recorded_uuid)
    )]
    OtherInstance {
        index: usize,
        recorded_uuid: String,
        recorded_gpu_instance: u32,
        made_uuid: String,
        made_gpu_instance: u32,
    },
    #[error(
        "field `devices[{index}].migModeOff` names GPU {}, whose MIG mode the plugin did not turn off for this claim \
         (its MIG ledger says not): the record is set aside and the GPU's MIG mode left as it is",
        quoted(gpu_uuid)
    )]
    ModeNotTurnedOff { index: usize, gpu_uuid: String },
}

/// Whether `record` names a dynamic MIG device or a whole dynamic GPU.
pub fn touches_mig(record: &ClaimRecord) -> bool {
    record.devices.iter().any(|d| d.dynamic_mig.is_some() || d.mig_mode_off.is_some())
}

fn quoted(value: &str) -> String {
    crate::state::checkpoint::derived::quoted(value)
}

/// The intents of a record's dynamic MIG devices.
pub fn intents(record: &ClaimRecord) -> Vec<&MigIntent> {
    record.devices.iter().filter_map(|d| d.dynamic_mig.as_ref()).map(|m| &m.intent).collect()
}

#[cfg(test)]
mod tests {
    use super::super::control::fake::FakeControl;
    use super::super::ledger::Ledger;
    use super::*;
    use crate::state::checkpoint::MadeInstance;
    use crate::state::checkpoint::{DynamicMigDevice, MigModeOff, PrepareState};

    const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    use super::super::test_support::intent;

    fn entry(start: u32, made: Made) -> OwnedInstance {
        OwnedInstance { gpu_uuid: "GPU-a".into(), profile_id: 19, placement_start: start, placement_size: 1, made }
    }

    #[test]
    fn only_the_instance_nvml_returned_to_us_is_ours() {
        let control = FakeControl::with_gpus(&["GPU-a"]);
        let p = Placement { start: 3, size: 1 };
        let gi = control.create_gpu_instance("GPU-a", 19, p).unwrap();
        let uuid_of = |gi: u32, ci: u32| control.mig_uuid("GPU-a", gi, ci).ok();
        let half = &control.instances("GPU-a").unwrap()[0];
        assert_eq!(judge(&entry(3, Made::GpuInstance { gpu_instance_id: gi }), half, &uuid_of), Proof::Ours);
        assert_eq!(judge(&entry(3, Made::GpuInstance { gpu_instance_id: gi + 1 }), half, &uuid_of), Proof::Unproven);
        assert_eq!(judge(&entry(3, Made::Creating), half, &uuid_of), Proof::Unproven, "about to create: unproven");
        assert_eq!(judge(&entry(3, Made::Destroyed), half, &uuid_of), Proof::Unproven);
        let (ci, uuid) = control.create_compute_instance("GPU-a", gi, 0).unwrap();
        let whole = &control.instances("GPU-a").unwrap()[0];
        let complete = |uuid: &str| {
            entry(3, Made::Complete { gpu_instance_id: gi, compute_instance_id: ci, mig_uuid: uuid.into() })
        };
        assert_eq!(judge(&complete(&uuid), whole, &uuid_of), Proof::Ours);
        assert_eq!(judge(&complete("MIG-other"), whole, &uuid_of), Proof::Unproven, "another instance there now");
        assert_eq!(
            judge(&entry(3, Made::GpuInstance { gpu_instance_id: gi }), whole, &uuid_of),
            Proof::Unproven,
            "a compute instance the ledger never recorded"
        );
        assert_eq!(judge(&entry(4, Made::GpuInstance { gpu_instance_id: gi }), half, &uuid_of), Proof::Unproven);
    }

    fn record(made: Option<&str>, off: Option<&str>) -> ClaimRecord {
        let mut r = crate::state::checkpoint::test_support::record(UID, &["gpu-0-mig-1g10gb-19-3"]);
        r.state = PrepareState::PrepareCompleted;
        r.devices[0].dynamic_mig = Some(DynamicMigDevice {
            intent: intent(3),
            made: made.map(|uuid| MadeInstance {
                gpu_instance_id: 1,
                compute_instance_id: 0,
                uuid: uuid.into(),
                gpu_instance_cap: 0,
                compute_instance_cap: 0,
            }),
        });
        r.devices[0].mig_mode_off = off.map(|gpu| MigModeOff { gpu_uuid: gpu.into(), gpu_minor: 1 });
        r
    }

    #[test]
    fn a_record_must_agree_with_the_ledger() {
        let tmp = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(tmp.path());
        let error = check_record(&record(Some("MIG-admin"), None), None).unwrap_err().to_string();
        assert!(error.starts_with("field `devices[0].dynamicMig` names"), "{error}");
        let mut own = ledger.claim(UID, "boot");
        own.made_compute_instance(&intent(3), 1, 0, "MIG-made").unwrap();
        let l = own.entry().clone();
        assert_eq!(check_record(&record(Some("MIG-made"), None), Some(&l)), Ok(()));
        let error = check_record(&record(Some("MIG-admin"), None), Some(&l)).unwrap_err().to_string();
        assert!(error.starts_with("field `devices[0].dynamicMig.made`"), "{error}");
        let error = check_record(&record(Some("MIG-made"), Some("GPU-b")), Some(&l)).unwrap_err().to_string();
        assert!(error.starts_with("field `devices[0].migModeOff`"), "{error}");
        own.mig_mode_off("GPU-b").unwrap();
        assert_eq!(check_record(&record(Some("MIG-made"), Some("GPU-b")), Some(own.entry())), Ok(()));
        own.destroyed(&intent(3)).unwrap();
        assert_eq!(
            check_record(&record(Some("MIG-made"), None), Some(own.entry())),
            Ok(()),
            "an unprepare killed half-way"
        );
    }

    #[test]
    fn owned_and_withheld_come_from_the_ledger_of_this_boot() {
        let control = FakeControl::with_gpus(&["GPU-a"]);
        let gi = control.create_gpu_instance("GPU-a", 19, Placement { start: 3, size: 1 }).unwrap();
        let (_, uuid) = control.create_compute_instance("GPU-a", gi, 0).unwrap();
        let mut ours = ClaimLedger::new(UID, "boot");
        ours.instances
            .push(entry(0, Made::Complete { gpu_instance_id: 9, compute_instance_id: 0, mig_uuid: "MIG-ours".into() }));
        ours.instances.push(entry(3, Made::Creating));
        ours.instances.push(entry(5, Made::Creating));
        let mut before = ClaimLedger::new(UID, "old-boot");
        before
            .instances
            .push(entry(1, Made::Complete { gpu_instance_id: 2, compute_instance_id: 0, mig_uuid: "MIG-old".into() }));
        assert_eq!(owned_uuids([&ours, &before], "boot"), BTreeSet::from(["MIG-ours".to_string()]));
        let held = withheld([&ours, &before], "boot", &control);
        assert_eq!(
            held,
            [Withheld {
                gpu_uuid: "GPU-a".into(),
                gpu_instance_id: gi,
                placement: Placement { start: 3, size: 1 },
                mig_uuid: Some(uuid)
            }],
            "the instance at 3 may be ours; nothing is at 5"
        );
    }
}
