//! NVML on a machine without a GPU: a mock `libnvidia-ml.so` (C, built here
//! with the system `cc` from `tests/mock-nvml/mock_nvml.c`) installed in a
//! fake driver root and loaded from there, answering from a device table
//! this test writes from a fake inventory. `print-slices` through NVML must
//! then publish exactly what it publishes from the fake inventory: the real
//! nvml-wrapper code paths, end to end.

use std::path::Path;
use std::process::Command;

use gpu_dra_driver::inventory::catalog::Catalog;
use gpu_dra_driver::inventory::{Inventory, fake};
use gpu_dra_driver::names::NodeName;
use integration_tests::mock_nvml::{build_library, sys_tree, table, write_boot_id};
use integration_tests::mock_nvml_node::discovery_args;
use integration_tests::wait;
use integration_tests::{kubelet_plugin, stdout_ok, workspace_root};

/// A node whose NVML is the mock, from a fake inventory example.
struct MockNode {
    dir: tempfile::TempDir,
    example: std::path::PathBuf,
    inventory: Inventory,
}

impl MockNode {
    fn new(example: &str) -> Self {
        let example = workspace_root().join("examples/inventories").join(example);
        let text = std::fs::read_to_string(&example).unwrap();
        let raw_version = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("driverVersion:"))
            .map(|v| v.trim().trim_matches('"').to_string())
            .unwrap();
        let inventory = fake::load(&example, &NodeName::new("node-a").unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let node = MockNode { dir, example, inventory };
        build_library(&node.root(), &raw_version);
        std::fs::write(node.table(), table(&node.inventory, &raw_version)).unwrap();
        sys_tree(&node.dir.path().join("sys"), &node.inventory);
        write_boot_id(&node.dir.path().join("proc"));
        node
    }

    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("driver")
    }

    fn table(&self) -> std::path::PathBuf {
        self.dir.path().join("nvml-table")
    }

    /// Flags that make the plugin discover through the mock.
    fn args(&self) -> Vec<String> {
        discovery_args(self.dir.path())
    }

    /// The mock delivers `xid` on GPU `minor` at its next event wait.
    fn inject_xid(&self, minor: u32, xid: u32) {
        use std::io::Write;
        let mut events = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(format!("{}.events", self.table().display()))
            .unwrap();
        writeln!(events, "{minor}|{xid}").unwrap();
    }
}

#[test]
fn nvml_discovery_publishes_what_the_fake_inventories_do() {
    for (example, devices) in
        [("dgx-h100.yaml", 8), ("a100-mig.yaml", 12), ("gb200-clique.yaml", 4), ("pcie-nvlink-pairs.yaml", 4)]
    {
        publishes_the_same(example, devices);
    }
}

fn publishes_the_same(example: &str, expected_devices: usize) {
    let node = MockNode::new(example);
    let (from_nvml, from_fake) = print_both(&node, &[]);
    let devices = |v: &serde_json::Value| -> usize {
        v["items"].as_array().unwrap().iter().map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len)).sum()
    };
    assert_eq!(devices(&from_nvml), expected_devices, "{example}: {from_nvml}");
    let first = &from_nvml["items"][0]["spec"]["devices"][0]["attributes"];
    for key in ["uuid", "productName", "architecture", "driverVersion", "resource.kubernetes.io/pcieRoot"] {
        assert!(!first[key].is_null(), "{key} missing: {first}");
    }
    assert_eq!(from_nvml, from_fake, "{example}: NVML through the mock publishes what the fake inventory publishes");
}

/// `print-slices` of `node` through the mock NVML and from its fake
/// inventory, with `extra` flags.
fn print_both(node: &MockNode, extra: &[&str]) -> (serde_json::Value, serde_json::Value) {
    let print = |source: &[String], table: Option<&Path>| {
        let mut cmd = Command::new(kubelet_plugin());
        cmd.args(["print-slices", "--node-name", "node-a", "-o", "json"]).args(extra).args(source);
        if let Some(table) = table {
            cmd.env("MOCK_NVML_TABLE", table);
        }
        let out = cmd.output().unwrap();
        let json: serde_json::Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
        json
    };
    let from_fake = print(&["--fake-inventory".to_string(), node.example.display().to_string()], None);
    let from_nvml = print(&node.args(), Some(&node.table()));
    (from_nvml, from_fake)
}

/// The first device or counter set two `print-slices` outputs disagree on.
fn difference(a: &serde_json::Value, b: &serde_json::Value) -> String {
    let entries = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| {
                let devices = s["spec"]["devices"].as_array().cloned().unwrap_or_default();
                let sets = s["spec"]["sharedCounters"].as_array().cloned().unwrap_or_default();
                devices.into_iter().chain(sets)
            })
            .collect()
    };
    let (x, y) = (entries(a), entries(b));
    match x.iter().zip(&y).find(|(p, q)| p != q) {
        Some((p, q)) => format!("\n{p}\n{q}"),
        None => format!("{} against {} entries, or the slice layout", x.len(), y.len()),
    }
}

