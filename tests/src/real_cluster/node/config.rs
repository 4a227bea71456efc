//! The node's configuration files, as text: containerd's, the kubelet's,
//! and the kubelet's kubeconfig.

use std::path::Path;

use super::PAUSE_IMAGE;
use super::binaries::NodeBinaries;

/// containerd's limit on its shims' socket directory (`socket_dir`).
const MAX_SOCKET_DIR_LEN: usize = 42;

/// containerd's `socket_dir` for the shims' sockets, `dir/s`, when that path
/// is short enough for containerd; else nothing (they go to /run/containerd/s).
pub(super) fn shim_sockets(dir: &Path) -> String {
    let sockets = dir.join("s").display().to_string();
    if sockets.len() <= MAX_SOCKET_DIR_LEN {
        format!("[plugins.\"io.containerd.shim.v1.manager\"]\n  socket_dir = \"{sockets}\"\n")
    } else {
        String::new()
    }
}

/// containerd's configuration for a node in `dir`, listening on `socket`:
/// every path under `dir` (root, state, runc's state, the shims' sockets
/// when the path is short enough for containerd -- else they go to
/// /run/containerd/s); CDI (on by default in 2.x) reading only
/// `dir/cdi`, the directory the plugin writes; the pause image pinned; the
/// runc shim and runc by absolute path; no CNI configuration (host-network
/// pods only); NRI, tracing and the snapshotters the tests do not use off.
pub fn containerd(dir: &Path, socket: &Path, bins: &NodeBinaries) -> String {
    let d = |sub: &str| dir.join(sub).display().to_string();
    let shim_sockets = shim_sockets(dir);
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.native", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
{shim_sockets}[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{pause}"
[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = ["{cdi}"]
  # Without CAP_SYS_RESOURCE (these machines' root lacks it) runc cannot
  # lower a sandbox's oom_score_adj to the kubelet's -998 and every
  # sandbox fails with "can't get final child's PID from pipe: EOF";
  # this caps it at containerd's own.
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "{shim}"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "{runc_root}"
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{cni}"]
  conf_dir = "{cni}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        root = d("containerd-root"),
        state = d("containerd-state"),
        socket = socket.display(),
        opt = d("opt"),
        pause = PAUSE_IMAGE,
        cdi = d("cdi"),
        shim = bins.containerd_shim.display(),
        runc = bins.runc.display(),
        runc_root = d("runc"),
        cni = d("cni"),
    )
}

/// What the kubelet's configuration varies in.
pub struct KubeletSettings<'a> {
    /// The address its API listens on (loopback, or the node's own).
    pub address: std::net::IpAddr,
    pub containerd_socket: &'a Path,
    pub cgroup_root: &'a str,
    pub port: u16,
    pub healthz_port: u16,
    pub pod_logs: &'a Path,
}

/// The kubelet's configuration: loopback ports, anonymous access to its
/// API (nothing but the test reaches it), cgroup v1 with cgroupfs under
/// its own cgroup root, eviction that never fires on a shared machine's
/// disks, and quick status updates and syncs.
pub fn kubelet(settings: &KubeletSettings<'_>) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 hierarchies on these machines: 1.35+ refuse them unless told.
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
containerRuntimeEndpoint: unix://{socket}
imageServiceEndpoint: unix://{socket}
address: {address}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
podLogsDir: {pod_logs}
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
# A shared test machine's disks and memory are whatever they are.
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
enforceNodeAllocatable: []
resolvConf: \"\"
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
fileCheckFrequency: 5s
",
        address = settings.address,
        cgroup_root = settings.cgroup_root,
        socket = settings.containerd_socket.display(),
        port = settings.port,
        healthz = settings.healthz_port,
        pod_logs = settings.pod_logs.display(),
    )
}

/// A kubeconfig for the API server at `url` that authenticates with a
/// client certificate.
pub fn client_certificate_kubeconfig(url: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {url}\n    \
         certificate-authority: {}\nusers:\n- name: node\n  user:\n    client-certificate: {}\n    \
         client-key: {}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: node\n\
         current-context: real\n",
        ca.display(),
        cert.display(),
        key.display()
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn bins() -> NodeBinaries {
        NodeBinaries {
            kubelet: "/c/kubelet".into(),
            containerd: "/c/containerd".into(),
            containerd_shim: "/c/containerd-shim-runc-v2".into(),
            ctr: "/c/ctr".into(),
            runc: "/usr/sbin/runc".into(),
            images: "/c/images.tar".into(),
        }
    }

    #[test]
    fn containerd_keeps_everything_under_the_node_directory() {
        let dir = PathBuf::from("/tmp/real-node-a");
        let config = containerd(&dir, &dir.join("containerd.sock"), &bins());
        for line in [
            "version = 3",
            "root = \"/tmp/real-node-a/containerd-root\"",
            "state = \"/tmp/real-node-a/containerd-state\"",
            "  address = \"/tmp/real-node-a/containerd.sock\"",
            "[plugins.\"io.containerd.shim.v1.manager\"]",
            "  socket_dir = \"/tmp/real-node-a/s\"",
            "  cdi_spec_dirs = [\"/tmp/real-node-a/cdi\"]",
            "  restrict_oom_score_adj = true",
            "  runtime_path = \"/c/containerd-shim-runc-v2\"",
            "  BinaryName = \"/usr/sbin/runc\"",
            "  Root = \"/tmp/real-node-a/runc\"",
            &format!("  sandbox = \"{PAUSE_IMAGE}\""),
        ] {
            assert!(config.lines().any(|l| l == line), "no {line:?} in\n{config}");
        }
        let paths = config.lines().filter_map(|l| l.split_once(" = \"/").map(|(_, p)| p));
        for path in paths {
            assert!(
                path.starts_with("tmp/real-node-a/") || path.starts_with("c/") || path.starts_with("usr/sbin/"),
                "{path}"
            );
        }
    }

    #[test]
    fn a_socket_dir_too_long_for_containerd_is_left_to_its_default() {
        let dir = PathBuf::from("/a/temporary/directory/deeper/than/containerd/allows");
        let config = containerd(&dir, &dir.join("containerd.sock"), &bins());
        assert!(!config.contains("socket_dir"), "{config}");
        assert!(config.contains("restrict_oom_score_adj = true"));
    }
}
