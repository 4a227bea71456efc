//! MPS through the preparer, with a recording host and `nvidia-smi`: the
//! order of the steps, the checkpoint before them, the roll-back of a
//! failure, and start-up after a crash.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::mps::lifecycle::test_support::FakeHost;
use super::sharing::test_support::Recorder;
use super::test_support::{Harness, allocated, claim_config, claim_ref};
use crate::state::checkpoint::{CheckpointDir, PrepareState};
use gpu_dra_driver::names::ClaimUid;

const A: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const B: &str = "1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

fn harness() -> (Harness, Arc<Recorder>, Arc<FakeHost>) {
    let mut h = Harness::new();
    h.gates = "MPSSupport=true,TimeSlicingSettings=true".parse().unwrap();
    let (gpu, host) = (Arc::new(Recorder::default()), Arc::new(FakeHost::default()));
    h.gpu = Some(gpu.clone());
    h.mps = Some(host.clone());
    (h, gpu, host)
}

fn with_mps(uid: &str, name: &str, percentage: u8) -> ResourceClaim {
    let mut claim = allocated(uid, name, &["gpu-0"]);
    let devices = claim.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap();
    devices.config = Some(vec![claim_config(serde_json::json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": percentage}},
    }))]);
    claim
}

fn share(uid: &str, name: &str, memory: &str) -> ResourceClaim {
    let mut claim = allocated(uid, name, &["gpu-0"]);
    let devices = claim.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap();
    let result = &mut devices.results.as_mut().unwrap()[0];
    result.share_id = Some(format!("share-{name}"));
    result.consumed_capacity = Some([("memory".to_owned(), Quantity(memory.to_owned()))].into());
    claim
}

fn take(calls: &std::sync::Mutex<Vec<String>>) -> Vec<String> {
    std::mem::take(&mut *calls.lock().unwrap())
}

fn records(h: &Harness) -> Vec<crate::state::checkpoint::ClaimRecord> {
    CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap().load().unwrap().records
}

#[tokio::test]
async fn a_claims_daemon_is_brought_up_in_order_and_torn_down_on_unprepare() {
    let (h, gpu, host) = harness();
    let uuid = h.inventory.borrow().gpus[0].uuid.clone();
    h.source.put(with_mps(A, "a", 25));
    let (p, _) = h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    let root = h.dir.path().join("state/mps").join(A);
    assert_eq!(take(&gpu.calls), [format!("mode {uuid} EXCLUSIVE_PROCESS")]);
    assert_eq!(
        take(&host.calls),
        [
            format!("dirs {}", root.display()),
            "mount".into(),
            format!("start {uuid}"),
            "control get_default_active_thread_percentage".into(),
            "control set_default_active_thread_percentage 25".into(),
        ]
    );
    let record = records(&h).remove(0);
    assert_eq!(record.state, PrepareState::PrepareCompleted);
    let daemon = record.mps.unwrap();
    assert!(daemon.process.is_some(), "the daemon's process is recorded");
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(h.dir.path().join("cdi").join(h.cdi_files()[0].clone())).unwrap())
            .unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    assert_eq!(edits["env"], serde_json::json!(["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]));
    assert_eq!(edits["mounts"][0]["hostPath"], root.join("pipe").to_string_lossy().as_ref());
    assert_eq!(edits["mounts"][1]["containerPath"], "/dev/shm");

    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert_eq!(take(&host.calls), ["control quit", "unmount", "rmdirs"]);
    assert_eq!(take(&gpu.calls), [format!("mode {uuid} DEFAULT")]);
    assert!(records(&h).is_empty() && h.cdi_files().is_empty());
}

#[tokio::test]
async fn two_shares_of_one_gpu_get_their_own_daemon_and_limit() {
    let (h, gpu, host) = harness();
    let uuid = h.inventory.borrow().gpus[0].uuid.clone();
    h.source.put(share(A, "a", "10Gi"));
    h.source.put(share(B, "b", "30Gi"));
    let (p, _) = h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap();
    let limits: Vec<String> = take(&host.calls).into_iter().filter(|c| c.contains("pinned")).collect();
    assert_eq!(
        limits,
        [
            format!("control set_default_device_pinned_mem_limit {uuid} 10240M"),
            format!("control set_default_device_pinned_mem_limit {uuid} 30720M"),
        ]
    );
    let roots: Vec<_> = records(&h).into_iter().map(|r| r.mps.unwrap().root).collect();
    assert_ne!(roots[0], roots[1], "one daemon per claim");
    take(&gpu.calls);
    // The first share to go leaves the GPU's mode; the last resets it.
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert!(take(&gpu.calls).is_empty());
    p.unprepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap();
    assert_eq!(take(&gpu.calls), [format!("mode {uuid} DEFAULT")]);
}

#[tokio::test]
async fn a_daemon_that_never_answers_fails_the_claim_and_is_rolled_back() {
    let (h, gpu, host) = harness();
    let uuid = h.inventory.borrow().gpus[0].uuid.clone();
    h.source.put(with_mps(A, "a", 25));
    *host.fail.lock().unwrap() = Some("get");
    let (p, _) = h.open();
    let err = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err().to_string();
    assert!(err.contains("MPS: the MPS control daemon in") && err.contains("did not answer within"), "{err}");
    let calls = take(&host.calls);
    assert_eq!(calls[calls.len() - 3..], ["control quit", "unmount", "rmdirs"], "{calls:?}");
    assert_eq!(take(&gpu.calls), [format!("mode {uuid} EXCLUSIVE_PROCESS"), format!("mode {uuid} DEFAULT")]);
    assert!(records(&h).is_empty() && h.cdi_files().is_empty());
}

#[tokio::test]
async fn start_up_keeps_a_running_daemon_restarts_a_gone_one_and_undoes_an_interrupted_one() {
    let (h, gpu, host) = harness();
    let uuid = h.inventory.borrow().gpus[0].uuid.clone();
    h.source.put(with_mps(A, "a", 25));
    let (p, _) = h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    drop(p);
    take(&host.calls);
    take(&gpu.calls);
    // Still running: kept as it is.
    let (p, report) = h.open();
    assert_eq!(report.kept, 1);
    assert_eq!(take(&host.calls), ["control get_default_active_thread_percentage"]);
    drop(p);
    // Gone (the plugin's container was restarted): started again with the
    // same limits, and the new process recorded.
    let before = records(&h)[0].mps.clone().unwrap().process;
    *host.running.lock().unwrap() = None;
    let (p, _) = h.open();
    let calls = take(&host.calls);
    assert!(calls.contains(&format!("start {uuid}")), "{calls:?}");
    assert_eq!(calls.last().unwrap(), "control set_default_active_thread_percentage 25");
    let after = records(&h)[0].mps.clone().unwrap().process;
    assert!(after.is_some() && after != before, "{before:?} {after:?}");
    drop(p);
    // Interrupted before completing: torn down and the GPU reset.
    let dir = CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap();
    let mut record = dir.load().unwrap().records.remove(0);
    record.state = PrepareState::PrepareStarted;
    dir.write(&ClaimUid::new(A).unwrap(), &record).unwrap();
    take(&gpu.calls);
    let (_p, report) = h.open();
    assert_eq!(report.rolled_back, [A.to_owned()]);
    assert_eq!(take(&host.calls), ["control quit", "unmount", "rmdirs"]);
    assert_eq!(take(&gpu.calls), [format!("mode {uuid} DEFAULT")]);
}

#[tokio::test]
async fn mps_and_time_slicing_do_not_mix_on_one_gpu() {
    let (h, _gpu, _host) = harness();
    h.source.put(share(A, "a", "10Gi"));
    let mut sliced = allocated(B, "b", &["gpu-0"]);
    let devices = sliced.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap();
    devices.results.as_mut().unwrap()[0].share_id = Some("s-b".into());
    devices.config = Some(vec![claim_config(serde_json::json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing"},
    }))]);
    h.source.put(sliced);
    let (p, _) = h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    let err = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err().to_string();
    assert!(err.contains("is MPS for ResourceClaim default/a and would be time-sliced"), "{err}");
}

