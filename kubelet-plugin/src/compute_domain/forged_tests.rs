//! Forged ComputeDomain state (issue 31, cases 1, 2, 6 and 7): someone
//! with write access to the agent's state directory, or who runs processes
//! on the node, cannot make the agent delete, signal, start or write
//! anything it did not make. Each forged file is set aside (`.damaged`)
//! with one log line, and the agent's own work goes on.

use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use gpu_dra_driver::compute_domain::imex;
use serde_json::{Value, json};

use super::tests::{DOMAIN, NODE, Node, UID_A, UID_B, prepare, unprepare};
use crate::state::checkpoint::envelope;

const UID_C: &str = "11111111-2222-4333-8444-555555555553";

fn spec_name(uid: &str) -> String {
    format!("k8s.compute-domain.nvidia.com-claim_{uid}.json")
}

/// A ComputeDomain record as the agent writes it, with `fields` replaced.
fn record(uid: &str, state: &str, domain_uid: &str, fields: Value) -> Value {
    let mut claim = json!({
        "uid": uid, "namespace": "team", "name": format!("forged-{}", &uid[30..]), "state": state,
        "bootId": "boot-1", "cdiSpecFile": spec_name(uid), "devices": [],
        "computeDomain": {"domainUid": domain_uid, "namespace": "team", "kind": "channel", "channels": [0]}
    });
    for (key, value) in fields.as_object().unwrap() {
        claim[key] = value.clone();
    }
    claim
}

/// Writes `claim` as `uid`'s record with a valid checksum.
fn forge(node: &Node, uid: &str, claim: &Value) {
    let dir = node.root().join("state/checkpoint");
    std::fs::create_dir_all(&dir).unwrap();
    let envelope = json!({"version": 1, "checksum": envelope::checksum(claim), "claim": claim});
    std::fs::write(dir.join(format!("{uid}.json")), serde_json::to_vec(&envelope).unwrap()).unwrap();
}

/// A process none of the agent's, killed when dropped.
struct Stranger(Child);

impl Stranger {
    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }

    /// Seen in the node's `--proc-root`, as a host process through hostPID.
    fn show_in(&self, proc_root: &Path) {
        // What the scan reads of it (its arguments) is there once its exec is done.
        crate::process::wait_for_exec(self.0.id());
        symlink(format!("/proc/{}", self.0.id()), proc_root.join(self.0.id().to_string())).unwrap();
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A program called `nvidia-imex` that is not the driver's: a shell loop.
fn impostor(dir: &Path) -> PathBuf {
    let bin = dir.join("usr/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let program = bin.join("nvidia-imex");
    std::fs::write(&program, "#!/bin/sh\nwhile :; do sleep 0.1; done\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    program
}

fn run(program: &Path, config: &Path) -> Stranger {
    Stranger(Command::new(program).arg("-c").arg(config).spawn().unwrap())
}

/// Processes whose command line holds `needle`.
fn running_with(needle: &Path) -> usize {
    let needle = needle.to_str().unwrap().as_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.parse::<u32>().is_ok()))
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| c.windows(needle.len()).any(|w| w == needle))
        .count()
}

/// Case 1: `device-nodes.json` naming paths (the old format) outside the
/// channel directory, or a planted file inside it: nothing it names is
/// removed, the file is set aside; the agent's own channel node still goes.
#[tokio::test]
async fn a_forged_device_node_list_deletes_nothing_it_names() {
    let node = Node::new(&[NODE]);
    let victim = node.root().join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    let planted = node.root().join("dev/nvidia-caps-imex-channels/channel7");
    std::fs::create_dir_all(planted.parent().unwrap()).unwrap();
    std::fs::write(&planted, "not a device").unwrap();
    std::fs::create_dir_all(node.root().join("state")).unwrap();
    let list = json!([victim, planted, node.root().join("cdi")]);
    std::fs::write(node.root().join("state/device-nodes.json"), list.to_string()).unwrap();

    let p = node.open();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), "not a device");
    assert!(node.root().join("cdi").is_dir());
    let state = node.files("state");
    assert!(state.contains(&"device-nodes.json.damaged".to_owned()), "{state:?}");
    assert!(!state.contains(&"device-nodes.json".to_owned()), "{state:?}");

    let a = node.channel_claim("pod-a-channel", UID_A);
    prepare(&p, &a).await.unwrap();
    assert!(node.channel_node().exists());
    unprepare(&p, &a).await;
    assert!(!node.channel_node().exists(), "the agent's own channel node goes");
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), "not a device");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
}

