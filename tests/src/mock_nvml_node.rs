//! A node whose NVML is the mock (`tests/mock-nvml/mock_nvml.c`, built with
//! the system `cc`), installed in a fake driver root, with the device table
//! written from a fake inventory and load figures (utilization, memory,
//! power, ...) the test sets and changes while the plugin runs
//! (`MOCK_NVML_TELEMETRY`).
//!
//! (`tests/tests/mock_nvml.rs` has its own copy of the table writer, with
//! NVLink and fabric lines; this one writes what telemetry needs: GPUs,
//! MIG profiles and instances.)

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_dra_driver::driver_root::fake_tree::{self, LIBDIR};
use gpu_dra_driver::inventory::catalog::Catalog;
use gpu_dra_driver::inventory::nvml::names;
use gpu_dra_driver::inventory::{Inventory, MigMode, fake};
use gpu_dra_driver::names::NodeName;

use crate::workspace_root;

/// One device's load figures; `None` is "not supported" for that call.
#[derive(Debug, Clone, Default)]
pub struct Load {
    pub gpu_util: Option<u32>,
    pub memory_util: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub power_milliwatts: Option<u32>,
    pub temperature_celsius: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
}

impl Load {
    /// A busy or idle whole GPU: every figure, utilization `percent`.
    pub fn gpu(percent: u32) -> Self {
        Load {
            gpu_util: Some(percent),
            memory_util: Some(percent / 2),
            memory_used_bytes: Some(4 << 30),
            power_milliwatts: Some(100_000 + percent * 3_000),
            temperature_celsius: Some(40 + percent / 4),
            sm_clock_mhz: Some(1980),
            ecc_corrected: Some(1),
            ecc_uncorrected: Some(0),
        }
    }

    /// What NVML gives for a MIG device: memory only.
    pub fn mig(memory_used_bytes: u64) -> Self {
        Load { memory_used_bytes: Some(memory_used_bytes), ..Load::default() }
    }

    fn line(&self, uuid: &str) -> String {
        fn f<T: ToString>(v: Option<T>) -> String {
            v.map_or_else(|| "-".into(), |v| v.to_string())
        }
        format!(
            "load|{uuid}|{}|{}|{}|{}|{}|{}|{}|{}\n",
            f(self.gpu_util),
            f(self.memory_util),
            f(self.memory_used_bytes),
            f(self.power_milliwatts),
            f(self.temperature_celsius),
            f(self.sm_clock_mhz),
            f(self.ecc_corrected),
            f(self.ecc_uncorrected)
        )
    }
}

pub struct MockNvmlNode {
    pub dir: tempfile::TempDir,
    pub inventory: Inventory,
}

impl MockNvmlNode {
    /// From fake-inventory YAML: builds the mock into a fake driver root
    /// and writes its table, `/sys` and the boot id.
    pub fn new(inventory_yaml: &str) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("inventory.yaml");
        std::fs::write(&file, inventory_yaml).expect("inventory file");
        let inventory = fake::load(&file, &NodeName::new("node-a").expect("node name")).expect("fake inventory");
        let node = MockNvmlNode { dir, inventory };
        // The driver's own spelling (`570.172.08`), as NVML reports it.
        let version = inventory_yaml
            .lines()
            .find_map(|l| l.trim().strip_prefix("driverVersion:"))
            .map_or_else(|| node.inventory.driver_version.to_string(), |v| v.trim().trim_matches('"').to_string());
        let root = node.root();
        fake_tree::build(&root, &version, &[("libcuda.so", "libcuda.so.1")]).expect("driver root");
        let nvml = root.join(LIBDIR).join(format!("libnvidia-ml.so.{version}"));
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", "-o"])
            .arg(&nvml)
            .arg(workspace_root().join("tests/mock-nvml/mock_nvml.c"))
            .status()
            .expect("running cc");
        assert!(built.success(), "building the mock NVML");
        assert!(Command::new("ldconfig").arg("-r").arg(&root).status().expect("ldconfig").success());
        std::fs::write(node.table(), table(&node.inventory, &version)).expect("table");
        sys_tree(&node.dir.path().join("sys"), &node.inventory);
        proc_tree(&node.dir.path().join("proc"), &node.inventory);
        let boot_id = node.dir.path().join("proc/sys/kernel/random");
        std::fs::create_dir_all(&boot_id).expect("proc");
        std::fs::write(boot_id.join("boot_id"), "4b1c2a55-7d0e-4f6a-9c3b-2e1d0f9a8b7c\n").expect("boot id");
        node
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("driver")
    }

    pub fn table(&self) -> PathBuf {
        self.dir.path().join("nvml-table")
    }

    pub fn telemetry_file(&self) -> PathBuf {
        self.dir.path().join("nvml-telemetry")
    }

    /// Flags that make the plugin discover through the mock.
    pub fn args(&self) -> Vec<String> {
        let path = |p: &str| self.dir.path().join(p).display().to_string();
        vec![
            "--driver-root".into(),
            self.root().display().to_string(),
            "--sys-root".into(),
            path("sys"),
            "--proc-root".into(),
            path("proc"),
            // Missing device nodes are made here, never in the real /dev.
            "--dev-root".into(),
            path("dev"),
        ]
    }

    /// The variables the mock reads.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("MOCK_NVML_TABLE".into(), self.table().display().to_string()),
            ("MOCK_NVML_TELEMETRY".into(), self.telemetry_file().display().to_string()),
        ]
    }

    /// Sets the load figures, by device UUID (others: none), atomically.
    pub fn set_loads(&self, loads: &[(&str, Load)]) {
        let text: String = loads.iter().map(|(uuid, load)| load.line(uuid)).collect();
        let tmp = self.dir.path().join("nvml-telemetry.tmp");
        std::fs::write(&tmp, text).expect("load figures");
        std::fs::rename(&tmp, self.telemetry_file()).expect("load figures");
    }

    /// The UUID of the published device `name`.
    pub fn uuid(&self, name: &str) -> String {
        let name = gpu_dra_driver::names::DeviceName::new(name).expect("device name");
        match self.inventory.find_device(&name).unwrap_or_else(|| panic!("no device {name}")) {
            gpu_dra_driver::inventory::PublishedDevice::Gpu(g) => g.uuid.clone(),
            gpu_dra_driver::inventory::PublishedDevice::Mig { mig, .. } => mig.uuid.clone(),
            gpu_dra_driver::inventory::PublishedDevice::DynamicMig { .. } => {
                panic!("{name} is a dynamic MIG device: it has no UUID until a claim makes it")
            }
        }
    }
}

