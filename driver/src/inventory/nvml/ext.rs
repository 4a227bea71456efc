//! Safe wrappers for the NVML calls nvml-wrapper 0.13 lacks or gets wrong:
//! MIG instance ids, GPU/compute instances and their profiles (with names),
//! the NVLink remote device type (nvml-wrapper's discards the answer) and
//! GPU fabric info (clique ids).
//!
//! Each function resolves its symbol from the library nvml-wrapper loaded
//! (`Nvml::lib()`): a symbol an older driver lacks is an error value
//! ([`NvmlError::FailedToLoadSymbol`]), never a panic. Out-structs start
//! zeroed; versioned ones carry `NVML_STRUCT_VERSION` (`sizeof | ver << 24`)
//! and fall back to older versions when the driver rejects the newer one
//! (`NVML_ERROR_ARGUMENT_VERSION_MISMATCH` or `InvalidArg`). C strings are
//! read up to their NUL or the end of their buffer, as lossy UTF-8. Handles
//! borrow the [`Nvml`] they came from, so none outlives the library.

use std::mem;
use std::os::raw::c_char;

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::struct_wrappers::device::ProfileInfo;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::*;

use crate::inventory::model::Placement;

/// `NVML_STRUCT_VERSION(T, version)` from nvml.h.
const fn struct_version<T>(version: u32) -> u32 {
    mem::size_of::<T>() as u32 | (version << 24)
}

pub const GPU_INSTANCE_PROFILE_INFO_V3: u32 = struct_version::<nvmlGpuInstanceProfileInfo_v3_t>(3);
pub const GPU_INSTANCE_PROFILE_INFO_V2: u32 = struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2);
pub const COMPUTE_INSTANCE_PROFILE_INFO_V2: u32 = struct_version::<nvmlComputeInstanceProfileInfo_v2_t>(2);
pub const GPU_FABRIC_INFO_V3: u32 = struct_version::<nvmlGpuFabricInfo_v3_t>(3);
pub const GPU_FABRIC_INFO_V2: u32 = struct_version::<nvmlGpuFabricInfo_v2_t>(2);

// The bindings declare nvmlDeviceGetGpuInstanceProfileInfoV with a v2 out
// pointer; we hand it a v3 struct (tagged v3), which must be no smaller.
const _: () =
    assert!(mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>() >= mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>());
// nvmlDeviceGetGpuFabricInfoV takes the v3 struct; a v2 answer is a prefix.
const _: () = assert!(mem::size_of::<nvmlGpuFabricInfo_v3_t>() >= mem::size_of::<nvmlGpuFabricInfo_v2_t>());

/// Whether NVML rejected a struct version (`NVML_ERROR_ARGUMENT_VERSION_MISMATCH`,
/// which nvml-wrapper surfaces as an unexpected variant).
pub fn is_version_mismatch(error: &NvmlError) -> bool {
    matches!(error, NvmlError::UnexpectedVariant(code) if *code == nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
}

/// Whether a versioned query's error means "try an older struct version":
/// a version mismatch, or `InvalidArg`, which is also how NVML rejects an
/// argument it does not understand. (When `InvalidArg` really means a bad
/// argument, the older query fails the same way and that error is returned.)
fn try_older_version(error: &NvmlError) -> bool {
    is_version_mismatch(error) || matches!(error, NvmlError::InvalidArg)
}

/// A C string in a fixed buffer: up to the first NUL (or the whole buffer),
/// invalid UTF-8 replaced.
pub fn c_string_lossy(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().map(|&c| u8::from_ne_bytes(c.to_ne_bytes())).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// NVML out-structs for which all-zero bytes are a valid value.
///
/// # Safety
///
/// Implement only for `repr(C)` structs made of integers, arrays of integers
/// and raw pointers.
unsafe trait Zeroed: Sized {
    fn zeroed() -> Self {
        // SAFETY: the trait's contract: all-zero bytes are a valid `Self`.
        unsafe { mem::zeroed() }
    }
}

/// Implements [`Zeroed`] for bindgen `repr(C)` structs after checking the
/// claim at the call site: every field is an integer, an integer array, a
/// nested such struct or a raw pointer (all-zero is null).
macro_rules! zeroed_structs {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: all fields are integers, integer arrays, nested such
        // structs or raw pointers (see the invocation below).
        unsafe impl Zeroed for $t {}
    )*};
}

