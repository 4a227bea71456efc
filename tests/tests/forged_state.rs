//! Forged and damaged state through the real plugin binary: start-up acts
//! only on names it made. Checkpoint records with valid checksums that
//! name files outside the plugin's directories or another claim's spec, a
//! record renamed to another claim's UID, records that are symlinks to
//! `/dev/zero` or to a FIFO, a FIFO, an oversized record: each is set
//! aside with one log line, and the files the test planted (outside, and
//! healthy claims' specs) survive. Forged MPS state (an outside root, a
//! foreign process's pid and start time, symlinked daemon, pipe and log
//! directories, launch requests for claims that do not exist) deletes,
//! kills, launches and writes nothing outside the plugin's own state.
//!
//! The MPS tests mount a real tmpfs (as the plugin does on a node), so
//! they need root, like `tests/tests/mps.rs`.

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use gpu_kubelet_plugin::process::parse_stat;
use gpu_kubelet_plugin::state::checkpoint::{
    CheckpointDir, ClaimRecord, DaemonProcess, MAX_RECORD_BYTES, MpsDaemon, PrepareState, boot_id,
};
use integration_tests::claim_fixtures::{Allocated, opaque_config};
use integration_tests::fake_mps::{self, Cleanup, mps_calls};
use integration_tests::kubelet::KubeletConfig;
use integration_tests::node::{DRIVER, NODE, RunningNode, WAIT};
use integration_tests::plugin_process::{PluginOptions, PluginProcess};
use integration_tests::wait;

const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 4\n";
const DAMAGED_LINE: &str = "damaged checkpoint record";

/// A claim UID no other test uses: `<n>` in the first group.
fn uid(n: u32) -> String {
    format!("{n:08x}-9c1d-4a57-8d3c-1f2e3d4c5b6a")
}

fn this_boot() -> String {
    boot_id(Path::new("/proc")).expect("boot id")
}

/// A record with a valid checksum (written by the plugin's own code).
fn record(uid: &str, state: PrepareState, boot: &str) -> ClaimRecord {
    ClaimRecord {
        uid: uid.to_owned(),
        namespace: "default".into(),
        name: format!("forged-{}", &uid[..8]),
        state,
        boot_id: boot.to_owned(),
        cdi_spec_file: None,
        devices: Vec::new(),
        mps: None,
        compute_domain: None,
        adopted: None,
    }
}

fn daemon(root: PathBuf, process: Option<DaemonProcess>) -> MpsDaemon {
    MpsDaemon { visible: vec!["GPU-forged".into()], process, ..MpsDaemon::at(root) }
}

fn checkpoint(node: &RunningNode) -> CheckpointDir {
    CheckpointDir::open(node.dirs.plugin_dir(DRIVER).join("checkpoint")).expect("checkpoint")
}

fn write(dir: &CheckpointDir, record: &ClaimRecord) {
    let uid = gpu_dra_driver::names::ClaimUid::new(record.uid.as_str()).unwrap();
    dir.write(&uid, record).expect("writing a forged record");
}

fn mkfifo(path: &Path) {
    let mode = rustix::fs::Mode::from_raw_mode(0o600);
    rustix::fs::mknodat(rustix::fs::CWD, path, rustix::fs::FileType::Fifo, mode, 0).expect("mkfifo");
}

/// Every file under `dir` (symlinks not followed) with its content (a
/// directory, link or FIFO by its kind), to compare before and after.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(next) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            let what = if kind.is_symlink() {
                format!("link to {}", std::fs::read_link(&path).unwrap().display())
            } else if kind.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else if kind.is_file() {
                String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned()
            } else {
                "special".to_owned()
            };
            out.insert(path, what);
        }
    }
    out
}

/// A process that is none of the plugin's, killed when dropped.
struct Foreign(Child);

impl Foreign {
    /// `sleep` with `env`, as a stranger's process on the node.
    fn start(env: &[(&str, &Path)]) -> Self {
        let mut command = Command::new("sleep");
        command.arg("600");
        for (k, v) in env {
            command.env(k, v);
        }
        Self(command.spawn().expect("sleep"))
    }

