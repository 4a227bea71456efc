//! The node's programs and images, built by `tests/kube-bins/build.sh
//! <minor> node` into the per-machine cache when it lacks them.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::real_cluster::binaries::run_build_script;

/// Where one node's programs and images are.
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    pub kubelet: PathBuf,
    pub containerd: PathBuf,
    pub containerd_shim: PathBuf,
    pub ctr: PathBuf,
    pub runc: PathBuf,
    /// OCI archive holding [`PAUSE_IMAGE`] and [`TEST_IMAGE`].
    pub images: PathBuf,
}

/// The node's programs for Kubernetes `minor`, built (and runc installed)
/// by `build.sh <minor> node` when the cache lacks them.
pub fn node_binaries(minor: &str) -> NodeBinaries {
    static BUILT: OnceLock<Mutex<Option<(String, NodeBinaries)>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some((built_minor, found)) = built.as_ref()
        && built_minor == minor
    {
        return found.clone();
    }
    let printed = run_build_script(
        &[minor, "node"],
        &format!("real node: {{script}} {minor} node (builds the kubelet and containerd when the cache lacks them)"),
        "the real-node test needs Go, the Go module proxy and Debian's runc",
    );
    let value = |key: &str| printed.path(key);
    let kubelet_dir = value("kubelet-bin-dir=");
    let containerd_dir = value("containerd-bin-dir=");
    let found = NodeBinaries {
        kubelet: kubelet_dir.join("kubelet"),
        containerd: containerd_dir.join("containerd"),
        containerd_shim: containerd_dir.join("containerd-shim-runc-v2"),
        ctr: containerd_dir.join("ctr"),
        runc: value("runc="),
        images: value("node-images="),
    };
    for path in [&found.kubelet, &found.containerd, &found.containerd_shim, &found.ctr, &found.runc, &found.images] {
        assert!(path.is_file(), "{} is missing after the build", path.display());
    }
    *built = Some((minor.to_string(), found.clone()));
    found
}
