//! A node's reboot, as far as one machine can play it: every process of
//! the node stops at once, what a node keeps in `/run` (a tmpfs) goes,
//! what it keeps on disk stays, and its services start again; a restart
//! of the kubelet alone; a pod's processes killed.

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
        self.keep_logs(&["kubelet", "containerd"], "before-reboot");
        self.make_mount_namespace();
        self.start_containerd();
        self.start_kubelet(cluster);
    }

    /// Restarts the kubelet alone (killed, then started again with a new
    /// configuration and ports), as `systemctl restart kubelet` does: the
    /// containers run on, and the kubelet finds them. Its log before is
    /// kept as `kubelet-before-restart.log`.
    pub fn restart_kubelet(&mut self, cluster: &Cluster) {
        let at = self.processes.iter().position(|p| p.name() == "kubelet").expect("a running kubelet");
        self.processes.remove(at).kill();
        self.keep_logs(&["kubelet"], "before-restart");
        self.start_kubelet(cluster);
    }

    /// Kills every process of pod `uid` (its sandbox and its containers),
    /// as a crash or the OOM killer would: the kubelet finds the sandbox
    /// dead and makes a new one, preparing the pod's claims before.
    pub fn kill_pod(&self, uid: &str) {
        let classes = ["kubepods/besteffort", "kubepods/burstable", "kubepods"];
        let cgroups = classes.map(|class| format!("{}/{class}/pod{uid}", self.cgroup_root));
        let cgroup = cgroups.iter().find(|c| cleanup::cgroup_exists(c));
        let cgroup = cgroup.unwrap_or_else(|| panic!("no cgroup of pod {uid} among {cgroups:?}"));
        cleanup::kill_cgroup_processes(cgroup);
    }

    /// Renames each component's log to `<component>-<suffix>.log`.
    fn keep_logs(&self, components: &[&str], suffix: &str) {
        for component in components {
            let log = self.dir.path().join(format!("{component}.log"));
            let kept = self.dir.path().join(format!("{component}-{suffix}.log"));
            std::fs::rename(&log, &kept).unwrap_or_else(|e| panic!("keeping {}: {e}", log.display()));
        }
    }
}
