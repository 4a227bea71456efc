//! One real node for the tests: containerd (CDI on, reading the directory
//! the plugin writes its specs to) running containers with Debian's runc,
//! and the release's kubelet registered with a [`Cluster`]'s API server.
//! Built by `tests/kube-bins/build.sh <minor> node` into the same
//! per-machine cache as the control plane.
//!
//! Everything the node makes stays under one temporary directory
//! (containerd's root and state, runc's state, the kubelet's root and pod
//! logs, the CDI directory), under one cgroup of its own in every
//! hierarchy, and is removed on drop: processes killed (the kubelet,
//! containerd, its shims and the containers in the node's cgroup), mounts
//! under the directory detached, the cgroups removed. The kubelet sets six
//! kernel tunables when it starts (`vm.overcommit_memory`,
//! `kernel.panic`, ...; `protectKernelDefaults: true` would refuse to
//! start instead); their values are restored on drop. Pods run with the
//! host's network: containerd has no CNI configuration, so the node
//! reports `NetworkReady=false` and test pods tolerate its taints.
//! Must run as root (mounts, cgroups, device nodes).

mod binaries;
mod cleanup;
mod config;
mod containerd;
mod plugin;
mod reboot;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

pub use binaries::{NodeBinaries, node_binaries};
pub use containerd::{CRI_NAMESPACE, Containerd};

use super::process::ControlPlaneProcess;
use super::{Cluster, unique};

/// The sandbox ("pause") image: a shell that sleeps until SIGTERM.
pub const PAUSE_IMAGE: &str = "localhost/gpu-dra-driver/pause:busybox";
/// The test containers' image: Debian's busybox-static, entrypoint `sh`.
pub const TEST_IMAGE: &str = "localhost/gpu-dra-driver/busybox:test";
/// How long a real-node test waits for the kubelet, containerd and the
/// plugin to act (a pod to start, a health change to reach it).
pub const NODE_WAIT: Duration = Duration::from_secs(120);
/// The fake inventory of the single-node tests: two H100s on a current driver.
pub const TWO_H100: &str = r#"
driverVersion: "580.82.07"
cudaDriverVersion: "13.0"
gpus:
  - model: H100-80GB
    count: 2
"#;

/// Start-up wait for containerd and the kubelet's registration.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The kernel tunables the kubelet's container manager sets
/// (`setupKernelTunables`), restored on drop.
const KUBELET_SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// A running node. Dropping it tears everything down (see the module's
/// documentation).
pub struct RealNode {
    name: String,
    bins: NodeBinaries,
    /// `/gpu-dra-realnode-<unique>`: the kubelet's `cgroupRoot`, under
    /// which every pod's cgroup is made, in every hierarchy.
    cgroup_root: String,
    /// The kubelet first, then containerd: stopped in this order.
    processes: Vec<ControlPlaneProcess>,
    /// Each tunable's value before the kubelet started.
    sysctls: Vec<(PathBuf, String)>,
    /// Of [`cleanup::FIXED_DIRS`], those that did not exist before the node.
    made_fixed_dirs: Vec<&'static Path>,
    /// Set for a node in a mount namespace of its own ([`RealNode::start_own`]).
    own: Option<OwnPaths>,
    dir: tempfile::TempDir,
}

/// A node whose kubelet and containerd run in a mount namespace of their
/// own, where the kubelet's and CDI's usual paths are the node's
/// directories: several such nodes on one machine each have
/// `/var/lib/kubelet` and `/var/run/cdi`, as the chart's DaemonSet mounts
/// them on every node; and an address of its own (`--node-ip`), which its
/// host-network pods listen on.
struct OwnPaths {
    node_ip: std::net::Ipv4Addr,
}

/// The kubelet's root directory and the CDI directory, as the chart's
/// defaults name them, inside an own node's mount namespace.
const OWN_KUBELET_ROOT: &str = "/var/lib/kubelet";
const OWN_CDI_DIR: &str = "/var/run/cdi";