    fn process(&self) -> DaemonProcess {
        let pid = self.0.id() as i32;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        DaemonProcess { pid, start_time: parse_stat(&stat).unwrap().start_time }
    }

    fn is_alive(&self) -> bool {
        fake_mps::is_alive(self.0.id() as i32)
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the plugin again on the same files; start-up must finish (no
/// hang on a FIFO, no unbounded read of `/dev/zero`).
fn restart(node: &mut RunningNode, options: &PluginOptions) {
    if node.process.wait_timeout(Duration::ZERO).ok().flatten().is_none() {
        node.process.kill().unwrap();
    }
    node.process = PluginProcess::spawn(&node.dirs, options).unwrap();
    node.plugin = node
        .runtime
        .block_on(node.kubelet.wait_and_register(WAIT))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()));
}

/// The log's lines that report `file` set aside; exactly one expected,
/// containing `reason`.
fn assert_set_aside_once(node: &RunningNode, file: &Path, reason: &str) {
    let log = node.process.log();
    let needle = format!("file={}", file.display());
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(DAMAGED_LINE) && l.contains(&needle)).collect();
    assert_eq!(lines.len(), 1, "one line for {}:\n{log}", file.display());
    assert!(lines[0].contains(reason), "{reason:?} not in {}", lines[0]);
    let mut aside = file.as_os_str().to_owned();
    aside.push(".damaged");
    assert!(std::fs::symlink_metadata(&aside).is_ok(), "{} is kept aside", file.display());
    assert!(std::fs::symlink_metadata(file).is_err(), "{} is no longer read", file.display());
}

#[test]
fn forged_checkpoint_records_are_set_aside_and_nothing_else_is_deleted() {
    let options = PluginOptions::default();
    let mut node = RunningNode::start(INVENTORY, KubeletConfig::new("", DRIVER), options.clone());
    let healthy = node.gpu_claim("healthy", &["gpu-0"]);
    let renamed = node.gpu_claim("renamed", &["gpu-1"]);
    for claim in [&healthy, &renamed] {
        let answers = node.prepare(std::slice::from_ref(claim));
        assert!(answers.values().all(Result::is_ok), "{answers:?}");
    }
    node.process.kill().unwrap();

    let outside = node.dirs.root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let absolute_victim = outside.join("absolute-victim");
    std::fs::write(&absolute_victim, b"keep me").unwrap();
    std::fs::write(outside.join("relative-victim"), b"keep me too").unwrap();
    let fifo = outside.join("fifo");
    mkfifo(&fifo);
    let checkpoint = checkpoint(&node);
    let at = |uid: &str| checkpoint.path().join(format!("{uid}.json"));
    let boot = this_boot();
    let healthy_spec = node.spec_path(&healthy.uid).file_name().unwrap().to_string_lossy().into_owned();
    let mut forged: Vec<(PathBuf, &str)> = Vec::new();

    // Valid checksums, names that are not the record's own.
    let mut absolute = record(&uid(1), PrepareState::PrepareStarted, &boot);
    absolute.cdi_spec_file = Some(absolute_victim.to_string_lossy().into_owned());
    let mut relative = record(&uid(2), PrepareState::PrepareCompleted, "another-boot");
    relative.cdi_spec_file = Some("../outside/relative-victim".into());
    let mut others_spec = record(&uid(3), PrepareState::PrepareStarted, &boot);
    others_spec.cdi_spec_file = Some(healthy_spec.clone());
    for r in [&absolute, &relative, &others_spec] {
        write(&checkpoint, r);
        forged.push((at(&r.uid), "field `cdiSpecFile` is"));
    }
    // The renamed claim's record under another UID (its own file gone),
    // and a record holding another UID than its name.
    std::fs::rename(at(&renamed.uid), at(&uid(4))).unwrap();
    forged.push((at(&uid(4)), "is named after"));
    write(&checkpoint, &record(&uid(50), PrepareState::PrepareStarted, &boot));
    std::fs::rename(at(&uid(50)), at(&uid(5))).unwrap();
    forged.push((at(&uid(5)), "is named after"));
    // Files that are not records.
    symlink("/dev/zero", at(&uid(6))).unwrap();
    forged.push((at(&uid(6)), "is a symbolic link"));
    symlink(&fifo, at(&uid(7))).unwrap();
    forged.push((at(&uid(7)), "is a symbolic link"));
    mkfifo(&at(&uid(8)));
    forged.push((at(&uid(8)), "is a FIFO"));
    let mut oversized = b"{\"version\":1,\"checksum\":\"".to_vec();
    oversized.resize(MAX_RECORD_BYTES as usize + 1, b'x');
    std::fs::write(at(&uid(9)), oversized).unwrap();
    forged.push((at(&uid(9)), "the most such a file may hold"));
    let outside_before = snapshot(&outside);

    let started = Instant::now();
    restart(&mut node, &options);
    assert!(started.elapsed() < WAIT, "start-up finished");
    for (file, reason) in &forged {
        assert_set_aside_once(&node, file, reason);
    }
    assert_eq!(snapshot(&outside), outside_before, "nothing outside the plugin's directories changed");
    assert_eq!(std::fs::read(&absolute_victim).unwrap(), b"keep me");
    assert!(node.spec_path(&healthy.uid).exists(), "the healthy claim's spec is kept");
    assert!(node.spec_path(&renamed.uid).exists(), "the renamed record's claim's spec is kept");
    // The healthy claim is still prepared (answered from its record).
    let records = node.records();
    assert_eq!(records.iter().map(|r| r.uid.as_str()).collect::<Vec<_>>(), [healthy.uid.as_str()]);
    let answers = node.prepare(std::slice::from_ref(&healthy));
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    // A second start-up finds nothing more to set aside.
    restart(&mut node, &options);
    assert!(!node.process.log().contains(DAMAGED_LINE), "{}", node.process.log());
    assert_eq!(snapshot(&outside), outside_before);
    assert!(node.spec_path(&healthy.uid).exists() && node.spec_path(&renamed.uid).exists());
}

