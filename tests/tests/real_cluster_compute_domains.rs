//! ComputeDomains on the real control plane of the oldest and the newest
//! supported release: NVIDIA's example (`examples/compute-domain/
//! four-node-job.yaml`, applied unchanged) on four fake GB200 trays of one
//! NVLink clique, each running our node agent with `--compute-domains` over
//! a fake driver root (fake `nvidia-imex`), and our controller with
//! `--compute-domains`, all on their own ServiceAccount tokens under the
//! chart's RBAC. The real kube-controller-manager makes the pods' claims
//! from the template our controller creates, the real kube-scheduler
//! allocates them; with no kubelet, the test prepares and unprepares each
//! bound pod's claims through the node's plugin sockets as the kubelet
//! would, and finishes the pods the API server leaves terminating.
//!
//! Then a domain asking more nodes than its clique has, with pods on two
//! cliques: explained by an Event, and the other clique's node never joins;
//! and a domain naming a template the user already has: explained, and
//! that template left alone when the domain goes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpu_dra_driver::compute_domain::FINALIZER;
use gpu_dra_driver::compute_domain::api::{ComputeDomain, Readiness};
use integration_tests::imex_host::CHANNEL_DEVICE;
use integration_tests::real_cluster::driver::{
    allocation, chart, eventually, install, start_controller, yaml_documents,
};
use integration_tests::real_cluster::objects::create_all;
use integration_tests::real_cluster::tray::Tray;
use integration_tests::real_cluster::{Cluster, Release, V1_34, V1_37};
use integration_tests::workspace_root;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PropagationPolicy};
use serde_json::{Value, json};

const NAMESPACE: &str = "default";

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The example GB200 tray of clique 1 or 2.
fn gb200(clique: u32) -> PathBuf {
    let file = if clique == 1 { "gb200-clique.yaml" } else { "gb200-clique-2.yaml" };
    workspace_root().join("examples/inventories").join(file)
}

struct Scene<'a> {
    cluster: &'a Cluster,
    trays: Vec<Tray>,
    controller: integration_tests::controller_process::ControllerProcess,
    /// Whether the release serves the channel's binding conditions and its
    /// scheduler waits for them (`DRADeviceBindingConditions`, beta and on
    /// since 1.36; dropped from the slice on 1.34 defaults).
    binding: bool,
}

