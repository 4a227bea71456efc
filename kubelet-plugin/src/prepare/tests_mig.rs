//! Dynamic MIG through the preparer, on an in-memory GPU: two H100s, GPU
//! 0 dynamic, GPU 1 partitioned by an administrator (one 3g.40gb).

use std::sync::Arc;

use gpu_dra_driver::inventory::dynamic_mig::{DynamicMigGpus, select};
use gpu_dra_driver::inventory::{Inventory, MigMode, Placement, fake};
use gpu_dra_driver::names::ClaimUid;

use super::test_support::{Harness, allocated, claim_ref, node};
use crate::mig::control::MigControl;
use crate::mig::control::fake::FakeControl;
use crate::state::checkpoint::{CheckpointDir, ClaimRecord, DynamicMigDevice, PrepareState};
use crate::state::checkpoint::{MadeInstance, MigIntent};

const A: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const B: &str = "1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const FOUR: &str = "gpu-0-mig-4g40gb-5-0";
const TWO: &str = "gpu-0-mig-2g20gb-14-4";
const ONE: &str = "gpu-0-mig-1g10gb-19-6";

fn inventory() -> Inventory {
    let text = "gpus:\n  - model: H100-80GB\n    count: 2\n    mig:\n      - gpus: [0]\n        dynamic: true\n      \
                - gpus: [1]\n        instances: [3g.40gb]\n";
    let mut inventory = fake::parse(text, &node()).unwrap();
    select(&mut inventory, &DynamicMigGpus::Auto, &|_| false);
    assert!(inventory.gpus[0].dynamic_mig().is_some());
    assert!(matches!(inventory.gpus[1].mig, MigMode::Enabled(_)), "GPU 1 stays static");
    inventory
}

struct Node {
    h: Harness,
    gpu0: String,
    gpu1: String,
    control: Arc<FakeControl>,
}

fn node_with_mig() -> Node {
    let mut h = Harness::new();
    let inv = inventory();
    let (gpu0, gpu1) = (inv.gpus[0].uuid.clone(), inv.gpus[1].uuid.clone());
    h.inventory.send_replace(Arc::new(inv));
    let control = Arc::new(FakeControl::with_gpus(&[&gpu0, &gpu1]));
    // The administrator's 3g.40gb on GPU 1.
    let gi = control.create_gpu_instance(&gpu1, 9, Placement { start: 0, size: 4 }).unwrap();
    control.create_compute_instance(&gpu1, gi, 2).unwrap();
    h.mig = Some(control.clone());
    let caps = h.dir.path().join("proc/driver/nvidia-caps");
    std::fs::create_dir_all(&caps).unwrap();
    let mut minors = String::new();
    for gpu in 0..2 {
        for gi in 0..15 {
            let base = 3 + 135 * gpu + 9 * gi;
            minors.push_str(&format!("gpu{gpu}/gi{gi}/access {base}\ngpu{gpu}/gi{gi}/ci0/access {}\n", base + 1));
        }
    }
    std::fs::write(caps.join("mig-minors"), minors).unwrap();
    Node { h, gpu0, gpu1, control }
}

