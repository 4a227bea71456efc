//! Discovery on a fake driver root laid out like a real install: ELF
//! libraries built with the system `cc`, an `ld.so.cache` made for the
//! tree by the system's own `ldconfig -r`, firmware, binaries, a socket.

use std::os::unix::fs::symlink;
use std::path::Path;

use super::fake_tree::LIBDIR;
use super::root::{normalize, resolve};
use super::*;

const VERSION: &str = "580.95.05";

fn fake_root(root: &Path, libs: &[(&str, &str)]) {
    fake_tree::build(root, VERSION, libs).unwrap();
}

#[test]
fn libraries_come_from_ldconfigs_cache_with_their_links() {
    let tmp = tempfile::tempdir().unwrap();
    fake_root(
        tmp.path(),
        &[
            ("libcuda.so", "libcuda.so.1"),
            ("libnvidia-ml.so", "libnvidia-ml.so.1"),
            ("libnvidia-nvvm.so", "libnvidia-nvvm.so.4"),
        ],
    );
    let root = DriverRoot::new(tmp.path(), Some(PathBuf::from("/run/nvidia/driver")));
    // NVML's version without the leading zero finds the same firmware.
    let files = discover(&root, "580.95.5", Capabilities::all()).unwrap();
    let mounts: Vec<(&str, &str)> =
        files.mounts.iter().map(|m| (m.host_path.as_str(), m.container_path.as_str())).collect();
    let lib = |l: &str| format!("/{LIBDIR}/{l}.{VERSION}");
    let host = |p: &str| format!("/run/nvidia/driver{p}");
    let expected: Vec<String> = vec![
        lib("libcuda.so"),
        lib("libnvidia-ml.so"),
        lib("libnvidia-nvvm.so"),
        format!("/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"),
        format!("/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin"),
        "/usr/bin/nvidia-smi".into(),
        "/usr/bin/nvidia-cuda-mps-control".into(),
        "/run/nvidia-persistenced/socket".into(),
    ];
    let expected_mounts: Vec<(String, String)> = expected.iter().map(|p| (host(p), p.clone())).collect();
    assert_eq!(mounts, expected_mounts.iter().map(|(h, c)| (h.as_str(), c.as_str())).collect::<Vec<_>>());
    let d = format!("/{LIBDIR}");
    assert_eq!(
        files.links,
        [
            (format!("libcuda.so.{VERSION}"), format!("{d}/libcuda.so.1")),
            ("libcuda.so.1".to_string(), format!("{d}/libcuda.so")),
            (format!("libnvidia-ml.so.{VERSION}"), format!("{d}/libnvidia-ml.so.1")),
            ("libnvidia-ml.so.1".to_string(), format!("{d}/libnvidia-ml.so")),
            (format!("libnvidia-nvvm.so.{VERSION}"), format!("{d}/libnvidia-nvvm.so.4")),
            ("libnvidia-nvvm.so.4".to_string(), format!("{d}/libnvidia-nvvm.so")),
        ]
    );
    assert_eq!(files.library_dirs, [d]);
}

