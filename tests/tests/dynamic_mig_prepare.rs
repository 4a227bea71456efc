//! Dynamic MIG at prepare, through the real plugin and the mock NVML: two
//! H100s, GPU 0 dynamic, GPU 1 cut by an administrator (two 3g.40gb).
//! - a claim for 4g + 2g + 1g on GPU 0 makes three instances (three MIG
//!   UUIDs in the spec and in the claim's status.devices, caps minors as
//!   the driver's files say), and unprepare leaves the GPU empty;
//! - a SIGKILL at every step of prepare and unprepare, then a restart:
//!   no instance leaked, no claim lost, the retry succeeds;
//! - forged records naming GPU 1's instances never get them destroyed.

use std::collections::BTreeMap;

use gpu_dra_driver::names::ClaimUid;
use gpu_kubelet_plugin::prepared::PreparedDevice;
use gpu_kubelet_plugin::state::checkpoint::{
    CheckpointDevice, CheckpointDir, ClaimRecord, DynamicMigDevice, PrepareState,
};
use gpu_kubelet_plugin::state::checkpoint::{MadeInstance, MigIntent};
use integration_tests::mock_gpu::dynamic_mig::{FOUR, GATES, ONE, TWO, start};
use integration_tests::mock_gpu::{BOOT_ID, MockGpuNode, MockInstance};
use integration_tests::node::{DRIVER, RunningNode, WAIT};
use integration_tests::wait;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kubelet_proto::dra_v1::Claim;

const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 2\n    mig:\n      - gpus: [0]\n        dynamic: true\n      \
                         - gpus: [1]\n        instances: [3g.40gb, 3g.40gb]\n";

fn gpu0(gpu: &MockGpuNode) -> Vec<MockInstance> {
    gpu.instances().remove(&0).unwrap_or_default()
}

/// GPU 1's instances as the table made them.
fn static_instances(gpu: &MockGpuNode) -> Vec<(u32, u32)> {
    gpu.instances()[&1].iter().map(|i| (i.start, i.size)).collect()
}

fn spec_text(node: &RunningNode, uid: &str) -> String {
    std::fs::read_to_string(node.spec_path(uid)).unwrap_or_default()
}

#[test]
fn a_claim_for_4g_2g_1g_is_made_and_unmade_through_nvml() {
    let gpu = MockGpuNode::new(INVENTORY);
    let node = start(gpu.plugin_options(GATES));
    let claim = node.gpu_claim("mixed", &[ONE, FOUR, TWO]);
    let answers = node.prepare(std::slice::from_ref(&claim));
    let devices = answers[&claim.uid].clone().unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()));
    assert_eq!(devices.len(), 3);

    let made = gpu0(&gpu);
    assert_eq!(made.len(), 3, "three instances in the mock: {made:?}");
    assert!(made.iter().all(|i| i.has_compute_instance));
    let mut placements: Vec<(u32, u32, u32)> = made.iter().map(|i| (i.profile_id, i.start, i.size)).collect();
    placements.sort();
    assert_eq!(placements, [(5, 0, 4), (14, 4, 2), (19, 6, 1)]);
    let spec = spec_text(&node, &claim.uid);
    for instance in &made {
        assert!(spec.contains(&instance.uuid), "MIG UUID {} in the spec:\n{spec}", instance.uuid);
        let gi = gpu.cap_minor(0, instance.gpu_instance_id, None).expect("GPU instance capability");
        let ci = gpu.cap_minor(0, instance.gpu_instance_id, Some(0)).expect("compute instance capability");
        for minor in [gi, ci] {
            assert!(spec.contains(&format!("/dev/nvidia-caps/nvidia-cap{minor}\"")), "cap {minor} in the spec");
        }
    }
    assert_eq!(spec.matches("GPU_DRA_MIG_UUID_").count(), 3);
    // The claim's status.devices names each device's made MIG UUID.
    let made_uuids: std::collections::BTreeSet<String> = made.iter().map(|i| i.uuid.clone()).collect();
    let status_uuids = || -> std::collections::BTreeSet<String> {
        node.server
            .get::<ResourceClaim>(Some("default"), "mixed")
            .ok()
            .and_then(|c| c.status?.devices)
            .unwrap_or_default()
            .iter()
            .filter(|d| d.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True"))
            .filter_map(|d| d.data.as_ref()?.0["uuid"].as_str().map(str::to_owned))
            .collect()
    };
    let shown = || format!("status.devices {:?}, made {made_uuids:?}\n{}", status_uuids(), node.process.log());
    wait::wait_until("status.devices to name the made MIG devices", WAIT, || status_uuids() == made_uuids, shown);
    // A repeat answers from the record.
    let again = node.prepare(std::slice::from_ref(&claim));
    assert_eq!(again[&claim.uid].as_ref().map(Vec::len), Ok(3));
    assert_eq!(gpu0(&gpu).len(), 3);

    node.unprepare(std::slice::from_ref(&claim));
    assert!(gpu0(&gpu).is_empty(), "unprepare leaves the GPU empty");
    assert_eq!(static_instances(&gpu), [(0, 4), (4, 4)], "the administrator's instances stay");
    assert!(node.records().is_empty());
    assert!(!node.spec_path(&claim.uid).exists());
}