impl Scene<'_> {
    fn logs(&self) -> String {
        let trays: Vec<String> = self.trays.iter().map(Tray::log).collect();
        format!("{}\n---- controller\n{}\n{}", self.cluster.logs(), self.controller.log(), trays.join("\n"))
    }

    fn tray(&self, node: &str) -> &Tray {
        self.trays.iter().find(|t| t.name() == node).unwrap_or_else(|| panic!("no tray {node}"))
    }

    fn domains(&self) -> Api<ComputeDomain> {
        Api::namespaced(self.cluster.admin(), NAMESPACE)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cluster.admin(), NAMESPACE)
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.cluster.admin(), NAMESPACE)
    }

    async fn domain(&self, name: &str) -> Option<ComputeDomain> {
        self.domains().get_opt(name).await.ok().flatten()
    }

    /// Waits until `pod` is bound and every one of its claims is made and
    /// allocated (the kubelet's precondition for preparing them).
    async fn scheduled(&self, pod: &str) -> (String, Vec<ResourceClaim>) {
        eventually(
            &format!("pod {pod} bound with its claims allocated"),
            || async {
                let found = self.pods().get(pod).await.ok()?;
                let spec = found.spec.as_ref()?;
                let node = spec.node_name.clone()?;
                // A claim the pod names, or the one made from its template
                // (recorded in the pod's status under the entry's name).
                let made = found.status.as_ref().and_then(|s| s.resource_claim_statuses.clone()).unwrap_or_default();
                let mut claims = Vec::new();
                for entry in spec.resource_claims.iter().flatten() {
                    let name = match &entry.resource_claim_name {
                        Some(name) => name.clone(),
                        None => made.iter().find(|s| s.name == entry.name)?.resource_claim_name.clone()?,
                    };
                    claims.push(self.claims().get(&name).await.ok()?);
                }
                claims.iter().all(|c| !allocation(c).is_empty()).then_some((node, claims))
            },
            || self.logs(),
        )
        .await
    }

    /// The kubelet's part for a pod bound to `node`: prepare each claim
    /// with its driver, then report the pod running.
    async fn run_pod(&self, pod: &str, node: &str, claims: &[ResourceClaim]) {
        for claim in claims {
            self.tray(node).prepare(claim).await.unwrap_or_else(|e| {
                panic!("preparing {:?} for {pod} on {node}: {e}\n{}", claim.metadata.name, self.logs())
            });
        }
        let running = json!({"status": {"phase": "Running"}});
        self.pods().patch_status(pod, &PatchParams::default(), &Patch::Merge(&running)).await.unwrap();
    }

    /// The kubelet's part for pods the API server marked for deletion:
    /// unprepare their claims, report them finished and remove them.
    async fn finish_terminating_pods(&self, running: &[(String, String, Vec<ResourceClaim>)]) {
        for (pod, node, claims) in running {
            eventually(
                &format!("pod {pod} marked for deletion"),
                || async {
                    let found = self.pods().get_opt(pod).await.ok()?;
                    found.is_none_or(|p| p.metadata.deletion_timestamp.is_some()).then_some(())
                },
                || self.logs(),
            )
            .await;
            for claim in claims {
                self.tray(node).unprepare(claim).await;
            }
            let failed = json!({"status": {"phase": "Failed"}});
            let finished = self.pods().patch_status(pod, &PatchParams::default(), &Patch::Merge(&failed)).await;
            gone_or_done(finished.map(drop), pod);
            let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
            gone_or_done(self.pods().delete(pod, &now).await.map(drop), pod);
        }
    }

    /// Deletes the domain and waits until it, its template and every claim
    /// of the namespace are gone (the real garbage collector and
    /// resourceclaim controller, our controller's finalizer).
    async fn delete_domain(&self, name: &str, template: &str) {
        self.domains().delete(name, &DeleteParams::default()).await.unwrap();
        let templates: Api<ResourceClaimTemplate> = Api::namespaced(self.cluster.admin(), NAMESPACE);
        eventually(
            &format!("domain {name}, its template and the claims gone"),
            || async {
                let domain = self.domain(name).await;
                let template = templates.get_opt(template).await.ok()?;
                let claims = self.claims().list(&ListParams::default()).await.ok()?;
                let pods = self.pods().list(&ListParams::default()).await.ok()?;
                (domain.is_none() && template.is_none() && claims.items.is_empty() && pods.items.is_empty())
                    .then_some(())
            },
            || self.logs(),
        )
        .await;
    }

    /// Nothing of `uids` (the domain's, its claims') remains on any tray:
    /// no daemon, no channel device node, no CDI spec or state file.
    fn assert_nothing_left(&self, uids: &[String]) {
        for tray in &self.trays {
            let imex = &tray.imex;
            assert_eq!(imex.daemons(), 0, "{}: a daemon outlived the domain: {:?}", tray.name(), imex.imex_log());
            assert!(!imex.channel_node().exists(), "{}: the channel device node remains", tray.name());
            let left = tray.files_mentioning(uids);
            assert!(left.is_empty(), "{}: files remain: {left:?}", tray.name());
            assert_eq!(tray.cdi_files(), Vec::<PathBuf>::new(), "{}: CDI specs remain", tray.name());
        }
    }

    /// Every Event note about pod `name` (the scheduler's among them).
    async fn pod_notes(&self, name: &str) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.cluster.admin(), NAMESPACE);
        let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        list.into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|e| e.note)
            .collect()
    }

    /// The Warning notes our controller wrote on domain `name`.
    async fn warnings(&self, name: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.cluster.admin(), NAMESPACE);
        let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        list.into_iter()
            .filter(|e| {
                let regarding = e.regarding.as_ref();
                regarding.and_then(|r| r.kind.as_deref()) == Some("ComputeDomain")
                    && regarding.and_then(|r| r.name.as_deref()) == Some(name)
            })
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }
}

