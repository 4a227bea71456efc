//! Helpers for the cross-process tests: build the workspace's binaries once
//! and run them as a user would.

pub mod apiserver;
pub mod build;
pub mod claim_fixtures;
pub mod compute_domain_cluster;
pub mod controller_process;
pub mod docs;
pub mod fake_mps;
pub mod fault_proxy;
pub mod first_use;
pub mod go_allocator;
pub mod helm;
pub mod helm_cli;
pub mod https_client;
pub mod image;
pub mod imex_host;
pub mod kubelet;
pub mod mock_gpu;
pub mod mock_nvml;
pub mod mock_nvml_node;
pub mod node;
pub mod nvidia_state;
pub mod pci_core;
pub mod plugin_process;
pub mod ports;
pub mod publisher;
pub mod rbac;
pub mod real_chart;
pub mod real_cluster;
pub mod wait;
pub mod webhook_process;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The workspace root (where `examples/` lives).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The example fake inventories shipped in `examples/inventories/`.
pub fn example_inventories() -> Vec<PathBuf> {
    let dir = workspace_root().join("examples/inventories");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Builds `bin` in the debug profile under test, or in `release_profile`
/// when this crate is optimized (benchmarks), so that benchmarks measure
/// the binary as shipped.
fn build(package: &str, bin: &str, release_profile: &str) -> PathBuf {
    let profile = if cfg!(debug_assertions) { None } else { Some(release_profile) };
    build::cargo_build(build::Artifact::Bin { package, bin }, profile)
}

/// Path of `gpu-kubelet-plugin`, built on first use.
pub fn kubelet_plugin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("gpu-kubelet-plugin", "gpu-kubelet-plugin", "node"))
}

/// Path of `gpu-dra-controller`, built on first use.
pub fn controller() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("gpu-dra-controller", "gpu-dra-controller", "release"))
}

/// Path of `kubectl-gpu` (the kubectl plugin), built on first use.
pub fn kubectl_gpu() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("kubectl-gpu", "kubectl-gpu", "release"))
}

/// Runs `bin` with `args`, feeding `stdin`; the environment is cleared of the
/// plugin's own variables so tests see only their flags.
pub fn run(bin: &Path, args: &[&str], stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env_remove("NODE_NAME")
        .env_remove("DRIVER_NAME")
        .env_remove("FAKE_INVENTORY")
        .env_remove("CDI_DIR")
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(input).expect("writing stdin");
    }
    child.wait_with_output().expect("waiting for the child")
}

/// `gpu-dra-controller simulate` of the shipped DeviceClasses and `claims`
/// on `fleet` (both relative to the workspace root), printed as `format`.
pub fn simulate_shipped(claims: &str, fleet: &str, format: &str) -> Output {
    let root = workspace_root();
    let (classes, claims, fleet) = (root.join("deviceclasses"), root.join(claims), root.join(fleet));
    let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_owned();
    let (classes, claims, fleet) = (path(&classes), path(&claims), path(&fleet));
    run(controller(), &["simulate", "-f", &classes, "-f", &claims, "--fleet", &fleet, "-o", format], None)
}

/// Standard output as text, asserting success.
pub fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

/// Runs `bin` with `args` as [`run`] does, but kills it and panics if it
/// is still running after `watchdog`: a bound only a hang reaches, so that
/// a test of a command that must not hang fails instead of hanging.
pub fn run_or_kill(bin: &Path, args: &[&str], watchdog: std::time::Duration) -> Output {
    use std::io::{Read, Seek};
    let out = tempfile::tempfile().expect("a temporary file for stdout");
    let err = tempfile::tempfile().expect("a temporary file for stderr");
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("stdout"))
        .stderr(err.try_clone().expect("stderr"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()));
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait().expect("waiting for the child");
        let _ = done.send(());
        status
    });
    let hung = finished.recv_timeout(watchdog).is_err();
    if hung {
        // SAFETY: plain syscall. The child is not reaped until `waiter`'s
        // wait returns, so the pid is still the child's.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let status = waiter.join().expect("the waiting thread");
    let read = |mut f: std::fs::File| {
        let mut bytes = Vec::new();
        f.rewind().expect("rewinding an output file");
        f.read_to_end(&mut bytes).expect("reading an output file");
        bytes
    };
    let output = Output { status, stdout: read(out), stderr: read(err) };
    assert!(
        !hung,
        "{} {args:?} still ran after {watchdog:?} (killed)\nstderr: {}",
        bin.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}
