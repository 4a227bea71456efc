//! The chart as users install it, on two real nodes of a real control
//! plane, shared by the tests that install it (`tests/real_chart.rs`) and
//! upgrade, roll back, reboot and uninstall it
//! (`tests/real_chart_lifecycle.rs`): the image `image/build.sh` writes,
//! imported into each node's containerd with `ctr -n k8s.io images
//! import`; the real `helm` with the README's "Try it on kind" command and
//! the values a test node needs (see [`ChartCluster::install`]); the first
//! claim of the guide's "Writing claims" (`docs/claims.md`) as a pod whose
//! container prints what CDI gave it.
//!
//! Each node's kubelet and containerd run in a mount namespace of their
//! own where `/var/lib/kubelet` and `/var/run/cdi` are that node's (the
//! chart mounts the same host paths on every node: its defaults are used
//! as they are), and each has an address of its own on `lo`
//! (`--node-ip`). Needs root, as a kubelet does.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::helm::{self, NAMESPACE, RELEASE};
use crate::image::{BuiltImage, build_image};
use crate::real_cluster::host_address::HostAddress;
use crate::real_cluster::node::{RealNode, TEST_IMAGE};
use crate::real_cluster::{Cluster, Release};
use crate::{docs, helm_cli, workspace_root};

/// The Lease the controller's replicas elect their leader on.
pub const CONTROLLER_LEASE: &str = "gpu-dra-controller";

/// The image, built once per test process into `dir` (an archive whose
/// inputs have not changed is kept as it is).
pub fn image(dir: &Path) -> &'static BuiltImage {
    static IMAGE: std::sync::OnceLock<BuiltImage> = std::sync::OnceLock::new();
    IMAGE.get_or_init(|| build_image(dir))
}

/// The "Try it on kind" install command (the README's "Install on a
/// cluster"), as words.
pub fn kind_install_command() -> Vec<String> {
    let docs = docs::docs_text();
    let kind = docs.split("**Try it on kind**").nth(1).expect("the docs' kind section");
    let block = kind.split("```sh").nth(1).and_then(|b| b.split("```").next()).expect("its commands");
    let joined = block.replace("\\\n", " ");
    let line = joined.lines().find(|l| l.trim_start().starts_with("helm install")).expect("its helm install");
    line.split_whitespace().map(str::to_string).collect()
}

/// A control plane and its nodes, each with the image imported, before
/// and after the chart is installed. Dropped in this order: the nodes,
/// their addresses, the control plane.
pub struct ChartCluster {
    pub nodes: Vec<RealNode>,
    _addresses: Vec<HostAddress>,
    pub cluster: Cluster,
    /// The plugin's metrics, the controller's metrics, the webhook.
    pub ports: [u16; 3],
    /// Where helm's home, the values and the test's files go.
    tmp: PathBuf,
}

