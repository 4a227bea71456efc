//! VFIO passthrough through the real plugin process, the mock NVML and a
//! PCI core emulating the kernel's driver binding on the node's fake
//! `/sys` ([`integration_tests::pci_core`]): two H100s, GPU 0's IOMMU group
//! holding its audio function too.
//! - a claim for `gpu-vfio-0` binds the group to `vfio-pci` and its
//!   unprepare gives it back (kubelet stand-in, gRPC);
//! - a SIGKILL at every step of the switch during a prepare, then a
//!   restart: every device is bound to exactly one driver, its own, no
//!   record is left, and the kubelet's retry passes the GPU through;
//! - a SIGKILL while an unprepare gives the group back: the claim is whole
//!   again after the restart (same CDI ids), and the retried unprepare
//!   gives everything back.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_kubelet_plugin::state::checkpoint::PrepareState;
use integration_tests::kubelet::KubeletConfig;
use integration_tests::mock_gpu::MockGpuNode;
use integration_tests::node::{DRIVER, RunningNode};
use integration_tests::pci_core::PciCore;
use integration_tests::plugin_process::PluginOptions;
use integration_tests::wait;
use kubelet_proto::dra_v1::Claim;

const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 2\n";
const GATES: &str = "PassthroughSupport=true";

struct Host {
    gpu: MockGpuNode,
    core: PciCore,
    options: PluginOptions,
    group: u32,
}

fn host() -> Host {
    let gpu = MockGpuNode::new(INVENTORY);
    let gpu0 = &gpu.inventory.gpus[0];
    let audio = gpu0.pci_bus_id.expect("bus id");
    let audio = format!("{:04x}:{:02x}:{:02x}.1", audio.domain, audio.bus, audio.device);
    let root = gpu0.pcie_root.clone().expect("root");
    let group = gpu0.iommu_group.expect("group");
    let dev = gpu.dir.path().join("host");
    let core = PciCore::start(&gpu.dir.path().join("sys"), &dev, &[(&audio, &root, group, "snd_hda_intel")]);
    let mut options = gpu.plugin_options(GATES);
    options.extra_args.extend(["--dev-root".to_string(), dev.display().to_string()]);
    Host { gpu, core, options, group }
}

fn start(host: &Host) -> RunningNode {
    RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), host.options.clone())
}

fn passed_through(host: &Host) -> bool {
    let drivers = host.core.drivers();
    let gpu1 = host.gpu.inventory.gpus[1].pci_bus_id.expect("bus id").to_string();
    drivers.iter().all(|(bdf, d)| d.as_deref() == Some(if *bdf == gpu1 { "nvidia" } else { "vfio-pci" }))
        && host.core.group_node_exists(host.group)
}

/// Waits (the emulator answers just after each write) until `done`.
fn settles(what: &str, done: impl Fn() -> bool, log: impl Fn() -> String) {
    wait::wait_until(what, Duration::from_secs(10), done, log);
}

fn ids(node: &RunningNode, claim: &Claim) -> Vec<Vec<String>> {
    let answer = node.prepare(std::slice::from_ref(claim)).remove(&claim.uid).expect("answer");
    let devices = answer.unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()));
    devices.into_iter().map(|d| d.cdi_device_ids).collect()
}

#[test]
fn a_gpu_is_passed_through_with_its_group_and_given_back_at_unprepare() {
    let host = host();
    let node = start(&host);
    let claim = node.gpu_claim("vm", &["gpu-vfio-0"]);
    assert_eq!(ids(&node, &claim), [[format!("k8s.{DRIVER}/claim={}-gpu-vfio-0", claim.uid)]]);
    assert!(passed_through(&host), "{:?}\n{}", host.core.drivers(), node.process.log());
    let spec = std::fs::read_to_string(node.spec_path(&claim.uid)).expect("spec");
    assert!(spec.contains(&format!("/dev/vfio/{}\"", host.group)) && spec.contains("/dev/vfio/vfio"), "{spec}");
    assert!(!spec.contains("/dev/nvidia0"), "nothing of the nvidia driver: {spec}");
    // The other name of the same GPU is refused while it is passed through.
    let other = node.gpu_claim("container", &["gpu-0"]);
    let refused = node.prepare(std::slice::from_ref(&other)).remove(&other.uid).expect("answer");
    assert!(refused.as_ref().is_err_and(|e| e.contains("same GPU")), "{refused:?}");

    node.unprepare(std::slice::from_ref(&claim));
    settles("given back", || host.core.is_original(), || node.process.log());
    assert!(node.records().is_empty());
    assert!(!node.spec_path(&claim.uid).exists());
}

#[test]
fn sigkill_at_every_step_of_the_switch_leaves_every_device_on_one_driver() {
    let host = host();
    let mut node = start(&host);
    let claim = node.gpu_claim("vm", &["gpu-vfio-0"]);
    let mut summary = BTreeMap::new();
    for step in [
        "vfio-recorded",
        "vfio-override",
        "vfio-override:2",
        "vfio-unbound",
        "vfio-unbound:2",
        "vfio-probed",
        "vfio-probed:2",
        "vfio-bound",
    ] {
        node.killed_during(&host.options, step, |node| node.prepare_answered(&claim));
        // Start-up gave the interrupted prepare's group back.
        settles(
            &format!("{step}: given back {:?}", host.core.drivers()),
            || host.core.is_original(),
            || node.process.log(),
        );
        assert!(node.records().is_empty(), "{step}: {:?}", node.records());
        // The kubelet's retry passes the GPU through.
        ids(&node, &claim);
        assert!(passed_through(&host), "{step}: {:?}", host.core.drivers());
        node.unprepare(std::slice::from_ref(&claim));
        settles(&format!("{step}: unprepared"), || host.core.is_original(), || node.process.log());
        summary.insert(step, "given back, retried");
    }
    for step in ["vfio-released", "vfio-released:2", "after-spec-removed"] {
        let first = ids(&node, &claim);
        node.killed_during(&host.options, step, |node| node.unprepare_answered(&claim));
        // The record still says prepared: start-up made the claim whole.
        settles(
            &format!("{step}: whole again {:?}", host.core.drivers()),
            || passed_through(&host),
            || node.process.log(),
        );
        let records = node.records();
        assert_eq!(records.len(), 1, "{step}");
        assert_eq!(records[0].state, PrepareState::PrepareCompleted, "{step}");
        assert_eq!(ids(&node, &claim), first, "{step}: the same CDI ids");
        node.unprepare(std::slice::from_ref(&claim));
        settles(&format!("{step}: unprepared"), || host.core.is_original(), || node.process.log());
        summary.insert(step, "whole again, unprepared");
    }
    assert!(node.records().is_empty());
    eprintln!("kill points: {summary:?}");
}
