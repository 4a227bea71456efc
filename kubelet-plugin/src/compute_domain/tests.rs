//! The preparer in-process: fake IMEX programs in a temporary driver root,
//! claims and domains from maps, conditions recorded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_dra_driver::compute_domain::api::{
    ComputeDomain, ComputeDomainNode, ComputeDomainSpec, ComputeDomainStatus, Readiness,
};
use gpu_dra_driver::compute_domain::imex::{self, DaemonState};
use gpu_dra_driver::driver_root::fake_imex;
use gpu_dra_driver::names::{ClaimUid, DomainUid, DriverName, NodeName};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

use super::daemons::Daemons;
use super::*;
use crate::claim_status::refusal::Explanation;
use crate::claim_status::write::ConditionError;
use crate::deadline::Deadline;
use crate::kubelet_api::grpc::DraService;
use crate::prepare::test_support::MapSource;
use crate::prepare::types::ClaimRef;
use crate::prepared::PreparedDevice;
use crate::state::checkpoint::{CheckpointDir, PrepareState};

pub(super) const DOMAIN: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
pub(super) const NODE: &str = "gb200-0";

pub(super) fn domain() -> DomainUid {
    DomainUid::new(DOMAIN).unwrap()
}

/// The node's view of the domain, whether its watch has listed ("not
/// yet" while the flag holds), and the domain only the API server has so
/// far (the watch has not delivered it), and the error reading the API
/// server gives while one is set.
#[derive(Clone, Default)]
pub(super) struct Domains(
    Arc<Mutex<Option<ComputeDomain>>>,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<Mutex<Option<ComputeDomain>>>,
    Arc<Mutex<Option<LookupError>>>,
    Arc<Mutex<Vec<ResourceClaim>>>,
);

impl DomainLookup for Domains {
    /// Synced unless a test says otherwise (the flag holds "not yet").
    fn synced(&self) -> bool {
        !self.1.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn find(&self, namespace: &str, uid: &str) -> Option<ComputeDomain> {
        let found = self.0.lock().unwrap().clone();
        found.filter(|d| d.metadata.namespace.as_deref() == Some(namespace) && d.metadata.uid.as_deref() == Some(uid))
    }

    async fn read_live(&self, namespace: &str, uid: &str) -> Result<Option<ComputeDomain>, LookupError> {
        if let Some(error) = self.3.lock().unwrap().clone() {
            return Err(error);
        }
        let live = self.2.lock().unwrap().clone().or_else(|| self.0.lock().unwrap().clone());
        Ok(live
            .filter(|d| d.metadata.namespace.as_deref() == Some(namespace) && d.metadata.uid.as_deref() == Some(uid)))
    }

    fn listing(&self, node: &str) -> Vec<ComputeDomain> {
        self.0
            .lock()
            .unwrap()
            .clone()
            .filter(|d| gpu_dra_driver::compute_domain::binding::lists_node_not_ready(d, node))
            .into_iter()
            .collect()
    }

    /// The domain's claims: those of `4` with its label, or the error `3`
    /// holds.
    async fn claims_of(&self, namespace: &str, uid: &str) -> Result<Vec<ResourceClaim>, LookupError> {
        if let Some(error) = self.3.lock().unwrap().clone() {
            return Err(error);
        }
        let labelled = |c: &ResourceClaim| {
            c.metadata.namespace.as_deref() == Some(namespace)
                && c.metadata.labels.as_ref().and_then(|l| l.get(gpu_dra_driver::compute_domain::DOMAIN_LABEL))
                    == Some(&uid.to_owned())
        };
        Ok(self.4.lock().unwrap().iter().filter(|c| labelled(c)).cloned().collect())
    }
}

/// Conditions written; while `refusal` holds an error, writes fail with
/// it; the Events that explained a refusal.
#[derive(Clone, Default)]
pub(super) struct Conditions {
    pub(super) written: Arc<Mutex<Vec<(String, DaemonState)>>>,
    refusal: Arc<Mutex<Option<ConditionError>>>,
    explained: Arc<Mutex<Vec<Explanation>>>,
    /// Binding failures written: (claim, reason).
    pub(super) failed: Arc<Mutex<Vec<(String, String)>>>,
}

impl ConditionWriter for Conditions {
    async fn set_ready(&self, _ns: &str, name: &str, _device: &str, state: &DaemonState) -> Result<(), ConditionError> {
        if let Some(error) = self.refusal.lock().unwrap().clone() {
            return Err(error);
        }
        self.written.lock().unwrap().push((name.to_owned(), state.clone()));
        Ok(())
    }

