//! The driver's libraries, found as NVIDIA's toolkit finds them for its CDI
//! specs: every `*.so.<driver version>` in the directories that hold
//! `libcuda` and `libnvidia-ml` (and their `vdpau/` subdirectories), the
//! legacy `libnvidia-nvvm70`, and the EGL platform libraries (versioned on
//! their own). Each comes with the soname programs load it by, from the
//! root's `ld.so.cache` or a link beside it.

use super::ld_cache;
use super::root::{DriverRoot, resolve};
use crate::version::Semver;

/// Where `ldconfig` looks when there is no cache (and where distributions
/// put the driver's libraries).
const LIBRARY_DIRS: &[&str] = &[
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
];

/// A library found: where the cache or the directory search says it is
/// (as the root sees it) and the real file that path leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FoundLibrary {
    /// The name programs load it by (`libcuda.so.1`, `libnvidia-nvvm.so.4`),
    /// when known.
    pub soname: Option<String>,
    /// The regular file, as a path inside the root.
    pub real: String,
}

/// EGL platform libraries: versioned `X.Y.Z` of their own, not the driver's.
const EGL_PLATFORM: &[&str] = &[
    "libnvidia-egl-gbm.so",
    "libnvidia-egl-wayland.so",
    "libnvidia-egl-wayland2.so",
    "libnvidia-egl-xcb.so",
    "libnvidia-egl-xlib.so",
];
/// NVVM of CUDA 11's ABI, kept beside the current one.
const LEGACY_NVVM: &str = "libnvidia-nvvm70.so";

