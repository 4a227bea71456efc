//! ComputeDomain prepares under faults, through the whole system (see
//! [`integration_tests::compute_domain_cluster`]):
//! - a SIGKILL of the node agent at every step of a channel and a daemon
//!   prepare and of their unprepares (`GPU_DRA_KILL_AT`), then a restart:
//!   no second daemon, no orphan configuration, device node, spec or
//!   record; a finished prepare is kept; the retry succeeds;
//! - a restarted agent adopts its running daemon (SIGTERM or SIGKILL),
//!   starts it again when it died with the agent, and releases claims
//!   deleted from the API while it was down (no daemon left behind);
//! - a host-managed `nvidia-imex` is used for a domain it lists, never
//!   doubled or stopped, and a domain it lacks is refused per claim.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_dra_driver::compute_domain::api::Readiness;
use gpu_dra_driver::compute_domain::imex;
use integration_tests::compute_domain_cluster::{Cluster, Node, WAIT, one_node_domain, wait_until};
use integration_tests::plugin_process::PluginOptions;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kubelet_proto::dra_v1::Claim;

fn killing_at(options: &PluginOptions, step: &str) -> PluginOptions {
    let mut options = options.clone();
    options.env.push(("GPU_DRA_KILL_AT".into(), step.into()));
    options
}

#[derive(Clone, Copy, PartialEq)]
enum Call {
    Prepare,
    Unprepare,
}

/// SIGTERM, a process that kills itself at `step` during `call`, then a
/// plain process again on the same files.
fn kill_at(cluster: &Cluster, node: &mut Node, step: &str, call: Call, claim: &Claim) {
    let options = node.options.clone();
    node.process.terminate(WAIT).expect("SIGTERM");
    node.restart_with(&cluster.rt, &killing_at(&options, step));
    let claims = std::slice::from_ref(claim);
    let answered = match call {
        Call::Prepare => cluster.rt.block_on(node.kubelet.prepare_raw(&node.plugin, claims)).is_ok(),
        Call::Unprepare => cluster.rt.block_on(node.kubelet.unprepare_raw(&node.plugin, claims)).is_ok(),
    };
    assert!(!answered, "{step}: answered, the kill point never reached\n{}", node.process.log());
    let status = node.process.wait_timeout(Duration::from_secs(30)).expect("wait").expect("the plugin killed itself");
    assert!(!status.success(), "{step}: {status:?}");
    node.restart_with(&cluster.rt, &options);
}

/// What the node holds: exactly the `prepared` claims' records and specs,
/// one daemon (with one configuration directory) while any is prepared,
/// the channel node while a channel claim is.
fn check_settled(node: &Node, step: &str, prepared: &[&Claim], channel_held: bool) {
    let mut records: Vec<String> = prepared.iter().map(|c| format!("{}.json", c.uid)).collect();
    records.sort();
    let mut held = node.records();
    held.sort();
    assert_eq!(held, records, "{step}: records\n{}", node.process.log());
    let mut specs = node.files(&node.dirs.cdi);
    specs.sort();
    let mut expected: Vec<String> =
        prepared.iter().map(|c| format!("k8s.compute-domain.nvidia.com-claim_{}.json", c.uid)).collect();
    expected.sort();
    assert_eq!(specs, expected, "{step}: specs");
    let daemons = usize::from(!prepared.is_empty());
    assert_eq!(node.daemons(), daemons, "{step}: daemons: {:?}", node.imex_log());
    assert_eq!(node.files(&node.state().join("domains")).len(), daemons, "{step}: daemon directories");
    assert_eq!(node.channel_node().exists(), channel_held, "{step}: the channel node");
}

fn wait_on(cluster: &Cluster, node: &Node, what: &str, done: impl Fn(&Node) -> bool) {
    let logs = || format!("controller:\n{}\nnode:\n{}", cluster.controller.log(), node.process.log());
    wait_until(what, || done(node), logs);
}

fn prepare_ok(cluster: &Cluster, node: &Node, claim: &Claim, step: &str) -> Vec<String> {
    node.prepare(&cluster.rt, std::slice::from_ref(claim))
        .remove(0)
        .unwrap_or_else(|e| panic!("{step}: {e}\n{}", node.process.log()))
}

