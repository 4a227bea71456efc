use std::time::Duration;

use super::test_support::{Harness, allocated, claim_config, claim_ref};
use crate::state::checkpoint::{CheckpointDir, ClaimRecord, PrepareState, envelope};
use gpu_dra_driver::names::ClaimUid;

const A: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const B: &str = "1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

fn spec_file(uid: &str) -> String {
    format!("k8s.gpu.nvidia.com-claim_{uid}.json")
}

#[tokio::test]
async fn prepare_writes_spec_and_record_and_repeats_from_the_record() {
    let h = Harness::new();
    h.source.put(allocated(A, "a", &["gpu-0", "gpu-1-mig-1g10gb-19-0"]));
    let (p, report) = h.open();
    assert_eq!(report, Default::default());
    let out = p.prepare(vec![claim_ref(A, "a")]).await;
    let devices = out[A].clone().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].device_name, "gpu-0");
    assert_eq!(devices[0].pool_name, "node-a");
    assert_eq!(devices[0].request_names, ["gpu"]);
    assert_eq!(devices[1].cdi_device_ids, [format!("k8s.gpu.nvidia.com/claim={A}-gpu-1-mig-1g10gb-19-0")]);
    assert_eq!(h.cdi_files(), [spec_file(A)]);
    assert_eq!(h.checkpoint_files(), [format!("{A}.json")]);
    let loaded = CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap().load().unwrap();
    assert_eq!(loaded.records[0].state, PrepareState::PrepareCompleted);

    let gets = h.source.gets();
    let again = p.prepare(vec![claim_ref(A, "a")]).await;
    assert_eq!(again[A], Ok(devices), "a repeat answers the same");
    assert_eq!(h.source.gets(), gets, "a repeat does not read the claim again");
    assert_eq!(p.prepared_claims(), 1);
}

#[tokio::test]
async fn unprepare_removes_everything_and_is_idempotent() {
    let h = Harness::new();
    h.source.put(allocated(A, "a", &["gpu-0"]));
    let (p, _) = h.open();
    p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    h.source.remove("a");
    let out = p.unprepare(vec![claim_ref(A, "a")]).await;
    assert_eq!(out[A], Ok(()), "unprepare works when the ResourceClaim is gone");
    assert!(h.cdi_files().is_empty());
    assert!(h.checkpoint_files().is_empty());
    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
}

#[tokio::test]
async fn a_device_serves_one_claim_unless_shared() {
    let h = Harness::new();
    h.source.put(allocated(A, "a", &["gpu-0"]));
    h.source.put(allocated(B, "b", &["gpu-0"]));
    let (p, _) = h.open();
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    let err = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err().to_string();
    assert!(err.contains("gpu-0 is already prepared for ResourceClaim default/a"), "{err}");
    assert_eq!(h.cdi_files(), [spec_file(A)], "the refused claim left nothing");
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert!(p.prepare(vec![claim_ref(B, "b")]).await[B].is_ok());
}

#[tokio::test]
async fn shares_of_one_device_coexist() {
    let h = Harness::new();
    for (uid, name, share) in [(A, "a", "s-1"), (B, "b", "s-2")] {
        let mut claim = allocated(uid, name, &["gpu-0"]);
        let status = claim.status.as_mut().unwrap();
        let results = status.allocation.as_mut().unwrap().devices.as_mut().unwrap().results.as_mut().unwrap();
        results[0].share_id = Some(share.into());
        h.source.put(claim);
    }
    let (p, _) = h.open();
    let out = p.prepare(vec![claim_ref(A, "a"), claim_ref(B, "b")]).await;
    assert_eq!(out[A].as_ref().unwrap()[0].share_id.as_deref(), Some("s-1"));
    assert_eq!(out[B].as_ref().unwrap()[0].share_id.as_deref(), Some("s-2"));
}

#[tokio::test]
async fn bad_references_and_lookups_fail_per_claim() {
    let h = Harness::new();
    h.source.put(allocated(A, "a", &["gpu-0"]));
    let (p, _) = h.open();
    let out = p.prepare(vec![claim_ref("../../etc", "x"), claim_ref(A, "a"), claim_ref(B, "missing")]).await;
    assert!(out["../../etc"].as_ref().unwrap_err().to_string().contains("invalid claim UID"), "{:?}", out["../../etc"]);
    assert!(out[A].is_ok());
    assert!(out[B].as_ref().unwrap_err().to_string().contains("default/missing not found"));
    *h.source.error.lock().unwrap() = Some("API server unavailable".into());
    h.source.put(allocated(B, "b", &["gpu-2"]));
    assert_eq!(p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err().to_string(), "API server unavailable");
    assert_eq!(h.cdi_files(), [spec_file(A)]);
}