fn spec(h: &Harness, uid: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(h.dir.path().join(format!("cdi/k8s.gpu.nvidia.com-claim_{uid}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn records(h: &Harness) -> Vec<ClaimRecord> {
    CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap().load().unwrap().records
}

#[tokio::test]
async fn a_claim_for_4g_2g_1g_makes_three_instances_and_unprepare_empties_the_gpu() {
    let n = node_with_mig();
    n.h.source.put(allocated(A, "a", &[ONE, FOUR, TWO]));
    let (p, _) = n.h.open();
    let devices = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert_eq!(devices.len(), 3);
    assert_eq!(n.control.count(&n.gpu0), 3);
    let spec = spec(&n.h, A);
    let text = spec.to_string();
    // MIG-fake-1 is the administrator's instance on GPU 1.
    for i in 2..=4 {
        assert!(text.contains(&format!("MIG-fake-{i}")), "MIG UUID {i} in the spec: {text}");
    }
    let four = spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == format!("{A}-{FOUR}")).unwrap();
    let nodes: Vec<&str> =
        four["containerEdits"]["deviceNodes"].as_array().unwrap().iter().map(|n| n["path"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]);
    let record = &records(&n.h)[0];
    assert_eq!(record.state, PrepareState::PrepareCompleted);
    assert!(record.devices.iter().all(|d| d.dynamic_mig.as_ref().is_some_and(|m| m.made.is_some())));
    let creates: Vec<String> =
        n.control.calls.lock().unwrap().iter().filter(|c| c.starts_with("create-gi")).cloned().collect();
    assert!(
        creates[1].ends_with("5 0+4") && creates[2].ends_with("14 4+2") && creates[3].ends_with("19 6+1"),
        "largest first: {creates:?}"
    );

    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
    assert_eq!(n.control.count(&n.gpu0), 0, "unprepare leaves the GPU empty");
    assert_eq!(n.control.count(&n.gpu1), 1, "the static instance is never touched");
    assert!(n.h.cdi_files().is_empty() && n.h.checkpoint_files().is_empty());
    let destroys: Vec<String> =
        n.control.calls.lock().unwrap().iter().filter(|c| c.starts_with("destroy-gi")).cloned().collect();
    assert_eq!(destroys.len(), 3);
    assert!(destroys[0].ends_with(" 3") && destroys[2].ends_with(" 1"), "reverse creation order: {destroys:?}");
}

#[tokio::test]
async fn overlapping_layouts_and_failures_leave_nothing_behind() {
    let n = node_with_mig();
    n.h.source.put(allocated(A, "a", &[TWO]));
    n.h.source.put(allocated(B, "b", &["gpu-0-mig-3g40gb-9-4"]));
    let (p, _) = n.h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    let error = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err().to_string();
    assert!(error.contains("conflicts with device gpu-0-mig-2g20gb-14-4 of ResourceClaim default/a"), "{error}");
    assert_eq!(n.control.count(&n.gpu0), 1);
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();

    // A compute instance that cannot be made: the GPU instance goes too.
    *n.control.fail.lock().unwrap() = Some("create-ci".into());
    let error = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err().to_string();
    assert!(error.contains("injected"), "{error}");
    assert_eq!(n.control.count(&n.gpu0), 0);
    assert!(n.h.cdi_files().is_empty() && n.h.checkpoint_files().is_empty());
    *n.control.fail.lock().unwrap() = None;
    assert!(p.prepare(vec![claim_ref(B, "b")]).await[B].is_ok(), "a retry succeeds");
}

#[tokio::test]
async fn the_whole_gpu_leaves_mig_mode_while_prepared() {
    let n = node_with_mig();
    n.h.source.put(allocated(A, "a", &["gpu-0"]));
    n.h.source.put(allocated(B, "b", &[ONE]));
    let (p, _) = n.h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert!(!n.control.mig_mode(&n.gpu0).unwrap().current, "MIG mode off for the whole GPU");
    let error = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err().to_string();
    assert!(error.contains("conflicts with device gpu-0"), "{error}");
    assert_eq!(records(&n.h)[0].devices[0].mig_mode_off.as_ref().unwrap().gpu_uuid, n.gpu0);
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert!(n.control.mig_mode(&n.gpu0).unwrap().current, "MIG mode on again");
    assert!(p.prepare(vec![claim_ref(B, "b")]).await[B].is_ok());
}

fn intent(gpu: &str, profile_id: u32, start: u32, size: u32) -> MigIntent {
    MigIntent {
        gpu_uuid: gpu.into(),
        gpu_minor: 0,
        profile: "forged".into(),
        profile_id,
        compute_profile_index: 0,
        placement_start: start,
        placement_size: size,
    }
}

fn forged(uid: &str, state: PrepareState, device: &str, mig: MigIntent, made: Option<MadeInstance>) -> ClaimRecord {
    let mut record = crate::state::checkpoint::test_support::record(uid, &[device]);
    record.state = state;
    record.devices[0].dynamic_mig = Some(DynamicMigDevice { intent: mig, made });
    record
}

/// The ownership ledger as the plugin would have written it for `uid`.
fn ledger(h: &Harness) -> crate::mig::ledger::Ledger {
    crate::mig::ledger::Ledger::new(h.dir.path().join("state/mig-ledger"))
}

#[tokio::test]
async fn start_up_rolls_back_sweeps_remakes_and_never_touches_the_static_gpu() {
    let n = node_with_mig();
    let checkpoint = CheckpointDir::open(n.h.dir.path().join("state/checkpoint")).unwrap();
    let write = |r: &ClaimRecord| checkpoint.write(&ClaimUid::new(r.uid.as_str()).unwrap(), r).unwrap();
    let book = ledger(&n.h);
    // An interrupted prepare left a 4g at 0 on GPU 0 (its ledger has the GPU instance).
    let four = intent(&n.gpu0, 5, 0, 4);
    let gi = n.control.create_gpu_instance(&n.gpu0, 5, Placement { start: 0, size: 4 }).unwrap();
    book.claim(A, "boot-1").made_gpu_instance(&four, gi).unwrap();
    write(&forged(A, PrepareState::PrepareStarted, FOUR, four, None));
    // A prepared claim whose 1g at 6 vanished.
    let made = MadeInstance {
        gpu_instance_id: 9,
        compute_instance_id: 0,
        uuid: "MIG-gone".into(),
        gpu_instance_cap: 84,
        compute_instance_cap: 85,
    };
    let one = intent(&n.gpu0, 19, 6, 1);
    book.claim(B, "boot-1").made_compute_instance(&one, 9, 0, "MIG-gone").unwrap();
    let mut kept = forged(B, PrepareState::PrepareCompleted, ONE, one, Some(made));
    kept.devices[0].cdi_device_ids = vec![format!("k8s.gpu.nvidia.com/claim={B}-{ONE}")];
    write(&kept);
    // An instance the plugin made for a claim whose record is gone, at 4.
    let e = "4b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
    let orphan = n.control.create_gpu_instance(&n.gpu0, 14, Placement { start: 4, size: 2 }).unwrap();
    let (ci, uuid) = n.control.create_compute_instance(&n.gpu0, orphan, 1).unwrap();
    book.claim(e, "boot-1").made_compute_instance(&intent(&n.gpu0, 14, 4, 2), orphan, ci, &uuid).unwrap();
    // Forged records naming the administrator's instance on GPU 1.
    let c = "2b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
    let d = "3b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
    write(&forged(c, PrepareState::PrepareStarted, "gpu-1-mig-3g40gb-9-0", intent(&n.gpu1, 9, 0, 4), None));
    write(&forged(d, PrepareState::PrepareCompleted, "gpu-1-mig-3g40gb-9-4", intent(&n.gpu1, 9, 4, 4), None));

    let (p, report) = n.h.open();
    assert_eq!(report.rolled_back.len(), 2, "{report:?}");
    assert_eq!(report.damaged.len(), 1, "the forged prepared claim: {report:?}");
    assert_eq!(report.mig.remade, [B.to_owned()]);
    let observed = n.control.instances(&n.gpu0).unwrap();
    assert_eq!(observed.len(), 1, "only the remade 1g: {observed:?}");
    assert_eq!(observed[0].placement, Placement { start: 6, size: 1 });
    assert_eq!(n.control.count(&n.gpu1), 1, "the static GPU's instance survives every forged record");
    let spec = spec(&n.h, B).to_string();
    assert!(spec.contains("MIG-fake-") && !spec.contains("MIG-gone"), "the spec names the new instance: {spec}");
    let remade = records(&n.h).into_iter().find(|r| r.uid == B).unwrap();
    let new_uuid = remade.devices[0].dynamic_mig.as_ref().unwrap().made.as_ref().unwrap().uuid.clone();
    assert_ne!(new_uuid, "MIG-gone");
    let in_ledger = ledger(&n.h);
    in_ledger.load();
    assert!(in_ledger.get(A).is_none() && in_ledger.get(e).is_none(), "released ledgers go with their claims");
    assert_eq!(crate::mig::ownership::owned_uuids(&in_ledger.all(), "boot-1"), [new_uuid].into());
    // The forged completed record on the static GPU is unprepared without touching it.
    assert_eq!(p.unprepare(vec![claim_ref(d, "claim")]).await[d], Ok(()));
    assert_eq!(n.control.count(&n.gpu1), 1);
    assert_eq!(p.unprepare(vec![claim_ref(B, "claim")]).await[B], Ok(()));
    assert_eq!(n.control.count(&n.gpu0), 0);
}

/// Forged state on the in-memory GPU (issue 31, cases 3, 4, 11): records
/// with valid checksums that no ledger backs. An interrupted prepare at
/// the exact placement of another claim's instance, and one naming a
/// whole GPU a healthy claim holds with MIG off (GPU 2, never dynamic),
/// undo nothing; a prepared claim naming a free placement makes nothing.
#[tokio::test]
async fn forged_records_destroy_switch_and_make_nothing() {
    let n = node_with_mig();
    let text = "gpus:\n  - model: H100-80GB\n    count: 3\n    mig:\n      - gpus: [0]\n        dynamic: true\n      \
                - gpus: [1]\n        instances: [3g.40gb]\n";
    let mut inventory = fake::parse(text, &node()).unwrap();
    select(&mut inventory, &DynamicMigGpus::Auto, &|_| false);
    let gpu2 = inventory.gpus[2].uuid.clone();
    assert!(matches!(inventory.gpus[2].mig, MigMode::Disabled));
    n.h.inventory.send_replace(Arc::new(inventory));
    n.control.gpus.lock().unwrap().insert(
        gpu2.clone(),
        crate::mig::control::fake::FakeGpu {
            mig: crate::mig::control::MigModeState { current: false, pending: false },
            switchable: true,
            ..Default::default()
        },
    );
    n.h.source.put(allocated(A, "a", &[FOUR]));
    n.h.source.put(allocated(B, "b", &["gpu-2"]));
    let (p, _) = n.h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap();
    drop(p);
    let checkpoint = CheckpointDir::open(n.h.dir.path().join("state/checkpoint")).unwrap();
    let write = |r: &ClaimRecord| checkpoint.write(&ClaimUid::new(r.uid.as_str()).unwrap(), r).unwrap();
    let (c, d, e) = (
        "2b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a",
        "3b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a",
        "4b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a",
    );
    write(&forged(c, PrepareState::PrepareStarted, FOUR, intent(&n.gpu0, 5, 0, 4), None));
    let mut whole = crate::state::checkpoint::test_support::record(d, &["gpu-2"]);
    whole.state = PrepareState::PrepareStarted;
    whole.devices[0].mig_mode_off = Some(crate::state::checkpoint::MigModeOff { gpu_uuid: gpu2.clone(), gpu_minor: 2 });
    write(&whole);
    let phantom = MadeInstance {
        gpu_instance_id: 5,
        compute_instance_id: 0,
        uuid: "MIG-phantom".into(),
        gpu_instance_cap: 0,
        compute_instance_cap: 0,
    };
    write(&forged(e, PrepareState::PrepareCompleted, TWO, intent(&n.gpu0, 14, 4, 2), Some(phantom)));

    let (p, report) = n.h.open();
    assert_eq!(report.damaged.len(), 1, "the phantom prepared claim: {report:?}");
    let observed = n.control.instances(&n.gpu0).unwrap();
    assert_eq!(observed.len(), 1, "A's 4g kept, no 2g made: {observed:?}");
    assert_eq!(observed[0].placement, Placement { start: 0, size: 4 });
    assert!(!n.control.mig_mode(&gpu2).unwrap().current, "GPU 2 stays out of MIG mode under claim b");
    assert!(!n.control.calls.lock().unwrap().iter().any(|c| c.starts_with("set-mig-mode")), "no switch at all");
    for uid in [c, d, e] {
        assert_eq!(p.unprepare(vec![claim_ref(uid, "claim")]).await[uid], Ok(()));
    }
    assert_eq!(n.control.count(&n.gpu0), 1);
    assert!(!n.control.mig_mode(&gpu2).unwrap().current);
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert_eq!(n.control.count(&n.gpu0), 0);
}

/// A damaged record of a real claim (case 11): its instance is kept, its
/// GPU stays dynamic for the selection (the ledger, not the record, says
/// the instance is ours), and the kubelet's unprepare of that claim
/// destroys it. An instance the plugin was about to create when it was
/// killed (ledger `Creating`) is kept and its placements withheld.
#[tokio::test]
async fn a_damaged_record_keeps_its_gpu_dynamic_and_its_unprepare_cleans_up() {
    use crate::mig::selection::DynamicMigSelection;
    let n = node_with_mig();
    let selection = DynamicMigSelection::new("DynamicMIG=true".parse().unwrap(), DynamicMigGpus::Auto);
    n.h.source.put(allocated(A, "a", &[ONE]));
    let (p, _) = n.h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    drop(p);
    let uuid = n.control.instances(&n.gpu0).unwrap()[0].clone();
    let path = n.h.dir.path().join(format!("state/checkpoint/{A}.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("\"name\":\"a\"", "\"name\":\"b\"", 1)).unwrap();
    // A kill right after a create call, before its ledger write, for claim B.
    let two = intent(&n.gpu0, 14, 4, 2);
    ledger(&n.h).claim(B, "boot-1").creating(&two).unwrap();
    let gi = n.control.create_gpu_instance(&n.gpu0, 14, Placement { start: 4, size: 2 }).unwrap();
    n.control.create_compute_instance(&n.gpu0, gi, 1).unwrap();

    let mut config = n.h.config("boot-1");
    config.selection = Some(selection.clone());
    let (p, report) = super::Preparer::open(config, n.h.source.clone(), n.h.inventory.subscribe()).unwrap();
    assert_eq!(report.damaged.len(), 1);
    assert_eq!(n.control.count(&n.gpu0), 2, "the damaged claim's instance and the unproven one kept: {uuid:?}");
    // What the publisher would see: GPU 0 with both instances as MIG devices.
    let text = "gpus:\n  - model: H100-80GB\n    count: 2\n    mig:\n      - gpus: [0]\n        instances: [1g.10gb, 2g.20gb]\n";
    let mut seen = fake::parse(text, &node()).unwrap();
    let gpu0 = &mut seen.gpus[0];
    gpu0.uuid = n.gpu0.clone();
    if let MigMode::Enabled(migs) = &mut gpu0.mig {
        for (m, o) in migs.iter_mut().zip(n.control.instances(&n.gpu0).unwrap().iter()) {
            m.uuid = n.control.mig_uuid(&n.gpu0, o.gpu_instance_id, 0).unwrap();
            m.placement = o.placement;
        }
    }
    selection.apply(&mut seen);
    assert!(seen.gpus[0].dynamic_mig().is_some(), "GPU 0 stays dynamic: {:?}", seen.gpus[0].mig);
    let caps = seen.gpus[0].mig_capabilities.as_ref().unwrap();
    let offered: Vec<Placement> = caps.profiles.iter().flat_map(|p| p.placements.clone()).collect();
    assert!(offered.iter().all(|o| !o.overlaps(Placement { start: 4, size: 2 })), "{offered:?}");
    assert!(offered.contains(&Placement { start: 0, size: 4 }), "{offered:?}");

    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
    let left = n.control.instances(&n.gpu0).unwrap();
    assert_eq!(left.len(), 1, "the damaged claim's instance is gone, the unproven one stays: {left:?}");
    assert_eq!(left[0].placement, Placement { start: 4, size: 2 });
}

/// MPS on a dynamic MIG device, as on a static one: the daemon serves the
/// instance just made (its UUID), its GPU goes to `EXCLUSIVE_PROCESS`, and
/// unprepare stops the daemon before it destroys the instance.
#[tokio::test]
async fn mps_runs_on_a_dynamic_mig_device() {
    use super::mps::lifecycle::test_support::FakeHost;
    use super::sharing::test_support::Recorder;
    use super::test_support::claim_config;

    let mut n = node_with_mig();
    n.h.gates = "MPSSupport=true".parse().unwrap();
    let (gpu, host) = (Arc::new(Recorder::default()), Arc::new(FakeHost::default()));
    n.h.gpu = Some(gpu.clone());
    n.h.mps = Some(host.clone());
    let mut claim = allocated(A, "a", &[TWO]);
    let devices = claim.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap();
    devices.config = Some(vec![claim_config(serde_json::json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
    }))]);
    n.h.source.put(claim);
    let (p, _) = n.h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    let record = records(&n.h).remove(0);
    let made = record.devices[0].dynamic_mig.as_ref().unwrap().made.clone().unwrap();
    let daemon = record.mps.clone().unwrap();
    assert_eq!(daemon.visible, std::slice::from_ref(&made.uuid), "the daemon serves the new instance");
    assert_eq!(daemon.gpus, [n.gpu0.clone()]);
    assert!(host.calls.lock().unwrap().iter().any(|c| c == &format!("start {}", made.uuid)), "{:?}", host.calls);
    let spec = spec(&n.h, A).to_string();
    assert!(spec.contains("CUDA_MPS_PIPE_DIRECTORY") && spec.contains(&made.uuid), "{spec}");
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert_eq!(n.control.count(&n.gpu0), 0);
    assert!(gpu.calls.lock().unwrap().iter().any(|c| c.contains("DEFAULT")), "{:?}", gpu.calls);
}