// Fields checked against nvml-wrapper-sys 0.10 bindings.rs: integers and
// `c_char`/`c_uchar` arrays, plus `nvmlDevice_t` / `nvmlGpuInstance_t`
// pointers and placement structs of integers in the two *Info_t structs.
zeroed_structs!(
    nvmlGpuInstanceProfileInfo_v3_t,
    nvmlGpuInstanceProfileInfo_v2_t,
    nvmlGpuInstanceInfo_t,
    nvmlComputeInstanceInfo_t,
    nvmlComputeInstanceProfileInfo_v2_t,
    nvmlComputeInstanceProfileInfo_t,
    nvmlGpuFabricInfo_v3_t,
    nvmlGpuFabricInfo_t,
    nvmlDeviceAddressingMode_v1_t,
);

pub const DEVICE_ADDRESSING_MODE_V1: u32 = struct_version::<nvmlDeviceAddressingMode_v1_t>(1);

/// `nvmlDeviceGetAddressingMode`: how the GPU reaches system memory
/// (`NVML_DEVICE_ADDRESSING_MODE_NONE` / `_HMM` / `_ATS`), on drivers that
/// have it (R570+); a missing symbol is `FailedToLoadSymbol`.
pub fn addressing_mode(device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetAddressingMode.as_ref())?;
    let mut mode = nvmlDeviceAddressingMode_v1_t::zeroed();
    mode.version = DEVICE_ADDRESSING_MODE_V1;
    // SAFETY: a live device handle and a pointer to a struct we own.
    nvml_try(unsafe { sym(raw(device), &mut mode) })?;
    Ok(mode.value)
}

