//! The chart as users install it, its pods on a real node: the image
//! `image/build.sh` writes (the binaries the other tests run, see
//! `integration_tests::image`) imported into the node's containerd with
//! `ctr -n k8s.io images import`, then `helm install` by the real `helm`
//! (v4, `tests/kube-bins/helm`) with the README's "Try it on kind" values
//! against the real 1.37 control plane. The real kubelet starts the
//! plugin as the DaemonSet's pod and the controller as the Deployment's;
//! the plugin registers from inside its container through the chart's
//! host mounts and publishes its slices; the README's first claim runs in
//! a real container with what our CDI spec gives it; an impossible claim
//! gets the controller's explanation; the real API server calls the
//! controller's webhook through the chart's Service.
//!
//! Network: the node has no CNI, so both workloads run on the host's
//! network (`kubeletPlugin.hostNetwork`, `controller.hostNetwork`), their
//! ports chosen by the test; they reach the API server on loopback
//! (`KUBERNETES_SERVICE_HOST`, through the chart's `env` values: there is
//! no kube-proxy for the `kubernetes` Service), and the API server reaches
//! the webhook at the node's address, which its EndpointSlice holds
//! (`--enable-aggregator-routing`). Nothing leaves the machine.
//! Needs root, as `real_node` does.

use std::path::{Path, PathBuf};

use integration_tests::helm::{self, NAMESPACE, RELEASE};
use integration_tests::image::build_image;
use integration_tests::real_cluster::driver::{eventually, yaml_documents};
use integration_tests::real_cluster::node::{RealNode, TEST_IMAGE};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Cluster, V1_37};
use integration_tests::{helm_cli, run, workspace_root};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const NODE: &str = "chart-node";
const CONTROLLER_LEASE: &str = "gpu-dra-controller";

fn tmp_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("real-chart")
}

/// The README's "Try it on kind" install command, as words.
fn readme_install_command() -> Vec<String> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let kind = readme.split("**Try it on kind**").nth(1).expect("the README's kind section");
    let block = kind.split("```sh").nth(1).and_then(|b| b.split("```").next()).expect("its commands");
    let joined = block.replace("\\\n", " ");
    let line = joined.lines().find(|l| l.trim_start().starts_with("helm install")).expect("its helm install");
    line.split_whitespace().map(str::to_string).collect()
}

/// The values the test adds to the README's: the node's kubelet and CDI
/// directories, the host's network with ports of the test's, the API
/// server on loopback, explanations without the default wait.
fn test_values(cluster: &Cluster, node: &RealNode, [plugin_metrics, controller_metrics, webhook]: [u16; 3]) -> Value {
    let port = cluster.url().rsplit(':').next().unwrap().to_string();
    let api_server = json!([{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                            {"name": "KUBERNETES_SERVICE_PORT", "value": port}]);
    json!({
        "kubeletPlugin": {
            "pluginsDir": node.plugins_dir(), "registryDir": node.registry_dir(), "cdiDir": node.cdi_dir(),
            "hostNetwork": true, "metricsPort": plugin_metrics, "env": api_server,
        },
        "controller": {
            "hostNetwork": true, "metricsPort": controller_metrics, "env": api_server, "explainAfter": "1s",
        },
        "webhook": {"port": webhook},
    })
}

/// `helm install` as the README says, plus `-f` with the test's values:
/// helm's output (NOTES.txt).
fn helm_install(cluster: &Cluster, node: &RealNode, ports: [u16; 3], image_name: &str) -> String {
    let command = readme_install_command();
    assert_eq!(&command[..4], ["helm", "install", RELEASE, "charts/gpu-dra-driver"], "{command:?}");
    let chart = workspace_root().join("charts/gpu-dra-driver").display().to_string();
    let mut args: Vec<String> = command[1..].to_vec();
    args[2] = chart;
    // The README's image name is what `docker build -t` gave; image/build.sh
    // names it with the chart's repository and version.
    let (repository, tag) = image_name.rsplit_once(':').unwrap();
    for arg in args.iter_mut() {
        if arg.starts_with("image.repository=") {
            *arg = format!("image.repository={repository}");
        }
    }
    let values = tmp_dir().join("values.json");
    std::fs::write(&values, serde_json::to_vec(&test_values(cluster, node, ports)).unwrap()).unwrap();
    args.extend(["--set".into(), format!("image.tag={tag}"), "-f".into(), values.display().to_string()]);
    args.extend(["--kubeconfig".into(), cluster.admin_kubeconfig().display().to_string()]);
    let borrowed: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = helm_cli::run(&tmp_dir().join("helm-home"), &borrowed);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "helm {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The `kubectl` commands NOTES.txt prints with nothing to fill in.
fn notes_commands(notes: &str) -> Vec<Vec<String>> {
    notes
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kubectl ") && !l.contains('<'))
        .map(|l| l.split_whitespace().skip(1).map(str::to_string).collect())
        .collect()
}

/// The pods of the chart's `component`, and which of them run and are ready.
async fn pods_of(cluster: &Cluster, component: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), NAMESPACE);
    let selector = format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}");
    pods.list(&ListParams::default().labels(&selector)).await.map(|l| l.items).unwrap_or_default()
}

fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// The README's first claim ("Writing claims"): its template as written,
/// its pod with a container that prints its environment (the README's
/// image has no shell) on the host's network.
fn readme_first_claim(signal: &Path) -> (Value, Value) {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let section = readme.split("## Writing claims").nth(1).expect("the README's Writing claims");
    let block = section.split("```yaml").nth(1).and_then(|b| b.split("```").next()).expect("its first claim");
    let documents = helm::documents("README", block);
    let mut template = documents.iter().find(|d| d["kind"] == "ResourceClaimTemplate").unwrap().clone();
    let mut pod = documents.iter().find(|d| d["kind"] == "Pod").unwrap().clone();
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
const SHOW: &str = "echo '== env'; env; echo '== end'; until [ -e /signal/finish ]; do sleep 0.2; done";

/// The container's report: the lines between `== env` and `== end`.
fn env_section(log: &str) -> Vec<&str> {
    log.lines().skip_while(|l| *l != "== env").skip(1).take_while(|l| *l != "== end").collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installed_by_helm_runs_its_pods_on_a_real_node() {
    if !rustix::process::geteuid().is_root() {
        panic!("the real node needs root (mounts, cgroups, device nodes), as a kubelet does");
    }
    std::fs::create_dir_all(tmp_dir()).unwrap();
    let image = build_image(&tmp_dir().join("image"));
    let cluster = Cluster::start(V1_37).await;
    let node = RealNode::start(&cluster, NODE).await;
    node.import_image(&image.archive, &image.name);
    let ports: [u16; 3] = integration_tests::ports::reserve();
    let notes = helm_install(&cluster, &node, ports, &image.name);

    let pod_logs = |component: &str, lines: usize| -> String {
        let Ok(dir) = std::fs::read_dir(node.dir().join("pod-logs")) else { return String::new() };
        let mut text = String::new();
        for entry in dir.flatten() {
            let folder = entry.file_name().to_string_lossy().into_owned();
            if folder.starts_with(&format!("{NAMESPACE}_{RELEASE}-{component}")) {
                for file in walk(&entry.path()) {
                    text += &format!("---- {}\n{}\n", file.display(), tail(&file, lines));
                }
            }
        }
        text
    };
    let logs = || {
        format!(
            "{}\n{}\n---- plugin pods\n{}\n---- controller pods\n{}",
            cluster.logs(),
            node.logs(),
            pod_logs("kubelet-plugin", 40),
            pod_logs("controller", 40)
        )
    };

    // The plugin: the DaemonSet's pod runs and is ready on the node, and
    // has registered with the kubelet and published the fake inventory.
    let plugin = eventually(
        "the plugin's pod to be ready",
        || async { pods_of(&cluster, "kubelet-plugin").await.into_iter().find(is_ready) },
        logs,
    )
    .await;
    assert_eq!(plugin.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));
    let slices: Api<ResourceSlice> = Api::all(cluster.admin());
    let published = eventually(
        "the plugin's slices",
        || async {
            let list = slices.list(&ListParams::default().fields(&format!("spec.nodeName={NODE}"))).await.ok()?;
            let devices: usize = list.items.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum();
            (devices > 0).then_some(devices)
        },
        logs,
    )
    .await;
    assert_eq!(published, 8, "the README's fake inventory is eight H100s");
    let registration = node.registry_dir().join("gpu.nvidia.com-reg.sock");
    assert!(registration.exists(), "no registration socket {}\n{}", registration.display(), logs());

    // The controller: both replicas of the Deployment exist; on one node
    // with the host's network only one can run (the second would take the
    // same ports: the scheduler keeps it Pending), and it holds the Lease.
    let controllers = eventually(
        "a ready controller",
        || async {
            let pods = pods_of(&cluster, "controller").await;
            (pods.len() == 2 && pods.iter().any(is_ready)).then_some(pods)
        },
        logs,
    )
    .await;
    let running = controllers.iter().find(|p| is_ready(p)).map(name).unwrap();
    let leases: Api<Lease> = Api::namespaced(cluster.admin(), NAMESPACE);
    let holder = eventually(
        "the controller's Lease",
        || async { leases.get(CONTROLLER_LEASE).await.ok()?.spec?.holder_identity },
        logs,
    )
    .await;
    // The identity is the pod's name and a suffix of the process's.
    assert!(holder.starts_with(&format!("{running}-")), "{holder} is not the running replica {running}");
    let pending: Vec<_> = controllers.iter().filter(|p| !is_ready(p)).collect();
    let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    assert!(pending.iter().all(|p| phase(p) == "Pending"), "{pending:?}");

    // The webhook through the Service: an opaque config with a field
    // GpuConfig lacks is denied by the controller, called by the API
    // server at the Service's endpoint (dry runs until the endpoint is
    // there: the webhook's failurePolicy is Ignore).
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.admin(), "default");
    let bad: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "bad-config", "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters":
                {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "typo": true}}}]}},
    }))
    .unwrap();
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    let denial = eventually(
        "the webhook's denial",
        || async {
            match claims.create(&dry_run, &bad).await {
                Err(kube::Error::Api(status)) if status.message.contains("denied the request") => Some(status.message),
                _ => None,
            }
        },
        logs,
    )
    .await;
    assert!(denial.contains(r#"admission webhook "resourceclaims.gpu.nvidia.com" denied the request"#), "{denial}");

    // The README's first claim in a real container: what CDI gave it.
    let signal = node.dir().join("signal");
    std::fs::create_dir_all(&signal).unwrap();
    let (template, pod) = readme_first_claim(&signal);
    create_all(&cluster.admin(), &[template, pod.clone()]).await.unwrap_or_else(|e| panic!("{e}"));
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), "default");
    let pod_name = pod["metadata"]["name"].as_str().unwrap();
    let container = pod["spec"]["containers"][0]["name"].as_str().unwrap();
    let uid = pods.get(pod_name).await.unwrap().metadata.uid.unwrap();
    let log = eventually(
        "the container's report",
        || async {
            let log = node.container_log("default", pod_name, &uid, container);
            log.contains("== end").then_some(log)
        },
        logs,
    )
    .await;
    eprintln!("---- the container's environment\n{log}");
    let claim_name = pods.get(pod_name).await.unwrap().status.unwrap().resource_claim_statuses.unwrap()[0]
        .resource_claim_name
        .clone()
        .unwrap();
    let claim = claims.get(&claim_name).await.unwrap();
    let claim_uid = claim.metadata.uid.clone().unwrap();
    let results = claim.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].pool, NODE);
    // The spec the plugin wrote from its container into the host's CDI
    // directory: every variable it sets is in the container's environment.
    let spec_path = node.cdi_dir().join(format!("k8s.gpu.nvidia.com-claim_{claim_uid}.json"));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap_or_else(|e| {
        panic!("{}: {e}\n{}", spec_path.display(), logs());
    }))
    .unwrap();
    let env = env_section(&log);
    let variables = env_edits(&spec);
    assert!(variables.iter().any(|v| v.starts_with("NVIDIA_VISIBLE_DEVICES=")), "{spec}");
    for variable in &variables {
        assert!(env.contains(variable), "{variable} (CDI) is not in the container's environment: {env:?}");
    }
    std::fs::write(signal.join("finish"), b"").unwrap();

    // An impossible claim with a pod waiting for it: the controller's
    // explanation, as an Event on the claim.
    let impossible = yaml_documents(&workspace_root().join("examples/claims/08-unsatisfiable.yaml"));
    let waiting = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": "default"},
        "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": TEST_IMAGE, "imagePullPolicy": "Never"}],
                 "resourceClaims": [{"name": "gpus", "resourceClaimName": "eight-b200"}]}});
    create_all(&cluster.admin(), &[impossible[0].clone(), waiting]).await.unwrap_or_else(|e| panic!("{e}"));
    let events: Api<Event> = Api::namespaced(cluster.admin(), "default");
    let event = eventually(
        "the explanation Event on the claim",
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("eight-b200")
                    && e.reason.as_deref() == Some("Unsatisfiable")
            })
        },
        logs,
    )
    .await;
    assert_eq!(event.reporting_controller.as_deref(), Some("gpu.nvidia.com/controller"));

    // NOTES.txt's commands with nothing to fill in run, against this
    // cluster, in a real kubectl.
    let kubectl = helm::kubectl(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let commands = notes_commands(&notes);
    assert!(commands.len() >= 2, "{notes}");
    for command in commands {
        let mut args = vec!["--kubeconfig".to_string(), cluster.admin_kubeconfig().display().to_string()];
        args.extend(command);
        let borrowed: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&kubectl, &borrowed, None);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "kubectl {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        eprintln!("---- kubectl {}\n{stdout}", args[2..].join(" "));
    }

    // Neither workload met an error in its pod.
    for component in ["kubelet-plugin", "controller"] {
        let log = pod_logs(component, usize::MAX);
        assert!(!log.is_empty(), "no log of the {component} pods");
        assert!(!log.contains("ERROR"), "the {component} pods logged an error:\n{log}");
    }
}

/// Every variable the spec sets (its own and its devices').
fn env_edits(spec: &Value) -> Vec<&str> {
    let devices = spec["devices"].as_array().into_iter().flatten();
    let edits = std::iter::once(&spec["containerEdits"]).chain(devices.map(|d| &d["containerEdits"]));
    edits.flat_map(|e| e["env"].as_array().into_iter().flatten()).filter_map(Value::as_str).collect()
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
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
