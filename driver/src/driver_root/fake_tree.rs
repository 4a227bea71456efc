//! A driver installation for tests and demos on machines without one:
//! ELF libraries built with the system `cc` (each with its soname), an
//! `ld.so.cache` made for the tree by the system's own `ldconfig -r`, GSP
//! firmware, binaries and the persistenced socket, laid out like a real
//! install under `usr/lib/x86_64-linux-gnu`.

use std::io;
use std::path::Path;
use std::process::Command;

/// The library directory of the tree.
pub const LIBDIR: &str = "usr/lib/x86_64-linux-gnu";

/// Builds the tree under `root` for driver `version`, with `libs` as
/// (library, soname), e.g. `("libcuda.so", "libcuda.so.1")`.
pub fn build(root: &Path, version: &str, libs: &[(&str, &str)]) -> io::Result<()> {
    let dir = root.join(LIBDIR);
    std::fs::create_dir_all(&dir)?;
    for (library, soname) in libs {
        shared_object(&dir.join(format!("{library}.{version}")), soname)?;
    }
    std::fs::create_dir_all(root.join("etc"))?;
    std::fs::write(root.join("etc/ld.so.conf"), format!("/{LIBDIR}\n"))?;
    // -r: the tree's own cache, written into it (soname links made there).
    run(Command::new("ldconfig").arg("-r").arg(root))?;
    let firmware = root.join(format!("lib/firmware/nvidia/{version}"));
    std::fs::create_dir_all(&firmware)?;
    for f in ["gsp_ga10x.bin", "gsp_tu10x.bin"] {
        std::fs::write(firmware.join(f), b"fw")?;
    }
    std::fs::create_dir_all(root.join("usr/bin"))?;
    for b in ["nvidia-smi", "nvidia-cuda-mps-control"] {
        std::fs::write(root.join("usr/bin").join(b), b"#!/bin/sh\n")?;
    }
    std::fs::create_dir_all(root.join("run/nvidia-persistenced"))?;
    std::fs::write(root.join("run/nvidia-persistenced/socket"), b"")?;
    Ok(())
}

/// The driver's libraries of every capability set, as (library, soname):
/// compute and utility, video (`vdpau/` holds VDPAU's), graphics.
pub const COMPLETE_LIBRARIES: &[(&str, &str)] = &[
    ("libcuda.so", "libcuda.so.1"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
    ("libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"),
    ("libnvidia-allocator.so", "libnvidia-allocator.so.1"),
    ("libnvcuvid.so", "libnvcuvid.so.1"),
    ("libnvidia-encode.so", "libnvidia-encode.so.1"),
    ("libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
    ("libGLX_nvidia.so", "libGLX_nvidia.so.0"),
    ("libEGL_nvidia.so", "libEGL_nvidia.so.0"),
    ("libGLESv2_nvidia.so", "libGLESv2_nvidia.so.2"),
    ("libnvidia-eglcore.so", "libnvidia-eglcore.so.VERSION"),
    ("libnvidia-glcore.so", "libnvidia-glcore.so.VERSION"),
];

/// A complete installation of driver `version` under `root`: [`build`]
/// with [`COMPLETE_LIBRARIES`] (`VERSION` in a soname is the version, as
/// the real ones name themselves), VDPAU's library in `vdpau/`, an EGL
/// platform library with its own version, the EGL/Vulkan/OpenCL
/// configuration files, X.Org's modules, and a CUDA `compat/` directory
/// (the forward-compatibility libraries an image brings: never mounted).
pub fn build_complete(root: &Path, version: &str) -> io::Result<()> {
    let libs: Vec<(&str, String)> =
        COMPLETE_LIBRARIES.iter().map(|(l, soname)| (*l, soname.replace("VERSION", version))).collect();
    let borrowed: Vec<(&str, &str)> = libs.iter().map(|(l, s)| (*l, s.as_str())).collect();
    build(root, version, &borrowed)?;
    let dir = root.join(LIBDIR);
    std::fs::create_dir_all(dir.join("vdpau"))?;
    shared_object(&dir.join(format!("vdpau/libvdpau_nvidia.so.{version}")), "libvdpau_nvidia.so.1")?;
    std::os::unix::fs::symlink(format!("libvdpau_nvidia.so.{version}"), dir.join("vdpau/libvdpau_nvidia.so.1"))?;
    shared_object(&dir.join("libnvidia-egl-wayland.so.1.1.19"), "libnvidia-egl-wayland.so.1")?;
    for (file, text) in [
        ("usr/share/glvnd/egl_vendor.d/10_nvidia.json", r#"{"ICD":{"library_path":"libEGL_nvidia.so.0"}}"#),
        ("usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json", "{}"),
        ("etc/vulkan/icd.d/nvidia_icd.json", r#"{"ICD":{"library_path":"libGLX_nvidia.so.0"}}"#),
        ("etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1\n"),
        ("usr/share/nvidia/nvoptix.bin", "optix"),
    ] {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap_or(root))?;
        std::fs::write(path, text)?;
    }
    let xorg = root.join("usr/lib/xorg/modules");
    std::fs::create_dir_all(xorg.join("drivers"))?;
    std::fs::create_dir_all(xorg.join("extensions"))?;
    shared_object(&xorg.join("drivers/nvidia_drv.so"), "nvidia_drv.so")?;
    shared_object(&xorg.join(format!("extensions/libglxserver_nvidia.so.{version}")), "libglxserver_nvidia.so.1")?;
    let compat = root.join("usr/local/cuda/compat");
    std::fs::create_dir_all(&compat)?;
    shared_object(&compat.join("libcuda.so.999.99.99"), "libcuda.so.1")?;
    run(Command::new("ldconfig").arg("-r").arg(root))
}

/// An ELF shared object with this soname at `path`.
fn shared_object(path: &Path, soname: &str) -> io::Result<()> {
    let src = path.with_extension("c");
    std::fs::write(&src, "int nvidia_fake(void) { return 0; }\n")?;
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"]).arg(path).arg(&src);
    run(&mut cc)?;
    std::fs::remove_file(src)
}

fn run(command: &mut Command) -> io::Result<()> {
    let status = command.status()?;
    if status.success() { Ok(()) } else { Err(io::Error::other(format!("{command:?} failed: {status}"))) }
}
