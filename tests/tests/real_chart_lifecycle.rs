//! The chart's life after `helm install`, on two real nodes of the real
//! 1.37 control plane (see `integration_tests::real_chart`), with a claim
//! prepared and its pod running throughout:
//!
//! 1. `helm upgrade` to a second tag of the image: the DaemonSet replaces
//!    the plugin one node at a time (never both not ready), the new plugin
//!    keeps the checkpointed claim, the pod keeps its container, a new
//!    claim prepares, and the old claim's unprepare (its pod deleted)
//!    removes its spec and record; `helm rollback` the same way back;
//! 2. a node's reboot (`RealNode::reboot`: every process killed, `/run`
//!    with the CDI directory emptied, the services started again; the
//!    plugin's state on disk stays): the plugin writes the prepared claim's
//!    spec again and the pod's container starts again with its devices
//!    (kubernetes#141433); then the spec removed again, the kubelet alone
//!    restarted and the pod's processes killed: the kubelet's prepare of
//!    the new sandbox, answered by the plugin still running, writes it
//!    again;
//! 3. `helm uninstall`, as docs/install.md's "Upgrade, roll back, uninstall"
//!    says: the slices go, the sockets go, a running pod keeps its spec and
//!    record, the ComputeDomain CRD stays; the pod deleted meanwhile waits
//!    for the driver to unprepare it, which the next install does; a second
//!    uninstall with nothing prepared leaves no spec and no record.
//!
//! ComputeDomains are on (`resources.computeDomains.enabled`), so that the
//! CRD and the second driver's socket and slices are part of it. Needs
//! root, as `real_chart` does.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use integration_tests::helm::{NAMESPACE, RELEASE};
use integration_tests::real_chart::{
    CONTROLLER_LEASE, ChartCluster, env_edits, env_section, first_claim, image, is_ready, name, node_name,
};
use integration_tests::real_cluster::V1_37;
use integration_tests::real_cluster::driver::{eventually, eventually_within};
use integration_tests::real_cluster::objects::create_all;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerStatus, Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

const NODES: [&str; 2] = ["life-node-a", "life-node-b"];
const DRIVERS: [&str; 2] = ["gpu.nvidia.com", "compute-domain.nvidia.com"];
const CRD: &str = "computedomains.resource.nvidia.com";
/// A rollout replaces two plugins one after the other; a rebooted node
/// starts its pods again after the kubelet's back-off; the kubelet
/// removes a deregistered driver's slices after its grace period (30 s).
const SLOW_WAIT: Duration = Duration::from_secs(240);

fn tmp_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("real-chart-lifecycle")
}

/// A pod of docs/claims.md's first claim, its container running, its claim
/// prepared on `node`.
struct ClaimPod {
    pod: String,
    uid: String,
    node: String,
    container_id: String,
    claim_uid: String,
}

impl ClaimPod {
    /// The claim's CDI spec on its node.
    fn spec(&self, chart: &ChartCluster) -> PathBuf {
        chart.node(&self.node).cdi_dir().join(format!("k8s.gpu.nvidia.com-claim_{}.json", self.claim_uid))
    }

    /// The claim's checkpoint record in the plugin's state directory on
    /// its node (a host path that outlives the plugin's pods).
    fn record(&self, chart: &ChartCluster) -> PathBuf {
        chart.node(&self.node).plugins_dir().join("gpu.nvidia.com/checkpoint").join(format!("{}.json", self.claim_uid))
    }
}

fn container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()
}

