//! A claim for a whole dynamic H100 (MIG mode switchable without a reset)
//! through the real plugin and the mock NVML, with the ResourceSlices the
//! plugin publishes to the API-server stand-in read after every step:
//! - prepare turns MIG mode off and the node then publishes the GPU whole
//!   (no MIG devices, no counter set); unprepare turns it on and the MIG
//!   devices and counters come back, twice in one process;
//! - a restart while the claim holds the GPU publishes it whole, and the
//!   unprepare after the restart brings the MIG devices back;
//! - a SIGKILL right after the switch in prepare (rolled back at start-up)
//!   and in unprepare (the prepared claim gets its GPU out of MIG mode
//!   again): no claim lost, the retry succeeds, the slices say the truth.

use gpu_kubelet_plugin::state::checkpoint::PrepareState;
use integration_tests::kubelet::KubeletConfig;
use integration_tests::mock_gpu::MockGpuNode;
use integration_tests::node::{DRIVER, NODE, RunningNode, WAIT};
use integration_tests::wait;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kubelet_proto::dra_v1::Claim;

const INVENTORY: &str =
    "gpus:\n  - model: H100-80GB\n    count: 2\n    mig:\n      - gpus: [0]\n        dynamic: true\n";

/// What the node publishes for GPU 0.
#[derive(Debug, PartialEq, Eq)]
enum Gpu0 {
    /// `gpu-0` and its MIG devices, sharing `gpu-0-counter-set`.
    Dynamic,
    /// `gpu-0` alone, no counters.
    Whole,
}

/// GPU 0 as the stored slices show it; `None` while they are neither.
fn published(node: &RunningNode) -> Option<Gpu0> {
    let slices: Vec<ResourceSlice> =
        node.server.list(None, &format!("spec.nodeName={NODE},spec.driver={DRIVER}")).ok()?;
    let devices: Vec<&str> =
        slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.as_str()).collect();
    let counter_sets: Vec<&str> =
        slices.iter().flat_map(|s| s.spec.shared_counters.iter().flatten()).map(|c| c.name.as_str()).collect();
    let migs = devices.iter().filter(|d| d.starts_with("gpu-0-mig-")).count();
    if !devices.contains(&"gpu-0") || !devices.contains(&"gpu-1") {
        return None;
    }
    // An H100 publishes 25 MIG devices (every profile and placement).
    match (migs, counter_sets.contains(&"gpu-0-counter-set")) {
        (25, true) => Some(Gpu0::Dynamic),
        (0, false) => Some(Gpu0::Whole),
        _ => None,
    }
}

/// Waits until the slices show `want` (a hang guard, not a timing assertion).
fn eventually_published(node: &RunningNode, want: Gpu0, step: &str) {
    let shown = || format!("slices showing {:?}, not {want:?}\n{}", published(node), node.process.log());
    wait::wait_until(&format!("{step}: {want:?}"), WAIT, || published(node).as_ref() == Some(&want), shown);
}

/// The GPU's mode, the records and the slices agree that the claim holds
/// GPU 0 whole (`true`) or that nothing does.
fn check(gpu: &MockGpuNode, node: &RunningNode, held: bool, step: &str) {
    assert_eq!(gpu.mig_mode(0), !held, "{step}: MIG mode of GPU 0\n{}", node.process.log());
    let records = node.records();
    if held {
        assert_eq!(records.len(), 1, "{step}: {records:?}");
        assert_eq!(records[0].state, PrepareState::PrepareCompleted, "{step}");
        assert!(records[0].devices[0].mig_mode_off.is_some(), "{step}: {records:?}");
    } else {
        assert!(records.is_empty(), "{step}: {records:?}");
    }
    assert!(gpu.instances()[&0].is_empty(), "{step}: no MIG instance on GPU 0");
    eventually_published(node, if held { Gpu0::Whole } else { Gpu0::Dynamic }, step);
}

fn prepared(node: &RunningNode, claim: &Claim, step: &str) {
    let answers = node.prepare(std::slice::from_ref(claim));
    let devices = answers[&claim.uid].clone().unwrap_or_else(|e| panic!("{step}: {e}\n{}", node.process.log()));
    assert_eq!(devices.len(), 1, "{step}");
}

#[test]
fn the_slices_follow_the_mig_mode_a_whole_gpu_claim_switches() {
    let gpu = MockGpuNode::new(INVENTORY);
    let options = gpu.plugin_options("DynamicMIG=true");
    let mut node = RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), options.clone());
    let claim = node.gpu_claim("whole", &["gpu-0"]);
    check(&gpu, &node, false, "start");

    for round in ["first", "second"] {
        prepared(&node, &claim, round);
        check(&gpu, &node, true, &format!("{round} prepare"));
        node.unprepare(std::slice::from_ref(&claim));
        check(&gpu, &node, false, &format!("{round} unprepare"));
    }

    // A restart while the claim holds the GPU: the new process publishes
    // what it finds, and follows the unprepare.
    prepared(&node, &claim, "before the restart");
    node.restart();
    check(&gpu, &node, true, "after the restart");
    prepared(&node, &claim, "repeat after the restart");
    node.unprepare(std::slice::from_ref(&claim));
    check(&gpu, &node, false, "unprepare after the restart");

    // Killed right after turning MIG mode off: start-up rolls back.
    node.killed_during(&options, "after-mig-mode", |node| node.prepare_answered(&claim));
    check(&gpu, &node, false, "prepare killed after the switch");
    prepared(&node, &claim, "retry");
    check(&gpu, &node, true, "retry");

    // Killed right after turning MIG mode on again: the claim is still
    // prepared, so start-up gives it its GPU back; the retry unprepares.
    node.killed_during(&options, "after-mig-mode", |node| node.unprepare_answered(&claim));
    check(&gpu, &node, true, "unprepare killed after the switch");
    node.unprepare(std::slice::from_ref(&claim));
    check(&gpu, &node, false, "unprepare retried");
    assert!(!node.spec_path(&claim.uid).exists());
}