    async fn explain(&self, explanation: &Explanation) -> Result<(), crate::claim_status::refusal::EventError> {
        self.explained.lock().unwrap().push(explanation.clone());
        Ok(())
    }

    async fn fail_binding(&self, _ns: &str, name: &str, reason: &str) -> Result<(), ConditionError> {
        if let Some(error) = self.refusal.lock().unwrap().clone() {
            return Err(error);
        }
        self.failed.lock().unwrap().push((name.to_owned(), reason.to_owned()));
        Ok(())
    }
}

pub(super) struct Node {
    dir: tempfile::TempDir,
    claims: MapSource,
    domains: Domains,
    pub(super) conditions: Conditions,
}

pub(super) type Preparer = DomainPreparer<MapSource, Domains, Conditions>;

impl Node {
    pub(super) fn new(members: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        fake_imex::install(&dir.path().join("driver")).unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(
            dir.path().join("proc/devices"),
            "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n\nBlock devices:\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("cdi")).unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        let node =
            Self { dir, claims: MapSource::default(), domains: Domains::default(), conditions: Conditions::default() };
        node.set_members(members);
        node
    }

    pub(super) fn root(&self) -> &Path {
        self.dir.path()
    }

    pub(super) fn set_members(&self, members: &[&str]) {
        let mut domain = ComputeDomain::new("team", "job", ComputeDomainSpec::with_template(0, "job-channel"));
        domain.metadata.uid = Some(DOMAIN.into());
        domain.status = Some(ComputeDomainStatus {
            status: Readiness::NotReady,
            nodes: members
                .iter()
                .enumerate()
                .map(|(i, n)| ComputeDomainNode {
                    name: n.to_string(),
                    ip_address: format!("10.0.0.{}", i + 1),
                    clique_id: "u.1".into(),
                    index: i as u32,
                    status: Readiness::NotReady,
                })
                .collect(),
        });
        *self.domains.0.lock().unwrap() = Some(domain);
    }

    pub(super) fn open(&self) -> Preparer {
        let config = DomainConfig {
            driver: DriverName::new("compute-domain.nvidia.com").unwrap(),
            node: NodeName::new(NODE).unwrap(),
            cdi_dir: self.root().join("cdi"),
            state_dir: self.root().join("state"),
            boot_id: "boot-1".into(),
            dev_root: Some(self.root().to_path_buf()),
            proc_root: self.root().join("proc"),
            ready_timeout: Duration::from_millis(1500),
        };
        let daemons =
            Daemons::new(self.root().join("state/domains"), daemons::ImexPrograms::find(&self.root().join("driver")));
        DomainPreparer::open(config, daemons, self.claims.clone(), self.domains.clone(), self.conditions.clone())
            .unwrap()
    }

    /// A channel claim of the domain allocated here; returns its reference.
    pub(super) fn channel_claim(&self, name: &str, uid: &str) -> ClaimRef {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"namespace": "team", "name": name, "uid": uid},
            "spec": {"devices": {"requests": [{"name": "channel", "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}],
                "config": [{"requests": ["channel"], "opaque": {"driver": "compute-domain.nvidia.com",
                    "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": DOMAIN}}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "channel", "driver": "compute-domain.nvidia.com", "pool": NODE, "device": "channel-0"}]}}}
        }))
        .unwrap();
        self.claims.put(claim);
        ClaimRef { namespace: "team".into(), name: name.into(), uid: uid.into() }
    }

    /// A channel claim of the domain (labelled as its template labels it)
    /// allocated here with the channel's binding conditions, that the
    /// scheduler holds for binding; `domain_id` is what its config names.
    pub(super) fn waiting_channel_claim(&self, name: &str, uid: &str, domain_id: &str) -> ResourceClaim {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"namespace": "team", "name": name, "uid": uid,
                "labels": {gpu_dra_driver::compute_domain::DOMAIN_LABEL: DOMAIN}},
            "spec": {"devices": {"requests": [{"name": "channel", "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}],
                "config": [{"requests": ["channel"], "opaque": {"driver": "compute-domain.nvidia.com",
                    "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": domain_id}}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "channel", "driver": "compute-domain.nvidia.com", "pool": NODE, "device": "channel-0",
                 "bindingConditions": ["Ready"], "bindingFailureConditions": ["ImexDaemonFailed"]}]}}}
        }))
        .unwrap();
        self.claims.put(claim.clone());
        self.domains.4.lock().unwrap().push(claim.clone());
        claim
    }

    /// Replaces the domain's claims as the API lists them.
    pub(super) fn set_domain_claims(&self, claims: Vec<ResourceClaim>) {
        *self.domains.4.lock().unwrap() = claims;
    }

    /// Makes listing the domain's claims fail with `error` (`None`: succeed).
    pub(super) fn set_api_error(&self, error: Option<LookupError>) {
        *self.domains.3.lock().unwrap() = error;
    }

    pub(super) fn remove_claim(&self, name: &str) {
        self.claims.remove(name);
        self.domains.4.lock().unwrap().retain(|c| c.metadata.name.as_deref() != Some(name));
    }

    pub(super) fn imex_log(&self) -> Vec<String> {
        fake_imex::daemon_log(&self.root().join("driver"))
    }

    pub(super) fn channel_node(&self) -> PathBuf {
        self.root().join("dev/nvidia-caps-imex-channels/channel0")
    }

    pub(super) fn files(&self, dir: &str) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.root().join(dir)) else { return Vec::new() };
        let mut names: Vec<String> = entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
        names.sort();
        names
    }
}