/// When the CDI directory is unusable the roll-back cannot delete a spec
/// either, so the started record stays; the next attempt rolls it back and
/// prepares afresh.
#[tokio::test]
async fn a_failed_spec_write_is_retried_from_a_started_record() {
    let h = Harness::new();
    h.source.put(allocated(A, "a", &["gpu-0"]));
    let (p, _) = h.open();
    let cdi = h.dir.path().join("cdi");
    std::fs::remove_dir(&cdi).unwrap();
    std::fs::write(&cdi, b"not a directory").unwrap();
    let err = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err().to_string();
    assert!(err.contains("writing CDI spec"), "{err}");
    assert_eq!(p.prepared_claims(), 0);
    let loaded = CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap().load().unwrap();
    assert_eq!(loaded.records[0].state, PrepareState::PrepareStarted);

    std::fs::remove_file(&cdi).unwrap();
    std::fs::create_dir(&cdi).unwrap();
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    assert_eq!(h.cdi_files(), [spec_file(A)]);
}

#[tokio::test]
async fn claims_on_other_devices_do_not_wait() {
    let h = Harness::new();
    h.source.put(allocated(B, "b", &["gpu-2"]));
    let (p, _) = h.open();
    let held = p.locks.lock(vec![super::preparer::device_key("gpu-0")]).await;
    let out = tokio::time::timeout(Duration::from_secs(30), p.prepare(vec![claim_ref(B, "b")])).await;
    assert!(out.expect("a claim on gpu-2 must not wait for gpu-0")[B].is_ok());
    drop(held);
}

fn write_record(h: &Harness, uid: &str, state: PrepareState, boot: &str, devices: &[&str]) {
    let dir = CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap();
    let mut record: ClaimRecord = crate::state::checkpoint::test_support::record(uid, devices);
    record.state = state;
    record.boot_id = boot.into();
    dir.write(&ClaimUid::new(uid).unwrap(), &record).unwrap();
}

#[tokio::test]
async fn start_up_rolls_back_interrupted_prepares_and_deletes_orphans() {
    let h = Harness::new();
    drop(h.open());
    let cdi = h.dir.path().join("cdi");
    write_record(&h, A, PrepareState::PrepareStarted, "boot-1", &["gpu-0"]);
    std::fs::write(cdi.join(spec_file(A)), b"{}").unwrap();
    std::fs::write(cdi.join(spec_file(B)), b"{}").unwrap();
    std::fs::write(cdi.join(format!(".{}.7-0.tmp", spec_file(B))), b"{").unwrap();
    std::fs::write(cdi.join("other-vendor.json"), b"{}").unwrap();
    let (p, report) = h.open();
    assert_eq!(report.rolled_back, [A]);
    assert_eq!(report.orphans.len(), 1);
    assert_eq!(report.temp_files, 1);
    assert_eq!(h.cdi_files(), ["other-vendor.json"], "foreign files are left alone");
    assert!(h.checkpoint_files().is_empty());
    h.source.put(allocated(A, "a", &["gpu-0"]));
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok(), "the kubelet's retry prepares afresh");
}

#[tokio::test]
async fn start_up_keeps_completed_claims_and_rewrites_missing_specs() {
    let h = Harness::new();
    h.source.put(allocated(A, "a", &["gpu-0"]));
    let devices = {
        let (p, _) = h.open();
        p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap()
    };
    let spec = h.dir.path().join("cdi").join(spec_file(A));
    let original = std::fs::read(&spec).unwrap();
    std::fs::remove_file(&spec).unwrap();
    let (p, report) = h.open();
    assert_eq!(report.kept, 1);
    assert_eq!(report.rewritten, [A]);
    assert_eq!(std::fs::read(&spec).unwrap(), original);
    assert_eq!(p.prepare(vec![claim_ref(A, "a")]).await[A], Ok(devices));
}

