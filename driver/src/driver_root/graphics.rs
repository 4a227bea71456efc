//! The graphics set's files besides its libraries, as NVIDIA's toolkit
//! mounts them: the EGL vendor and platform files, Vulkan ICD and layer
//! files, the OpenCL ICD, OptiX's data, X.Org's driver modules, and the
//! links the GBM and GLX server loaders look for.

use super::libraries::is_driver_version;
use super::root::{DriverMount, DriverRoot, resolve};
use crate::version::Semver;

/// Configuration files under the root's `/etc`, `/usr/local/share` or
/// `/usr/share`, each mounted where the container's loaders look
/// (`<container dir>/<relative path>`), whatever directory the host used.
const CONFIGS: &[(&str, &str)] = &[
    ("glvnd/egl_vendor.d/10_nvidia.json", "/usr/share"),
    ("egl/egl_external_platform.d/15_nvidia_gbm.json", "/usr/share"),
    ("egl/egl_external_platform.d/10_nvidia_wayland.json", "/usr/share"),
    ("egl/egl_external_platform.d/09_nvidia_wayland2.json", "/usr/share"),
    ("egl/egl_external_platform.d/20_nvidia_xcb.json", "/usr/share"),
    ("egl/egl_external_platform.d/20_nvidia_xlib.json", "/usr/share"),
    ("nvidia/nvoptix.bin", "/usr/share"),
    ("X11/xorg.conf.d/10-nvidia.conf", "/usr/share"),
    ("X11/xorg.conf.d/nvidia-drm-outputclass.conf", "/usr/share"),
    ("OpenCL/vendors/nvidia.icd", "/etc"),
    ("vulkan/icd.d/nvidia_icd.json", "/etc"),
    ("vulkan/icd.d/nvidia_layers.json", "/etc"),
    ("vulkan/implicit_layer.d/nvidia_layers.json", "/etc"),
    (VULKAN_ARCH_ICD, "/etc"),
];

#[cfg(target_arch = "aarch64")]
const VULKAN_ARCH_ICD: &str = "vulkan/icd.d/nvidia_icd.aarch64.json";
#[cfg(not(target_arch = "aarch64"))]
const VULKAN_ARCH_ICD: &str = "vulkan/icd.d/nvidia_icd.x86_64.json";

/// Where configuration files are looked for under the root (the
/// toolkit's `/etc` and XDG data directories); Vulkan's also at the root
/// itself (GKE installs them there).
const CONFIG_DIRS: &[&str] = &["/etc", "/usr/local/share", "/usr/share"];

/// The configuration files present under the root.
pub(super) fn configs(root: &DriverRoot) -> Vec<DriverMount> {
    let mut mounts = Vec::new();
    for (relative, container_dir) in CONFIGS {
        let vulkan_at_root = relative.starts_with("vulkan/").then_some("");
        let found = CONFIG_DIRS
            .iter()
            .copied()
            .chain(vulkan_at_root)
            .map(|dir| format!("{dir}/{relative}"))
            .find_map(|path| resolve(root, &path));
        if let Some(real) = found {
            mounts.push(DriverMount {
                host_path: root.host(&real),
                container_path: format!("{container_dir}/{relative}"),
            });
        }
    }
    mounts
}

/// X.Org's NVIDIA modules for driver `version`, mounted at their own
/// paths (an `xorg.conf.d` `ModulePath` then stays right), searched under
/// each library directory as the toolkit does.
pub(super) fn xorg_modules(root: &DriverRoot, library_dirs: &[String], version: &str) -> Vec<DriverMount> {
    let mut dirs: Vec<String> = Vec::new();
    let standard = ["/usr/lib", "/usr/lib64", "/usr/X11R6/lib", "/usr/X11R6/lib64"];
    for lib in library_dirs.iter().map(String::as_str).chain(standard) {
        for sub in [
            "nvidia/xorg",
            "xorg/modules/drivers",
            "xorg/modules/extensions",
            "xorg/modules/updates/drivers",
            "xorg/modules/updates/extensions",
        ] {
            let dir = format!("{lib}/{sub}");
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    let wanted = Semver::normalize(version).ok();
    let is_module = |name: &str| {
        name == "nvidia_drv.so"
            || name
                .strip_prefix("libglxserver_nvidia.so.")
                .is_some_and(|suffix| is_driver_version(suffix, version, wanted.as_ref()))
    };
    let mut mounts: Vec<DriverMount> = Vec::new();
    for dir in &dirs {
        let mut names: Vec<String> = std::fs::read_dir(root.local(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| is_module(name))
            .collect();
        names.sort();
        for name in names {
            let taken = mounts.iter().any(|m| m.container_path.rsplit('/').next() == Some(name.as_str()));
            if let Some(real) = resolve(root, &format!("{dir}/{name}")).filter(|_| !taken) {
                mounts.push(DriverMount { host_path: root.host(&real), container_path: real });
            }
        }
    }
    mounts
}

/// Links the graphics loaders need beyond sonames, as (target, link):
/// GBM's `gbm/nvidia-drm_gbm.so` to the allocator and the GLX server
/// module's unversioned name.
/// `mounts` are the driver's real files only (the libraries of the driver
/// version, the modules), so a name prefix identifies each.
pub(super) fn links(mounts: &[DriverMount]) -> Vec<(String, String)> {
    let mut links = Vec::new();
    for mount in mounts {
        let Some((dir, file)) = mount.container_path.rsplit_once('/') else { continue };
        if file.starts_with("libnvidia-allocator.so.") {
            links.push(("../libnvidia-allocator.so.1".to_string(), format!("{dir}/gbm/nvidia-drm_gbm.so")));
        } else if file.starts_with("libglxserver_nvidia.so.") {
            links.push((file.to_string(), format!("{dir}/libglxserver_nvidia.so")));
        }
    }
    links
}
