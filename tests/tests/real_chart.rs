//! The chart as users install it, its pods on two real nodes: the image
//! `image/build.sh` writes (the binaries the other tests run, see
//! `integration_tests::image`) imported into the node's containerd with
//! `ctr -n k8s.io images import` on each, then `helm install` by the real `helm`
//! (v4, `tests/kube-bins/helm`) with the README's "Try it on kind" values
//! against the real control plane (1.34 and 1.37). The real kubelets start the
//! plugin as the DaemonSet's pods and the controller as the Deployment's
//! two replicas (one leads; the other takes over when it goes);
//! the plugin registers from inside its container through the chart's
//! host mounts and publishes its slices; docs/claims.md's first claim runs in
//! a real container with what our CDI spec gives it; an impossible claim
//! gets the controller's explanation; the real API server calls the
//! controller's webhook through the chart's Service.
//!
//! The two nodes share this machine: each node's kubelet and containerd
//! run in a mount namespace of their own where `/var/lib/kubelet` and
//! `/var/run/cdi` are that node's (the chart mounts the same host paths on
//! every node: its defaults are used as they are), and each has an
//! address of its own on `lo` (`--node-ip`).
//!
//! Network: the nodes have no CNI, so both workloads run on the host's
//! network (`kubeletPlugin.hostNetwork`, `controller.hostNetwork`), each
//! pod listening on its node's address only (`$(POD_IP)`), on ports the
//! test chooses; they reach the API server on loopback
//! (`KUBERNETES_SERVICE_HOST`, through the chart's `env` values: there is
//! no kube-proxy for the `kubernetes` Service), and the API server reaches
//! the webhook at a node's address, which its EndpointSlice holds
//! (`--enable-aggregator-routing`). Nothing leaves the machine.
//! Needs root, as `real_node` does.

use std::path::{Path, PathBuf};

use integration_tests::helm::{self, NAMESPACE};
use integration_tests::real_chart::{
    CONTROLLER_LEASE, ChartCluster, env_edits, env_section, first_claim, image, is_ready, name, node_name,
};
use integration_tests::real_cluster::driver::{event_about, eventually, yaml_documents};
use integration_tests::real_cluster::node::TEST_IMAGE;
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::{Release, V1_34, V1_37};
use integration_tests::{run, workspace_root};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

const NODES: [&str; 2] = ["chart-node-a", "chart-node-b"];

fn tmp_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("real-chart")
}

/// The `kubectl` commands NOTES.txt prints, as words, without their
/// trailing comments.
fn notes_commands(notes: &str) -> Vec<Vec<String>> {
    notes
        .lines()
        .map(|l| l.split(" # ").next().unwrap_or_default().trim())
        .filter(|l| l.starts_with("kubectl "))
        .map(|l| l.split_whitespace().skip(1).map(str::to_string).collect())
        .collect()
}

