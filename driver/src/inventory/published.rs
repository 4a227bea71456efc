//! The devices a node publishes, named as NVIDIA names them, and found
//! again by name.

use super::dynamic_mig;
use super::model::{Fault, Gpu, Inventory, MigCapableProfile, MigDevice, MigMode, Placement, VFIO_PREFIX};
use crate::names::{DeviceName, InvalidName};

/// A device the node publishes: a whole GPU, one MIG device of it, or
/// (dynamic MIG) one profile at one placement, which exists only once
/// prepared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PublishedDevice<'a> {
    Gpu(&'a Gpu),
    Mig {
        parent: &'a Gpu,
        mig: &'a MigDevice,
    },
    DynamicMig {
        parent: &'a Gpu,
        profile: &'a MigCapableProfile,
        placement: Placement,
    },
    /// The whole GPU for VFIO passthrough (`gpu-vfio-<minor>`), published
    /// beside `gpu-<minor>` with the `PassthroughSupport` gate only.
    Vfio(&'a Gpu),
}

impl Gpu {
    /// The devices this GPU offers, in [`Inventory::published_devices`]'
    /// order: the whole GPU when MIG is off, otherwise its MIG devices by
    /// placement; when dynamic, one device per profile and placement
    /// (smallest first), then the whole GPU where MIG mode can be switched.
    fn push_published<'a>(&'a self, out: &mut Vec<PublishedDevice<'a>>) {
        match &self.mig {
            MigMode::Disabled => out.push(PublishedDevice::Gpu(self)),
            MigMode::Enabled(migs) => {
                let mut migs: Vec<&MigDevice> = migs.iter().collect();
                migs.sort_by_key(|m| (m.placement.start, m.profile.gi_profile_id));
                out.extend(migs.into_iter().map(|mig| PublishedDevice::Mig { parent: self, mig }));
            }
            MigMode::Dynamic(_) => {
                // Without a profile table there is nothing to offer (`select` never does this).
                let Some(caps) = &self.mig_capabilities else { return };
                out.extend(caps.devices().map(|(profile, placement)| PublishedDevice::DynamicMig {
                    parent: self,
                    profile,
                    placement,
                }));
                if caps.mig_mode_switchable {
                    out.push(PublishedDevice::Gpu(self));
                }
            }
        }
    }
}

impl MigDevice {
    /// `gpu-<parentMinor>-mig-<profile>-<giProfileId>-<placementStart>`, with
    /// the profile lowered to a DNS label the way NVIDIA's driver does it
    /// (`1g.10gb+me` becomes `1g10gb-me`).
    pub fn device_name(&self, parent: &Gpu) -> Result<DeviceName, InvalidName> {
        dynamic_mig::mig_device_name(parent.minor, &self.profile.name, self.profile.gi_profile_id, self.placement.start)
    }
}

impl<'a> PublishedDevice<'a> {
    pub fn name(&self) -> Result<DeviceName, InvalidName> {
        match self {
            PublishedDevice::Gpu(gpu) => gpu.device_name(),
            PublishedDevice::Mig { parent, mig } => mig.device_name(parent),
            PublishedDevice::DynamicMig { parent, profile, placement } => dynamic_mig::mig_device_name(
                parent.minor,
                &profile.profile.name,
                profile.profile.gi_profile_id,
                placement.start,
            ),
            PublishedDevice::Vfio(gpu) => gpu.vfio_device_name(),
        }
    }

    /// The physical GPU this device lives on.
    pub fn gpu(&self) -> &'a Gpu {
        match self {
            PublishedDevice::Gpu(gpu) | PublishedDevice::Vfio(gpu) => gpu,
            PublishedDevice::Mig { parent, .. } | PublishedDevice::DynamicMig { parent, .. } => parent,
        }
    }

    /// Faults of the device itself and, for a MIG device, of its parent GPU.
    pub fn faults(&self) -> Vec<Fault> {
        match self {
            PublishedDevice::Gpu(gpu) | PublishedDevice::Vfio(gpu) => gpu.faults.clone(),
            PublishedDevice::Mig { parent, mig } => parent.faults.iter().chain(&mig.faults).copied().collect(),
            PublishedDevice::DynamicMig { parent, .. } => parent.faults.clone(),
        }
    }
}

impl Inventory {
    /// The devices this node offers, in a stable order: per GPU (by minor),
    /// the whole GPU when MIG is off, otherwise its MIG devices by placement;
    /// for a dynamic GPU, one device per profile and placement (smallest
    /// first, see [`MigCapabilities::devices`]), then the
    /// whole GPU where MIG mode can be switched.
    pub fn published_devices(&self) -> Vec<PublishedDevice<'_>> {
        let mut out = Vec::new();
        for gpu in &self.gpus {
            gpu.push_published(&mut out);
        }
        out
    }

    /// The GPUs' VFIO devices (published with `PassthroughSupport`), by minor.
    pub fn vfio_devices(&self) -> impl Iterator<Item = PublishedDevice<'_>> {
        self.gpus.iter().filter(|g| g.passthrough_capable()).map(PublishedDevice::Vfio)
    }

    /// Looks a published device up by its device name.
    ///
    /// Every name starts with its GPU's `gpu-<minor>`, so only that GPU's
    /// devices are named and compared: a prepare looks each of its devices
    /// up several times, and a dynamic MIG GPU offers dozens.
    pub fn find_device(&self, name: &DeviceName) -> Option<PublishedDevice<'_>> {
        if let Some(minor) = name.as_str().strip_prefix(VFIO_PREFIX) {
            let gpu = self.gpus.iter().find(|g| g.minor.to_string() == minor)?;
            return gpu.passthrough_capable().then_some(PublishedDevice::Vfio(gpu));
        }
        let minor = gpu_minor_of(name.as_str());
        let mut candidates = Vec::new();
        for gpu in self.gpus.iter().filter(|g| minor.is_none_or(|m| g.minor == m)) {
            gpu.push_published(&mut candidates);
        }
        candidates.into_iter().find(|d| d.name().is_ok_and(|n| &n == name))
    }
}

/// The GPU minor a device name starts with (`gpu-3`, `gpu-3-mig-...`).
fn gpu_minor_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("gpu-")?;
    let digits = rest.split('-').next()?;
    digits.parse().ok()
}
