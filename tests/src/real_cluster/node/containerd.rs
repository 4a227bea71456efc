//! containerd alone, without a kubelet: the node's containerd and runc
//! (the same binaries as [`super::RealNode`]'s), with its CRI plugin off,
//! to import an image archive and run a container from it as a node would.
//! Everything stays under one temporary directory, taken apart on drop as
//! the node's is: containerd killed with its group, the shims serving its
//! socket killed, mounts under the directory detached.
//! Must run as root (mounts, runc).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::binaries::{NodeBinaries, node_binaries};
use super::cleanup;
use crate::real_cluster::process::ControlPlaneProcess;

/// The Kubernetes minor whose node binaries are used (containerd's version
/// does not depend on it).
const NODE_MINOR: &str = "1.37";
/// The namespace the CRI, hence the kubelet, reads images from.
pub const CRI_NAMESPACE: &str = "k8s.io";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running containerd. Dropping it takes everything apart.
pub struct Containerd {
    bins: NodeBinaries,
    process: Option<ControlPlaneProcess>,
    dir: tempfile::TempDir,
}

impl Containerd {
    /// Starts containerd (built by `tests/kube-bins/build.sh 1.37 node`
    /// when the cache lacks it) and waits until it answers.
    pub fn start() -> Self {
        let bins = node_binaries(NODE_MINOR);
        let dir = tempfile::Builder::new().prefix("containerd-").tempdir().expect("temporary directory");
        std::fs::create_dir(dir.path().join("s")).expect("the shims' socket directory");
        let config = dir.path().join("containerd.toml");
        std::fs::write(&config, config_text(dir.path())).expect("containerd config");
        let process = ControlPlaneProcess::spawn(
            "containerd",
            &bins.containerd,
            &["--config".to_string(), config.display().to_string()],
            dir.path().join("containerd.log"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut containerd = Self { bins, process: Some(process), dir };
        let deadline = Instant::now() + START_TIMEOUT;
        while !containerd.ctr(&["version"]).status.success() {
            if let Some(exit) = containerd.process.as_mut().and_then(ControlPlaneProcess::exited) {
                panic!("{exit}\n{}", containerd.log());
            }
            assert!(Instant::now() < deadline, "containerd did not answer\n{}", containerd.log());
            std::thread::sleep(Duration::from_millis(200));
        }
        containerd
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// `ctr --address <socket> args...`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new(&self.bins.ctr)
            .arg("--address")
            .arg(self.socket())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.bins.ctr.display()))
    }

    /// Debian's runc, which `ctr run --runc-binary` takes.
    pub fn runc(&self) -> &Path {
        &self.bins.runc
    }

    /// The last lines of containerd's log.
    pub fn log(&self) -> String {
        self.process.as_ref().map(|p| p.log_tail(40)).unwrap_or_default()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
        cleanup::kill_shims(&self.socket());
        cleanup::unmount_under(self.dir.path());
    }
}

/// Every path under `dir`; the plugins a bare containerd needs to import,
/// unpack (overlayfs) and run (the runc shim, found beside containerd);
/// the CRI and the snapshotters nobody uses off.
fn config_text(dir: &Path) -> String {
    let d = |sub: &str| dir.join(sub).display().to_string();
    let shim_sockets = super::config::shim_sockets(dir);
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.native", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
{shim_sockets}"#,
        root = d("root"),
        state = d("state"),
        socket = d("containerd.sock"),
        opt = d("opt"),
    )
}