/// Case 1, the new format: a channel listed as created goes only when its
/// node is the character device the agent makes (major from
/// `/proc/devices`, minor the channel): a regular file, a symlink and a
/// device of another major stay; a channel beyond the driver's range
/// makes the list damaged.
#[tokio::test]
async fn a_listed_channel_goes_only_if_it_is_the_agents_device() {
    let node = Node::new(&[NODE]);
    let dir = node.root().join("dev/nvidia-caps-imex-channels");
    std::fs::create_dir_all(&dir).unwrap();
    let victim = node.root().join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    std::fs::write(dir.join("channel1"), "a file").unwrap();
    symlink(&victim, dir.join("channel2")).unwrap();
    let mode = rustix::fs::Mode::from_raw_mode(0o600);
    let char_device = rustix::fs::FileType::CharacterDevice;
    rustix::fs::mknodat(rustix::fs::CWD, dir.join("channel3"), char_device, mode, rustix::fs::makedev(1, 3)).unwrap();
    rustix::fs::mknodat(rustix::fs::CWD, dir.join("channel4"), char_device, mode, rustix::fs::makedev(234, 4)).unwrap();
    std::fs::create_dir_all(node.root().join("state")).unwrap();
    let list = json!({"channels": [1, 2, 3, 4]});
    std::fs::write(node.root().join("state/device-nodes.json"), list.to_string()).unwrap();

    drop(node.open());
    let mut left = node.files("dev/nvidia-caps-imex-channels");
    left.sort();
    assert_eq!(left, ["channel1", "channel2", "channel3"], "only the agent's kind of node went");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(!node.files("state").contains(&"device-nodes.json".to_owned()));

    std::fs::write(node.root().join("state/device-nodes.json"), json!({"channels": [1, 5000]}).to_string()).unwrap();
    drop(node.open());
    assert!(node.files("state").contains(&"device-nodes.json.damaged".to_owned()), "{:?}", node.files("state"));
    assert!(dir.join("channel1").exists());
}

/// Case 2: records whose `cdiSpecFile` names another claim's spec or a
/// path: set aside at start-up, and the healthy claim's spec and the file
/// outside are kept; the healthy claim is still prepared.
#[tokio::test]
async fn a_record_naming_another_claims_spec_deletes_nothing() {
    let node = Node::new(&[NODE]);
    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    let devices = prepare(&p, &a).await.unwrap();
    drop(p);
    let victim = node.root().join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    forge(&node, UID_B, &record(UID_B, "PrepareStarted", DOMAIN, json!({"cdiSpecFile": spec_name(UID_A)})));
    forge(&node, UID_C, &record(UID_C, "PrepareStarted", DOMAIN, json!({"cdiSpecFile": "../victim"})));

    let p = node.open();
    assert!(node.root().join("cdi").join(spec_name(UID_A)).exists(), "the healthy claim's spec is kept");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert_eq!(
        node.files("state/checkpoint"),
        [format!("{UID_A}.json"), format!("{UID_B}.json.damaged"), format!("{UID_C}.json.damaged")]
    );
    assert_eq!(prepare(&p, &a).await.unwrap(), devices, "still prepared, from its record");
    unprepare(&p, &a).await;
    assert_eq!(node.files("cdi"), Vec::<String>::new());
}

/// Case 6: a process called `nvidia-imex` running with the domain's very
/// configuration path is not the agent's daemon: the agent starts its own,
/// and stops only that one on release; a forged process record naming
/// the stranger does not get it signalled either.
#[tokio::test]
async fn a_process_named_nvidia_imex_is_not_taken_for_the_agents_daemon() {
    let node = Node::new(&[NODE]);
    let program = impostor(&node.root().join("impostor"));
    let domain_dir = node.root().join("state/domains").join(DOMAIN);
    let mut stranger = run(&program, &domain_dir.join("imexd.cfg"));
    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    prepare(&p, &a).await.unwrap();
    assert_eq!(node.imex_log().iter().filter(|l| l.starts_with("start ")).count(), 1, "{:?}", node.imex_log());
    unprepare(&p, &a).await;
    assert!(node.imex_log().last().unwrap().starts_with("stop "), "ours is stopped: {:?}", node.imex_log());
    assert!(stranger.alive(), "the stranger is not signalled");
    drop(p);

    // Its pid, start time and program forged as the domain's daemon.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", stranger.0.id())).unwrap();
    let start_time = crate::process::parse_stat(&stat).unwrap().start_time;
    let exe = std::fs::read_link(format!("/proc/{}/exe", stranger.0.id())).unwrap();
    std::fs::create_dir_all(&domain_dir).unwrap();
    std::fs::write(domain_dir.join("imexd.cfg"), "forged").unwrap();
    let forged = json!({"pid": stranger.0.id(), "startTime": start_time, "exe": exe});
    std::fs::write(domain_dir.join("daemon.json"), forged.to_string()).unwrap();
    drop(node.open());
    assert!(stranger.alive(), "a forged record does not get it signalled");
    assert_eq!(node.files("state/domains"), Vec::<String>::new(), "the daemon-less directory goes");
}