/// Every driver library under the root for driver `version`, as
/// (unversioned name, where it is), in directory order then by name; one
/// per name (the first directory wins, as the loader's search would).
pub(super) fn versioned(
    root: &DriverRoot,
    cache: &[ld_cache::CacheEntry],
    version: &str,
) -> Vec<(String, FoundLibrary)> {
    let wanted = Semver::normalize(version).ok();
    let mut found: Vec<(String, FoundLibrary)> = Vec::new();
    for dir in search_dirs(root, cache) {
        let mut names: Vec<String> = std::fs::read_dir(root.local(&dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let Some(library) = driver_library_name(&name, version, wanted.as_ref()) else { continue };
            if found.iter().any(|(l, _)| *l == library) {
                continue;
            }
            let path = format!("{dir}/{name}");
            // Only the real file counts here (a link of the same name pattern
            // is found through it).
            if resolve(root, &path).as_deref() != Some(path.as_str()) {
                continue;
            }
            let soname = soname_of(root, cache, &dir, &library, &path);
            found.push((library, FoundLibrary { soname, real: path }));
        }
    }
    found
}

/// `libcuda.so` for `libcuda.so.580.95.05` when that is driver `version`
/// (NVML may write `580.95.5`); the EGL platform and legacy NVVM libraries
/// whatever their version.
fn driver_library_name(file: &str, version: &str, wanted: Option<&Semver>) -> Option<String> {
    let (library, suffix) = file.split_once(".so.")?;
    let library = format!("{library}.so");
    let ours = is_driver_version(suffix, version, wanted)
        || library == LEGACY_NVVM
        || (EGL_PLATFORM.contains(&library.as_str()) && suffix.contains('.'));
    ours.then_some(library)
}

/// Whether a file's version suffix is driver `version` (`wanted`: the
/// version normalized, so that `580.95.05` and `580.95.5` agree).
pub(super) fn is_driver_version(suffix: &str, version: &str, wanted: Option<&Semver>) -> bool {
    suffix == version || wanted.is_some_and(|w| Semver::normalize(suffix).ok().as_ref() == Some(w))
}

/// Directories to search: where the cache puts `libcuda` and
/// `libnvidia-ml`, then the standard library directories, each followed
/// by its `vdpau/` subdirectory; only those that exist.
fn search_dirs(root: &DriverRoot, cache: &[ld_cache::CacheEntry]) -> Vec<String> {
    let from_cache = cache
        .iter()
        .filter(|e| e.soname.starts_with("libcuda.so.") || e.soname.starts_with("libnvidia-ml.so."))
        .filter_map(|e| e.path.rsplit_once('/').map(|(dir, _)| dir.to_string()));
    let standard = LIBRARY_DIRS.iter().map(|d| format!("/{d}"));
    let mut dirs: Vec<String> = Vec::new();
    for dir in from_cache.chain(standard) {
        for candidate in [dir.clone(), format!("{dir}/vdpau")] {
            if !dirs.contains(&candidate) && root.local(&candidate).is_dir() {
                dirs.push(candidate);
            }
        }
    }
    dirs
}

/// The soname of `real` (the library `library` in `dir`): the cache's
/// entry that leads to it, or else the shortest link beside it that does.
fn soname_of(
    root: &DriverRoot,
    cache: &[ld_cache::CacheEntry],
    dir: &str,
    library: &str,
    real: &str,
) -> Option<String> {
    let prefix = format!("{library}.");
    let real_name = real.rsplit('/').next().unwrap_or(real);
    let from_cache = cache
        .iter()
        .filter(|e| e.soname.starts_with(&prefix) && e.soname != real_name)
        .find(|e| resolve(root, &e.path).as_deref() == Some(real))
        .map(|e| e.soname.clone());
    from_cache.or_else(|| {
        let mut links: Vec<String> = std::fs::read_dir(root.local(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix) && n != real_name)
            .filter(|n| resolve(root, &format!("{dir}/{n}")).as_deref() == Some(real))
            .collect();
        links.sort_by_key(|n| (n.len(), n.clone()));
        links.into_iter().next()
    })
}

/// `library` found by name alone (any `library.<suffix>` the cache or the
/// library directories list), for roots whose files do not carry the
/// driver version.
pub(super) fn by_name(root: &DriverRoot, cache: &[ld_cache::CacheEntry], library: &str) -> Option<FoundLibrary> {
    let prefix = format!("{library}.");
    let from_cache =
        cache.iter().filter(|e| e.soname.starts_with(&prefix)).map(|e| (Some(e.soname.clone()), e.path.clone()));
    let from_dirs = LIBRARY_DIRS.iter().flat_map(|d| {
        let dir = format!("/{d}");
        let mut names: Vec<String> = std::fs::read_dir(root.local(&dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        names.sort();
        names.into_iter().map(move |n| (None, format!("{dir}/{n}")))
    });
    from_cache.chain(from_dirs).find_map(|(soname, path)| {
        let real = resolve(root, &path)?;
        // Found by a link name in a directory: that name is the soname.
        let soname = soname.or_else(|| (path != real).then(|| path.rsplit('/').next().unwrap_or_default().to_string()));
        Some(FoundLibrary { soname, real })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_carry_the_driver_version_or_their_own() {
        let v = Semver::normalize("580.95.5").ok();
        let name = |f: &str| driver_library_name(f, "580.95.5", v.as_ref());
        assert_eq!(name("libcuda.so.580.95.05").as_deref(), Some("libcuda.so"));
        assert_eq!(name("libnvcuvid.so.580.95.5").as_deref(), Some("libnvcuvid.so"));
        assert_eq!(name("libcuda.so.1"), None, "a soname link is not the library");
        assert_eq!(name("libcuda.so.570.10.01"), None, "another driver's leftover");
        assert_eq!(name("libnvidia-egl-wayland.so.1.1.19").as_deref(), Some("libnvidia-egl-wayland.so"));
        assert_eq!(name("libnvidia-egl-wayland.so.1"), None);
        assert_eq!(name("libnvidia-nvvm70.so.4").as_deref(), Some("libnvidia-nvvm70.so"));
        assert_eq!(name("README"), None);
    }
}