/// A write to a pod that may already be gone (its owner's deletion got there first).
fn gone_or_done(result: kube::Result<()>, pod: &str) {
    match result {
        Ok(()) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => panic!("pod {pod}: {e}"),
    }
}

/// NVIDIA's example on four trays of one clique: Ready with each node,
/// each channel prepared with its device node, the IMEX peers the four
/// addresses; then the workload and the domain go and leave nothing.
async fn four_trays_form_a_domain(scene: &Scene<'_>) {
    let example = yaml_documents(&workspace_root().join("examples/compute-domain/four-node-job.yaml"));
    create_all(&scene.cluster.admin(), &example)
        .await
        .unwrap_or_else(|e| panic!("the real API server refused the example: {e}\n{}", scene.logs()));
    let domain = scene.domain("training").await.unwrap();
    let domain_uid = domain.metadata.uid.clone().unwrap();

    let pods: Vec<String> = eventually(
        "the Job's four pods",
        || async {
            let list = scene.pods().list(&ListParams::default().labels("app=training")).await.ok()?;
            let names: Vec<String> = list.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
            (names.len() == 4).then_some(names)
        },
        || scene.logs(),
    )
    .await;
    let mut running = Vec::new();
    for pod in &pods {
        let (node, claims) = scene.scheduled(pod).await;
        if scene.binding {
            // Bound only once the node's IMEX daemon was ready: it runs
            // before the kubelet's prepare, and the channel says Ready.
            let tray = scene.tray(&node);
            assert_eq!(
                tray.imex.daemons(),
                1,
                "{pod} bound to {node} before its daemon ran: {:?}",
                tray.imex.imex_log()
            );
            let channel = claims.iter().find(|c| !binding_conditions(c).is_empty()).unwrap_or_else(|| {
                panic!("{pod}: no channel allocated with binding conditions: {claims:?}\n{}", scene.logs())
            });
            assert_eq!(binding_conditions(channel), ["Ready"]);
            assert_eq!(device_conditions(channel), [("Ready".to_owned(), "True".to_owned())], "{channel:?}");
        }
        scene.run_pod(pod, &node, &claims).await;
        running.push((pod.clone(), node, claims));
    }
    let nodes: BTreeSet<&str> = running.iter().map(|(_, node, _)| node.as_str()).collect();
    assert_eq!(nodes.len(), 4, "one pod per tray: {running:?}");

    let status = eventually(
        "the domain Ready",
        || async {
            let status = scene.domain("training").await?.status?;
            (status.status == Readiness::Ready).then_some(status)
        },
        || scene.logs(),
    )
    .await;
    let listed: BTreeSet<&str> = status.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(listed, nodes, "{status:?}");
    for node in &status.nodes {
        let tray = scene.tray(&node.name);
        assert_eq!((node.status, node.ip_address.as_str()), (Readiness::Ready, tray.address.as_str()), "{node:?}");
        assert!(node.clique_id.ends_with(".1"), "{node:?}");
    }
    let domain = scene.domain("training").await.unwrap();
    assert!(domain.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER), "{:?}", domain.metadata);

    // Each channel: a CDI spec with the channel's device node; each
    // tray's IMEX daemon was given the four addresses (in the order of
    // the domain's node indexes, which follow who joined first).
    let peers: BTreeSet<String> = scene.trays.iter().map(|t| t.address.clone()).collect();
    let mut uids = vec![domain_uid];
    for (pod, node, claims) in &running {
        let tray = scene.tray(node);
        let channel = claims
            .iter()
            .find(|c| allocation(c).iter().any(|(_, device)| device.starts_with("channel")))
            .unwrap_or_else(|| panic!("{pod} has no channel claim: {claims:?}"));
        let uid = channel.metadata.uid.clone().unwrap();
        let spec = tray.cdi_spec(&uid).unwrap_or_else(|| panic!("{pod}: no CDI spec for its channel claim"));
        let paths: Vec<&str> = spec["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|d| d["containerEdits"]["deviceNodes"].as_array().into_iter().flatten())
            .filter_map(|n| n["path"].as_str())
            .collect();
        assert!(paths.contains(&CHANNEL_DEVICE), "{pod}: {spec}");
        assert!(tray.imex.channel_node().exists(), "{node}: no channel device node");
        // A daemon that started before the last node joined is told the
        // new list (SIGUSR1) as the agent sees the domain change.
        eventually(
            &format!("{node}'s IMEX daemon configured with the four addresses"),
            || async { (last_peers(&tray.imex.imex_log()).as_ref() == Some(&peers)).then_some(()) },
            || format!("{:?}\n{}", tray.imex.imex_log(), scene.logs()),
        )
        .await;
        let log = tray.imex.imex_log();
        assert_eq!(tray.imex.daemons(), 1, "{node}: one daemon: {log:?}");
        uids.extend(claims.iter().filter_map(|c| c.metadata.uid.clone()));
    }

    // The workload goes: the Job and, through the garbage collector, its
    // pods; the kubelet's part unprepares. Then the domain.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(scene.cluster.admin(), NAMESPACE);
    let background =
        DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..DeleteParams::default() };
    jobs.delete("training", &background).await.unwrap();
    scene.finish_terminating_pods(&running).await;
    scene.delete_domain("training", "training-channel").await;
    scene.assert_nothing_left(&uids);
    for tray in &scene.trays {
        let log = tray.imex.imex_log();
        assert!(log.last().is_some_and(|l| l.starts_with("stop ")), "{}: {log:?}", tray.name());
    }
    // The four-gpus template is the user's, left as applied.
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(scene.cluster.admin(), NAMESPACE);
    templates.delete("four-gpus", &DeleteParams::default()).await.unwrap();
}

