//! ComputeDomains on the API-server stand-in, for the whole-system tests:
//! the real controller with `--compute-domains`, and fake GB200 nodes each
//! running the real node agent with `--compute-domains` over a fake driver
//! root with fake `nvidia-imex` / `nvidia-imex-ctl`. A test acts as the
//! resourceclaim controller (a claim per pod from the domain's template),
//! the scheduler and the kubelet (prepare, unprepare).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_dra_driver::compute_domain::api::{ComputeDomain, ComputeDomainSpec};
use gpu_dra_driver::driver_root::{fake_imex, fake_tree};
use k8s_openapi::api::core::v1::Node as NodeObject;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kubelet_proto::dra_v1::Claim;
use serde_json::json;

use crate::apiserver::ApiServer;
use crate::controller_process::ControllerProcess;
use crate::kubelet::{Kubelet, KubeletConfig, Plugin, claim};
use crate::plugin_process::{PluginDirs, PluginOptions, PluginProcess, wait_for_path};

pub const CD_DRIVER: &str = "compute-domain.nvidia.com";
pub const WAIT: Duration = Duration::from_secs(60);

/// The example GB200 tray of clique 1 or 2 (`examples/inventories/`).
pub fn gb200(clique: u32) -> String {
    let file = if clique == 1 { "gb200-clique.yaml" } else { "gb200-clique-2.yaml" };
    std::fs::read_to_string(crate::workspace_root().join("examples/inventories").join(file)).unwrap()
}

/// The documents of `examples/compute-domain/four-node-job.yaml`.
pub fn example_documents() -> Vec<serde_json::Value> {
    let path = crate::workspace_root().join("examples/compute-domain/four-node-job.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect()
}

/// The example's ComputeDomain, as NVIDIA's users write it.
pub fn example_domain() -> ComputeDomain {
    let mut domain: ComputeDomain = serde_json::from_value(example_documents()[0].clone()).unwrap();
    domain.metadata.namespace = Some("default".into());
    domain
}

pub struct Node {
    pub name: String,
    pub address: String,
    pub dirs: PluginDirs,
    pub options: PluginOptions,
    pub process: PluginProcess,
    pub kubelet: Kubelet,
    pub plugin: Plugin,
    pub driver_root: PathBuf,
    pub host: PathBuf,
}

impl Node {
    pub fn start(
        server: &ApiServer,
        rt: &tokio::runtime::Runtime,
        index: usize,
        clique: u32,
        ready_timeout_ms: u32,
    ) -> Self {
        Self::start_with(server, rt, index, clique, ready_timeout_ms, &[])
    }

    /// [`Node::start`] with more flags for the node agent.
    pub fn start_with(
        server: &ApiServer,
        rt: &tokio::runtime::Runtime,
        index: usize,
        clique: u32,
        ready_timeout_ms: u32,
        flags: &[&str],
    ) -> Self {
        let name = format!("gb200-{index}");
        let address = format!("10.0.0.{}", index + 1);
        let dirs = PluginDirs::new(&gb200(clique)).unwrap();
        server.write_kubeconfig(&dirs.kubeconfig).unwrap();
        let driver_root = dirs.root.path().join("driver-root");
        fake_tree::build(
            &driver_root,
            "580.82.07",
            &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")],
        )
        .unwrap();
        fake_imex::install(&driver_root).unwrap();
        let host = dirs.root.path().join("host");
        std::fs::create_dir_all(host.join("dev")).unwrap();
        std::fs::create_dir_all(host.join("proc/sys/kernel/random")).unwrap();
        std::fs::write(host.join("proc/sys/kernel/random/boot_id"), "6f1c1c1e-0d2f-4e5b-8a6c-7d9e0f1a2b3c\n").unwrap();
        std::fs::write(host.join("proc/devices"), "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n")
            .unwrap();
        let mut node_object: NodeObject = serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": address}]}
        }))
        .unwrap();
        node_object.metadata.name = Some(name.clone());
        server.create_with_status(&node_object).unwrap();
        let options = PluginOptions {
            node: name.clone(),
            extra_args: [
                "--compute-domains",
                "--driver-root",
                driver_root.to_str().unwrap(),
                "--dev-root",
                host.to_str().unwrap(),
                "--proc-root",
                host.join("proc").to_str().unwrap(),
                "--imex-ready-timeout-ms",
                &ready_timeout_ms.to_string(),
                "--imex-health-interval-ms",
                "200",
            ]
            .into_iter()
            .chain(flags.iter().copied())
            .map(String::from)
            .collect(),
            ..PluginOptions::default()
        };
        let process = PluginProcess::spawn(&dirs, &options).unwrap();
        let kubelet = Kubelet::new(KubeletConfig::new(dirs.registry.clone(), CD_DRIVER));
        let plugin = register(rt, &kubelet, &dirs, &process);
        Self { name, address, dirs, options, process, kubelet, plugin, driver_root, host }
    }

    pub fn prepare(&self, rt: &tokio::runtime::Runtime, claims: &[Claim]) -> Vec<Result<Vec<String>, String>> {
        let answers = rt.block_on(self.kubelet.prepare_raw(&self.plugin, claims)).expect("prepare call");
        claims
            .iter()
            .map(|c| {
                let a = &answers[&c.uid];
                if a.error.is_empty() {
                    Ok(a.devices.iter().flat_map(|d| d.cdi_device_ids.clone()).collect())
                } else {
                    Err(a.error.clone())
                }
            })
            .collect()
    }

    /// SIGKILL, then a new process on the same files, registered again.
    pub fn kill_and_restart(&mut self, rt: &tokio::runtime::Runtime) {
        self.process.kill().unwrap();
        self.process = PluginProcess::spawn(&self.dirs, &self.options).unwrap();
        self.plugin = register(rt, &self.kubelet, &self.dirs, &self.process);
    }

    /// A new process on the same files with `options` (the previous one
    /// must be gone), registered again.
    pub fn restart_with(&mut self, rt: &tokio::runtime::Runtime, options: &PluginOptions) {
        self.process = PluginProcess::spawn(&self.dirs, options).unwrap();
        self.plugin = register(rt, &self.kubelet, &self.dirs, &self.process);
    }

    /// The node's checkpoint records (file names).
    pub fn records(&self) -> Vec<String> {
        self.files(&self.state().join("checkpoint"))
    }

    /// Live `nvidia-imex` processes of this node's state directory.
    pub fn daemons(&self) -> usize {
        self.daemon_pids().len()
    }

    /// The pids of those processes (a fork of one, between its fork and
    /// exec, is not another).
    pub fn daemon_pids(&self) -> Vec<u32> {
        let state = self.state();
        let needle = state.to_str().unwrap().as_bytes();
        let matching: Vec<(u32, u32)> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
                let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
                let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
                let (state, ppid) = (fields.next()?, fields.next()?.parse::<u32>().ok()?);
                // The daemon (under the fake's shell), not nvidia-imex-ctl.
                let daemon = cmdline.split(|b| *b == 0).take(2).any(|a| a.ends_with(b"/nvidia-imex"));
                let ours = cmdline.windows(needle.len()).any(|w| w == needle);
                (daemon && ours && !matches!(state, "Z" | "X")).then_some((pid, ppid))
            })
            .collect();
        let mut pids: Vec<u32> = matching
            .iter()
            .filter(|(_, ppid)| !matching.iter().any(|(pid, _)| pid == ppid))
            .map(|(pid, _)| *pid)
            .collect();
        pids.sort_unstable();
        pids
    }

    pub fn imex_log(&self) -> Vec<String> {
        fake_imex::daemon_log(&self.driver_root)
    }

    pub fn channel_node(&self) -> PathBuf {
        self.host.join("dev/nvidia-caps-imex-channels/channel0")
    }

    pub fn state(&self) -> PathBuf {
        self.dirs.plugin_dir("gpu.nvidia.com").join("compute-domains")
    }

    pub fn files(&self, dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|e| e.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default()
    }
}

