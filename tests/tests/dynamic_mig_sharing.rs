//! Sharing on dynamic MIG through the real plugin, the mock NVML and the
//! fake MPS programs (`integration_tests::fake_mps`) in the mock's driver
//! root: two H100s, GPU 0 dynamic, GPU 1 cut by an administrator.
//! - MPS (`MigDeviceConfig`) on a dynamic MIG device: the daemon serves
//!   the instance made for the claim, and unprepare stops it before the
//!   instance goes;
//! - time-slicing (`MigDeviceConfig`, no interval, as NVIDIA has it) on a
//!   dynamic MIG device prepares as on the static GPU's MIG device;
//! - time-slicing (`GpuConfig` with an interval) on the whole dynamic GPU:
//!   MIG mode off, the interval set on it, both undone at unprepare.
//!
//! The plugin mounts a tmpfs for an MPS daemon, so these need root (as the
//! plugin does on a node).

use integration_tests::claim_fixtures::{Allocated, opaque_config};
use integration_tests::fake_mps::{self, Cleanup, mps_calls, running_daemons, smi_calls};
use integration_tests::kubelet::KubeletConfig;
use integration_tests::mock_gpu::MockGpuNode;
use integration_tests::node::{DRIVER, NODE, RunningNode};
use kubelet_proto::dra_v1::Claim;
use serde_json::{Value, json};

const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 2\n    mig:\n      - gpus: [0]\n        dynamic: true\n      \
                         - gpus: [1]\n        instances: [3g.40gb, 3g.40gb]\n";
const GATES: &str = "DynamicMIG=true,MPSSupport=true,TimeSlicingSettings=true";

/// The node, its driver root (mock NVML and fake MPS programs), and a
/// guard that kills daemons and detaches mounts a failed test left.
fn node() -> (MockGpuNode, RunningNode, Cleanup) {
    let gpu = MockGpuNode::new(INVENTORY);
    fake_mps::install_programs(&gpu.driver_root());
    let mut options = gpu.plugin_options(GATES);
    options.extra_args.extend(["--mps-ready-timeout-ms".to_string(), "1500".to_string()]);
    let node = RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), options);
    let cleanup = Cleanup(node.dirs.root.path().to_path_buf());
    (gpu, node, cleanup)
}

fn claim(node: &RunningNode, name: &str, device: &str, parameters: Value) -> Claim {
    node.claim(name, &[Allocated::new("gpu", NODE, device)], vec![opaque_config("FromClaim", &[], DRIVER, parameters)])
}

fn mig_config(sharing: Value) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": sharing})
}

fn prepared(node: &RunningNode, claim: &Claim) -> Vec<kubelet_proto::dra_v1::Device> {
    let answers = node.prepare(std::slice::from_ref(claim));
    answers[&claim.uid].clone().unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()))
}

fn gpu0_uuids(gpu: &MockGpuNode) -> Vec<String> {
    gpu.instances()[&0].iter().map(|i| i.uuid.clone()).collect()
}

#[test]
fn mps_serves_the_instance_made_for_the_claim_and_stops_before_it_goes() {
    let (gpu, node, _cleanup) = node();
    let root = gpu.driver_root();
    let claim = claim(
        &node,
        "mps",
        "gpu-0-mig-3g40gb-9-4",
        mig_config(json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}})),
    );
    prepared(&node, &claim);
    let made = gpu0_uuids(&gpu);
    assert_eq!(made.len(), 1, "one instance made: {:?}", gpu.instances());
    let record = node.records().remove(0);
    let daemon = record.mps.clone().expect("an MPS daemon in the record");
    assert_eq!(daemon.visible, made, "the daemon serves the new instance");
    let parent = &gpu.inventory.gpus[0].uuid;
    assert_eq!(smi_calls(&root), [format!("-i {parent} -c EXCLUSIVE_PROCESS")]);
    let starts: Vec<String> = mps_calls(&root).into_iter().filter(|c| c.starts_with("start ")).collect();
    assert_eq!(starts.len(), 1, "{starts:?}");
    assert!(starts[0].starts_with(&format!("start {} ", made[0])), "{starts:?}");
    assert_eq!(running_daemons(node.dirs.root.path()).len(), 1);
    let spec = std::fs::read_to_string(node.spec_path(&claim.uid)).unwrap();
    assert!(spec.contains("CUDA_MPS_PIPE_DIRECTORY") && spec.contains(&made[0]), "{spec}");

    node.unprepare(std::slice::from_ref(&claim));
    assert!(running_daemons(node.dirs.root.path()).is_empty(), "the daemon stopped");
    assert!(mps_calls(&root).iter().any(|c| c.ends_with(" quit")), "{:?}", mps_calls(&root));
    assert!(gpu0_uuids(&gpu).is_empty(), "the instance is gone");
    assert_eq!(smi_calls(&root).last().cloned(), Some(format!("-i {parent} -c DEFAULT")));
    assert!(node.records().is_empty());
}

#[test]
fn time_slicing_on_dynamic_mig_devices_and_on_the_whole_dynamic_gpu() {
    let (gpu, node, _cleanup) = node();
    let root = gpu.driver_root();
    // A MIG device has no interval to set (NVIDIA's MigDeviceSharing): the
    // config prepares on a dynamic one as on the administrator's.
    let dynamic = claim(&node, "ts-dynamic", "gpu-0-mig-1g10gb-19-6", mig_config(json!({"strategy": "TimeSlicing"})));
    let fixed = claim(&node, "ts-static", "gpu-1-mig-3g40gb-9-0", mig_config(json!({"strategy": "TimeSlicing"})));
    for c in [&dynamic, &fixed] {
        assert_eq!(prepared(&node, c).len(), 1);
    }
    assert_eq!(gpu0_uuids(&gpu).len(), 1, "the dynamic device was made");
    let spec = std::fs::read_to_string(node.spec_path(&dynamic.uid)).unwrap();
    assert!(spec.contains(&gpu0_uuids(&gpu)[0]), "{spec}");
    assert!(smi_calls(&root).is_empty(), "no interval for MIG devices: {:?}", smi_calls(&root));
    node.unprepare(&[dynamic.clone(), fixed.clone()]);
    assert!(gpu0_uuids(&gpu).is_empty());
    assert_eq!(gpu.instances()[&1].len(), 2, "the administrator's instances stay");

    // The whole dynamic GPU, time-sliced Long: out of MIG mode, the
    // interval set on it; back in MIG mode and DEFAULT afterwards.
    let whole = claim(
        &node,
        "ts-whole",
        "gpu-0",
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
               "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}),
    );
    prepared(&node, &whole);
    let parent = &gpu.inventory.gpus[0].uuid;
    assert!(!gpu.mig_mode(0), "MIG mode off for the whole GPU");
    assert!(
        smi_calls(&root).contains(&format!("compute-policy -i {parent} --set-timeslice 3")),
        "{:?}",
        smi_calls(&root)
    );
    node.unprepare(std::slice::from_ref(&whole));
    assert!(gpu.mig_mode(0), "MIG mode on again");
    assert_eq!(
        smi_calls(&root).last().cloned(),
        Some(format!("compute-policy -i {parent} --set-timeslice 0")),
        "the default interval again"
    );
    assert!(node.records().is_empty());
}