/// Case 6: an `nvidia-imex` that is not root's, or not the driver's
/// program, seen through hostPID, is no host-managed daemon: it blocks no
/// prepare (both list none of the domain's nodes) and is left alone.
#[tokio::test]
async fn an_unprivileged_or_foreign_nvidia_imex_is_not_the_hosts() {
    let node = Node::new(&[NODE]);
    let etc = node.root().join("etc/nvidia-imex");
    std::fs::create_dir_all(&etc).unwrap();
    let nodes = etc.join("nodes_config.cfg");
    std::fs::write(&nodes, "10.0.0.9\n").unwrap();
    let config = etc.join("config.cfg");
    std::fs::write(&config, imex::daemon_config(&nodes, &etc.join("imex.log"))).unwrap();
    let proc_root = node.root().join("proc");
    // Root runs a copy that is not the driver's program.
    let mut foreign = run(&impostor(&node.root().join("impostor")), &config);
    foreign.show_in(&proc_root);
    // Nobody runs the driver's very program (readable by all here).
    for dir in [node.root().to_path_buf(), node.root().join("driver")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // The fake leaves its "serving" mark beside the configuration.
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut command = Command::new(node.root().join("driver/usr/bin/nvidia-imex"));
    std::os::unix::process::CommandExt::uid(command.arg("-c").arg(&config), 65534);
    let mut unprivileged = Stranger(command.spawn().unwrap());
    unprivileged.show_in(&proc_root);

    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    prepare(&p, &a).await.unwrap();
    assert_eq!(node.imex_log().iter().filter(|l| l.starts_with("start ")).count(), 1, "{:?}", node.imex_log());
    unprepare(&p, &a).await;
    assert!(foreign.alive() && unprivileged.alive(), "neither is signalled");
}

/// Case 7: records whose `domainUid` is a path (absolute, or climbing out
/// of the daemons' directory) start no daemon on files outside the state
/// directory and are set aside; a symlinked daemon directory or output
/// log is refused, nothing written through it.
#[tokio::test]
async fn a_forged_domain_uid_or_symlinked_daemon_files_lead_nowhere() {
    let node = Node::new(&[NODE]);
    let outside = node.root().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let config = outside.join("imexd.cfg");
    std::fs::write(&config, imex::daemon_config(&outside.join("nodes.cfg"), &outside.join("imex.log"))).unwrap();
    std::fs::write(outside.join("nodes.cfg"), "10.0.0.1\n").unwrap();
    forge(&node, UID_A, &record(UID_A, "PrepareCompleted", outside.to_str().unwrap(), json!({})));
    forge(&node, UID_B, &record(UID_B, "PrepareCompleted", "../../outside", json!({})));
    let before = node.files("outside");

    let p = node.open();
    assert_eq!(running_with(&config), 0, "no daemon runs on the outside configuration");
    assert!(node.imex_log().is_empty(), "{:?}", node.imex_log());
    assert_eq!(node.files("state/checkpoint"), [format!("{UID_A}.json.damaged"), format!("{UID_B}.json.damaged")]);
    assert_eq!(node.files("outside"), before);

    // The domain's output log a symlink out: refused, nothing created.
    let domain_dir = node.root().join("state/domains").join(DOMAIN);
    std::fs::create_dir_all(&domain_dir).unwrap();
    let through_link = node.root().join("created-through-a-link");
    symlink(&through_link, domain_dir.join("output.log")).unwrap();
    let a = node.channel_claim("pod-a-channel", UID_A);
    let error = prepare(&p, &a).await.unwrap_err();
    assert!(error.contains("output.log") && error.contains("symbolic link"), "{error}");
    assert!(std::fs::symlink_metadata(&through_link).is_err(), "nothing created through the link");

    // The domain's directory a symlink out: refused, nothing written there.
    let _ = std::fs::remove_dir_all(&domain_dir);
    let elsewhere = node.root().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    symlink(&elsewhere, &domain_dir).unwrap();
    let error = prepare(&p, &a).await.unwrap_err();
    assert!(error.contains(DOMAIN), "{error}");
    assert_eq!(node.files("elsewhere"), Vec::<String>::new(), "nothing written through the link");
    assert!(node.imex_log().is_empty(), "{:?}", node.imex_log());
}
