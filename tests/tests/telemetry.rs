//! Per-device and per-claim telemetry and idle-claim warnings, end to end:
//! the real plugin on the mock NVML with load figures this test sets, the
//! API-server stand-in holding the claims, the kubelet stand-in preparing
//! them. Also what dcgm-exporter's DRA mode reads from our slices, and the
//! sampling cost (printed, not asserted).

use std::time::{Duration, Instant};

use integration_tests::claim_fixtures::{self, Allocated, allocated_claim};
use integration_tests::kubelet::{KubeletConfig, claim};
use integration_tests::mock_gpu::MockGpuNode;
use integration_tests::mock_nvml_node::{Load, MockNvmlNode, write_loads};
use integration_tests::node::{DRIVER, NODE, RunningNode};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess, scrape_metrics};
use integration_tests::wait;
use integration_tests::{kubelet_plugin, stdout_ok, workspace_root};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;

const WAIT: Duration = Duration::from_secs(60);

const TWO_H100: &str =
    "driverVersion: \"580.82.07\"\ncudaDriverVersion: \"13.0\"\ngpus:\n  - model: H100-80GB\n    count: 2\n";
const ONE_A100_MIG: &str = "driverVersion: \"570.172.08\"\ncudaDriverVersion: \"12.8\"\ngpus:\n  - model: A100-SXM4-80GB\n    count: 1\n    mig:\n      - gpus: [0]\n        instances: [3g.40gb, 2g.20gb, {profile: 1g.10gb, start: 6}]\n";

/// The plugin's flags for the mock and a fast telemetry loop.
fn options(node: &MockNvmlNode, extra: &[&str]) -> PluginOptions {
    let mut extra_args = node.args();
    extra_args.extend(["--telemetry-interval-ms", "200"].map(String::from));
    extra_args.extend(extra.iter().map(|s| (*s).to_string()));
    PluginOptions {
        fake_inventory: false,
        metrics_addr: "127.0.0.1:0".into(),
        extra_args,
        env: node.env(),
        ..PluginOptions::default()
    }
}

fn metrics_addr(process: &mut PluginProcess) -> String {
    process.metrics_addr(WAIT).unwrap_or_else(|| panic!("no metrics address in\n{}", process.log()))
}

fn scrape(addr: &str) -> String {
    scrape_metrics(addr).expect("GET /metrics")
}

/// The lines of `family` (exactly: `name{` or `name `).
fn lines<'a>(text: &'a str, family: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(&format!("{family}{{")) || l.starts_with(&format!("{family} "))).collect()
}

fn wait_until(what: &str, log: &dyn Fn() -> String, done: impl FnMut() -> bool) {
    wait::wait_until(what, WAIT, done, log);
}

/// Stores `default/<name>` allocated `devices` of the node, reserved for
/// `pods`; returns the kubelet's reference and the claim's UID.
fn store_claim(
    node: &RunningNode,
    name: &str,
    devices: &[&str],
    pods: &[&str],
) -> (kubelet_proto::dra_v1::Claim, String) {
    let results: Vec<Allocated> = devices.iter().map(|d| Allocated::new("gpu", NODE, d)).collect();
    let mut object = allocated_claim("default", name, &results, vec![]);
    if let Some(status) = object.status.as_mut() {
        status.reserved_for = Some(
            pods.iter()
                .map(|p| ResourceClaimConsumerReference {
                    api_group: None,
                    resource: "pods".into(),
                    name: (*p).into(),
                    uid: format!("uid-{p}"),
                })
                .collect(),
        );
    }
    let uid = claim_fixtures::store(&node.server, &object).expect("storing the claim");
    (claim("default", name, &uid), uid)
}

fn idle_events(node: &RunningNode) -> Vec<Event> {
    let events: Vec<Event> = node.server.list(Some("default"), "").expect("listing events");
    events.into_iter().filter(|e| e.reason.as_deref() == Some("GpuClaimIdle")).collect()
}