/// The raw handle of a device, for the duration of a borrow of it.
fn raw(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: `handle` only copies out the pointer nvml-wrapper holds (it is
    // unsafe to make callers think about lifetimes). Every caller here uses
    // it while `device`, and so the `Nvml` it borrows, is alive.
    unsafe { device.handle() }
}

/// Most placements read for one profile: a GPU has at most 8 memory slices,
/// so anything larger is a broken answer, not a reason to allocate.
const MAX_PLACEMENTS: u32 = 64;

/// Every placement NVML offers for GPU-instance profile id `profile_id`
/// on a physical GPU (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`,
/// asked for the count first). nvml-wrapper's `possible_placements` never
/// sets its vector's length and so always answers none.
pub fn possible_placements(device: &Device<'_>, profile_id: u32) -> Result<Vec<Placement>, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref())?;
    let mut count: u32 = 0;
    // SAFETY: a live device handle; a null array with a valid count pointer
    // asks NVML for the number of placements only.
    nvml_try(unsafe { sym(raw(device), profile_id, std::ptr::null_mut(), &mut count) })?;
    if count > MAX_PLACEMENTS {
        return Err(NvmlError::Unknown);
    }
    let mut placements = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: a live device handle and an array of `count` placements we own,
    // with `count` saying its length.
    nvml_try(unsafe { sym(raw(device), profile_id, placements.as_mut_ptr(), &mut count) })?;
    placements.truncate(count as usize);
    Ok(placements.iter().map(|p| Placement { start: p.start, size: p.size }).collect())
}

/// The GPU-instance id of a MIG device handle (`nvmlDeviceGetGpuInstanceId`).
pub fn gpu_instance_id(mig_device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(mig_device.nvml().lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let mut id = 0;
    // SAFETY: a live device handle and a valid out pointer to a c_uint.
    nvml_try(unsafe { sym(raw(mig_device), &mut id) })?;
    Ok(id)
}

/// The compute-instance id of a MIG device handle (`nvmlDeviceGetComputeInstanceId`).
pub fn compute_instance_id(mig_device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(mig_device.nvml().lib().nvmlDeviceGetComputeInstanceId.as_ref())?;
    let mut id = 0;
    // SAFETY: a live device handle and a valid out pointer to a c_uint.
    nvml_try(unsafe { sym(raw(mig_device), &mut id) })?;
    Ok(id)
}

/// What a GPU-instance profile provides, whichever query version answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstanceProfile {
    /// The profile id (`nvidia-smi mig -cgi <id>`), not the profile index.
    pub id: u32,
    /// Compute slices: the `G` of `<G>g.<GB>gb`.
    pub slice_count: u32,
    pub instance_count: u32,
    pub multiprocessor_count: u32,
    pub copy_engine_count: u32,
    pub decoder_count: u32,
    pub encoder_count: u32,
    pub jpeg_count: u32,
    pub ofa_count: u32,
    /// In MiB, although NVML calls the field `memorySizeMB`.
    pub memory_size_mib: u64,
    /// NVML's name, e.g. `MIG 1g.10gb`; `None` from the v1 query.
    pub name: Option<String>,
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// The v2 and v3 profile structs share every field we read.
macro_rules! profile_from_versioned {
    ($($t:ty),*) => {$(
        impl From<&$t> for GpuInstanceProfile {
            fn from(p: &$t) -> Self {
                Self {
                    id: p.id,
                    slice_count: p.sliceCount,
                    instance_count: p.instanceCount,
                    multiprocessor_count: p.multiprocessorCount,
                    copy_engine_count: p.copyEngineCount,
                    decoder_count: p.decoderCount,
                    encoder_count: p.encoderCount,
                    jpeg_count: p.jpegCount,
                    ofa_count: p.ofaCount,
                    memory_size_mib: p.memorySizeMB,
                    name: non_empty(c_string_lossy(&p.name)),
                }
            }
        }
    )*};
}

profile_from_versioned!(nvmlGpuInstanceProfileInfo_v3_t, nvmlGpuInstanceProfileInfo_v2_t);

impl From<ProfileInfo> for GpuInstanceProfile {
    fn from(p: ProfileInfo) -> Self {
        Self {
            id: p.id,
            slice_count: p.slice_count,
            instance_count: p.instance_count,
            multiprocessor_count: p.multiprocessor_count,
            copy_engine_count: p.copy_engine_count,
            decoder_count: p.decoder_count,
            encoder_count: p.encoder_count,
            jpeg_count: p.jpeg_count,
            ofa_count: p.ofa_count,
            memory_size_mib: p.memory_size_mb,
            name: None,
        }
    }
}

/// The GPU-instance profile at `profile_index` (`NVML_GPU_INSTANCE_PROFILE_*`)
/// of a physical GPU: `nvmlDeviceGetGpuInstanceProfileInfoV` with the v3
/// struct, then v2 when the driver rejects v3, then the unversioned v1 query
/// (no name) when the V function is missing or takes neither.
/// `NotSupported` / `InvalidArg` mean the GPU has no such profile.
pub fn gpu_instance_profile(device: &Device<'_>, profile_index: u32) -> Result<GpuInstanceProfile, NvmlError> {
    if let Ok(sym) = device.nvml().lib().nvmlDeviceGetGpuInstanceProfileInfoV.as_ref() {
        let mut v3 = nvmlGpuInstanceProfileInfo_v3_t::zeroed();
        v3.version = GPU_INSTANCE_PROFILE_INFO_V3;
        let out = (&mut v3 as *mut nvmlGpuInstanceProfileInfo_v3_t).cast::<nvmlGpuInstanceProfileInfo_v2_t>();
        // SAFETY: a live device handle and a pointer to a v3 struct we own
        // whose version field says v3, so NVML writes the v3 layout into it
        // (the bindings type the parameter as v2; v3 is no smaller, asserted above).
        match nvml_try(unsafe { sym(raw(device), profile_index, out) }) {
            Ok(()) => return Ok(GpuInstanceProfile::from(&v3)),
            Err(e) if !try_older_version(&e) => return Err(e),
            Err(_) => {}
        }
        let mut v2 = nvmlGpuInstanceProfileInfo_v2_t::zeroed();
        v2.version = GPU_INSTANCE_PROFILE_INFO_V2;
        // SAFETY: a live device handle and a pointer to a v2 struct we own, tagged v2.
        match nvml_try(unsafe { sym(raw(device), profile_index, &mut v2) }) {
            Ok(()) => return Ok(GpuInstanceProfile::from(&v2)),
            Err(e) if !try_older_version(&e) => return Err(e),
            Err(_) => {}
        }
    }
    device.profile_info(profile_index).map(GpuInstanceProfile::from)
}

/// What the type at the far end of an NVLink is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvLinkRemoteDeviceType {
    Gpu,
    /// An IBM POWER CPU's NVLink processing unit.
    IbmNpu,
    Switch,
    Unknown(u32),
}

impl NvLinkRemoteDeviceType {
    #[allow(non_upper_case_globals)] // bindgen's names for nvml.h's enum values
    fn from_c(value: nvmlIntNvLinkDeviceType_t) -> Self {
        match value {
            nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU => Self::Gpu,
            nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU => Self::IbmNpu,
            nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH => Self::Switch,
            other => Self::Unknown(other),
        }
    }
}

/// The device type at the far end of `link` (`nvmlDeviceGetNvLinkRemoteDeviceType`).
pub fn nvlink_remote_device_type(device: &Device<'_>, link: u32) -> Result<NvLinkRemoteDeviceType, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref())?;
    let mut kind: nvmlIntNvLinkDeviceType_t = nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    // SAFETY: a live device handle and a valid out pointer to the enum (a c_uint).
    nvml_try(unsafe { sym(raw(device), link, &mut kind) })?;
    Ok(NvLinkRemoteDeviceType::from_c(kind))
}

/// A GPU's place in an NVLink fabric (multi-node NVLink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuFabricInfo {
    pub cluster_uuid: [u8; 16],
    /// An `nvmlReturn_t`: whether fabric registration succeeded.
    pub status: u32,
    pub clique_id: u32,
    /// `NVML_GPU_FABRIC_STATE_*`.
    pub state: u8,
}