/// The mount points in the machine's namespace that own nodes bind onto,
/// shared by every own node of this process: made (when absent) as the
/// first starts, removed (if made here, and empty) when the last has
/// gone. Removing one while a node is bound to it would detach that
/// node's mounts (Linux detaches other namespaces' mounts on rmdir).
struct OwnMountPoints {
    live: usize,
    made: Vec<&'static str>,
}

static OWN_MOUNT_POINTS: std::sync::Mutex<OwnMountPoints> =
    std::sync::Mutex::new(OwnMountPoints { live: 0, made: Vec::new() });

fn hold_own_mount_points() {
    let mut points = OWN_MOUNT_POINTS.lock().unwrap_or_else(|e| e.into_inner());
    if points.live == 0 {
        points.made = [OWN_KUBELET_ROOT, OWN_CDI_DIR].into_iter().filter(|p| !Path::new(p).exists()).collect();
    }
    for point in [OWN_KUBELET_ROOT, OWN_CDI_DIR] {
        std::fs::create_dir_all(point).unwrap_or_else(|e| panic!("mount point {point}: {e}"));
    }
    points.live += 1;
}

fn release_own_mount_points() {
    let mut points = OWN_MOUNT_POINTS.lock().unwrap_or_else(|e| e.into_inner());
    points.live = points.live.saturating_sub(1);
    if points.live == 0 {
        for point in std::mem::take(&mut points.made) {
            let _ = std::fs::remove_dir(point);
        }
    }
}

impl RealNode {
    /// Starts containerd, imports the images, and starts the kubelet as
    /// node `name` of `cluster`, authenticating as the node
    /// (`system:node:<name>` in `system:nodes`, a client certificate from
    /// the cluster's CA): the real Node authorizer decides what it may
    /// read (its pods' claims). Returns once the Node object exists.
    /// Panics with the logs when something does not come up.
    pub async fn start(cluster: &Cluster, name: &str) -> Self {
        Self::start_with(cluster, name, None).await
    }

    /// [`RealNode::start`] in a mount namespace of the node's own, at
    /// `node_ip` (an address of this machine): see [`OwnPaths`]. The
    /// kubelet's paths seen from the machine ([`RealNode::plugins_dir`],
    /// [`RealNode::cdi_dir`]) are the node directory's as for any node.
    pub async fn start_own(cluster: &Cluster, name: &str, node_ip: std::net::Ipv4Addr) -> Self {
        Self::start_with(cluster, name, Some(OwnPaths { node_ip })).await
    }