/// After a restart from a kill: nothing of the claim is left unless it
/// completed; the static GPU is as it was.
fn check_settled(gpu: &MockGpuNode, node: &RunningNode, step: &str, prepared: bool) {
    let instances = gpu0(gpu);
    let records = node.records();
    if prepared {
        assert_eq!(instances.len(), 3, "{step}: a prepared claim has its instances: {instances:?}");
        assert!(instances.iter().all(|i| i.has_compute_instance), "{step}: {instances:?}");
        assert_eq!(records.len(), 1, "{step}");
        assert_eq!(records[0].state, PrepareState::PrepareCompleted, "{step}");
    } else {
        assert!(instances.is_empty(), "{step}: leaked instances {instances:?}\n{}", node.process.log());
        assert!(records.is_empty(), "{step}: records {records:?}");
    }
    assert_eq!(static_instances(gpu), [(0, 4), (4, 4)], "{step}: the static GPU");
}

#[test]
fn sigkill_at_every_step_of_prepare_and_unprepare_leaks_and_loses_nothing() {
    let gpu = MockGpuNode::new(INVENTORY);
    let options = gpu.plugin_options(GATES);
    let mut node = start(options.clone());
    let claim = node.gpu_claim("mixed", &[FOUR, TWO, ONE]);
    let mut summary = BTreeMap::new();
    for step in [
        "after-record",
        "after-gpu-instance",
        "after-gpu-instance:3",
        "after-compute-instance",
        "after-compute-instance:2",
        "after-spec",
    ] {
        node.killed_during(&options, step, |node| node.prepare_answered(&claim));
        check_settled(&gpu, &node, step, false);
        let retry = node.prepare(std::slice::from_ref(&claim));
        assert_eq!(retry[&claim.uid].as_ref().map(Vec::len), Ok(3), "{step}: the retry\n{}", node.process.log());
        check_settled(&gpu, &node, step, true);
        node.unprepare(std::slice::from_ref(&claim));
        check_settled(&gpu, &node, step, false);
        summary.insert(step, "rolled back, retried");
    }
    // (`after-gpu-destroyed:3`: every instance gone, the spec and the
    // record not yet; `after-spec-removed`: the record alone left.)
    for step in [
        "after-compute-destroyed",
        "after-compute-destroyed:3",
        "after-gpu-destroyed",
        "after-gpu-destroyed:2",
        "after-gpu-destroyed:3",
        "after-spec-removed",
    ] {
        let first = node.prepare(std::slice::from_ref(&claim));
        let ids: Vec<Vec<String>> = first[&claim.uid].clone().unwrap().into_iter().map(|d| d.cdi_device_ids).collect();
        node.killed_during(&options, step, |node| node.unprepare_answered(&claim));
        // Start-up made the claim whole again: not lost, same CDI ids.
        check_settled(&gpu, &node, step, true);
        let repeat = node.prepare(std::slice::from_ref(&claim));
        let again: Vec<Vec<String>> =
            repeat[&claim.uid].clone().unwrap().into_iter().map(|d| d.cdi_device_ids).collect();
        assert_eq!(again, ids, "{step}");
        node.unprepare(std::slice::from_ref(&claim));
        check_settled(&gpu, &node, step, false);
        summary.insert(step, "remade, unprepared again");
    }
    assert!(!node.spec_path(&claim.uid).exists());
    eprintln!("kill points: {summary:?}");
}