/// The binding conditions of `claim`'s allocated channel.
fn binding_conditions(claim: &ResourceClaim) -> Vec<String> {
    let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
    let channel =
        results.and_then(|d| d.results.as_ref()).into_iter().flatten().find(|r| r.device.starts_with("channel"));
    channel.and_then(|r| r.binding_conditions.clone()).unwrap_or_default()
}

/// (type, status) of each condition of `claim`'s channel entry in
/// `status.devices`, read from the API server now.
fn device_conditions(claim: &ResourceClaim) -> Vec<(String, String)> {
    let devices = claim.status.as_ref().and_then(|s| s.devices.as_ref());
    let channel = devices.into_iter().flatten().find(|d| d.device.starts_with("channel"));
    channel
        .and_then(|d| d.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect()
}

/// Whether the trays' compute-domain slices keep the channel's binding
/// conditions as the server stored them.
async fn serves_binding_conditions(cluster: &Cluster) -> bool {
    let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(cluster.admin());
    let selector = format!("spec.driver={}", gpu_dra_driver::compute_domain::DRIVER_NAME);
    let list = slices.list(&ListParams::default().fields(&selector)).await.unwrap();
    list.items.iter().flat_map(|s| s.spec.devices.iter().flatten()).any(|d| d.binding_conditions.is_some())
}

/// The peers a fake daemon was last given (`start|reload <cfg> <peers...>`).
fn last_peers(log: &[String]) -> Option<BTreeSet<String>> {
    let line = log.iter().rev().find(|l| l.starts_with("start ") || l.starts_with("reload "))?;
    Some(line.split_whitespace().skip(2).map(String::from).collect())
}

/// A pod on `node` with a channel from `template`.
fn pod_on(name: &str, node: &str, template: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "containers": [{"name": "main", "image": "registry.invalid/app", "resources": {"claims": [{"name": "imex"}]}}],
                 "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": template}]}})
}

/// A user's claim of a domain's IMEX daemon on the node it lands on.
fn daemon_claim(name: &str, domain_uid: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {
            "requests": [{"name": "daemon", "exactly": {"deviceClassName": "compute-domain-daemon.nvidia.com"}}],
            "config": [{"requests": ["daemon"], "opaque": {"driver": "compute-domain.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainDaemonConfig", "domainID": domain_uid}}}]}}})
}

