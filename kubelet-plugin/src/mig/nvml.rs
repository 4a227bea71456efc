//! [`MigControl`] on NVML. nvml-wrapper 0.13 has MIG mode get/set and MIG
//! device handles (used here) but no GPU-instance or compute-instance
//! creation, destruction or lookup: those calls are made by hand through
//! the symbols nvml-wrapper loaded (`Nvml::lib()`), as the driver crate's
//! `inventory::nvml::ext` does for its queries. A symbol an old driver lacks
//! is an error value, never a panic.

use std::ptr;

use gpu_dra_driver::inventory::Placement;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::*;

use super::control::{MigControl, MigControlError, MigModeState, ObservedInstance};

/// GPU-instance ids NVML hands out: `/proc/driver/nvidia-caps/mig-minors`
/// lists `gi0` to `gi14` per GPU.
const MAX_GPU_INSTANCE_ID: u32 = 15;
/// Compute-instance ids within a GPU instance (`ci0` to `ci7`).
const MAX_COMPUTE_INSTANCE_ID: u32 = 8;

/// One NVML session for the plugin's life (NVIDIA's driver found handle
/// lookups slow without one).
pub struct NvmlMigControl {
    nvml: Nvml,
}

impl NvmlMigControl {
    pub fn new(nvml: Nvml) -> Self {
        Self { nvml }
    }

    fn gpu(&self, uuid: &str, what: &str) -> Result<Device<'_>, MigControlError> {
        self.nvml.device_by_uuid(uuid).map_err(|error| match error {
            NvmlError::NotFound | NvmlError::InvalidArg => {
                MigControlError::NoGpu { what: what.into(), gpu: uuid.into() }
            }
            other => nvml_error(what, other),
        })
    }

    fn gpu_instance(&self, device: &Device<'_>, id: u32) -> Result<Option<nvmlGpuInstance_t>, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
        let mut handle: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: a live device handle and a valid out pointer.
        match nvml_try(unsafe { sym(raw(device), id, &mut handle) }) {
            Ok(()) if !handle.is_null() => Ok(Some(handle)),
            Ok(()) | Err(NvmlError::NotFound) => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn compute_instance(&self, gi: nvmlGpuInstance_t, id: u32) -> Result<Option<nvmlComputeInstance_t>, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceGetComputeInstanceById.as_ref())?;
        let mut handle: nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: a GPU-instance handle NVML gave us in this session and a valid out pointer.
        match nvml_try(unsafe { sym(gi, id, &mut handle) }) {
            Ok(()) if !handle.is_null() => Ok(Some(handle)),
            Ok(()) | Err(NvmlError::NotFound) => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn gi_info(&self, gi: nvmlGpuInstance_t) -> Result<nvmlGpuInstanceInfo_t, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
        // SAFETY: all-zero is a valid value of this struct of integers and pointers.
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a GPU-instance handle from this session and a struct we own.
        nvml_try(unsafe { sym(gi, &mut info) })?;
        Ok(info)
    }

    fn required_gi(&self, device: &Device<'_>, id: u32, what: &str) -> Result<nvmlGpuInstance_t, MigControlError> {
        self.gpu_instance(device, id)
            .map_err(|e| nvml_error(what, e))?
            .ok_or_else(|| MigControlError::Nvml { what: what.into(), message: format!("no GPU instance {id}") })
    }
}

/// The raw handle of a device while it is borrowed.
fn raw(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: copies the pointer nvml-wrapper holds; used only while
    // `device`, and the `Nvml` it borrows, are alive.
    unsafe { device.handle() }
}

fn nvml_error(what: &str, error: NvmlError) -> MigControlError {
    let code = |c| matches!(error, NvmlError::UnexpectedVariant(v) if v == c);
    if code(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES) {
        return MigControlError::NoRoom {
            what: what.into(),
            hint: ": another GPU instance overlaps this placement (one the plugin did not make, or one still being \
                   destroyed); nvidia-smi mig -lgi lists them"
                .into(),
        };
    }
    if code(nvmlReturn_enum_NVML_ERROR_IN_USE) || matches!(error, NvmlError::InUse) {
        return MigControlError::InUse { what: what.into() };
    }
    MigControlError::Nvml { what: what.into(), message: error.to_string() }
}

