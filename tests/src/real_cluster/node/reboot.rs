//! A node's reboot, as far as one machine can play it: every process of
//! the node stops at once, what a node keeps in `/run` (a tmpfs) goes,
//! what it keeps on disk stays, and its services start again.

use super::{Cluster, RealNode, cleanup};

/// The node's directories that stand for `/run`: the CDI directory
/// (`/var/run/cdi`), containerd's state, runc's, the shims' sockets.
const RUN_DIRS: [&str; 4] = ["cdi", "containerd-state", "runc", "s"];
/// Its sockets there.
const RUN_FILES: [&str; 2] = ["containerd.sock", "containerd.sock.ttrpc"];

impl RealNode {
    /// Reboots the node: the kubelet, the pods' processes, containerd and
    /// its shims are killed, then the mount namespace with every mount in
    /// it (the pods' volumes, the sandboxes' `/dev/shm`); the node's
    /// cgroups and its `/run` directories ([`RUN_DIRS`]) are removed; the
    /// kubelet's root (with the plugins' state), containerd's root (its
    /// images) and the pod logs stay. Then the namespace is made again and
    /// containerd and the kubelet start, as a booted node's services do;
    /// the kubelet finds its pods in the API server and starts them again.
    /// The logs before are kept as `<component>-before-reboot.log`. The
    /// boot id is the machine's and stays the same. Only for a node in a
    /// mount namespace of its own ([`RealNode::start_own`]): another's
    /// mounts are the machine's, which no reboot of it clears.
    pub fn reboot(&mut self, cluster: &Cluster) {
        assert!(self.own.is_some(), "only a node in a mount namespace of its own can reboot");
        self.kill_all();
        cleanup::remove_cgroups(&self.cgroup_root);
        for sub in RUN_DIRS {
            let dir = self.dir.path().join(sub);
            if dir.exists() {
                std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("clearing {}: {e}", dir.display()));
            }
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("making {}: {e}", dir.display()));
        }
        for file in RUN_FILES {
            let _ = std::fs::remove_file(self.dir.path().join(file));
        }
        for component in ["kubelet", "containerd"] {
            let log = self.dir.path().join(format!("{component}.log"));
            let kept = self.dir.path().join(format!("{component}-before-reboot.log"));
            std::fs::rename(&log, &kept).unwrap_or_else(|e| panic!("keeping {}: {e}", log.display()));
        }
        self.make_mount_namespace();
        self.start_containerd();
        self.start_kubelet(cluster);
    }
}