fn mps_options(root: &Path) -> PluginOptions {
    PluginOptions {
        extra_args: vec![
            "--driver-root".into(),
            root.to_string_lossy().into_owned(),
            "--feature-gates".into(),
            "MPSSupport=true".into(),
            "--mps-ready-timeout-ms".into(),
            "1500".into(),
        ],
        ..PluginOptions::default()
    }
}

fn mps_config() -> Vec<k8s_openapi::api::resource::v1::DeviceAllocationConfiguration> {
    vec![opaque_config(
        "FromClaim",
        &[],
        DRIVER,
        serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                           "sharing": {"strategy": "MPS", "mpsConfig": {}}}),
    )]
}

/// An outside directory shaped like a daemon's, with a file in each part.
fn outside_daemon_dir(dir: &Path) {
    for part in ["pipe", "log", "shm"] {
        std::fs::create_dir_all(dir.join(part)).unwrap();
        std::fs::write(dir.join(part).join("keep"), part).unwrap();
    }
    std::fs::write(dir.join("keep"), b"outside").unwrap();
}

#[test]
fn forged_mps_state_touches_nothing_outside_the_plugins_state() {
    let driver = tempfile::tempdir().unwrap();
    let root = fake_mps::driver_root(driver.path());
    let options = mps_options(&root);
    let mut node = RunningNode::start(INVENTORY, KubeletConfig::new("", DRIVER), options.clone());
    let _cleanup = Cleanup(node.dirs.root.path().to_path_buf());
    let kept = node.claim("kept", &[Allocated::new("gpu", NODE, "gpu-0")], mps_config());
    let answers = node.prepare(std::slice::from_ref(&kept));
    assert!(answers.values().all(Result::is_ok), "{answers:?}\n{}", node.process.log());
    let kept_daemon = node.records()[0].mps.clone().unwrap().process.unwrap();
    node.process.kill().unwrap();

    // Outside the plugin's directories: a daemon-shaped tree, and a
    // stranger's process whose environment names its pipe directory.
    let outside = tempfile::tempdir().unwrap();
    let (tree, linked_root, linked_orphan) =
        (outside.path().join("tree"), outside.path().join("linked-root"), outside.path().join("orphan"));
    for dir in [&tree, &linked_root, &linked_orphan] {
        outside_daemon_dir(dir);
    }
    let stranger = Foreign::start(&[("CUDA_MPS_PIPE_DIRECTORY", tree.join("pipe").as_path())]);
    let checkpoint = checkpoint(&node);
    let mps_dir = node.dirs.plugin_dir(DRIVER).join("mps");
    let boot = this_boot();
    let at = |uid: &str| checkpoint.path().join(format!("{uid}.json"));

    // An outside root with the stranger as its daemon; the same from
    // another boot.
    let mut outside_root = record(&uid(11), PrepareState::PrepareStarted, &boot);
    outside_root.mps = Some(daemon(tree.clone(), Some(stranger.process())));
    let mut other_boot = record(&uid(12), PrepareState::PrepareCompleted, "another-boot");
    other_boot.mps = Some(daemon(tree.clone(), None));
    // Our own root, the stranger's pid and start time as its daemon.
    let mut foreign_pid = record(&uid(13), PrepareState::PrepareStarted, &boot);
    foreign_pid.mps = Some(daemon(mps_dir.join(uid(13)), Some(stranger.process())));
    for part in ["pipe", "log", "shm"] {
        std::fs::create_dir_all(mps_dir.join(uid(13)).join(part)).unwrap();
    }
    // A prepared claim whose pipe and log directories lead outside.
    let mut linked_parts = record(&uid(14), PrepareState::PrepareCompleted, &boot);
    linked_parts.mps = Some(daemon(mps_dir.join(uid(14)), Some(stranger.process())));
    std::fs::create_dir_all(mps_dir.join(uid(14)).join("shm")).unwrap();
    symlink(tree.join("pipe"), mps_dir.join(uid(14)).join("pipe")).unwrap();
    symlink(tree.join("log"), mps_dir.join(uid(14)).join("log")).unwrap();
    // An interrupted prepare whose daemon directory is a link outside.
    let mut linked = record(&uid(15), PrepareState::PrepareStarted, &boot);
    linked.mps = Some(daemon(mps_dir.join(uid(15)), None));
    symlink(&linked_root, mps_dir.join(uid(15))).unwrap();
    for r in [&outside_root, &other_boot, &foreign_pid, &linked_parts, &linked] {
        write(&checkpoint, r);
    }
    // Directories no record owns: a link outside, a name that is no UID.
    symlink(&linked_orphan, mps_dir.join(uid(16))).unwrap();
    std::fs::create_dir_all(mps_dir.join("not-a-claim")).unwrap();
    let outside_before = snapshot(outside.path());

    restart(&mut node, &options);
    assert_set_aside_once(&node, &at(&uid(11)), "field `mps.root` is");
    assert_set_aside_once(&node, &at(&uid(12)), "field `mps.root` is");
    assert!(stranger.is_alive(), "the stranger's process was not killed\n{}", node.process.log());
    assert_eq!(snapshot(outside.path()), outside_before, "nothing outside was deleted or written");
    assert!(fake_mps::is_alive(kept_daemon.pid), "the healthy claim's daemon is kept");
    assert_eq!(mps_calls(&root).iter().filter(|c| c.starts_with("start ")).count(), 1, "nothing else launched");
    // The interrupted prepare with our own root was rolled back (its
    // directory is ours), the stranger untouched; the links are left.
    assert!(!mps_dir.join(uid(13)).exists());
    assert!(std::fs::symlink_metadata(mps_dir.join(uid(15))).unwrap().file_type().is_symlink());
    assert!(std::fs::symlink_metadata(mps_dir.join(uid(16))).unwrap().file_type().is_symlink());
    assert!(mps_dir.join("not-a-claim").is_dir());
    let log = node.process.log();
    assert!(log.contains("is a symbolic link, not the directory the plugin made"), "{log}");
    assert!(node.spec_path(&kept.uid).exists());
    node.unprepare(std::slice::from_ref(&kept));
    assert!(!fake_mps::is_alive(kept_daemon.pid));
    assert!(stranger.is_alive());
    assert_eq!(snapshot(outside.path()), outside_before);
}

