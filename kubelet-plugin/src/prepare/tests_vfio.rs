//! VFIO passthrough through the preparer, on the fake kernel
//! ([`crate::vfio::fake_kernel`]): `gpu-0` (0000:18:00.0, group 32 with
//! its audio function 0000:18:00.1) and `gpu-2` (0000:38:00.0, group 34).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::test_support::{Harness, allocated, claim_ref};
use crate::state::checkpoint::{CheckpointDir, PrepareState};
use crate::vfio::VfioHost;
use crate::vfio::fake_kernel::FakeKernel;
use crate::vfio::switch::Timing;
use gpu_dra_driver::names::ClaimUid;

const A: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const B: &str = "1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const FAST: Timing = Timing { timeout: Duration::from_millis(200), poll: Duration::from_millis(5) };

fn drivers(list: &[&str]) -> Vec<(String, Option<String>)> {
    ["0000:18:00.0", "0000:18:00.1", "0000:28:00.0", "0000:38:00.0"]
        .iter()
        .zip(list)
        .map(|(id, d)| (id.to_string(), Some(d.to_string())))
        .collect()
}

fn original() -> Vec<(String, Option<String>)> {
    drivers(&["nvidia", "snd_hda_intel", "nvidia", "nvidia"])
}

fn gpu0_passed() -> Vec<(String, Option<String>)> {
    drivers(&["vfio-pci", "vfio-pci", "nvidia", "nvidia"])
}

fn harness() -> (Harness, Arc<FakeKernel>) {
    let mut h = Harness::new();
    let kernel = Arc::new(FakeKernel::new(
        &h.dir.path().join("host"),
        &[
            ("0000:18:00.0", 32, "nvidia"),
            ("0000:18:00.1", 32, "snd_hda_intel"),
            ("0000:28:00.0", 33, "nvidia"),
            ("0000:38:00.0", 34, "nvidia"),
        ],
    ));
    let proc_root = h.dir.path().join("proc");
    std::fs::create_dir_all(&proc_root).unwrap();
    let holders = Arc::new(crate::vfio::holders::ProcHolders { proc_root });
    h.vfio = Some(VfioHost { binding: kernel.clone(), holders, timing: FAST });
    (h, kernel)
}

fn checkpoint(h: &Harness) -> CheckpointDir {
    CheckpointDir::open(h.dir.path().join("state/checkpoint")).unwrap()
}

#[tokio::test]
async fn a_passed_through_gpu_goes_to_vfio_pci_with_its_group_and_comes_back_at_unprepare() {
    let (h, kernel) = harness();
    h.source.put(allocated(A, "a", &["gpu-vfio-0"]));
    let (p, _) = h.open();
    let devices = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
    assert_eq!(devices[0].cdi_device_ids, [format!("k8s.gpu.nvidia.com/claim={A}-gpu-vfio-0")]);
    assert_eq!(kernel.drivers(), gpu0_passed());
    let spec =
        std::fs::read_to_string(h.dir.path().join("cdi").join(format!("k8s.gpu.nvidia.com-claim_{A}.json"))).unwrap();
    assert!(spec.contains("/dev/vfio/32") && spec.contains("/dev/vfio/vfio"), "{spec}");
    let record = &checkpoint(&h).load().unwrap().records[0];
    assert_eq!(record.state, PrepareState::PrepareCompleted);
    let switch = record.devices[0].vfio.as_ref().expect("the switch is recorded");
    assert_eq!((switch.pci_bus_id.as_str(), switch.iommu_group, switch.members.len()), ("0000:18:00.0", 32, 2));
    assert_eq!(switch.members[1].original_driver.as_deref(), Some("snd_hda_intel"));

    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
    assert_eq!(kernel.drivers(), original());
    assert!(h.cdi_files().is_empty() && h.checkpoint_files().is_empty());
}

#[tokio::test]
async fn a_group_that_never_reaches_vfio_pci_is_given_back_and_leaves_nothing() {
    let (h, kernel) = harness();
    kernel.vfio_binds.store(false, Ordering::SeqCst);
    h.source.put(allocated(A, "a", &["gpu-vfio-0"]));
    let (p, _) = h.open();
    let err = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err().to_string();
    assert!(err.contains("was not bound to vfio-pci"), "{err}");
    assert_eq!(kernel.drivers(), original());
    assert!(h.cdi_files().is_empty() && h.checkpoint_files().is_empty());
}

