//! The node agent's ComputeDomain side: the `compute-domain.nvidia.com`
//! driver, served by the same process as the GPU driver (`run
//! --compute-domains`) with its own registration, sockets, slice pool,
//! checkpoint and CDI specs.
//!
//! One process serves both because both read the same inventory (a node's
//! clique is its GPUs' fabric clique): a second process would open a second
//! NVML session and a second API watch for nothing. The IMEX daemon is
//! the node agent's child, not a pod's: a channel is prepared only when the
//! domain's daemon on this node answers ready, and the agent is the one
//! that knows, without an API round trip.
//!
//! Prepare (channel or daemon claim), each step recorded first:
//! 1. the claim's plan ([`claim_plan`]): domain, channels;
//! 2. checkpoint `PrepareStarted`;
//! 3. wait (bounded) until the domain's status lists this node, then write
//!    the IMEX configuration with the domain's node addresses and start
//!    `nvidia-imex` (or tell a running one the new peers) ([`daemons`]);
//!    beside a host-managed `nvidia-imex`, check that it lists the domain's
//!    nodes instead, else refuse the claim ([`host_imex`]);
//! 4. wait (bounded) until `nvidia-imex-ctl -q` answers READY; a daemon
//!    that was already running and is not ready fails the prepare at once;
//! 5. create the channel device nodes a fresh node lacks;
//! 6. CDI spec, checkpoint `PrepareCompleted`, and the device's `Ready`
//!    condition on the claim (which the controller aggregates into the
//!    domain's status).
//!
//! A failure rolls back the claim's record and spec, and stops the
//! domain's daemon when no other claim of it remains. Start-up rolls back
//! every `PrepareStarted` record, stops daemons no record needs, and
//! starts again the daemons of prepared claims that died with the
//! previous agent. Unprepare removes the record first, then the spec, then
//! what no record needs; a kill between leaves files start-up removes.
//! The health loop also releases claims deleted from the API while the
//! kubelet could not unprepare them, so no daemon runs on for nothing.
//! Every step between two side effects is a kill point for the crash
//! tests ([`crate::state::kill_point`]).

pub mod claim_plan;
pub mod daemons;
pub mod health;
pub mod host_imex;
pub mod ready_condition;
pub mod serve;
mod serving;
pub mod status;

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_dra_driver::cdi;
use gpu_dra_driver::compute_domain::api::{ComputeDomain, ComputeDomainNode};
use gpu_dra_driver::compute_domain::imex::{self, DaemonState};
use gpu_dra_driver::names::{ClaimUid, DriverName, NodeName};

use crate::kubelet_api::grpc::{ClaimOutcome, ClaimRef, Deadline, DraService, PreparedDevice};
use crate::prepare::types::ClaimSource;
use crate::state::checkpoint::{CheckpointDevice, CheckpointDir, ClaimRecord, PrepareState};
use crate::state::durable;
use crate::state::kill_point::{self, Step};
use daemons::{Daemons, Ensured};
use ready_condition::{ChannelClaim, ConditionError, Explanation, WriteFailures};
pub(crate) use serving::Server;

/// The record of device nodes this agent created (removed when no claim
/// holds a channel any more).
const CREATED_NODES: &str = "device-nodes.json";
const CDI_FILE_MODE: u32 = 0o644;
/// How often a prepare re-checks what it waits for.
const POLL: Duration = Duration::from_millis(100);

/// Where the agent finds ComputeDomains (a reflector store in `run`, a map
/// in tests): the domain with `uid` in `namespace`.
pub trait DomainLookup: Send + Sync + 'static {
    fn find(&self, namespace: &str, uid: &str) -> Option<ComputeDomain>;

    /// Whether the lookup has heard the API's whole list once (a domain
    /// it lacks before then may just not have arrived yet).
    fn synced(&self) -> bool {
        true
    }
}

/// Writes the `Ready` condition of a prepared device on its claim, and
/// the Event that explains why the API server refuses it.
pub trait ConditionWriter: Send + Sync + 'static {
    fn set_ready(
        &self,
        namespace: &str,
        name: &str,
        device: &str,
        state: &DaemonState,
    ) -> impl std::future::Future<Output = Result<(), ConditionError>> + Send;

    fn explain(&self, explanation: &Explanation) -> impl std::future::Future<Output = Result<(), String>> + Send;
}