#[tokio::test]
async fn a_repeated_prepare_writes_a_missing_spec_again() {
    // kubernetes#141433: the CDI directory emptied while the plugin runs
    // (a tmpfs cleaned, a node "rebooted" without a new boot id); the
    // kubelet's next prepare must give the runtime a spec again.
    let h = Harness::new();
    h.source.put(allocated(A, "a", &["gpu-0"]));
    let (p, _) = h.open();
    let devices = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    let spec = h.dir.path().join("cdi").join(spec_file(A));
    let original = std::fs::read(&spec).unwrap();
    std::fs::remove_file(&spec).unwrap();
    let gets = h.source.gets();
    assert_eq!(p.prepare(vec![claim_ref(A, "a")]).await[A], Ok(devices), "the same devices");
    assert_eq!(std::fs::read(&spec).unwrap(), original, "the same spec, written again");
    assert_eq!(h.source.gets(), gets, "from the record: the claim is not read again");
    assert_eq!(h.checkpoint_files(), [format!("{A}.json")]);
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert!(h.cdi_files().is_empty() && h.checkpoint_files().is_empty());
}

#[tokio::test]
async fn a_reboot_voids_every_record() {
    let h = Harness::new();
    h.source.put(allocated(A, "a", &["gpu-0"]));
    {
        let (p, _) = h.open_boot("boot-1");
        p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    }
    let (p, report) = h.open_boot("boot-2");
    assert_eq!(report.other_boot, [A]);
    assert!(h.cdi_files().is_empty() && h.checkpoint_files().is_empty());
    assert_eq!(p.prepared_claims(), 0);
}

#[tokio::test]
async fn a_damaged_record_is_set_aside_and_its_spec_kept_until_unprepare() {
    let h = Harness::new();
    drop(h.open());
    let dir = h.dir.path().join("state/checkpoint");
    let mut bytes = envelope::encode(&crate::state::checkpoint::test_support::record(A, &["gpu-0"])).unwrap();
    bytes.truncate(bytes.len() - 5);
    std::fs::write(dir.join(format!("{A}.json")), bytes).unwrap();
    std::fs::write(h.dir.path().join("cdi").join(spec_file(A)), b"{}").unwrap();
    let (p, report) = h.open();
    assert_eq!(report.damaged.len(), 1);
    assert_eq!(h.checkpoint_files(), [format!("{A}.json.damaged")]);
    assert_eq!(h.cdi_files(), [spec_file(A)]);
    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
    assert!(h.cdi_files().is_empty());
}

/// Records with valid checksums naming files that are not theirs (an
/// absolute path, `../`, another claim's spec) and a record renamed to
/// another claim's UID are set aside; no file they name is deleted, nor
/// the spec of the claim a renamed record belongs to.
#[tokio::test]
async fn records_naming_other_files_are_set_aside_and_nothing_they_name_goes() {
    let h = Harness::new();
    h.source.put(allocated(A, "a", &["gpu-0"]));
    {
        let (p, _) = h.open();
        p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    }
    let cdi = h.dir.path().join("cdi");
    let outside = h.dir.path().join("outside");
    std::fs::write(&outside, b"keep").unwrap();
    let dir = CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap();
    let forged = |n: u8, name: String, boot: &str| {
        let uid = format!("{n}c4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a");
        let mut record = crate::state::checkpoint::test_support::record(&uid, &["gpu-1"]);
        record.state = PrepareState::PrepareStarted;
        record.boot_id = boot.into();
        record.cdi_spec_file = Some(name);
        dir.write(&ClaimUid::new(uid.as_str()).unwrap(), &record).unwrap();
    };
    forged(1, outside.to_string_lossy().into_owned(), "boot-1");
    forged(2, "../outside".into(), "boot-0");
    forged(3, spec_file(A), "boot-1");
    // A's record renamed to B: A's spec must not become an orphan.
    std::fs::rename(dir.path().join(format!("{A}.json")), dir.path().join(format!("{B}.json"))).unwrap();
    let (p, report) = h.open();
    assert_eq!(report.damaged.len(), 4, "{report:?}");
    assert!(report.rolled_back.is_empty() && report.other_boot.is_empty() && report.orphans.is_empty());
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
    assert_eq!(h.cdi_files(), [spec_file(A)]);
    assert!(h.checkpoint_files().iter().all(|f| f.ends_with(".damaged")), "{:?}", h.checkpoint_files());
    assert!(cdi.join(spec_file(A)).exists());
    assert_eq!(p.prepared_claims(), 0);
}

