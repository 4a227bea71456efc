//! The node's GPUs as plain data, and where that data comes from.
//!
//! Two sources fill the same model: NVML on a GPU node ([`nvml`]) and a YAML
//! file for tests, demos and `simulate` ([`fake`]). Everything downstream
//! (slices, CDI, health) reads only this model.

pub mod catalog;
pub mod dynamic_mig;
pub mod fake;
pub mod mig_layout;
mod model;
pub mod nvlink;
pub mod nvml;
mod pci;
mod published;

pub use model::{
    AddressingMode, CliqueId, DeviceMajors, Fault, Gpu, Inventory, MigCapMinors, MigCapabilities, MigCapableProfile,
    MigDevice, MigMode, MigProfile, Placement, VFIO_PREFIX,
};
pub use pci::{InvalidPciBusId, PciBusId};
pub use published::PublishedDevice;

/// Where an inventory comes from.
pub trait InventorySource {
    /// Reads the node's GPUs now. Called at start and whenever the plugin
    /// re-discovers (e.g. after a health event).
    fn discover(&self) -> Result<Inventory, DiscoveryError>;
}

impl InventorySource for fake::FakeSource {
    fn discover(&self) -> Result<Inventory, DiscoveryError> {
        Ok(self.read()?)
    }
}

impl InventorySource for nvml::NvmlSource {
    fn discover(&self) -> Result<Inventory, DiscoveryError> {
        Ok(self.discover_nvml()?)
    }
}

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error(transparent)]
    Fake(#[from] fake::FakeInventoryError),
    #[error(transparent)]
    Nvml(#[from] nvml::NvmlDiscoveryError),
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::version::Semver;

    /// A plain healthy GPU for unit tests elsewhere in the crate.
    pub fn gpu(minor: u32) -> Gpu {
        Gpu {
            index: minor,
            minor,
            uuid: format!("GPU-00000000-0000-0000-0000-{minor:012}"),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            brand: "Nvidia".into(),
            architecture: "Hopper".into(),
            cuda_compute_capability: Semver::from_major_minor(9, 0),
            pci_bus_id: Some(PciBusId::parse(&format!("0000:{:02x}:00.0", 0x18 + minor)).unwrap()),
            pcie_root: Some("pci0000:17".into()),
            iommu_group: None,
            numa_node: Some(0),
            memory_bytes: 80 << 30,
            mig: MigMode::Disabled,
            mig_capabilities: None,
            nvlink_group: None,
            clique: None,
            addressing_mode: None,
            faults: vec![],
        }
    }

    pub fn mig(profile: &str, gi_profile_id: u32, start: u32, size: u32) -> MigDevice {
        MigDevice {
            uuid: format!("MIG-00000000-0000-0000-0000-{start:012}"),
            profile: MigProfile {
                name: profile.into(),
                gi_profile_id,
                multiprocessors: 16,
                copy_engines: 1,
                decoders: 1,
                encoders: 0,
                jpeg_engines: 0,
                ofa_engines: 0,
                memory_bytes: 9984 << 20,
            },
            placement: Placement { start, size },
            gpu_instance_id: start + 1,
            compute_instance_id: 0,
            caps: Some(MigCapMinors { gpu_instance: 12, compute_instance: 13 }),
            faults: vec![],
        }
    }

    pub fn inventory(gpus: Vec<Gpu>) -> Inventory {
        Inventory {
            driver_version: Semver::normalize("580.82.07").unwrap(),
            cuda_driver_version: Semver::normalize("13.0").unwrap(),
            device_majors: DeviceMajors { nvidia_uvm: Some(235), nvidia_caps: Some(236) },
            gpus,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use crate::names::DeviceName;

    #[test]
    fn device_names_follow_nvidia() {
        let parent = gpu(3);
        assert_eq!(parent.device_name().unwrap().as_str(), "gpu-3");
        assert_eq!(mig("1g.10gb", 19, 4, 1).device_name(&parent).unwrap().as_str(), "gpu-3-mig-1g10gb-19-4");
        assert_eq!(mig("1g.10gb+me", 20, 0, 1).device_name(&parent).unwrap().as_str(), "gpu-3-mig-1g10gb-me-20-0");
    }

    #[test]
    fn mig_enabled_gpus_publish_only_their_instances() {
        let mut partitioned = gpu(1);
        partitioned.mig = MigMode::Enabled(vec![mig("3g.40gb", 9, 4, 4), mig("3g.40gb", 9, 0, 4)]);
        let mut stranded = gpu(2);
        stranded.mig = MigMode::Enabled(vec![]);
        let inv = inventory(vec![gpu(0), partitioned, stranded]);
        let names: Vec<String> = inv.published_devices().iter().map(|d| d.name().unwrap().to_string()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4"]);
        let found = inv.find_device(&DeviceName::new("gpu-1-mig-3g40gb-9-4").unwrap()).unwrap();
        assert_eq!(found.gpu().minor, 1);
        assert!(inv.find_device(&DeviceName::new("gpu-2").unwrap()).is_none());
    }

    #[test]
    fn find_device_agrees_with_the_published_list() {
        let mut partitioned = gpu(1);
        partitioned.mig = MigMode::Enabled(vec![mig("3g.40gb", 9, 4, 4), mig("1g.10gb", 19, 0, 1)]);
        let inv = inventory(vec![gpu(0), partitioned, gpu(10), gpu(12)]);
        for device in inv.published_devices() {
            let name = device.name().unwrap();
            let found = inv.find_device(&name).unwrap();
            assert_eq!(found.name().unwrap(), name);
            assert_eq!(found.gpu().uuid, device.gpu().uuid);
        }
        for absent in ["gpu-01", "gpu-2", "gpu-1", "gpu-12-mig-1g10gb-19-0", "gpu-x", "mig-1", "gpu"] {
            assert!(inv.find_device(&DeviceName::new(absent).unwrap()).is_none(), "{absent}");
        }
    }

    #[test]
    fn mig_devices_inherit_parent_faults() {
        let mut parent = gpu(0);
        parent.faults = vec![Fault::Lost];
        let mut m = mig("1g.10gb", 19, 0, 1);
        m.faults = vec![Fault::Xid(94)];
        let d = PublishedDevice::Mig { parent: &parent, mig: &m };
        assert_eq!(d.faults(), vec![Fault::Lost, Fault::Xid(94)]);
    }

    #[test]
    fn clique_id_format() {
        let c = CliqueId { cluster_uuid: uuid::Uuid::from_u128(0xabc), clique: 7 };
        assert_eq!(c.to_string(), "00000000-0000-0000-0000-000000000abc.7");
    }

    #[test]
    fn placements_overlap() {
        let a = Placement { start: 0, size: 4 };
        assert!(a.overlaps(Placement { start: 3, size: 1 }));
        assert!(!a.overlaps(Placement { start: 4, size: 4 }));
        assert_eq!(a.slices().count(), 4);
    }
}