impl MigControl for NvmlMigControl {
    fn create_gpu_instance(&self, gpu: &str, profile_id: u32, placement: Placement) -> Result<u32, MigControlError> {
        let what =
            format!("creating GPU instance of profile {profile_id} at {}+{} on {gpu}", placement.start, placement.size);
        let device = self.gpu(gpu, &what)?;
        let lib = self.nvml.lib();
        let sym = nvml_sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref()).map_err(|e| nvml_error(&what, e))?;
        let wanted = nvmlGpuInstancePlacement_t { start: placement.start, size: placement.size };
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: a live device handle, a placement we own and a valid out pointer.
        nvml_try(unsafe { sym(raw(&device), profile_id, &wanted, &mut gi) }).map_err(|e| nvml_error(&what, e))?;
        if gi.is_null() {
            return Err(MigControlError::Nvml { what, message: "NVML returned no handle".into() });
        }
        Ok(self.gi_info(gi).map_err(|e| nvml_error(&what, e))?.id)
    }

    fn create_compute_instance(
        &self,
        gpu: &str,
        gi: u32,
        profile_index: u32,
    ) -> Result<(u32, String), MigControlError> {
        let what = format!("creating the compute instance of GPU instance {gi} on {gpu}");
        let device = self.gpu(gpu, &what)?;
        let handle = self.required_gi(&device, gi, &what)?;
        let lib = self.nvml.lib();
        // The compute-instance profile id of that index, with shared engines.
        let profile_id = {
            let sym = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfoV.as_ref())
                .map_err(|e| nvml_error(&what, e))?;
            // SAFETY: all-zero is a valid value of this struct of integers.
            let mut info: nvmlComputeInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
            info.version = std::mem::size_of::<nvmlComputeInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
            // SAFETY: a GPU-instance handle from this session and a v2 struct we own, tagged v2.
            nvml_try(unsafe { sym(handle, profile_index, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut info) })
                .map_err(|e| nvml_error(&what, e))?;
            info.id
        };
        let sym = nvml_sym(lib.nvmlGpuInstanceCreateComputeInstance.as_ref()).map_err(|e| nvml_error(&what, e))?;
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: a GPU-instance handle from this session and a valid out pointer.
        nvml_try(unsafe { sym(handle, profile_id, &mut ci) }).map_err(|e| nvml_error(&what, e))?;
        let sym = nvml_sym(lib.nvmlComputeInstanceGetInfo_v2.as_ref()).map_err(|e| nvml_error(&what, e))?;
        // SAFETY: all-zero is a valid value of this struct of integers and pointers.
        let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: the compute-instance handle just returned and a struct we own.
        nvml_try(unsafe { sym(ci, &mut info) }).map_err(|e| nvml_error(&what, e))?;
        let uuid = self.mig_uuid(gpu, gi, info.id)?;
        Ok((info.id, uuid))
    }

    fn destroy_compute_instance(&self, gpu: &str, gi: u32, ci: u32) -> Result<(), MigControlError> {
        let what = format!("destroying compute instance {ci} of GPU instance {gi} on {gpu}");
        let device = self.gpu(gpu, &what)?;
        let Some(handle) = self.gpu_instance(&device, gi).map_err(|e| nvml_error(&what, e))? else { return Ok(()) };
        let Some(ci) = self.compute_instance(handle, ci).map_err(|e| nvml_error(&what, e))? else { return Ok(()) };
        let sym = nvml_sym(self.nvml.lib().nvmlComputeInstanceDestroy.as_ref()).map_err(|e| nvml_error(&what, e))?;
        // SAFETY: a compute-instance handle from this session.
        nvml_try(unsafe { sym(ci) }).map_err(|e| nvml_error(&what, e))
    }

    fn destroy_gpu_instance(&self, gpu: &str, gi: u32) -> Result<(), MigControlError> {
        let what = format!("destroying GPU instance {gi} on {gpu}");
        let device = self.gpu(gpu, &what)?;
        let Some(handle) = self.gpu_instance(&device, gi).map_err(|e| nvml_error(&what, e))? else { return Ok(()) };
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceDestroy.as_ref()).map_err(|e| nvml_error(&what, e))?;
        // SAFETY: a GPU-instance handle from this session.
        nvml_try(unsafe { sym(handle) }).map_err(|e| nvml_error(&what, e))
    }

    fn instances(&self, gpu: &str) -> Result<Vec<ObservedInstance>, MigControlError> {
        let what = format!("listing the MIG instances of {gpu}");
        let device = self.gpu(gpu, &what)?;
        let mut out = Vec::new();
        for id in 0..MAX_GPU_INSTANCE_ID {
            let handle = match self.gpu_instance(&device, id) {
                Ok(Some(handle)) => handle,
                Ok(None) => continue,
                // MIG mode off: no instances.
                Err(NvmlError::NotSupported) => return Ok(Vec::new()),
                Err(error) => return Err(nvml_error(&what, error)),
            };
            let info = self.gi_info(handle).map_err(|e| nvml_error(&what, e))?;
            let mut compute_instances = Vec::new();
            for ci in 0..MAX_COMPUTE_INSTANCE_ID {
                if self.compute_instance(handle, ci).map_err(|e| nvml_error(&what, e))?.is_some() {
                    compute_instances.push(ci);
                }
            }
            out.push(ObservedInstance {
                gpu_instance_id: info.id,
                profile_id: info.profileId,
                placement: Placement { start: info.placement.start, size: info.placement.size },
                compute_instances,
            });
        }
        Ok(out)
    }

    fn mig_mode(&self, gpu: &str) -> Result<MigModeState, MigControlError> {
        let what = format!("reading the MIG mode of {gpu}");
        let mode = self.gpu(gpu, &what)?.mig_mode().map_err(|e| nvml_error(&what, e))?;
        Ok(MigModeState {
            current: mode.current == NVML_DEVICE_MIG_ENABLE,
            pending: mode.pending == NVML_DEVICE_MIG_ENABLE,
        })
    }

    fn set_mig_mode(&self, gpu: &str, on: bool) -> Result<MigModeState, MigControlError> {
        let what = format!("turning MIG mode {} on {gpu}", if on { "on" } else { "off" });
        // nvml-wrapper returns the activation status; the mode read after
        // says whether it took effect (a GPU needing a reset keeps the old).
        self.gpu(gpu, &what)?.set_mig_mode(on).map_err(|e| nvml_error(&what, e))?;
        self.mig_mode(gpu)
    }

    fn mig_uuid(&self, gpu: &str, gi: u32, ci: u32) -> Result<String, MigControlError> {
        let what = format!("reading the UUID of MIG device gi{gi}/ci{ci} on {gpu}");
        let device = self.gpu(gpu, &what)?;
        let count = device.mig_device_count().map_err(|e| nvml_error(&what, e))?;
        for index in 0..count {
            let Ok(mig) = device.mig_device_by_index(index) else { continue };
            let ids = gpu_dra_driver::inventory::nvml::ext::gpu_instance_id(&mig)
                .and_then(|g| gpu_dra_driver::inventory::nvml::ext::compute_instance_id(&mig).map(|c| (g, c)));
            if ids.is_ok_and(|ids| ids == (gi, ci)) {
                return mig.uuid().map_err(|e| nvml_error(&what, e));
            }
        }
        Err(MigControlError::Nvml { what, message: "NVML lists no MIG device with these instance ids".into() })
    }
}
