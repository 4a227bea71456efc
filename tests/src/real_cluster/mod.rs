//! The real Kubernetes control plane for the tests: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler of one release, built from
//! their Go modules (`tests/kube-bins/`), started on loopback in a
//! temporary directory and torn down with every process and file on drop.
//!
//! - The API server serves `resource.k8s.io/v1` with the release's
//!   default gates, as users run it, or with the optional DRA gates our
//!   features use turned on ([`Release::with_optional_gates`]) for the
//!   tests that need them; it signs service-account
//!   tokens with a key made by the test, and authorizes with `Node,RBAC`:
//!   the plugin and controller run on their own ServiceAccount tokens
//!   ([`Cluster::pod_bound_token`]) and the real authorizer and admission
//!   judge them. The test's own set-up calls use an admin token
//!   (`system:masters`) from a static token file.
//! - There is no kubelet: Node objects are made by the test
//!   ([`Cluster::create_node`]); the node-lifecycle controller is off and the
//!   `TaintNodesByCondition` admission plugin is disabled, so such nodes are
//!   schedulable (no `not-ready` taint) and pods are bound but never run.

mod binaries;
pub mod driver;
pub mod host_address;
pub mod intercept;
pub mod mig_fleet;
pub mod node;
pub mod objects;
mod pki;
mod process;
pub mod tray;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

pub use binaries::{Binaries, Printed, binaries, cached_binaries, run_script};
use pki::Pki;
use process::ControlPlaneProcess;

/// A Kubernetes release the tests run against, with the feature gates its
/// users have: the release's defaults, or with the optional DRA gates our
/// features use turned on ([`Release::with_optional_gates`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// "1.37": the directory `tests/kube-bins/k8s-<minor>` pins its patch.
    pub minor: &'static str,
    /// The DRA gates our features use that the release has, off by
    /// default, and does not lock, read from its
    /// `pkg/features/kube_features.go` (a gate locked to its default --
    /// GA and `LockToDefault` -- is on and is left out).
    optional_gates: &'static [&'static str],
    /// The API server's `--runtime-config` those gates need.
    optional_runtime_config: &'static [&'static str],
    /// Whether the optional gates are on (else the release's defaults).
    gates_on: bool,
}

impl Release {
    /// The same release with the optional DRA gates on: for the features
    /// that need them there (consumable capacity, partitionable devices
    /// and device taints are alpha in 1.34).
    pub const fn with_optional_gates(self) -> Self {
        Self { gates_on: true, ..self }
    }

    /// `--feature-gates` for all three components (empty: the defaults).
    pub fn feature_gates(&self) -> &'static [&'static str] {
        if self.gates_on { self.optional_gates } else { &[] }
    }

    /// The API server's `--runtime-config` (empty: the defaults).
    pub fn runtime_config(&self) -> &'static [&'static str] {
        if self.gates_on { self.optional_runtime_config } else { &[] }
    }

    /// "1.34 (default gates)" or "1.34 (optional DRA gates on)", for messages.
    pub fn describe(&self) -> String {
        let gates = if self.gates_on { "optional DRA gates on" } else { "default gates" };
        format!("{} ({gates})", self.minor)
    }
}

/// 1.34: DRA is GA; partitionable devices, consumable capacity, device
/// taints and extended resources are alpha (off unless set); prioritized
/// lists and admin access are beta (on). ServiceAccountTokenPodNodeInfo is
/// GA and locked since 1.32 in every release here.
pub const V1_34: Release = Release {
    minor: "1.34",
    optional_gates: &["DRAConsumableCapacity", "DRADeviceTaints", "DRAExtendedResource", "DRAPartitionableDevices"],
    // DRADeviceTaints makes the kube-scheduler watch DeviceTaintRules,
    // which 1.34 serves only in v1alpha3 (off by default): without it the
    // scheduler's DRA plugin never syncs and no claim is ever allocated.
    optional_runtime_config: &["resource.k8s.io/v1alpha3=true"],
    gates_on: false,
};