#[derive(Debug, Clone)]
pub struct DomainConfig {
    pub driver: DriverName,
    pub node: NodeName,
    pub cdi_dir: PathBuf,
    /// `<state-dir>/compute-domains`: checkpoint, daemons, created nodes.
    pub state_dir: PathBuf,
    pub boot_id: String,
    /// Where the host's `/dev` is; `None`: create no device nodes.
    pub dev_root: Option<PathBuf>,
    /// The host's `/proc` (`devices` names the channels' major).
    pub proc_root: PathBuf,
    /// How long a prepare waits for the node to join the domain and for a
    /// fresh daemon to become ready.
    pub ready_timeout: Duration,
}

pub struct DomainPreparer<S, D, W> {
    config: DomainConfig,
    checkpoint: CheckpointDir,
    pub(crate) daemons: Arc<Daemons>,
    claims: S,
    pub(crate) domains: D,
    pub(crate) conditions: W,
    /// One prepare or unprepare at a time: they share daemons and nodes.
    lock: tokio::sync::Mutex<()>,
    /// The last answer of each domain's daemon (the health loop's).
    pub(crate) states: Mutex<HashMap<String, DaemonState>>,
    /// Condition writes that failed, logged once each.
    pub(crate) write_failures: WriteFailures,
}

impl<S: ClaimSource, D: DomainLookup, W: ConditionWriter> DomainPreparer<S, D, W> {
    /// Opens the checkpoint and undoes what a killed predecessor left half done.
    pub fn open(config: DomainConfig, daemons: Daemons, claims: S, domains: D, conditions: W) -> Result<Self, String> {
        durable::create_dir(&config.state_dir, 0o700)
            .map_err(|e| format!("creating {}: {e}", config.state_dir.display()))?;
        let checkpoint = CheckpointDir::open(config.state_dir.join("checkpoint")).map_err(|e| e.to_string())?;
        let preparer = Self {
            config,
            checkpoint,
            daemons: Arc::new(daemons),
            claims,
            domains,
            conditions,
            lock: tokio::sync::Mutex::new(()),
            states: Mutex::new(HashMap::new()),
            write_failures: WriteFailures::default(),
        };
        preparer.recover()?;
        Ok(preparer)
    }

    fn records(&self) -> Result<Vec<ClaimRecord>, String> {
        let loaded = self.checkpoint.load().map_err(|e| e.to_string())?;
        for damaged in &loaded.damaged {
            tracing::warn!(path = %damaged.path.display(), reason = %damaged.reason, "unreadable compute-domain record kept aside");
        }
        Ok(loaded.records)
    }

    /// Rolls back unfinished and other-boot records, then removes what no
    /// record needs: daemons, device nodes, spec files.
    fn recover(&self) -> Result<(), String> {
        for record in self.records()? {
            let stale = record.state == PrepareState::PrepareStarted || record.boot_id != self.config.boot_id;
            if stale {
                let uid = ClaimUid::new(record.uid.as_str()).map_err(|e| e.to_string())?;
                tracing::info!(claim = %record.uid, state = ?record.state, "rolling back an unfinished compute-domain prepare");
                self.remove_claim(&uid, record.cdi_spec_file.as_deref())?;
            }
        }
        let records = self.records()?;
        let owned: BTreeSet<String> = records.iter().filter_map(|r| r.cdi_spec_file.clone()).collect();
        let prefix = cdi::claim_spec_file_prefix(&self.config.driver);
        if let Ok(entries) = std::fs::read_dir(&self.config.cdi_dir) {
            for name in entries.flatten().filter_map(|e| e.file_name().into_string().ok()) {
                if name.starts_with(&prefix) && !owned.contains(&name) {
                    tracing::info!(file = name, "removing a compute-domain CDI spec no record owns");
                    durable::remove(&self.config.cdi_dir, &name).map_err(|e| format!("removing {name}: {e}"))?;
                }
            }
        }
        self.collect_garbage(&records)?;
        self.revive_daemons(&records);
        Ok(())
    }

