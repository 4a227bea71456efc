//! The kernel's PCI core for a test node's fake `/sys` (the tree
//! [`crate::mock_nvml::sys_tree`] lays out), so the real plugin process can
//! switch drivers on it. Each driver's `unbind` and the bus's
//! `drivers_probe` are FIFOs; a thread per FIFO reads the addresses
//! written to it and does what the PCI core does (sysfs-bus-pci): an
//! unbind drops the `driver` link, a probe binds the `driver_override`'s
//! driver (else the device's own); `<dev>/dev/vfio/<group>` exists while
//! every device of the group is on `vfio-pci` (vfio.rst).
//!
//! Unlike the kernel it answers after the write returned, so it binds an
//! unbound device at once, as the probe the plugin always writes next
//! would (a probe read before its unbind would otherwise find the device
//! still bound and do nothing).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const DRIVERS: [&str; 3] = ["nvidia", "vfio-pci", "snd_hda_intel"];
/// A canonical PCI address's length (`0000:18:00.0`): writes that follow
/// each other closely reach a FIFO's reader as one text.
const BDF_LEN: usize = 12;

pub struct PciCore {
    state: Arc<State>,
    fifos: Vec<PathBuf>,
}

struct State {
    sys: PathBuf,
    dev: PathBuf,
    /// Each device's group and the driver its IDs match.
    devices: BTreeMap<String, (u32, String)>,
    lock: Mutex<()>,
    stop: AtomicBool,
}

impl PciCore {
    /// Starts the core on `sys` (with `dev` holding `dev/vfio`), adding
    /// `functions` (address, PCIe root, IOMMU group, driver: a GPU's audio
    /// function) to the tree first.
    pub fn start(sys: &Path, dev: &Path, functions: &[(&str, &str, u32, &str)]) -> Self {
        for (bdf, root, group, driver) in functions {
            crate::mock_nvml::pci_device(sys, root, bdf, Some(*group), driver);
        }
        std::fs::create_dir_all(dev.join("dev/vfio")).expect("dev/vfio");
        let mut devices = BTreeMap::new();
        for entry in std::fs::read_dir(sys.join("bus/pci/devices")).expect("devices").flatten() {
            let bdf = entry.file_name().to_string_lossy().into_owned();
            let link = |name: &str| {
                let target = std::fs::read_link(entry.path().join(name)).ok()?;
                Some(target.file_name()?.to_string_lossy().into_owned())
            };
            if let (Some(group), Some(driver)) = (link("iommu_group"), link("driver")) {
                devices.insert(bdf, (group.parse().expect("group"), driver));
            }
        }
        let mut fifos: Vec<PathBuf> =
            DRIVERS.iter().map(|d| sys.join("bus/pci/drivers").join(d).join("unbind")).collect();
        fifos.push(sys.join("bus/pci/drivers_probe"));
        let state = Arc::new(State {
            sys: sys.to_path_buf(),
            dev: dev.to_path_buf(),
            devices,
            lock: Mutex::new(()),
            stop: AtomicBool::new(false),
        });
        for (index, fifo) in fifos.iter().enumerate() {
            std::fs::create_dir_all(fifo.parent().expect("parent")).expect("driver dir");
            rustix::fs::mknodat(rustix::fs::CWD, fifo, rustix::fs::FileType::Fifo, 0o600.into(), 0).expect("mkfifo");
            let (state, fifo) = (Arc::clone(&state), fifo.clone());
            let driver = DRIVERS.get(index).map(|d| d.to_string());
            std::thread::spawn(move || state.serve(&fifo, driver.as_deref()));
        }
        state.update_group_nodes();
        Self { state, fifos }
    }

    /// The driver each device is bound to now, by address.
    pub fn drivers(&self) -> BTreeMap<String, Option<String>> {
        let _held = self.state.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.state.devices.keys().map(|bdf| (bdf.clone(), self.state.driver(bdf))).collect()
    }

    /// Every device on the driver its IDs match, none overridden, no group
    /// node: the node as it was before any passthrough.
    pub fn is_original(&self) -> bool {
        let _held = self.state.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.state.devices.iter().all(|(bdf, (group, driver))| {
            self.state.driver(bdf).as_deref() == Some(driver.as_str())
                && self.state.override_of(bdf).is_none()
                && !self.state.group_node(*group).exists()
        })
    }

    /// Whether `/dev/vfio/<group>` exists.
    pub fn group_node_exists(&self, group: u32) -> bool {
        self.state.group_node(group).exists()
    }
}

impl Drop for PciCore {
    /// Wakes each thread (a blank line) to see that it is told to stop.
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        for fifo in &self.fifos {
            let _ = std::fs::OpenOptions::new().write(true).open(fifo).and_then(|mut f| f.write_all(b"\n"));
        }
    }
}

impl State {
    fn device_dir(&self, bdf: &str) -> PathBuf {
        self.sys.join("bus/pci/devices").join(bdf)
    }

    fn driver(&self, bdf: &str) -> Option<String> {
        let target = std::fs::read_link(self.device_dir(bdf).join("driver")).ok()?;
        Some(target.file_name()?.to_string_lossy().into_owned())
    }

    fn override_of(&self, bdf: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.device_dir(bdf).join("driver_override")).unwrap_or_default();
        let text = text.trim();
        (!text.is_empty() && text != "(null)").then(|| text.to_owned())
    }

    fn group_node(&self, group: u32) -> PathBuf {
        self.dev.join("dev/vfio").join(group.to_string())
    }

    /// Reads `fifo` until told to stop; `driver`: the driver whose
    /// `unbind` it is, `None` for `drivers_probe`. The FIFO is held open
    /// for writing too, so a write that comes while another is read is
    /// kept (a FIFO's last close drops what it holds) and never ends the
    /// read.
    fn serve(&self, fifo: &Path, driver: Option<&str>) {
        let Ok(mut file) = std::fs::OpenOptions::new().read(true).write(true).open(fifo) else { return };
        let mut pending = String::new();
        let mut buf = [0u8; 4096];
        while !self.stop.load(Ordering::SeqCst) {
            let Ok(n) = file.read(&mut buf) else { return };
            pending.extend(String::from_utf8_lossy(&buf[..n]).chars().filter(|c| !c.is_whitespace()));
            let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            while pending.len() >= BDF_LEN {
                let bdf: String = pending.drain(..BDF_LEN).collect();
                if !self.devices.contains_key(&bdf) {
                    continue;
                }
                if let Some(driver) = driver
                    && self.driver(&bdf).as_deref() == Some(driver)
                {
                    let _ = std::fs::remove_file(self.device_dir(&bdf).join("driver"));
                }
                self.probe(&bdf);
            }
            self.update_group_nodes();
        }
    }

    /// Binds an unbound device to its override's driver, else its own.
    fn probe(&self, bdf: &str) {
        if self.driver(bdf).is_some() {
            return;
        }
        let driver = self.override_of(bdf).unwrap_or_else(|| self.devices[bdf].1.clone());
        let link = self.device_dir(bdf).join("driver");
        std::os::unix::fs::symlink(format!("../../../bus/pci/drivers/{driver}"), link).expect("driver link");
    }

    fn update_group_nodes(&self) {
        let mut viable: BTreeMap<u32, bool> = BTreeMap::new();
        for (bdf, (group, _)) in &self.devices {
            *viable.entry(*group).or_insert(true) &= self.driver(bdf).as_deref() == Some("vfio-pci");
        }
        for (group, viable) in viable {
            let node = self.group_node(group);
            if viable {
                std::fs::write(&node, "").expect("group node");
            } else {
                let _ = std::fs::remove_file(&node);
            }
        }
    }
}
