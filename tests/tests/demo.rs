//! The README's first command, `cargo run -p integration-tests --example
//! demo`, run as a user would: it must finish, allocate through the
//! controller, explain the claim that cannot fit, prepare on both nodes and
//! clean up.

use std::process::Command;

use integration_tests::build::{Artifact, cargo_build};

#[test]
fn the_whole_system_demo_runs_end_to_end() {
    let demo = cargo_build(Artifact::Example { package: "integration-tests", example: "demo" }, None);
    let output = Command::new(demo).output().expect("running the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    for expected in [
        "notebook-gpu         pod notebook   -> dgx-h100-a: ",
        "trainer-gpus         pod trainer    -> dgx-h100-a: ",
        "tiny-llm-mig         pod tiny-llm   -> hgx-a100-mig: gpu-0-mig-1g",
        "big-model-gpus       pod big-model  -> not allocated: claim default/big-model-gpus cannot be allocated",
        "-> CDI k8s.gpu.nvidia.com/claim=",
        "libraries: libcuda.so.580.82.07",
        "every claim deallocated and gone",
        "removed every file",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
}

/// `demo -- --help` prints its usage and exits 0; an unknown argument
/// fails with the usage.
#[test]
fn the_demo_prints_its_usage() {
    let demo = cargo_build(Artifact::Example { package: "integration-tests", example: "demo" }, None);
    let help = Command::new(&demo).arg("--help").output().expect("running the demo");
    let stdout = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&help.stderr));
    assert!(stdout.starts_with("usage: cargo run -p integration-tests --example demo"), "{stdout}");
    assert!(stdout.contains("--real-cluster [1.34|1.37]"), "{stdout}");
    let wrong = Command::new(&demo).arg("--no-such-flag").output().expect("running the demo");
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success() && stderr.contains("--no-such-flag") && stderr.contains("usage:"), "{stderr}");
}

/// `demo -- --real-cluster 1.37`, as the README shows it: the real
/// controller manager makes the claims, the real scheduler binds the pods
/// with devices from our slices, the controller explains the one that
/// cannot fit, the nodes prepare, and everything is removed.
#[test]
fn the_demo_runs_against_the_real_control_plane() {
    // The demo never builds the control plane itself; the tests do.
    integration_tests::real_cluster::binaries("1.37");
    let demo = cargo_build(Artifact::Example { package: "integration-tests", example: "demo" }, None);
    let output = Command::new(demo).args(["--real-cluster", "1.37"]).output().expect("running the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    for expected in [
        "Kubernetes 1.37: etcd, kube-apiserver, kube-controller-manager, kube-scheduler",
        "pod notebook   bound to dgx-h100-a; claim notebook-gpu-",
        "pod tiny-llm   bound to hgx-a100-mig; claim tiny-llm-mig-",
        "pod big-model  unschedulable; claim big-model-gpus-",
        "cannot be allocated on any of 2 nodes (closest: dgx-h100-a)",
        "-> CDI k8s.gpu.nvidia.com/claim=",
        "every claim deallocated and gone",
        "removed every file",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
}