/// 1.35: as 1.34 (its DRA gates are still alpha), but the scheduler
/// watches DeviceTaintRules only with DRADeviceTaintRules, a gate of its
/// own, so DRADeviceTaints needs no alpha API.
pub const V1_35: Release = Release {
    minor: "1.35",
    optional_gates: &["DRAConsumableCapacity", "DRADeviceTaints", "DRAExtendedResource", "DRAPartitionableDevices"],
    optional_runtime_config: &[],
    gates_on: false,
};

/// 1.36: consumable capacity, device taints, extended resources,
/// partitionable devices and binding conditions are beta and on: its
/// defaults are what our features use (as 1.37's).
pub const V1_36: Release =
    Release { minor: "1.36", optional_gates: &[], optional_runtime_config: &[], gates_on: false };

/// 1.37: admin access, prioritized lists, device taints and extended
/// resources are GA; partitionable devices and consumable capacity are
/// beta and on. List-typed attributes (`DRAListTypeAttributes`) are alpha:
/// the one optional gate.
pub const V1_37: Release = Release {
    minor: "1.37",
    optional_gates: &["DRAListTypeAttributes"],
    optional_runtime_config: &[],
    gates_on: false,
};

/// The oldest and the newest supported release.
pub const RELEASES: [Release; 2] = [V1_34, V1_37];

/// Start-up wait: the API server's post-start hooks take a few seconds,
/// much longer on a busy 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A running control plane. Dropping it kills every process (by process
/// group) and removes its directory.
pub struct Cluster {
    release: Release,
    /// Killed in reverse start order on drop, before `dir` goes.
    processes: Vec<ControlPlaneProcess>,
    url: String,
    pki: Pki,
    admin_kubeconfig: PathBuf,
    admin: kube::Client,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Builds the release's binaries when the cache lacks them, starts the
    /// control plane and waits until the API server is ready and the
    /// controller manager has made the `default` ServiceAccount. Panics
    /// with the components' logs when they do not come up.
    pub async fn start(release: Release) -> Self {
        let bins = binaries(release.minor);
        let dir = tempfile::Builder::new().prefix("real-cluster-").tempdir().expect("temporary directory");
        let path = dir.path().to_path_buf();
        let pki = Pki::write(&path).unwrap_or_else(|e| panic!("making the cluster's keys: {e}"));
        let admin_token = format!("admin-{}", unique());
        std::fs::write(path.join("tokens.csv"), format!("{admin_token},admin,admin-uid,\"system:masters\"\n"))
            .expect("token file");
        let gates = release.feature_gates().iter().map(|g| format!("{g}=true")).collect::<Vec<_>>().join(",");
        let [etcd_client, etcd_peer, apiserver, controller_manager, scheduler] = crate::ports::reserve();
        let url = format!("https://127.0.0.1:{apiserver}");
        let admin_kubeconfig = path.join("admin.kubeconfig");
        std::fs::write(&admin_kubeconfig, kubeconfig_yaml(&url, &pki.ca_cert, &admin_token)).expect("kubeconfig");
        let p = |file: &Path| file.display().to_string();

        let mut processes = Vec::new();
        let mut spawn = |name: &'static str, program: &Path, args: Vec<String>| {
            let log = path.join(format!("{name}.log"));
            processes.push(ControlPlaneProcess::spawn(name, program, &args, log).unwrap_or_else(|e| panic!("{e}")));
        };
        let etcd_client_url = format!("http://127.0.0.1:{etcd_client}");
        let etcd_peer_url = format!("http://127.0.0.1:{etcd_peer}");
        spawn(
            "etcd",
            &bins.etcd,
            vec![
                "--name=default".into(),
                format!("--data-dir={}", p(&path.join("etcd"))),
                format!("--listen-client-urls={etcd_client_url}"),
                format!("--advertise-client-urls={etcd_client_url}"),
                format!("--listen-peer-urls={etcd_peer_url}"),
                format!("--initial-advertise-peer-urls={etcd_peer_url}"),
                format!("--initial-cluster=default={etcd_peer_url}"),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
        );
        spawn(
            "kube-apiserver",
            &bins.kube_apiserver,
            vec![
                format!("--etcd-servers={etcd_client_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={apiserver}"),
                format!("--tls-cert-file={}", p(&pki.serving_cert)),
                format!("--tls-private-key-file={}", p(&pki.serving_key)),
                format!("--client-ca-file={}", p(&pki.ca_cert)),
                format!("--token-auth-file={}", p(&path.join("tokens.csv"))),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={}", p(&pki.service_account_public)),
                format!("--service-account-signing-key-file={}", p(&pki.service_account_private)),
                "--authorization-mode=Node,RBAC".into(),
                // The plugin's DaemonSet is privileged, as on every cluster
                // that runs device drivers (kubeadm's default too).
                "--allow-privileged=true".into(),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                "--disable-admission-plugins=TaintNodesByCondition".into(),
                // The `kubernetes` Service's endpoints would be 127.0.0.1,
                // which endpoint validation refuses.
                "--endpoint-reconciler-type=none".into(),
                // No kube-proxy routes Service IPs: the API server calls a
                // Service-based webhook at an address of its EndpointSlices
                // (buildServiceResolver: NewEndpointServiceResolver).
                "--enable-aggregator-routing=true".into(),
                // A test node's name resolves nowhere: the API server
                // reaches a kubelet (`kubectl logs`) at its InternalIP.
                "--kubelet-preferred-address-types=InternalIP".into(),
                "--enable-priority-and-fairness=false".into(),
                "--profiling=false".into(),
                format!("--feature-gates={gates}"),
                format!("--runtime-config={}", release.runtime_config().join(",")),
            ],
        );
        let common = |port: u16| {
            vec![
                format!("--kubeconfig={}", p(&admin_kubeconfig)),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--feature-gates={gates}"),
            ]
        };
        let mut args = common(controller_manager);
        args.extend([
            // No kubelet heartbeats: the lifecycle controller would taint
            // every test node unreachable.
            "--controllers=*,-node-lifecycle-controller".to_string(),
            format!("--root-ca-file={}", p(&pki.ca_cert)),
            format!("--service-account-private-key-file={}", p(&pki.service_account_private)),
        ]);
        spawn("kube-controller-manager", &bins.kube_controller_manager, args);
        let mut args = common(scheduler);
        // For a look at the scheduler's DRA plugin (`-v=5`: in-flight claims,
        // the assume cache; `-v=6`: every device it counts as allocated).
        if let Ok(level) = std::env::var(SCHEDULER_VERBOSITY) {
            args.push(format!("-v={level}"));
        }
        spawn("kube-scheduler", &bins.kube_scheduler, args);

        let admin = client(&admin_kubeconfig).await;
        let mut cluster = Self { release, processes, url, pki, admin_kubeconfig, admin, dir };
        let started = Instant::now();
        cluster.wait("the API server's /readyz", |c| async move { ready(&c).await }).await;
        cluster
            .wait("the default ServiceAccount (kube-controller-manager)", |c| async move {
                Api::<ServiceAccount>::namespaced(c, "default").get_opt("default").await.ok().flatten().is_some()
            })
            .await;
        eprintln!("real cluster {}: ready in {:.1} s", release.describe(), started.elapsed().as_secs_f64());
        cluster
    }

