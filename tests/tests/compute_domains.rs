//! ComputeDomains through the whole system (see
//! [`integration_tests::compute_domain_cluster`]): a domain of four nodes,
//! one beyond its clique, health, and a killed node agent.

use std::time::{Duration, Instant};

use gpu_dra_driver::compute_domain::api::{ComputeDomain, Readiness};
use integration_tests::compute_domain_cluster::{
    CD_DRIVER, Cluster, Node, example_documents, example_domain, one_node_domain, wait_until,
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kubelet_proto::dra_v1::Claim;

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
    let seen = started.elapsed();
    println!("node NotReady in the domain status after {seen:?}");
    // Within seconds: a 200 ms health interval and the controller's
    // reaction, with a generous margin (not a benchmark).
    assert!(seen < Duration::from_secs(10), "NotReady after {seen:?}");
    let extra = cluster.allocated_channel("late-worker", "gb200-2");
    let asked = Instant::now();
    let error = nodes[2].prepare(rt, std::slice::from_ref(&extra)).remove(0).unwrap_err();
    // Refused at once, not after the 20 s ready wait.
    assert!(asked.elapsed() < Duration::from_secs(5), "refused after {:?}", asked.elapsed());
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
    let (cluster, mut node, claim) = one_node_domain();
    let rt = &cluster.rt;

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

/// `--gpus=false` (the chart's ComputeDomain-only install,
/// `resources.gpus.enabled=false`): the node agent registers and publishes
/// the compute-domain driver only, and its channels prepare as usual.
#[test]
fn a_node_agent_without_the_gpu_driver_serves_compute_domains_alone() {
    let cluster = Cluster::start();
    let node = Node::start_with(&cluster.server, &cluster.rt, 0, 1, 20_000, &["--gpus=false"]);
    let logs = || format!("controller:\n{}\nnode:\n{}", cluster.controller.log(), node.process.log());
    cluster.apply_domain(1);
    wait_until("the domain's template", || cluster.template().is_some(), logs);
    let channel = cluster.allocated_channel("worker-0", "gb200-0");
    wait_until(
        "the node in the domain",
        || cluster.domain().and_then(|d| d.status).is_some_and(|s| s.nodes.len() == 1),
        logs,
    );
    let devices = node.prepare(&cluster.rt, std::slice::from_ref(&channel)).remove(0);
    assert_eq!(
        devices.unwrap_or_else(|e| panic!("{e}\n{}", logs())),
        [format!("k8s.{CD_DRIVER}/claim={}-channel-0", channel.uid)]
    );

    let slices = || -> Vec<ResourceSlice> { cluster.server.list(None, "").unwrap() };
    wait_until("the compute-domain slices", || !slices().is_empty(), logs);
    let slices = slices();
    let drivers: std::collections::BTreeSet<&str> = slices.iter().map(|s| s.spec.driver.as_str()).collect();
    assert_eq!(drivers, [CD_DRIVER].into(), "{slices:?}");
    let sockets = node.files(&node.dirs.registry);
    assert!(sockets.iter().any(|s| s.starts_with(CD_DRIVER)), "{sockets:?}");
    assert!(!sockets.iter().any(|s| s.starts_with("gpu.nvidia.com")), "no GPU registration: {sockets:?}");
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

/// One ComputeDomain the code cannot hold (`spec.numNodes` 4294967296, past
/// the `u32` it is read into) beside a good one: the good one is
/// reconciled and its channel prepares, the bad one gets one Warning Event
/// naming the field and the fix, and neither watch fails for it (kube's
/// watcher fails a whole list on one undecodable object).
///
/// The stand-in stores the object as given, as a real API server does
/// when its CRD has no bound on the field: an object stored before the
/// chart's CRD had `maximum` (or under an older chart's CRD) still reaches
/// the watches. A real server with the current CRD refuses it at admission.
#[test]
fn an_undecodable_domain_is_reported_on_itself_and_the_others_are_served() {
    // Stored before the controller and the node agent start, so that it is
    // in their first list (a watch event that does not decode is skipped by
    // kube's watcher; a list that does not decode fails whole).
    let huge = serde_json::json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"namespace": "default", "name": "huge"},
        "spec": {"numNodes": 4_294_967_296_u64, "channel": {"resourceClaimTemplate": {"name": "huge-channel"}}}
    });
    let cluster = Cluster::start_over(&[huge]);
    let node = Node::start(&cluster.server, &cluster.rt, 0, 1, 20_000);
    let logs = || format!("controller:\n{}\nnode:\n{}", cluster.controller.log(), node.process.log());
    cluster.apply_domain(1);

    wait_until("the good domain's template", || cluster.template().is_some(), logs);
    let channel = cluster.allocated_channel("worker-0", "gb200-0");
    wait_until(
        "the node in the good domain",
        || cluster.domain().and_then(|d| d.status).is_some_and(|s| s.nodes.len() == 1),
        logs,
    );
    let devices = node.prepare(&cluster.rt, std::slice::from_ref(&channel)).remove(0);
    assert!(devices.is_ok(), "{devices:?}\n{}", logs());

    let about_huge = || -> Vec<k8s_openapi::api::events::v1::Event> {
        let events: Vec<k8s_openapi::api::events::v1::Event> = cluster.server.list(Some("default"), "").unwrap();
        events.into_iter().filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("huge")).collect()
    };
    wait_until("the bad domain's Event", || !about_huge().is_empty(), logs);
    let events = about_huge();
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!((event.type_.as_deref(), event.reason.as_deref()), (Some("Warning"), Some("InvalidSpec")));
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("ComputeDomain"));
    let note = event.note.as_deref().unwrap_or_default();
    assert!(note.contains("spec.numNodes") && note.contains("4294967296"), "{note}");
    assert!(note.contains("delete it and create it again"), "{note}");
    assert!(
        cluster.server.get::<ResourceClaimTemplate>(Some("default"), "huge-channel").is_err(),
        "nothing is done for the bad domain"
    );
    assert!(node.process.log().contains("default/huge"), "the node agent logs it\n{}", node.process.log());
}