pub(super) const UID_A: &str = "11111111-2222-4333-8444-555555555551";
pub(super) const UID_B: &str = "11111111-2222-4333-8444-555555555552";

pub(super) async fn prepare(p: &Preparer, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
    p.prepare(vec![claim.clone()], Deadline::default_from_now())
        .await
        .remove(&claim.uid)
        .unwrap()
        .map_err(|e| e.to_string())
}

pub(super) async fn unprepare(p: &Preparer, claim: &ClaimRef) {
    let out = p.unprepare(vec![claim.clone()], Deadline::default_from_now()).await;
    out[&claim.uid].as_ref().unwrap();
}

#[tokio::test]
async fn a_channel_is_prepared_over_one_daemon_with_the_domains_peers_and_cleaned_up() {
    let node = Node::new(&[NODE, "gb200-1", "gb200-2", "gb200-3"]);
    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    let devices = prepare(&p, &a).await.unwrap();
    assert_eq!(devices[0].device_name, "channel-0");
    assert_eq!(devices[0].pool_name, NODE);
    assert_eq!(devices[0].cdi_device_ids, [format!("k8s.compute-domain.nvidia.com/claim={UID_A}-channel-0")]);
    let config = node.root().join(format!("state/domains/{DOMAIN}/imexd.cfg"));
    assert_eq!(node.imex_log(), [format!("start {} 10.0.0.1 10.0.0.2 10.0.0.3 10.0.0.4", config.display())]);
    let spec = std::fs::read_to_string(
        node.root().join("cdi").join(format!("k8s.compute-domain.nvidia.com-claim_{UID_A}.json")),
    )
    .unwrap();
    assert!(spec.contains("/dev/nvidia-caps-imex-channels/channel0") && spec.contains("\"major\": 234"), "{spec}");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(node.channel_node()).unwrap().file_type().is_char_device());
    assert_eq!(node.conditions.written.lock().unwrap().as_slice(), [("pod-a-channel".to_owned(), DaemonState::Ready)]);

    // A second pod's claim of the same domain: the same daemon; prepare again: the same answer.
    let b = node.channel_claim("pod-b-channel", UID_B);
    prepare(&p, &b).await.unwrap();
    assert_eq!(prepare(&p, &a).await.unwrap(), devices);
    assert_eq!(node.imex_log().len(), 1, "{:?}", node.imex_log());
    assert!(p.daemons.find(&domain()).is_some());

    // A node joins: the daemon is told the new peer list.
    node.set_members(&[NODE, "gb200-1", "gb200-2", "gb200-3", "gb200-4"]);
    let mut written = HashMap::new();
    health::pass_for_tests(&p, &mut written).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        node.imex_log()[1].starts_with("reload ") && node.imex_log()[1].ends_with("10.0.0.5"),
        "{:?}",
        node.imex_log()
    );

    unprepare(&p, &a).await;
    assert!(p.daemons.find(&domain()).is_some(), "pod b still holds the domain");
    assert!(node.channel_node().exists());
    unprepare(&p, &b).await;
    unprepare(&p, &b).await;
    assert!(p.daemons.find(&domain()).is_none());
    assert!(node.imex_log().last().unwrap().starts_with("stop "), "{:?}", node.imex_log());
    assert!(!node.channel_node().exists() && !node.root().join("dev/nvidia-caps-imex-channels").exists());
    assert_eq!(node.files("cdi"), Vec::<String>::new());
    assert_eq!(node.files("state/domains"), Vec::<String>::new());
    assert_eq!(node.files("state/checkpoint"), Vec::<String>::new());
}

