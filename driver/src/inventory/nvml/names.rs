//! NVIDIA's spellings of what NVML reports as numbers: brands,
//! architectures, versions and MIG profile names, as go-nvlib (and so
//! NVIDIA's DRA driver) writes them. Pure functions, tested here.

use nvml_wrapper_sys::bindings::*;

use crate::version::Semver;

/// `NVML_DEVICE_ARCH_T23X` (Orin), in nvml.h of NVML 12 (dropped in 13).
const NVML_DEVICE_ARCH_T23X: u32 = 11;
/// `NVML_DEVICE_ARCH_RUBIN`, in nvml.h of NVML 13; not in nvml-wrapper-sys 0.10.
const NVML_DEVICE_ARCH_RUBIN: u32 = 13;
/// `NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX`, in nvml.h of NVML 13; not in
/// nvml-wrapper-sys 0.10 nor (yet) in go-nvlib's naming table.
pub const NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX: u32 = 0x11;

/// go-nvlib's `GetBrandAsString` for an `nvmlBrandType_t`; `Unknown` for
/// values newer than this table (go-nvlib errors on those instead).
#[allow(non_upper_case_globals)] // bindgen's names for nvml.h's enum values
pub fn brand_name(code: u32) -> &'static str {
    match code {
        nvmlBrandType_enum_NVML_BRAND_QUADRO => "Quadro",
        nvmlBrandType_enum_NVML_BRAND_TESLA => "Tesla",
        nvmlBrandType_enum_NVML_BRAND_NVS => "NVS",
        nvmlBrandType_enum_NVML_BRAND_GRID => "Grid",
        nvmlBrandType_enum_NVML_BRAND_GEFORCE => "GeForce",
        nvmlBrandType_enum_NVML_BRAND_TITAN => "Titan",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_VAPPS => "NvidiaVApps",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_VPC => "NvidiaVPC",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_VCS => "NvidiaVCS",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_VWS => "NvidiaVWS",
        // Also NVML_BRAND_NVIDIA_VGAMING, the deprecated alias.
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_CLOUD_GAMING => "NvidiaCloudGaming",
        nvmlBrandType_enum_NVML_BRAND_QUADRO_RTX => "QuadroRTX",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX => "NvidiaRTX",
        nvmlBrandType_enum_NVML_BRAND_NVIDIA => "Nvidia",
        nvmlBrandType_enum_NVML_BRAND_GEFORCE_RTX => "GeForceRTX",
        nvmlBrandType_enum_NVML_BRAND_TITAN_RTX => "TitanRTX",
        _ => "Unknown",
    }
}

/// go-nvlib's `GetArchitectureAsString` for an `nvmlDeviceArchitecture_t`;
/// `Unknown` for values newer than this table.
pub fn architecture_name(code: u32) -> &'static str {
    match code {
        NVML_DEVICE_ARCH_KEPLER => "Kepler",
        NVML_DEVICE_ARCH_MAXWELL => "Maxwell",
        NVML_DEVICE_ARCH_PASCAL => "Pascal",
        NVML_DEVICE_ARCH_VOLTA => "Volta",
        NVML_DEVICE_ARCH_TURING => "Turing",
        NVML_DEVICE_ARCH_AMPERE => "Ampere",
        NVML_DEVICE_ARCH_ADA => "Ada Lovelace",
        NVML_DEVICE_ARCH_HOPPER => "Hopper",
        NVML_DEVICE_ARCH_BLACKWELL => "Blackwell",
        NVML_DEVICE_ARCH_T23X => "Orin",
        NVML_DEVICE_ARCH_RUBIN => "Rubin",
        _ => "Unknown",
    }
}

/// The CUDA version NVML encodes as `1000 * major + 10 * minor` (e.g.
/// `12040` is 12.4), as NVIDIA's driver formats it; `None` if negative.
pub fn cuda_driver_version(encoded: i32) -> Option<Semver> {
    let v = u64::try_from(encoded).ok()?;
    Some(Semver::from_major_minor(v / 1000, (v % 1000) / 10))
}

/// A compute capability such as `9.0` as `9.0.0`; negative parts (never
/// seen) read as 0.
pub fn compute_capability(major: i32, minor: i32) -> Semver {
    Semver::from_major_minor(u64::try_from(major).unwrap_or(0), u64::try_from(minor).unwrap_or(0))
}

/// The profile name inside NVML's v2/v3 profile info (`MIG 1g.10gb`), without
/// the `MIG ` prefix; `None` when empty.
pub fn nvml_profile_name(raw: &str) -> Option<&str> {
    let name = raw.trim();
    let name = match name.strip_prefix("MIG") {
        Some(rest) if rest.is_empty() || rest.starts_with(char::is_whitespace) => rest.trim_start(),
        _ => name,
    };
    (!name.is_empty()).then_some(name)
}

/// go-nvlib's name of a GPU-instance profile whose compute instance spans it:
/// `<slices>g.<GB>gb` plus the attribute suffix of the NVML profile index.
/// `total_memory_bytes` is the whole GPU's memory.
pub fn mig_profile_name(profile_index: u32, slices: u32, profile_memory_mib: u64, total_memory_bytes: u64) -> String {
    let gb = mig_memory_gb(profile_memory_mib, total_memory_bytes);
    format!("{slices}g.{gb}gb{}", mig_profile_suffix(profile_index))
}