#[tokio::test]
async fn start_up_removes_daemon_directories_no_record_owns_and_those_from_before_a_reboot() {
    let (h, _gpu, host) = harness();
    h.source.put(with_mps(A, "a", 25));
    let (p, _) = h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    drop(p);
    std::fs::create_dir_all(h.dir.path().join("state/mps").join(B).join("pipe")).unwrap();
    take(&host.calls);
    // After a reboot: no process is looked for (its pid may be another's
    // now), only the directories go; the orphan is torn down too.
    *host.running.lock().unwrap() = None;
    let (_p, report) = h.open_boot("boot-2");
    assert_eq!(report.other_boot, [A.to_owned()]);
    assert_eq!(take(&host.calls), ["unmount", "rmdirs", "unmount", "rmdirs"]);
}

/// NVIDIA's `ConsumableShares`: four claims holding one share each of
/// gpu-0 are prepared side by side with no MPS daemon (the shares are not
/// enforced, as in NVIDIA's driver), and an MPS config beside them is
/// refused naming its path.
#[tokio::test]
async fn nvidia_consumable_shares_prepare_without_daemons_and_refuse_mps() {
    let (mut h, gpu, host) = harness();
    h.gates = "ConsumableShares=true,MPSSupport=true".parse().unwrap();
    let uids = [A, B, "2b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a", "3b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a"];
    for (i, uid) in uids.iter().enumerate() {
        let mut claim = share(uid, &format!("replica-{i}"), "0");
        let result = &mut claim
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap()[0];
        result.consumed_capacity.as_mut().unwrap().insert("shares".into(), Quantity("1".into()));
        h.source.put(claim);
    }
    let (p, _) = h.open();
    let refs: Vec<_> = uids.iter().enumerate().map(|(i, uid)| claim_ref(uid, &format!("replica-{i}"))).collect();
    let out = p.prepare(refs).await;
    for uid in uids {
        let devices = out[uid].clone().unwrap_or_else(|e| panic!("{uid}: {e}"));
        assert_eq!(devices[0].device_name, "gpu-0");
    }
    assert!(take(&host.calls).is_empty(), "no MPS daemon for unenforced shares");
    assert!(take(&gpu.calls).is_empty(), "the GPU's compute mode is left alone");
    assert_eq!(h.cdi_files().len(), 4);

    const C: &str = "4b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
    h.source.put(with_mps(C, "mps", 50));
    let err = p.prepare(vec![claim_ref(C, "mps")]).await[C].clone().unwrap_err().to_string();
    assert!(err.contains("MPS is not supported with the ConsumableShares feature gate"), "{err}");
    assert!(err.contains(".sharing:"), "names the config's path: {err}");
}