impl ChartCluster {
    /// Starts `release`'s control plane and nodes `names` (each at an
    /// address of the benchmarking range, apart per process and release:
    /// 1.37's are .74, .75, ...), and imports `image` into each.
    pub async fn start(release: Release, tmp: &Path, names: &[&str], image: &BuiltImage) -> Self {
        assert!(
            rustix::process::geteuid().is_root(),
            "the real node needs root (mounts, cgroups, device nodes), as a kubelet does"
        );
        std::fs::create_dir_all(tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
        let cluster = Cluster::start(release).await;
        let pid = std::process::id();
        let minor: u8 = release.minor.trim_start_matches("1.").parse().expect("a minor version");
        let addresses: Vec<HostAddress> = (0..names.len() as u8)
            .map(|i| HostAddress::add_to_loopback(Ipv4Addr::new(198, 19, (pid & 0xff) as u8, 2 * minor + i)))
            .collect();
        let mut nodes = Vec::new();
        for (name, address) in names.iter().zip(&addresses) {
            let node = RealNode::start_own(&cluster, name, address.ip()).await;
            node.import_image(&image.archive, &image.name);
            nodes.push(node);
        }
        Self { nodes, _addresses: addresses, cluster, ports: crate::ports::reserve(), tmp: tmp.to_path_buf() }
    }

    /// `helm args...` against this cluster, with a helm home of the
    /// test's: its standard output, asserting success.
    pub fn helm(&self, args: &[&str]) -> String {
        let home = self.tmp.join(format!("helm-home-{}", self.cluster.release().minor));
        let kubeconfig = self.cluster.admin_kubeconfig().display().to_string();
        let mut all = args.to_vec();
        all.extend(["--kubeconfig", &kubeconfig]);
        let out = helm_cli::run(&home, &all);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "helm {all:?}: {stdout}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        stdout
    }

    /// `helm install` as the README says, plus `-f` with the values a test
    /// node needs and `extra` (merged over them): helm's output
    /// (NOTES.txt). `image_name` is `<repository>:<tag>`, as
    /// `image/build.sh` names it.
    pub fn install(&self, image_name: &str, extra: &Value) -> String {
        let command = kind_install_command();
        assert_eq!(&command[..4], ["helm", "install", RELEASE, "charts/gpu-dra-driver"], "{command:?}");
        let chart = workspace_root().join("charts/gpu-dra-driver").display().to_string();
        let mut args: Vec<String> = command[1..].to_vec();
        args[2] = chart;
        // The README's image name is what `docker build -t` gave;
        // image/build.sh names it with the chart's repository and version.
        let (repository, tag) = image_name.rsplit_once(':').expect("<repository>:<tag>");
        for arg in args.iter_mut() {
            if arg.starts_with("image.repository=") {
                *arg = format!("image.repository={repository}");
            }
        }
        let mut values = self.test_values();
        merge(&mut values, extra);
        let file = self.tmp.join(format!("values-{}.json", self.cluster.release().minor));
        std::fs::write(&file, serde_json::to_vec(&values).expect("values as JSON")).expect("writing the values");
        args.extend(["--set".into(), format!("image.tag={tag}"), "-f".into(), file.display().to_string()]);
        let borrowed: Vec<&str> = args.iter().map(String::as_str).collect();
        self.helm(&borrowed)
    }

    /// The values the tests add to the README's: the host's network with
    /// ports of the test's, each pod on its node's address (the nodes have
    /// no CNI), the API server on loopback (there is no kube-proxy for the
    /// `kubernetes` Service), explanations without the default wait. The
    /// kubelet's and CDI's paths are the chart's own.
    fn test_values(&self) -> Value {
        let [plugin_metrics, controller_metrics, webhook] = self.ports;
        let port = self.cluster.url().rsplit(':').next().unwrap_or_default().to_string();
        let api_server = json!([{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                                {"name": "KUBERNETES_SERVICE_PORT", "value": port}]);
        json!({
            "kubeletPlugin": {"hostNetwork": true, "metricsPort": plugin_metrics, "env": api_server},
            "controller": {
                "hostNetwork": true, "metricsPort": controller_metrics, "env": api_server, "explainAfter": "1s",
            },
            "webhook": {"port": webhook},
        })
    }

    pub fn node(&self, name: &str) -> &RealNode {
        self.nodes.iter().find(|n| n.name() == name).unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Reboots node `name` (see [`RealNode::reboot`]).
    pub fn reboot(&mut self, name: &str) {
        let (node, cluster) = self.node_mut(name);
        node.reboot(cluster);
    }

    /// Restarts node `name`'s kubelet (see [`RealNode::restart_kubelet`]).
    pub fn restart_kubelet(&mut self, name: &str) {
        let (node, cluster) = self.node_mut(name);
        node.restart_kubelet(cluster);
    }

    fn node_mut(&mut self, name: &str) -> (&mut RealNode, &Cluster) {
        let node = self.nodes.iter_mut().find(|n| n.name() == name).unwrap_or_else(|| panic!("no node {name}"));
        (node, &self.cluster)
    }

    /// The pods of the chart's `component`.
    pub async fn pods_of(&self, component: &str) -> Vec<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.cluster.admin(), NAMESPACE);
        let selector = format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}");
        pods.list(&ListParams::default().labels(&selector)).await.map(|l| l.items).unwrap_or_default()
    }

