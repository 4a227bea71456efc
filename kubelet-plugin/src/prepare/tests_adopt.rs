//! Adopting NVIDIA's checkpoint at start-up, through the preparer.

use serde_json::{Value, json};

use super::super::test_support::{Harness, allocated, claim_ref};
use crate::state::checkpoint::{CheckpointDir, PrepareState};

/// Served: a whole GPU.
const GPU: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
/// Served: a MIG device that exists on its own.
const MIG: &str = "1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
/// Not served: MPS through NVIDIA's daemon.
const MPS: &str = "2b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
/// Interrupted.
const STARTED: &str = "3b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
/// Refused: a CDI id that is not derived from its UID.
const FORGED: &str = "4b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
/// Refused: another node's pool.
const ELSEWHERE: &str = "5b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
/// A new claim of ours.
const NEW: &str = "6b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

fn yaml(uid: &str) -> String {
    format!("k8s.gpu.nvidia.com-claim_{uid}.yaml")
}

fn json_spec(uid: &str) -> String {
    format!("k8s.gpu.nvidia.com-claim_{uid}.json")
}

fn gpu_uuid(h: &Harness, minor: u32) -> String {
    h.inventory.borrow().gpus.iter().find(|g| g.minor == minor).unwrap().uuid.clone()
}

fn mig_uuid(h: &Harness) -> String {
    let inventory = h.inventory.borrow();
    let gpu = inventory.gpus.iter().find(|g| g.minor == 1).unwrap();
    match &gpu.mig {
        gpu_dra_driver::inventory::MigMode::Enabled(migs) => migs[0].uuid.clone(),
        other => panic!("gpu-1 is {other:?}"),
    }
}

fn kubelet_device(uid: &str, device: &str, pool: &str) -> Value {
    json!({"Requests": ["gpu"], "PoolName": pool, "DeviceName": device,
           "CDIDeviceIDs": [format!("k8s.gpu.nvidia.com/claim={uid}-{device}")]})
}

fn claim(state: &str, name: &str, devices: Vec<Value>, mps: &str) -> Value {
    json!({"checkpointState": state, "name": name, "namespace": "default", "status": {},
           "preparedDevices": [{"devices": devices, "configState": {"mpsControlDaemonID": mps}}]})
}

/// NVIDIA's v2 checkpoint with one claim of each kind, and their spec files.
fn nvidia_state(h: &Harness, boot: &str) -> Value {
    let gpu = |uid: &str, device: &str, uuid: String| json!({"gpu": {"info": {"uuid": uuid}, "device": kubelet_device(uid, device, "node-a")}, "mig": null});
    let mut forged = kubelet_device(FORGED, "gpu-2", "node-a");
    forged["CDIDeviceIDs"] = json!(["k8s.gpu.nvidia.com/claim=../../etc"]);
    let file = json!({"checksum": 1, "v1": {}, "v2": {"checksum": 2, "nodeBootID": boot, "preparedClaims": {
        GPU: claim("PrepareCompleted", "gpu", vec![gpu(GPU, "gpu-0", gpu_uuid(h, 0))], ""),
        MIG: claim("PrepareCompleted", "mig", vec![json!({"gpu": null, "mig": {
            "concrete": {"parentMinor": 1, "giId": 1, "ciId": 0, "migUUID": mig_uuid(h), "parentUUID": gpu_uuid(h, 1)},
            "device": kubelet_device(MIG, "gpu-1-mig-1g10gb-19-0", "node-a")}})], ""),
        MPS: claim("PrepareCompleted", "mps", vec![gpu(MPS, "gpu-2", gpu_uuid(h, 2))], "d41d8cd9"),
        // As NVIDIA's plugin records it: no devices.
        STARTED: {"checkpointState": "PrepareStarted", "name": "started", "namespace": "default", "status": {}},
        FORGED: claim("PrepareCompleted", "forged", vec![json!({"gpu": {"info": {"uuid": "GPU-x"}, "device": forged}})], ""),
        ELSEWHERE: claim("PrepareCompleted", "elsewhere",
            vec![json!({"gpu": {"info": {"uuid": "GPU-x"}, "device": kubelet_device(ELSEWHERE, "gpu-0", "node-b")}})], ""),
        "not-a-uid": {"checkpointState": "Sideways"},
    }}});
    write_nvidia(h, &file);
    for uid in [GPU, MIG, MPS, STARTED, FORGED, ELSEWHERE] {
        std::fs::create_dir_all(h.dir.path().join("cdi")).unwrap();
        std::fs::write(h.dir.path().join("cdi").join(yaml(uid)), format!("kind: k8s.gpu.nvidia.com/claim # {uid}\n"))
            .unwrap();
    }
    file
}