fn unprepare_ok(cluster: &Cluster, node: &Node, claim: &Claim) {
    cluster.rt.block_on(node.kubelet.unprepare(&node.plugin, std::slice::from_ref(claim))).unwrap();
}

#[test]
fn sigkill_at_every_step_of_a_domain_prepare_and_unprepare_leaks_and_doubles_nothing() {
    let (cluster, mut node, channel) = one_node_domain();
    let daemon = cluster.allocated_daemon("imex-0", "gb200-0");
    let mut summary: BTreeMap<String, &str> = BTreeMap::new();
    let prepare_steps = [
        "cd-recorded",
        "cd-daemon-configured",
        "cd-daemon-started",
        "cd-node-created",
        "cd-spec-written",
        "cd-completed",
    ];
    for (claim, kind) in [(&channel, "channel"), (&daemon, "daemon")] {
        let is_channel = kind == "channel";
        for step in prepare_steps.iter().filter(|s| is_channel || **s != "cd-node-created") {
            let label = format!("{kind} prepare, {step}");
            kill_at(&cluster, &mut node, step, Call::Prepare, claim);
            if *step == "cd-completed" {
                // Finished before the kill: kept, the same answer again.
                check_settled(&node, &label, &[claim], is_channel);
            } else {
                check_settled(&node, &label, &[], false);
            }
            let ids = prepare_ok(&cluster, &node, claim, &label);
            assert_eq!(ids, [format!("k8s.compute-domain.nvidia.com/claim={}-{kind}-0", claim.uid)], "{label}");
            check_settled(&node, &label, &[claim], is_channel);
            unprepare_ok(&cluster, &node, claim);
            check_settled(&node, &label, &[], false);
            summary.insert(label, "rolled back or kept, retried");
        }
        for step in ["cd-unrecorded", "cd-spec-removed", "cd-daemon-stopped"] {
            let label = format!("{kind} unprepare, {step}");
            prepare_ok(&cluster, &node, claim, &label);
            kill_at(&cluster, &mut node, step, Call::Unprepare, claim);
            check_settled(&node, &label, &[], false);
            // The kubelet's retry of the unprepare, then a new prepare.
            unprepare_ok(&cluster, &node, claim);
            prepare_ok(&cluster, &node, claim, &label);
            check_settled(&node, &label, &[claim], is_channel);
            unprepare_ok(&cluster, &node, claim);
            check_settled(&node, &label, &[], false);
            summary.insert(label, "finished at start-up, prepared again");
        }
    }

    // A daemon claim holds the domain's daemon while a channel prepare is
    // killed: that daemon stays the only one, untouched.
    prepare_ok(&cluster, &node, &daemon, "holder");
    let holder = node.daemon_pids();
    assert_eq!(holder.len(), 1);
    for step in ["cd-recorded", "cd-node-created", "cd-spec-written", "cd-completed"] {
        let label = format!("channel beside a daemon claim, {step}");
        kill_at(&cluster, &mut node, step, Call::Prepare, &channel);
        let kept = step == "cd-completed";
        let prepared: Vec<&Claim> = if kept { vec![&daemon, &channel] } else { vec![&daemon] };
        check_settled(&node, &label, &prepared, kept);
        assert_eq!(node.daemon_pids(), holder, "{label}: the same daemon");
        prepare_ok(&cluster, &node, &channel, &label);
        check_settled(&node, &label, &[&daemon, &channel], true);
        unprepare_ok(&cluster, &node, &channel);
        assert_eq!(node.daemon_pids(), holder, "{label}: the same daemon");
        summary.insert(label, "the holder's daemon kept");
    }
    unprepare_ok(&cluster, &node, &daemon);
    check_settled(&node, "the end", &[], false);
    eprintln!("kill points: {summary:#?}");
}