/// The shared counter keeps the scheduler from giving one GPU under both
/// names, but the kubelet may prepare a new claim before it unprepared the
/// old one: the checkpoint decides, before anything is written.
#[tokio::test]
async fn a_gpu_held_under_its_other_name_is_never_unbound() {
    for (held, wanted) in [("gpu-0", "gpu-vfio-0"), ("gpu-vfio-0", "gpu-0")] {
        let (h, kernel) = harness();
        h.source.put(allocated(A, "a", &[held]));
        h.source.put(allocated(B, "b", &[wanted]));
        let (p, _) = h.open();
        p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
        let before = kernel.drivers();
        let err = p.prepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap_err().to_string();
        assert!(err.contains("are the same GPU, one of them passed through"), "{held}: {err}");
        assert!(err.contains("ResourceClaim default/a"), "{err}");
        assert_eq!(kernel.drivers(), before, "{held}: the refusal touched nothing");
        assert_eq!(h.checkpoint_files(), [format!("{A}.json")]);
        p.unprepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
        assert!(p.prepare(vec![claim_ref(B, "b")]).await[B].is_ok(), "{held}: free once unprepared");
    }
}

#[tokio::test]
async fn start_up_gives_an_interrupted_passthrough_back_and_keeps_a_completed_one() {
    let (h, kernel) = harness();
    h.source.put(allocated(A, "a", &["gpu-vfio-0"]));
    h.source.put(allocated(B, "b", &["gpu-vfio-2"]));
    {
        let (p, _) = h.open();
        p.prepare(vec![claim_ref(A, "a"), claim_ref(B, "b")]).await[A].clone().unwrap();
    }
    assert_eq!(kernel.drivers(), drivers(&["vfio-pci", "vfio-pci", "nvidia", "vfio-pci"]));
    // A's prepare is made to look killed after its bind: `PrepareStarted`.
    let dir = checkpoint(&h);
    let mut started = dir.load().unwrap().records.into_iter().find(|r| r.uid == A).unwrap();
    started.state = PrepareState::PrepareStarted;
    dir.write(&ClaimUid::new(A).unwrap(), &started).unwrap();
    let (p, report) = h.open();
    assert_eq!(report.rolled_back, [A]);
    assert_eq!(report.kept, 1);
    assert_eq!(kernel.drivers(), drivers(&["nvidia", "snd_hda_intel", "nvidia", "vfio-pci"]));
    p.unprepare(vec![claim_ref(B, "b")]).await[B].clone().unwrap();
    assert_eq!(kernel.drivers(), original());
}

/// A record (a valid checksum) whose switch names a device outside the
/// GPU's group, or a group that is not the GPU's, is set aside at
/// start-up: nothing it names is written, then or at its unprepare.
#[tokio::test]
async fn a_forged_switch_is_set_aside_and_nothing_it_names_is_touched() {
    for forge in ["stranger", "group"] {
        let (h, kernel) = harness();
        h.source.put(allocated(A, "a", &["gpu-vfio-0"]));
        // A prepared claim's record, re-written as an interrupted prepare
        // that (says it) switched gpu-2, or another group.
        let mut record = {
            let (p, _) = h.open();
            p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap();
            checkpoint(&h).load().unwrap().records.remove(0)
        };
        let switch = record.devices[0].vfio.as_mut().unwrap();
        match forge {
            "stranger" => switch.members[1].pci_bus_id = "0000:38:00.0".into(),
            _ => switch.iommu_group = 34,
        }
        record.state = PrepareState::PrepareStarted;
        checkpoint(&h).write(&ClaimUid::new(A).unwrap(), &record).unwrap();
        let (p, report) = h.open();
        assert_eq!(report.damaged.len(), 1, "{forge}");
        assert!(report.rolled_back.is_empty());
        assert_eq!(kernel.drivers(), gpu0_passed(), "{forge}: start-up touched nothing");
        assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
        assert_eq!(kernel.drivers(), gpu0_passed(), "{forge}: the unprepare touched nothing");
    }
}

#[tokio::test]
async fn a_gpu_a_process_holds_open_is_not_passed_through_and_nothing_changes() {
    let (h, kernel) = harness();
    h.source.put(allocated(A, "a", &["gpu-vfio-0"]));
    let fd_dir = h.dir.path().join("proc/4242/fd");
    std::fs::create_dir_all(&fd_dir).unwrap();
    std::os::unix::fs::symlink("/dev/nvidia0", fd_dir.join("5")).unwrap();
    let before = kernel.drivers();
    let (p, _) = h.open();
    let error = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err().to_string();
    assert!(error.contains("GPU gpu-0 (/dev/nvidia0) is still open in process(es) [4242]"), "{error}");
    assert_eq!(kernel.drivers(), before, "no sysfs write");
    assert!(h.checkpoint_files().is_empty() && h.cdi_files().is_empty());
    std::fs::remove_file(fd_dir.join("5")).unwrap();
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok(), "the retry once the process let go");
    assert_eq!(kernel.drivers(), gpu0_passed());
}
