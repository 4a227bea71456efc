//! Dynamic MIG never destroys, switches or makes what it does not own,
//! whatever its state files say (issue 31, cases 3, 4 and 11), through the
//! real plugin and the mock NVML: three H100s, GPU 0 dynamic, GPU 1 cut by
//! an administrator (two 3g.40gb), GPU 2 with MIG off. Every record here is
//! written by the test with a valid checksum, as someone with write access
//! to the state directory (or a bug) could.
//! - forged records naming the administrator's instances (an interrupted
//!   prepare at the exact placement, a prepared claim holding the UUID) or
//!   another claim's instance never get them destroyed;
//! - a forged interrupted prepare naming a GPU a healthy claim holds whole
//!   never turns its MIG mode on, and a forged prepared claim naming a
//!   dynamic GPU never turns it off;
//! - a damaged record of a real dynamic MIG claim keeps its instance and
//!   does not strand the GPU: its other placements serve new claims, and
//!   the kubelet's unprepare of that claim removes the instance; a forged
//!   prepared claim naming a free placement makes nothing.

use gpu_dra_driver::names::ClaimUid;
use gpu_kubelet_plugin::prepared::PreparedDevice;
use gpu_kubelet_plugin::state::checkpoint::{
    CheckpointDevice, CheckpointDir, ClaimRecord, DynamicMigDevice, MigModeOff, PrepareState,
};
use gpu_kubelet_plugin::state::checkpoint::{MadeInstance, MigIntent};
use integration_tests::kubelet::claim;
use integration_tests::mock_gpu::dynamic_mig::{FOUR, GATES, ONE, TWO, start};
use integration_tests::mock_gpu::{BOOT_ID, MockGpuNode, MockInstance};
use integration_tests::node::{DRIVER, RunningNode, WAIT};

const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 3\n    mig:\n      - gpus: [0]\n        dynamic: true\n      \
                         - gpus: [1]\n        instances: [3g.40gb, 3g.40gb]\n";
const FORGED_A: &str = "f1000000-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const FORGED_B: &str = "f2000000-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const FORGED_C: &str = "f3000000-9c1d-4a57-8d3c-1f2e3d4c5b6a";

fn on(gpu: &MockGpuNode, minor: u32) -> Vec<MockInstance> {
    gpu.instances().remove(&minor).unwrap_or_default()
}

fn placements(gpu: &MockGpuNode, minor: u32) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = on(gpu, minor).iter().map(|i| (i.start, i.size)).collect();
    out.sort_unstable();
    out
}

fn checkpoint(node: &RunningNode) -> CheckpointDir {
    CheckpointDir::open(node.dirs.plugin_dir(DRIVER).join("checkpoint")).expect("checkpoint")
}

fn write(node: &RunningNode, record: &ClaimRecord) {
    checkpoint(node).write(&ClaimUid::new(record.uid.as_str()).expect("uid"), record).expect("forged record");
}

