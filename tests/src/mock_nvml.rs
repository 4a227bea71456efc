//! The mock `libnvidia-ml` (`tests/mock-nvml/mock_nvml.c`) as every test
//! node sets it up: built with the system `cc` into a fake driver root, a
//! device table written from a fake inventory, and the `/sys` tree NVML's
//! PCI bus IDs resolve in. One writer serves the discovery, dynamic-MIG
//! and telemetry nodes, so the mock answers alike for all of them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_dra_driver::driver_root::fake_tree::{self, LIBDIR};
use gpu_dra_driver::inventory::nvml::names;
use gpu_dra_driver::inventory::{Gpu, Inventory, MigMode};

use crate::workspace_root;

/// A boot id every mock node's `/proc` reports.
pub const BOOT_ID: &str = "4b1c2a55-7d0e-4f6a-9c3b-2e1d0f9a8b7c";

/// A fake driver root at `root` for driver `version`, holding the mock
/// built as `libnvidia-ml.so.<version>` and its `ld.so.cache`.
pub fn build_library(root: &Path, version: &str) {
    fake_tree::build(root, version, &[("libcuda.so", "libcuda.so.1")]).expect("driver root");
    let nvml = root.join(LIBDIR).join(format!("libnvidia-ml.so.{version}"));
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-pthread", "-O1", "-Wl,-soname,libnvidia-ml.so.1", "-o"])
        .arg(&nvml)
        .arg(workspace_root().join("tests/mock-nvml/mock_nvml.c"))
        .status()
        .expect("running cc");
    assert!(built.success(), "building the mock NVML");
    assert!(Command::new("ldconfig").arg("-r").arg(root).status().expect("ldconfig").success());
}

/// `<proc>/sys/kernel/random/boot_id`.
pub fn write_boot_id(proc: &Path) {
    let dir = proc.join("sys/kernel/random");
    std::fs::create_dir_all(&dir).expect("proc");
    std::fs::write(dir.join("boot_id"), format!("{BOOT_ID}\n")).expect("boot id");
}

/// The NVML code whose name is `name` (inverting the plugin's own table).
fn code(name: &str, names: fn(u32) -> &'static str) -> u32 {
    (0..64).find(|&c| names(c) == name).unwrap_or_else(|| panic!("no NVML code for {name}"))
}

/// The mock's table for `inventory`: GPUs, MIG modes with their profiles,
/// placements and instances, fabric cliques (odd GPUs answer only the v2
/// query, so the v3 -> v2 fallback runs) and NVLink groups as full meshes.
pub fn table(inventory: &Inventory, version: &str) -> String {
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
        mig_lines(&mut t, g);
        if let Some(clique) = g.clique {
            let uuid = clique.cluster_uuid.simple();
            let _ = writeln!(t, "fabric|{}|{uuid}|{}|{}", g.minor, clique.clique, g.minor % 2);
        }
        let peers = inventory
            .gpus
            .iter()
            .filter(|p| p.minor != g.minor && p.nvlink_group.is_some() && p.nvlink_group == g.nvlink_group);
        for (link, peer) in peers.enumerate() {
            let _ = writeln!(t, "link|{}|{link}|{}", g.minor, peer.pci_bus_id.expect("bus id"));
        }
    }
    t
}

/// MIG mode, the profiles with their placements, and the instances.
fn mig_lines(t: &mut String, g: &Gpu) {
    let instances = match &g.mig {
        MigMode::Disabled => return,
        MigMode::Enabled(migs) | MigMode::Dynamic(migs) => migs,
    };
    let _ = writeln!(t, "migmode|{}", g.minor);
    for p in g.mig_capabilities.iter().flat_map(|caps| &caps.profiles) {
        let q = &p.profile;
        let _ = writeln!(
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
        );
        for placement in &p.placements {
            let _ = writeln!(t, "placement|{}|{}|{}|{}", g.minor, q.gi_profile_id, placement.start, placement.size);
        }
    }
    for m in instances {
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

/// `/sys/bus/pci/devices/<bdf>` links into a PCIe root, with `numa_node`,
/// each GPU bound to `nvidia` and in its IOMMU group (the fake
/// inventory's) as sysfs-bus-pci lays them out.
pub fn sys_tree(sys: &Path, inventory: &Inventory) {
    for g in &inventory.gpus {
        let root = g.pcie_root.clone().unwrap_or_else(|| "pci0000:00".into());
        let device = pci_device(sys, &root, &g.pci_bus_id.expect("bus id").to_string(), g.iommu_group, "nvidia");
        std::fs::write(device.join("numa_node"), format!("{}\n", g.numa_node.unwrap_or(0))).expect("numa_node");
    }
}

/// One PCI function under `sys`: `devices/<root>/<bdf>` with its
/// `driver_override` (none), its `driver` link, its `iommu_group` link and
/// the group's link back, and `bus/pci/devices/<bdf>`. Returns its directory.
pub fn pci_device(sys: &Path, root: &str, bdf: &str, group: Option<u32>, driver: &str) -> PathBuf {
    use std::os::unix::fs::symlink;
    let device = sys.join("devices").join(root).join(bdf);
    std::fs::create_dir_all(&device).expect("sys");
    std::fs::create_dir_all(sys.join("bus/pci/drivers").join(driver)).expect("driver");
    std::fs::write(device.join("driver_override"), "(null)\n").expect("driver_override");
    symlink(format!("../../../bus/pci/drivers/{driver}"), device.join("driver")).expect("driver link");
    if let Some(group) = group {
        let members = sys.join("kernel/iommu_groups").join(group.to_string()).join("devices");
        std::fs::create_dir_all(&members).expect("group");
        symlink(format!("../../../../devices/{root}/{bdf}"), members.join(bdf)).expect("member");
        symlink(format!("../../../kernel/iommu_groups/{group}"), device.join("iommu_group")).expect("iommu_group");
    }
    let links = sys.join("bus/pci/devices");
    std::fs::create_dir_all(&links).expect("sys");
    symlink(format!("../../../devices/{root}/{bdf}"), links.join(bdf)).expect("symlink");
    device
}
