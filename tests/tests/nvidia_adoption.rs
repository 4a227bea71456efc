//! The real plugin binary adopts NVIDIA's kubelet plugin's state, in each
//! checkpoint layout NVIDIA's releases wrote (made by `tests/nvidia-state`,
//! a generator following their source, with the kubelet's checksum
//! package; specs written as YAML by the CNCF CDI library), through the
//! kubelet stand-in: a repeated prepare answers NVIDIA's CDI ids without
//! asking the API server, unprepare removes NVIDIA's spec. Forged state
//! adopts nothing and deletes nothing; a failing API server does not stop
//! an adopted claim from being served.

use integration_tests::apiserver::Matcher;
use integration_tests::kubelet::{KubeletConfig, claim};
use integration_tests::node::{DRIVER, NODE, RunningNode, WAIT};
use integration_tests::nvidia_state::{self, NvidiaClaim, NvidiaDevice, NvidiaFormat};
use integration_tests::plugin_process::PluginOptions;
use integration_tests::wait;
use serde_json::json;

const INVENTORY: &str = "gpus:\n  - model: H100-80GB\n    count: 4\n";
const A: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const B: &str = "1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

fn start() -> RunningNode {
    RunningNode::start(INVENTORY, KubeletConfig::new("", DRIVER), PluginOptions::default())
}

fn cdi_id(uid: &str, device: &str) -> String {
    format!("k8s.gpu.nvidia.com/claim={uid}-{device}")
}

fn yaml_spec(node: &RunningNode, uid: &str) -> std::path::PathBuf {
    node.dirs.cdi.join(format!("k8s.gpu.nvidia.com-claim_{uid}.yaml"))
}

/// NVIDIA's spec for `uid`'s `device`, as YAML.
fn write_spec(node: &RunningNode, uid: &str, device: &str, minor: u32) {
    let spec = json!({"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [{"name": format!("{uid}-{device}"), "containerEdits": {
            "deviceNodes": [{"path": format!("/dev/nvidia{minor}")}]}}],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}});
    nvidia_state::write_cdi_yaml(spec.to_string().as_bytes(), &yaml_spec(node, uid));
}

/// The UUID the fake inventory gives `gpu-<minor>`: read from the slices.
fn gpu_uuid(node: &RunningNode, device: &str) -> String {
    let uuid = || {
        let slices: Vec<k8s_openapi::api::resource::v1::ResourceSlice> = node.server.list(None, "").unwrap_or_default();
        slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == device)
            .and_then(|d| d.attributes.as_ref()?.get("uuid")?.string.clone())
    };
    wait::until_some(&format!("a slice naming {device}"), WAIT, uuid, || node.process.log())
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap().trim().to_owned()
}

fn nvidia_dir(node: &RunningNode) -> std::path::PathBuf {
    node.dirs.plugin_dir(DRIVER)
}

/// Stops the plugin, lays NVIDIA's state out, starts it again.
fn switch(node: &mut RunningNode, checkpoint: &[u8]) {
    node.process.terminate(WAIT).expect("SIGTERM");
    std::fs::write(nvidia_dir(node).join("checkpoint.json"), checkpoint).unwrap();
    node.respawn(&PluginOptions::default());
}

fn adopted_line(node: &RunningNode) -> String {
    let log = node.process.log();
    log.lines()
        .find(|l| l.contains("adopted the claims NVIDIA's DRA plugin prepared"))
        .map(str::to_owned)
        .unwrap_or_default()
}

#[test]
fn each_layout_nvidias_releases_wrote_is_adopted_and_served_until_unprepared() {
    for format in NvidiaFormat::all() {
        let mut node = start();
        let uuid = gpu_uuid(&node, "gpu-0");
        // Before v25.12 NVIDIA's plugin also gave its base spec's id.
        let standard = "k8s.gpu.nvidia.com/device=gpu-0".to_owned();
        let ids: Vec<String> = if format.is_v25_12_or_later() {
            vec![cdi_id(A, "gpu-0")]
        } else {
            vec![standard.clone(), cdi_id(A, "gpu-0")]
        };
        let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let device = NvidiaDevice::gpu(&uuid, "gpu", NODE, "gpu-0", &cdi_id(A, "gpu-0")).cdi_ids(&id_refs);
        let mut claims = vec![NvidiaClaim::completed(A, "default", "a", vec![device])];
        if format.has_states() {
            let uuid1 = gpu_uuid(&node, "gpu-1");
            claims.push(NvidiaClaim::started(
                B,
                "default",
                "b",
                vec![NvidiaDevice::gpu(&uuid1, "gpu", NODE, "gpu-1", &cdi_id(B, "gpu-1"))],
            ));
            write_spec(&node, B, "gpu-1", 1);
        }
        write_spec(&node, A, "gpu-0", 0);
        let checkpoint = nvidia_state::checkpoint(format, &boot_id(), &claims);
        nvidia_state::verify(&checkpoint).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        switch(&mut node, &checkpoint);
        let line = adopted_line(&node);
        assert!(line.contains("served=1") && line.contains("refused=0"), "{format:?}: {line}\n{}", node.process.log());
        if format.has_states() {
            assert!(line.contains("interrupted=1"), "{format:?}: {line}");
            assert!(!yaml_spec(&node, B).exists(), "{format:?}: the interrupted prepare's spec stays");
        }

        // The kubelet asks again (a new sandbox): NVIDIA's ids, no API call.
        let gets = node.server.faults().count(&Matcher::new("GET", "/resourceclaims/"), 200);
        let a = claim("default", "a", A);
        let answer = node.prepare(std::slice::from_ref(&a)).remove(A).unwrap();
        let devices = answer.unwrap_or_else(|e| panic!("{format:?}: {e}"));
        assert_eq!(devices[0].cdi_device_ids, ids, "{format:?}");
        assert_eq!(node.server.faults().count(&Matcher::new("GET", "/resourceclaims/"), 200), gets, "{format:?}");
        // gpu-0 is taken: a new claim of ours for it waits.
        let other = node.gpu_claim("other", &["gpu-0"]);
        let busy = node.prepare(std::slice::from_ref(&other)).remove(&other.uid).unwrap().unwrap_err();
        assert!(busy.contains("gpu-0 is already prepared"), "{format:?}: {busy}");

        node.unprepare(std::slice::from_ref(&a));
        assert!(!yaml_spec(&node, A).exists(), "{format:?}: unprepare left NVIDIA's spec");
        assert!(node.records().is_empty(), "{format:?}");
        assert!(node.prepare(std::slice::from_ref(&other)).remove(&other.uid).unwrap().is_ok(), "{format:?}");
    }
}

