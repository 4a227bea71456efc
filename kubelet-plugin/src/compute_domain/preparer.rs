//! The ComputeDomain driver's preparer: its checkpoint, daemons and
//! device nodes, and the prepare and unprepare steps of the module's list
//! ([`super`]); start-up recovery and garbage collection live here too.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use gpu_dra_driver::cdi;
use gpu_dra_driver::compute_domain::api::{ComputeDomain, ComputeDomainNode};
use gpu_dra_driver::compute_domain::imex::{self, DaemonState};
use gpu_dra_driver::names::{ClaimUid, DomainUid};

use super::channel_claim::ChannelClaim;
use super::claim_plan;
use super::cluster::{ConditionWriter, DomainLookup};
use super::config::DomainConfig;
use super::created_nodes;
use super::daemons::{Daemons, Ensured};
use super::error::{Error, LookupError};
use super::imex_server::Server;
use super::records;
use crate::claim_status::refusal::WriteFailures;
use crate::deadline::Deadline;
use crate::kubelet_api::grpc::DraService;
use crate::observe::metrics::{ErrorKind, Metrics};
use crate::prepare::types::ClaimSource;
use crate::prepare::types::{ClaimError, ClaimOutcome, ClaimRef};
use crate::prepared::PreparedDevice;
use crate::state::checkpoint::{self as checkpoint, CheckpointDevice, CheckpointDir, ClaimRecord, PrepareState};
use crate::state::durable;
use crate::state::kill_point::{self, Step};

const CDI_FILE_MODE: u32 = 0o644;
/// How often a prepare re-checks what it waits for.
const POLL: Duration = Duration::from_millis(100);

/// The `compute-domain.nvidia.com` driver's prepare and unprepare, and
/// what they share with the health loop.
pub struct DomainPreparer<S, D, W> {
    pub(super) config: DomainConfig,
    pub(super) checkpoint: CheckpointDir,
    pub(crate) daemons: Arc<Daemons>,
    pub(super) claims: S,
    pub(crate) domains: D,
    pub(crate) conditions: W,
    /// One prepare or unprepare at a time: they share daemons and nodes.
    pub(super) lock: tokio::sync::Mutex<()>,
    /// The last answer of each domain's daemon (the health loop's).
    pub(crate) states: Mutex<HashMap<String, DaemonState>>,
    /// Condition writes that failed, logged once each.
    pub(crate) write_failures: WriteFailures,
    /// Damaged state files set aside, and where they are counted.
    damaged: AtomicU64,
    metrics: OnceLock<Arc<Metrics>>,
}

/// The usable records, and the claims whose records were set aside (their
/// spec files are kept: the claim may be in use).
struct Records {
    valid: Vec<(ClaimUid, ClaimRecord)>,
    set_aside_owners: BTreeSet<String>,
}