#[test]
fn a_prepared_claims_metrics_carry_it_and_an_idle_claim_is_warned_until_busy() {
    let gpus = MockNvmlNode::new(TWO_H100);
    let (gpu0, gpu1) = (gpus.uuid("gpu-0"), gpus.uuid("gpu-1"));
    gpus.set_loads(&[(&gpu0, Load::gpu(2)), (&gpu1, Load::gpu(90))]);
    let opts = options(&gpus, &["--idle-window-seconds", "2", "--idle-threshold-percent", "5"]);
    let mut node = RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), opts);
    let addr = metrics_addr(&mut node.process);
    let log = || node.process.log();

    // Before any claim: device readings without claim labels.
    wait_until("readings of gpu-1", &log, || {
        lines(&scrape(&addr), "gpu_dra_device_gpu_utilization_percent").iter().any(|l| l.contains("device=\"gpu-1\""))
    });

    let (claim_ref, uid) = store_claim(&node, "notebook-gpu", &["gpu-0"], &["notebook"]);
    let answers = node.prepare(std::slice::from_ref(&claim_ref));
    assert!(answers[&uid].is_ok(), "{answers:?}");
    let held = |text: &str| -> Option<String> {
        lines(text, "gpu_dra_device_gpu_utilization_percent")
            .into_iter()
            .find(|l| l.contains("device=\"gpu-0\"") && l.contains("claim_name=\"notebook-gpu\""))
            .map(str::to_owned)
    };
    wait_until("gpu-0 labelled with its claim", &log, || held(&scrape(&addr)).is_some());
    let text = scrape(&addr);
    let line = held(&text).unwrap();
    for label in [
        format!("uuid=\"{gpu0}\""),
        "model=\"NVIDIA H100 80GB HBM3\"".to_string(),
        "claim_namespace=\"default\"".to_string(),
        format!("claim_uid=\"{uid}\""),
        "pods=\"notebook\"".to_string(),
    ] {
        assert!(line.contains(&label), "{label} missing in {line}");
    }
    assert!(line.ends_with(" 2.0"), "{line}");
    let power = lines(&text, "gpu_dra_device_power_watts");
    assert!(power.iter().any(|l| l.contains("device=\"gpu-1\"") && l.ends_with(" 370.0")), "{power:?}");
    assert_eq!(lines(&text, "gpu_dra_prepared_claims"), ["gpu_dra_prepared_claims 1.0"]);
    assert_eq!(lines(&text, "gpu_dra_allocated_devices"), ["gpu_dra_allocated_devices 1.0"]);

    // Idle past the 2 s window: a Warning on the claim and on its pod.
    wait_until("the idle-claim Events", &log, || idle_events(&node).len() == 2);
    let events = idle_events(&node);
    let mut about: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            let r = e.regarding.clone().unwrap_or_default();
            (r.kind.unwrap_or_default(), r.name.unwrap_or_default())
        })
        .collect();
    about.sort();
    assert_eq!(about, [("Pod".to_string(), "notebook".to_string()), ("ResourceClaim".into(), "notebook-gpu".into())]);
    let note = events[0].note.clone().unwrap_or_default();
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(note.contains("default/notebook-gpu holds device gpu-0 at an average GPU utilization of 2.0%"), "{note}");
    assert!(note.contains("over the last 2s (idle threshold 5%)"), "{note}");
    let text = scrape(&addr);
    assert_eq!(lines(&text, "gpu_dra_idle_claims"), ["gpu_dra_idle_claims 1.0"]);
    let idle = lines(&text, "gpu_dra_claim_idle_utilization_percent");
    assert!(
        idle.len() == 1 && idle[0].contains("claim_name=\"notebook-gpu\"") && idle[0].contains("devices=\"gpu-0\""),
        "{idle:?}"
    );

    // Busy again: the warnings go.
    gpus.set_loads(&[(&gpu0, Load::gpu(80)), (&gpu1, Load::gpu(90))]);
    wait_until("the idle-claim Events to go", &log, || idle_events(&node).is_empty());
    wait_until("no idle claim in the metrics", &log, || {
        lines(&scrape(&addr), "gpu_dra_idle_claims") == ["gpu_dra_idle_claims 0.0"]
    });

    // Unprepared: its labels go with it.
    node.unprepare(&[claim_ref]);
    wait_until("the claim's labels to go", &log, || {
        let text = scrape(&addr);
        held(&text).is_none() && lines(&text, "gpu_dra_prepared_claims") == ["gpu_dra_prepared_claims 0.0"]
    });
    assert!(idle_events(&node).is_empty());
}

