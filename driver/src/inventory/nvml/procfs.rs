//! The `/proc` and `/sys` files that complete what NVML reports: dynamic
//! character-device majors, MIG capability minors, a GPU's PCIe root and its
//! NUMA node. Parsers are pure; readers take the root so tests can point
//! them at fixtures.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::inventory::model::{DeviceMajors, MigCapMinors};
use crate::inventory::pci::{PciBusId, pcie_root_from_sysfs_link};

/// Majors of `nvidia-uvm` and `nvidia-caps` from the "Character devices:"
/// section of `/proc/devices` (lines `<major> <name>`).
pub fn parse_proc_devices(text: &str) -> DeviceMajors {
    let mut majors = DeviceMajors::default();
    let mut in_character_devices = false;
    for line in text.lines().map(str::trim) {
        if line.ends_with(':') {
            in_character_devices = line == "Character devices:";
            continue;
        }
        if !in_character_devices {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(major), Some(name), None) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let Ok(major) = major.parse::<u32>() else {
            continue;
        };
        let slot = match name {
            "nvidia-uvm" => &mut majors.nvidia_uvm,
            "nvidia-caps" => &mut majors.nvidia_caps,
            _ => continue,
        };
        slot.get_or_insert(major);
    }
    majors
}

/// Reads `<proc>/devices`; unknown majors when the file cannot be read.
pub fn read_device_majors(proc_root: &Path) -> DeviceMajors {
    let path = proc_root.join("devices");
    match fs::read_to_string(&path) {
        Ok(text) => parse_proc_devices(&text),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read character-device majors; nvidia-uvm and nvidia-caps majors are unknown");
            DeviceMajors::default()
        }
    }
}

/// `/proc/driver/nvidia-caps/mig-minors`: capability path to the minor of
/// `/dev/nvidia-caps/nvidia-cap<minor>`, e.g. `gpu0/gi1/ci0/access` to 13.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigMinors {
    minors: HashMap<String, u32>,
}

impl MigMinors {
    /// Reads lines `<capability> <minor>`, skipping any that are not.
    pub fn parse(text: &str) -> Self {
        let minors = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                match (fields.next(), fields.next(), fields.next()) {
                    (Some(cap), Some(minor), None) => Some((cap.to_string(), minor.parse().ok()?)),
                    _ => None,
                }
            })
            .collect();
        Self { minors }
    }

    /// The minor of one capability, e.g. `config` or `gpu0/gi1/access`.
    pub fn get(&self, capability: &str) -> Option<u32> {
        self.minors.get(capability).copied()
    }

    /// Both access minors of a MIG device: `gpu<minor>/gi<gi>/access` and
    /// `gpu<minor>/gi<gi>/ci<ci>/access`; `None` unless both are listed.
    pub fn lookup(&self, parent_minor: u32, gpu_instance: u32, compute_instance: u32) -> Option<MigCapMinors> {
        let gi = format!("gpu{parent_minor}/gi{gpu_instance}/access");
        let ci = format!("gpu{parent_minor}/gi{gpu_instance}/ci{compute_instance}/access");
        Some(MigCapMinors { gpu_instance: self.get(&gi)?, compute_instance: self.get(&ci)? })
    }

    pub fn is_empty(&self) -> bool {
        self.minors.is_empty()
    }
}

/// Reads `<proc>/driver/nvidia-caps/mig-minors`; empty when it is missing
/// (the nvidia-caps module is not loaded, or the driver predates MIG).
pub fn read_mig_minors(proc_root: &Path) -> MigMinors {
    let path = proc_root.join("driver/nvidia-caps/mig-minors");
    match fs::read_to_string(&path) {
        Ok(text) => MigMinors::parse(&text),
        Err(error) => {
            tracing::debug!(path = %path.display(), %error, "no MIG capability minors; MIG devices get no caps");
            MigMinors::default()
        }
    }
}

/// `<sys>/bus/pci/devices/<bdf>`, the symlink into the device tree.
fn sysfs_device(sys_root: &Path, bus_id: &PciBusId) -> PathBuf {
    sys_root.join("bus/pci/devices").join(bus_id.to_string())
}

/// The PCIe root (`pci0000:64`) of a device from its sysfs symlink; `None`
/// when the link is missing or does not look like a PCI device path.
pub fn read_pcie_root(sys_root: &Path, bus_id: &PciBusId) -> Option<String> {
    let link = sysfs_device(sys_root, bus_id);
    match fs::read_link(&link) {
        Ok(target) => {
            let target = target.to_string_lossy();
            let root = pcie_root_from_sysfs_link(&target, bus_id);
            if root.is_none() {
                tracing::debug!(link = %link.display(), %target, "sysfs link does not name a PCIe root; pcieRoot unknown");
            }
            root
        }
        Err(error) => {
            tracing::debug!(link = %link.display(), %error, "cannot read sysfs link; pcieRoot unknown");
            None
        }
    }
}

/// The IOMMU group of a device: the last component of its `iommu_group`
/// link (`../../../../kernel/iommu_groups/<n>`, sysfs-bus-pci ABI); `None`
/// without an IOMMU (no link) or when the link names no group number.
pub fn read_iommu_group(sys_root: &Path, bus_id: &PciBusId) -> Option<u32> {
    let target = fs::read_link(sysfs_device(sys_root, bus_id).join("iommu_group")).ok()?;
    iommu_group_from_link(&target)
}