impl<S: ClaimSource, D: DomainLookup, W: ConditionWriter> DomainPreparer<S, D, W> {
    /// Opens the checkpoint and undoes what a killed predecessor left half done.
    pub fn open(config: DomainConfig, daemons: Daemons, claims: S, domains: D, conditions: W) -> Result<Self, Error> {
        durable::create_dir(&config.state_dir, 0o700)
            .map_err(|source| Error::CreateDir { path: config.state_dir.clone(), source })?;
        // Its own, not left to the GPU driver's preparer: with --gpus=false
        // this is the only writer of the directory.
        durable::create_dir(&config.cdi_dir, 0o755)
            .map_err(|source| Error::CreateCdiDir { path: config.cdi_dir.clone(), source })?;
        let checkpoint = CheckpointDir::open(config.state_dir.join("checkpoint"))?;
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
            damaged: AtomicU64::new(0),
            metrics: OnceLock::new(),
        };
        preparer.recover()?;
        Ok(preparer)
    }

    /// Counts damaged state in `metrics` (`gpu_dra_errors_total{kind="checkpoint"}`),
    /// including what start-up set aside before.
    pub fn count_damage_in(&self, metrics: Arc<Metrics>) {
        for _ in 0..self.damaged.load(Ordering::Relaxed) {
            metrics.error(ErrorKind::Checkpoint);
        }
        let _ = self.metrics.set(metrics);
    }

    /// Damaged state files set aside so far.
    pub fn damaged(&self) -> u64 {
        self.damaged.load(Ordering::Relaxed)
    }

    /// Sets the damaged state file `path` aside, with one log line saying
    /// why and what to do, and counts it.
    fn set_aside(&self, path: &std::path::Path, reason: &str, kept: &str) {
        let dir = path.parent().unwrap_or(&self.config.state_dir);
        match checkpoint::set_aside_file(dir, path) {
            Ok(aside) => tracing::error!(
                file = %path.display(), %reason, aside = %aside.display(),
                "damaged compute-domain state; set aside, nothing it names is touched: {kept}"
            ),
            Err(error) => {
                tracing::error!(file = %path.display(), %reason, %error, "damaged compute-domain state; setting it aside failed")
            }
        }
        self.damaged.fetch_add(1, Ordering::Relaxed);
        if let Some(metrics) = self.metrics.get() {
            metrics.error(ErrorKind::Checkpoint);
        }
    }

    /// The records, checked ([`records::check`]); damaged ones are set aside.
    fn load(&self) -> Result<Records, Error> {
        let loaded = self.checkpoint.load()?;
        let mut owners: BTreeSet<String> = loaded.set_aside_owners.into_iter().collect();
        const KEPT: &str = "the claim's CDI spec is kept until the kubelet unprepares it";
        for damaged in &loaded.damaged {
            self.set_aside(&damaged.path, &damaged.reason, KEPT);
            owners.insert(damaged.uid.clone());
            owners.extend(damaged.names_other.clone());
        }
        let mut valid = Vec::new();
        for record in loaded.records {
            match records::check(&record, &self.config.driver) {
                Ok(uid) => valid.push((uid, record)),
                Err(reason) => {
                    self.set_aside(&self.checkpoint.record_path(&record.uid), &reason.to_string(), KEPT);
                    owners.insert(record.uid);
                }
            }
        }
        Ok(Records { valid, set_aside_owners: owners })
    }

    pub(super) fn records(&self) -> Result<Vec<ClaimRecord>, Error> {
        Ok(self.load()?.valid.into_iter().map(|(_, record)| record).collect())
    }

    /// The claim's record, if usable; a damaged one is set aside.
    pub(super) fn record_of(&self, uid: &ClaimUid) -> Result<Option<ClaimRecord>, Error> {
        match self.checkpoint.read_one(uid) {
            Ok(Some(record)) => match records::check(&record, &self.config.driver) {
                Ok(_) => Ok(Some(record)),
                Err(reason) => {
                    let kept = "the claim's CDI spec is kept until the kubelet unprepares it";
                    self.set_aside(&self.checkpoint.record_path(uid.as_str()), &reason.to_string(), kept);
                    Ok(None)
                }
            },
            Ok(None) => Ok(None),
            Err(damaged) => {
                self.set_aside(&self.checkpoint.record_path(uid.as_str()), &damaged.reason, "");
                Ok(None)
            }
        }
    }

    /// Rolls back unfinished and other-boot records, then removes what no
    /// record needs: daemons, device nodes, spec files.
    fn recover(&self) -> Result<(), Error> {
        let loaded = self.load()?;
        for (uid, record) in &loaded.valid {
            let stale = record.state == PrepareState::PrepareStarted || record.boot_id != self.config.boot_id;
            if stale {
                tracing::info!(claim = %record.uid, state = ?record.state, "rolling back an unfinished compute-domain prepare");
                self.remove_claim(uid)?;
            }
        }
        let loaded = self.load()?;
        let mut owned: BTreeSet<String> =
            loaded.valid.iter().map(|(uid, _)| cdi::claim_spec_file_name(&self.config.driver, uid)).collect();
        for owner in &loaded.set_aside_owners {
            if let Ok(uid) = ClaimUid::new(owner.as_str()) {
                owned.insert(cdi::claim_spec_file_name(&self.config.driver, &uid));
            }
        }
        let prefix = cdi::claim_spec_file_prefix(&self.config.driver);
        if let Ok(entries) = std::fs::read_dir(&self.config.cdi_dir) {
            for name in entries.flatten().filter_map(|e| e.file_name().into_string().ok()) {
                if name.starts_with(&prefix) && !owned.contains(&name) {
                    tracing::info!(file = name, "removing a compute-domain CDI spec no record owns");
                    durable::remove(&self.config.cdi_dir, &name)
                        .map_err(|source| Error::RemoveStraySpec { name: name.clone(), source })?;
                }
            }
        }
        for stray in self.daemons.strays() {
            tracing::warn!(path = %stray.display(), "not a daemon directory the agent made (a directory named by a ComputeDomain UID); left alone");
        }
        // Checked now, so a damaged list is reported at start-up.
        let _ = self.created_nodes();
        let records: Vec<ClaimRecord> = loaded.valid.into_iter().map(|(_, record)| record).collect();
        self.collect_garbage(&records)?;
        self.revive_daemons(&records);
        Ok(())
    }

    /// Stops daemons of domains no record holds; removes created device
    /// nodes when no record holds a channel.
    fn collect_garbage(&self, records: &[ClaimRecord]) -> Result<(), Error> {
        let needed: BTreeSet<&DomainUid> =
            records.iter().filter_map(|r| r.compute_domain.as_ref()).map(|d| &d.domain_uid).collect();
        for domain in self.daemons.domains() {
            if !needed.contains(&domain) {
                self.daemons.stop(&domain)?;
                self.states.lock().unwrap_or_else(|p| p.into_inner()).remove(domain.as_str());
            }
        }
        let channels_held = records.iter().filter_map(|r| r.compute_domain.as_ref()).any(|d| !d.channels.is_empty());
        if channels_held {
            return Ok(());
        }
        let Some(created) = self.created_nodes() else { return Ok(()) };
        if let Some(root) = &self.config.dev_root {
            let major = self.channel_major();
            for id in created {
                if created_nodes::remove_node(root, id, major)? {
                    tracing::info!(channel = id, "removed a channel device node");
                }
            }
            let _ = std::fs::remove_dir(root.join(imex::CHANNEL_DIR.trim_start_matches('/')));
        }
        durable::remove(&self.config.state_dir, created_nodes::FILE).map_err(Error::ForgetCreatedNodes)?;
        Ok(())
    }

    /// The channels whose nodes this agent created; `None` when the list
    /// is damaged (set aside here: nothing it lists is removed).
    fn created_nodes(&self) -> Option<BTreeSet<u32>> {
        match created_nodes::read(&self.config.state_dir, self.config.dev_root.as_deref()) {
            Ok(channels) => Some(channels),
            Err(reason) => {
                let kept = "the channel device nodes it listed are left in place; remove a stale \
                    /dev/nvidia-caps-imex-channels/channel<N> by hand once no workload on the node uses it";
                self.set_aside(&self.config.state_dir.join(created_nodes::FILE), &reason.to_string(), kept);
                None
            }
        }
    }

    /// The IMEX channels' major, from `<proc>/devices`.
    fn channel_major(&self) -> Option<u32> {
        let devices = gpu_dra_driver::bounded_file::read_to_string(
            &self.config.proc_root.join("devices"),
            64 * 1024,
            gpu_dra_driver::bounded_file::Links::Follow,
        );
        devices.ok().and_then(|t| imex::channel_major(&t))
    }

    /// Removes the claim's record, then its spec, whose name is derived
    /// from the claim's UID (a spec no record owns is removed at start-up,
    /// so a kill between leaks nothing).
    fn remove_claim(&self, uid: &ClaimUid) -> Result<(), Error> {
        self.checkpoint.remove(uid)?;
        kill_point::reached(Step::DomainUnrecorded);
        let file = cdi::claim_spec_file_name(&self.config.driver, uid);
        if durable::remove(&self.config.cdi_dir, &file)
            .map_err(|source| Error::RemoveSpec { file: file.clone(), source })?
        {
            kill_point::reached(Step::DomainSpecRemoved);
        }
        Ok(())
    }

    /// The domain's nodes' addresses once this node is among them.
    pub(super) fn peers(&self, domain: &ComputeDomain) -> Option<Vec<IpAddr>> {
        let nodes: Vec<&ComputeDomainNode> =
            domain.status.as_ref().map(|s| s.nodes.iter().collect()).unwrap_or_default();
        nodes.iter().any(|n| n.name == self.config.node.as_str()).then(|| {
            let mut sorted = nodes.clone();
            sorted.sort_by_key(|n| n.index);
            sorted.iter().filter_map(|n| n.ip_address.parse().ok()).collect()
        })
    }

    async fn prepare_one(&self, claim: &ClaimRef, deadline: &Deadline) -> Result<Vec<PreparedDevice>, Error> {
        let valid = claim.validate()?;
        if let Some(record) = self.record_of(&valid.uid)? {
            if record.state == PrepareState::PrepareCompleted {
                return Ok(record.prepared_devices());
            }
            self.remove_claim(&valid.uid)?;
        }
        let until = deadline.work_until();
        let object = self
            .claims
            .get(&valid.namespace, &valid.name, until)
            .await
            .map_err(|e| Error::ClaimLookup(e.to_string()))?
            .ok_or_else(|| Error::NoClaim(valid.clone()))?;
        if object.metadata.uid.as_deref() != Some(valid.uid.as_str()) {
            self.claims.forget(&valid.namespace, &valid.name);
            return Err(Error::Replaced { claim: valid, uid: object.metadata.uid });
        }
        let plan = claim_plan::plan(&object, self.config.driver.as_str(), self.config.node.as_str())?;
        let domain_uid = plan.domain.domain_uid.clone();
        let found = self
            .find_domain(&valid.namespace, domain_uid.as_str(), until)
            .await
            .map_err(|reason| Error::DomainUnreadable { domain_uid: domain_uid.clone(), reason })?;
        let domain = found.ok_or_else(|| {
            if self.domains.synced() {
                Error::NoDomain { domain_uid: domain_uid.clone(), namespace: valid.namespace.clone() }
            } else {
                Error::DomainsNotListed { after: self.config.ready_timeout, domain_uid: domain_uid.clone() }
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
            adopted: None,
        };
        self.checkpoint.write(&valid.uid, &record)?;
        kill_point::reached(Step::DomainRecorded);
        match self.bring_up(&valid.uid, record, &plan, &domain_name, until).await {
            Ok(devices) => {
                let claim = ChannelClaim {
                    namespace: &valid.namespace,
                    name: &valid.name,
                    uid: valid.uid.as_str(),
                    domain_uid: domain_uid.as_str(),
                    // The plan has at least one device (claim_plan refuses none).
                    device: plan.devices.first().map_or("", |(_, device)| device.as_str()),
                };
                // A failure is the health loop's to retry (logged once).
                self.write_ready(&claim, &DaemonState::Ready).await;
                Ok(devices)
            }
            Err(error) => {
                let rollback = self.remove_claim(&valid.uid).and_then(|()| {
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
    async fn find_domain(
        &self,
        namespace: &str,
        uid: &str,
        until: tokio::time::Instant,
    ) -> Result<Option<ComputeDomain>, LookupError> {
        let wait_until = until.min(tokio::time::Instant::now() + self.config.ready_timeout);
        loop {
            let domain = self.domains.find(namespace, uid);
            if domain.is_some() {
                return Ok(domain);
            }
            if self.domains.synced() {
                return self.domains.read_live(namespace, uid).await;
            }
            if tokio::time::Instant::now() >= wait_until {
                return Ok(None);
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
    ) -> Result<Vec<PreparedDevice>, Error> {
        let domain_uid = &plan.domain.domain_uid;
        let wait_until = until.min(tokio::time::Instant::now() + self.config.ready_timeout);
        let node = self.config.node.as_str();
        let peers = loop {
            let domain = self.domains.find(&plan.domain.namespace, domain_uid.as_str());
            if let Some(peers) = domain.as_ref().and_then(|d| self.peers(d)) {
                break peers;
            }
            if tokio::time::Instant::now() >= wait_until {
                let listed: Vec<String> = domain
                    .and_then(|d| d.status)
                    .map(|s| s.nodes.into_iter().map(|n| n.name).collect())
                    .unwrap_or_default();
                return Err(Error::NotJoined {
                    node: node.to_owned(),
                    domain: domain_name.to_owned(),
                    after: self.config.ready_timeout,
                    listed,
                });
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
            self.states.lock().unwrap_or_else(|p| p.into_inner()).insert(domain_uid.to_string(), state.clone());
            match state {
                DaemonState::Ready => break,
                DaemonState::NotReady(answer) if ensured == Ensured::Unchanged => {
                    return Err(Error::NotReady {
                        domain: domain_name.to_owned(),
                        node: node.to_owned(),
                        answer,
                        hint: log_hint,
                    });
                }
                DaemonState::NotReady(answer) if tokio::time::Instant::now() >= wait_until => {
                    return Err(Error::NeverReady {
                        domain: domain_name.to_owned(),
                        node: node.to_owned(),
                        after: self.config.ready_timeout,
                        answer,
                        hint: log_hint,
                    });
                }
                DaemonState::NotReady(_) => tokio::time::sleep(POLL).await,
            }
        }
        let major = self.channel_major();
        let (spec, mut devices) = claim_plan::cdi_spec(&self.config.driver, uid, plan, major, domain_name)?;
        if let (Some(root), Some(major)) = (&self.config.dev_root, major) {
            self.create_nodes(root, major, &plan.domain.channels)?;
        }
        for device in &mut devices {
            device.pool_name = node.to_owned();
        }
        let spec_file = cdi::claim_spec_file_name(&self.config.driver, uid);
        let bytes = serde_json::to_vec_pretty(&spec).map_err(Error::EncodeSpec)?;
        durable::write(&self.config.cdi_dir, &spec_file, &bytes, CDI_FILE_MODE)
            .map_err(|source| Error::WriteSpec { file: spec_file.clone(), source })?;
        kill_point::reached(Step::DomainSpecWritten);
        record.devices = devices.iter().map(|d| CheckpointDevice::new(d.clone(), false)).collect();
        record.state = PrepareState::PrepareCompleted;
        self.checkpoint.write(uid, &record)?;
        kill_point::reached(Step::DomainCompleted);
        Ok(devices)
    }

    /// Creates the missing channel nodes, recording each before it exists.
    fn create_nodes(&self, dev_root: &std::path::Path, major: u32, channels: &[u32]) -> Result<(), Error> {
        let Some(mut created) = self.created_nodes() else {
            return Err(Error::CreatedNodesDamaged(self.config.state_dir.join(created_nodes::FILE)));
        };
        for id in channels {
            let path = dev_root.join(imex::channel_path(*id).trim_start_matches('/'));
            if std::fs::symlink_metadata(&path).is_ok() {
                continue;
            }
            if created.insert(*id) {
                created_nodes::write(&self.config.state_dir, &created).map_err(Error::RecordCreatedNodes)?;
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

    async fn unprepare_one(&self, claim: &ClaimRef) -> Result<(), Error> {
        let valid = claim.validate()?;
        self.release(&valid.uid)
    }

    /// Removes the claim's record and spec, then what no record needs.
    pub(crate) fn release(&self, uid: &ClaimUid) -> Result<(), Error> {
        // A record set aside as damaged leaves its spec for this unprepare.
        self.record_of(uid)?;
        self.remove_claim(uid)?;
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

    pub(crate) fn peers_of(&self, namespace: &str, uid: &DomainUid) -> Option<Vec<IpAddr>> {
        self.domains.find(namespace, uid.as_str()).and_then(|d| self.peers(&d))
    }
}

impl<S: ClaimSource, D: DomainLookup, W: ConditionWriter> DraService for DomainPreparer<S, D, W> {
    async fn prepare(&self, claims: Vec<ClaimRef>, deadline: Deadline) -> HashMap<String, ClaimOutcome> {
        let _guard = self.lock.lock().await;
        let mut out = HashMap::new();
        for claim in claims {
            // The kubelet's answer carries the message.
            let outcome = self.prepare_one(&claim, &deadline).await.map_err(ClaimError::service);
            if let Err(error) = &outcome {
                tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), %error, "compute-domain prepare failed");
            }
            out.insert(claim.uid.clone(), outcome);
        }
        out
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>, _deadline: Deadline) -> HashMap<String, Result<(), ClaimError>> {
        let _guard = self.lock.lock().await;
        let mut out = HashMap::new();
        for claim in claims {
            out.insert(claim.uid.clone(), self.unprepare_one(&claim).await.map_err(ClaimError::service));
        }
        out
    }
}