#[test]
fn forged_state_adopts_nothing_and_deletes_nothing() {
    let mut node = start();
    let uuid = gpu_uuid(&node, "gpu-0");
    // A file the forged entries point at, outside every directory of ours.
    let victim = node.dirs.root.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let traversal = format!("k8s.gpu.nvidia.com/claim=../../{}", victim.display());
    let claims = [
        NvidiaClaim::completed(A, "default", "a", vec![NvidiaDevice::gpu(&uuid, "gpu", NODE, "gpu-0", &traversal)]),
        NvidiaClaim::completed(
            B,
            "default",
            "b",
            vec![NvidiaDevice::gpu(&uuid, "gpu", "node-b", "gpu-0", &cdi_id(B, "gpu-0"))],
        ),
        NvidiaClaim::completed(
            "../../victim",
            "default",
            "c",
            vec![NvidiaDevice::gpu(&uuid, "gpu", NODE, "gpu-1", "x")],
        ),
    ];
    write_spec(&node, A, "gpu-0", 0);
    let checkpoint = nvidia_state::checkpoint(NvidiaFormat::latest(), &boot_id(), &claims);
    switch(&mut node, &checkpoint);
    let line = adopted_line(&node);
    assert!(line.contains("served=0") && line.contains("refused=3"), "{line}\n{}", node.process.log());
    assert!(node.records().is_empty());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(yaml_spec(&node, A).exists(), "start-up deleted a spec that is not ours");
    // Not adopted: the kubelet's prepare is a fresh one, from the API.
    let fresh = node.gpu_claim("fresh", &["gpu-0"]);
    assert!(node.prepare(std::slice::from_ref(&fresh)).remove(&fresh.uid).unwrap().is_ok(), "{}", node.process.log());

    // A symbolic link in NVIDIA's place, and a file that is no checkpoint:
    // left as they are, reported, nothing adopted.
    for (name, bad) in [("symlink", None), ("garbage", Some(b"\x00\x01not json".as_slice()))] {
        node.process.terminate(WAIT).expect("SIGTERM");
        let path = nvidia_dir(&node).join("checkpoint.json");
        let _ = std::fs::remove_file(&path);
        match bad {
            Some(bytes) => std::fs::write(&path, bytes).unwrap(),
            None => std::os::unix::fs::symlink(&victim, &path).unwrap(),
        }
        node.respawn(&PluginOptions::default());
        let log = node.process.log();
        assert!(log.contains("NVIDIA's DRA plugin checkpoint cannot be read"), "{name}: {log}");
        assert!(std::fs::symlink_metadata(&path).is_ok(), "{name}: moved");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep", "{name}");
    }
}

#[test]
fn an_adopted_claim_is_served_while_the_api_server_fails() {
    let mut node = start();
    let uuid = gpu_uuid(&node, "gpu-2");
    let claims = [NvidiaClaim::completed(
        A,
        "default",
        "a",
        vec![NvidiaDevice::gpu(&uuid, "gpu", NODE, "gpu-2", &cdi_id(A, "gpu-2"))],
    )];
    write_spec(&node, A, "gpu-2", 2);
    let checkpoint = nvidia_state::checkpoint(NvidiaFormat::latest(), &boot_id(), &claims);
    node.server.faults().fail_next(Matcher::any(), usize::MAX, 500);
    switch(&mut node, &checkpoint);
    assert!(adopted_line(&node).contains("served=1"), "{}", node.process.log());
    let a = claim("default", "a", A);
    let devices = node.prepare(std::slice::from_ref(&a)).remove(A).unwrap().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(devices[0].cdi_device_ids, [cdi_id(A, "gpu-2")]);
    node.unprepare(std::slice::from_ref(&a));
    assert!(!yaml_spec(&node, A).exists());
    node.server.faults().clear();
}