#[tokio::test]
async fn a_not_ready_daemon_blocks_new_channels_at_once_and_flips_the_condition() {
    let node = Node::new(&[NODE]);
    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    prepare(&p, &a).await.unwrap();
    std::fs::write(node.root().join("driver/imex.not-ready"), "").unwrap();
    let mut written = HashMap::new();
    health::pass_for_tests(&p, &mut written).await;
    assert_eq!(
        node.conditions.written.lock().unwrap().last().unwrap(),
        &("pod-a-channel".to_owned(), DaemonState::NotReady("NOT_READY".into()))
    );
    let b = node.channel_claim("pod-b-channel", UID_B);
    let started = std::time::Instant::now();
    let error = prepare(&p, &b).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1), "not after a wait");
    assert!(
        error.starts_with("the IMEX daemon of ComputeDomain team/job on node gb200-0 is not ready (nvidia-imex-ctl: NOT_READY): no new channels are prepared here until it is"),
        "{error}"
    );
    assert_eq!(node.files("state/checkpoint"), [format!("{UID_A}.json")], "b rolled back");
    std::fs::remove_file(node.root().join("driver/imex.not-ready")).unwrap();
    health::pass_for_tests(&p, &mut written).await;
    assert_eq!(node.conditions.written.lock().unwrap().last().unwrap().1, DaemonState::Ready);
    prepare(&p, &b).await.unwrap();
    unprepare(&p, &a).await;
    unprepare(&p, &b).await;
}

/// A refused condition write: the prepare still succeeds, the refusal is
/// explained once on the domain (naming the claim) however many health
/// passes retry it, and the condition lands once the API accepts it.
#[tokio::test]
async fn a_refused_condition_is_explained_once_and_written_when_allowed() {
    let node = Node::new(&[NODE]);
    let p = node.open();
    let refusal = ConditionError::Refused {
        action: "writing the status of claim team/pod-a-channel".into(),
        code: 403,
        reason: "Forbidden".into(),
        message: "cannot associated-node:update resource \"resourceclaims/driver\"".into(),
    };
    *node.conditions.refusal.lock().unwrap() = Some(refusal);
    let a = node.channel_claim("pod-a-channel", UID_A);
    prepare(&p, &a).await.unwrap();
    let mut written = HashMap::new();
    for _ in 0..5 {
        health::pass_for_tests(&p, &mut written).await;
    }
    let explained = node.conditions.explained.lock().unwrap().clone();
    assert_eq!(explained.len(), 1, "once, not every pass: {explained:#?}");
    let event = &explained[0];
    assert_eq!((event.namespace.as_str(), event.reason), ("team", crate::claim_status::refusal::REFUSED_REASON));
    assert_eq!(
        (event.regarding.kind.as_deref(), event.regarding.name.as_deref(), event.regarding.uid.as_deref()),
        (Some("ComputeDomain"), Some("job"), Some(DOMAIN))
    );
    assert_eq!(event.related.as_ref().and_then(|r| r.name.as_deref()), Some("pod-a-channel"));
    assert!(
        event.note.contains("ResourceClaim team/pod-a-channel")
            && event.note.contains("HTTP 403 Forbidden")
            && event.note.contains("associated-node:update on resourceclaims/driver for compute-domain.nvidia.com"),
        "{}",
        event.note
    );
    assert!(node.conditions.written.lock().unwrap().is_empty());

    *node.conditions.refusal.lock().unwrap() = None;
    health::pass_for_tests(&p, &mut written).await;
    assert_eq!(node.conditions.written.lock().unwrap().as_slice(), [("pod-a-channel".to_owned(), DaemonState::Ready)]);
    assert_eq!(node.conditions.explained.lock().unwrap().len(), 1);
    unprepare(&p, &a).await;
}