    /// Stops daemons of domains no record holds; removes created device
    /// nodes when no record holds a channel.
    fn collect_garbage(&self, records: &[ClaimRecord]) -> Result<(), String> {
        let needed: BTreeSet<&str> =
            records.iter().filter_map(|r| r.compute_domain.as_ref()).map(|d| d.domain_uid.as_str()).collect();
        for domain in self.daemons.domains() {
            if !needed.contains(domain.as_str()) {
                self.daemons.stop(&domain)?;
                self.states.lock().unwrap_or_else(|p| p.into_inner()).remove(&domain);
            }
        }
        let channels_held = records.iter().filter_map(|r| r.compute_domain.as_ref()).any(|d| !d.channels.is_empty());
        if !channels_held {
            for path in self.created_nodes() {
                match std::fs::remove_file(&path) {
                    Ok(()) => tracing::info!(path = %path.display(), "removed a channel device node"),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(format!("removing {}: {e}", path.display())),
                }
            }
            if let Some(root) = &self.config.dev_root {
                let _ = std::fs::remove_dir(root.join(imex::CHANNEL_DIR.trim_start_matches('/')));
            }
            durable::remove(&self.config.state_dir, CREATED_NODES).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn created_nodes(&self) -> Vec<PathBuf> {
        std::fs::read(self.config.state_dir.join(CREATED_NODES))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Removes the claim's record, then its spec (a spec no record owns is
    /// removed at start-up, so a kill between leaks nothing).
    fn remove_claim(&self, uid: &ClaimUid, spec_file: Option<&str>) -> Result<(), String> {
        self.checkpoint.remove(uid).map_err(|e| e.to_string())?;
        kill_point::reached(Step::DomainUnrecorded);
        if let Some(file) = spec_file {
            durable::remove(&self.config.cdi_dir, file).map_err(|e| format!("removing CDI spec {file}: {e}"))?;
            kill_point::reached(Step::DomainSpecRemoved);
        }
        Ok(())
    }

    /// The domain's nodes' addresses once this node is among them.
    fn peers(&self, domain: &ComputeDomain) -> Option<Vec<IpAddr>> {
        let nodes: Vec<&ComputeDomainNode> =
            domain.status.as_ref().map(|s| s.nodes.iter().collect()).unwrap_or_default();
        nodes.iter().any(|n| n.name == self.config.node.as_str()).then(|| {
            let mut sorted = nodes.clone();
            sorted.sort_by_key(|n| n.index);
            sorted.iter().filter_map(|n| n.ip_address.parse().ok()).collect()
        })
    }

    async fn prepare_one(&self, claim: &ClaimRef, deadline: &Deadline) -> ClaimOutcome {
        let valid = claim.validate().map_err(|e| e.to_string())?;
        if let Some(record) = self.checkpoint.read_one(&valid.uid)? {
            if record.state == PrepareState::PrepareCompleted {
                return Ok(record.prepared_devices());
            }
            self.remove_claim(&valid.uid, record.cdi_spec_file.as_deref())?;
        }
        let until = deadline.work_until();
        let object = self
            .claims
            .get(&valid.namespace, &valid.name, until)
            .await?
            .ok_or_else(|| format!("claim {valid} does not exist"))?;
        if object.metadata.uid.as_deref() != Some(valid.uid.as_str()) {
            self.claims.forget(&valid.namespace, &valid.name);
            return Err(format!("claim {valid} was replaced (its UID is now {:?})", object.metadata.uid));
        }
        let plan = claim_plan::plan(&object, self.config.driver.as_str(), self.config.node.as_str())?;
        let domain_uid = plan.domain.domain_uid.clone();
        let domain = self.find_domain(&valid.namespace, &domain_uid, until).await.ok_or_else(|| {
            if self.domains.synced() {
                format!(
                    "no ComputeDomain with UID {domain_uid} in namespace {}: it was deleted, or the claim's config names another namespace's domain",
                    valid.namespace
                )
            } else {
                format!(
                    "the node agent has not yet listed ComputeDomains from the API after {:?} (is the computedomains.resource.nvidia.com CRD installed, and may the agent list it?); ComputeDomain {domain_uid} unknown so far",
                    self.config.ready_timeout
                )
            }
        })?;
        let domain_name = format!("{}/{}", valid.namespace, domain.metadata.name.clone().unwrap_or_default());
        let spec_file = cdi::claim_spec_file_name(&self.config.driver, &valid.uid);
        let record = ClaimRecord {
            uid: valid.uid.to_string(),
            namespace: valid.namespace.clone(),
            name: valid.name.clone(),
            state: PrepareState::PrepareStarted,
            boot_id: self.config.boot_id.clone(),
            cdi_spec_file: Some(spec_file.clone()),
            devices: Vec::new(),
            mps: None,
            compute_domain: Some(plan.domain.clone()),
        };
        self.checkpoint.write(&valid.uid, &record).map_err(|e| e.to_string())?;
        kill_point::reached(Step::DomainRecorded);
        match self.bring_up(&valid.uid, record, &plan, &domain_name, until).await {
            Ok(devices) => {
                let claim = ChannelClaim {
                    namespace: &valid.namespace,
                    name: &valid.name,
                    uid: valid.uid.as_str(),
                    domain_uid: &domain_uid,
                    // The plan has at least one device (claim_plan refuses none).
                    device: plan.devices.first().map_or("", |(_, device)| device.as_str()),
                };
                // A failure is the health loop's to retry (logged once).
                self.write_ready(&claim, &DaemonState::Ready).await;
                Ok(devices)
            }
            Err(error) => {
                let rollback = self.remove_claim(&valid.uid, Some(&spec_file)).and_then(|()| {
                    let records = self.records()?;
                    self.collect_garbage(&records)
                });
                if let Err(more) = rollback {
                    tracing::warn!(claim = %valid, error = %more, "roll-back incomplete; start-up retries it");
                }
                Err(error)
            }
        }
    }

    /// The domain, waiting (bounded) for the domain watch's first list
    /// after a start: the kubelet prepares again as soon as the agent is back.
    async fn find_domain(&self, namespace: &str, uid: &str, until: tokio::time::Instant) -> Option<ComputeDomain> {
        let wait_until = until.min(tokio::time::Instant::now() + self.config.ready_timeout);
        loop {
            let domain = self.domains.find(namespace, uid);
            if domain.is_some() || self.domains.synced() || tokio::time::Instant::now() >= wait_until {
                return domain;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Steps 3 to 6 of the module's list.
    async fn bring_up(
        &self,
        uid: &ClaimUid,
        mut record: ClaimRecord,
        plan: &claim_plan::ClaimPlan,
        domain_name: &str,
        until: tokio::time::Instant,
    ) -> Result<Vec<PreparedDevice>, String> {
        let domain_uid = &plan.domain.domain_uid;
        let wait_until = until.min(tokio::time::Instant::now() + self.config.ready_timeout);
        let node = self.config.node.as_str();
        let peers = loop {
            let domain = self.domains.find(&plan.domain.namespace, domain_uid);
            if let Some(peers) = domain.as_ref().and_then(|d| self.peers(d)) {
                break peers;
            }
            if tokio::time::Instant::now() >= wait_until {
                let listed: Vec<String> = domain
                    .and_then(|d| d.status)
                    .map(|s| s.nodes.into_iter().map(|n| n.name).collect())
                    .unwrap_or_default();
                return Err(format!(
                    "node {node} has not joined ComputeDomain {domain_name} after {:?} (its status lists [{}]): the domain's Events say why (another NVLink clique, no clique, no address), or the controller (gpu-dra-controller run --compute-domains) is not running",
                    self.config.ready_timeout,
                    listed.join(", ")
                ));
            }
            tokio::time::sleep(POLL).await;
        };
        let server = self.server(domain_uid, &peers, domain_name)?;
        let (ensured, log_hint) = match &server {
            Server::Own => (
                self.daemons.ensure(domain_uid, &peers)?,
                format!("see {}", self.daemons.log_file(domain_uid).display()),
            ),
            Server::Host(host) => (
                Ensured::Unchanged,
                format!(
                    "the host-managed nvidia-imex (pid {}, -c {}) serves this node",
                    host.pid,
                    host.config.display()
                ),
            ),
        };
        loop {
            let state = self.query(domain_uid, &server).await;
            self.states.lock().unwrap_or_else(|p| p.into_inner()).insert(domain_uid.clone(), state.clone());
            match state {
                DaemonState::Ready => break,
                DaemonState::NotReady(answer) if ensured == Ensured::Unchanged => {
                    return Err(format!(
                        "the IMEX daemon of ComputeDomain {domain_name} on node {node} is not ready (nvidia-imex-ctl: {answer}): no new channels are prepared here until it is; {log_hint}"
                    ));
                }
                DaemonState::NotReady(answer) if tokio::time::Instant::now() >= wait_until => {
                    return Err(format!(
                        "the IMEX daemon of ComputeDomain {domain_name} on node {node} did not become ready in {:?} (nvidia-imex-ctl: {answer}); {log_hint}",
                        self.config.ready_timeout
                    ));
                }
                DaemonState::NotReady(_) => tokio::time::sleep(POLL).await,
            }
        }
        let major =
            std::fs::read_to_string(self.config.proc_root.join("devices")).ok().and_then(|t| imex::channel_major(&t));
        let (spec, mut devices) = claim_plan::cdi_spec(&self.config.driver, uid, plan, major, domain_name)?;
        if let (Some(root), Some(major)) = (&self.config.dev_root, major) {
            self.create_nodes(root, major, &plan.domain.channels)?;
        }
        for device in &mut devices {
            device.pool_name = node.to_owned();
        }
        let spec_file = record.cdi_spec_file.clone().unwrap_or_default();
        let bytes = serde_json::to_vec_pretty(&spec).map_err(|e| e.to_string())?;
        durable::write(&self.config.cdi_dir, &spec_file, &bytes, CDI_FILE_MODE)
            .map_err(|e| format!("writing CDI spec {spec_file}: {e}"))?;
        kill_point::reached(Step::DomainSpecWritten);
        record.devices = devices
            .iter()
            .map(|d| CheckpointDevice {
                request_names: d.request_names.clone(),
                pool_name: d.pool_name.clone(),
                device_name: d.device_name.clone(),
                cdi_device_ids: d.cdi_device_ids.clone(),
                share_id: None,
                admin_access: false,
                time_slice: None,
                dynamic_mig: None,
                mig_mode_off: None,
            })
            .collect();
        record.state = PrepareState::PrepareCompleted;
        self.checkpoint.write(uid, &record).map_err(|e| e.to_string())?;
        kill_point::reached(Step::DomainCompleted);
        Ok(devices)
    }

    /// Creates the missing channel nodes, recording each before it exists.
    fn create_nodes(&self, dev_root: &std::path::Path, major: u32, channels: &[u32]) -> Result<(), String> {
        let mut created = self.created_nodes();
        for id in channels {
            let path = dev_root.join(imex::channel_path(*id).trim_start_matches('/'));
            if std::fs::symlink_metadata(&path).is_ok() {
                continue;
            }
            if !created.contains(&path) {
                created.push(path.clone());
                let bytes = serde_json::to_vec(&created).map_err(|e| e.to_string())?;
                durable::write(&self.config.state_dir, CREATED_NODES, &bytes, 0o600)
                    .map_err(|e| format!("recording device nodes: {e}"))?;
            }
            let node = gpu_dra_driver::cdi::spec::DeviceNode::char(imex::channel_path(*id), major, *id);
            if crate::host::device_nodes::create_missing(dev_root, [&node]).is_empty() {
                tracing::warn!(path = %path.display(), "channel device node not created; the container runtime creates it from the spec");
            } else {
                kill_point::reached(Step::DomainNodeCreated);
            }
        }
        Ok(())
    }

    async fn unprepare_one(&self, claim: &ClaimRef) -> Result<(), String> {
        let valid = claim.validate().map_err(|e| e.to_string())?;
        self.release(&valid.uid)
    }

    /// Removes the claim's record and spec, then what no record needs.
    pub(crate) fn release(&self, uid: &ClaimUid) -> Result<(), String> {
        if let Some(record) = self.checkpoint.read_one(uid)? {
            self.remove_claim(uid, record.cdi_spec_file.as_deref())?;
        }
        let records = self.records()?;
        self.collect_garbage(&records)
    }

    /// Records of prepared claims, for the health loop.
    pub(crate) fn prepared(&self) -> Vec<ClaimRecord> {
        self.records().unwrap_or_default().into_iter().filter(|r| r.state == PrepareState::PrepareCompleted).collect()
    }

    pub(crate) fn node(&self) -> &str {
        self.config.node.as_str()
    }

    pub(crate) fn peers_of(&self, namespace: &str, uid: &str) -> Option<Vec<IpAddr>> {
        self.domains.find(namespace, uid).and_then(|d| self.peers(&d))
    }
}

impl<S: ClaimSource, D: DomainLookup, W: ConditionWriter> DraService for DomainPreparer<S, D, W> {
    async fn prepare(&self, claims: Vec<ClaimRef>, deadline: Deadline) -> HashMap<String, ClaimOutcome> {
        let _guard = self.lock.lock().await;
        let mut out = HashMap::new();
        for claim in claims {
            let outcome = self.prepare_one(&claim, &deadline).await;
            if let Err(error) = &outcome {
                tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), %error, "compute-domain prepare failed");
            }
            out.insert(claim.uid.clone(), outcome);
        }
        out
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>, _deadline: Deadline) -> HashMap<String, Result<(), String>> {
        let _guard = self.lock.lock().await;
        let mut out = HashMap::new();
        for claim in claims {
            out.insert(claim.uid.clone(), self.unprepare_one(&claim).await);
        }
        out
    }
}

#[cfg(test)]
mod tests;
