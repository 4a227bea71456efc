//! The node's programs and images, built by `tests/kube-bins/build.sh
//! <minor> node` into the per-machine cache when it lacks them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::real_cluster::binaries::{Built, BuiltOnce, built_once};

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
    static BUILT: BuiltOnce<NodeBinaries> = OnceLock::new();
    let banner =
        format!("real node: {{script}} {minor} node (builds the kubelet and containerd when the cache lacks them)");
    let need = "the real-node test needs Go, the Go module proxy and Debian's runc";
    built_once(&BUILT, &[minor, "node"], &banner, need, |printed| {
        let kubelet_dir = printed.path("kubelet-bin-dir=");
        let containerd_dir = printed.path("containerd-bin-dir=");
        NodeBinaries {
            kubelet: kubelet_dir.join("kubelet"),
            containerd: containerd_dir.join("containerd"),
            containerd_shim: containerd_dir.join("containerd-shim-runc-v2"),
            ctr: containerd_dir.join("ctr"),
            runc: printed.path("runc="),
            images: printed.path("node-images="),
        }
    })
}

impl Built for NodeBinaries {
    fn files(&self) -> Vec<&Path> {
        vec![&self.kubelet, &self.containerd, &self.containerd_shim, &self.ctr, &self.runc, &self.images]
    }
}