/// A domain of five nodes where the clique has four, whose pods land on
/// two cliques: an Event says both, the status lists the first clique's
/// node only, and the other clique's channel is refused after the wait.
/// The first pod also holds a daemon claim, which the real scheduler
/// allocates on its node beside the channel.
async fn beyond_the_clique_is_explained(scene: &Scene<'_>, stray: &str) {
    let domain = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "wide", "namespace": NAMESPACE},
        "spec": {"numNodes": 5, "channel": {"resourceClaimTemplate": {"name": "wide-channel"}}}});
    create_all(&scene.cluster.admin(), &[domain]).await.unwrap_or_else(|e| panic!("{e}"));
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(scene.cluster.admin(), NAMESPACE);
    eventually(
        "the wide domain's template",
        || async { templates.get_opt("wide-channel").await.ok().flatten() },
        || scene.logs(),
    )
    .await;
    let first = scene.trays[0].name().to_string();
    // wide-a also holds a daemon claim of the domain (NVIDIA's daemon
    // pods' kind): prepared as the same daemon as the channel's.
    let domain_uid = scene.domain("wide").await.unwrap().metadata.uid.unwrap();
    let mut wide_a = pod_on("wide-a", &first, "wide-channel");
    wide_a["spec"]["resourceClaims"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "daemon", "resourceClaimName": "wide-daemon"}));
    let objects = [daemon_claim("wide-daemon", &domain_uid), wide_a, pod_on("wide-b", stray, "wide-channel")];
    create_all(&scene.cluster.admin(), &objects).await.unwrap_or_else(|e| panic!("{e}"));
    let (node_a, claims_a) = scene.scheduled("wide-a").await;
    assert_eq!(node_a, first);
    let daemons: Vec<_> = claims_a.iter().flat_map(allocation).filter(|(_, d)| d.starts_with("daemon")).collect();
    assert_eq!(daemons.len(), 1, "wide-a's daemon claim allocated on its node: {claims_a:?}");

    let note = eventually(
        "the wide domain explained",
        || async {
            let warnings = scene.warnings("wide").await;
            warnings.into_iter().map(|(_, note)| note).find(|note| {
                note.contains("numNodes is 5 but NVLink clique") && note.contains(&format!("{stray} (clique "))
            })
        },
        || scene.logs(),
    )
    .await;
    assert!(note.contains("has 4 nodes") && note.contains("cannot join its IMEX domain"), "{note}");
    let status = scene.domain("wide").await.unwrap().status.unwrap();
    assert_eq!(status.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), [first.as_str()], "{status:?}");
    assert_eq!(status.status, Readiness::NotReady);

    // The kubelet's part: the clique's node prepares.
    let stray_tray = scene.tray(stray);
    scene.run_pod("wide-a", &first, &claims_a).await;
    assert_eq!(scene.tray(&first).imex.daemons(), 1, "one daemon for the channel and the daemon claim");
    let claims_b = if scene.binding {
        // The stray node's channel never binds: the controller fails its
        // binding with the reason, which the scheduler reports on the pod
        // (and places it again, on the only node its selector allows).
        let note = eventually(
            "the scheduler's note that wide-b's binding failed",
            || async {
                let notes = scene.pod_notes("wide-b").await;
                notes.into_iter().find(|n| n.contains(&format!("node {stray} cannot join ComputeDomain default/wide")))
            },
            || scene.logs(),
        )
        .await;
        assert!(note.contains("ImexDaemonUnavailable"), "{note}");
        let pod = scene.pods().get("wide-b").await.unwrap();
        assert_eq!(pod.spec.and_then(|s| s.node_name), None, "never bound");
        Vec::new()
    } else {
        // Without binding conditions the pod binds, and the stray node's
        // prepare is refused with the reason after its bounded wait.
        let (node_b, claims_b) = scene.scheduled("wide-b").await;
        assert_eq!(node_b, stray);
        let error = stray_tray.prepare(&claims_b[0]).await.unwrap_err();
        assert!(error.starts_with(&format!("node {stray} has not joined ComputeDomain default/wide after")), "{error}");
        claims_b
    };
    assert!(stray_tray.imex.imex_log().is_empty(), "{:?}", stray_tray.imex.imex_log());
    assert_eq!(stray_tray.imex.daemons(), 0);

    let uids: Vec<String> = std::iter::once(scene.domain("wide").await.unwrap().metadata.uid.unwrap())
        .chain(claims_a.iter().chain(&claims_b).filter_map(|c| c.metadata.uid.clone()))
        .collect();
    for pod in ["wide-a", "wide-b"] {
        scene.pods().delete(pod, &DeleteParams::default()).await.unwrap();
    }
    let running =
        [("wide-a".to_string(), first.clone(), claims_a), ("wide-b".to_string(), stray.to_string(), claims_b)];
    scene.finish_terminating_pods(&running).await;
    scene.claims().delete("wide-daemon", &DeleteParams::default()).await.unwrap();
    scene.delete_domain("wide", "wide-channel").await;
    scene.assert_nothing_left(&uids);
}