/// The NVML code whose name is `name` (inverting the plugin's own table).
fn code(name: &str, names: fn(u32) -> &'static str) -> u32 {
    (0..64).find(|&c| names(c) == name).unwrap_or_else(|| panic!("no NVML code for {name}"))
}

fn table(inventory: &Inventory, version: &str) -> String {
    let catalog = Catalog::embedded().expect("catalog");
    let mut t = format!("driver|{version}\n");
    let cuda = inventory.cuda_driver_version.to_string();
    let mut parts = cuda.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let _ = writeln!(t, "cuda|{}", major * 1000 + minor * 10);
    for g in &inventory.gpus {
        let cc = g.cuda_compute_capability.to_string();
        let mut cc = cc.split('.');
        let _ = writeln!(
            t,
            "gpu|{}|{}|{}|{}|{}|{}|{}|{}|{}|0x233010DE|{}",
            g.minor,
            g.uuid,
            g.product_name,
            code(&g.brand, names::brand_name),
            code(&g.architecture, names::architecture_name),
            cc.next().unwrap_or("0"),
            cc.next().unwrap_or("0"),
            g.memory_bytes,
            g.pci_bus_id.expect("bus id"),
            g.numa_node.unwrap_or(0),
        );
        let MigMode::Enabled(migs) = &g.mig else { continue };
        let model = catalog.models.values().find(|m| m.product_name == g.product_name).expect("catalog model");
        let _ = writeln!(t, "migmode|{}", g.minor);
        for p in &model.mig_profiles {
            let index = match (p.compute_slices, p.name.contains("+me"), p.memory_slices) {
                (1, true, _) => 7,
                (2, true, _) => 8,
                (1, false, 2) => 9,
                (1, false, _) => 0,
                (2, ..) => 1,
                (3, ..) => 2,
                (4, ..) => 3,
                (7, ..) => 4,
                (8, ..) => 5,
                (6, ..) => 6,
                (n, ..) => panic!("no NVML profile index for {n} slices"),
            };
            let _ = writeln!(
                t,
                "profile|{}|{index}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
                g.minor,
                p.gi_profile_id,
                p.compute_slices,
                p.max_count,
                p.multiprocessors,
                p.copy_engines,
                p.decoders,
                p.encoders,
                p.jpeg_engines,
                p.ofa_engines,
                p.memory_mib,
                p.name
            );
        }
        for m in migs {
            let _ = writeln!(
                t,
                "mig|{}|{}|{}|{}|{}|{}|{}",
                g.minor,
                m.uuid,
                m.gpu_instance_id,
                m.compute_instance_id,
                m.profile.gi_profile_id,
                m.placement.start,
                m.placement.size
            );
        }
    }
    t
}

/// `/proc/devices` (the majors of nvidia-uvm and nvidia-caps) and the MIG
/// capability minors.
fn proc_tree(proc: &Path, inventory: &Inventory) {
    std::fs::create_dir_all(proc.join("driver/nvidia-caps")).expect("proc");
    std::fs::write(
        proc.join("devices"),
        "Character devices:\n195 nvidia\n235 nvidia-caps\n508 nvidia-uvm\n\nBlock devices:\n8 sd\n",
    )
    .expect("proc/devices");
    let mut minors = String::new();
    let mut next = 1;
    for g in &inventory.gpus {
        let MigMode::Enabled(migs) = &g.mig else { continue };
        for m in migs {
            let gi = format!("gpu{}/gi{}", g.minor, m.gpu_instance_id);
            let _ = writeln!(minors, "{gi}/access {next}");
            let _ = writeln!(minors, "{gi}/ci{}/access {}", m.compute_instance_id, next + 1);
            next += 2;
        }
    }
    std::fs::write(proc.join("driver/nvidia-caps/mig-minors"), minors).expect("mig-minors");
}

/// `/sys/bus/pci/devices/<bdf>` links into a PCIe root, with `numa_node`.
fn sys_tree(sys: &Path, inventory: &Inventory) {
    for g in &inventory.gpus {
        let bdf = g.pci_bus_id.expect("bus id").to_string();
        let root = g.pcie_root.clone().expect("pcie root");
        let device = sys.join("devices").join(&root).join(&bdf);
        std::fs::create_dir_all(&device).expect("sys");
        std::fs::write(device.join("numa_node"), format!("{}\n", g.numa_node.unwrap_or(0))).expect("sys");
        let links = sys.join("bus/pci/devices");
        std::fs::create_dir_all(&links).expect("sys");
        std::os::unix::fs::symlink(format!("../../../devices/{root}/{bdf}"), links.join(&bdf)).expect("sys");
    }
}