fn running_container(pod: &Pod) -> Option<&ContainerStatus> {
    container(pod).filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// The container of docs/claims.md's first claim's pod.
const CONTAINER: &str = "jupyter";

/// Creates `pod` as `name` and waits until its container runs and has
/// printed its environment, which holds every variable its claim's CDI
/// spec sets.
async fn start_pod(chart: &ChartCluster, pod: &Value, name: &str) -> ClaimPod {
    let mut pod = pod.clone();
    pod["metadata"]["name"] = json!(name);
    create_all(&chart.cluster.admin(), &[pod]).await.unwrap_or_else(|e| panic!("{e}"));
    let pods: Api<Pod> = Api::namespaced(chart.cluster.admin(), "default");
    let found = eventually(
        &format!("pod {name} to run"),
        || async {
            let pod = pods.get(name).await.ok()?;
            let container_id = running_container(&pod)?.container_id.clone()?;
            let claim = pod.status.as_ref()?.resource_claim_statuses.as_ref()?.first()?.resource_claim_name.clone()?;
            Some((pod, container_id, claim))
        },
        || chart.logs(),
    )
    .await;
    let (pod, container_id, claim) = found;
    let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> = Api::namespaced(chart.cluster.admin(), "default");
    let claim = claims.get(&claim).await.unwrap_or_else(|e| panic!("claim {claim}: {e}"));
    let running = ClaimPod {
        pod: name.to_string(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        node: node_name(&pod),
        container_id,
        claim_uid: claim.metadata.uid.clone().unwrap_or_default(),
    };
    shows_its_devices(chart, &running, 0).await;
    running
}

/// The log of the container's run `run` shows every variable of its
/// claim's spec.
async fn shows_its_devices(chart: &ChartCluster, running: &ClaimPod, run: i32) {
    let node = chart.node(&running.node);
    let log = eventually(
        &format!("the report of {}'s container, run {run}", running.pod),
        || async {
            let log = node.container_log_of_run("default", &running.pod, &running.uid, CONTAINER, run);
            log.contains("== end").then_some(log)
        },
        || chart.logs(),
    )
    .await;
    let text = std::fs::read_to_string(running.spec(chart)).unwrap_or_else(|e| panic!("{e}\n{}", chart.logs()));
    let spec: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let variables = env_edits(&spec);
    assert!(variables.iter().any(|v| v.starts_with("NVIDIA_VISIBLE_DEVICES=")), "{spec}");
    let env = env_section(&log);
    for variable in &variables {
        assert!(env.contains(variable), "{variable} (CDI) is not in {}'s environment: {env:?}", running.pod);
    }
}

/// Waits for the pod to run a new container (`when` says after what),
/// whose log shows every variable of its claim's spec: its status.
async fn runs_again(chart: &ChartCluster, running: &ClaimPod, when: &str) -> ContainerStatus {
    let pods: Api<Pod> = Api::namespaced(chart.cluster.admin(), "default");
    let restarted = eventually_within(
        &format!("{} to run again {when}", running.pod),
        SLOW_WAIT,
        || async {
            let pod = pods.get(&running.pod).await.ok()?;
            let status = running_container(&pod)?;
            (status.container_id.as_deref() != Some(running.container_id.as_str())).then(|| status.clone())
        },
        || chart.logs(),
    )
    .await;
    shows_its_devices(chart, running, restarted.restart_count).await;
    restarted
}

/// The pod as it is now: still running its first container.
async fn still_running(chart: &ChartCluster, running: &ClaimPod) {
    let pods: Api<Pod> = Api::namespaced(chart.cluster.admin(), "default");
    let pod = pods.get(&running.pod).await.unwrap_or_else(|e| panic!("{}: {e}", running.pod));
    let status = running_container(&pod).unwrap_or_else(|| panic!("{} does not run: {:?}", running.pod, pod.status));
    assert_eq!(status.container_id.as_deref(), Some(running.container_id.as_str()), "a new container");
    assert_eq!(status.restart_count, 0, "{}'s container restarted", running.pod);
}

/// Deletes the pod and waits for the kubelet to unprepare its claim
/// through the plugin (see [`unprepared`]).
async fn delete_and_unprepare(chart: &ChartCluster, running: &ClaimPod) {
    let pods: Api<Pod> = Api::namespaced(chart.cluster.admin(), "default");
    pods.delete(&running.pod, &DeleteParams::default()).await.unwrap_or_else(|e| panic!("{}: {e}", running.pod));
    unprepared(chart, running).await;
}

/// Waits for a deleted pod's claim to be unprepared (its spec and record
/// gone) and the pod to go.
async fn unprepared(chart: &ChartCluster, running: &ClaimPod) {
    let pods: Api<Pod> = Api::namespaced(chart.cluster.admin(), "default");
    eventually_within(
        &format!("{}'s claim to be unprepared and the pod gone", running.pod),
        SLOW_WAIT,
        || async {
            let gone = pods.get_opt(&running.pod).await.ok()?.is_none();
            (gone && !running.spec(chart).exists() && !running.record(chart).exists()).then_some(())
        },
        || chart.logs(),
    )
    .await;
}

/// Runs `helm args` that change the plugin's image to `tag`, and follows
/// the DaemonSet's rollout: at every look at least one node has a ready
/// plugin (`maxUnavailable: 1`); done when every plugin is a new pod with
/// `tag`, ready. Then `running`'s claim: the new plugin on its node kept
/// its record (`checkpoint reconciled` with `kept=1`, the record's bytes
/// unchanged), its container runs on; a new pod's claim prepares; the old
/// pod deleted, its claim is unprepared. Returns the new pod.
async fn roll(chart: &ChartCluster, args: &[&str], tag: &str, running: ClaimPod, pod: &Value, next: &str) -> ClaimPod {
    let old: BTreeSet<String> =
        chart.pods_of("kubelet-plugin").await.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    let record = std::fs::read(running.record(chart)).unwrap_or_else(|e| panic!("the record: {e}"));
    chart.helm(args);
    let has_tag = |pod: &Pod| {
        pod.spec.as_ref().is_some_and(|s| {
            s.containers.iter().all(|c| c.image.as_deref().is_some_and(|i| i.ends_with(&format!(":{tag}"))))
        })
    };
    // Each different look, for the test's output.
    let looks = std::sync::Mutex::new(Vec::<String>::new());
    let plugins = eventually_within(
        &format!("the plugins to roll to {tag}"),
        SLOW_WAIT,
        || async {
            let pods = chart.pods_of("kubelet-plugin").await;
            let serving: BTreeSet<String> = pods.iter().filter(|p| is_ready(p)).map(node_name).collect();
            let states: Vec<String> =
                pods.iter().map(|p| format!("{} on {}: ready {}", name(p), node_name(p), is_ready(p))).collect();
            assert!(serving.len() >= NODES.len() - 1, "more than one node without a ready plugin: {states:?}");
            let mut looks = looks.lock().unwrap_or_else(|e| e.into_inner());
            if looks.last() != Some(&states.join(", ")) {
                looks.push(states.join(", "));
            }
            let new = |p: &Pod| p.metadata.uid.as_ref().is_some_and(|u| !old.contains(u)) && has_tag(p);
            (pods.len() == NODES.len() && pods.iter().all(|p| is_ready(p) && new(p))).then_some(pods)
        },
        || chart.logs(),
    )
    .await;
    eprintln!(
        "---- helm {}: the plugins as the rollout went\n{}",
        args[0],
        looks.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
    );
    let plugin = plugins.iter().find(|p| node_name(p) == running.node).expect("a plugin on the pod's node");
    let uid = plugin.metadata.uid.clone().unwrap_or_default();
    let log = chart.node(&running.node).container_log(NAMESPACE, &name(plugin), &uid, "plugin");
    let reconciled = log.lines().find(|l| l.contains("checkpoint reconciled") && !l.contains("compute_domain"));
    assert!(reconciled.is_some_and(|l| l.contains("kept=1")), "the new plugin did not keep the claim:\n{log}");
    assert_eq!(std::fs::read(running.record(chart)).ok(), Some(record), "the record changed");
    assert!(running.spec(chart).exists(), "the spec went");
    still_running(chart, &running).await;
    let started = start_pod(chart, pod, next).await;
    delete_and_unprepare(chart, &running).await;
    started
}

/// Our files on each node: the registration sockets, the CDI specs, and
/// every file under the drivers' state directories (relative).
fn leftovers(chart: &ChartCluster, node: &str) -> BTreeSet<String> {
    let node = chart.node(node);
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(node.registry_dir()).into_iter().flatten().flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if DRIVERS.iter().any(|d| file.starts_with(d)) {
            found.insert(format!("plugins_registry/{file}"));
        }
    }
    for entry in std::fs::read_dir(node.cdi_dir()).into_iter().flatten().flatten() {
        found.insert(format!("cdi/{}", entry.file_name().to_string_lossy()));
    }
    for driver in DRIVERS {
        let dir = node.plugins_dir().join(driver);
        for file in integration_tests::real_chart::walk(&dir) {
            let relative = file.strip_prefix(node.plugins_dir()).unwrap_or(&file).display().to_string();
            found.insert(format!("plugins/{relative}"));
        }
    }
    eprintln!("---- {}: our files {found:?}", node.name());
    found
}

/// What `helm uninstall` leaves on a node, as docs/install.md says: the lock
/// file of the plugin's state directory, and the spec and record of each
/// claim whose pod still runs there (and directories with no file).
fn kept_after_uninstall(prepared: &[&str]) -> BTreeSet<String> {
    let mut kept = BTreeSet::from(["plugins/gpu.nvidia.com/plugin.lock".to_string()]);
    for uid in prepared {
        kept.insert(format!("cdi/k8s.gpu.nvidia.com-claim_{uid}.json"));
        kept.insert(format!("plugins/gpu.nvidia.com/checkpoint/{uid}.json"));
    }
    kept
}

/// After `helm uninstall`: no pod of the release, no slice of its drivers.
async fn uninstalled(chart: &ChartCluster) {
    let slices: Api<ResourceSlice> = Api::all(chart.cluster.admin());
    let pods: Api<Pod> = Api::namespaced(chart.cluster.admin(), NAMESPACE);
    let started = std::time::Instant::now();
    eventually_within(
        "the release's pods and slices to go",
        SLOW_WAIT,
        || async {
            let ours = format!("app.kubernetes.io/instance={RELEASE}");
            let left = pods.list(&ListParams::default().labels(&ours)).await.ok()?.items.len();
            let list = slices.list(&ListParams::default()).await.ok()?.items;
            let published = list.iter().filter(|s| DRIVERS.contains(&s.spec.driver.as_str())).count();
            (left == 0 && published == 0).then_some(())
        },
        || chart.logs(),
    )
    .await;
    eprintln!("---- helm uninstall: pods and slices gone after {:.1?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrade_rollback_reboot_and_uninstall_keep_a_prepared_claim_and_leave_nothing_behind() {
    let image = image(&tmp_dir().join("image"));
    let mut chart = ChartCluster::start(V1_37, &tmp_dir(), &NODES, image).await;
    let (repository, tag) = image.name.rsplit_once(':').expect("<repository>:<tag>");
    let next_tag = format!("{tag}-next");
    for node in &chart.nodes {
        node.tag_image(&image.name, &format!("{repository}:{next_tag}"));
    }
    let values = json!({"resources": {"computeDomains": {"enabled": true}}});
    chart.install(&image.name, &values);
    eventually_within(
        "a ready plugin on each node",
        SLOW_WAIT,
        || async {
            let ready = chart.pods_of("kubelet-plugin").await.into_iter().filter(is_ready).count();
            (ready == NODES.len()).then_some(())
        },
        || chart.logs(),
    )
    .await;

    // docs/claims.md's first claim, its pod running on and on (the signal
    // never comes; `Always`: a reboot starts it again).
    let (template, mut pod) = first_claim(&chart.cluster.dir().join("signal"));
    pod["spec"]["restartPolicy"] = json!("Always");
    pod["spec"]["terminationGracePeriodSeconds"] = json!(1);
    create_all(&chart.cluster.admin(), &[template]).await.unwrap_or_else(|e| panic!("{e}"));
    let first = start_pod(&chart, &pod, "first").await;

    // 1. Upgrade to the second tag, then roll back to the first.
    let chart_dir = integration_tests::workspace_root().join("charts/gpu-dra-driver").display().to_string();
    let set_tag = format!("image.tag={next_tag}");
    let upgrade = ["upgrade", RELEASE, &chart_dir, "-n", NAMESPACE, "--reuse-values", "--set", &set_tag];
    let second = roll(&chart, &upgrade, &next_tag, first, &pod, "second").await;
    let rollback = ["rollback", RELEASE, "1", "-n", NAMESPACE];
    let third = roll(&chart, &rollback, tag, second, &pod, "third").await;

    // 2. A reboot of the pod's node: the spec goes with /run, the record
    // stays; the pod's container starts again with its devices, from the
    // spec the plugin wrote again.
    let spec = std::fs::read(third.spec(&chart)).unwrap_or_else(|e| panic!("the spec: {e}"));
    let record = std::fs::read(third.record(&chart)).unwrap_or_else(|e| panic!("the record: {e}"));
    let node = third.node.clone();
    chart.reboot(&node);
    let pods: Api<Pod> = Api::namespaced(chart.cluster.admin(), "default");
    let restarted = runs_again(&chart, &third, "after the reboot").await;
    assert!(restarted.restart_count >= 1, "{restarted:?}");
    assert_eq!(std::fs::read(third.spec(&chart)).ok(), Some(spec), "the spec written again differs");
    assert_eq!(std::fs::read(third.record(&chart)).ok(), Some(record), "the record changed");
    let plugin_logs = chart.pod_logs("kubelet-plugin", usize::MAX);
    assert!(plugin_logs.contains("rewritten=1"), "no plugin wrote the spec again:\n{plugin_logs}");
    let third = ClaimPod { container_id: restarted.container_id.clone().unwrap_or_default(), ..third };

    // The spec gone again, the kubelet restarted (it forgets which claims
    // it prepared), the plugin running on, and then the pod's sandbox and
    // container killed: the kubelet prepares the claim again before it
    // makes the new sandbox, and the running plugin, whose record says
    // prepared, writes the spec again (not its start-up: it did not
    // restart). Else the container could not start (kubernetes#141433).
    let plugin_container = |pods: Vec<Pod>| {
        let on_node = pods.into_iter().find(|p| node_name(p) == node)?;
        container(&on_node)?.container_id.clone()
    };
    let plugin_before = plugin_container(chart.pods_of("kubelet-plugin").await);
    let spec = std::fs::read(third.spec(&chart)).unwrap_or_else(|e| panic!("the spec: {e}"));
    std::fs::remove_file(third.spec(&chart)).unwrap_or_else(|e| panic!("the spec: {e}"));
    chart.restart_kubelet(&node);
    chart.node(&node).kill_pod(&third.uid);
    let restarted = runs_again(&chart, &third, "after its sandbox died").await;
    assert_eq!(std::fs::read(third.spec(&chart)).ok(), Some(spec), "the spec written again differs");
    let plugin_logs = chart.pod_logs("kubelet-plugin", usize::MAX);
    assert!(plugin_logs.contains("the CDI spec of a prepared claim was missing; written again"), "{plugin_logs}");
    assert_eq!(plugin_container(chart.pods_of("kubelet-plugin").await), plugin_before, "the plugin restarted");
    let third = ClaimPod { container_id: restarted.container_id.clone().unwrap_or_default(), ..third };

    // 3. Uninstall with the claim prepared and its pod running: the
    // slices and sockets go; the pod runs on, with its spec and record;
    // the CRD stays.
    let crds: Api<CustomResourceDefinition> = Api::all(chart.cluster.admin());
    assert!(crds.get_opt(CRD).await.ok().flatten().is_some(), "the install made no {CRD}");
    chart.helm(&["uninstall", RELEASE, "-n", NAMESPACE]);
    uninstalled(&chart).await;
    for node in NODES {
        let prepared: Vec<&str> = if node == third.node { vec![third.claim_uid.as_str()] } else { vec![] };
        assert_eq!(leftovers(&chart, node), kept_after_uninstall(&prepared), "on {node}");
    }
    let pod = pods.get(&third.pod).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(running_container(&pod).and_then(|c| c.container_id.clone()), Some(third.container_id.clone()));
    assert!(crds.get_opt(CRD).await.ok().flatten().is_some(), "helm uninstall deleted {CRD}");

    // The pod deleted without the driver: its container stops, its claim
    // stays prepared (nothing can unprepare it) and the pod waits.
    pods.delete(&third.pod, &DeleteParams::default()).await.unwrap_or_else(|e| panic!("{e}"));
    eventually(
        "the pod's container to stop",
        || async {
            let pod = pods.get(&third.pod).await.ok()?;
            let stopped = container(&pod)?.state.as_ref()?.terminated.is_some();
            stopped.then_some(())
        },
        || chart.logs(),
    )
    .await;
    assert!(third.spec(&chart).exists() && third.record(&chart).exists(), "unprepared without a driver?");
    // The next install's plugin unprepares it, and the pod goes.
    chart.install(&image.name, &values);
    unprepared(&chart, &third).await;

    // 4. Uninstall with nothing prepared: nothing of ours but the lock;
    // the CRD, the namespace and the controller's Lease in it stay.
    chart.helm(&["uninstall", RELEASE, "-n", NAMESPACE]);
    uninstalled(&chart).await;
    for node in NODES {
        assert_eq!(leftovers(&chart, node), kept_after_uninstall(&[]), "on {node}");
    }
    assert!(crds.get_opt(CRD).await.ok().flatten().is_some(), "helm uninstall deleted {CRD}");
    let namespaces: Api<Namespace> = Api::all(chart.cluster.admin());
    assert!(namespaces.get_opt(NAMESPACE).await.ok().flatten().is_some(), "the namespace went");
    let leases: Api<Lease> = Api::namespaced(chart.cluster.admin(), NAMESPACE);
    assert!(leases.get_opt(CONTROLLER_LEASE).await.ok().flatten().is_some(), "the controller's Lease went");
}
