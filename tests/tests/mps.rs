//! MPS through the real plugin binary, with a fake driver root whose
//! `nvidia-cuda-mps-control` and `nvidia-smi` record every invocation (see
//! `integration_tests::fake_mps`): a claim's daemon is started with its
//! limits, answers, is reachable from the container (CDI env and mounts)
//! and is torn down; a plugin killed at any step of prepare leaves no
//! daemon, mount or limit behind after its restart, while a prepared
//! claim's daemon outlives the restart (or is started again); two shares
//! of one GPU each get their own daemon and memory limit.
//!
//! The plugin mounts a real tmpfs, so these tests need root (as the plugin
//! does on a node).

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_kubelet_plugin::state::checkpoint::MpsDaemon;
use integration_tests::claim_fixtures::{Allocated, opaque_config};
use integration_tests::fake_mps::{self, Cleanup, mounts_under, mps_calls, running_daemons, smi_calls};
use integration_tests::kubelet::KubeletConfig;
use integration_tests::node::{DRIVER, NODE, RunningNode, WAIT};
use integration_tests::plugin_process::{PluginOptions, PluginProcess};
use integration_tests::wait;
use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use kubelet_proto::dra_v1::Claim;

/// Two whole H100s and a third split into one MIG device.
const INVENTORY: &str =
    "gpus:\n  - model: H100-80GB\n    count: 3\n    mig:\n      - gpus: [2]\n        instances: [1g.10gb]\n";
const MIG: &str = "gpu-2-mig-1g10gb-19-0";

fn options(root: &Path, gates: &str) -> PluginOptions {
    PluginOptions {
        extra_args: vec![
            "--driver-root".into(),
            root.to_string_lossy().into_owned(),
            "--feature-gates".into(),
            gates.into(),
            "--mps-ready-timeout-ms".into(),
            "1500".into(),
        ],
        ..PluginOptions::default()
    }
}

/// A node with `gates`, a fake driver root (in `TempDir`), and a guard
/// that kills daemons and detaches mounts the test left (dropped first).
fn node(gates: &str) -> (tempfile::TempDir, RunningNode, PathBuf, Cleanup) {
    let driver = tempfile::tempdir().unwrap();
    let root = fake_mps::driver_root(driver.path());
    let node = RunningNode::start(INVENTORY, KubeletConfig::new("", DRIVER), options(&root, gates));
    let cleanup = Cleanup(node.dirs.root.path().to_path_buf());
    (driver, node, root, cleanup)
}

fn mps_config(config: serde_json::Value) -> Vec<DeviceAllocationConfiguration> {
    vec![opaque_config(
        "FromClaim",
        &[],
        DRIVER,
        serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                           "sharing": {"strategy": "MPS", "mpsConfig": config}}),
    )]
}

fn daemon_of(node: &RunningNode, uid: &str) -> MpsDaemon {
    let record = node.records().into_iter().find(|r| r.uid == uid).expect("a record");
    record.mps.expect("an MPS daemon in the record")
}

/// The UUID a prepared claim's daemon shows for `device`.
fn gpu_uuid(node: &RunningNode, device: &str) -> String {
    let record = node.records().into_iter().find(|r| r.devices.iter().any(|d| d.device_name == device));
    record.and_then(|r| r.mps).map(|m| m.visible[0].clone()).expect("a daemon's device")
}

fn wait_until(what: &str, timeout: Duration, done: impl FnMut() -> bool) {
    wait::wait_until(what, timeout, done, String::new);
}

fn prepare_ok(node: &RunningNode, claim: &Claim) {
    let answers = node.prepare(std::slice::from_ref(claim));
    assert!(answers.values().all(Result::is_ok), "{answers:?}\n{}", node.process.log());
}

/// `(mount point, major:minor)` of each mount `pid` sees.
fn mounts_of(pid: &str) -> Vec<(PathBuf, String)> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    table
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            Some((PathBuf::from(fields.get(4)?), fields.get(2)?.to_string()))
        })
        .collect()
}

