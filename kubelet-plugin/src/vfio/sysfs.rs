//! The kernel's PCI driver-binding files, for one sysfs root (`--sys-root`).
//!
//! Semantics (Documentation/ABI/testing/sysfs-bus-pci and
//! Documentation/driver-api/vfio.rst):
//! * `devices/<bdf>/driver` links to the bound driver's directory; absent
//!   when no driver is bound;
//! * writing a driver's name to `devices/<bdf>/driver_override` makes that
//!   driver the only one that may bind the device; writing an empty line
//!   clears it;
//! * writing `<bdf>` to `drivers/<name>/unbind` unbinds it from `<name>`;
//! * writing `<bdf>` to `drivers_probe` binds it to the driver that matches
//!   (the override, else by ID: `nvidia` for the GPU, its own driver for
//!   each other function);
//! * `devices/<bdf>/iommu_group` links to `kernel/iommu_groups/<n>`, whose
//!   `devices/` lists every device of the group: VFIO hands a group to a
//!   user only when all of them are bound to a VFIO driver (or none).
//!
//! Every path is built from a validated [`PciBusId`] and a plain driver
//! name, never read from a file; links are read, never followed, except
//! `iommu_group`, whose target must be the group the inventory named
//! inside this root.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use gpu_dra_driver::bounded_file::is_plain_name;
use gpu_dra_driver::inventory::PciBusId;

/// The driver a passed-through device is bound to.
pub const VFIO_PCI: &str = "vfio-pci";

/// What the switch needs of the kernel; [`Sysfs`] on a node, an emulator
/// in tests.
pub trait PciBinding: Send + Sync {
    /// The driver bound to `device`, `None` when none is.
    fn driver(&self, device: &PciBusId) -> Result<Option<String>, SysfsError>;
    /// Every device of `device`'s IOMMU group, which must be `group`.
    fn group_members(&self, device: &PciBusId, group: u32) -> Result<Vec<PciBusId>, SysfsError>;
    /// Writes `driver_override` (`None` clears it).
    fn set_override(&self, device: &PciBusId, driver: Option<&str>) -> Result<(), SysfsError>;
    /// Unbinds `device` from `driver`.
    fn unbind(&self, device: &PciBusId, driver: &str) -> Result<(), SysfsError>;
    /// Asks the kernel to bind `device` to its matching driver.
    fn probe(&self, device: &PciBusId) -> Result<(), SysfsError>;
    /// Whether `/dev/vfio/<group>` exists (the group is usable).
    fn group_node_exists(&self, group: u32) -> bool;
}

/// A sysfs file that could not be read or written, or that lies.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error("{path}: {why}; refusing to touch the device")]
    Forged { path: PathBuf, why: String },
}

/// The real files under a sysfs root and a `/dev` root.
#[derive(Debug, Clone)]
pub struct Sysfs {
    pub sys_root: PathBuf,
    /// Where the host's `/` is, for `/dev/vfio/<group>`.
    pub dev_root: PathBuf,
}

impl Sysfs {
    fn device(&self, device: &PciBusId) -> PathBuf {
        self.sys_root.join("bus/pci/devices").join(device.to_string())
    }

    fn write(&self, path: &Path, text: &str) -> Result<(), SysfsError> {
        let io = |error| SysfsError::Io { path: path.to_path_buf(), error };
        // Never creates: these files exist only where the kernel made them.
        // A sysfs attribute takes each write whole (O_TRUNC is ignored there).
        let mut file = fs::OpenOptions::new().write(true).truncate(true).open(path).map_err(io)?;
        file.write_all(text.as_bytes()).map_err(io)
    }
}

/// The last component of a driver link, if it is a plain driver name.
fn driver_name(path: &Path, target: &Path) -> Result<String, SysfsError> {
    let name = target.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if !is_plain_name(name) {
        return Err(SysfsError::Forged { path: path.to_path_buf(), why: format!("names no driver ({target:?})") });
    }
    Ok(name.to_owned())
}

impl PciBinding for Sysfs {
    fn driver(&self, device: &PciBusId) -> Result<Option<String>, SysfsError> {
        let path = self.device(device).join("driver");
        match fs::read_link(&path) {
            Ok(target) => driver_name(&path, &target).map(Some),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(SysfsError::Io { path, error }),
        }
    }

    fn group_members(&self, device: &PciBusId, group: u32) -> Result<Vec<PciBusId>, SysfsError> {
        let link = self.device(device).join("iommu_group");
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |error| SysfsError::Io { path, error }
        };
        let resolved = fs::canonicalize(&link).map_err(io(&link))?;
        let expected = fs::canonicalize(self.sys_root.join("kernel/iommu_groups")).map_err(io(&link))?;
        if resolved != expected.join(group.to_string()) {
            return Err(SysfsError::Forged {
                path: link,
                why: format!("leads to {} rather than IOMMU group {group} of this sysfs root", resolved.display()),
            });
        }
        let dir = resolved.join("devices");
        let mut members = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let member =
                PciBusId::parse(&name).map_err(|e| SysfsError::Forged { path: dir.clone(), why: e.to_string() })?;
            if member.to_string() != name {
                return Err(SysfsError::Forged {
                    path: dir.clone(),
                    why: format!("{name:?} is no canonical PCI address"),
                });
            }
            members.push(member);
        }
        members.sort();
        if !members.contains(device) {
            return Err(SysfsError::Forged { path: dir, why: format!("does not list {device} itself") });
        }
        Ok(members)
    }

    fn set_override(&self, device: &PciBusId, driver: Option<&str>) -> Result<(), SysfsError> {
        // An empty line clears the override (sysfs-bus-pci).
        self.write(&self.device(device).join("driver_override"), &format!("{}\n", driver.unwrap_or_default()))
    }

    fn unbind(&self, device: &PciBusId, driver: &str) -> Result<(), SysfsError> {
        let path = self.sys_root.join("bus/pci/drivers").join(driver).join("unbind");
        if !is_plain_name(driver) {
            return Err(SysfsError::Forged { path, why: "is no plain driver name".into() });
        }
        self.write(&path, &device.to_string())
    }

    fn probe(&self, device: &PciBusId) -> Result<(), SysfsError> {
        self.write(&self.sys_root.join("bus/pci/drivers_probe"), &device.to_string())
    }

    fn group_node_exists(&self, group: u32) -> bool {
        self.dev_root.join("dev/vfio").join(group.to_string()).exists()
    }
}