#[tokio::test]
async fn a_node_outside_the_domain_gets_a_clear_error_after_the_bounded_wait() {
    let node = Node::new(&["gb200-1"]);
    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    let error = prepare(&p, &a).await.unwrap_err();
    assert!(
        error.starts_with("node gb200-0 has not joined ComputeDomain team/job after 1.5s (its status lists [gb200-1])"),
        "{error}"
    );
    assert!(node.imex_log().is_empty());
    assert_eq!(node.files("state/checkpoint"), Vec::<String>::new());
    assert_eq!(node.files("cdi"), Vec::<String>::new());
}

/// The states a kill at each step of a prepare leaves, rebuilt from a
/// finished prepare: start-up rolls each back to nothing, keeps a finished
/// one, and a new prepare runs exactly one daemon.
#[tokio::test]
async fn start_up_rolls_back_a_prepare_killed_at_any_step() {
    for step in ["recorded", "daemon-started", "node-created", "spec-written", "completed"] {
        let node = Node::new(&[NODE]);
        let a = node.channel_claim("pod-a-channel", UID_A);
        let p = node.open();
        prepare(&p, &a).await.unwrap();
        drop(p);
        let checkpoint = CheckpointDir::open(node.root().join("state/checkpoint")).unwrap();
        let uid = ClaimUid::new(UID_A).unwrap();
        let mut record = checkpoint.read_one(&uid).unwrap().unwrap();
        if step != "completed" {
            record.state = PrepareState::PrepareStarted;
            record.devices.clear();
            checkpoint.write(&uid, &record).unwrap();
        }
        let spec = node.root().join("cdi").join(record.cdi_spec_file.clone().unwrap());
        if ["recorded", "daemon-started", "node-created"].contains(&step) {
            std::fs::remove_file(&spec).unwrap();
        }
        if ["recorded", "daemon-started"].contains(&step) {
            std::fs::remove_file(node.channel_node()).unwrap();
            std::fs::remove_file(node.root().join("state/device-nodes.json")).unwrap();
        }
        let daemons =
            Daemons::new(node.root().join("state/domains"), daemons::ImexPrograms::find(&node.root().join("driver")));
        if step == "recorded" {
            daemons.stop(&domain()).unwrap();
        }
        let p = node.open();
        if step == "completed" {
            assert_eq!(node.files("state/checkpoint"), [format!("{UID_A}.json")]);
            assert!(p.daemons.find(&domain()).is_some() && spec.exists() && node.channel_node().exists());
        } else {
            assert_eq!(node.files("state/checkpoint"), Vec::<String>::new(), "{step}");
            assert_eq!(node.files("cdi"), Vec::<String>::new(), "{step}");
            assert_eq!(node.files("state/domains"), Vec::<String>::new(), "{step}");
            assert!(p.daemons.find(&domain()).is_none() && !node.channel_node().exists(), "{step}");
        }
        prepare(&p, &a).await.unwrap();
        let starts = node.imex_log().iter().filter(|l| l.starts_with("start")).count();
        let stops = node.imex_log().iter().filter(|l| l.starts_with("stop")).count();
        assert_eq!(starts - stops, 1, "{step}: one daemon runs: {:?}", node.imex_log());
        unprepare(&p, &a).await;
        assert!(p.daemons.find(&domain()).is_none(), "{step}");
    }
}

