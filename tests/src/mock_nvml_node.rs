//! A node whose NVML is the mock (`tests/mock-nvml/mock_nvml.c`, built with
//! the system `cc`), installed in a fake driver root, with the device table
//! written from a fake inventory and load figures (utilization, memory,
//! power, ...) the test sets and changes while the plugin runs
//! (`MOCK_NVML_TELEMETRY`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use gpu_dra_driver::inventory::{Inventory, MigMode, fake};
use gpu_dra_driver::names::NodeName;

use crate::mock_nvml::{build_library, sys_tree, table, write_boot_id};

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
        build_library(&node.root(), &version);
        std::fs::write(node.table(), table(&node.inventory, &version)).expect("table");
        sys_tree(&node.dir.path().join("sys"), &node.inventory);
        proc_tree(&node.dir.path().join("proc"), &node.inventory);
        write_boot_id(&node.dir.path().join("proc"));
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
        let mut args = discovery_args(self.dir.path());
        // Missing device nodes are made here, never in the real /dev.
        args.extend(["--dev-root".into(), self.dir.path().join("dev").display().to_string()]);
        args
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
        write_loads(&self.telemetry_file(), loads);
    }

    /// The UUID of the published device `name`.
    pub fn uuid(&self, name: &str) -> String {
        let name = gpu_dra_driver::names::DeviceName::new(name).expect("device name");
        match self.inventory.find_device(&name).unwrap_or_else(|| panic!("no device {name}")) {
            gpu_dra_driver::inventory::PublishedDevice::Gpu(g)
            | gpu_dra_driver::inventory::PublishedDevice::Vfio(g) => g.uuid.clone(),
            gpu_dra_driver::inventory::PublishedDevice::Mig { mig, .. } => mig.uuid.clone(),
            gpu_dra_driver::inventory::PublishedDevice::DynamicMig { .. } => {
                panic!("{name} is a dynamic MIG device: it has no UUID until a claim makes it")
            }
        }
    }
}

/// The flags that make discovery (`run` or `print-slices`) go through a
/// mock laid out under `dir`: driver root `driver`, `sys` and `proc`.
pub fn discovery_args(dir: &Path) -> Vec<String> {
    let path = |p: &str| dir.join(p).display().to_string();
    vec!["--driver-root".into(), path("driver"), "--sys-root".into(), path("sys"), "--proc-root".into(), path("proc")]
}

/// Writes the mock's load figures file (`MOCK_NVML_TELEMETRY`) at `path`,
/// by device UUID (others: none), atomically: for nodes built otherwise
/// (e.g. [`crate::mock_gpu::MockGpuNode`], whose MIG devices are made at
/// prepare).
pub fn write_loads(path: &Path, loads: &[(&str, Load)]) {
    let text: String = loads.iter().map(|(uuid, load)| load.line(uuid)).collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("load figures");
    std::fs::rename(&tmp, path).expect("load figures");
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