async fn the_chart_installed_by_helm_runs_its_pods_on_two_real_nodes(release: Release) {
    let image = image(&tmp_dir().join("image"));
    let chart = ChartCluster::start(release, &tmp_dir(), &NODES, image).await;
    let (cluster, nodes) = (&chart.cluster, &chart.nodes);
    let node_of = |name: &str| chart.node(name);
    let notes = chart.install(&image.name, &json!({}));
    let pod_logs = |component: &str, lines: usize| chart.pod_logs(component, lines);
    let logs = || chart.logs();
    let pods_of = |component: &'static str| chart.pods_of(component);

    // The plugin: the DaemonSet's pod runs and is ready on each node, has
    // registered with its kubelet and published the fake inventory.
    let plugins = eventually(
        "a ready plugin on each node",
        || async {
            let ready: Vec<Pod> = pods_of("kubelet-plugin").await.into_iter().filter(is_ready).collect();
            (ready.len() == NODES.len()).then_some(ready)
        },
        logs,
    )
    .await;
    let mut on: Vec<String> = plugins.iter().map(node_name).collect();
    on.sort();
    assert_eq!(on, NODES, "one plugin per node");
    let slices: Api<ResourceSlice> = Api::all(cluster.admin());
    for node in nodes {
        let published = eventually(
            "the plugin's slices",
            || async {
                let selector = format!("spec.nodeName={}", node.name());
                let list = slices.list(&ListParams::default().fields(&selector)).await.ok()?;
                let devices: usize = list.items.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum();
                (devices > 0).then_some(devices)
            },
            logs,
        )
        .await;
        assert_eq!(published, 8, "the README's fake inventory is eight H100s, on {}", node.name());
        let registration = node.registry_dir().join("gpu.nvidia.com-reg.sock");
        assert!(registration.exists(), "no registration socket {}\n{}", registration.display(), logs());
    }

    // The controller: both replicas run, one on each node (their ports
    // are their nodes'); one leads; when its pod is deleted, the other
    // takes the Lease over.
    let controllers = eventually(
        "two ready controllers",
        || async {
            let ready: Vec<Pod> = pods_of("controller").await.into_iter().filter(is_ready).collect();
            (ready.len() == 2).then_some(ready)
        },
        logs,
    )
    .await;
    assert_ne!(node_name(&controllers[0]), node_name(&controllers[1]), "the replicas share a node");
    let leases: Api<Lease> = Api::namespaced(cluster.admin(), NAMESPACE);
    let holder = || async { leases.get(CONTROLLER_LEASE).await.ok()?.spec?.holder_identity };
    let leader = eventually("the controller's Lease", holder, logs).await;
    // The identity is the pod's name and a suffix of the process's.
    let leads = |pod: &Pod, identity: &str| identity.starts_with(&format!("{}-", name(pod)));
    let (leading, other): (Vec<&Pod>, Vec<&Pod>) = controllers.iter().partition(|p| leads(p, &leader));
    assert_eq!((leading.len(), other.len()), (1, 1), "{leader} is not one of the replicas");
    let pods_api: Api<Pod> = Api::namespaced(cluster.admin(), NAMESPACE);
    pods_api.delete(&name(leading[0]), &DeleteParams::default()).await.unwrap();
    eventually(
        "the other replica to take the Lease over",
        || async { holder().await.filter(|h| leads(other[0], h)) },
        logs,
    )
    .await;

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

    // docs/claims.md's first claim in a real container: what CDI gave it.
    let signal = cluster.dir().join("signal");
    std::fs::create_dir_all(&signal).unwrap();
    let (template, pod) = first_claim(&signal);
    create_all(&cluster.admin(), &[template, pod.clone()]).await.unwrap_or_else(|e| panic!("{e}"));
    let pods: Api<Pod> = Api::namespaced(cluster.admin(), "default");
    let pod_name = pod["metadata"]["name"].as_str().unwrap();
    let container = pod["spec"]["containers"][0]["name"].as_str().unwrap();
    let uid = pods.get(pod_name).await.unwrap().metadata.uid.unwrap();
    let node =
        eventually("the pod to be scheduled", || async { pods.get(pod_name).await.ok()?.spec?.node_name }, logs).await;
    let node = node_of(&node);
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
    assert_eq!(results[0].pool, node.name());
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
    let event = event_about(cluster, "default", "eight-b200", "Unsatisfiable", logs).await;
    assert_eq!(event.reporting_controller.as_deref(), Some("gpu.nvidia.com/controller"));

    // Every kubectl command NOTES.txt prints runs, against this cluster,
    // in a real kubectl, with its placeholders filled in as a user would:
    // the impossible claim, the first node, the plugin pod the command
    // before printed. What a user reads there is there.
    let kubectl = helm::kubectl(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let commands = notes_commands(&notes);
    assert_eq!(commands.len(), 6, "{notes}");
    let mut fill =
        vec![("<namespace>", "default".to_string()), ("<claim>", "eight-b200".into()), ("<node>", NODES[0].into())];
    let mut printed = Vec::new();
    for command in commands {
        let mut args = vec!["--kubeconfig".to_string(), cluster.admin_kubeconfig().display().to_string()];
        args.extend(command.iter().map(|word| fill.iter().fold(word.clone(), |w, (p, v)| w.replace(p, v))));
        assert!(!args.iter().any(|a| a.contains('<')), "a placeholder the test does not know: {args:?}");
        let borrowed: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&kubectl, &borrowed, None);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "kubectl {args:?}: {stdout}{}\n{}", String::from_utf8_lossy(&out.stderr), logs());
        eprintln!("---- kubectl {}\n{stdout}", args[2..].join(" "));
        if args.contains(&"name".to_string()) {
            fill.push(("<plugin-pod>", stdout.trim().to_string()));
        }
        printed.push(stdout);
    }
    let described = &printed[3];
    assert!(described.contains("Unsatisfiable"), "describe shows no explanation: {described}");
    let plugin_log = &printed[5];
    assert!(plugin_log.contains("registered with the kubelet"), "{plugin_log}");

    // Neither workload met an error in its pod.
    for component in ["kubelet-plugin", "controller"] {
        let log = pod_logs(component, usize::MAX);
        assert!(!log.is_empty(), "no log of the {component} pods");
        assert!(!log.contains("ERROR"), "the {component} pods logged an error:\n{log}");
    }
}

macro_rules! on_release {
    ($module:ident, $release:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread")]
            async fn the_chart_installed_by_helm_runs_its_pods_on_two_real_nodes() {
                super::the_chart_installed_by_helm_runs_its_pods_on_two_real_nodes($release).await
            }
        }
    };
}

on_release!(k8s_1_34, V1_34);
on_release!(k8s_1_37, V1_37);