#[tokio::test]
async fn failures_are_counted_by_kind() {
    let h = Harness::new();
    let metrics = std::sync::Arc::new(crate::observe::metrics::Metrics::new());
    let (p, _) = h.open();
    let p = p.with_metrics(metrics.clone());
    p.prepare(vec![claim_ref("bad", "x"), claim_ref(B, "missing")]).await;
    let text = metrics.encode().unwrap();
    assert!(text.contains(r#"gpu_dra_errors_total{kind="invalid_request"} 1"#), "{text}");
    assert!(text.contains(r#"gpu_dra_errors_total{kind="claim_lookup"} 1"#), "{text}");
}

fn time_sliced(
    uid: &str,
    name: &str,
    interval: &str,
    share: Option<&str>,
) -> k8s_openapi::api::resource::v1::ResourceClaim {
    let mut claim = allocated(uid, name, &["gpu-0"]);
    let devices = claim.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap();
    devices.results.as_mut().unwrap()[0].share_id = share.map(str::to_owned);
    devices.config = Some(vec![claim_config(serde_json::json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }))]);
    claim
}

fn gpu_harness() -> (Harness, std::sync::Arc<super::sharing::test_support::Recorder>) {
    let mut h = Harness::new();
    h.gates = "TimeSlicingSettings=true".parse().unwrap();
    let recorder = std::sync::Arc::new(super::sharing::test_support::Recorder::default());
    h.gpu = Some(recorder.clone());
    (h, recorder)
}

fn calls(recorder: &super::sharing::test_support::Recorder) -> Vec<String> {
    std::mem::take(&mut *recorder.calls.lock().unwrap())
}

#[tokio::test]
async fn time_slicing_is_set_at_prepare_and_reset_by_the_last_claim() {
    let (h, gpu) = gpu_harness();
    let uuid = h.inventory.borrow().gpus[0].uuid.clone();
    h.source.put(time_sliced(A, "a", "Short", Some("s-1")));
    h.source.put(time_sliced(B, "b", "Short", Some("s-2")));
    let (p, _) = h.open();
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    assert_eq!(calls(&gpu), [format!("set {uuid} 1")]);
    let loaded = CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap().load().unwrap();
    assert_eq!(loaded.records[0].devices[0].time_slice.as_ref().map(|t| t.interval), Some(1));
    // A second claim on the same GPU with the same interval shares it.
    assert!(p.prepare(vec![claim_ref(B, "b")]).await[B].is_ok());
    assert_eq!(calls(&gpu), [format!("set {uuid} 1")]);
    // The first to let go leaves the setting; the last resets it.
    p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert!(calls(&gpu).is_empty());
    p.unprepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap();
    assert_eq!(calls(&gpu), [format!("set {uuid} 0")]);
}

#[tokio::test]
async fn one_gpu_cannot_take_two_intervals_and_gates_stay_closed_by_default() {
    let (h, gpu) = gpu_harness();
    h.source.put(time_sliced(A, "a", "Long", Some("s-1")));
    h.source.put(time_sliced(B, "b", "Short", Some("s-2")));
    let (p, _) = h.open();
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    let err = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err().to_string();
    assert!(err.contains("Long for ResourceClaim default/a and Short for ResourceClaim default/b"), "{err}");
    assert_eq!(calls(&gpu).len(), 1, "the refused claim changed nothing");

    let closed = Harness::new();
    closed.source.put(time_sliced(A, "a", "Long", None));
    let (p, _) = closed.open();
    let err = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err().to_string();
    assert!(err.contains(r#"the "TimeSlicingSettings" feature gate is not enabled"#), "{err}");
}

#[tokio::test]
async fn an_interrupted_time_sliced_prepare_is_undone_at_start_and_kept_ones_set_again() {
    let (h, gpu) = gpu_harness();
    let uuid = h.inventory.borrow().gpus[0].uuid.clone();
    h.source.put(time_sliced(A, "a", "Medium", Some("s-1")));
    let (p, _) = h.open();
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    drop(p);
    calls(&gpu);
    // A restart keeps the completed claim and sets its time-slice again.
    let (_p, report) = h.open();
    assert_eq!(report.kept, 1);
    assert_eq!(calls(&gpu), [format!("set {uuid} 2")]);
    // A crash between the started record and the spec: the record is
    // rolled back at start and the GPU reset.
    let dir = CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap();
    let mut record = dir.load().unwrap().records.remove(0);
    record.state = PrepareState::PrepareStarted;
    dir.write(&ClaimUid::new(A).unwrap(), &record).unwrap();
    let (_p, report) = h.open();
    assert_eq!(report.rolled_back, [A.to_owned()]);
    assert_eq!(calls(&gpu), [format!("set {uuid} 0")]);
}
