//! ComputeDomains through the whole system: the API-server stand-in
//! (serving the CRD's resource as the apiextensions-apiserver does), the
//! real controller with `--compute-domains`, and fake GB200 nodes each
//! running the real node agent with `--compute-domains` over a fake driver
//! root with fake `nvidia-imex` / `nvidia-imex-ctl`. The test acts as the
//! resourceclaim controller (a claim per pod from the domain's template),
//! the scheduler (one pod per node) and the kubelet (prepare, unprepare).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_dra_driver::compute_domain::api::{ChannelSpec, ComputeDomain, ComputeDomainSpec, Readiness, TemplateName};
use gpu_dra_driver::driver_root::{fake_imex, fake_tree};
use integration_tests::apiserver::ApiServer;
use integration_tests::controller_process::ControllerProcess;
use integration_tests::kubelet::{Kubelet, KubeletConfig, Plugin, claim};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess, wait_for_path};
use k8s_openapi::api::core::v1::Node as NodeObject;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kubelet_proto::dra_v1::Claim;
use serde_json::json;

const CD_DRIVER: &str = "compute-domain.nvidia.com";
const WAIT: Duration = Duration::from_secs(60);

/// The example GB200 tray of clique 1 or 2 (`examples/inventories/`).
fn gb200(clique: u32) -> String {
    let file = if clique == 1 { "gb200-clique.yaml" } else { "gb200-clique-2.yaml" };
    std::fs::read_to_string(integration_tests::workspace_root().join("examples/inventories").join(file)).unwrap()
}

/// The documents of `examples/compute-domain/four-node-job.yaml`.
fn example_documents() -> Vec<serde_json::Value> {
    let path = integration_tests::workspace_root().join("examples/compute-domain/four-node-job.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect()
}

/// The example's ComputeDomain, as NVIDIA's users write it.
fn example_domain() -> ComputeDomain {
    let mut domain: ComputeDomain = serde_json::from_value(example_documents()[0].clone()).unwrap();
    domain.metadata.namespace = Some("default".into());
    domain
}

struct Node {
    name: String,
    address: String,
    dirs: PluginDirs,
    options: PluginOptions,
    process: PluginProcess,
    kubelet: Kubelet,
    plugin: Plugin,
    driver_root: PathBuf,
    host: PathBuf,
}

impl Node {
    fn start(
        server: &ApiServer,
        rt: &tokio::runtime::Runtime,
        index: usize,
        clique: u32,
        ready_timeout_ms: u32,
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
            .map(String::from)
            .to_vec(),
            ..PluginOptions::default()
        };
        let process = PluginProcess::spawn(&dirs, &options).unwrap();
        let kubelet = Kubelet::new(KubeletConfig::new(dirs.registry.clone(), CD_DRIVER));
        let plugin = register(rt, &kubelet, &dirs, &process);
        Self { name, address, dirs, options, process, kubelet, plugin, driver_root, host }
    }

    fn prepare(&self, rt: &tokio::runtime::Runtime, claims: &[Claim]) -> Vec<Result<Vec<String>, String>> {
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
    fn kill_and_restart(&mut self, rt: &tokio::runtime::Runtime) {
        self.process.kill().unwrap();
        self.process = PluginProcess::spawn(&self.dirs, &self.options).unwrap();
        self.plugin = register(rt, &self.kubelet, &self.dirs, &self.process);
    }

    /// Live `nvidia-imex` processes of this node's state directory.
    fn daemons(&self) -> usize {
        let state = self.state();
        let needle = state.to_str().unwrap().as_bytes();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.parse::<u32>().is_ok()))
            .filter(|e| {
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                let alive = stat.rsplit_once(')').is_some_and(|(_, r)| !r.trim_start().starts_with('Z'));
                alive
                    && cmdline.windows(11).any(|w| w == b"nvidia-imex")
                    && cmdline.windows(needle.len()).any(|w| w == needle)
            })
            .count()
    }

    fn imex_log(&self) -> Vec<String> {
        fake_imex::daemon_log(&self.driver_root)
    }

    fn channel_node(&self) -> PathBuf {
        self.host.join("dev/nvidia-caps-imex-channels/channel0")
    }

    fn state(&self) -> PathBuf {
        self.dirs.plugin_dir("gpu.nvidia.com").join("compute-domains")
    }

    fn files(&self, dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|e| e.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default()
    }
}