fn forged(uid: &str, state: PrepareState, device: &str, intent: MigIntent, made: Option<MadeInstance>) -> ClaimRecord {
    ClaimRecord {
        uid: uid.into(),
        namespace: "default".into(),
        name: format!("forged-{}", &uid[..8]),
        state,
        boot_id: BOOT_ID.into(),
        cdi_spec_file: None,
        devices: vec![CheckpointDevice {
            dynamic_mig: Some(DynamicMigDevice { intent, made }),
            ..CheckpointDevice::new(
                PreparedDevice {
                    request_names: vec!["gpu".into()],
                    pool_name: "node-a".into(),
                    device_name: device.into(),
                    cdi_device_ids: Vec::new(),
                    share_id: None,
                },
                false,
            )
        }],
        mps: None,
        compute_domain: None,
        adopted: None,
    }
}

fn intent(gpu: &MockGpuNode, minor: u32, profile_id: u32, start: u32, size: u32) -> MigIntent {
    MigIntent {
        gpu_uuid: gpu.inventory.gpus[minor as usize].uuid.clone(),
        gpu_minor: minor,
        profile: "3g.40gb".into(),
        profile_id,
        compute_profile_index: 2,
        placement_start: start,
        placement_size: size,
    }
}

/// Forged records (valid checksums) naming the administrator's instances
/// on GPU 1: an interrupted prepare at its first instance's placement, a
/// prepared claim holding its second by UUID. With GPU 0 named dynamic
/// (`--dynamic-mig-gpus 0`) and with `auto` (GPU 1 keeps an instance no
/// record names), start-up and the unprepare of the forged claims leave
/// both instances where they are; GPU 0 is settled as usual.
#[test]
fn a_static_gpu_keeps_its_instances_whatever_the_checkpoint_says() {
    for dynamic in ["0", "auto"] {
        let gpu = MockGpuNode::new(INVENTORY);
        let mut options = gpu.plugin_options(GATES);
        options.extra_args.extend(["--dynamic-mig-gpus".to_string(), dynamic.to_string()]);
        let node = start(options.clone());
        let second = gpu.instances()[&1][1].clone();
        let mut node = node;
        node.process.terminate(WAIT).expect("SIGTERM");
        let checkpoint = CheckpointDir::open(node.dirs.plugin_dir(DRIVER).join("checkpoint")).unwrap();
        let interrupted = "a1000000-9c1d-4a57-8d3c-1f2e3d4c5b6a";
        let held = "a2000000-9c1d-4a57-8d3c-1f2e3d4c5b6a";
        let mut records = vec![forged(
            held,
            PrepareState::PrepareCompleted,
            "gpu-1-mig-3g40gb-9-4",
            intent(&gpu, 1, 9, 4, 4),
            Some(MadeInstance {
                gpu_instance_id: second.gpu_instance_id,
                compute_instance_id: 0,
                uuid: second.uuid.clone(),
                gpu_instance_cap: 0,
                compute_instance_cap: 0,
            }),
        )];
        if dynamic == "0" {
            // Explicitly static: even records naming every instance exactly.
            records.push(forged(
                interrupted,
                PrepareState::PrepareStarted,
                "gpu-1-mig-3g40gb-9-0",
                intent(&gpu, 1, 9, 0, 4),
                None,
            ));
        }
        for record in &records {
            checkpoint.write(&ClaimUid::new(record.uid.as_str()).unwrap(), record).unwrap();
        }
        node.respawn(&options);
        assert_eq!(static_instances(&gpu), [(0, 4), (4, 4)], "{dynamic}: start-up\n{}", node.process.log());
        let forged_claims: Vec<Claim> =
            records.iter().map(|r| integration_tests::kubelet::claim("default", &r.name, &r.uid)).collect();
        node.unprepare(&forged_claims);
        assert_eq!(static_instances(&gpu), [(0, 4), (4, 4)], "{dynamic}: unprepare of forged claims");
        // GPU 0 still works.
        let claim = node.gpu_claim("mixed", &[FOUR, ONE]);
        assert!(node.prepare(std::slice::from_ref(&claim))[&claim.uid].is_ok(), "{}", node.process.log());
        assert_eq!(gpu0(&gpu).len(), 2);
        node.unprepare(std::slice::from_ref(&claim));
        assert!(gpu0(&gpu).is_empty());
        assert_eq!(static_instances(&gpu), [(0, 4), (4, 4)], "{dynamic}");
    }
}
