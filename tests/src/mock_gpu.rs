//! A GPU node whose NVML is the mock `libnvidia-ml` (`tests/mock-nvml`),
//! built from a fake inventory: the table of GPUs, MIG modes, profiles,
//! placements and an administrator's instances; a driver root the plugin
//! loads it from; `/sys` and `/proc` (boot id, device majors) under a
//! temporary root; the mock's instance state and capability files there
//! too, so instances the plugin makes survive its restarts and can be
//! inspected.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_dra_driver::driver_root::fake_tree::{self, LIBDIR};
use gpu_dra_driver::inventory::nvml::names;
use gpu_dra_driver::inventory::{Gpu, Inventory, MigMode, fake};
use gpu_dra_driver::names::NodeName;

use crate::plugin_process::PluginOptions;
use crate::workspace_root;

const DRIVER_VERSION: &str = "580.82.07";
pub const BOOT_ID: &str = "4b1c2a55-7d0e-4f6a-9c3b-2e1d0f9a8b7c";

/// The NVML code whose name is `name` (inverting the plugin's own table).
fn code(name: &str, names: fn(u32) -> &'static str) -> u32 {
    (0..64).find(|&c| names(c) == name).unwrap_or_else(|| panic!("no NVML code for {name}"))
}

/// One GPU instance in the mock's state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockInstance {
    pub gpu_instance_id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub has_compute_instance: bool,
    pub uuid: String,
}

pub struct MockGpuNode {
    pub dir: tempfile::TempDir,
    pub inventory: Inventory,
}

impl MockGpuNode {
    /// A node for `inventory_yaml` (a fake inventory: its GPUs' UUIDs,
    /// models, MIG layouts, `dynamic: true` for MIG mode with no instances).
    pub fn new(inventory_yaml: &str) -> Self {
        let inventory = fake::parse(inventory_yaml, &NodeName::new("node-a").expect("node")).expect("inventory");
        let node = MockGpuNode { dir: tempfile::tempdir().expect("temp dir"), inventory };
        let root = node.driver_root();
        fake_tree::build(&root, DRIVER_VERSION, &[("libcuda.so", "libcuda.so.1")]).expect("driver root");
        let nvml = root.join(LIBDIR).join(format!("libnvidia-ml.so.{DRIVER_VERSION}"));
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", "-o"])
            .arg(&nvml)
            .arg(workspace_root().join("tests/mock-nvml/mock_nvml.c"))
            .status()
            .expect("cc");
        assert!(built.success(), "building the mock NVML");
        assert!(Command::new("ldconfig").arg("-r").arg(&root).status().expect("ldconfig").success());
        std::fs::write(node.table(), node.table_text()).expect("table");
        node.sys_tree();
        let proc = node.proc_root();
        std::fs::create_dir_all(proc.join("sys/kernel/random")).expect("proc");
        std::fs::write(proc.join("sys/kernel/random/boot_id"), format!("{BOOT_ID}\n")).expect("boot id");
        std::fs::write(
            proc.join("devices"),
            "Character devices:\n195 nvidia\n235 nvidia-uvm\n236 nvidia-caps\n\nBlock devices:\n8 sd\n",
        )
        .expect("devices");
        node
    }

    pub fn driver_root(&self) -> PathBuf {
        self.dir.path().join("driver")
    }

    pub fn proc_root(&self) -> PathBuf {
        self.dir.path().join("proc")
    }

    pub fn table(&self) -> PathBuf {
        self.dir.path().join("nvml-table")
    }

