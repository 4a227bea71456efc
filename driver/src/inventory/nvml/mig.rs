//! A GPU's MIG mode, MIG devices and MIG capabilities.
//!
//! For each MIG device NVML lists, we find its GPU instance (placement,
//! profile) and compute instance, and publish it only when the compute
//! instance spans the whole GPU instance, the only shape NVIDIA's driver
//! advertises. `/dev/nvidia-caps` minors come from `mig-minors`. For a GPU
//! in MIG mode we also read every GPU-instance profile with its possible
//! placements, for dynamic MIG.

use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE;

use super::error::GpuError;
use super::ext::{self, GpuInstance, GpuInstanceProfile};
use super::names;
use super::procfs::MigMinors;
use crate::inventory::dynamic_mig;
use crate::inventory::model::{MigCapabilities, MigCapableProfile, MigDevice, MigMode, MigProfile};

/// What [`read`] finds: the mode with its devices, and for a GPU in MIG
/// mode the profiles and placements it supports.
pub(super) struct MigState {
    pub mode: MigMode,
    pub capabilities: Option<MigCapabilities>,
}

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` of NVML 13's nvml.h (nvml-wrapper-sys
/// 0.10 says 17). Older drivers answer `InvalidArg` for indices they lack.
const GPU_INSTANCE_PROFILE_COUNT: u32 = 0x12;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` of NVML 13's nvml.h (the bindings say 8).
const COMPUTE_INSTANCE_PROFILE_COUNT: u32 = 0x9;

/// The GPU's MIG mode with its devices. A GPU without MIG support is
/// `Disabled`; one whose MIG devices cannot be listed is `Enabled` with none
/// (nothing is published rather than the whole, partitioned GPU).
pub(super) fn read(
    parent: &Device<'_>,
    parent_minor: u32,
    architecture: &str,
    total_memory_bytes: u64,
    minors: &MigMinors,
) -> Result<MigState, GpuError> {
    let disabled = MigState { mode: MigMode::Disabled, capabilities: None };
    let mode = match parent.mig_mode() {
        Ok(mode) => mode,
        Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => return Ok(disabled),
        Err(error) => return Err(GpuError::nvml("MIG mode", error)),
    };
    if mode.current != NVML_DEVICE_MIG_ENABLE {
        return Ok(disabled);
    }
    let mut parent_gpu = ParentGpu { device: parent, minor: parent_minor, total_memory_bytes, profiles: None };
    let capabilities = capabilities(&mut parent_gpu, architecture);
    let count = match parent.mig_device_count() {
        Ok(count) => count,
        Err(NvmlError::GpuLost) => return Err(GpuError::Lost),
        Err(error) => {
            tracing::warn!(minor = parent_minor, %error, "MIG is enabled but NVML cannot count MIG devices; publishing none");
            return Ok(MigState { mode: MigMode::Enabled(Vec::new()), capabilities: None });
        }
    };
    let mut devices = Vec::new();
    for index in 0..count {
        let mig = match parent.mig_device_by_index(index) {
            Ok(mig) => mig,
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
            Err(NvmlError::GpuLost) => return Err(GpuError::Lost),
            Err(error) => {
                tracing::warn!(minor = parent_minor, index, %error, "skipping MIG device: NVML cannot open it");
                continue;
            }
        };
        match parent_gpu.read_device(&mig, minors) {
            Ok(device) => devices.push(device),
            Err(reason) => tracing::warn!(minor = parent_minor, index, %reason, "skipping MIG device"),
        }
    }
    Ok(MigState { mode: MigMode::Enabled(devices), capabilities })
}

/// Every GPU-instance profile of the GPU with its possible placements,
/// named as NVIDIA's driver names them; `None` when NVML offers none.
fn capabilities(parent: &mut ParentGpu<'_, '_>, architecture: &str) -> Option<MigCapabilities> {
    let (device, minor, total_memory_bytes) = (parent.device, parent.minor, parent.total_memory_bytes);
    let mut profiles = Vec::new();
    for (index, p) in parent.profiles().to_vec() {
        let placements = match ext::possible_placements(device, p.id) {
            Ok(placements) => placements,
            Err(error) => {
                tracing::debug!(minor, profile = p.id, %error, "cannot read the profile's placements; not offered");
                continue;
            }
        };
        let Some(memory_slices) = placements.first().map(|pl| pl.size) else { continue };
        let Some(ci_index) = dynamic_mig::compute_instance_profile_index(p.slice_count) else {
            tracing::debug!(minor, profile = p.id, slices = p.slice_count, "no compute-instance profile spans it");
            continue;
        };
        if placements.iter().any(|pl| pl.size != memory_slices || pl.size == 0) {
            tracing::warn!(minor, profile = p.id, ?placements, "placements of unequal sizes; profile not offered");
            continue;
        }
        let mut placements = placements;
        placements.sort_by_key(|pl| pl.start);
        profiles.push(MigCapableProfile {
            profile: MigProfile {
                name: names::mig_profile_name(index, p.slice_count, p.memory_size_mib, total_memory_bytes),
                gi_profile_id: p.id,
                multiprocessors: p.multiprocessor_count,
                copy_engines: p.copy_engine_count,
                decoders: p.decoder_count,
                encoders: p.encoder_count,
                jpeg_engines: p.jpeg_count,
                ofa_engines: p.ofa_count,
                memory_bytes: p.memory_size_mib.saturating_mul(1 << 20),
            },
            profile_index: index,
            compute_instance_profile_index: ci_index,
            compute_slices: p.slice_count,
            memory_slices,
            max_count: p.instance_count,
            placements,
        });
    }
    profiles.sort_by_key(|p| p.profile.gi_profile_id);
    let memory_slices = profiles.iter().flat_map(|p| &p.placements).map(|pl| pl.start + pl.size).max()?;
    let compute_slices = profiles.iter().map(|p| p.compute_slices).max()?;
    Some(MigCapabilities {
        memory_slices,
        compute_slices,
        mig_mode_switchable: dynamic_mig::mig_mode_switchable(architecture),
        profiles,
    })
}