/// dcgm-exporter's names and labels; a MIG device has memory but no
/// utilization (NVML gives none: DCGM profiling would), and is never
/// called idle for lack of a number.
#[test]
fn dcgm_naming_and_a_mig_device_without_utilization() {
    let gpus = MockNvmlNode::new(ONE_A100_MIG);
    let device = "gpu-0-mig-1g10gb-19-6";
    let mig = gpus.uuid(device);
    gpus.set_loads(&[(&mig, Load::mig(1 << 30))]);
    let opts =
        options(&gpus, &["--telemetry-names", "dcgm", "--idle-window-seconds", "1", "--idle-threshold-percent", "5"]);
    let mut node = RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), opts);
    let addr = metrics_addr(&mut node.process);
    let log = || node.process.log();
    let (claim_ref, uid) = store_claim(&node, "tiny-llm-mig", &[device], &["tiny-llm"]);
    assert!(node.prepare(std::slice::from_ref(&claim_ref))[&uid].is_ok());
    let held = |text: &str| -> Option<String> {
        lines(text, "DCGM_FI_DEV_FB_USED").into_iter().find(|l| l.contains("pod=\"tiny-llm\"")).map(str::to_owned)
    };
    wait_until("the MIG device's memory with its pod", &log, || held(&scrape(&addr)).is_some());
    let line = held(&scrape(&addr)).unwrap();
    let parent = gpus.inventory.gpus[0].uuid.clone();
    for label in [
        "gpu=\"0\"".to_string(),
        format!("UUID=\"{parent}\""),
        "device=\"nvidia0\"".into(),
        "modelName=\"NVIDIA A100-SXM4-80GB\"".into(),
        "GPU_I_PROFILE=\"1g.10gb\"".into(),
        "Hostname=\"node-a\"".into(),
        "namespace=\"default\"".into(),
        "dra_claim_name=\"tiny-llm-mig\"".into(),
        format!("dra_device_name=\"{device}\""),
        format!("dra_mig_device_uuid=\"{mig}\""),
        "dra_pool_name=\"node-a\"".into(),
    ] {
        assert!(line.contains(&label), "{label} missing in {line}");
    }
    assert!(line.ends_with(" 1024.0"), "MiB: {line}");
    // Several passes later: still no utilization, no idle verdict.
    std::thread::sleep(Duration::from_millis(1500));
    let text = scrape(&addr);
    assert!(lines(&text, "DCGM_FI_DEV_GPU_UTIL").is_empty(), "no zeros for a MIG device:\n{text}");
    assert_eq!(lines(&text, "gpu_dra_idle_claims"), ["gpu_dra_idle_claims 0.0"]);
    assert!(idle_events(&node).is_empty());
}