/// The GPU's fabric info: `nvmlDeviceGetGpuFabricInfoV` with the v3 struct,
/// then v2 when the driver rejects v3, then the legacy `nvmlDeviceGetGpuFabricInfo`
/// when the V function is missing or takes neither. `NotSupported` before
/// Hopper and on GPUs outside an NVLink fabric.
pub fn gpu_fabric_info(device: &Device<'_>) -> Result<GpuFabricInfo, NvmlError> {
    let lib = device.nvml().lib();
    if let Ok(sym) = lib.nvmlDeviceGetGpuFabricInfoV.as_ref() {
        for version in [GPU_FABRIC_INFO_V3, GPU_FABRIC_INFO_V2] {
            let mut info = nvmlGpuFabricInfo_v3_t::zeroed();
            info.version = version;
            // SAFETY: a live device handle and a pointer to a v3 struct we
            // own; tagged v2, NVML writes only the v2 prefix of it.
            match nvml_try(unsafe { sym(raw(device), &mut info) }) {
                Ok(()) => {
                    return Ok(GpuFabricInfo {
                        cluster_uuid: info.clusterUuid,
                        status: info.status,
                        clique_id: info.cliqueId,
                        state: info.state,
                    });
                }
                Err(e) if !try_older_version(&e) => return Err(e),
                Err(_) => {}
            }
        }
    }
    let sym = nvml_sym(lib.nvmlDeviceGetGpuFabricInfo.as_ref())?;
    let mut info = nvmlGpuFabricInfo_t::zeroed();
    // SAFETY: a live device handle and a pointer to the unversioned struct we own.
    nvml_try(unsafe { sym(raw(device), &mut info) })?;
    Ok(GpuFabricInfo {
        cluster_uuid: info.clusterUuid,
        status: info.status,
        clique_id: info.cliqueId,
        state: info.state,
    })
}

/// A GPU instance of a MIG-enabled GPU. Borrows the [`Nvml`] it came from.
#[derive(Debug)]
pub struct GpuInstance<'nvml> {
    handle: nvmlGpuInstance_t,
    nvml: &'nvml Nvml,
}