/// The daemon of a prepared claim died with the previous agent (its
/// container restarted): start-up starts it again from its files, before
/// the domain is even known; a claim deleted from the API while no
/// unprepare came is released by the health loop, its daemon stopped.
#[tokio::test]
async fn a_daemon_lost_with_the_agent_is_started_again_and_a_deleted_claim_released() {
    let node = Node::new(&[NODE]);
    let a = node.channel_claim("pod-a-channel", UID_A);
    let p = node.open();
    prepare(&p, &a).await.unwrap();
    let pid = p.daemons.find(&domain()).unwrap();
    drop(p);
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), rustix::process::Signal::KILL).unwrap();
    let daemons =
        Daemons::new(node.root().join("state/domains"), daemons::ImexPrograms::find(&node.root().join("driver")));
    while daemons.find(&domain()).is_some() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let unknown = node.domains.0.lock().unwrap().take();
    let p = node.open();
    let revived = p.daemons.find(&domain()).expect("started again at start-up");
    assert_ne!(revived, pid);
    let starts = || node.imex_log().iter().filter(|l| l.starts_with("start ")).count();
    for _ in 0..200 {
        if starts() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(starts(), 2, "{:?}", node.imex_log());
    // The domain not yet in the store: the health loop keeps that daemon, no second one.
    let mut written = HashMap::new();
    health::pass_for_tests(&p, &mut written).await;
    assert_eq!(p.daemons.find(&domain()), Some(revived));
    *node.domains.0.lock().unwrap() = unknown;
    // Channel prepares keep working on the revived daemon.
    let b = node.channel_claim("pod-b-channel", UID_B);
    prepare(&p, &b).await.unwrap();
    assert_eq!(p.daemons.find(&domain()), Some(revived));

    // Both claims deleted from the API with no unprepare: released.
    node.claims.remove("pod-a-channel");
    node.claims.remove("pod-b-channel");
    health::pass_for_tests(&p, &mut written).await;
    assert!(p.daemons.find(&domain()).is_none());
    assert_eq!(node.files("state/checkpoint"), Vec::<String>::new());
    assert_eq!(node.files("cdi"), Vec::<String>::new());
    assert_eq!(node.files("state/domains"), Vec::<String>::new());
    assert!(!node.channel_node().exists());
    // The kubelet's late unprepare is answered.
    unprepare(&p, &a).await;
}

/// A host-managed `nvidia-imex` (the driver root's program run by root, seen
/// in the node's process table): never a second daemon beside it; a
/// domain it lists is served through it, its readiness asked of it; a
/// domain it does not list is refused with what to do; it is never stopped.
#[tokio::test]
async fn a_host_managed_daemon_serves_the_domains_it_lists_and_refuses_the_others() {
    let node = Node::new(&[NODE]);
    // The host runs the driver root's own program, as root.
    let host_root = node.root().join("driver");
    let etc = node.root().join("etc/nvidia-imex");
    std::fs::create_dir_all(&etc).unwrap();
    let nodes = etc.join("nodes_config.cfg");
    std::fs::write(&nodes, "# this rack\n10.0.0.1\n10.0.0.7\n").unwrap();
    std::fs::write(etc.join("config.cfg"), imex::daemon_config(&nodes, &etc.join("imex.log"))).unwrap();
    let mut host = std::process::Command::new(host_root.join("usr/bin/nvidia-imex"))
        .arg("-c")
        .arg(etc.join("config.cfg"))
        .spawn()
        .unwrap();
    std::os::unix::fs::symlink(format!("/proc/{}", host.id()), node.root().join(format!("proc/{}", host.id())))
        .unwrap();
    while !etc.join("fake-imex.serving").exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    prepare(&p, &a).await.unwrap();
    let host_start = format!("start {} # this rack 10.0.0.1 10.0.0.7", etc.join("config.cfg").display());
    assert_eq!(node.imex_log(), std::slice::from_ref(&host_start), "no daemon of ours");
    assert_eq!(node.files("state/domains"), Vec::<String>::new());
    assert!(node.channel_node().exists());
    assert_eq!(node.conditions.written.lock().unwrap().last().unwrap().1, DaemonState::Ready);

    // Its readiness is the node's: not ready blocks new channels at once.
    std::fs::write(node.root().join("driver/imex.not-ready"), "").unwrap();
    let mut written = HashMap::new();
    health::pass_for_tests(&p, &mut written).await;
    assert_eq!(node.conditions.written.lock().unwrap().last().unwrap().1, DaemonState::NotReady("NOT_READY".into()));
    assert_eq!(node.imex_log(), std::slice::from_ref(&host_start), "the health loop starts none either");
    let b = node.channel_claim("pod-b-channel", UID_B);
    let error = prepare(&p, &b).await.unwrap_err();
    assert!(
        error.contains("is not ready (nvidia-imex-ctl: NOT_READY)")
            && error.contains(&format!("the host-managed nvidia-imex (pid {}", host.id())),
        "{error}"
    );
    std::fs::remove_file(node.root().join("driver/imex.not-ready")).unwrap();
    unprepare(&p, &a).await;
    assert!(!node.channel_node().exists());

    // A domain with a node the host's list lacks is refused, per claim.
    node.set_members(&[NODE, "gb200-1"]);
    let error = prepare(&p, &b).await.unwrap_err();
    assert!(
        error.starts_with(&format!(
            "node gb200-0 runs a host-managed nvidia-imex (pid {}, -c {}), and its node list {} lacks 10.0.0.2 of ComputeDomain team/job",
            host.id(),
            etc.join("config.cfg").display(),
            nodes.display()
        )) && error.contains("systemctl disable --now nvidia-imex"),
        "{error}"
    );
    assert_eq!(node.files("state/checkpoint"), Vec::<String>::new());
    assert_eq!(host.try_wait().unwrap(), None, "the host's daemon is never stopped");
    assert_eq!(fake_imex::daemon_log(&host_root), [host_start], "nor signalled, and no daemon of ours");
    host.kill().unwrap();
    host.wait().unwrap();
}

