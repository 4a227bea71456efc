//! A GPU node whose NVML is the mock `libnvidia-ml` (`tests/mock-nvml`),
//! built from a fake inventory: the table of GPUs, MIG modes, profiles,
//! placements and an administrator's instances; a driver root the plugin
//! loads it from; `/sys` under a temporary root; `/proc` (boot id, device
//! majors, MIG capability files) and the mock's instance state in memory,
//! so instances the plugin makes survive its restarts and can be
//! inspected.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpu_dra_driver::inventory::{Inventory, MigMode, fake};
use gpu_dra_driver::names::NodeName;

pub use crate::mock_nvml::BOOT_ID;
use crate::mock_nvml::{build_library, sys_tree, table, write_boot_id};
use crate::plugin_process::PluginOptions;

const DRIVER_VERSION: &str = "580.82.07";

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
    /// What a real node keeps in the kernel and the GPUs rather than on
    /// its disk, in memory where the machine has a tmpfs (`/dev/shm`): the
    /// host's /proc stand-in (`proc/`) and the mock's instance table
    /// (`nvml-state`). The mock rewrites both on every change, fsyncing the
    /// table; on a disk file system those writes would share the journal
    /// with the plugin's own fsyncs and charge the mock's bookkeeping to
    /// the plugin's prepare.
    memory: tempfile::TempDir,
    pub inventory: Inventory,
}

/// A directory in memory (`/dev/shm`) where there is one, else in the
/// system's temporary directory.
fn memory_backed_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("mock-gpu")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("temp dir")
}

impl MockGpuNode {
    /// A node for `inventory_yaml` (a fake inventory: its GPUs' UUIDs,
    /// models, MIG layouts, `dynamic: true` for MIG mode with no instances).
    pub fn new(inventory_yaml: &str) -> Self {
        let inventory = fake::parse(inventory_yaml, &NodeName::new("node-a").expect("node")).expect("inventory");
        let node = MockGpuNode { dir: tempfile::tempdir().expect("temp dir"), memory: memory_backed_dir(), inventory };
        build_library(&node.driver_root(), DRIVER_VERSION);
        std::fs::write(node.table(), table(&node.inventory, DRIVER_VERSION)).expect("table");
        sys_tree(&node.dir.path().join("sys"), &node.inventory);
        let proc = node.proc_root();
        std::fs::create_dir(&proc).expect("proc root");
        write_boot_id(&proc);
        std::fs::write(
            proc.join("devices"),
            "Character devices:\n195 nvidia\n235 nvidia-uvm\n236 nvidia-caps\n\nBlock devices:\n8 sd\n",
        )
        .expect("devices");
        std::fs::create_dir_all(proc.join("driver/nvidia-caps")).expect("nvidia-caps");
        std::fs::write(proc.join("driver/nvidia-caps/mig-minors"), mig_minors(&node.inventory)).expect("mig-minors");
        node
    }

    pub fn driver_root(&self) -> PathBuf {
        self.dir.path().join("driver")
    }

    pub fn proc_root(&self) -> PathBuf {
        self.memory.path().join("proc")
    }

    pub fn table(&self) -> PathBuf {
        self.dir.path().join("nvml-table")
    }

    /// The mock's instance table (`MOCK_NVML_STATE`).
    pub fn state(&self) -> PathBuf {
        self.memory.path().join("nvml-state")
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

    /// Whether GPU `minor` is in MIG mode now (the mock's state file, or
    /// the table's until the first change).
    pub fn mig_mode(&self, minor: u32) -> bool {
        let from_state = std::fs::read_to_string(self.state()).ok().and_then(|text| {
            text.lines().find_map(|line| {
                let f: Vec<&str> = line.split('|').collect();
                (f.len() == 4 && f[0] == "mode" && f[1] == minor.to_string()).then(|| f[2] == "1")
            })
        });
        from_state.unwrap_or_else(|| {
            self.inventory.gpus.iter().any(|g| g.minor == minor && !matches!(g.mig, MigMode::Disabled))
        })
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
}

/// Whether `path` holds `needle` (a spec, a log).
pub fn file_contains(path: &Path, needle: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle))
}

/// The driver's `/proc/driver/nvidia-caps/mig-minors` table for every
/// GPU instance and compute instance id a GPU could have, with the minors
/// the mock gives its capability files (gi: 3 + 135 * minor + 9 * G; ci:
/// that + 1 + C), so the administrator's instances have theirs too.
fn mig_minors(inventory: &Inventory) -> String {
    let mut table = String::from("config 1\nmonitor 2\n");
    for gpu in &inventory.gpus {
        for gi in 0..15 {
            let base = 3 + 135 * gpu.minor + 9 * gi;
            table.push_str(&format!("gpu{}/gi{gi}/access {base}\n", gpu.minor));
            for ci in 0..8 {
                table.push_str(&format!("gpu{}/gi{gi}/ci{ci}/access {}\n", gpu.minor, base + 1 + ci));
            }
        }
    }
    table
}

/// What the dynamic MIG suites share: the gate, GPU 0's devices they make,
/// and the plugin started on a mock node (NVML only, no fake inventory).
pub mod dynamic_mig {
    use crate::kubelet::KubeletConfig;
    use crate::node::{DRIVER, RunningNode};
    use crate::plugin_process::PluginOptions;

    pub const GATES: &str = "DynamicMIG=true";
    pub const FOUR: &str = "gpu-0-mig-4g40gb-5-0";
    pub const TWO: &str = "gpu-0-mig-2g20gb-14-4";
    pub const ONE: &str = "gpu-0-mig-1g10gb-19-6";

    /// The plugin with `options` (a [`super::MockGpuNode`]'s), on an empty
    /// fake inventory: what it publishes comes from the mock NVML.
    pub fn start(options: PluginOptions) -> RunningNode {
        RunningNode::start("gpus: []\n", KubeletConfig::new("", DRIVER), options)
    }
}