/// The daemon's `/dev/shm` is the claim's tmpfs (MPS server and clients
/// share memory there), and its mount namespace holds no claim's tmpfs
/// under the state directory (it would keep that memory alive).
fn assert_daemon_sees_its_shm(daemon: &MpsDaemon) {
    let pid = daemon.process.expect("a recorded process").pid.to_string();
    let shm = std::fs::canonicalize(daemon.shm_dir()).unwrap();
    let ours = mounts_of("self").into_iter().find(|(p, _)| *p == shm).expect("the claim's tmpfs").1;
    let theirs = mounts_of(&pid);
    let dev_shm = theirs.iter().rev().find(|(p, _)| p == Path::new("/dev/shm")).map(|(_, id)| id.clone());
    assert_eq!(dev_shm, Some(ours), "the daemon's /dev/shm is the claim's tmpfs");
    let mps_dir = shm.parent().and_then(Path::parent).unwrap();
    let held: Vec<_> = theirs.iter().filter(|(p, _)| p.starts_with(mps_dir)).collect();
    assert!(held.is_empty(), "the daemon's namespace holds {held:?}");
}

/// Nothing of any MPS daemon is left on the node.
fn assert_nothing_left(node: &RunningNode, root: &Path) {
    let mps_dir = node.dirs.plugin_dir(DRIVER).join("mps");
    assert_eq!(running_daemons(node.dirs.root.path()), Vec::<i32>::new(), "a daemon leaked");
    assert_eq!(mounts_under(node.dirs.root.path()), Vec::<PathBuf>::new(), "a mount leaked");
    let left: Vec<_> = std::fs::read_dir(&mps_dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "daemon directories left: {left:?}");
    let modes: Vec<String> = smi_calls(root).into_iter().filter(|c| c.contains(" -c ")).collect();
    assert!(modes.last().is_none_or(|m| m.ends_with("-c DEFAULT")), "a GPU left in EXCLUSIVE_PROCESS: {modes:?}");
}