#[tokio::test]
async fn a_record_or_spec_that_cannot_be_written_leaves_no_instance() {
    let n = node_with_mig();
    n.h.source.put(allocated(A, "a", &[FOUR, ONE]));
    let (p, _) = n.h.open();

    // The record cannot be written (a directory holds its name): nothing is made.
    let record = n.h.dir.path().join(format!("state/checkpoint/{A}.json"));
    std::fs::create_dir(&record).unwrap();
    let error = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err().to_string();
    assert!(error.contains(A), "{error}");
    assert_eq!(n.control.count(&n.gpu0), 0, "nothing made without a record");
    assert!(!n.control.calls.lock().unwrap().iter().any(|c| c.starts_with("create-gi") && c.contains(&n.gpu0)));
    std::fs::remove_dir(&record).unwrap();

    // The spec cannot be written, after the instances exist: they go again.
    let spec_path = n.h.dir.path().join(format!("cdi/k8s.gpu.nvidia.com-claim_{A}.json"));
    std::fs::create_dir(&spec_path).unwrap();
    let error = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err().to_string();
    assert!(error.contains("writing CDI spec"), "{error}");
    assert_eq!(n.control.count(&n.gpu0), 0, "the instances are destroyed");
    std::fs::remove_dir(&spec_path).unwrap();

    let devices = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert_eq!(devices.len(), 2, "a retry succeeds");
    assert_eq!(n.control.count(&n.gpu0), 2);
    assert_eq!(records(&n.h).len(), 1);
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert_eq!(n.control.count(&n.gpu0), 0);
    assert!(n.h.cdi_files().is_empty() && n.h.checkpoint_files().is_empty());
}