/// Dynamic MIG through NVML: the mock reports each model's profiles and
/// placements (A100-40GB, A100-80GB, A30, H100, H200, B200), and
/// `print-slices` with DynamicMIG offers every one of them, for 1.34 and
/// 1.37, exactly as from the fake inventory; the slices pass
/// `validate-slices` for the same release.
#[test]
fn nvml_discovery_offers_every_mig_profile_and_placement() {
    let node = MockNode::new("dynamic-mig.yaml");
    for version in ["1.34", "1.37"] {
        let (from_nvml, from_fake) =
            print_both(&node, &["--feature-gates", "DynamicMIG=true", "--kubernetes-version", version]);
        assert!(
            from_nvml == from_fake,
            "{version}: NVML and fake inventory differ: {}",
            difference(&from_nvml, &from_fake)
        );
        let names: std::collections::BTreeSet<String> = from_nvml["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect();
        let mut expected = std::collections::BTreeSet::new();
        let catalog = Catalog::embedded().unwrap();
        for g in &node.inventory.gpus {
            let model = catalog.models.values().find(|m| m.product_name == g.product_name).unwrap();
            match g.minor {
                0..=5 => {
                    if !g.architecture.starts_with("Ampere") {
                        expected.insert(format!("gpu-{}", g.minor));
                    }
                    for p in &model.mig_profiles {
                        for [start, _] in &p.placements {
                            let label = p.name.replace('.', "").replace('+', "-");
                            expected.insert(format!("gpu-{}-mig-{label}-{}-{start}", g.minor, p.gi_profile_id));
                        }
                    }
                }
                6 => {
                    expected.insert("gpu-6-mig-3g40gb-9-0".into());
                    expected.insert("gpu-6-mig-3g40gb-9-4".into());
                }
                _ => {
                    expected.insert(format!("gpu-{}", g.minor));
                }
            }
        }
        assert_eq!(names, expected, "{version}");
        let counter_sets: Vec<String> = from_nvml["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["spec"]["sharedCounters"].as_array().cloned().unwrap_or_default())
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(counter_sets.len(), 6, "{version}: the static and the whole GPU have no counters: {counter_sets:?}");

        let file = node.dir.path().join(format!("slices-{version}.json"));
        std::fs::write(&file, from_nvml.to_string()).unwrap();
        let out = Command::new(integration_tests::controller())
            .args(["validate-slices", "--kubernetes-version", version, "-f"])
            .arg(&file)
            .output()
            .unwrap();
        let text = stdout_ok(&out);
        assert!(text.lines().all(|l| l.ends_with(": valid")), "{version}: {text}");
    }
}

/// A running plugin on the mock NVML: an injected XID 79 (fallen off the
/// bus) takes its GPU out of service; XID 43 (an application fault) leaves
/// its GPU allocatable, published with effect None on this 1.37 server.
#[test]
fn injected_xids_reach_a_running_plugin_through_nvml_events() {
    use integration_tests::apiserver::ApiServer;
    use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
    use k8s_openapi::api::resource::v1::ResourceSlice;

    let node = MockNode::new("dgx-h100.yaml");
    let server = ApiServer::start_in_thread().unwrap();
    let dirs = PluginDirs::new("gpus: []\n").unwrap();
    server.write_kubeconfig(&dirs.kubeconfig).unwrap();
    let options = PluginOptions {
        fake_inventory: false,
        extra_args: node.args(),
        env: vec![("MOCK_NVML_TABLE".into(), node.table().display().to_string())],
        ..PluginOptions::default()
    };
    let plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let taints = |name: &str| -> Option<Vec<String>> {
        let slices: Vec<ResourceSlice> = server.list(None, "spec.nodeName=node-a").ok()?;
        let device = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).find(|d| d.name == name)?;
        Some(
            device
                .taints
                .iter()
                .flatten()
                .map(|t| format!("{}={}:{}", t.key, t.value.clone().unwrap_or_default(), t.effect))
                .collect(),
        )
    };
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        wait::wait_until(what, std::time::Duration::from_secs(60), done, || plugin.log());
    };
    wait("the slices are published", &|| taints("gpu-7").is_some());
    assert_eq!(taints("gpu-2"), Some(vec![]));
    node.inject_xid(2, 79);
    node.inject_xid(5, 43);
    wait("XID 79 taints gpu-2", &|| taints("gpu-2").is_some_and(|t| !t.is_empty()));
    wait("XID 43 is published", &|| taints("gpu-5").is_some_and(|t| !t.is_empty()));
    assert_eq!(taints("gpu-2"), Some(vec!["gpu.nvidia.com/xid=79:NoSchedule".to_string()]));
    assert_eq!(taints("gpu-5"), Some(vec!["gpu.nvidia.com/xid=43:None".to_string()]), "allocatable");
    assert_eq!(taints("gpu-0"), Some(vec![]));
}