#[test]
fn without_a_cache_the_library_directories_are_searched() {
    let tmp = tempfile::tempdir().unwrap();
    fake_root(tmp.path(), &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")]);
    std::fs::remove_file(tmp.path().join("etc/ld.so.cache")).unwrap();
    let files = discover(&DriverRoot::new(tmp.path(), None), VERSION, Capabilities::all()).unwrap();
    assert_eq!(files.mounts[0].container_path, format!("/{LIBDIR}/libcuda.so.{VERSION}"));
    assert!(files.mounts[0].host_path.starts_with(&*tmp.path().to_string_lossy()), "host root = root by default");
    assert!(files.links.contains(&("libcuda.so.1".to_string(), format!("/{LIBDIR}/libcuda.so"))));
}

/// A cache that is a symlink (to `/dev/zero`, to a FIFO) or too large is
/// not read: no hang, no unbounded read; the library directories are
/// searched instead.
#[test]
fn a_cache_that_is_not_a_small_regular_file_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    fake_root(tmp.path(), &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")]);
    let cache = tmp.path().join("etc/ld.so.cache");
    let fifo = tmp.path().join("fifo");
    rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, rustix::fs::Mode::from_raw_mode(0o600), 0)
        .unwrap();
    let too_large = tmp.path().join("large");
    std::fs::File::create(&too_large).unwrap().set_len(super::ld_cache::MAX_FILE_BYTES + 1).unwrap();
    for target in [std::path::Path::new("/dev/zero"), &fifo, &too_large] {
        std::fs::remove_file(&cache).unwrap();
        std::os::unix::fs::symlink(target, &cache).unwrap();
        let error = super::ld_cache::read(tmp.path()).unwrap_err();
        assert!(error.to_string().contains("is a symbolic link"), "{error}");
        let files = discover(&DriverRoot::new(tmp.path(), None), VERSION, Capabilities::all()).unwrap();
        assert_eq!(files.mounts[0].container_path, format!("/{LIBDIR}/libcuda.so.{VERSION}"));
    }
    std::fs::remove_file(&cache).unwrap();
    std::fs::rename(&too_large, &cache).unwrap();
    let error = super::ld_cache::read(tmp.path()).unwrap_err();
    assert!(error.to_string().contains("the most such a file may hold"), "{error}");
    assert!(discover(&DriverRoot::new(tmp.path(), None), VERSION, Capabilities::all()).is_ok());
}

#[test]
fn a_root_without_libcuda_names_the_directory_and_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    fake_root(tmp.path(), &[("libnvidia-ml.so", "libnvidia-ml.so.1")]);
    let e = discover(&DriverRoot::new(tmp.path(), None), VERSION, Capabilities::all()).unwrap_err();
    assert_eq!(e, DiscoveryError::Missing { library: "libcuda.so", root: tmp.path().display().to_string() });
    assert!(e.to_string().contains("--driver-root"), "{e}");
}

#[test]
fn absolute_links_stay_inside_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    fake_root(tmp.path(), &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")]);
    // A link to an absolute path is the root's path, not this machine's.
    let link = tmp.path().join(LIBDIR).join("libnvidia-cfg.so.1");
    symlink(format!("/{LIBDIR}/libcuda.so.{VERSION}"), &link).unwrap();
    assert_eq!(
        resolve(&DriverRoot::new(tmp.path(), None), &format!("/{LIBDIR}/libnvidia-cfg.so.1")),
        Some(format!("/{LIBDIR}/libcuda.so.{VERSION}"))
    );
    // A loop ends.
    symlink("loop-b", tmp.path().join("loop-a")).unwrap();
    symlink("loop-a", tmp.path().join("loop-b")).unwrap();
    assert_eq!(resolve(&DriverRoot::new(tmp.path(), None), "/loop-a"), None);
    assert_eq!(normalize(Path::new("/../../etc/../x")), Some("/x".to_string()));
}

#[test]
fn nvml_is_located_under_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    fake_root(tmp.path(), &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")]);
    let root = DriverRoot::new(tmp.path(), Some(PathBuf::from("/elsewhere")));
    assert_eq!(
        local_library(&root, "libnvidia-ml.so"),
        Some(tmp.path().join(format!("{LIBDIR}/libnvidia-ml.so.{VERSION}"))),
        "a path this process can open, not the host's"
    );
    assert_eq!(local_library(&root, "libnvidia-nscq.so"), None);
}

