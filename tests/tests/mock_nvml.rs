//! NVML on a machine without a GPU: a mock `libnvidia-ml.so` (C, built here
//! with the system `cc` from `tests/mock-nvml/mock_nvml.c`) installed in a
//! fake driver root and loaded from there, answering from a device table
//! this test writes from a fake inventory. `print-slices` through NVML must
//! then publish exactly what it publishes from the fake inventory: the real
//! nvml-wrapper code paths, end to end.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use gpu_dra_driver::driver_root::fake_tree::{self, LIBDIR};
use gpu_dra_driver::inventory::nvml::names;
use gpu_dra_driver::inventory::{Inventory, fake};
use gpu_dra_driver::names::NodeName;
use integration_tests::{kubelet_plugin, stdout_ok, workspace_root};

/// The NVML code whose name is `name` (inverting the plugin's own table).
fn code(name: &str, names: fn(u32) -> &'static str) -> u32 {
    (0..64).find(|&c| names(c) == name).unwrap_or_else(|| panic!("no NVML code for {name}"))
}

/// The mock's table for `inventory` (whole GPUs; NVLink groups as full meshes).
fn table(inventory: &Inventory, raw_driver_version: &str) -> String {
    let mut t = format!("driver|{raw_driver_version}\n");
    let cuda = inventory.cuda_driver_version.to_string();
    let mut parts = cuda.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    writeln!(t, "cuda|{}", major * 1000 + minor * 10).unwrap();
    for g in &inventory.gpus {
        let (cc_major, cc_minor) = g.cuda_compute_capability.as_str().split_once('.').unwrap();
        let cc_minor = cc_minor.split('.').next().unwrap();
        writeln!(
            t,
            "gpu|{}|{}|{}|{}|{}|{}|{}|{}|{}|0x233010DE|{}",
            g.minor,
            g.uuid,
            g.product_name,
            code(&g.brand, names::brand_name),
            code(&g.architecture, names::architecture_name),
            cc_major,
            cc_minor,
            g.memory_bytes,
            g.pci_bus_id.unwrap(),
            g.numa_node.unwrap_or(0),
        )
        .unwrap();
        let peers = inventory
            .gpus
            .iter()
            .filter(|p| p.minor != g.minor && p.nvlink_group.is_some() && p.nvlink_group == g.nvlink_group);
        for (link, peer) in peers.enumerate() {
            writeln!(t, "link|{}|{link}|{}", g.minor, peer.pci_bus_id.unwrap()).unwrap();
        }
    }
    t
}

/// `/sys/bus/pci/devices/<bdf>` links into a PCIe root, with `numa_node`.
fn sys_tree(sys: &Path, inventory: &Inventory) {
    for g in &inventory.gpus {
        let bdf = g.pci_bus_id.unwrap().to_string();
        let device = sys.join("devices").join(g.pcie_root.as_ref().unwrap()).join(&bdf);
        std::fs::create_dir_all(&device).unwrap();
        std::fs::write(device.join("numa_node"), format!("{}\n", g.numa_node.unwrap_or(0))).unwrap();
        let links = sys.join("bus/pci/devices");
        std::fs::create_dir_all(&links).unwrap();
        let target = format!("../../../devices/{}/{bdf}", g.pcie_root.as_ref().unwrap());
        std::os::unix::fs::symlink(target, links.join(&bdf)).unwrap();
    }
}

#[test]
fn nvml_discovery_publishes_what_the_fake_inventory_does() {
    let example = workspace_root().join("examples/inventories/dgx-h100.yaml");
    let text = std::fs::read_to_string(&example).unwrap();
    let raw_version = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("driverVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap();
    let inventory = fake::load(&example, &NodeName::new("node-a").unwrap()).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("driver");
    fake_tree::build(&root, &raw_version, &[("libcuda.so", "libcuda.so.1")]).unwrap();
    let nvml = root.join(LIBDIR).join(format!("libnvidia-ml.so.{raw_version}"));
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", "-o"])
        .arg(&nvml)
        .arg(workspace_root().join("tests/mock-nvml/mock_nvml.c"))
        .status()
        .unwrap();
    assert!(built.success(), "building the mock NVML");
    assert!(Command::new("ldconfig").arg("-r").arg(&root).status().unwrap().success());
    let table_file = dir.path().join("nvml-table");
    std::fs::write(&table_file, table(&inventory, &raw_version)).unwrap();
    let sys = dir.path().join("sys");
    sys_tree(&sys, &inventory);
    let proc_root = dir.path().join("proc");
    std::fs::create_dir_all(&proc_root).unwrap();

    let print = |extra: &[&str], env: Option<&Path>| {
        let mut cmd = Command::new(kubelet_plugin());
        cmd.args(["print-slices", "--node-name", "node-a", "-o", "json"]).args(extra);
        if let Some(table) = env {
            cmd.env("MOCK_NVML_TABLE", table);
        }
        let out = cmd.output().unwrap();
        let json: serde_json::Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
        json
    };
    let from_fake = print(&["--fake-inventory", example.to_str().unwrap()], None);
    let from_nvml = print(
        &[
            "--driver-root",
            root.to_str().unwrap(),
            "--sys-root",
            sys.to_str().unwrap(),
            "--proc-root",
            proc_root.to_str().unwrap(),
        ],
        Some(&table_file),
    );
    let devices = |v: &serde_json::Value| -> usize {
        v["items"].as_array().unwrap().iter().map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len)).sum()
    };
    assert_eq!(devices(&from_nvml), 8, "{from_nvml}");
    let first = &from_nvml["items"][0]["spec"]["devices"][0]["attributes"];
    for key in
        ["uuid", "productName", "architecture", "driverVersion", "nvlinkGroup", "resource.kubernetes.io/pcieRoot"]
    {
        assert!(!first[key].is_null(), "{key} missing: {first}");
    }
    assert_eq!(from_nvml, from_fake, "NVML through the mock publishes what the fake inventory publishes");
}