/// `gpu-kubelet-plugin mps-supervisor`, killed when dropped.
struct Supervisor(Child, PathBuf);

impl Supervisor {
    fn start(state_dir: &Path, driver_root: &Path, log: PathBuf) -> Self {
        let child = Command::new(integration_tests::kubelet_plugin())
            .arg("mps-supervisor")
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--driver-root")
            .arg(driver_root)
            .env("LOG_LEVEL", "info")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self(child, log)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_supervisor_launches_only_for_claims_the_checkpoint_holds_and_follows_no_link() {
    let driver = tempfile::tempdir().unwrap();
    let driver_root = fake_mps::driver_root(driver.path());
    let state = tempfile::tempdir().unwrap();
    let _cleanup = Cleanup(state.path().to_path_buf());
    let checkpoint = CheckpointDir::open(state.path().join("checkpoint")).unwrap();
    let mps_dir = state.path().join("mps");
    let outside = tempfile::tempdir().unwrap();
    let request = br#"{"visible":["GPU-forged"]}"#;
    let claim_dir = |n: u32, with_record: bool| {
        let dir = mps_dir.join(uid(n));
        if with_record {
            let mut r = record(&uid(n), PrepareState::PrepareStarted, &this_boot());
            r.mps = Some(daemon(dir.clone(), None));
            write(&checkpoint, &r);
        }
        dir
    };
    let real_parts = |dir: &Path| {
        for part in ["pipe", "log", "shm"] {
            std::fs::create_dir_all(dir.join(part)).unwrap();
        }
    };
    // The control: a claim the checkpoint holds, asking properly.
    let good = claim_dir(21, true);
    real_parts(&good);
    std::fs::write(good.join("launch.request"), request).unwrap();
    // No such claim.
    let stranger = claim_dir(22, false);
    real_parts(&stranger);
    std::fs::write(stranger.join("launch.request"), request).unwrap();
    // A held claim whose directory is a link outside, with a request there.
    let linked_target = outside.path().join("linked");
    real_parts(&linked_target);
    std::fs::write(linked_target.join("launch.request"), request).unwrap();
    symlink(&linked_target, claim_dir(23, true)).unwrap();
    // A held claim whose log directory leads outside.
    let linked_log = claim_dir(24, true);
    real_parts(&linked_log);
    std::fs::remove_dir(linked_log.join("log")).unwrap();
    std::fs::create_dir_all(outside.path().join("log")).unwrap();
    symlink(outside.path().join("log"), linked_log.join("log")).unwrap();
    std::fs::write(linked_log.join("launch.request"), request).unwrap();
    // A held claim whose request is a link to an outside file.
    let linked_request = claim_dir(25, true);
    real_parts(&linked_request);
    std::fs::write(outside.path().join("request"), request).unwrap();
    symlink(outside.path().join("request"), linked_request.join("launch.request")).unwrap();
    let outside_before = snapshot(outside.path());

    let supervisor = Supervisor::start(state.path(), &driver_root, state.path().join("supervisor.log"));
    let answered = || good.join("launch.result").exists() && linked_log.join("launch.result").exists();
    wait::wait_until("the supervisor's answers", WAIT, answered, || supervisor.log());
    // Several more rounds of the supervisor's loop.
    std::thread::sleep(Duration::from_millis(1000));
    let good_result = std::fs::read_to_string(good.join("launch.result")).unwrap();
    assert_eq!(good_result, r#"{"error":null}"#, "{}", supervisor.log());
    let starts: Vec<String> = mps_calls(&driver_root).into_iter().filter(|c| c.starts_with("start ")).collect();
    assert_eq!(starts.len(), 1, "{starts:?}");
    assert!(starts[0].contains(&good.join("pipe").to_string_lossy().into_owned()), "{starts:?}");
    let refused = std::fs::read_to_string(linked_log.join("launch.result")).unwrap();
    assert!(refused.contains("is a symbolic link"), "{refused}");
    assert_eq!(snapshot(outside.path()), outside_before, "nothing written or deleted outside");
    assert!(stranger.join("launch.request").exists() && !stranger.join("launch.result").exists());
    let log = supervisor.log();
    for (n, why) in
        [(22, "no claim with this UID"), (23, "not a directory the plugin made"), (25, "not a regular file")]
    {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(&uid(n))).collect();
        assert_eq!(lines.len(), 1, "one line for {}:\n{log}", uid(n));
        assert!(lines[0].contains(why), "{}", lines[0]);
    }
}