pub fn register(rt: &tokio::runtime::Runtime, kubelet: &Kubelet, dirs: &PluginDirs, process: &PluginProcess) -> Plugin {
    // A killed predecessor's socket file may still be there: retry until
    // the new process answers on it.
    let socket = dirs.registration_socket(CD_DRIVER);
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(wait_for_path(&socket, true, WAIT), "no {CD_DRIVER} registration socket\n{}", process.log());
        match rt.block_on(kubelet.register(&socket)) {
            Ok(plugin) => return plugin,
            Err(e) if Instant::now() >= deadline => panic!("{e}\n{}", process.log()),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// [`crate::wait::wait_until`] within [`WAIT`].
pub fn wait_until(what: &str, done: impl FnMut() -> bool, logs: impl Fn() -> String) {
    crate::wait::wait_until(what, WAIT, done, logs);
}

pub struct Cluster {
    pub domain_name: String,
    pub template_name: String,
    pub server: ApiServer,
    pub dir: tempfile::TempDir,
    pub controller: ControllerProcess,
    pub rt: tokio::runtime::Runtime,
}

impl Cluster {
    pub fn start() -> Self {
        Self::start_over(&[])
    }

    /// Starts with `stored` (untyped objects of kinds the stand-in serves,
    /// written as given: no schema) in the API before the controller
    /// lists them.
    pub fn start_over(stored: &[serde_json::Value]) -> Self {
        let server = ApiServer::start_in_thread().unwrap();
        for object in stored {
            let kind = object["kind"].as_str().and_then(crate::apiserver::kinds::by_kind).expect("a served kind");
            let namespace = object["metadata"]["namespace"].as_str();
            server.store().create(kind, namespace, object.clone(), "kubectl").unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let controller =
            ControllerProcess::spawn(&kubeconfig, "ctl-0", &["--compute-domains", "--leader-elect=false"]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Self { domain_name: "job".into(), template_name: "job-channel".into(), server, dir, controller, rt }
    }

    pub fn domain(&self) -> Option<ComputeDomain> {
        self.server.get::<ComputeDomain>(Some("default"), &self.domain_name).ok()
    }

    /// NVIDIA's example shape: `numNodes` and a template name.
    pub fn apply_domain(&self, num_nodes: u32) -> ComputeDomain {
        let domain = ComputeDomain::new("default", "job", ComputeDomainSpec::with_template(num_nodes, "job-channel"));
        self.server.create(&domain).unwrap()
    }

    /// Applies `domain` as `kubectl apply` would.
    pub fn apply(&mut self, domain: &ComputeDomain) {
        self.domain_name = domain.metadata.name.clone().unwrap();
        self.template_name = domain.spec.channel.as_ref().unwrap().resource_claim_template.name.clone();
        self.server.create(domain).unwrap();
    }

    pub fn template(&self) -> Option<ResourceClaimTemplate> {
        self.server.get::<ResourceClaimTemplate>(Some("default"), &self.template_name).ok()
    }

    /// Pod `worker-<i>`'s claim from the template, allocated on `node` as
    /// the scheduler leaves it (the template's labels and config copied).
    pub fn allocated_channel(&self, pod: &str, node: &str) -> Claim {
        let template = self.template().expect("the domain's template");
        let spec = template.spec.unwrap();
        let config = spec.spec.as_ref().unwrap().devices.as_ref().unwrap().config.clone().unwrap();
        let allocated_config: Vec<serde_json::Value> =
            config.iter().map(|c| json!({"source": "FromClaim", "requests": c.requests, "opaque": c.opaque})).collect();
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": format!("{pod}-channel"), "labels": spec.metadata.unwrap().labels},
            "spec": spec.spec,
            "status": {
                "allocation": {"devices": {
                    "results": [{"request": "channel", "driver": CD_DRIVER, "pool": node, "device": "channel-0"}],
                    "config": allocated_config}},
                "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("{pod}-uid")}]
            }
        }))
        .unwrap();
        let stored = self.server.create_with_status(&claim).unwrap();
        claim_ref(&stored)
    }

    /// Pod `pod`'s daemon claim of the domain, allocated on `node` (the
    /// claim NVIDIA's per-domain daemon pods hold).
    pub fn allocated_daemon(&self, pod: &str, node: &str) -> Claim {
        let domain_uid = self.domain().and_then(|d| d.metadata.uid).expect("the domain's UID");
        let opaque = json!({"driver": CD_DRIVER, "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainDaemonConfig", "domainID": domain_uid}});
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": format!("{pod}-daemon")},
            "spec": {"devices": {
                "requests": [{"name": "daemon", "exactly": {"deviceClassName": "compute-domain-daemon.nvidia.com"}}],
                "config": [{"requests": ["daemon"], "opaque": opaque}]}},
            "status": {
                "allocation": {"devices": {
                    "results": [{"request": "daemon", "driver": CD_DRIVER, "pool": node, "device": "daemon-0"}],
                    "config": [{"source": "FromClaim", "requests": ["daemon"], "opaque": opaque}]}},
                "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("{pod}-uid")}]
            }
        }))
        .unwrap();
        let stored = self.server.create_with_status(&claim).unwrap();
        claim_ref(&stored)
    }

    pub fn warnings(&self) -> Vec<(String, String)> {
        self.server
            .list::<Event>(Some("default"), "")
            .unwrap()
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ComputeDomain"))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }
}

pub fn claim_ref(stored: &ResourceClaim) -> Claim {
    claim("default", stored.metadata.name.as_deref().unwrap(), stored.metadata.uid.as_deref().unwrap())
}

/// One node in a one-node domain, with pod `worker-0`'s channel claim
/// allocated there (which lists the node in the domain's status).
pub fn one_node_domain() -> (Cluster, Node, Claim) {
    let cluster = Cluster::start();
    let node = Node::start(&cluster.server, &cluster.rt, 0, 1, 20_000);
    cluster.apply_domain(1);
    let logs = || cluster.controller.log();
    wait_until("the workload template", || cluster.template().is_some(), logs);
    let channel = cluster.allocated_channel("worker-0", "gb200-0");
    wait_until(
        "the node in the domain",
        || cluster.domain().and_then(|d| d.status).is_some_and(|s| s.nodes.len() == 1),
        logs,
    );
    (cluster, node, channel)
}
