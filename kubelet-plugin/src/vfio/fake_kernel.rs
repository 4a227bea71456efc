//! A fake sysfs tree and a few lines of kernel: the switch writes the real
//! files through [`Sysfs`], and [`FakeKernel`] then does what the PCI core
//! does on those writes (sysfs-bus-pci): `unbind` drops the `driver` link,
//! `drivers_probe` binds the override's driver (else the device's ID
//! match), and `/dev/vfio/<group>` exists while every device of the group
//! is bound to `vfio-pci` (vfio.rst: a group is viable only then).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use gpu_dra_driver::inventory::PciBusId;

use super::sysfs::{PciBinding, Sysfs, SysfsError, VFIO_PCI};

pub(crate) struct FakeKernel {
    pub sys: Sysfs,
    /// Each device's group and the driver its IDs match.
    devices: BTreeMap<PciBusId, (u32, String)>,
    /// Off: `vfio-pci` binds nothing (the module is not loaded).
    pub vfio_binds: AtomicBool,
}

pub(crate) fn bdf(s: &str) -> PciBusId {
    PciBusId::parse(s).expect("bdf")
}

impl FakeKernel {
    /// `devices`: address, IOMMU group, matching driver; each starts bound
    /// to that driver. Trees go under `root/sys` and `root/dev`.
    pub fn new(root: &Path, devices: &[(&str, u32, &str)]) -> Self {
        let sys = root.join("sys");
        for driver in ["nvidia", VFIO_PCI, "snd_hda_intel"] {
            let dir = sys.join("bus/pci/drivers").join(driver);
            fs::create_dir_all(&dir).expect("drivers");
            fs::write(dir.join("unbind"), "").expect("unbind");
        }
        fs::write(sys.join("bus/pci/drivers_probe"), "").expect("drivers_probe");
        fs::create_dir_all(sys.join("bus/pci/devices")).expect("devices");
        fs::create_dir_all(root.join("dev/vfio")).expect("dev");
        let mut map = BTreeMap::new();
        for (addr, group, driver) in devices {
            let id = bdf(addr);
            let dir = sys.join("devices/pci0000:00").join(addr);
            fs::create_dir_all(&dir).expect("device");
            fs::write(dir.join("driver_override"), "(null)\n").expect("override");
            let group_dir = sys.join("kernel/iommu_groups").join(group.to_string()).join("devices");
            fs::create_dir_all(&group_dir).expect("group");
            symlink(format!("../../../../devices/pci0000:00/{addr}"), group_dir.join(addr)).expect("member");
            symlink(format!("../../../kernel/iommu_groups/{group}"), dir.join("iommu_group")).expect("iommu_group");
            symlink(format!("../../../devices/pci0000:00/{addr}"), sys.join("bus/pci/devices").join(addr))
                .expect("bus link");
            map.insert(id, (*group, driver.to_string()));
        }
        let kernel = Self {
            sys: Sysfs { sys_root: sys, dev_root: root.to_path_buf() },
            devices: map,
            vfio_binds: AtomicBool::new(true),
        };
        for (id, (_, driver)) in &kernel.devices {
            kernel.link(id, Some(driver));
        }
        kernel
    }

    fn dir(&self, id: &PciBusId) -> PathBuf {
        self.sys.sys_root.join("devices/pci0000:00").join(id.to_string())
    }

    fn link(&self, id: &PciBusId, driver: Option<&str>) {
        let link = self.dir(id).join("driver");
        let _ = fs::remove_file(&link);
        if let Some(driver) = driver {
            symlink(format!("../../../bus/pci/drivers/{driver}"), &link).expect("driver link");
        }
        self.update_group_nodes();
    }

    fn update_group_nodes(&self) {
        let mut groups: BTreeMap<u32, bool> = BTreeMap::new();
        for (id, (group, _)) in &self.devices {
            let bound = self.sys.driver(id).ok().flatten().as_deref() == Some(VFIO_PCI);
            *groups.entry(*group).or_insert(true) &= bound;
        }
        for (group, viable) in groups {
            let node = self.sys.dev_root.join("dev/vfio").join(group.to_string());
            if viable {
                fs::write(&node, "").expect("node")
            } else {
                let _ = fs::remove_file(&node);
            }
        }
    }

    /// The driver each device is bound to now, by address.
    pub fn drivers(&self) -> Vec<(String, Option<String>)> {
        self.devices.keys().map(|id| (id.to_string(), self.sys.driver(id).expect("driver"))).collect()
    }

    pub fn override_of(&self, id: &str) -> String {
        fs::read_to_string(self.dir(&bdf(id)).join("driver_override")).expect("override").trim().to_owned()
    }
}

impl PciBinding for FakeKernel {
    fn driver(&self, device: &PciBusId) -> Result<Option<String>, SysfsError> {
        self.sys.driver(device)
    }

    fn group_members(&self, device: &PciBusId, group: u32) -> Result<Vec<PciBusId>, SysfsError> {
        self.sys.group_members(device, group)
    }

    fn set_override(&self, device: &PciBusId, driver: Option<&str>) -> Result<(), SysfsError> {
        self.sys.set_override(device, driver)
    }

    fn unbind(&self, device: &PciBusId, driver: &str) -> Result<(), SysfsError> {
        self.sys.unbind(device, driver)?;
        if self.sys.driver(device)?.as_deref() == Some(driver) {
            self.link(device, None);
        }
        Ok(())
    }

    fn probe(&self, device: &PciBusId) -> Result<(), SysfsError> {
        self.sys.probe(device)?;
        if self.sys.driver(device)?.is_some() {
            return Ok(());
        }
        let over = fs::read_to_string(self.dir(device).join("driver_override")).unwrap_or_default();
        let over = over.trim();
        let matching = match over {
            "" | "(null)" => self.devices.get(device).map(|(_, d)| d.clone()),
            VFIO_PCI if !self.vfio_binds.load(Ordering::SeqCst) => None,
            other => Some(other.to_owned()),
        };
        if let Some(driver) = matching {
            self.link(device, Some(&driver));
        }
        Ok(())
    }

    fn group_node_exists(&self, group: u32) -> bool {
        self.sys.group_node_exists(group)
    }
}