/// The checkpoint's files set aside as damaged.
fn damaged(node: &RunningNode) -> Vec<String> {
    let dir = node.dirs.plugin_dir(DRIVER).join("checkpoint");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("checkpoint dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".damaged"))
        .collect();
    names.sort();
    names
}

fn device(name: &str) -> CheckpointDevice {
    let prepared = PreparedDevice {
        request_names: vec!["gpu".into()],
        pool_name: "node-a".into(),
        device_name: name.into(),
        cdi_device_ids: Vec::new(),
        share_id: None,
    };
    CheckpointDevice::new(prepared, false)
}

fn forged(uid: &str, state: PrepareState, devices: Vec<CheckpointDevice>) -> ClaimRecord {
    ClaimRecord {
        uid: uid.into(),
        namespace: "default".into(),
        name: format!("forged-{}", &uid[..2]),
        state,
        boot_id: BOOT_ID.into(),
        cdi_spec_file: None,
        devices,
        mps: None,
        compute_domain: None,
        adopted: None,
    }
}

fn mig_device(name: &str, intent: MigIntent, made: Option<MadeInstance>) -> CheckpointDevice {
    CheckpointDevice { dynamic_mig: Some(DynamicMigDevice { intent, made }), ..device(name) }
}

fn intent(gpu: &MockGpuNode, minor: u32, profile: &str, profile_id: u32, start: u32, size: u32) -> MigIntent {
    MigIntent {
        gpu_uuid: gpu.inventory.gpus[minor as usize].uuid.clone(),
        gpu_minor: minor,
        profile: profile.into(),
        profile_id,
        compute_profile_index: match size {
            1 => 0,
            2 => 1,
            4 => 3,
            _ => 2,
        },
        placement_start: start,
        placement_size: size,
    }
}

fn made(instance: &MockInstance) -> MadeInstance {
    MadeInstance {
        gpu_instance_id: instance.gpu_instance_id,
        compute_instance_id: 0,
        uuid: instance.uuid.clone(),
        gpu_instance_cap: 0,
        compute_instance_cap: 0,
    }
}

/// Case 3. With `auto`, forged records naming *every* instance of the
/// administrator's GPU 1 (the first by an interrupted prepare at its exact
/// placement, the second by a prepared claim holding its UUID), and one
/// naming the exact placement of a real claim's instance on GPU 0: start-up
/// and the kubelet's unprepare of the forged claims destroy none of them.
/// (Before the ownership ledger, the records made GPU 1 "the plugin's",
/// start-up destroyed the first instance and the unprepare the second, and
/// the forged roll-back destroyed the real claim's 4g.)
#[test]
fn forged_records_never_destroy_instances_the_plugin_did_not_make_for_them() {
    let gpu = MockGpuNode::new(INVENTORY);
    let options = gpu.plugin_options(GATES);
    let mut node = start(options.clone());
    let real = node.gpu_claim("real", &[FOUR]);
    assert!(node.prepare(std::slice::from_ref(&real))[&real.uid].is_ok(), "{}", node.process.log());
    let admin = on(&gpu, 1);
    let real_instance = on(&gpu, 0)[0].clone();
    node.process.terminate(WAIT).expect("SIGTERM");

    let records = [
        forged(
            FORGED_A,
            PrepareState::PrepareStarted,
            vec![mig_device("gpu-1-mig-3g40gb-9-0", intent(&gpu, 1, "3g.40gb", 9, 0, 4), None)],
        ),
        forged(
            FORGED_B,
            PrepareState::PrepareCompleted,
            vec![mig_device("gpu-1-mig-3g40gb-9-4", intent(&gpu, 1, "3g.40gb", 9, 4, 4), Some(made(&admin[1])))],
        ),
        forged(
            FORGED_C,
            PrepareState::PrepareStarted,
            vec![mig_device(FOUR, intent(&gpu, 0, "4g.40gb", 5, 0, 4), None)],
        ),
    ];
    for record in &records {
        write(&node, record);
    }
    node.respawn(&options);
    assert_eq!(
        placements(&gpu, 1),
        [(0, 4), (4, 4)],
        "start-up kept the administrator's instances\n{}",
        node.process.log()
    );
    assert_eq!(on(&gpu, 0), std::slice::from_ref(&real_instance), "start-up kept the real claim's instance");
    assert_eq!(damaged(&node), [format!("{FORGED_B}.json.damaged")], "the forged prepared claim is set aside");

    let forged_claims: Vec<_> = records.iter().map(|r| claim("default", &r.name, &r.uid)).collect();
    node.unprepare(&forged_claims);
    assert_eq!(placements(&gpu, 1), [(0, 4), (4, 4)], "the unprepare of forged claims kept them");
    assert_eq!(on(&gpu, 0), [real_instance], "and the real claim's");
    node.unprepare(std::slice::from_ref(&real));
    assert!(on(&gpu, 0).is_empty(), "the real claim's own unprepare removes its instance");
    assert_eq!(placements(&gpu, 1), [(0, 4), (4, 4)]);
}

/// Case 4. A healthy claim holds dynamic GPU 0 whole (MIG mode off, so the
/// GPU is no longer dynamic). A forged interrupted prepare of another claim
/// naming GPU 0 as a whole GPU it took out of MIG mode never turns MIG mode
/// on under the healthy claim, at start-up or at its unprepare; a forged
/// prepared claim naming GPU 2 (MIG off, never dynamic) changes nothing
/// either. Only the healthy claim's own unprepare turns GPU 0's MIG mode on.
#[test]
fn forged_records_never_switch_mig_mode_under_a_claim() {
    let gpu = MockGpuNode::new(INVENTORY);
    let options = gpu.plugin_options(GATES);
    let mut node = start(options.clone());
    let whole = node.gpu_claim("whole", &["gpu-0"]);
    assert!(node.prepare(std::slice::from_ref(&whole))[&whole.uid].is_ok(), "{}", node.process.log());
    assert!(!gpu.mig_mode(0), "the claim took GPU 0 out of MIG mode");
    node.process.terminate(WAIT).expect("SIGTERM");

    let off = |minor: u32| MigModeOff { gpu_uuid: gpu.inventory.gpus[minor as usize].uuid.clone(), gpu_minor: minor };
    let records = [
        forged(
            FORGED_A,
            PrepareState::PrepareStarted,
            vec![CheckpointDevice { mig_mode_off: Some(off(0)), ..device("gpu-0") }],
        ),
        forged(
            FORGED_B,
            PrepareState::PrepareCompleted,
            vec![CheckpointDevice { mig_mode_off: Some(off(2)), ..device("gpu-2") }],
        ),
    ];
    for record in &records {
        write(&node, record);
    }
    node.respawn(&options);
    assert!(!gpu.mig_mode(0), "start-up left GPU 0 out of MIG mode under its claim\n{}", node.process.log());
    assert!(!gpu.mig_mode(2), "GPU 2 as it was");
    let forged_claims: Vec<_> = records.iter().map(|r| claim("default", &r.name, &r.uid)).collect();
    node.unprepare(&forged_claims);
    assert!(!gpu.mig_mode(0), "the unprepare of the forged claims left it too");
    assert!(!gpu.mig_mode(2));
    node.unprepare(std::slice::from_ref(&whole));
    assert!(gpu.mig_mode(0), "the healthy claim's unprepare turns MIG mode on again\n{}", node.process.log());
}

/// Case 11. A real claim's 1g on GPU 0; its record is then damaged (one
/// byte changed, so its checksum fails). Start-up sets the record aside and
/// keeps the instance, and GPU 0 stays dynamic: a new claim for the 4g
/// beside it is prepared. The kubelet's unprepare of the damaged claim
/// removes its instance (the plugin made it, no claim holds it now). A
/// forged prepared claim naming a free placement (the 2g at 4) never makes
/// start-up create an instance.
#[test]
fn a_damaged_record_does_not_strand_its_gpu_and_a_forged_one_makes_nothing() {
    let gpu = MockGpuNode::new(INVENTORY);
    let options = gpu.plugin_options(GATES);
    let mut node = start(options.clone());
    let small = node.gpu_claim("small", &[ONE]);
    assert!(node.prepare(std::slice::from_ref(&small))[&small.uid].is_ok(), "{}", node.process.log());
    assert_eq!(placements(&gpu, 0), [(6, 1)]);
    node.process.terminate(WAIT).expect("SIGTERM");

    let path = checkpoint(&node).record_path(&small.uid);
    let text = std::fs::read_to_string(&path).expect("record");
    std::fs::write(&path, text.replacen("\"namespace\":\"default\"", "\"namespace\":\"defaulu\"", 1)).expect("damage");
    let phantom = forged(
        FORGED_A,
        PrepareState::PrepareCompleted,
        vec![mig_device(
            TWO,
            intent(&gpu, 0, "2g.20gb", 14, 4, 2),
            Some(MadeInstance {
                gpu_instance_id: 2,
                compute_instance_id: 0,
                uuid: "MIG-6d160000-0002-4004-8002-000000000099".into(),
                gpu_instance_cap: 0,
                compute_instance_cap: 0,
            }),
        )],
    );
    write(&node, &phantom);
    node.respawn(&options);
    assert_eq!(
        placements(&gpu, 0),
        [(6, 1)],
        "the damaged claim's instance kept, nothing made\n{}",
        node.process.log()
    );
    let mut set_aside = damaged(&node);
    set_aside.sort();
    let mut want = vec![format!("{}.json.damaged", small.uid), format!("{FORGED_A}.json.damaged")];
    want.sort();
    assert_eq!(set_aside, want);

    let big = node.gpu_claim("big", &[FOUR]);
    let answer = node.prepare(std::slice::from_ref(&big))[&big.uid].clone();
    assert!(answer.is_ok(), "GPU 0 still serves dynamic claims: {answer:?}\n{}", node.process.log());
    assert_eq!(placements(&gpu, 0), [(0, 4), (6, 1)]);

    node.unprepare(std::slice::from_ref(&small));
    assert_eq!(
        placements(&gpu, 0),
        [(0, 4)],
        "the damaged claim's unprepare removed its instance\n{}",
        node.process.log()
    );
    node.unprepare(&[claim("default", &phantom.name, &phantom.uid)]);
    assert_eq!(placements(&gpu, 0), [(0, 4)]);
    node.unprepare(std::slice::from_ref(&big));
    assert!(on(&gpu, 0).is_empty());
    assert_eq!(placements(&gpu, 1), [(0, 4), (4, 4)]);
}