/// Just after a start the domain watch has not listed yet: a prepare waits
/// for it (bounded) instead of calling the domain deleted; a watch that
/// never lists is named in the error.
#[tokio::test]
async fn a_prepare_waits_for_the_domain_watchs_first_list() {
    use std::sync::atomic::Ordering;
    let node = Node::new(&[NODE]);
    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    let domain = node.domains.0.lock().unwrap().take();
    node.domains.1.store(true, Ordering::SeqCst);
    let error = prepare(&p, &a).await.unwrap_err();
    assert!(error.starts_with("the node agent has not yet listed ComputeDomains from the API after 1.5s"), "{error}");
    let domains = node.domains.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        *domains.0.lock().unwrap() = domain;
        domains.1.store(false, Ordering::SeqCst);
    });
    prepare(&p, &a).await.unwrap();
    unprepare(&p, &a).await;
    // Listed, and the domain is not there: at once.
    node.domains.0.lock().unwrap().take();
    let started = std::time::Instant::now();
    let error = prepare(&p, &a).await.unwrap_err();
    assert!(error.starts_with("no ComputeDomain with UID"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// The watch has listed but not yet delivered a domain made moments ago
/// (its claim was allocated first): the prepare reads it from the API
/// server rather than call it deleted. Seen in the real-cluster suites on
/// a loaded machine, where every channel prepare failed that way.
#[tokio::test]
async fn a_domain_the_watch_has_not_delivered_yet_is_read_from_the_api() {
    let node = Node::new(&[NODE]);
    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    let domain = node.domains.0.lock().unwrap().take();
    *node.domains.2.lock().unwrap() = domain.clone();
    // The watch delivers it a moment later; the prepare then waits for
    // the node's place in it as always.
    let domains = node.domains.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        *domains.0.lock().unwrap() = domain;
    });
    prepare(&p, &a).await.unwrap();
    unprepare(&p, &a).await;
}

#[tokio::test]
async fn an_api_server_that_cannot_be_read_is_said_so_not_that_the_domain_was_deleted() {
    let node = Node::new(&[NODE]);
    let p = node.open();
    let a = node.channel_claim("pod-a-channel", UID_A);
    node.domains.0.lock().unwrap().take();
    *node.domains.3.lock().unwrap() = Some(LookupError::ListFailed {
        what: "ComputeDomains in default".into(),
        reason: "503 Service Unavailable".into(),
    });
    let error = prepare(&p, &a).await.unwrap_err();
    assert!(error.contains("the API server could not be read") && error.contains("503"), "{error}");
    assert!(!error.contains("deleted"), "{error}");
}
