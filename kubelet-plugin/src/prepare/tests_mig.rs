//! Dynamic MIG through the preparer, on an in-memory GPU: two H100s, GPU
//! 0 dynamic, GPU 1 partitioned by an administrator (one 3g.40gb).

use std::sync::Arc;

use gpu_dra_driver::inventory::dynamic_mig::{DynamicMigGpus, select};
use gpu_dra_driver::inventory::{Inventory, MigMode, Placement, fake};
use gpu_dra_driver::names::ClaimUid;

use super::test_support::{Harness, allocated, claim_ref, node};
use crate::mig::MadeInstance;
use crate::mig::MigIntent;
use crate::mig::control::MigControl;
use crate::mig::control::fake::FakeControl;
use crate::state::checkpoint::{CheckpointDir, ClaimRecord, DynamicMigDevice, PrepareState};

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
    let error = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err();
    assert!(error.contains("conflicts with device gpu-0-mig-2g20gb-14-4 of ResourceClaim default/a"), "{error}");
    assert_eq!(n.control.count(&n.gpu0), 1);
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();

    // A compute instance that cannot be made: the GPU instance goes too.
    *n.control.fail.lock().unwrap() = Some("create-ci".into());
    let error = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err();
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
    let error = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err();
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

#[tokio::test]
async fn start_up_rolls_back_sweeps_remakes_and_never_touches_the_static_gpu() {
    let n = node_with_mig();
    let checkpoint = CheckpointDir::open(n.h.dir.path().join("state/checkpoint")).unwrap();
    let write = |r: &ClaimRecord| checkpoint.write(&ClaimUid::new(r.uid.as_str()).unwrap(), r).unwrap();
    // An interrupted prepare left a 4g at 0 on GPU 0.
    n.control.create_gpu_instance(&n.gpu0, 5, Placement { start: 0, size: 4 }).unwrap();
    write(&forged(A, PrepareState::PrepareStarted, FOUR, intent(&n.gpu0, 5, 0, 4), None));
    // A prepared claim whose 1g at 6 vanished.
    let made = MadeInstance {
        gpu_instance_id: 9,
        compute_instance_id: 0,
        uuid: "MIG-gone".into(),
        gpu_instance_cap: 84,
        compute_instance_cap: 85,
    };
    let mut kept = forged(B, PrepareState::PrepareCompleted, ONE, intent(&n.gpu0, 19, 6, 1), Some(made));
    kept.devices[0].cdi_device_ids = vec![format!("k8s.gpu.nvidia.com/claim={B}-{ONE}")];
    write(&kept);
    // An instance nobody owns, at 4.
    let orphan = n.control.create_gpu_instance(&n.gpu0, 14, Placement { start: 4, size: 2 }).unwrap();
    n.control.create_compute_instance(&n.gpu0, orphan, 1).unwrap();
    // Forged records naming the administrator's instance on GPU 1.
    let c = "2b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
    let d = "3b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
    write(&forged(c, PrepareState::PrepareStarted, "gpu-1-mig-3g40gb-9-0", intent(&n.gpu1, 9, 0, 4), None));
    write(&forged(d, PrepareState::PrepareCompleted, "gpu-1-mig-3g40gb-9-4", intent(&n.gpu1, 9, 4, 4), None));

    let (p, report) = n.h.open();
    assert_eq!(report.rolled_back.len(), 2, "{report:?}");
    assert_eq!(report.mig.destroyed, 1, "the orphan at 4: {report:?}");
    assert_eq!(report.mig.remade, [B.to_owned()]);
    let observed = n.control.instances(&n.gpu0).unwrap();
    assert_eq!(observed.len(), 1, "only the remade 1g: {observed:?}");
    assert_eq!(observed[0].placement, Placement { start: 6, size: 1 });
    assert_eq!(n.control.count(&n.gpu1), 1, "the static GPU's instance survives every forged record");
    let spec = spec(&n.h, B).to_string();
    assert!(spec.contains("MIG-fake-") && !spec.contains("MIG-gone"), "the spec names the new instance: {spec}");
    let remade = records(&n.h).into_iter().find(|r| r.uid == B).unwrap();
    assert_ne!(remade.devices[0].dynamic_mig.as_ref().unwrap().made.as_ref().unwrap().uuid, "MIG-gone");
    // The forged completed record on the static GPU is unprepared without touching it.
    assert_eq!(p.unprepare(vec![claim_ref(d, "claim")]).await[d], Ok(()));
    assert_eq!(n.control.count(&n.gpu1), 1);
    assert_eq!(p.unprepare(vec![claim_ref(B, "claim")]).await[B], Ok(()));
    assert_eq!(n.control.count(&n.gpu0), 0);
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
    let error = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err();
    assert!(error.contains(A), "{error}");
    assert_eq!(n.control.count(&n.gpu0), 0, "nothing made without a record");
    assert!(!n.control.calls.lock().unwrap().iter().any(|c| c.starts_with("create-gi") && c.contains(&n.gpu0)));
    std::fs::remove_dir(&record).unwrap();

    // The spec cannot be written, after the instances exist: they go again.
    let spec_path = n.h.dir.path().join(format!("cdi/k8s.gpu.nvidia.com-claim_{A}.json"));
    std::fs::create_dir(&spec_path).unwrap();
    let error = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err();
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
