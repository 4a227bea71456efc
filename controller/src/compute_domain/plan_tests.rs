use super::*;
use gpu_dra_driver::compute_domain::api::ComputeDomainSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

fn domain(num_nodes: u32) -> ComputeDomain {
    let mut d = ComputeDomain::new("default", "job", ComputeDomainSpec::with_template(num_nodes, "job-channel"));
    d.metadata.uid = Some(UID.into());
    d.metadata.finalizers = Some(vec![FINALIZER.into()]);
    d
}

fn channel(node: &str, ready: Option<bool>) -> ChannelClaim {
    ChannelClaim {
        namespace: "default".into(),
        name: format!("pod-{node}-channel"),
        domain_id: UID.into(),
        node: node.into(),
        ready,
        waiting: false,
    }
}

/// Nodes `a0..a{n}` in clique A and `b0..b{m}` in clique B, each with an address.
fn fleet(a: usize, b: usize) -> (BTreeMap<String, NodeFacts>, BTreeMap<String, usize>) {
    let mut nodes = BTreeMap::new();
    for (prefix, clique, count) in [("a", "uuid.1", a), ("b", "uuid.2", b)] {
        for i in 0..count {
            nodes.insert(
                format!("{prefix}{i}"),
                NodeFacts { address: Some(format!("10.0.{}.{i}", prefix.len())), clique: Some(clique.into()) },
            );
        }
    }
    let sizes = BTreeMap::from([("uuid.1".to_owned(), a), ("uuid.2".to_owned(), b)]);
    (nodes, sizes)
}

fn run(
    domain: &ComputeDomain,
    template: Option<&ResourceClaimTemplate>,
    channels: &[ChannelClaim],
    a: usize,
    b: usize,
) -> Plan {
    let (nodes, clique_sizes) = fleet(a, b);
    plan(&Inputs { domain, template, channels, nodes: &nodes, clique_sizes: &clique_sizes })
}

#[test]
fn a_new_domain_gets_its_finalizer_template_and_a_not_ready_status() {
    let mut d = domain(4);
    d.metadata.finalizers = None;
    let p = run(&d, None, &[], 4, 0);
    assert!(p.add_finalizer && !p.remove_finalizer);
    let TemplateAction::Create(t) = &p.template else { panic!("{p:?}") };
    assert_eq!(t.metadata.name.as_deref(), Some("job-channel"));
    assert_eq!(t.metadata.labels.as_ref().unwrap()[DOMAIN_LABEL], UID);
    assert_eq!(t.metadata.owner_references.as_ref().unwrap()[0].uid, UID);
    let devices = t.spec.as_ref().unwrap().spec.as_ref().unwrap().devices.as_ref().unwrap();
    assert_eq!(devices.requests.as_ref().unwrap()[0].exactly.as_ref().unwrap().device_class_name, CHANNEL_CLASS);
    let params = &devices.config.as_ref().unwrap()[0].opaque.as_ref().unwrap().parameters.0;
    assert_eq!(
        params,
        &serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": UID, "allocationMode": "Single"})
    );
    assert_eq!(p.status, Some(ComputeDomainStatus { status: Readiness::NotReady, nodes: vec![] }));
    assert!(p.problems.is_empty());
}