/// A domain naming a template the user already has: explained
/// (TemplateTaken), its spec immutable, and deleting the domain leaves
/// that template alone.
async fn a_taken_template_is_explained_and_kept(scene: &Scene<'_>) {
    let objects = [
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "taken-channel", "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}),
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": "taken", "namespace": NAMESPACE},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "taken-channel"}}}}),
    ];
    create_all(&scene.cluster.admin(), &objects).await.unwrap_or_else(|e| panic!("{e}"));
    let (reason, note) = eventually(
        "the taken template explained",
        || async { scene.warnings("taken").await.into_iter().next() },
        || scene.logs(),
    )
    .await;
    assert_eq!(reason, "TemplateTaken", "{note}");
    assert!(note.contains("ResourceClaimTemplate taken-channel exists and is not this domain's"), "{note}");
    // The chart's CRD keeps the spec as applied (NVIDIA's rule).
    let change = json!({"spec": {"numNodes": 2}});
    let refused = scene.domains().patch("taken", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap_err();
    assert!(refused.to_string().contains("A computeDomain.spec is immutable"), "{refused}");
    scene.domains().delete("taken", &DeleteParams::default()).await.unwrap();
    eventually(
        "the domain released",
        || async { scene.domain("taken").await.is_none().then_some(()) },
        || scene.logs(),
    )
    .await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(scene.cluster.admin(), NAMESPACE);
    let kept = templates.get_opt("taken-channel").await.unwrap();
    assert!(kept.is_some_and(|t| t.metadata.deletion_timestamp.is_none()), "the user's template was deleted");
    templates.delete("taken-channel", &DeleteParams::default()).await.unwrap();
}

async fn compute_domains_on_the_real_control_plane(release: Release) {
    let started = Instant::now();
    let cluster = Cluster::start(release).await;
    let values = json!({"webhook": {"enabled": false}, "resources": {"computeDomains": {"enabled": true}}});
    install(&cluster, &chart(tmp_dir(), values)).await;
    let mut trays = Vec::new();
    for i in 0..4 {
        trays.push(Tray::start(&cluster, &format!("gb200-{i}"), &gb200(1), &format!("10.0.0.{}", i + 1), 20_000).await);
    }
    let controller = start_controller(&cluster, "cd", "gb200-0", &["--compute-domains"]).await;
    let binding = serves_binding_conditions(&cluster).await;
    assert_eq!(binding, release.minor == "1.37", "{}: binding conditions served", release.describe());
    let mut scene = Scene { cluster: &cluster, trays, controller, binding };
    four_trays_form_a_domain(&scene).await;
    eprintln!(
        "{}: the four-tray domain formed and was cleaned up after {:.1} s",
        release.minor,
        started.elapsed().as_secs_f64()
    );

    // A tray of another rack (clique 2), added only now so that the Job's
    // pods could not land on it.
    let stray = Tray::start(&cluster, "gb200-rack2-0", &gb200(2), "10.0.1.1", 2_000).await;
    scene.trays.push(stray);
    beyond_the_clique_is_explained(&scene, "gb200-rack2-0").await;
    a_taken_template_is_explained_and_kept(&scene).await;
    eprintln!("{}: done after {:.1} s", release.minor, started.elapsed().as_secs_f64());
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_34_compute_domains_form_explain_and_clean_up() {
    compute_domains_on_the_real_control_plane(V1_34).await
}

#[tokio::test(flavor = "multi_thread")]
async fn k8s_1_37_compute_domains_form_explain_and_clean_up() {
    compute_domains_on_the_real_control_plane(V1_37).await
}