/// A dynamic MIG device (DynamicMIG gate) made at prepare: while the claim
/// is prepared its memory reading carries the DRA device name, its MIG
/// UUID, the parent GPU's UUID, the profile and the claim; utilization,
/// which NVML does not give per MIG device, is not published; unprepared,
/// the device's lines go.
#[test]
fn a_dynamic_mig_device_is_reported_while_its_claim_is_prepared() {
    let gpu = MockGpuNode::new(
        "gpus:\n  - model: H100-80GB\n    count: 1\n    mig:\n      - gpus: [0]\n        dynamic: true\n",
    );
    let parent = gpu.inventory.gpus[0].uuid.clone();
    let loads = gpu.dir.path().join("nvml-telemetry");
    write_loads(&loads, &[(&parent, Load::gpu(40))]);
    let mut opts = gpu.plugin_options("DynamicMIG=true");
    opts.metrics_addr = "127.0.0.1:0".into();
    opts.extra_args.extend(["--telemetry-interval-ms", "200"].map(String::from));
    opts.env.push(("MOCK_NVML_TELEMETRY".into(), loads.display().to_string()));
    let mut node = RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), opts);
    let addr = metrics_addr(&mut node.process);
    let log = || node.process.log();
    let device = "gpu-0-mig-1g10gb-19-6";
    let mentions = |text: &str| text.lines().any(|l| l.contains(&format!("device=\"{device}\"")));
    wait_until("the parent GPU's reading", &log, || {
        lines(&scrape(&addr), "gpu_dra_device_gpu_utilization_percent").iter().any(|l| l.contains(&parent))
    });
    assert!(!mentions(&scrape(&addr)), "no line for a MIG device not made yet");

    let (claim_ref, uid) = store_claim(&node, "tiny-llm-mig", &[device], &["tiny-llm"]);
    let answers = node.prepare(std::slice::from_ref(&claim_ref));
    assert!(answers[&uid].is_ok(), "{answers:?}\n{}", log());
    let made = gpu.instances().remove(&0).unwrap_or_default();
    assert_eq!(made.len(), 1, "{made:?}");
    let mig = made[0].uuid.clone();
    write_loads(&loads, &[(&parent, Load::gpu(40)), (&mig, Load::mig(3 << 30))]);
    let held = |text: &str| -> Option<String> {
        lines(text, "gpu_dra_device_memory_used_bytes")
            .into_iter()
            .find(|l| l.contains(&format!("device=\"{device}\"")) && l.contains("claim_name=\"tiny-llm-mig\""))
            .map(str::to_owned)
    };
    wait_until("the made MIG device's memory with its claim", &log, || {
        held(&scrape(&addr)).is_some_and(|l| l.ends_with(" 3221225472.0"))
    });
    let text = scrape(&addr);
    let line = held(&text).unwrap_or_default();
    for label in [
        format!("uuid=\"{mig}\""),
        format!("parent_uuid=\"{parent}\""),
        "mig_profile=\"1g.10gb\"".to_string(),
        "model=\"NVIDIA H100 80GB HBM3\"".to_string(),
        "claim_namespace=\"default\"".to_string(),
        format!("claim_uid=\"{uid}\""),
        "pods=\"tiny-llm\"".to_string(),
    ] {
        assert!(line.contains(&label), "{label} missing in {line}");
    }
    for family in ["gpu_dra_device_gpu_utilization_percent", "gpu_dra_device_power_watts"] {
        assert!(
            !lines(&text, family).iter().any(|l| l.contains(&format!("device=\"{device}\""))),
            "{family}: nothing (not a zero) for the MIG device:\n{text}"
        );
    }

    // NVML's share of the prepare is timed apart from the driver's own.
    let count = |operation: &str| format!("gpu_dra_mig_nvml_duration_seconds_count{{operation=\"{operation}\"}} 1");
    assert!(text.contains(&count("prepare")), "{text}");

    node.unprepare(&[claim_ref]);
    wait_until("the MIG device's lines to go", &log, || !mentions(&scrape(&addr)));
    assert!(scrape(&addr).contains(&count("unprepare")));
}

/// dcgm-exporter's DRA mode maps `(pool, device)` back to a GPU through
/// the node's ResourceSlices of driver `gpu.nvidia.com`: attribute `type`
/// (`gpu` or `mig`), `uuid`, and for MIG `parentUUID` and `profile`.
#[test]
fn our_slices_carry_what_dcgm_exporters_dra_mode_reads() {
    let inventory = workspace_root().join("examples/inventories/a100-mig.yaml");
    let out = std::process::Command::new(kubelet_plugin())
        .args(["print-slices", "--node-name", "node-a", "-o", "json", "--fake-inventory"])
        .arg(&inventory)
        .output()
        .expect("print-slices");
    let json: serde_json::Value = serde_json::from_str(&stdout_ok(&out)).expect("JSON");
    let mut kinds = std::collections::BTreeSet::new();
    for slice in json["items"].as_array().expect("items") {
        assert_eq!(slice["spec"]["driver"], "gpu.nvidia.com");
        assert_eq!(slice["spec"]["pool"]["name"], "node-a", "the pool dcgm-exporter keys devices by");
        for device in slice["spec"]["devices"].as_array().into_iter().flatten() {
            let attr = |key: &str| device["attributes"][key]["string"].as_str().map(str::to_owned);
            let kind = attr("type").unwrap_or_else(|| panic!("no type: {device}"));
            let uuid = attr("uuid").unwrap_or_else(|| panic!("no uuid: {device}"));
            match kind.as_str() {
                "gpu" => assert!(uuid.starts_with("GPU-"), "{device}"),
                "mig" => {
                    assert!(uuid.starts_with("MIG-"), "{device}");
                    assert!(attr("parentUUID").is_some_and(|p| p.starts_with("GPU-")), "{device}");
                    assert!(attr("profile").is_some_and(|p| p.contains('g')), "{device}");
                }
                other => panic!("type {other} is one dcgm-exporter skips: {device}"),
            }
            kinds.insert(kind);
        }
    }
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), ["gpu", "mig"]);
}

