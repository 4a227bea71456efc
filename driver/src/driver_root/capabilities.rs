//! Driver capabilities: which of the driver's files a container gets, in
//! the names `NVIDIA_DRIVER_CAPABILITIES` uses (`compute`, `utility`,
//! `video`, `graphics`). NVIDIA's DRA driver gives every container all of
//! them (its CDI specs mount every library of the driver version); that is
//! our default too, and a node can narrow it with `--driver-capabilities`.

use std::fmt;
use std::str::FromStr;

/// One capability set of the driver's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// CUDA and OpenCL: `libcuda`, the JIT compilers, MPS binaries.
    Compute,
    /// Management: NVML, `nvidia-smi`, persistenced, IMEX tools.
    Utility,
    /// Encode and decode: NVENC, NVDEC (`libnvcuvid`), VDPAU, optical flow.
    Video,
    /// OpenGL, EGL, GLX, Vulkan: their libraries, ICD and vendor files, X.Org modules.
    Graphics,
}

impl Capability {
    pub const ALL: [Capability; 4] =
        [Capability::Compute, Capability::Utility, Capability::Video, Capability::Graphics];

    pub fn name(self) -> &'static str {
        match self {
            Capability::Compute => "compute",
            Capability::Utility => "utility",
            Capability::Video => "video",
            Capability::Graphics => "graphics",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of capabilities; [`Capabilities::all`] by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities(u8);

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities::all()
    }
}

impl Capabilities {
    pub fn all() -> Self {
        Capabilities(Capability::ALL.iter().fold(0, |bits, c| bits | c.bit()))
    }

    pub fn contains(self, capability: Capability) -> bool {
        self.0 & capability.bit() != 0
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Capability::ALL.iter().filter(|c| self.contains(**c)).map(|c| c.name()).collect();
        f.write_str(&names.join(","))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapabilitiesError {
    #[error(
        "driver capability {0:?} is unknown: use a comma-separated list of compute, utility, video, graphics, or all"
    )]
    Unknown(String),
    #[error("no driver capability given: use a comma-separated list of compute, utility, video, graphics, or all")]
    Empty,
}

impl FromStr for Capabilities {
    type Err = CapabilitiesError;

    /// `all`, or a comma-separated list (`compute,utility`), as
    /// `NVIDIA_DRIVER_CAPABILITIES` is written.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut bits = 0;
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                return Ok(Capabilities::all());
            }
            let capability = Capability::ALL
                .into_iter()
                .find(|c| c.name() == part)
                .ok_or_else(|| CapabilitiesError::Unknown(part.chars().take(64).collect()))?;
            bits |= capability.bit();
        }
        if bits == 0 { Err(CapabilitiesError::Empty) } else { Ok(Capabilities(bits)) }
    }
}

/// Libraries of the video set (libnvidia-container's `video_libs`).
const VIDEO_LIBRARIES: &[&str] =
    &["libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"];

/// Libraries of the graphics set: libnvidia-container's `graphics_libs`
/// and `graphics_libs_glvnd`, the toolkit's EGL platform and Vulkan
/// producer libraries.
const GRAPHICS_LIBRARIES: &[&str] = &[
    "libnvidia-eglcore.so",
    "libnvidia-glcore.so",
    "libnvidia-tls.so",
    "libnvidia-glsi.so",
    "libnvidia-fbc.so",
    "libnvidia-ifr.so",
    "libnvidia-rtcore.so",
    "libnvoptix.so",
    "libGLX_nvidia.so",
    "libEGL_nvidia.so",
    "libGLESv2_nvidia.so",
    "libGLESv1_CM_nvidia.so",
    "libnvidia-glvkspirv.so",
    "libnvidia-cbl.so",
    "libnvidia-egl-gbm.so",
    "libnvidia-egl-wayland.so",
    "libnvidia-egl-wayland2.so",
    "libnvidia-egl-xcb.so",
    "libnvidia-egl-xlib.so",
    "libnvidia-vulkan-producer.so",
    "libglxserver_nvidia.so",
];

/// Libraries of the utility set (libnvidia-container's `utility_libs`,
/// and NVSwitch's NSCQ).
const UTILITY_LIBRARIES: &[&str] = &["libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"];

/// The set a driver library belongs to, by its unversioned name
/// (`libnvcuvid.so`); a library of the driver version not named here is
/// compute's, as NVIDIA's specs mount every one of them.
pub fn of_library(library: &str) -> Capability {
    if VIDEO_LIBRARIES.contains(&library) {
        Capability::Video
    } else if GRAPHICS_LIBRARIES.contains(&library) {
        Capability::Graphics
    } else if UTILITY_LIBRARIES.contains(&library) {
        Capability::Utility
    } else {
        Capability::Compute
    }
}

/// The set a driver binary belongs to.
pub fn of_binary(binary: &str) -> Capability {
    match binary {
        "nvidia-cuda-mps-control" | "nvidia-cuda-mps-server" => Capability::Compute,
        "nvidia-xconfig" => Capability::Graphics,
        _ => Capability::Utility,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsed_as_nvidia_driver_capabilities_is_written() {
        assert_eq!("all".parse::<Capabilities>(), Ok(Capabilities::all()));
        let some: Capabilities = "compute, utility".parse().unwrap();
        assert!(some.contains(Capability::Compute) && some.contains(Capability::Utility));
        assert!(!some.contains(Capability::Video) && !some.contains(Capability::Graphics));
        assert_eq!(some.to_string(), "compute,utility");
        assert_eq!(Capabilities::default().to_string(), "compute,utility,video,graphics");
        let e = "compute,display".parse::<Capabilities>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "driver capability \"display\" is unknown: use a comma-separated list of compute, utility, video, graphics, or all"
        );
        assert_eq!(",".parse::<Capabilities>(), Err(CapabilitiesError::Empty));
    }

    #[test]
    fn libraries_fall_in_the_sets_nvidia_names() {
        assert_eq!(of_library("libnvcuvid.so"), Capability::Video);
        assert_eq!(of_library("libnvidia-encode.so"), Capability::Video);
        assert_eq!(of_library("libGLX_nvidia.so"), Capability::Graphics);
        assert_eq!(of_library("libnvidia-ml.so"), Capability::Utility);
        assert_eq!(of_library("libcuda.so"), Capability::Compute);
        assert_eq!(of_library("libnvidia-some-future.so"), Capability::Compute);
        assert_eq!(of_binary("nvidia-smi"), Capability::Utility);
        assert_eq!(of_binary("nvidia-cuda-mps-server"), Capability::Compute);
    }
}