/// What `nvmlGpuInstanceGetInfo` reports about a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInstanceInfo {
    pub id: u32,
    pub profile_id: u32,
    pub placement: Placement,
}

/// A compute instance inside a GPU instance. Borrows the [`Nvml`] it came from.
#[derive(Debug)]
pub struct ComputeInstance<'nvml> {
    handle: nvmlComputeInstance_t,
    nvml: &'nvml Nvml,
}

/// What `nvmlComputeInstanceGetInfo_v2` reports about a compute instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeInstanceInfo {
    pub id: u32,
    pub profile_id: u32,
}

/// A compute-instance profile, as far as we need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeInstanceProfile {
    pub id: u32,
    pub slice_count: u32,
    /// NVML's name; `None` from the v1 query.
    pub name: Option<String>,
}

impl<'nvml> GpuInstance<'nvml> {
    /// The GPU instance `id` of a physical GPU (`nvmlDeviceGetGpuInstanceById`).
    /// NVML may require privileges for this query.
    pub fn by_id(parent: &Device<'nvml>, id: u32) -> Result<Self, NvmlError> {
        let nvml = parent.nvml();
        let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
        let mut handle: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: a live device handle and a valid out pointer to a handle.
        nvml_try(unsafe { sym(raw(parent), id, &mut handle) })?;
        if handle.is_null() {
            return Err(NvmlError::Unknown);
        }
        Ok(Self { handle, nvml })
    }

    /// Its id, profile id and placement (`nvmlGpuInstanceGetInfo`).
    pub fn info(&self) -> Result<GpuInstanceInfo, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
        let mut info = nvmlGpuInstanceInfo_t::zeroed();
        // SAFETY: a non-null GPU-instance handle NVML gave us while the
        // borrowed `Nvml` is initialized, and a pointer to a struct we own.
        nvml_try(unsafe { sym(self.handle, &mut info) })?;
        Ok(GpuInstanceInfo {
            id: info.id,
            profile_id: info.profileId,
            placement: Placement { start: info.placement.start, size: info.placement.size },
        })
    }

    /// Its compute instance `id` (`nvmlGpuInstanceGetComputeInstanceById`).
    pub fn compute_instance_by_id(&self, id: u32) -> Result<ComputeInstance<'nvml>, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceGetComputeInstanceById.as_ref())?;
        let mut handle: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: a live GPU-instance handle and a valid out pointer to a handle.
        nvml_try(unsafe { sym(self.handle, id, &mut handle) })?;
        if handle.is_null() {
            return Err(NvmlError::Unknown);
        }
        Ok(ComputeInstance { handle, nvml: self.nvml })
    }

    /// The compute-instance profile at `profile_index`
    /// (`NVML_COMPUTE_INSTANCE_PROFILE_*`) with shared engines:
    /// `nvmlGpuInstanceGetComputeInstanceProfileInfoV` (v2 struct), or the v1
    /// query when that is missing or rejects the version.
    pub fn compute_instance_profile(&self, profile_index: u32) -> Result<ComputeInstanceProfile, NvmlError> {
        let lib = self.nvml.lib();
        let engines = NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED;
        if let Ok(sym) = lib.nvmlGpuInstanceGetComputeInstanceProfileInfoV.as_ref() {
            let mut info = nvmlComputeInstanceProfileInfo_v2_t::zeroed();
            info.version = COMPUTE_INSTANCE_PROFILE_INFO_V2;
            // SAFETY: a live GPU-instance handle and a pointer to a v2 struct we own, tagged v2.
            match nvml_try(unsafe { sym(self.handle, profile_index, engines, &mut info) }) {
                Ok(()) => {
                    return Ok(ComputeInstanceProfile {
                        id: info.id,
                        slice_count: info.sliceCount,
                        name: non_empty(c_string_lossy(&info.name)),
                    });
                }
                Err(e) if !try_older_version(&e) => return Err(e),
                Err(_) => {}
            }
        }
        let sym = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
        let mut info = nvmlComputeInstanceProfileInfo_t::zeroed();
        // SAFETY: a live GPU-instance handle and a pointer to the unversioned struct we own.
        nvml_try(unsafe { sym(self.handle, profile_index, engines, &mut info) })?;
        Ok(ComputeInstanceProfile { id: info.id, slice_count: info.sliceCount, name: None })
    }
}

