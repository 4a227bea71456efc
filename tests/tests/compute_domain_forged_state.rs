//! Forged ComputeDomain state through the real node agent (issue 31,
//! cases 1, 2, 6 and 7): state files written by the test while the agent
//! is down, and a process called `nvidia-imex` that is none of the
//! agent's. At restart each forged file is set aside (`*.damaged`) with
//! one log line, nothing it names is deleted, started or signalled, and
//! the healthy claim stays prepared; the agent's own daemon is still the
//! one it stops on release. (The same rules are unit-tested in
//! `kubelet-plugin/src/compute_domain/forged_tests.rs`.)

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command};

use integration_tests::compute_domain_cluster::{Node, one_node_domain};
use kubelet_proto::dra_v1::Claim;
use serde_json::{Value, json};

const DAMAGED_LINE: &str = "damaged compute-domain state";

/// A record as the agent writes it for `claim`, with `fields` replaced,
/// under `uid` (the file's name), with a valid checksum.
fn forge(node: &Node, uid: &str, like: &Value, fields: Value) {
    let mut claim = like.clone();
    claim["uid"] = json!(uid);
    claim["state"] = json!("PrepareStarted");
    claim["cdiSpecFile"] = json!(format!("k8s.compute-domain.nvidia.com-claim_{uid}.json"));
    for (key, value) in fields.as_object().unwrap() {
        claim[key] = value.clone();
    }
    let checksum = gpu_kubelet_plugin::state::checkpoint::envelope::checksum(&claim);
    let envelope = json!({"version": 1, "checksum": checksum, "claim": claim});
    let path = node.state().join("checkpoint").join(format!("{uid}.json"));
    std::fs::write(path, serde_json::to_vec(&envelope).unwrap()).unwrap();
}

/// The record the agent wrote for `claim` (its `claim` value).
fn record_of(node: &Node, claim: &Claim) -> Value {
    let path = node.state().join("checkpoint").join(format!("{}.json", claim.uid));
    let envelope: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    envelope["claim"].clone()
}

/// A shell loop called `nvidia-imex`, killed when dropped.
struct Stranger(Child);

impl Stranger {
    fn start(dir: &Path, config: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let program = dir.join("nvidia-imex");
        std::fs::write(&program, "#!/bin/sh\nwhile :; do sleep 0.1; done\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self(Command::new(program).arg("-c").arg(config).spawn().unwrap())
    }

    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn uid(n: u32) -> String {
    format!("{n:08x}-9c1d-4a57-8d3c-1f2e3d4c5b6a")
}

#[test]
fn forged_compute_domain_state_is_set_aside_and_nothing_it_names_is_touched() {
    let (cluster, mut node, channel) = one_node_domain();
    let ids = node.prepare(&cluster.rt, std::slice::from_ref(&channel)).remove(0).unwrap();
    let healthy = record_of(&node, &channel);
    let spec = node.dirs.cdi.join(format!("k8s.compute-domain.nvidia.com-claim_{}.json", channel.uid));
    let domain_uid = healthy["computeDomain"]["domainUid"].as_str().unwrap().to_owned();
    node.process.kill().unwrap();

    // Outside the agent's directories: files a forged state names.
    let outside = node.dirs.root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let victim = outside.join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    std::fs::write(outside.join("imexd.cfg"), "forged").unwrap();
    std::fs::write(outside.join("nodes.cfg"), "10.0.0.1\n").unwrap();
    // Case 2: another claim's spec, and a path, as `cdiSpecFile`.
    let spec_name = spec.file_name().unwrap().to_str().unwrap().to_owned();
    forge(&node, &uid(1), &healthy, json!({"cdiSpecFile": spec_name}));
    forge(&node, &uid(2), &healthy, json!({"cdiSpecFile": "../../outside/victim"}));
    // Case 7: a path as `domainUid`.
    let mut domain = healthy["computeDomain"].clone();
    domain["domainUid"] = json!(outside);
    forge(&node, &uid(3), &healthy, json!({"state": "PrepareCompleted", "computeDomain": domain.clone()}));
    domain["domainUid"] = json!("../../../../outside");
    forge(&node, &uid(4), &healthy, json!({"state": "PrepareCompleted", "computeDomain": domain}));
    // Case 1: the created device nodes' list naming a path outside.
    std::fs::write(node.state().join("device-nodes.json"), json!([victim]).to_string()).unwrap();
    // Case 6: a stranger called nvidia-imex with the domain's configuration.
    let config = node.state().join("domains").join(&domain_uid).join("imexd.cfg");
    let mut stranger = Stranger::start(&node.dirs.root.path().join("stranger"), &config);

    let options = node.options.clone();
    node.restart_with(&cluster.rt, &options);
    let log = node.process.log();
    let damaged: Vec<&str> = log.lines().filter(|l| l.contains(DAMAGED_LINE)).collect();
    assert_eq!(damaged.len(), 5, "one line per forged file:\n{log}");
    for n in 1..=4 {
        let aside = node.state().join("checkpoint").join(format!("{}.json.damaged", uid(n)));
        assert!(aside.exists(), "{} set aside\n{log}", uid(n));
    }
    assert!(node.state().join("device-nodes.json.damaged").exists());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(spec.exists(), "the healthy claim's spec is kept");
    assert_eq!(node.files(&outside).len(), 3, "nothing written outside: {:?}", node.files(&outside));
    assert!(stranger.alive(), "the stranger is not signalled");
    // The healthy claim is still prepared, served by the agent's own daemon.
    let again = node.prepare(&cluster.rt, std::slice::from_ref(&channel)).remove(0).unwrap();
    assert_eq!(again, ids);
    let starts = node.imex_log().iter().filter(|l| l.starts_with("start ")).count();
    assert_eq!(starts, 1, "the agent's daemon adopted, none started on the outside files: {:?}", node.imex_log());
    cluster.rt.block_on(node.kubelet.unprepare(&node.plugin, std::slice::from_ref(&channel))).unwrap();
    let last = node.imex_log().last().cloned().unwrap_or_default();
    assert_eq!(last, format!("stop {}", config.display()), "the agent's own daemon is stopped");
    assert!(stranger.alive(), "the stranger is still not signalled");
    assert!(!spec.exists());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
}