/// `.../kernel/iommu_groups/<n>` to `n`.
pub fn iommu_group_from_link(target: &Path) -> Option<u32> {
    let parent = target.parent()?.file_name()?;
    if parent != "iommu_groups" {
        return None;
    }
    let n = target.file_name()?.to_str()?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// A sysfs `numa_node` value: `-1` (no NUMA affinity) and garbage are `None`.
pub fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

/// Reads `<sys>/bus/pci/devices/<bdf>/numa_node`. `Err` when the file cannot
/// be read, so the caller can ask elsewhere; `Ok(None)` when it says none.
pub fn read_numa_node(sys_root: &Path, bus_id: &PciBusId) -> io::Result<Option<u32>> {
    fs::read_to_string(sysfs_device(sys_root, bus_id).join("numa_node")).map(|text| parse_numa_node(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iommu_group_is_the_number_the_link_ends_in() {
        let group = |t: &str| iommu_group_from_link(Path::new(t));
        assert_eq!(group("../../../../kernel/iommu_groups/42"), Some(42));
        assert_eq!(group("../../../../kernel/iommu_groups/4x"), None);
        assert_eq!(group("../../../../kernel/elsewhere/4"), None);
        assert_eq!(group("42"), None);
    }

    const PROC_DEVICES: &str = "Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
195 nvidia
235 nvidia-uvm
236 nvidia-caps
237 nvidia-caps-imex-channels
510 nvidia-nvswitch

Block devices:
  7 loop
236 nvidia-caps
";

    #[test]
    fn proc_devices_majors() {
        assert_eq!(parse_proc_devices(PROC_DEVICES), DeviceMajors { nvidia_uvm: Some(235), nvidia_caps: Some(236) });
    }

    #[test]
    fn proc_devices_without_nvidia_modules() {
        let text = "Character devices:\n  1 mem\n195 nvidia\n\nBlock devices:\n235 nvidia-uvm\n";
        assert_eq!(parse_proc_devices(text), DeviceMajors::default());
        assert_eq!(parse_proc_devices(""), DeviceMajors::default());
        assert_eq!(parse_proc_devices("Character devices:\nxx nvidia-uvm\n235\n"), DeviceMajors::default());
    }

    #[test]
    fn mig_minors_lookup() {
        let minors = MigMinors::parse(
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\nbroken line here\nx y\n",
        );
        assert_eq!(minors.get("config"), Some(1));
        assert_eq!(minors.get("x"), None);
        assert_eq!(minors.lookup(0, 1, 0), Some(MigCapMinors { gpu_instance: 12, compute_instance: 13 }));
        // A GPU instance without its compute instance line, and an unknown GPU.
        assert_eq!(minors.lookup(0, 2, 0), None);
        assert_eq!(minors.lookup(1, 1, 0), None);
        assert!(MigMinors::parse("").is_empty());
    }

    #[test]
    fn numa_node_values() {
        assert_eq!(parse_numa_node("1\n"), Some(1));
        assert_eq!(parse_numa_node("0"), Some(0));
        assert_eq!(parse_numa_node("-1\n"), None);
        assert_eq!(parse_numa_node(""), None);
    }

    /// A fixture tree under the system temp dir, removed on drop.
    struct Fixture(PathBuf);

    impl Fixture {
        fn new(name: &str) -> Self {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
            let dir = std::env::temp_dir().join(format!("gpu-dra-nvml-{name}-{}-{nanos}", std::process::id()));
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn write(&self, path: &str, text: &str) {
            let path = self.0.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn readers_use_the_given_roots() {
        let proc = Fixture::new("proc");
        proc.write("devices", PROC_DEVICES);
        proc.write("driver/nvidia-caps/mig-minors", "gpu3/gi1/access 417\ngpu3/gi1/ci0/access 418\n");
        assert_eq!(read_device_majors(&proc.0).nvidia_caps, Some(236));
        assert_eq!(
            read_mig_minors(&proc.0).lookup(3, 1, 0),
            Some(MigCapMinors { gpu_instance: 417, compute_instance: 418 })
        );

        let missing = proc.0.join("nothing-here");
        assert_eq!(read_device_majors(&missing), DeviceMajors::default());
        assert!(read_mig_minors(&missing).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn sysfs_pcie_root_and_numa_node() {
        let sys = Fixture::new("sys");
        let bdf = PciBusId::parse("0000:65:00.0").unwrap();
        sys.write("devices/pci0000:64/0000:64:01.0/0000:65:00.0/numa_node", "1\n");
        fs::create_dir_all(sys.0.join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:64/0000:64:01.0/0000:65:00.0",
            sys.0.join("bus/pci/devices/0000:65:00.0"),
        )
        .unwrap();
        assert_eq!(read_pcie_root(&sys.0, &bdf).as_deref(), Some("pci0000:64"));
        assert_eq!(read_numa_node(&sys.0, &bdf).unwrap(), Some(1));

        let absent = PciBusId::parse("0000:66:00.0").unwrap();
        assert_eq!(read_pcie_root(&sys.0, &absent), None);
        assert!(read_numa_node(&sys.0, &absent).is_err());
    }
}