impl ComputeInstance<'_> {
    /// Its id and profile id (`nvmlComputeInstanceGetInfo_v2`).
    pub fn info(&self) -> Result<ComputeInstanceInfo, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
        let mut info = nvmlComputeInstanceInfo_t::zeroed();
        // SAFETY: a non-null compute-instance handle NVML gave us while the
        // borrowed `Nvml` is initialized, and a pointer to a struct we own.
        nvml_try(unsafe { sym(self.handle, &mut info) })?;
        Ok(ComputeInstanceInfo { id: info.id, profile_id: info.profileId })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_versions_match_nvml_h() {
        // Sizes as C lays the structs out; nvml.h tags each with sizeof | ver << 24.
        assert_eq!(GPU_FABRIC_INFO_V3, 0x0300_0028);
        assert_eq!(GPU_FABRIC_INFO_V2, 0x0200_0024);
        assert_eq!(GPU_INSTANCE_PROFILE_INFO_V3, 0x0300_0098);
        assert_eq!(GPU_INSTANCE_PROFILE_INFO_V2, 0x0200_0098);
        assert_eq!(COMPUTE_INSTANCE_PROFILE_INFO_V2, 0x0200_0088);
    }

    #[test]
    fn version_mismatch_is_recognised() {
        assert!(is_version_mismatch(&NvmlError::from(nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH)));
        assert!(!is_version_mismatch(&NvmlError::NotSupported));
        assert!(!is_version_mismatch(&NvmlError::UnexpectedVariant(26)));
        assert!(try_older_version(&NvmlError::InvalidArg));
        assert!(!try_older_version(&NvmlError::NotSupported));
        assert!(!try_older_version(&NvmlError::GpuLost));
    }

    fn c_buf(bytes: &[u8]) -> Vec<c_char> {
        bytes.iter().map(|&b| c_char::from_ne_bytes(b.to_ne_bytes())).collect()
    }

    #[test]
    fn c_strings_stop_at_nul_or_the_buffer_end() {
        assert_eq!(c_string_lossy(&c_buf(b"MIG 1g.10gb\0garbage")), "MIG 1g.10gb");
        assert_eq!(c_string_lossy(&c_buf(b"no terminator")), "no terminator");
        assert_eq!(c_string_lossy(&c_buf(b"\0")), "");
        assert_eq!(c_string_lossy(&c_buf(b"bad \xff utf8\0")), "bad \u{fffd} utf8");
    }

    #[test]
    fn remote_device_types() {
        assert_eq!(
            NvLinkRemoteDeviceType::from_c(nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH),
            NvLinkRemoteDeviceType::Switch
        );
        assert_eq!(
            NvLinkRemoteDeviceType::from_c(nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU),
            NvLinkRemoteDeviceType::Gpu
        );
        assert_eq!(NvLinkRemoteDeviceType::from_c(7), NvLinkRemoteDeviceType::Unknown(7));
    }

    #[test]
    fn v3_profile_info_converts() {
        let mut p = nvmlGpuInstanceProfileInfo_v3_t::zeroed();
        p.id = 19;
        p.sliceCount = 1;
        p.memorySizeMB = 9984;
        for (slot, b) in p.name.iter_mut().zip(b"MIG 1g.10gb") {
            *slot = c_char::from_ne_bytes(b.to_ne_bytes());
        }
        let profile = GpuInstanceProfile::from(&p);
        assert_eq!((profile.id, profile.slice_count, profile.memory_size_mib), (19, 1, 9984));
        assert_eq!(profile.name.as_deref(), Some("MIG 1g.10gb"));
        assert_eq!(GpuInstanceProfile::from(&nvmlGpuInstanceProfileInfo_v3_t::zeroed()).name, None);
    }
}