    /// The mock's instance table (`MOCK_NVML_STATE`).
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("nvml-state")
    }

    /// Plugin options that discover through the mock, with `gates`.
    pub fn plugin_options(&self, gates: &str) -> PluginOptions {
        let path = |p: PathBuf| p.display().to_string();
        PluginOptions {
            fake_inventory: false,
            log_level: "info".into(),
            extra_args: vec![
                "--driver-root".into(),
                path(self.driver_root()),
                "--sys-root".into(),
                path(self.dir.path().join("sys")),
                "--proc-root".into(),
                path(self.proc_root()),
                "--feature-gates".into(),
                gates.into(),
            ],
            env: vec![
                ("MOCK_NVML_TABLE".into(), path(self.table())),
                ("MOCK_NVML_STATE".into(), path(self.state())),
                ("MOCK_NVML_PROC_ROOT".into(), path(self.proc_root())),
            ],
            ..PluginOptions::default()
        }
    }

    /// The GPU instances per GPU minor, as the mock holds them now (the
    /// table's, until the first change writes the state file).
    pub fn instances(&self) -> BTreeMap<u32, Vec<MockInstance>> {
        let mut out: BTreeMap<u32, Vec<MockInstance>> = BTreeMap::new();
        for gpu in &self.inventory.gpus {
            out.insert(gpu.minor, Vec::new());
        }
        let Ok(text) = std::fs::read_to_string(self.state()) else {
            for gpu in &self.inventory.gpus {
                if let MigMode::Enabled(migs) = &gpu.mig {
                    let list = out.entry(gpu.minor).or_default();
                    list.extend(migs.iter().map(|m| MockInstance {
                        gpu_instance_id: m.gpu_instance_id,
                        profile_id: m.profile.gi_profile_id,
                        start: m.placement.start,
                        size: m.placement.size,
                        has_compute_instance: true,
                        uuid: m.uuid.clone(),
                    }));
                }
            }
            return out;
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split('|').collect();
            if f.len() == 10 && f[0] == "gi" {
                let n = |i: usize| f[i].parse::<u32>().expect("number in the mock's state");
                out.entry(n(1)).or_default().push(MockInstance {
                    gpu_instance_id: n(2),
                    profile_id: n(3),
                    start: n(4),
                    size: n(5),
                    has_compute_instance: f[6] == "1",
                    uuid: if f[9] == "-" { String::new() } else { f[9].to_string() },
                });
            }
        }
        out
    }

    /// Makes the mock report processes on GPU `minor` (NVML_ERROR_IN_USE
    /// for destroying its instances or switching its MIG mode).
    pub fn set_busy(&self, minor: Option<u32>) {
        let path = PathBuf::from(format!("{}.busy", self.state().display()));
        match minor {
            Some(minor) => std::fs::write(path, format!("{minor}\n")).expect("busy file"),
            None => {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// The capability file's minor for GPU instance `gi` (and `ci`) of GPU `minor`.
    pub fn cap_minor(&self, minor: u32, gi: u32, ci: Option<u32>) -> Option<u32> {
        let mut path = self.proc_root().join(format!("driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}"));
        if let Some(ci) = ci {
            path.push(format!("ci{ci}"));
        }
        let text = std::fs::read_to_string(path.join("access")).ok()?;
        text.lines().find_map(|l| l.strip_prefix("DeviceFileMinor:")).and_then(|v| v.trim().parse().ok())
    }

    fn table_text(&self) -> String {
        let inventory = &self.inventory;
        let mut t = format!("driver|{DRIVER_VERSION}\n");
        let cuda = inventory.cuda_driver_version.to_string();
        let mut parts = cuda.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        writeln!(t, "cuda|{}", major * 1000 + minor * 10).unwrap();
        for g in &inventory.gpus {
            let (cc_major, cc_minor) = g.cuda_compute_capability.as_str().split_once('.').expect("compute capability");
            let cc_minor = cc_minor.split('.').next().unwrap_or("0");
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
                g.pci_bus_id.expect("bus id"),
                g.numa_node.unwrap_or(0),
            )
            .unwrap();
            mig_lines(&mut t, g);
        }
        t
    }

    fn sys_tree(&self) {
        let sys = self.dir.path().join("sys");
        for g in &self.inventory.gpus {
            let bdf = g.pci_bus_id.expect("bus id").to_string();
            let root = g.pcie_root.clone().unwrap_or_else(|| "pci0000:00".into());
            let device = sys.join("devices").join(&root).join(&bdf);
            std::fs::create_dir_all(&device).expect("sys");
            std::fs::write(device.join("numa_node"), format!("{}\n", g.numa_node.unwrap_or(0))).expect("numa");
            let links = sys.join("bus/pci/devices");
            std::fs::create_dir_all(&links).expect("sys");
            let target = format!("../../../devices/{root}/{bdf}");
            std::os::unix::fs::symlink(target, links.join(&bdf)).expect("symlink");
        }
    }
}

/// MIG mode, the profiles with their placements, and the instances.
fn mig_lines(t: &mut String, g: &Gpu) {
    let instances = match &g.mig {
        MigMode::Disabled => return,
        MigMode::Enabled(migs) | MigMode::Dynamic(migs) => migs,
    };
    writeln!(t, "migmode|{}", g.minor).unwrap();
    if let Some(caps) = &g.mig_capabilities {
        for p in &caps.profiles {
            let q = &p.profile;
            writeln!(
                t,
                "profile|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
                g.minor,
                p.profile_index,
                q.gi_profile_id,
                p.compute_slices,
                p.max_count,
                q.multiprocessors,
                q.copy_engines,
                q.decoders,
                q.encoders,
                q.jpeg_engines,
                q.ofa_engines,
                q.memory_bytes >> 20,
                q.name
            )
            .unwrap();
            for placement in &p.placements {
                writeln!(t, "placement|{}|{}|{}|{}", g.minor, q.gi_profile_id, placement.start, placement.size)
                    .unwrap();
            }
        }
    }
    for m in instances {
        writeln!(
            t,
            "mig|{}|{}|{}|{}|{}|{}|{}",
            g.minor,
            m.uuid,
            m.gpu_instance_id,
            m.compute_instance_id,
            m.profile.gi_profile_id,
            m.placement.start,
            m.placement.size
        )
        .unwrap();
    }
}

/// Whether `path` holds `needle` (a spec, a log).
pub fn file_contains(path: &Path, needle: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle))
}
