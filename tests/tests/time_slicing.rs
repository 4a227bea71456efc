//! Time-slicing through the real plugin binary: with `TimeSlicingSettings`
//! on, a claim's `GpuConfig` time-slice is set at prepare with the driver
//! root's `nvidia-smi` (here a small program that records every invocation
//! and answers like the real one) and reset at unprepare; a plugin killed
//! while `nvidia-smi` runs is undone at its next start.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_dra_driver::driver_root::fake_tree;
use integration_tests::claim_fixtures::{Allocated, opaque_config};
use integration_tests::kubelet::KubeletConfig;
use integration_tests::node::{DRIVER, NODE, RunningNode};
use integration_tests::plugin_process::{PluginOptions, PluginProcess};
use integration_tests::wait;

const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 2\n";

/// A fake driver installation whose `nvidia-smi` logs its arguments to
/// `<root>/nvidia-smi.log` (and its `LD_LIBRARY_PATH` to
/// `<root>/nvidia-smi.env`) and, while `<root>/nvidia-smi.hang` exists,
/// hangs in `compute-policy`.
fn driver_root(dir: &Path) -> PathBuf {
    let root = dir.join("driver-root");
    fake_tree::build(&root, "580.82.07", &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")])
        .unwrap();
    let smi = root.join("usr/bin/nvidia-smi");
    std::fs::write(
        &smi,
        r#"#!/bin/sh
root="$(dirname "$0")/../.."
echo "$*" >> "$root/nvidia-smi.log"
echo "$LD_LIBRARY_PATH" > "$root/nvidia-smi.env"
case "$1" in
  compute-policy)
    while [ -e "$root/nvidia-smi.hang" ]; do sleep 0.1; done
    echo "Successfully set the timeslice for GPU $3 to $5.";;
  -i)
    echo "Compute mode is already set to DEFAULT for GPU $2."
    echo "All done.";;
  *) echo "unexpected arguments: $*" >&2; exit 2;;
esac
"#,
    )
    .unwrap();
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    root
}

fn smi_calls(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("nvidia-smi.log")).unwrap_or_default().lines().map(str::to_owned).collect()
}

fn node(dir: &Path) -> (RunningNode, PathBuf) {
    let root = driver_root(dir);
    (RunningNode::start(INVENTORY, KubeletConfig::new("", DRIVER), options(&root)), root)
}

/// The plugin on the fake driver root `root` (its nvidia-smi logs calls),
/// time-slicing allowed.
fn options(root: &Path) -> PluginOptions {
    PluginOptions {
        extra_args: vec![
            "--driver-root".into(),
            root.to_string_lossy().into_owned(),
            "--feature-gates".into(),
            "TimeSlicingSettings=true".into(),
        ],
        ..PluginOptions::default()
    }
}

fn time_sliced(interval: &str) -> Vec<k8s_openapi::api::resource::v1::DeviceAllocationConfiguration> {
    vec![opaque_config(
        "FromClaim",
        &[],
        DRIVER,
        serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                           "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}),
    )]
}

fn gpu0_uuid(node: &RunningNode) -> String {
    let records = node.records();
    records[0].devices[0].time_slice.as_ref().map(|t| t.gpu_uuid.clone()).expect("a recorded time-slice")
}

#[test]
fn time_slice_set_at_prepare_and_reset_at_unprepare() {
    let dir = tempfile::tempdir().unwrap();
    let (node, root) = node(dir.path());
    let claim = node.claim("ts", &[Allocated::new("gpu", NODE, "gpu-0")], time_sliced("Long"));
    let answers = node.prepare(std::slice::from_ref(&claim));
    assert!(answers.values().all(Result::is_ok), "{answers:?}\n{}", node.process.log());
    let uuid = gpu0_uuid(&node);
    assert_eq!(
        smi_calls(&root),
        [format!("-i {uuid} -c DEFAULT"), format!("compute-policy -i {uuid} --set-timeslice 3")]
    );
    // It finds libnvidia-ml in the driver root, not in the plugin's image.
    let library_path = std::fs::read_to_string(root.join("nvidia-smi.env")).unwrap();
    assert!(Path::new(library_path.trim()).join("libnvidia-ml.so.1").exists(), "LD_LIBRARY_PATH={library_path}");
    assert!(library_path.trim().starts_with(root.to_str().unwrap()), "LD_LIBRARY_PATH={library_path}");
    node.unprepare(std::slice::from_ref(&claim));
    assert_eq!(
        smi_calls(&root)[2..],
        [format!("-i {uuid} -c DEFAULT"), format!("compute-policy -i {uuid} --set-timeslice 0")]
    );
    // An unknown interval is a per-claim error naming the field.
    let bad = node.claim("bad", &[Allocated::new("gpu", NODE, "gpu-1")], time_sliced("Forever"));
    let answers = node.prepare(std::slice::from_ref(&bad));
    let error = answers.values().next().unwrap().clone().unwrap_err();
    assert!(error.contains("sharing.timeSlicingConfig.interval"), "{error}");
}

#[test]
fn a_plugin_killed_while_setting_the_time_slice_undoes_it_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (mut node, root) = node(dir.path());
    let claim = node.claim("ts", &[Allocated::new("gpu", NODE, "gpu-0")], time_sliced("Short"));
    std::fs::write(root.join("nvidia-smi.hang"), b"").unwrap();
    let pid = node.process.pid();
    std::thread::scope(|scope| {
        // The call fails when the plugin dies: that is the point.
        let prepare =
            scope.spawn(|| node.runtime.block_on(node.kubelet.prepare_raw(&node.plugin, std::slice::from_ref(&claim))));
        let ran = || smi_calls(&root).iter().any(|c| c.starts_with("compute-policy"));
        wait::wait_until("nvidia-smi to run", Duration::from_secs(60), ran, || node.process.log());
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
        assert!(prepare.join().unwrap().is_err(), "the call did not see the plugin die");
    });
    std::fs::remove_file(root.join("nvidia-smi.hang")).unwrap();
    let interrupted = node.records();
    assert_eq!(interrupted.len(), 1, "the intent was recorded before nvidia-smi ran");
    let uuid = gpu0_uuid(&node);
    let before = smi_calls(&root).len();
    node.process = PluginProcess::spawn(&node.dirs, &options(&root)).unwrap();
    node.plugin = node
        .runtime
        .block_on(node.kubelet.wait_and_register(Duration::from_secs(60)))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()));
    assert!(node.records().is_empty(), "the interrupted prepare was rolled back");
    assert_eq!(
        smi_calls(&root)[before..],
        [format!("-i {uuid} -c DEFAULT"), format!("compute-policy -i {uuid} --set-timeslice 0")],
        "and the GPU reset"
    );
    // The kubelet's retry prepares afresh.
    let answers = node.prepare(std::slice::from_ref(&claim));
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
}