    /// Polls `check` with the admin client until it holds; panics with the
    /// logs on timeout or when a component exits.
    async fn wait<F, Fut>(&mut self, what: &str, check: F)
    where
        F: Fn(kube::Client) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if check(self.admin.clone()).await {
                return;
            }
            if let Some(exit) = self.processes.iter_mut().find_map(ControlPlaneProcess::exited) {
                panic!("{exit} while waiting for {what}\n{}", self.logs());
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn release(&self) -> Release {
        self.release
    }

    /// The admin client (`system:masters`), for the test's own set-up calls.
    pub fn admin(&self) -> kube::Client {
        self.admin.clone()
    }

    /// The API server's address, `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A directory inside the cluster's, removed with it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a kubeconfig for this API server that authenticates with `token`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) {
        std::fs::write(path, kubeconfig_yaml(&self.url, &self.pki.ca_cert, token))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// A client that authenticates with `token`.
    pub async fn client_with_token(&self, token: &str) -> kube::Client {
        let path = self.dir.path().join(format!("client-{}.kubeconfig", unique()));
        self.write_kubeconfig(&path, token);
        client(&path).await
    }

    /// The last lines of every component's log.
    pub fn logs(&self) -> String {
        self.processes
            .iter()
            .map(|p| format!("---- {} ({})\n{}", p.name(), p.log_path().display(), p.log_tail(40)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// CPU time a component (`"kube-scheduler"`, `"kube-apiserver"`, ...)
    /// has used so far; `None` for an unknown or exited one.
    pub fn cpu_time(&self, component: &str) -> Option<Duration> {
        self.processes.iter().find(|p| p.name() == component)?.cpu_time()
    }

    /// Panics (with the logs) if a component has exited.
    pub fn assert_running(&mut self) {
        if let Some(exit) = self.processes.iter_mut().find_map(ControlPlaneProcess::exited) {
            panic!("{exit}\n{}", self.logs());
        }
    }

    /// A Node object as a kubelet would register it (no kubelet runs):
    /// allocatable CPU, memory and pods, so the scheduler's fit checks pass.
    pub async fn create_node(&self, name: &str) -> Node {
        let nodes: Api<Node> = Api::all(self.admin());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        }))
        .expect("Node");
        nodes.create(&PostParams::default(), &node).await.unwrap_or_else(|e| panic!("creating node {name}: {e}"));
        let resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
        let status = json!({"status": {"capacity": resources, "allocatable": resources}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("node {name} status: {e}"))
    }

    /// A token for `namespace/service_account` bound to a pod on `node`,
    /// as the kubelet projects it into a pod's volume: the pod (made here,
    /// bound to the node, never run) carries the node's name into the token
    /// (ServiceAccountTokenPodNodeInfo), which admission policies read from
    /// `request.userInfo.extra`.
    pub async fn pod_bound_token(&self, namespace: &str, service_account: &str, node: &str) -> String {
        let pods: Api<Pod> = Api::namespaced(self.admin(), namespace);
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(format!("{service_account}-{node}-")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.to_string()),
                service_account_name: Some(service_account.to_string()),
                containers: vec![Container {
                    name: "main".into(),
                    image: Some("registry.invalid/not-run".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("pod for token: {e}"));
        let request: TokenRequest = serde_json::from_value(json!({
            "spec": {
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid},
                "expirationSeconds": 3600,
            },
        }))
        .expect("TokenRequest");
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin(), namespace);
        let answer = accounts
            .create_token_request(service_account, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{service_account}: {e}"));
        answer.status.and_then(|s| s.token).expect("TokenRequest answered without a token")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        while let Some(mut process) = self.processes.pop() {
            process.kill();
        }
        if let Some(keep) = std::env::var_os(KEEP_LOGS) {
            let into = Path::new(&keep).join(self.dir.path().file_name().unwrap_or_default());
            let _ = std::fs::create_dir_all(&into);
            for entry in std::fs::read_dir(self.dir.path()).into_iter().flatten().flatten() {
                if entry.path().extension().is_some_and(|e| e == "log") {
                    let _ = std::fs::copy(entry.path(), into.join(entry.file_name()));
                }
            }
            eprintln!("real cluster {}: logs kept in {}", self.release.describe(), into.display());
        }
    }
}

/// Environment: the kube-scheduler's `-v` level (default: its own, 0).
pub const SCHEDULER_VERBOSITY: &str = "GPU_DRA_TEST_SCHEDULER_V";
/// Environment: a directory where each cluster's component logs are copied
/// when it stops (default: they go with its temporary directory).
pub const KEEP_LOGS: &str = "GPU_DRA_TEST_KEEP_LOGS";

async fn ready(client: &kube::Client) -> bool {
    let request = http::Request::get("/readyz").body(Vec::new()).expect("request");
    client.request_text(request).await.is_ok_and(|body| body.trim() == "ok")
}

async fn client(kubeconfig: &Path) -> kube::Client {
    gpu_dra_driver::service::kube_client::install_crypto_provider();
    let config = Kubeconfig::read_from(kubeconfig).unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("client: {e}"))
}

fn kubeconfig_yaml(url: &str, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {url}\n    \
         certificate-authority: {}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: real\n  \
         context:\n    cluster: real\n    user: user\ncurrent-context: real\n",
        ca.display()
    )
}

fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{nanos}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}