    async fn start_with(cluster: &Cluster, name: &str, own: Option<OwnPaths>) -> Self {
        let bins = node_binaries(cluster.release().minor);
        let dir = tempfile::Builder::new().prefix("real-node-").tempdir().expect("temporary directory");
        if own.is_some() {
            // Released by the node's drop.
            hold_own_mount_points();
        }
        let mut node = Self {
            name: name.to_string(),
            bins,
            cgroup_root: format!("/gpu-dra-realnode-{}", unique()),
            processes: Vec::new(),
            sysctls: Vec::new(),
            // An own node's kubelet writes none of /var/lib/kubelet in the
            // machine's namespace (its mount point is shared: see
            // `OwnMountPoints`).
            made_fixed_dirs: cleanup::FIXED_DIRS
                .iter()
                .map(Path::new)
                .filter(|d| !d.exists() && (own.is_none() || !d.starts_with(OWN_KUBELET_ROOT)))
                .collect(),
            own,
            dir,
        };
        for sub in
            ["cdi", "cni", "kubelet", "kubelet-pki", "pod-logs", "containerd-root", "containerd-state", "opt", "s"]
        {
            std::fs::create_dir_all(node.dir.path().join(sub)).expect("node directory");
        }
        if node.own.is_some() {
            node.make_mount_namespace();
        }
        node.start_containerd();
        node.import_images();
        node.save_sysctls();
        node.start_kubelet(cluster);
        node.wait_registered(cluster).await;
        node
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory containerd reads CDI specs from (the plugin's
    /// `--cdi-dir`).
    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    /// The kubelet's plugin directory (the plugin's `--plugins-dir`).
    pub fn plugins_dir(&self) -> PathBuf {
        self.kubelet_root().join("plugins")
    }

    /// The kubelet's plugin registry (the plugin's `--registry-dir`).
    pub fn registry_dir(&self) -> PathBuf {
        self.kubelet_root().join("plugins_registry")
    }

    /// The node's cgroup (the kubelet's `cgroupRoot`), in every hierarchy.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// A directory inside the node's, removed with it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn kubelet_root(&self) -> PathBuf {
        self.dir.path().join("kubelet")
    }

    fn containerd_socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// What container `container` of pod `namespace/name` (uid `uid`)
    /// wrote, read from the kubelet's pod log directory (the CRI log
    /// format: time, stream and tag before each line). The API server
    /// cannot reach this kubelet's port to serve `pods/log`: the kubelet
    /// listens on loopback, and a node's address may not be loopback.
    pub fn container_log(&self, namespace: &str, name: &str, uid: &str, container: &str) -> String {
        self.container_log_of_run(namespace, name, uid, container, 0)
    }

    /// [`RealNode::container_log`] of the container's run number `run`
    /// (its `restartCount` then): the kubelet writes each run's log apart.
    pub fn container_log_of_run(&self, namespace: &str, name: &str, uid: &str, container: &str, run: i32) -> String {
        let file = self
            .dir
            .path()
            .join("pod-logs")
            .join(format!("{namespace}_{name}_{uid}"))
            .join(container)
            .join(format!("{run}.log"));
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        text.lines().filter_map(|line| line.splitn(4, ' ').nth(3)).collect::<Vec<_>>().join("\n")
    }

    /// The whole log of `component` (`kubelet` or `containerd`).
    pub fn log(&self, component: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{component}.log"))).unwrap_or_default()
    }

    /// The last lines of the kubelet's and containerd's logs.
    pub fn logs(&self) -> String {
        self.processes
            .iter()
            .map(|p| format!("---- {} ({})\n{}", p.name(), p.log_path().display(), p.log_tail(60)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Panics (with the logs) if the kubelet or containerd has exited.
    pub fn assert_running(&mut self) {
        if let Some(exit) = self.processes.iter_mut().find_map(ControlPlaneProcess::exited) {
            panic!("{exit}\n{}", self.logs());
        }
    }

    /// Starts `program` in the node's mount namespace, if it has one.
    fn spawn(&mut self, name: &'static str, program: &Path, args: Vec<String>) {
        let log = self.dir.path().join(format!("{name}.log"));
        let (program, args) = match self.namespace() {
            Some(ns) => {
                let mut all = vec![format!("--mount={}", ns.display()), "--".into(), program.display().to_string()];
                all.extend(args);
                (PathBuf::from("nsenter"), all)
            }
            None => (program.to_path_buf(), args),
        };
        let process = ControlPlaneProcess::spawn(name, &program, &args, log).unwrap_or_else(|e| panic!("{e}"));
        self.processes.push(process);
    }

    /// `/proc/<holder>/ns/mnt` of an own node's namespace holder (the
    /// first process, killed last).
    fn namespace(&self) -> Option<PathBuf> {
        let holder = self.processes.first().filter(|p| p.name() == "mount-namespace")?;
        Some(PathBuf::from(format!("/proc/{}/ns/mnt", holder.pid())))
    }

    /// A process holding a new mount namespace (private propagation:
    /// nothing mounted in it reaches the machine's), in which the node's
    /// `kubelet` and `cdi` directories are bound onto the usual paths.
    fn make_mount_namespace(&mut self) {
        let log = self.dir.path().join("mount-namespace.log");
        let args = ["--mount", "--propagation", "private", "sleep", "infinity"].map(String::from);
        let holder = ControlPlaneProcess::spawn("mount-namespace", Path::new("unshare"), &args, log)
            .unwrap_or_else(|e| panic!("{e}"));
        let (ours, theirs) = (std::fs::read_link("/proc/self/ns/mnt").ok(), format!("/proc/{}/ns/mnt", holder.pid()));
        self.processes.push(holder);
        let deadline = Instant::now() + START_TIMEOUT;
        while std::fs::read_link(&theirs).ok() == ours {
            self.assert_running();
            assert!(Instant::now() < deadline, "unshare made no mount namespace\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
        for (from, onto) in [(self.kubelet_root(), OWN_KUBELET_ROOT), (self.cdi_dir(), OWN_CDI_DIR)] {
            let out = Command::new("nsenter")
                .arg(format!("--mount={theirs}"))
                .args(["--", "mount", "--bind"])
                .arg(&from)
                .arg(onto)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("nsenter: {e}"));
            assert!(
                out.status.success(),
                "binding {} onto {onto}: {}",
                from.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    fn start_containerd(&mut self) {
        let config = self.dir.path().join("containerd.toml");
        std::fs::write(&config, config::containerd(self.dir.path(), &self.containerd_socket(), &self.bins))
            .expect("containerd config");
        let containerd = self.bins.containerd.clone();
        self.spawn("containerd", &containerd, vec!["--config".into(), config.display().to_string()]);
        let deadline = Instant::now() + START_TIMEOUT;
        while !self.ctr(&["version"]).status.success() {
            self.assert_running();
            assert!(Instant::now() < deadline, "containerd did not answer\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `ctr --address <socket> args...`.
    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.bins.ctr)
            .arg("--address")
            .arg(self.containerd_socket())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.bins.ctr.display()))
    }

    /// The pause and test images, into the namespace the CRI uses.
    fn import_images(&mut self) {
        self.import_archive(&self.bins.images, &[PAUSE_IMAGE, TEST_IMAGE]);
    }

    /// Imports an image archive (`image/build.sh`'s) into the namespace
    /// the CRI reads, as a user does with `ctr -n k8s.io images import`,
    /// and checks that `name` is there.
    pub fn import_image(&self, archive: &Path, name: &str) {
        self.import_archive(archive, &[name]);
    }

    /// Gives image `name` a second name `also` in the namespace the CRI
    /// reads (`ctr -n k8s.io images tag`): the same image under another
    /// tag, as a user's registry holds two versions.
    pub fn tag_image(&self, name: &str, also: &str) {
        let out = self.ctr(&["-n", CRI_NAMESPACE, "images", "tag", "--force", name, also]);
        assert!(out.status.success(), "ctr images tag {name} {also}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// `ctr -n k8s.io images import` of `archive`, then a check that each
    /// of `names` is listed.
    fn import_archive(&self, archive: &Path, names: &[&str]) {
        let archive = archive.display().to_string();
        let out = self.ctr(&["-n", CRI_NAMESPACE, "images", "import", "--local", &archive]);
        assert!(
            out.status.success(),
            "ctr images import {archive}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        let listed = self.ctr(&["-n", CRI_NAMESPACE, "images", "list", "-q"]);
        let listed = String::from_utf8_lossy(&listed.stdout);
        for name in names {
            assert!(listed.lines().any(|l| l == *name), "{name} not imported from {archive}: {listed}");
        }
    }

    fn save_sysctls(&mut self) {
        for name in KUBELET_SYSCTLS {
            let path = Path::new("/proc/sys").join(name);
            if let Ok(value) = std::fs::read_to_string(&path) {
                self.sysctls.push((path, value.trim().to_string()));
            }
        }
    }

    fn start_kubelet(&mut self, cluster: &Cluster) {
        let [port, healthz] = crate::ports::reserve();
        let config = self.dir.path().join("kubelet.yaml");
        // An own node's kubelet listens on its node's address, where the
        // API server reaches it (`kubectl logs`).
        let address = self.own.as_ref().map_or(std::net::IpAddr::from([127, 0, 0, 1]), |o| o.node_ip.into());
        let yaml = config::kubelet(&config::KubeletSettings {
            address,
            containerd_socket: &self.containerd_socket(),
            cgroup_root: &self.cgroup_root,
            port,
            healthz_port: healthz,
            pod_logs: &self.dir.path().join("pod-logs"),
        });
        std::fs::write(&config, yaml).expect("kubelet config");
        // The kubelet requires its cgroupRoot to exist in every hierarchy.
        cleanup::make_cgroups(&self.cgroup_root).unwrap_or_else(|e| panic!("{e}"));
        let kubeconfig = self.write_node_kubeconfig(cluster);
        let kubelet = self.bins.kubelet.clone();
        let args = vec![
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            match &self.own {
                Some(_) => format!("--root-dir={OWN_KUBELET_ROOT}"),
                None => format!("--root-dir={}", self.kubelet_root().display()),
            },
            format!("--cert-dir={}", self.dir.path().join("kubelet-pki").display()),
            format!("--hostname-override={}", self.name),
            "--v=2".into(),
        ];
        let mut args = args;
        if let Some(own) = &self.own {
            args.push(format!("--node-ip={}", own.node_ip));
        }
        self.spawn("kubelet", &kubelet, args);
    }

    /// A kubeconfig with the node's client certificate.
    fn write_node_kubeconfig(&self, cluster: &Cluster) -> PathBuf {
        let user = format!("system:node:{}", self.name);
        let (cert, key) = cluster
            .pki
            .client_certificate(&user, "system:nodes")
            .unwrap_or_else(|e| panic!("certificate for {user}: {e}"));
        let (cert_file, key_file) =
            (self.dir.path().join("kubelet-client.crt"), self.dir.path().join("kubelet-client.key"));
        std::fs::write(&cert_file, cert).expect("kubelet certificate");
        std::fs::write(&key_file, key).expect("kubelet key");
        let path = self.dir.path().join("kubelet.kubeconfig");
        let yaml = config::client_certificate_kubeconfig(&cluster.url, &cluster.pki.ca_cert, &cert_file, &key_file);
        std::fs::write(&path, yaml).expect("kubelet kubeconfig");
        path
    }

    async fn wait_registered(&mut self, cluster: &Cluster) {
        let nodes: Api<Node> = Api::all(cluster.admin());
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if nodes.get_opt(&self.name).await.ok().flatten().is_some() {
                return;
            }
            self.assert_running();
            assert!(Instant::now() < deadline, "the kubelet did not register node {}\n{}", self.name, self.logs());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl RealNode {
    /// Stops every process of the node: the kubelet first (it would
    /// restart what is killed), then the pods' processes, containerd and
    /// its shims, and last an own node's mount namespace.
    fn kill_all(&mut self) {
        while let Some(mut process) = self.processes.pop() {
            if process.name() == "containerd" {
                cleanup::kill_cgroup_processes(&self.cgroup_root);
            }
            process.kill();
        }
        cleanup::kill_cgroup_processes(&self.cgroup_root);
        cleanup::kill_shims(&self.containerd_socket());
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.kill_all();
        cleanup::unmount_under(self.dir.path());
        cleanup::remove_cgroups(&self.cgroup_root);
        cleanup::remove_fixed_paths(self.dir.path(), &self.made_fixed_dirs);
        if self.own.is_some() {
            release_own_mount_points();
        }
        for (path, value) in &self.sysctls {
            let _ = std::fs::write(path, value);
        }
    }
}

/// Panics unless this process is root: a real node needs it (mounts,
/// cgroups, device nodes), as a kubelet does.
pub fn require_root() {
    if !rustix::process::geteuid().is_root() {
        panic!("the real node needs root (mounts, cgroups, device nodes), as a kubelet does");
    }
}

/// The real 1.37 control plane with the chart's objects but no workloads,
/// one real node `name`, and the token its plugin (a test process) uses.
pub async fn cluster_with_node(name: &str, tmp_dir: &Path) -> (Cluster, RealNode, String) {
    require_root();
    let cluster = Cluster::start(super::V1_37).await;
    super::driver::install_without_workloads(&cluster, tmp_dir).await;
    let node = RealNode::start(&cluster, name).await;
    let token = node.plugin_token(&cluster).await;
    (cluster, node, token)
}