fn write_nvidia(h: &Harness, file: &Value) {
    std::fs::create_dir_all(h.dir.path().join("state")).unwrap();
    std::fs::write(h.dir.path().join("state/checkpoint.json"), file.to_string()).unwrap();
}

fn state_files(h: &Harness) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(h.dir.path().join("state"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint.json"))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn claims_nvidia_prepared_are_served_kept_or_refused_and_their_specs_go_with_their_unprepare() {
    let h = Harness::new();
    nvidia_state(&h, "boot-1");
    let (p, report) = h.open();
    let adopted = &report.adopted;
    assert_eq!(adopted.served, [GPU, MIG]);
    assert_eq!(adopted.not_served.iter().map(|(u, _)| u.as_str()).collect::<Vec<_>>(), [MPS]);
    assert!(adopted.not_served[0].1.contains("MPS control daemon \"d41d8cd9\""), "{adopted:?}");
    assert_eq!(adopted.interrupted, [STARTED]);
    let refused: std::collections::BTreeMap<_, _> = adopted.refused.iter().cloned().collect();
    assert!(refused[FORGED].contains("CDI ids [\"k8s.gpu.nvidia.com/claim=../../etc\"]"), "{refused:?}");
    assert!(refused[ELSEWHERE].contains("pool \"node-b\", but this node's pool is \"node-a\""), "{refused:?}");
    assert!(refused["not-a-uid"].contains("checkpointState"), "{refused:?}");
    assert_eq!(report.rolled_back, [STARTED], "an interrupted prepare is rolled back like ours");
    let renamed = state_files(&h);
    assert_eq!(renamed.len(), 1);
    assert!(renamed[0].starts_with("checkpoint.json.adopted-"), "{renamed:?}");
    assert_eq!(
        h.cdi_files(),
        [yaml(GPU), yaml(MIG), yaml(MPS), yaml(FORGED), yaml(ELSEWHERE)],
        "the interrupted claim's spec went; a refused claim's is not ours to delete"
    );

    // A repeated prepare answers the ids NVIDIA's plugin gave, without the API.
    let served = p.prepare(vec![claim_ref(GPU, "gpu")]).await[GPU].clone().unwrap();
    assert_eq!(served[0].cdi_device_ids, [format!("k8s.gpu.nvidia.com/claim={GPU}-gpu-0")]);
    assert_eq!(h.source.gets(), 0);
    let refused = p.prepare(vec![claim_ref(MPS, "mps")]).await[MPS].clone().unwrap_err().to_string();
    assert!(
        refused.contains("prepared on this node by NVIDIA's DRA driver, and this driver does not serve it"),
        "{refused}"
    );
    // The adopted claims hold their devices.
    h.source.put(allocated(NEW, "new", &["gpu-0"]));
    let busy = p.prepare(vec![claim_ref(NEW, "new")]).await[NEW].clone().unwrap_err().to_string();
    assert!(busy.contains("gpu-0 is already prepared for ResourceClaim default/gpu"), "{busy}");

    for (uid, name) in [(GPU, "gpu"), (MIG, "mig"), (MPS, "mps")] {
        assert_eq!(p.unprepare(vec![claim_ref(uid, name)]).await[uid], Ok(()));
    }
    assert_eq!(h.cdi_files(), [yaml(FORGED), yaml(ELSEWHERE)]);
    assert!(h.checkpoint_files().is_empty());
    assert!(p.prepare(vec![claim_ref(NEW, "new")]).await[NEW].is_ok(), "gpu-0 is free again");
    assert_eq!(h.cdi_files(), [yaml(FORGED), yaml(ELSEWHERE), json_spec(NEW)]);
}

#[tokio::test]
async fn a_restart_keeps_adopted_claims_and_never_adopts_twice() {
    let h = Harness::new();
    let file = nvidia_state(&h, "boot-1");
    let (p, _) = h.open();
    p.unprepare(vec![claim_ref(MIG, "mig")]).await[MIG].clone().unwrap();
    drop(p);
    let (p, report) = h.open();
    assert_eq!(report.adopted, Default::default(), "their file was set aside");
    assert_eq!(report.kept, 2, "the GPU and MPS claims");
    assert!(p.prepare(vec![claim_ref(GPU, "gpu")]).await[GPU].is_ok());
    drop(p);

    // A crash between the records and the rename: adopted again, but a
    // claim that has a record keeps it, and an unprepared one is adopted
    // again only because its entry is back (the rename never happened).
    write_nvidia(&h, &file);
    let (_p, report) = h.open();
    assert_eq!(report.adopted.had_record, [GPU, MPS]);
    assert_eq!(report.adopted.served, [MIG]);
}

#[tokio::test]
async fn a_missing_spec_of_an_adopted_claim_is_written_again_under_their_name() {
    let h = Harness::new();
    nvidia_state(&h, "boot-1");
    std::fs::remove_file(h.dir.path().join("cdi").join(yaml(GPU))).unwrap();
    let (_p, report) = h.open();
    assert!(report.rewritten.contains(&GPU.to_string()), "{report:?}");
    let text = std::fs::read_to_string(h.dir.path().join("cdi").join(yaml(GPU))).unwrap();
    let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(spec["devices"][0]["name"], format!("{GPU}-gpu-0"));
}

#[tokio::test]
async fn a_checkpoint_from_another_boot_is_void() {
    let h = Harness::new();
    nvidia_state(&h, "boot-0");
    let (_p, report) = h.open();
    assert_eq!(report.adopted.other_boot, 7 - 1, "every decodable claim");
    assert!(report.adopted.served.is_empty());
    assert!(h.checkpoint_files().is_empty());
    assert!(state_files(&h)[0].starts_with("checkpoint.json.adopted-"));
}

#[tokio::test]
async fn an_unreadable_checkpoint_is_left_as_it_is_and_its_specs_stay_until_unprepared() {
    for bad in [Some(b"{\"v2\": {\"preparedClaims\": 7}}".as_slice()), Some(b"\x00garbage".as_slice()), None] {
        let h = Harness::new();
        nvidia_state(&h, "boot-1");
        let path = h.dir.path().join("state/checkpoint.json");
        match bad {
            Some(bytes) => std::fs::write(&path, bytes).unwrap(),
            None => {
                std::fs::remove_file(&path).unwrap();
                std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
            }
        }
        let before = std::fs::symlink_metadata(&path).unwrap().len();
        let (p, report) = h.open();
        assert!(report.adopted.unreadable.is_some(), "{report:?}");
        assert!(report.adopted.served.is_empty() && report.orphans.is_empty());
        assert_eq!(std::fs::symlink_metadata(&path).unwrap().len(), before, "left as it is");
        assert_eq!(h.cdi_files().len(), 6, "start-up deletes no spec of theirs");
        assert_eq!(p.unprepare(vec![claim_ref(GPU, "gpu")]).await[GPU], Ok(()));
        assert!(!h.cdi_files().contains(&yaml(GPU)), "the kubelet's unprepare removes it");
    }
}

#[tokio::test]
async fn a_v1_checkpoint_is_adopted_without_names() {
    let h = Harness::new();
    let device = json!({"gpu": {"info": {"uuid": gpu_uuid(&h, 0)}, "device": kubelet_device(GPU, "gpu-0", "node-a")}, "mig": null});
    write_nvidia(
        &h,
        &json!({"checksum": 9, "v1": {"preparedClaims": {GPU: {"status": {}, "preparedDevices": [
            {"devices": [device], "configState": {"mpsControlDaemonID": ""}}]}}}}),
    );
    let (p, report) = h.open();
    assert_eq!(report.adopted.served, [GPU]);
    let loaded = CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap().load().unwrap();
    let record = &loaded.records[0];
    assert_eq!((record.state, record.namespace.as_str()), (PrepareState::PrepareCompleted, ""));
    assert_eq!(record.adopted.as_ref().unwrap().from, "v1");
    assert!(p.prepare(vec![claim_ref(GPU, "gpu")]).await[GPU].is_ok());
}

#[test]
fn a_gpu_that_changed_or_a_mig_device_nvidia_made_is_not_served() {
    let h = Harness::new();
    let inventory = h.inventory.borrow().clone();
    let driver = gpu_dra_driver::names::DriverName::nvidia_default();
    let node_name = super::super::test_support::node();
    let node = super::Node { driver: &driver, node: &node_name, boot_id: "b", inventory: &inventory };
    let device = |kind, device: &str| crate::state::nvidia_checkpoint::NvidiaDevice {
        kind,
        requests: vec!["gpu".into()],
        pool: "node-a".into(),
        device: device.into(),
        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={GPU}-{device}")],
        share_id: None,
    };
    use crate::state::nvidia_checkpoint::{NvidiaClaim, NvidiaDeviceKind, NvidiaGroup};
    let claim = |d| NvidiaClaim {
        uid: GPU.into(),
        namespace: "default".into(),
        name: "c".into(),
        completed: true,
        groups: vec![NvidiaGroup { mps_daemon: None, devices: vec![d] }],
        admin_access: vec![],
    };
    let why = |d| super::decide(&claim(d), "v2", &node).unwrap().1.adopted.unwrap().not_served.unwrap_or_default();
    assert!(
        why(device(NvidiaDeviceKind::Gpu { uuid: "GPU-other".into() }, "gpu-0"))
            .contains("but NVIDIA's checkpoint prepared it as GPU-other")
    );
    assert!(
        why(device(NvidiaDeviceKind::Mig { uuid: "MIG-x".into() }, "gpu-1-mig-2g20gb-14-0"))
            .contains("made by NVIDIA's driver (DynamicMIG)")
    );
    assert!(why(device(NvidiaDeviceKind::Vfio, "gpu-vfio-0")).contains("stays bound to vfio-pci"));
    assert!(
        why(device(NvidiaDeviceKind::Gpu { uuid: "GPU-x".into() }, "gpu-9")).contains("not published by this node")
    );
    let mut shared = device(NvidiaDeviceKind::Gpu { uuid: "GPU-x".into() }, "gpu-0");
    shared.share_id = Some("../x".into());
    assert!(matches!(super::decide(&claim(shared), "v2", &node), Err(super::Refusal::ShareId { .. })));
    let mut bad_request = device(NvidiaDeviceKind::Gpu { uuid: "GPU-x".into() }, "gpu-0");
    bad_request.requests = vec!["Gpu\n".into()];
    assert!(matches!(super::decide(&claim(bad_request), "v2", &node), Err(super::Refusal::Request { .. })));
}

#[tokio::test]
async fn claims_of_nvidias_releases_before_v25_12_keep_their_base_spec_ids() {
    let h = Harness::new();
    let device = |ids: Value| {
        json!({"gpu": {"info": {"uuid": gpu_uuid(&h, 0)}, "device":
            {"Requests": ["gpu"], "PoolName": "node-a", "DeviceName": "gpu-0", "CDIDeviceIDs": ids}}, "mig": null})
    };
    let both = json!(["k8s.gpu.nvidia.com/device=gpu-0", format!("k8s.gpu.nvidia.com/claim={GPU}-gpu-0")]);
    let reversed = json!([format!("k8s.gpu.nvidia.com/claim={MIG}-gpu-0"), "k8s.gpu.nvidia.com/device=gpu-0"]);
    write_nvidia(
        &h,
        &json!({"checksum": 9, "v1": {"preparedClaims": {
            GPU: {"status": {}, "preparedDevices": [{"devices": [device(both.clone())], "configState": {"mpsControlDaemonID": ""}}]},
            MIG: {"status": {}, "preparedDevices": [{"devices": [device(reversed)], "configState": {"mpsControlDaemonID": ""}}]}}}}),
    );
    let (p, report) = h.open();
    assert_eq!(report.adopted.served, [GPU]);
    assert!(report.adopted.refused[0].1.contains("before v25.12"), "{:?}", report.adopted.refused);
    assert!(report.rewritten.is_empty(), "no claim spec is made up for a claim of NVIDIA's base spec");
    assert!(h.cdi_files().is_empty());
    let answer = p.prepare(vec![claim_ref(GPU, "gpu")]).await[GPU].clone().unwrap();
    assert_eq!(serde_json::to_value(&answer[0].cdi_device_ids).unwrap(), both);
    assert_eq!(p.unprepare(vec![claim_ref(GPU, "gpu")]).await[GPU], Ok(()));
}