fn register(rt: &tokio::runtime::Runtime, kubelet: &Kubelet, dirs: &PluginDirs, process: &PluginProcess) -> Plugin {
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

fn wait_until(what: &str, mut done: impl FnMut() -> bool, logs: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Cluster {
    domain_name: String,
    template_name: String,
    server: ApiServer,
    _dir: tempfile::TempDir,
    controller: ControllerProcess,
    rt: tokio::runtime::Runtime,
}

impl Cluster {
    fn start() -> Self {
        let server = ApiServer::start_in_thread().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let controller =
            ControllerProcess::spawn(&kubeconfig, "ctl-0", &["--compute-domains", "--leader-elect=false"]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Self { domain_name: "job".into(), template_name: "job-channel".into(), server, _dir: dir, controller, rt }
    }

    fn domain(&self) -> Option<ComputeDomain> {
        self.server.get::<ComputeDomain>(Some("default"), &self.domain_name).ok()
    }

    /// NVIDIA's example shape: `numNodes` and a template name.
    fn apply_domain(&self, num_nodes: u32) -> ComputeDomain {
        let domain = ComputeDomain::new(
            "default",
            "job",
            ComputeDomainSpec {
                num_nodes,
                channel: Some(ChannelSpec {
                    resource_claim_template: TemplateName { name: "job-channel".into() },
                    allocation_mode: None,
                }),
            },
        );
        self.server.create(&domain).unwrap()
    }

    /// Applies `domain` as `kubectl apply` would.
    fn apply(&mut self, domain: &ComputeDomain) {
        self.domain_name = domain.metadata.name.clone().unwrap();
        self.template_name = domain.spec.channel.as_ref().unwrap().resource_claim_template.name.clone();
        self.server.create(domain).unwrap();
    }

    fn template(&self) -> Option<ResourceClaimTemplate> {
        self.server.get::<ResourceClaimTemplate>(Some("default"), &self.template_name).ok()
    }

    /// Pod `worker-<i>`'s claim from the template, allocated on `node` as
    /// the scheduler leaves it (the template's labels and config copied).
    fn allocated_channel(&self, pod: &str, node: &str) -> Claim {
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

    fn warnings(&self) -> Vec<(String, String)> {
        self.server
            .list::<Event>(Some("default"), "")
            .unwrap()
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ComputeDomain"))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }
}

fn claim_ref(stored: &ResourceClaim) -> Claim {
    claim("default", stored.metadata.name.as_deref().unwrap(), stored.metadata.uid.as_deref().unwrap())
}

#[test]
fn four_gb200_nodes_of_one_clique_form_a_ready_domain_and_leave_nothing_behind() {
    let mut cluster = Cluster::start();
    cluster.apply(&example_domain());
    let rt = &cluster.rt;
    let nodes: Vec<Node> = (0..4).map(|i| Node::start(&cluster.server, rt, i, 1, 20_000)).collect();
    let logs = || {
        format!(
            "controller:\n{}\n{}",
            cluster.controller.log(),
            nodes.iter().map(|n| format!("{}:\n{}", n.name, n.process.log())).collect::<Vec<_>>().join("\n")
        )
    };
    wait_until("the workload template", || cluster.template().is_some(), logs);
    let domain = cluster.domain().unwrap();
    assert!(domain.metadata.finalizers.iter().flatten().any(|f| f == "resource.nvidia.com/computeDomain"));

    let claims: Vec<Claim> =
        nodes.iter().enumerate().map(|(i, n)| cluster.allocated_channel(&format!("worker-{i}"), &n.name)).collect();
    for (node, claim) in nodes.iter().zip(&claims) {
        let answer =
            node.prepare(rt, std::slice::from_ref(claim)).remove(0).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
        assert_eq!(answer, [format!("k8s.{CD_DRIVER}/claim={}-channel-0", claim.uid)]);
    }
    wait_until(
        "the domain Ready",
        || cluster.domain().and_then(|d| d.status).is_some_and(|s| s.status == Readiness::Ready),
        logs,
    );
    let status = cluster.domain().unwrap().status.unwrap();
    assert_eq!(status.nodes.len(), 4);
    assert!(status.nodes.iter().all(|n| n.status == Readiness::Ready && n.clique_id.ends_with(".1")));
    let peers = "10.0.0.1 10.0.0.2 10.0.0.3 10.0.0.4";
    for node in &nodes {
        let log = node.imex_log();
        assert!(
            log.iter().any(|l| l.starts_with("start ") && l.ends_with(peers))
                || log.iter().any(|l| l.starts_with("reload ") && l.ends_with(peers)),
            "{}: {log:?}",
            node.name
        );
        assert_eq!(log.iter().filter(|l| l.starts_with("start ")).count(), 1, "{}: one daemon: {log:?}", node.name);
        assert!(node.channel_node().exists());
        let _ = &node.address;
    }

    // Health: node 2's daemon stops answering READY.
    std::fs::write(nodes[2].driver_root.join("imex.not-ready"), "").unwrap();
    let started = Instant::now();
    wait_until(
        "node 2 NotReady in the domain",
        || {
            cluster.domain().and_then(|d| d.status).is_some_and(|s| {
                s.status == Readiness::NotReady
                    && s.nodes.iter().any(|n| n.name == "gb200-2" && n.status == Readiness::NotReady)
            })
        },
        logs,
    );
    println!("node NotReady in the domain status after {:?}", started.elapsed());
    let extra = cluster.allocated_channel("late-worker", "gb200-2");
    let error = nodes[2].prepare(rt, std::slice::from_ref(&extra)).remove(0).unwrap_err();
    assert!(
        error.contains(
            "the IMEX daemon of ComputeDomain default/training on node gb200-2 is not ready (nvidia-imex-ctl: NOT_READY)"
        ),
        "{error}"
    );
    cluster.server.delete::<ResourceClaim>(Some("default"), "late-worker-channel").unwrap();
    std::fs::remove_file(nodes[2].driver_root.join("imex.not-ready")).unwrap();
    wait_until(
        "the domain Ready again",
        || cluster.domain().and_then(|d| d.status).is_some_and(|s| s.status == Readiness::Ready),
        logs,
    );

    // Tear-down: the workload goes (kubelet unprepares, claims deleted),
    // then the domain.
    for (node, claim) in nodes.iter().zip(&claims) {
        rt.block_on(node.kubelet.unprepare(&node.plugin, std::slice::from_ref(claim))).unwrap();
        cluster.server.delete::<ResourceClaim>(Some("default"), &claim.name).unwrap();
    }
    cluster.server.delete::<ComputeDomain>(Some("default"), "training").unwrap();
    wait_until("the domain gone", || cluster.domain().is_none() && cluster.template().is_none(), logs);
    for node in &nodes {
        assert!(node.imex_log().last().unwrap().starts_with("stop "), "{}: {:?}", node.name, node.imex_log());
        assert!(!node.channel_node().exists());
        assert_eq!(node.files(&node.dirs.cdi), Vec::<String>::new());
        assert_eq!(node.files(&node.state().join("domains")), Vec::<String>::new());
        assert_eq!(node.files(&node.state().join("checkpoint")), Vec::<String>::new());
    }
    assert!(cluster.server.list::<ResourceClaim>(Some("default"), "").unwrap().is_empty());
}

#[test]
fn a_domain_beyond_its_clique_is_explained_and_other_cliques_never_join() {
    let cluster = Cluster::start();
    let rt = &cluster.rt;
    let nodes = [Node::start(&cluster.server, rt, 0, 1, 2_000), Node::start(&cluster.server, rt, 1, 2, 2_000)];
    let logs = || format!("controller:\n{}", cluster.controller.log());
    cluster.apply_domain(3);
    wait_until("the workload template", || cluster.template().is_some(), logs);
    let a = cluster.allocated_channel("worker-0", "gb200-0");
    let b = cluster.allocated_channel("worker-1", "gb200-1");
    wait_until(
        "explanations",
        || {
            let w = cluster.warnings();
            w.iter().any(|(_, n)| n.contains("numNodes is 3 but NVLink clique") && n.contains("has 1 nodes"))
                && w.iter()
                    .any(|(_, n)| n.contains("gb200-1 (clique 9b3e4c1a-0d2f-4e5b-8a6c-7d9e0f1a2b3c.2) cannot join"))
        },
        logs,
    );
    let status = cluster.domain().unwrap().status.unwrap();
    assert_eq!(status.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["gb200-0"]);
    assert_eq!(status.status, Readiness::NotReady);
    // Node 0 is the domain's; node 1 (the other clique) is refused with
    // the reason after the bounded wait, and starts no daemon.
    nodes[0].prepare(rt, std::slice::from_ref(&a)).remove(0).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let error = nodes[1].prepare(rt, std::slice::from_ref(&b)).remove(0).unwrap_err();
    assert!(
        error.starts_with("node gb200-1 has not joined ComputeDomain default/job after 2s (its status lists [gb200-0]): the domain's Events say why"),
        "{error}"
    );
    assert!(nodes[1].imex_log().is_empty());
    assert_eq!(nodes[1].files(&nodes[1].dirs.cdi), Vec::<String>::new());
}

/// A SIGKILL of the node agent while a channel waits for its fresh daemon,
/// and one after a finished prepare: the first is rolled back at start-up
/// (its daemon stopped) and prepared again with one daemon; the second is
/// kept as it was (no second daemon, the same answer).
#[test]
fn a_killed_node_agent_neither_leaks_nor_doubles_a_daemon() {
    let cluster = Cluster::start();
    let rt = &cluster.rt;
    let mut node = Node::start(&cluster.server, rt, 0, 1, 20_000);
    let logs = || format!("controller:\n{}", cluster.controller.log());
    cluster.apply_domain(1);
    wait_until("the workload template", || cluster.template().is_some(), logs);
    let claim = cluster.allocated_channel("worker-0", "gb200-0");
    wait_until(
        "the node in the domain",
        || cluster.domain().and_then(|d| d.status).is_some_and(|s| s.nodes.len() == 1),
        logs,
    );

    // Killed while waiting for READY.
    std::fs::write(node.driver_root.join("imex.not-ready"), "").unwrap();
    let answers = {
        let kubelet = &node.kubelet;
        let plugin = &node.plugin;
        let claims = [claim.clone()];
        let call = kubelet.prepare_raw(plugin, &claims);
        rt.block_on(async {
            tokio::select! {
                answers = call => Some(answers),
                _ = tokio::time::sleep(Duration::from_millis(1500)) => None,
            }
        })
    };
    assert!(answers.is_none(), "the prepare waits for the daemon");
    assert_eq!(node.daemons(), 1);
    node.kill_and_restart(rt);
    assert_eq!(node.daemons(), 0, "start-up stopped the half-prepared claim's daemon: {:?}", node.imex_log());
    assert_eq!(node.files(&node.dirs.cdi), Vec::<String>::new());
    std::fs::remove_file(node.driver_root.join("imex.not-ready")).unwrap();
    let first = node
        .prepare(rt, std::slice::from_ref(&claim))
        .remove(0)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.process.log()));
    assert_eq!(node.daemons(), 1);

    // Killed after a finished prepare: kept.
    node.kill_and_restart(rt);
    assert_eq!(node.daemons(), 1);
    assert_eq!(node.prepare(rt, std::slice::from_ref(&claim)).remove(0).unwrap(), first);
    let starts = node.imex_log().iter().filter(|l| l.starts_with("start ")).count();
    assert_eq!(starts, 2, "{:?}", node.imex_log());

    rt.block_on(node.kubelet.unprepare(&node.plugin, std::slice::from_ref(&claim))).unwrap();
    assert_eq!(node.daemons(), 0);
    assert!(!node.channel_node().exists());
}

/// The example's other documents are valid Kubernetes objects, and its pods
/// take their channel from the domain's template.
#[test]
fn the_example_job_uses_the_domains_template() {
    let documents = example_documents();
    let domain = example_domain();
    assert_eq!(domain.spec.num_nodes, 4);
    let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(documents[1].clone()).unwrap();
    let pod = job.spec.unwrap().template.spec.unwrap();
    let claims = pod.resource_claims.unwrap();
    let template = &domain.spec.channel.unwrap().resource_claim_template.name;
    assert!(claims.iter().any(|c| c.resource_claim_template_name.as_ref() == Some(template)));
    let _: ResourceClaimTemplate = serde_json::from_value(documents[2].clone()).unwrap();
}