/// The cost of one NVML pass over 8 GPUs and over 56 MIG devices, and of
/// a `/metrics` scrape, measured on the running plugin (against the mock
/// NVML: the plugin's own cost, not the driver's). Printed, not asserted.
#[test]
fn sampling_cost_for_8_gpus_and_56_mig_devices_is_printed() {
    let eight_h100 =
        "driverVersion: \"580.82.07\"\ncudaDriverVersion: \"13.0\"\ngpus:\n  - model: H100-80GB\n    count: 8\n";
    let eight_a100_mig = format!(
        "driverVersion: \"570.172.08\"\ncudaDriverVersion: \"12.8\"\ngpus:\n  - model: A100-SXM4-80GB\n    count: 8\n    mig:\n      - gpus: [0, 1, 2, 3, 4, 5, 6, 7]\n        instances: [{}]\n",
        ["1g.10gb"; 7].join(", ")
    );
    for (what, yaml, devices) in [("8 GPUs", eight_h100.to_string(), 8), ("56 MIG devices", eight_a100_mig, 56)] {
        let gpus = MockNvmlNode::new(&yaml);
        let loads: Vec<(String, Load)> = gpus
            .inventory
            .published_devices()
            .iter()
            .map(|d| {
                let uuid = match d {
                    gpu_dra_driver::inventory::PublishedDevice::Gpu(g)
                    | gpu_dra_driver::inventory::PublishedDevice::Vfio(g) => g.uuid.clone(),
                    gpu_dra_driver::inventory::PublishedDevice::Mig { mig, .. } => mig.uuid.clone(),
                    gpu_dra_driver::inventory::PublishedDevice::DynamicMig { .. } => {
                        unreachable!("these inventories have no dynamic MIG GPU")
                    }
                };
                (uuid, Load::gpu(50))
            })
            .collect();
        assert_eq!(loads.len(), devices);
        gpus.set_loads(&loads.iter().map(|(u, l)| (u.as_str(), l.clone())).collect::<Vec<_>>());
        let dirs = PluginDirs::new("gpus: []\n").expect("directories");
        let server = integration_tests::apiserver::ApiServer::start_in_thread().expect("API stand-in");
        server.write_kubeconfig(&dirs.kubeconfig).expect("kubeconfig");
        let mut plugin = PluginProcess::spawn(&dirs, &options(&gpus, &[])).expect("plugin");
        let addr = metrics_addr(&mut plugin);
        let mut passes = Vec::new();
        let mut scrapes = Vec::new();
        let deadline = Instant::now() + WAIT;
        while passes.len() < 20 {
            assert!(Instant::now() < deadline, "{}", plugin.log());
            let started = Instant::now();
            let text = scrape(&addr);
            let took = started.elapsed();
            let sampled = lines(&text, "gpu_dra_device_gpu_utilization_percent").len();
            if let Some(value) = lines(&text, "gpu_dra_telemetry_sample_seconds")
                .first()
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                && sampled == devices
            {
                passes.push(value);
                scrapes.push(took.as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(210));
        }
        passes.sort_by(f64::total_cmp);
        scrapes.sort_by(f64::total_cmp);
        println!(
            "telemetry cost, {what}: NVML pass median {:.3} ms (max {:.3} ms); /metrics scrape median {:.3} ms (max {:.3} ms); {} samples",
            passes[passes.len() / 2] * 1e3,
            passes[passes.len() - 1] * 1e3,
            scrapes[scrapes.len() / 2] * 1e3,
            scrapes[scrapes.len() - 1] * 1e3,
            passes.len()
        );
    }
}