    /// The last `lines` lines of every log of the chart's `component`'s
    /// pods on every node (each container run's file).
    pub fn pod_logs(&self, component: &str, lines: usize) -> String {
        let mut text = String::new();
        let folders = self.nodes.iter().flat_map(|n| std::fs::read_dir(n.dir().join("pod-logs")).into_iter().flatten());
        for entry in folders.flatten() {
            let folder = entry.file_name().to_string_lossy().into_owned();
            if folder.starts_with(&format!("{NAMESPACE}_{RELEASE}-{component}")) {
                for file in walk(&entry.path()) {
                    text += &format!("---- {}\n{}\n", file.display(), tail(&file, lines));
                }
            }
        }
        text
    }

    /// What a failed wait shows: the control plane's and nodes' logs, the
    /// plugin's and the controller's pods'.
    pub fn logs(&self) -> String {
        format!(
            "{}\n{}\n---- plugin pods\n{}\n---- controller pods\n{}",
            self.cluster.logs(),
            self.nodes.iter().map(RealNode::logs).collect::<Vec<_>>().join("\n"),
            self.pod_logs("kubelet-plugin", 40),
            self.pod_logs("controller", 40)
        )
    }
}

/// `extra` over `values`, object by object.
fn merge(values: &mut Value, extra: &Value) {
    match (values, extra) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (slot, value) => *slot = value.clone(),
    }
}

pub fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

pub fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

pub fn node_name(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

/// The first claim of "Writing claims" (`docs/claims.md`): its template
/// as written, its pod with a container that prints its environment (the
/// page's image has no shell) on the host's network, then waits for
/// `finish` in `signal` (mounted at `/signal`).
pub fn first_claim(signal: &Path) -> (Value, Value) {
    let section = docs::section("Writing claims");
    let block = section.split("```yaml").nth(1).and_then(|b| b.split("```").next()).expect("its first claim");
    let documents = helm::documents("Writing claims", block);
    let find = |kind: &str| documents.iter().find(|d| d["kind"] == kind).cloned().expect("the claim's documents");
    let (mut template, mut pod) = (find("ResourceClaimTemplate"), find("Pod"));
    template["metadata"]["namespace"] = json!("default");
    pod["metadata"]["namespace"] = json!("default");
    let spec = &mut pod["spec"];
    spec["hostNetwork"] = json!(true);
    spec["restartPolicy"] = json!("Never");
    spec["automountServiceAccountToken"] = json!(false);
    spec["volumes"] = json!([{"name": "signal", "hostPath": {"path": signal}}]);
    let container = &mut spec["containers"][0];
    container["image"] = json!(TEST_IMAGE);
    container["imagePullPolicy"] = json!("Never");
    container["volumeMounts"] = json!([{"name": "signal", "mountPath": "/signal"}]);
    container["command"] = json!(["sh", "-c", SHOW]);
    (template, pod)
}

/// What the container prints (its environment), then it waits for the
/// test to let it finish (so its claim stays prepared while the test reads
/// the CDI spec).
pub const SHOW: &str = "echo '== env'; env; echo '== end'; until [ -e /signal/finish ]; do sleep 0.2; done";

/// The container's report: the lines between `== env` and `== end`.
pub fn env_section(log: &str) -> Vec<&str> {
    log.lines().skip_while(|l| *l != "== env").skip(1).take_while(|l| *l != "== end").collect()
}

/// Every variable a CDI spec sets (its own and its devices').
pub fn env_edits(spec: &Value) -> Vec<&str> {
    let devices = spec["devices"].as_array().into_iter().flatten();
    let edits = std::iter::once(&spec["containerEdits"]).chain(devices.map(|d| &d["containerEdits"]));
    edits.flat_map(|e| e["env"].as_array().into_iter().flatten()).filter_map(Value::as_str).collect()
}

/// Every file under `dir`.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}

/// The last `n` lines of `file`.
fn tail(file: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_values_merge_object_by_object() {
        let mut values = json!({"a": {"b": 1, "c": [1]}, "d": 2});
        merge(&mut values, &json!({"a": {"c": [2], "e": true}, "f": {"g": 3}}));
        assert_eq!(values, json!({"a": {"b": 1, "c": [2], "e": true}, "d": 2, "f": {"g": 3}}));
    }
}
