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

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use super::process::ControlPlaneProcess;
use super::{Cluster, free_ports, unique};
use crate::workspace_root;

/// The sandbox ("pause") image: a shell that sleeps until SIGTERM.
pub const PAUSE_IMAGE: &str = "localhost/gpu-dra-driver/pause:busybox";
/// The test containers' image: Debian's busybox-static, entrypoint `sh`.
pub const TEST_IMAGE: &str = "localhost/gpu-dra-driver/busybox:test";

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
    let script = workspace_root().join("tests/kube-bins/build.sh");
    eprintln!(
        "real node: {} {minor} node (builds the kubelet and containerd when the cache lacks them)",
        script.display()
    );
    let output = Command::new("bash")
        .arg(&script)
        .args([minor, "node"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{} {minor} node failed ({}): the real-node test needs Go, the Go module proxy and Debian's runc; see the README\n{stdout}",
        script.display(),
        output.status
    );
    let value = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key).map(PathBuf::from))
            .unwrap_or_else(|| panic!("{} printed no {key}: {stdout}", script.display()))
    };
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
    /// Of [`FIXED_DIRS`], those that did not exist before the node.
    made_fixed_dirs: Vec<&'static Path>,
    dir: tempfile::TempDir,
}

/// Where the kubelet links container logs (a path it does not let us
/// change).
const LOG_LINKS_DIR: &str = "/var/log/containers";
/// Where the kubelet's device manager always makes its socket.
const DEVICE_PLUGINS_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The directories outside the node's own that the kubelet writes to
/// whatever its flags, children before parents: on drop, our entries in
/// them are removed, and the directories themselves if the node made them.
const FIXED_DIRS: [&str; 3] = [LOG_LINKS_DIR, DEVICE_PLUGINS_DIR, "/var/lib/kubelet"];
/// containerd's limit on its shims' socket directory (`socket_dir`).
const MAX_SOCKET_DIR_LEN: usize = 42;

impl RealNode {
    /// Starts containerd, imports the images, and starts the kubelet as
    /// node `name` of `cluster`, authenticating as the node
    /// (`system:node:<name>` in `system:nodes`, a client certificate from
    /// the cluster's CA): the real Node authorizer decides what it may
    /// read (its pods' claims). Returns once the Node object exists. Panics with the
    /// logs when something does not come up.
    pub async fn start(cluster: &Cluster, name: &str) -> Self {
        let bins = node_binaries(cluster.release().minor);
        let dir = tempfile::Builder::new().prefix("real-node-").tempdir().expect("temporary directory");
        // The kubelet and runc traverse these as other users too (the
        // container's root is owned by root, but the kubelet checks modes).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut node = Self {
            name: name.to_string(),
            bins,
            cgroup_root: format!("/gpu-dra-realnode-{}", unique()),
            processes: Vec::new(),
            sysctls: Vec::new(),
            made_fixed_dirs: FIXED_DIRS.iter().map(Path::new).filter(|d| !d.exists()).collect(),
            dir,
        };
        for sub in
            ["cdi", "cni", "kubelet", "kubelet-pki", "pod-logs", "containerd-root", "containerd-state", "opt", "s"]
        {
            std::fs::create_dir_all(node.dir.path().join(sub)).expect("node directory");
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
        let file =
            self.dir.path().join("pod-logs").join(format!("{namespace}_{name}_{uid}")).join(container).join("0.log");
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

    fn spawn(&mut self, name: &'static str, program: &Path, args: Vec<String>) {
        let log = self.dir.path().join(format!("{name}.log"));
        let process = ControlPlaneProcess::spawn(name, program, &args, log).unwrap_or_else(|e| panic!("{e}"));
        self.processes.push(process);
    }

    fn start_containerd(&mut self) {
        let config = self.dir.path().join("containerd.toml");
        std::fs::write(&config, self.containerd_config()).expect("containerd config");
        let containerd = self.bins.containerd.clone();
        self.spawn("containerd", &containerd, vec!["--config".into(), config.display().to_string()]);
        let deadline = Instant::now() + START_TIMEOUT;
        while !self.ctr(&["version"]).status.success() {
            self.assert_running();
            assert!(Instant::now() < deadline, "containerd did not answer\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// containerd's configuration: every path under the node's directory;
    /// CDI (on by default in 2.x) reading only the node's CDI directory;
    /// the pause image pinned; the runc shim and runc by absolute path; no
    /// CNI configuration (host-network pods only), NRI and the snapshotters
    /// the tests do not use off.
    fn containerd_config(&self) -> String {
        let d = |sub: &str| self.dir.path().join(sub).display().to_string();
        let socket = self.containerd_socket().display().to_string();
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
{shim_sockets}
[plugins."io.containerd.cri.v1.images"]
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
            // The shims' sockets (else under /run/containerd/s, left
            // behind by killed shims), if the path is short enough.
            shim_sockets = if d("s").len() <= MAX_SOCKET_DIR_LEN {
                format!("[plugins.\"io.containerd.shim.v1.manager\"]\n  socket_dir = \"{}\"", d("s"))
            } else {
                String::new()
            },
            root = d("containerd-root"),
            state = d("containerd-state"),
            opt = d("opt"),
            pause = PAUSE_IMAGE,
            cdi = d("cdi"),
            shim = self.bins.containerd_shim.display(),
            runc = self.bins.runc.display(),
            runc_root = d("runc"),
            cni = d("cni"),
        )
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
        let archive = self.bins.images.display().to_string();
        let out = self.ctr(&["-n", "k8s.io", "images", "import", "--local", &archive]);
        assert!(
            out.status.success(),
            "ctr images import {archive}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        let listed = self.ctr(&["-n", "k8s.io", "images", "list", "-q"]);
        let listed = String::from_utf8_lossy(&listed.stdout);
        for image in [PAUSE_IMAGE, TEST_IMAGE] {
            assert!(listed.lines().any(|l| l == image), "{image} not imported: {listed}");
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
        let [port, healthz] = free_ports();
        let config = self.dir.path().join("kubelet.yaml");
        let socket = self.containerd_socket().display().to_string();
        let yaml = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 hierarchies on these machines: 1.35+ refuse them unless told.
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
containerRuntimeEndpoint: unix://{socket}
imageServiceEndpoint: unix://{socket}
address: 127.0.0.1
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
            cgroup_root = self.cgroup_root,
            pod_logs = self.dir.path().join("pod-logs").display(),
        );
        std::fs::write(&config, yaml).expect("kubelet config");
        // The kubelet requires its cgroupRoot to exist in every hierarchy.
        let relative = self.cgroup_root.trim_start_matches('/');
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            if hierarchy.path().join("cgroup.procs").is_file() {
                let dir = hierarchy.path().join(relative);
                std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("making cgroup {}: {e}", dir.display()));
            }
        }
        let kubeconfig = self.write_node_kubeconfig(cluster);
        let kubelet = self.bins.kubelet.clone();
        let args = vec![
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", self.kubelet_root().display()),
            format!("--cert-dir={}", self.dir.path().join("kubelet-pki").display()),
            format!("--hostname-override={}", self.name),
            "--v=2".into(),
        ];
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
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\nusers:\n- name: node\n  user:\n    client-certificate: {}\n    \
             client-key: {}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: node\n\
             current-context: real\n",
            cluster.url,
            cluster.pki.ca_cert.display(),
            cert_file.display(),
            key_file.display()
        );
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

    /// The cgroup directories of the node's root, one per hierarchy
    /// (`/sys/fs/cgroup/<controller>/<root>`, the unified one too).
    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let relative = self.cgroup_root.trim_start_matches('/');
        let mut dirs = vec![Path::new("/sys/fs/cgroup").join(relative)];
        if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
            dirs.extend(entries.flatten().map(|e| e.path().join(relative)));
        }
        dirs.retain(|d| d.is_dir());
        dirs
    }