/// The parent GPU and its GPU-instance profiles, read on first need.
struct ParentGpu<'a, 'nvml> {
    device: &'a Device<'nvml>,
    minor: u32,
    total_memory_bytes: u64,
    /// `(profile index, profile)` for every profile the GPU supports.
    profiles: Option<Vec<(u32, GpuInstanceProfile)>>,
}

impl<'nvml> ParentGpu<'_, 'nvml> {
    fn read_device(&mut self, mig: &Device<'nvml>, minors: &MigMinors) -> Result<MigDevice, String> {
        let uuid = mig.uuid().map_err(|e| format!("NVML cannot report its UUID: {e}"))?;
        let gi_id = ext::gpu_instance_id(mig).map_err(|e| format!("{uuid}: no GPU instance id: {e}"))?;
        let ci_id = ext::compute_instance_id(mig).map_err(|e| format!("{uuid}: no compute instance id: {e}"))?;
        let gi = GpuInstance::by_id(self.device, gi_id)
            .map_err(|e| format!("{uuid}: cannot open GPU instance {gi_id}: {e}"))?;
        let gi_info = gi.info().map_err(|e| format!("{uuid}: cannot read GPU instance {gi_id}: {e}"))?;
        let (profile_index, profile) =
            self.profiles().iter().find(|(_, p)| p.id == gi_info.profile_id).cloned().ok_or_else(|| {
                format!("{uuid}: the GPU lists no GPU-instance profile with id {}", gi_info.profile_id)
            })?;

        match compute_instance_slices(&gi, ci_id) {
            Ok(ci_slices) if ci_slices != profile.slice_count => {
                return Err(format!(
                    "{uuid}: compute instance {ci_id} spans {ci_slices} of GPU instance {gi_id}'s {} slices; \
                     only devices whose compute instance spans the GPU instance are published",
                    profile.slice_count
                ));
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(
                minor = self.minor, %uuid, gi_id, ci_id, %error,
                "cannot read the compute instance's profile; assuming it spans the GPU instance"
            ),
        }

        let computed = names::mig_profile_name(
            profile_index,
            profile.slice_count,
            profile.memory_size_mib,
            self.total_memory_bytes,
        );
        // NVIDIA's driver names profiles with go-nvlib's formula, and the
        // name is part of the device name: use it so names match NVIDIA's.
        if let Some(nvml_name) = profile.name.as_deref().and_then(names::nvml_profile_name)
            && nvml_name != computed
        {
            tracing::debug!(minor = self.minor, nvml_name, computed, "NVML's profile name differs from go-nvlib's");
        }
        let name = computed;
        Ok(MigDevice {
            uuid,
            profile: MigProfile {
                name,
                gi_profile_id: profile.id,
                multiprocessors: profile.multiprocessor_count,
                copy_engines: profile.copy_engine_count,
                decoders: profile.decoder_count,
                encoders: profile.encoder_count,
                jpeg_engines: profile.jpeg_count,
                ofa_engines: profile.ofa_count,
                memory_bytes: profile.memory_size_mib.saturating_mul(1 << 20),
            },
            placement: gi_info.placement,
            gpu_instance_id: gi_id,
            compute_instance_id: ci_id,
            caps: minors.lookup(self.minor, gi_id, ci_id),
            faults: Vec::new(),
        })
    }

    fn profiles(&mut self) -> &[(u32, GpuInstanceProfile)] {
        let (device, minor) = (self.device, self.minor);
        self.profiles.get_or_insert_with(|| read_profiles(device, minor))
    }
}

/// Every GPU-instance profile the GPU supports, by NVML profile index.
fn read_profiles(device: &Device<'_>, minor: u32) -> Vec<(u32, GpuInstanceProfile)> {
    let mut profiles = Vec::new();
    for index in 0..GPU_INSTANCE_PROFILE_COUNT {
        match ext::gpu_instance_profile(device, index) {
            Ok(profile) => profiles.push((index, profile)),
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(error) => tracing::debug!(minor, index, %error, "cannot read GPU-instance profile"),
        }
    }
    profiles
}

/// How many compute slices compute instance `ci_id` of `gi` spans.
fn compute_instance_slices(gi: &GpuInstance<'_>, ci_id: u32) -> Result<u32, NvmlError> {
    let ci_profile_id = gi.compute_instance_by_id(ci_id)?.info()?.profile_id;
    for index in 0..COMPUTE_INSTANCE_PROFILE_COUNT {
        match gi.compute_instance_profile(index) {
            Ok(profile) if profile.id == ci_profile_id => return Ok(profile.slice_count),
            Ok(_) | Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(error) => return Err(error),
        }
    }
    Err(NvmlError::NotFound)
}
