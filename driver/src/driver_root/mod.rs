//! What a GPU container needs from the node's driver installation, found
//! the way the NVIDIA Container Toolkit's `nvcdi` finds it: every library
//! of the driver version (compute, utility, video and graphics), with the
//! sonames the root's `ld.so.cache` gives them, the graphics
//! configuration files and X.Org modules, GSP firmware, binaries and IPC
//! sockets; narrowed to the [`Capabilities`] a node gives.
//!
//! The driver root is where the plugin sees the installation (`/`, or
//! `/driver-root` when the GPU Operator's `/run/nvidia/driver` is mounted
//! there); the host driver root is where the host sees it, and what specs
//! name, because the container runtime resolves mounts on the host.
//! Discovery runs at start and when the driver version changes, never on
//! the prepare path.

mod capabilities;
pub mod fake_imex;
pub mod fake_tree;
mod graphics;
pub mod ld_cache;
mod libraries;
mod root;

pub use capabilities::{Capabilities, CapabilitiesError, Capability};
use libraries::FoundLibrary;
pub use root::{DriverMount, DriverRoot};

use std::path::PathBuf;

/// Libraries of NVIDIA's compute and utility capabilities, found by name
/// when a root's files do not carry the driver version, and listed first
/// in specs in this order; the first two are required (with compute and
/// utility).
pub const LIBRARIES: &[&str] = &[
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libcudadebugger.so",
    "libnvidia-opencl.so",
    "libnvidia-cfg.so",
    "libnvidia-allocator.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-nscq.so",
];
const REQUIRED: &[&str] = &["libcuda.so", "libnvidia-ml.so"];

/// Utility and compute binaries.
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
    "nvidia-xconfig",
];
const BINARY_DIRS: &[&str] = &["usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin"];

/// IPC endpoints: persistenced and fabric manager sockets, the MPS pipe
/// directory.
pub const IPC: &[&str] = &["run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket", "tmp/nvidia-mps"];

/// `/dev/nvidia-modeset`: char 195:254.
pub const MODESET: (&str, u32) = ("/dev/nvidia-modeset", 254);

/// What discovery found: the mounts, the links to create in the container
/// (`target`, `link`), and the library directories whose ld cache the
/// container must update.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFiles {
    pub mounts: Vec<DriverMount>,
    pub links: Vec<(String, String)>,
    pub library_dirs: Vec<String>,
    /// Control device nodes present (path, minor) besides the ones every
    /// claim gets.
    pub control_devices: Vec<(String, u32)>,
    /// The driver version for CUDA's forward-compatibility hook
    /// (`enable-cuda-compat --host-driver-version`), with the compute set.
    pub cuda_compat_host_version: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiscoveryError {
    #[error(
        "{library} was not found under the driver root {root} (neither in its etc/ld.so.cache nor in its library directories): point --driver-root at the directory the NVIDIA driver is installed under (/ on the host, /run/nvidia/driver with the GPU Operator)"
    )]
    Missing { library: &'static str, root: String },
}

/// Finds what a GPU container needs under `root` for driver `version`
/// (libraries and firmware carry it in their names), of the sets in
/// `capabilities`.
pub fn discover(root: &DriverRoot, version: &str, capabilities: Capabilities) -> Result<DriverFiles, DiscoveryError> {
    let cache = native_cache(root);
    let mut files = DriverFiles::default();
    let mut found = libraries::versioned(root, &cache, version);
    for &library in LIBRARIES {
        if !found.iter().any(|(l, _)| l == library)
            && let Some(by_name) = libraries::by_name(root, &cache, library)
        {
            found.push((library.to_string(), by_name));
        }
    }
    for &library in REQUIRED {
        if capabilities.contains(capabilities::of_library(library)) && !found.iter().any(|(l, _)| l == library) {
            return Err(DiscoveryError::Missing { library, root: root.root.display().to_string() });
        }
    }
    // The well-known libraries first, in their order; the rest by name.
    found.sort_by_key(|(library, _)| {
        (LIBRARIES.iter().position(|l| l == library).unwrap_or(LIBRARIES.len()), library.clone())
    });
    for (library, lib) in &found {
        if capabilities.contains(capabilities::of_library(library)) {
            add_library(root, &mut files, library, lib);
        } else {
            tracing::debug!(library, %capabilities, "driver library outside the node's capabilities; skipped");
        }
    }
    if capabilities.contains(Capability::Graphics) {
        let modules = graphics::xorg_modules(root, &files.library_dirs, version);
        files.mounts.extend(graphics::configs(root));
        files.mounts.extend(modules);
        files.links.extend(graphics::links(&files.mounts));
    }
    if let Some(inside) = firmware_dir(root, version) {
        let mut names: Vec<String> = std::fs::read_dir(root.local(&inside))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let path = format!("{inside}/{name}");
            files.mounts.push(DriverMount { host_path: root.host(&path), container_path: path });
        }
    } else {
        tracing::debug!(version, "no GSP firmware directory for the driver version; skipped");
    }
    for binary in BINARIES.iter().filter(|b| capabilities.contains(capabilities::of_binary(b))) {
        let found = binary_path(root, binary);
        match found {
            Some(path) => files.mounts.push(DriverMount { host_path: root.host(&path), container_path: path }),
            None => tracing::debug!(binary, "driver binary not found; skipped"),
        }
    }
    for ipc in IPC {
        let path = format!("/{ipc}");
        if root.local(&path).exists() {
            files.mounts.push(DriverMount { host_path: root.host(&path), container_path: path });
        }
    }
    if root.local(MODESET.0).exists() {
        files.control_devices.push((MODESET.0.to_string(), MODESET.1));
    }
    if capabilities.contains(Capability::Compute) {
        // As the driver writes it (`570.172.08`, the suffix of libcuda's
        // file), where NVML may drop a leading zero.
        let libcuda = found.iter().find(|(l, _)| l == "libcuda.so");
        let written = libcuda.and_then(|(_, lib)| lib.real.rsplit_once(".so.").map(|(_, v)| v.to_string()));
        files.cuda_compat_host_version = Some(written.unwrap_or_else(|| version.to_string()));
    }
    Ok(files)
}

