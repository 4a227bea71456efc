//! Which MIG instances on the node are the plugin's, by `MIG-` UUID: what
//! decides (with `--dynamic-mig-gpus`) that a GPU holding them is still
//! dynamic after a restart, rather than an administrator's.
//!
//! A record of this boot owns the instances it recorded as made. An
//! interrupted prepare may also have made an instance whose UUID it never
//! recorded (killed between the compute instance and the record): the
//! instance at exactly the recorded GPU, profile and placement is its, so
//! that start-up finds its GPU dynamic and rolls it back. A GPU keeps an
//! administrator's status as long as it holds one instance no record
//! names exactly.

use std::collections::BTreeSet;

use super::control::MigControl;
use crate::state::checkpoint::{ClaimRecord, PrepareState};

/// The UUIDs of the instances `records` own (see the module doc).
/// `control` answers for interrupted prepares; without it (a fake
/// inventory) only recorded UUIDs count.
pub fn owned_uuids<'a>(
    records: impl IntoIterator<Item = &'a ClaimRecord>,
    boot_id: &str,
    control: Option<&dyn MigControl>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for record in records.into_iter().filter(|r| r.boot_id == boot_id) {
        for mig in record.devices.iter().filter_map(|d| d.dynamic_mig.as_ref()) {
            if let Some(made) = &mig.made {
                out.insert(made.uuid.clone());
                continue;
            }
            let (PrepareState::PrepareStarted, Some(control)) = (record.state, control) else { continue };
            let Ok(observed) = control.instances(&mig.intent.gpu_uuid) else { continue };
            for instance in observed.iter().filter(|o| mig.intent.is(o)) {
                for &ci in &instance.compute_instances {
                    if let Ok(uuid) = control.mig_uuid(&mig.intent.gpu_uuid, instance.gpu_instance_id, ci) {
                        out.insert(uuid);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use gpu_dra_driver::inventory::Placement;

    use super::super::control::fake::FakeControl;
    use super::super::{MadeInstance, MigIntent};
    use super::*;
    use crate::state::checkpoint::DynamicMigDevice;

    fn record(uid: &str, state: PrepareState, boot: &str, start: u32, made: Option<&str>) -> ClaimRecord {
        let mut r = crate::state::checkpoint::test_support::record(uid, &["gpu-0-mig-1g10gb-19-0"]);
        r.state = state;
        r.boot_id = boot.into();
        r.devices[0].dynamic_mig = Some(DynamicMigDevice {
            intent: MigIntent {
                gpu_uuid: "GPU-a".into(),
                gpu_minor: 0,
                profile: "1g.10gb".into(),
                profile_id: 19,
                compute_profile_index: 0,
                placement_start: start,
                placement_size: 1,
            },
            made: made.map(|uuid| MadeInstance {
                gpu_instance_id: 1,
                compute_instance_id: 0,
                uuid: uuid.into(),
                gpu_instance_cap: 0,
                compute_instance_cap: 0,
            }),
        });
        r
    }

    #[test]
    fn recorded_uuids_and_the_exact_instance_of_an_interrupted_prepare() {
        let control = FakeControl::with_gpus(&["GPU-a"]);
        let gi = control.create_gpu_instance("GPU-a", 19, Placement { start: 3, size: 1 }).unwrap();
        let (_, interrupted) = control.create_compute_instance("GPU-a", gi, 0).unwrap();
        let other = control.create_gpu_instance("GPU-a", 19, Placement { start: 5, size: 1 }).unwrap();
        control.create_compute_instance("GPU-a", other, 0).unwrap();
        let records = [
            record("a", PrepareState::PrepareCompleted, "boot", 0, Some("MIG-made")),
            record("b", PrepareState::PrepareStarted, "boot", 3, None),
            record("c", PrepareState::PrepareCompleted, "old-boot", 4, Some("MIG-before-reboot")),
            record("d", PrepareState::PrepareCompleted, "boot", 5, None),
        ];
        let owned = owned_uuids(&records, "boot", Some(&control));
        assert_eq!(owned, BTreeSet::from(["MIG-made".to_string(), interrupted]));
        assert_eq!(owned_uuids(&records, "boot", None), BTreeSet::from(["MIG-made".to_string()]));
    }
}