/// go-nvlib's `getMigMemorySizeGB`: the profile's share of memory rounded up
/// to eighths, times the GPU's memory in whole GiB (rounded up), rounded.
/// This is how an H100 with 79.6 GiB names its 9.75 GiB slice `1g.10gb`.
pub fn mig_memory_gb(profile_memory_mib: u64, total_memory_bytes: u64) -> u64 {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: u64 = 1 << 30;
    if total_memory_bytes == 0 {
        return 0;
    }
    let fraction = profile_memory_mib as f64 * MIB / total_memory_bytes as f64;
    let fraction = (fraction * 8.0).ceil() / 8.0;
    let total_gb = total_memory_bytes.div_ceil(GIB) as f64;
    (fraction * total_gb).round() as u64
}

/// The attribute suffix go-nvlib derives from a GPU-instance profile index.
pub fn mig_profile_suffix(profile_index: u32) -> &'static str {
    match profile_index {
        NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 | NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 => "+me",
        NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME | NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME => "+me.all",
        NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
        | NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX
        | NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX
        | NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX => "+gfx",
        NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME | NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME => "-me",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn brands_follow_go_nvlib() {
        assert_eq!(brand_name(nvmlBrandType_enum_NVML_BRAND_NVIDIA), "Nvidia");
        assert_eq!(brand_name(nvmlBrandType_enum_NVML_BRAND_TESLA), "Tesla");
        assert_eq!(brand_name(nvmlBrandType_enum_NVML_BRAND_GEFORCE_RTX), "GeForceRTX");
        assert_eq!(brand_name(nvmlBrandType_enum_NVML_BRAND_NVIDIA_VGAMING), "NvidiaCloudGaming");
        assert_eq!(brand_name(nvmlBrandType_enum_NVML_BRAND_UNKNOWN), "Unknown");
        assert_eq!(brand_name(99), "Unknown");
    }

    #[test]
    fn architectures_follow_go_nvlib() {
        assert_eq!(architecture_name(NVML_DEVICE_ARCH_AMPERE), "Ampere");
        assert_eq!(architecture_name(NVML_DEVICE_ARCH_ADA), "Ada Lovelace");
        assert_eq!(architecture_name(NVML_DEVICE_ARCH_HOPPER), "Hopper");
        assert_eq!(architecture_name(NVML_DEVICE_ARCH_BLACKWELL), "Blackwell");
        assert_eq!(architecture_name(11), "Orin");
        assert_eq!(architecture_name(NVML_DEVICE_ARCH_UNKNOWN), "Unknown");
        assert_eq!(architecture_name(13), "Rubin");
        assert_eq!(architecture_name(12), "Unknown");
    }

    #[test]
    fn versions() {
        assert_eq!(cuda_driver_version(12040).unwrap().as_str(), "12.4.0");
        assert_eq!(cuda_driver_version(13000).unwrap().as_str(), "13.0.0");
        assert_eq!(cuda_driver_version(11080).unwrap().as_str(), "11.8.0");
        assert_eq!(cuda_driver_version(-1), None);
        assert_eq!(compute_capability(9, 0).as_str(), "9.0.0");
        assert_eq!(compute_capability(12, 1).as_str(), "12.1.0");
    }

    #[test]
    fn nvml_names_lose_their_prefix() {
        assert_eq!(nvml_profile_name("MIG 1g.10gb"), Some("1g.10gb"));
        assert_eq!(nvml_profile_name("MIG 1g.10gb+me"), Some("1g.10gb+me"));
        assert_eq!(nvml_profile_name("2g.20gb"), Some("2g.20gb"));
        assert_eq!(nvml_profile_name(""), None);
        assert_eq!(nvml_profile_name("MIG "), None);
        assert_eq!(nvml_profile_name("MIGHTY"), Some("MIGHTY"));
    }

    #[test]
    fn h100_80gb_profile_names() {
        let total = 81559 * MIB;
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, 9984, total), "1g.10gb");
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 9984, total), "1g.10gb+me");
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 20096, total), "1g.20gb");
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2, 20096, total), "2g.20gb");
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 3, 40448, total), "3g.40gb");
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 4, 40448, total), "4g.40gb");
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 7, 81152, total), "7g.80gb");
    }

    #[test]
    fn a100_40gb_profile_names() {
        let total = 40536 * MIB;
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, 4864, total), "1g.5gb");
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2, 9856, total), "2g.10gb");
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 3, 19968, total), "3g.20gb");
        assert_eq!(mig_profile_name(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 7, 40192, total), "7g.40gb");
    }

    #[test]
    fn suffixes_follow_the_profile_index() {
        let total = 81559 * MIB;
        let name = |index| mig_profile_name(index, 1, 9984, total);
        assert_eq!(name(NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME), "1g.10gb+me.all");
        assert_eq!(name(NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX), "1g.10gb+gfx");
        assert_eq!(name(NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME), "1g.10gb-me");
        assert_eq!(mig_profile_suffix(NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1), "+me");
        assert_eq!(mig_profile_suffix(NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX), "+gfx");
        assert_eq!(mig_profile_suffix(NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX), "+gfx");
        assert_eq!(mig_profile_suffix(NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME), "-me");
        assert_eq!(mig_profile_suffix(NVML_GPU_INSTANCE_PROFILE_7_SLICE), "");
    }

    #[test]
    fn unknown_total_memory_does_not_divide_by_zero() {
        assert_eq!(mig_memory_gb(9984, 0), 0);
    }
}