#[test]
fn four_ready_nodes_of_one_clique_make_it_ready_with_stable_indexes() {
    let d = domain(4);
    let template = workload_template(&d);
    let mut channels: Vec<ChannelClaim> = (0..4).map(|i| channel(&format!("a{i}"), Some(true))).collect();
    channels[2].ready = None;
    let p = run(&d, Some(&template), &channels, 4, 0);
    assert_eq!(p.template, TemplateAction::Keep);
    let status = p.status.unwrap();
    assert_eq!(status.status, Readiness::NotReady, "a2 has not answered yet");
    assert_eq!(status.nodes.iter().map(|n| n.index).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(status.nodes[2].status, Readiness::NotReady);
    channels[2].ready = Some(true);
    let mut d = d;
    d.status = Some(status);
    let status = run(&d, Some(&template), &channels, 4, 0).status.unwrap();
    assert_eq!(status.status, Readiness::Ready);
    assert_eq!(status.nodes[0].ip_address, "10.0.1.0");
    assert_eq!(status.nodes[0].clique_id, "uuid.1");
    // a1 leaves, then comes back: the others keep their indexes, a new node
    // takes the lowest free one.
    d.status = Some(status);
    channels.remove(1);
    let status = run(&d, Some(&template), &channels, 4, 0).status.unwrap();
    assert_eq!(
        status.nodes.iter().map(|n| (n.name.as_str(), n.index)).collect::<Vec<_>>(),
        [("a0", 0), ("a2", 2), ("a3", 3)]
    );
    assert_eq!(status.status, Readiness::NotReady, "3 of numNodes 4");
    d.status = Some(status.clone());
    // Unchanged inputs: no status write.
    assert_eq!(run(&d, Some(&template), &channels, 4, 0).status, None);
}

#[test]
fn a_node_not_ready_makes_the_domain_not_ready() {
    let d = domain(0);
    let channels = [channel("a0", Some(true)), channel("a1", Some(false))];
    let status = run(&d, None, &channels, 2, 0).status.unwrap();
    assert_eq!(status.status, Readiness::NotReady);
    assert_eq!(status.nodes[1].status, Readiness::NotReady);
}

#[test]
fn nodes_of_two_cliques_never_share_a_domain() {
    let d = domain(0);
    let channels = [channel("a0", Some(true)), channel("a1", Some(true)), channel("b0", Some(true))];
    let p = run(&d, None, &channels, 2, 1);
    let status = p.status.unwrap();
    assert_eq!(status.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["a0", "a1"]);
    assert_eq!(status.status, Readiness::NotReady);
    assert_eq!(
        p.problems,
        [Problem::OtherCliques { clique: "uuid.1".into(), outside: vec![("b0".into(), "uuid.2".into())] }]
    );
    let note = p.problems[0].note();
    assert!(note.contains("b0 (clique uuid.2) cannot join"), "{note}");
}

/// A pod waiting for binding on a node of another clique: its binding is
/// failed at once with the reason (the scheduler would otherwise wait its
/// whole binding timeout for a daemon that never starts); one waiting in
/// the domain's clique, or already decided, is left to its node agent.
#[test]
fn a_channel_waiting_on_a_node_that_cannot_join_has_its_binding_refused() {
    let d = domain(0);
    let waiting = |node: &str| ChannelClaim { waiting: true, ..channel(node, None) };
    let channels = [waiting("a0"), waiting("b0"), channel("a1", Some(true)), channel("b1", None)];
    let p = run(&d, None, &channels, 2, 2);
    assert_eq!(p.refused_bindings.len(), 1, "{:?}", p.refused_bindings);
    let refused = &p.refused_bindings[0];
    assert_eq!((refused.name.as_str(), refused.node.as_str()), ("pod-b0-channel", "b0"));
    assert!(refused.reason.starts_with("node b0 cannot join ComputeDomain default/job: "), "{}", refused.reason);
    assert!(
        refused.reason.contains("b0 (clique uuid.2)") && refused.reason.contains("cannot join its IMEX domain"),
        "{}",
        refused.reason
    );
}

#[test]
fn more_nodes_than_the_clique_has_is_explained() {
    let d = domain(6);
    let channels: Vec<ChannelClaim> = (0..4).map(|i| channel(&format!("a{i}"), Some(true))).collect();
    let p = run(&d, None, &channels, 4, 0);
    assert_eq!(p.problems, [Problem::CliqueTooSmall { clique: "uuid.1".into(), has: 4, wants: 6 }]);
    assert!(p.problems[0].note().contains("lower numNodes to at most 4"));
    assert_eq!(p.status.unwrap().status, Readiness::NotReady);
    let p = run(&domain(19), None, &channels, 20, 0);
    assert!(p.problems.contains(&Problem::TooManyNodes { wants: 19 }), "{:?}", p.problems);
}

#[test]
fn unknown_nodes_are_explained_not_joined() {
    let d = domain(0);
    let channels = [channel("a0", Some(true)), channel("nowhere", Some(true))];
    let p = run(&d, None, &channels, 1, 0);
    assert_eq!(p.problems, [Problem::NoClique { nodes: vec!["nowhere".into()] }]);
    assert_eq!(p.status.unwrap().nodes.len(), 1);
}

#[test]
fn someone_elses_template_is_left_alone_and_explained() {
    let d = domain(0);
    let mut theirs = workload_template(&d);
    theirs.metadata.labels = None;
    let p = run(&d, Some(&theirs), &[], 1, 0);
    assert_eq!(p.template, TemplateAction::Keep);
    assert_eq!(p.problems, [Problem::TemplateTaken { name: "job-channel".into() }]);
}

#[test]
fn deletion_removes_the_template_then_the_finalizer() {
    let mut d = domain(0);
    d.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let template = workload_template(&d);
    let channels = [channel("a0", Some(true))];
    let p = run(&d, Some(&template), &channels, 1, 0);
    assert_eq!(p.template, TemplateAction::Delete { namespace: "default".into(), name: "job-channel".into() });
    assert!(!p.remove_finalizer && p.status.is_none());
    // Gone: the finalizer goes, whatever claims or node agents remain.
    let p = run(&d, None, &channels, 1, 0);
    assert!(p.remove_finalizer);
}

#[test]
fn channel_claims_are_read_from_the_allocation_and_the_agents_condition() {
    let d = domain(0);
    let template = workload_template(&d);
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "default", "name": "pod-0-channel"},
        "spec": template.spec.unwrap().spec,
        "status": {
            "allocation": {"devices": {"results": [{"request": "channel", "driver": DRIVER_NAME, "pool": "a0", "device": "channel-0"}]}},
            "devices": [{"driver": DRIVER_NAME, "pool": "a0", "device": "channel-0",
                          "conditions": [{"type": "Ready", "status": "True", "reason": "ImexReady", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]
        }
    }))
    .unwrap();
    assert_eq!(
        ChannelClaim::of(&claim),
        Some(channel("a0", Some(true))).map(|c| ChannelClaim { name: "pod-0-channel".into(), ..c })
    );
    let mut unallocated = claim;
    unallocated.status = None;
    assert_eq!(ChannelClaim::of(&unallocated), None);
}