/// What NVIDIA's toolkit injects for the same root: every library of the
/// driver version (video and graphics too, VDPAU's in `vdpau/`), the EGL
/// platform library, the configuration files where the container's loaders
/// look, X.Org's modules at their own paths, the GBM and GLX server links,
/// and the forward-compatibility hook's version; never the image's own
/// `compat/` libraries.
#[test]
fn a_complete_root_gives_every_set_and_a_narrower_set_leaves_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    fake_tree::build_complete(tmp.path(), VERSION).unwrap();
    let root = DriverRoot::new(tmp.path(), Some(PathBuf::from("/host")));
    let files = discover(&root, VERSION, Capabilities::all()).unwrap();
    let containers: Vec<&str> = files.mounts.iter().map(|m| m.container_path.as_str()).collect();
    let d = format!("/{LIBDIR}");
    for expected in [
        format!("{d}/libcuda.so.{VERSION}"),
        format!("{d}/libnvcuvid.so.{VERSION}"),
        format!("{d}/libnvidia-encode.so.{VERSION}"),
        format!("{d}/libnvidia-opticalflow.so.{VERSION}"),
        format!("{d}/vdpau/libvdpau_nvidia.so.{VERSION}"),
        format!("{d}/libGLX_nvidia.so.{VERSION}"),
        format!("{d}/libEGL_nvidia.so.{VERSION}"),
        format!("{d}/libnvidia-glcore.so.{VERSION}"),
        format!("{d}/libnvidia-egl-wayland.so.1.1.19"),
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json".into(),
        "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json".into(),
        "/etc/vulkan/icd.d/nvidia_icd.json".into(),
        "/etc/OpenCL/vendors/nvidia.icd".into(),
        "/usr/share/nvidia/nvoptix.bin".into(),
        "/usr/lib/xorg/modules/drivers/nvidia_drv.so".into(),
        format!("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{VERSION}"),
    ] {
        assert!(containers.contains(&expected.as_str()), "missing {expected} in {containers:#?}");
    }
    assert!(!containers.iter().any(|c| c.contains("compat")), "the image brings its compat libraries: {containers:?}");
    // Host paths are the host's view of the same files.
    let vulkan = files.mounts.iter().find(|m| m.container_path == "/etc/vulkan/icd.d/nvidia_icd.json").unwrap();
    assert_eq!(vulkan.host_path, "/host/etc/vulkan/icd.d/nvidia_icd.json");
    for link in [
        (format!("libvdpau_nvidia.so.{VERSION}"), format!("{d}/vdpau/libvdpau_nvidia.so.1")),
        ("libGLX_nvidia.so.0".to_string(), format!("{d}/libGLX_nvidia.so")),
        ("../libnvidia-allocator.so.1".to_string(), format!("{d}/gbm/nvidia-drm_gbm.so")),
        (
            format!("libglxserver_nvidia.so.{VERSION}"),
            "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so".to_string(),
        ),
    ] {
        assert!(files.links.contains(&link), "missing link {link:?} in {:#?}", files.links);
    }
    assert!(files.library_dirs.contains(&format!("{d}/vdpau")), "{:?}", files.library_dirs);
    assert_eq!(files.cuda_compat_host_version.as_deref(), Some(VERSION));

    let compute: Capabilities = "compute,utility".parse().unwrap();
    let narrow = discover(&root, VERSION, compute).unwrap();
    let containers: Vec<&str> = narrow.mounts.iter().map(|m| m.container_path.as_str()).collect();
    assert!(containers.contains(&format!("{d}/libcuda.so.{VERSION}").as_str()));
    for absent in ["libnvcuvid", "vdpau", "libGLX_nvidia", "egl_vendor", "vulkan", "xorg"] {
        assert!(!containers.iter().any(|c| c.contains(absent)), "{absent} outside compute,utility: {containers:?}");
    }
    let video = discover(&root, VERSION, "video".parse().unwrap()).unwrap();
    assert!(video.mounts.iter().any(|m| m.container_path.ends_with(&format!("libnvcuvid.so.{VERSION}"))));
    assert_eq!(video.cuda_compat_host_version, None, "no CUDA, no compat hook");
}