    /// SIGKILL to every process in the node's cgroups (the pods'
    /// containers and sandboxes), until none is left.
    fn kill_pod_processes(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut pids = Vec::new();
            for dir in self.cgroup_dirs() {
                for entry in walkdir(&dir) {
                    if let Ok(text) = std::fs::read_to_string(entry.join("cgroup.procs")) {
                        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
                    }
                }
            }
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids.into_iter().filter_map(rustix::process::Pid::from_raw) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL to containerd's shims for this node: the processes whose
    /// command line names this node's containerd socket (the shims detach
    /// from containerd's process group).
    fn kill_shims(&self) {
        let socket = self.containerd_socket().display().to_string();
        let Ok(entries) = std::fs::read_dir("/proc") else { return };
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let ours = args.first().is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                && args.iter().any(|a| *a == socket.as_bytes());
            if ours && let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }

    /// Detaches every mount under the node's directory, deepest first
    /// (container root filesystems, sandbox /dev/shm, the kubelet's
    /// shared bind mount of its root).
    fn unmount_all(&self) {
        let root = self.dir.path().display().to_string();
        for _ in 0..5 {
            let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split(' ').nth(4).map(unescape_mount_path))
                .filter(|m| m == &root || m.starts_with(&format!("{root}/")))
                .collect();
            if mounts.is_empty() {
                return;
            }
            mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for mount in mounts {
                let _ = rustix::mount::unmount(mount.as_str(), rustix::mount::UnmountFlags::DETACH);
            }
        }
    }

    /// Removes the node's cgroups, children first.
    fn remove_cgroups(&self) {
        for dir in self.cgroup_dirs() {
            let mut all = walkdir(&dir);
            all.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for cgroup in all {
                let _ = std::fs::remove_dir(&cgroup);
            }
        }
    }

    /// Removes what the kubelet wrote outside the node's directory: its
    /// links to this node's container logs, its device manager's socket
    /// (when the node made that directory), and the directories the node
    /// made, if empty.
    fn remove_fixed_paths(&self) {
        for entry in std::fs::read_dir(LOG_LINKS_DIR).into_iter().flatten().flatten() {
            if std::fs::read_link(entry.path()).is_ok_and(|target| target.starts_with(self.dir.path())) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        if self.made_fixed_dirs.contains(&Path::new(DEVICE_PLUGINS_DIR)) {
            let _ = std::fs::remove_file(Path::new(DEVICE_PLUGINS_DIR).join("kubelet.sock"));
        }
        for dir in &self.made_fixed_dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        // The kubelet first (it would restart what is killed), then the
        // pods' processes, containerd and its shims.
        while let Some(mut process) = self.processes.pop() {
            if process.name() == "containerd" {
                self.kill_pod_processes();
            }
            process.kill();
        }
        self.kill_pod_processes();
        self.kill_shims();
        self.unmount_all();
        self.remove_cgroups();
        self.remove_fixed_paths();
        for (path, value) in &self.sysctls {
            let _ = std::fs::write(path, value);
        }
    }
}

/// `dir` and every directory below it (cgroup trees are shallow).
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut found = vec![dir.to_path_buf()];
    let mut next = 0;
    while next < found.len() {
        if let Ok(entries) = std::fs::read_dir(&found[next]) {
            found.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
        }
        next += 1;
    }
    found
}

/// A mount point as `/proc/self/mountinfo` writes it: space, tab, newline
/// and backslash as octal escapes.
fn unescape_mount_path(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4).and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}