/// The GSP firmware directory of driver `version` (named as the driver
/// names it, `580.82.07`, while NVML's version may read `580.82.7`).
fn firmware_dir(root: &DriverRoot, version: &str) -> Option<String> {
    let wanted = crate::version::Semver::normalize(version).ok();
    for dir in ["/lib/firmware/nvidia", "/usr/lib/firmware/nvidia"] {
        let exact = format!("{dir}/{version}");
        if root.local(&exact).is_dir() {
            return Some(exact);
        }
        let found = std::fs::read_dir(root.local(dir)).into_iter().flatten().flatten().find(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            wanted.is_some() && crate::version::Semver::normalize(&name).ok() == wanted && e.path().is_dir()
        });
        if let Some(e) = found {
            return Some(format!("{dir}/{}", e.file_name().to_string_lossy()));
        }
    }
    None
}

/// Where this process reaches `library` (e.g. `libnvidia-ml.so`) under
/// the root: the real file its soname leads to, found as [`discover`] finds
/// it. The plugin loads NVML from the driver root this way.
/// Where `binary` is in the root, as a path inside it (`/usr/bin/nvidia-smi`).
fn binary_path(root: &DriverRoot, binary: &str) -> Option<String> {
    BINARY_DIRS.iter().map(|d| format!("/{d}/{binary}")).find(|p| root.local(p).is_file())
}

/// `binary` of the root as this process reaches it, to run it.
pub fn local_binary(root: &DriverRoot, binary: &str) -> Option<PathBuf> {
    binary_path(root, binary).map(|p| root.local(&p))
}

/// The real file of `library`, named without its version (`libcuda.so`,
/// not `libcuda.so.1`): any `libcuda.so.<version>` the root's cache or
/// library directories list.
pub fn local_library(root: &DriverRoot, library: &str) -> Option<PathBuf> {
    libraries::by_name(root, &native_cache(root), library).map(|found| root.local(&found.real))
}

/// The root's `ld.so.cache` entries for this machine's architecture; none
/// when it has no readable cache (the library directories are searched).
fn native_cache(root: &DriverRoot) -> Vec<ld_cache::CacheEntry> {
    match ld_cache::read(&root.root) {
        Ok(Ok(entries)) => entries.into_iter().filter(|e| e.is_for(ld_cache::native_arch())).collect(),
        Ok(Err(e)) => {
            tracing::debug!(root = %root.root.display(), error = %e, "unreadable ld.so.cache; searching library directories");
            Vec::new()
        }
        Err(e) if e.is_not_found() => {
            tracing::debug!(root = %root.root.display(), error = %e, "no ld.so.cache; searching library directories");
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(root = %root.root.display(), error = %e, "ld.so.cache not read; searching library directories");
            Vec::new()
        }
    }
}

/// Mounts the library's real file and links its soname (`libcuda.so.1`)
/// and development name (`libcuda.so`) to it, as programs that load either
/// expect.
fn add_library(root: &DriverRoot, files: &mut DriverFiles, library: &str, found: &FoundLibrary) {
    let real = &found.real;
    let (dir, file) = real.rsplit_once('/').unwrap_or(("", real));
    let dir = if dir.is_empty() { "/".to_string() } else { dir.to_string() };
    files.mounts.push(DriverMount { host_path: root.host(real), container_path: real.clone() });
    let mut dev_target = file.to_string();
    if let Some(soname) = found.soname.as_deref().filter(|s| *s != file) {
        files.links.push((file.to_string(), format!("{dir}/{soname}")));
        dev_target = soname.to_string();
    }
    if file != library && dev_target != library {
        files.links.push((dev_target, format!("{dir}/{library}")));
    }
    if !files.library_dirs.contains(&dir) {
        files.library_dirs.push(dir);
    }
}

#[cfg(test)]
mod tests;