#[test]
fn a_claims_daemon_is_started_with_its_limits_reachable_and_torn_down() {
    let (_driver, node, root, _cleanup) = node("MPSSupport=true");
    let claim = node.claim(
        "mps",
        &[Allocated::new("gpu", NODE, "gpu-0")],
        mps_config(serde_json::json!({"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "10Gi"})),
    );
    prepare_ok(&node, &claim);
    let daemon = daemon_of(&node, &claim.uid);
    let uuid = daemon.visible[0].clone();
    let pipe = daemon.pipe_dir().to_string_lossy().into_owned();
    assert_eq!(daemon.root, node.dirs.plugin_dir(DRIVER).join("mps").join(&claim.uid));
    assert_eq!(smi_calls(&root), [format!("-i {uuid} -c EXCLUSIVE_PROCESS")]);
    assert_eq!(
        mps_calls(&root),
        [
            format!("start {uuid} {pipe} {}", daemon.log_dir().display()),
            format!("{pipe} get_default_active_thread_percentage"),
            format!("{pipe} set_default_active_thread_percentage 40"),
            format!("{pipe} set_default_device_pinned_mem_limit {uuid} 10240M"),
        ]
    );
    // The daemon finds libcuda in the driver root, not in the plugin's image.
    let library_path = fake_mps::daemon_library_path(&root);
    assert!(Path::new(&library_path).join("libcuda.so.1").exists(), "LD_LIBRARY_PATH={library_path}");
    assert!(library_path.starts_with(root.to_str().unwrap()), "LD_LIBRARY_PATH={library_path}");
    let process = daemon.process.expect("the daemon's process is recorded");
    assert!(fake_mps::is_alive(process.pid), "the daemon runs detached from the plugin");
    assert_eq!(mounts_under(node.dirs.root.path()), [std::fs::canonicalize(daemon.shm_dir()).unwrap()]);
    assert_daemon_sees_its_shm(&daemon);

    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(node.spec_path(&claim.uid)).unwrap()).unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    assert_eq!(edits["env"], serde_json::json!(["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]));
    assert_eq!(
        edits["mounts"],
        serde_json::json!([
            {"hostPath": pipe, "containerPath": "/tmp/nvidia-mps", "options": ["rw", "nosuid", "nodev", "bind"]},
            {"hostPath": daemon.shm_dir(), "containerPath": "/dev/shm", "options": ["rw", "nosuid", "nodev", "bind"]},
        ])
    );

    node.unprepare(std::slice::from_ref(&claim));
    assert_eq!(mps_calls(&root)[4..], [format!("{pipe} quit")]);
    assert!(!fake_mps::is_alive(process.pid), "the daemon stopped");
    assert!(!daemon.root.exists(), "its directories are gone");
    assert_eq!(smi_calls(&root)[1..], [format!("-i {uuid} -c DEFAULT")]);
    assert_nothing_left(&node, &root);

    // A daemon that never answers fails the claim, bounded, and is undone.
    std::fs::write(root.join("mps.never-ready"), b"").unwrap();
    let slow = node.claim("slow", &[Allocated::new("gpu", NODE, "gpu-1")], mps_config(serde_json::json!({})));
    let answers = node.prepare(std::slice::from_ref(&slow));
    let error = answers.values().next().unwrap().clone().unwrap_err();
    assert!(error.contains("did not answer within"), "{error}");
    assert!(node.records().is_empty());
    assert_nothing_left(&node, &root);
    // Out-of-range and unknown fields are per-claim errors naming the path.
    let at = "status.allocation.devices.config[0].opaque.parameters.sharing.mpsConfig";
    let cases = [
        (serde_json::json!({"defaultActiveThreadPercentage": 101}), ".defaultActiveThreadPercentage"),
        (serde_json::json!({"defaultPinnedDeviceMemoryLimit": "512Ki"}), ".defaultPinnedDeviceMemoryLimit"),
        (serde_json::json!({"threads": 3}), ""),
    ];
    for (n, (config, field)) in cases.into_iter().enumerate() {
        let bad = node.claim(&format!("bad-{n}"), &[Allocated::new("gpu", NODE, "gpu-1")], mps_config(config));
        let error = node.prepare(std::slice::from_ref(&bad)).values().next().unwrap().clone().unwrap_err();
        assert!(error.starts_with(&format!("{at}{field}")), "{error}");
    }
}

#[test]
fn mps_with_the_gate_off_is_a_per_claim_error_naming_the_field() {
    let (_driver, node, root, _cleanup) = node("TimeSlicingSettings=true");
    let claim = node.claim("mps", &[Allocated::new("gpu", NODE, "gpu-0")], mps_config(serde_json::json!({})));
    let error = node.prepare(std::slice::from_ref(&claim)).values().next().unwrap().clone().unwrap_err();
    assert!(
        error.starts_with("status.allocation.devices.config[0].opaque.parameters.sharing")
            && error.contains(r#"the "MPSSupport" feature gate is not enabled"#),
        "{error}"
    );
    // A share of a GPU cannot be enforced without MPS: refused, not ignored.
    let share =
        node.claim("share", &[Allocated::new("gpu", NODE, "gpu-1").share("s-1", &[("memory", "10Gi")])], vec![]);
    let error = node.prepare(std::slice::from_ref(&share)).values().next().unwrap().clone().unwrap_err();
    assert!(error.contains("nor the MPSSupport feature gate is on"), "{error}");
    assert!(mps_calls(&root).is_empty() && smi_calls(&root).is_empty());
}

#[test]
fn two_shares_of_one_gpu_each_get_their_own_daemon_and_limit() {
    let (_driver, node, root, _cleanup) = node("MPSSupport=true");
    let small = node.claim(
        "small",
        &[Allocated::new("gpu", NODE, "gpu-0").share("s-1", &[("memory", "10Gi"), ("smPercent", "25")])],
        vec![],
    );
    let large =
        node.claim("large", &[Allocated::new("gpu", NODE, "gpu-0").share("s-2", &[("memory", "30Gi")])], vec![]);
    prepare_ok(&node, &small);
    prepare_ok(&node, &large);
    let (a, b) = (daemon_of(&node, &small.uid), daemon_of(&node, &large.uid));
    assert_ne!(a.root, b.root);
    let uuid = gpu_uuid(&node, "gpu-0");
    let calls = mps_calls(&root);
    let of = |d: &MpsDaemon| -> Vec<String> {
        let pipe = d.pipe_dir().to_string_lossy().into_owned();
        calls.iter().filter_map(|c| c.strip_prefix(&format!("{pipe} ")).map(str::to_owned)).collect()
    };
    assert_eq!(
        of(&a),
        [
            "get_default_active_thread_percentage".to_owned(),
            "set_default_active_thread_percentage 25".to_owned(),
            format!("set_default_device_pinned_mem_limit {uuid} 10240M"),
        ]
    );
    assert_eq!(
        of(&b),
        [
            "get_default_active_thread_percentage".to_owned(),
            format!("set_default_device_pinned_mem_limit {uuid} 30720M")
        ]
    );
    assert_eq!(running_daemons(node.dirs.root.path()).len(), 2);
    assert_daemon_sees_its_shm(&a);
    assert_daemon_sees_its_shm(&b);
    // The GPU stays EXCLUSIVE_PROCESS until the last share goes.
    node.unprepare(std::slice::from_ref(&small));
    assert!(!smi_calls(&root).iter().any(|c| c.ends_with("-c DEFAULT")));
    assert_eq!(running_daemons(node.dirs.root.path()).len(), 1);
    node.unprepare(std::slice::from_ref(&large));
    assert_eq!(smi_calls(&root).last().unwrap(), &format!("-i {uuid} -c DEFAULT"));
    assert_nothing_left(&node, &root);
}

fn restart_after_kill(node: &mut RunningNode, root: &Path) {
    node.process = PluginProcess::spawn(&node.dirs, &options(root, "MPSSupport=true")).unwrap();
    node.plugin = node
        .runtime
        .block_on(node.kubelet.wait_and_register(WAIT))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()));
}

/// Prepares `claim` while `hang` exists in the driver root, SIGKILLs the
/// plugin once `reached` is logged, and removes the hang.
fn kill_during_prepare(node: &mut RunningNode, root: &Path, claim: &Claim, hang: &str, reached: &dyn Fn() -> bool) {
    std::fs::write(root.join(hang), b"").unwrap();
    let pid = node.process.pid();
    std::thread::scope(|scope| {
        let prepare =
            scope.spawn(|| node.runtime.block_on(node.kubelet.prepare_raw(&node.plugin, std::slice::from_ref(claim))));
        wait_until(&format!("the step of {hang}"), Duration::from_secs(60), reached);
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
        assert!(prepare.join().unwrap().is_err(), "the call did not see the plugin die");
    });
    // The waiting fake program gives up once it sees its plugin dead.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::remove_file(root.join(hang)).unwrap();
}

#[test]
fn a_plugin_killed_at_any_step_of_prepare_leaves_nothing_behind() {
    let (_driver, mut node, root, _cleanup) = node("MPSSupport=true");
    let claim = node.claim(
        "mps",
        &[Allocated::new("gpu", NODE, "gpu-0")],
        mps_config(serde_json::json!({"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "2Gi"})),
    );
    let steps: [(&str, &str); 4] = [
        ("nvidia-smi.hang", "-c EXCLUSIVE_PROCESS"),
        ("mps.hang-start", "start "),
        ("mps.hang-get_default_active_thread_percentage", " get_default_active_thread_percentage"),
        ("mps.hang-set_default_device_pinned_mem_limit", " set_default_device_pinned_mem_limit"),
    ];
    for (hang, logged) in steps {
        let (smi_before, mps_before) = (smi_calls(&root).len(), mps_calls(&root).len());
        let reached =
            || smi_calls(&root)[smi_before..].iter().chain(&mps_calls(&root)[mps_before..]).any(|c| c.contains(logged));
        kill_during_prepare(&mut node, &root, &claim, hang, &reached);
        let records = node.records();
        assert_eq!(records.len(), 1, "{hang}: the intent was recorded before the step");
        assert!(records[0].mps.is_some());
        restart_after_kill(&mut node, &root);
        assert!(node.records().is_empty(), "{hang}: the interrupted prepare was rolled back");
        assert_nothing_left(&node, &root);
        // The kubelet's retry prepares afresh, with the limits.
        prepare_ok(&node, &claim);
        let pipe = daemon_of(&node, &claim.uid).pipe_dir().to_string_lossy().into_owned();
        let limits: Vec<String> = mps_calls(&root).into_iter().filter(|c| c.starts_with(&pipe)).collect();
        assert!(
            limits.ends_with(&[
                format!("{pipe} set_default_active_thread_percentage 50"),
                format!("{pipe} set_default_device_pinned_mem_limit {} 2048M", gpu_uuid(&node, "gpu-0"))
            ]),
            "{hang}: {limits:?}"
        );
        node.unprepare(std::slice::from_ref(&claim));
        assert_nothing_left(&node, &root);
    }
}

#[test]
fn a_prepared_claims_daemon_outlives_a_plugin_restart_or_is_started_again() {
    let (_driver, mut node, root, _cleanup) = node("MPSSupport=true");
    let claim = node.claim(
        "mps",
        &[Allocated::new("gpu", NODE, "gpu-1")],
        mps_config(serde_json::json!({"defaultActiveThreadPercentage": 30})),
    );
    prepare_ok(&node, &claim);
    let first = daemon_of(&node, &claim.uid).process.unwrap();
    // SIGKILL of the plugin: the detached daemon keeps running and is kept.
    node.process.kill().unwrap();
    restart_after_kill(&mut node, &root);
    assert!(fake_mps::is_alive(first.pid));
    assert_eq!(daemon_of(&node, &claim.uid).process, Some(first));
    assert_eq!(mps_calls(&root).iter().filter(|c| c.starts_with("start ")).count(), 1, "not started twice");
    // The daemon died while the plugin was down (a container restart kills
    // it): started again with the same limit.
    node.process.kill().unwrap();
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(first.pid).unwrap(),
        rustix::process::Signal::KILL,
    );
    wait_until("the daemon to die", Duration::from_secs(10), || !fake_mps::is_alive(first.pid));
    restart_after_kill(&mut node, &root);
    let again = daemon_of(&node, &claim.uid);
    let second = again.process.expect("the new process is recorded");
    assert_ne!(second, first);
    assert!(fake_mps::is_alive(second.pid));
    let pipe = again.pipe_dir().to_string_lossy().into_owned();
    assert_eq!(mps_calls(&root).last().unwrap(), &format!("{pipe} set_default_active_thread_percentage 30"));
    assert_eq!(mounts_under(node.dirs.root.path()).len(), 1, "one tmpfs, not two");
    // Killed while unpreparing (`quit` sent): the claim is still prepared
    // at restart, its daemon kept; the kubelet's retry tears it down.
    std::fs::write(root.join("mps.hang-quit"), b"").unwrap();
    let pid = node.process.pid();
    std::thread::scope(|scope| {
        let call =
            scope.spawn(|| node.runtime.block_on(node.kubelet.unprepare(&node.plugin, std::slice::from_ref(&claim))));
        wait_until("quit", Duration::from_secs(60), || mps_calls(&root).last().is_some_and(|c| c.ends_with(" quit")));
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
        assert!(call.join().unwrap().is_err(), "the call did not see the plugin die");
    });
    // The `quit` never reached the daemon: the fake client gives up when
    // its plugin dies (a real one that got through would stop the daemon,
    // and start-up would then start it again).
    std::thread::sleep(Duration::from_millis(300));
    std::fs::remove_file(root.join("mps.hang-quit")).unwrap();
    restart_after_kill(&mut node, &root);
    assert_eq!(daemon_of(&node, &claim.uid).process, Some(second), "kept across the interrupted unprepare");
    assert!(fake_mps::is_alive(second.pid));
    node.unprepare(std::slice::from_ref(&claim));
    assert_nothing_left(&node, &root);
}

/// `gpu-kubelet-plugin mps-supervisor`, killed when dropped.
struct Supervisor(std::process::Child);

impl Drop for Supervisor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn with_a_supervisor_the_daemon_lives_in_its_tree_and_outlives_the_plugin() {
    let driver = tempfile::tempdir().unwrap();
    let root = fake_mps::driver_root(driver.path());
    let mut options = options(&root, "MPSSupport=true");
    options.extra_args.push("--mps-supervisor".into());
    let mut node = RunningNode::start(INVENTORY, KubeletConfig::new("", DRIVER), options.clone());
    let _cleanup = Cleanup(node.dirs.root.path().to_path_buf());
    let log = std::fs::File::create(node.dirs.root.path().join("supervisor.log")).unwrap();
    let supervisor = Supervisor(
        std::process::Command::new(integration_tests::kubelet_plugin())
            .arg("mps-supervisor")
            .arg("--state-dir")
            .arg(node.dirs.plugin_dir(DRIVER))
            .arg("--driver-root")
            .arg(&root)
            .env("LOG_LEVEL", "info")
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let claim = node.claim(
        "mps",
        &[Allocated::new("gpu", NODE, "gpu-0")],
        mps_config(serde_json::json!({"defaultActiveThreadPercentage": 60})),
    );
    prepare_ok(&node, &claim);
    let daemon = daemon_of(&node, &claim.uid);
    let process = daemon.process.expect("recorded");
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", process.pid)).unwrap();
    let parent: u32 = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(parent, supervisor.0.id(), "the daemon is the supervisor's (its subreaper's) child");
    assert_daemon_sees_its_shm(&daemon);
    let pipe = daemon.pipe_dir().to_string_lossy().into_owned();
    assert_eq!(mps_calls(&root).last().unwrap(), &format!("{pipe} set_default_active_thread_percentage 60"));
    // The plugin dies and comes back: the daemon was never its child.
    node.process.kill().unwrap();
    node.process = PluginProcess::spawn(&node.dirs, &options).unwrap();
    node.plugin = node
        .runtime
        .block_on(node.kubelet.wait_and_register(WAIT))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()));
    assert!(fake_mps::is_alive(process.pid));
    assert_eq!(daemon_of(&node, &claim.uid).process, Some(process));
    node.unprepare(std::slice::from_ref(&claim));
    assert_nothing_left(&node, &root);
}

#[test]
fn a_mig_device_gets_a_daemon_for_its_own_uuid_and_its_gpu_changes_mode() {
    let (_driver, node, root, _cleanup) = node("MPSSupport=true");
    let config = vec![opaque_config(
        "FromClaim",
        &[],
        DRIVER,
        serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
                           "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4Gi"}}}),
    )];
    let claim = node.claim("mig", &[Allocated::new("gpu", NODE, MIG)], config);
    prepare_ok(&node, &claim);
    let daemon = daemon_of(&node, &claim.uid);
    let (mig, parent) = (daemon.visible[0].clone(), daemon.gpus[0].clone());
    assert!(mig.starts_with("MIG-") && parent.starts_with("GPU-"), "{mig} {parent}");
    let pipe = daemon.pipe_dir().to_string_lossy().into_owned();
    assert_eq!(mps_calls(&root)[0], format!("start {mig} {pipe} {}", daemon.log_dir().display()));
    assert_eq!(mps_calls(&root).last().unwrap(), &format!("{pipe} set_default_device_pinned_mem_limit {mig} 4096M"));
    assert_eq!(smi_calls(&root), [format!("-i {parent} -c EXCLUSIVE_PROCESS")]);
    node.unprepare(std::slice::from_ref(&claim));
    assert_eq!(smi_calls(&root).last().unwrap(), &format!("-i {parent} -c DEFAULT"));
    assert_nothing_left(&node, &root);
}