#[test]
fn a_restarted_agent_keeps_one_daemon_and_releases_claims_deleted_while_it_was_down() {
    let (cluster, mut node, first) = one_node_domain();
    let ids = prepare_ok(&cluster, &node, &first, "first");
    let daemon = node.daemon_pids();
    assert_eq!(daemon.len(), 1);

    // SIGTERM, then SIGKILL: the next agent adopts the running daemon.
    let options = node.options.clone();
    node.process.terminate(WAIT).expect("SIGTERM").expect("exited");
    node.restart_with(&cluster.rt, &options);
    assert_eq!(node.daemon_pids(), daemon, "adopted after SIGTERM");
    node.kill_and_restart(&cluster.rt);
    assert_eq!(node.daemon_pids(), daemon, "adopted after SIGKILL");
    let second = cluster.allocated_channel("worker-1", "gb200-0");
    prepare_ok(&cluster, &node, &second, "beside the adopted daemon");
    assert_eq!(node.daemon_pids(), daemon);
    assert_eq!(node.imex_log().iter().filter(|l| l.starts_with("start ")).count(), 1, "{:?}", node.imex_log());

    // The daemon dies with the agent (its container restarted): the next
    // agent starts it again at start-up; prepares keep working.
    node.process.kill().unwrap();
    let pid = rustix::process::Pid::from_raw(daemon[0] as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    wait_on(&cluster, &node, "the daemon gone", |n| n.daemons() == 0);
    node.restart_with(&cluster.rt, &options);
    wait_on(&cluster, &node, "the daemon started again", |n| n.daemons() == 1);
    assert_ne!(node.daemon_pids(), daemon);
    assert_eq!(prepare_ok(&cluster, &node, &first, "after the restart"), ids);
    let third = cluster.allocated_channel("worker-2", "gb200-0");
    prepare_ok(&cluster, &node, &third, "a new channel after the restart");
    assert_eq!(node.daemons(), 1);

    // The claims are deleted while the agent is down (no unprepare comes):
    // the next agent releases them and stops the daemon.
    node.process.kill().unwrap();
    for claim in [&first, &second, &third] {
        cluster.server.delete::<ResourceClaim>(Some("default"), &claim.name).unwrap();
    }
    node.restart_with(&cluster.rt, &options);
    wait_on(&cluster, &node, "the released claims' records, specs and daemon gone", |n| {
        n.daemons() == 0
            && n.records().is_empty()
            && n.files(&n.dirs.cdi).is_empty()
            && n.files(&n.state().join("domains")).is_empty()
    });
    check_settled(&node, "released", &[], false);
    // The kubelet's late unprepares are answered.
    for claim in [&first, &second, &third] {
        unprepare_ok(&cluster, &node, claim);
    }
}

/// A host-managed `nvidia-imex` (the driver root's program run by root with
/// the host's configuration, in the node's `--proc-root`: a process is
/// the host's by its executable and owner, not its name; see
/// `compute_domain_forged_state.rs` for impostors): the agent starts no daemon of its own; the
/// domain becomes Ready through the host's daemon, which lists the node;
/// once the host's list lacks it, a new channel is refused with what to
/// do; the host's daemon is never stopped.
#[test]
fn a_host_managed_daemon_is_used_never_doubled_and_a_domain_it_lacks_refused() {
    let cluster = Cluster::start();
    let node = Node::start(&cluster.server, &cluster.rt, 0, 1, 20_000);
    let host_root = node.dirs.root.path().join("host-imex");
    let etc = host_root.join("etc/nvidia-imex");
    std::fs::create_dir_all(&etc).unwrap();
    let nodes = etc.join("nodes_config.cfg");
    std::fs::write(&nodes, format!("{}\n10.0.0.2\n", node.address)).unwrap();
    let config = etc.join("config.cfg");
    std::fs::write(&config, imex::daemon_config(&nodes, &etc.join("imex.log"))).unwrap();
    let mut host = std::process::Command::new(node.driver_root.join("usr/bin/nvidia-imex"))
        .arg("-c")
        .arg(&config)
        .spawn()
        .unwrap();
    let host_start = format!("start {} {} 10.0.0.2", config.display(), node.address);
    std::os::unix::fs::symlink(format!("/proc/{}", host.id()), node.host.join(format!("proc/{}", host.id()))).unwrap();

    cluster.apply_domain(1);
    wait_on(&cluster, &node, "the workload template", |_| cluster.template().is_some());
    let first = cluster.allocated_channel("worker-0", "gb200-0");
    prepare_ok(&cluster, &node, &first, "through the host's daemon");
    assert_eq!(node.daemons(), 0, "no daemon of the agent's: {:?}", node.imex_log());
    assert!(node.channel_node().exists());
    wait_on(&cluster, &node, "the domain Ready", |_| {
        cluster.domain().and_then(|d| d.status).is_some_and(|s| s.status == Readiness::Ready)
    });

    std::fs::write(&nodes, "10.0.0.9\n").unwrap();
    let second = cluster.allocated_channel("worker-1", "gb200-0");
    let error = node.prepare(&cluster.rt, std::slice::from_ref(&second)).remove(0).unwrap_err();
    assert!(
        error.starts_with(&format!(
            "node gb200-0 runs a host-managed nvidia-imex (pid {}, -c {}), and its node list {} lacks {} of ComputeDomain default/job",
            host.id(),
            config.display(),
            nodes.display(),
            node.address
        )) && error.contains("systemctl disable --now nvidia-imex"),
        "{error}"
    );
    unprepare_ok(&cluster, &node, &first);
    assert!(!node.channel_node().exists());
    assert_eq!(node.daemons(), 0);
    assert_eq!(node.imex_log(), [host_start], "the host's daemon only: never signalled, none of the agent's");
    assert_eq!(host.try_wait().unwrap(), None, "the host's daemon runs on");
    host.kill().unwrap();
    host.wait().unwrap();
}

/// The API server refuses the agent's write of the channel's Ready
/// condition (403, as without `associated-node:update` on
/// `resourceclaims/driver` on Kubernetes 1.36+): the prepare succeeds, the
/// refusal is one warning in the log and one Warning Event on the domain
/// naming the claim, the answer and the fix, however many health passes
/// retry it; once allowed, the node turns Ready in the domain.
#[test]
fn a_refused_ready_condition_is_one_warning_and_one_event_on_the_domain() {
    use integration_tests::apiserver::Matcher;
    use k8s_openapi::api::events::v1::Event;

    let (cluster, node, channel) = one_node_domain();
    let logs = || format!("controller:\n{}\nnode:\n{}", cluster.controller.log(), node.process.log());
    let status_write = Matcher::new("PUT", "/resourceclaims/worker-0-channel/status");
    cluster.server.faults().fail_next(status_write.clone(), usize::MAX, 403);
    prepare_ok(&cluster, &node, &channel, "a refused condition");
    let refusals = || -> Vec<Event> {
        let events = cluster.server.list::<Event>(Some("default"), "").unwrap();
        events.into_iter().filter(|e| e.reason.as_deref() == Some("ReadyConditionRefused")).collect()
    };
    // Prepare's write and five health passes (200 ms apart), all refused.
    wait_until("six refused writes", || cluster.server.faults().count(&status_write, 403) >= 6, logs);
    let events = refusals();
    assert_eq!(events.len(), 1, "one Event, not one per pass: {events:#?}");
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!((regarding.kind.as_deref(), regarding.name.as_deref()), (Some("ComputeDomain"), Some("job")));
    assert_eq!(event.related.as_ref().and_then(|r| r.name.as_deref()), Some("worker-0-channel"));
    let note = event.note.as_deref().unwrap();
    for part in [
        "cannot write the Ready condition of channel-0 on ResourceClaim default/worker-0-channel",
        "HTTP 403 Forbidden: injected fault: HTTP 403",
        "associated-node:update on resourceclaims/driver for compute-domain.nvidia.com; the chart does this",
    ] {
        assert!(note.contains(part), "{part:?} not in {note:?}");
    }
    let warnings =
        node.process.log().lines().filter(|l| l.contains("cannot write the channel's Ready condition;")).count();
    assert_eq!(warnings, 1, "one warning, not one per pass:\n{}", node.process.log());
    let node_ready = || {
        cluster.domain().and_then(|d| d.status).is_some_and(|s| {
            s.status == Readiness::Ready && s.nodes.iter().any(|n| n.name == "gb200-0" && n.status == Readiness::Ready)
        })
    };
    assert!(!node_ready(), "not Ready without the condition");

    cluster.server.faults().clear();
    wait_until("the node Ready in the domain", node_ready, logs);
    assert!(node.process.log().contains("after earlier failures"), "{}", node.process.log());
    assert_eq!(refusals().len(), 1);
    unprepare_ok(&cluster, &node, &channel);
}
