//! The preparer: one per plugin process, it holds the checkpoint's mirror,
//! the locks and the inventory, and serves the kubelet's batches a claim
//! at a time (see [`super`] for the protocol of one claim).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use gpu_dra_driver::inventory::{Inventory, PublishedDevice};
use gpu_dra_driver::names::DeviceName;
use tokio::sync::watch;
use tokio::time::Instant;

use super::config::PreparerConfig;
use super::error::OpenError;
use super::failure::{Failure, kind};
use super::files::Files;
use super::locks::{self, KeyedLocks};
use super::offload::ALONE;
use super::reconcile::{self, ReconcileReport};
use super::types::{ClaimError, ClaimOutcome, ClaimRef, ClaimSource, ValidClaim};
use crate::claim_status::queue::{ClaimName, StatusQueue, Wanted, uuid_data};
use crate::deadline::Deadline;
use crate::observe::metrics::{ErrorKind, Metrics};
use crate::observe::telemetry::snapshot::PreparedClaim;
use crate::prepared::PreparedDevice;
use crate::state::checkpoint::{CheckpointDevice, CheckpointDir, ClaimRecord, PrepareState};
use crate::state::durable;

/// Claims of one batch worked on at once: a batch of 10,000 claims holds
/// this many claim futures, not 10,000 (the API lookups have their own,
/// smaller bound: `ClaimSourceConfig::max_in_flight`).
const CONCURRENT_CLAIMS: usize = 64;

/// Prepares and unprepares claims; one per plugin process.
pub struct Preparer<S> {
    pub(super) config: PreparerConfig,
    pub(super) source: S,
    pub(super) inventory: watch::Receiver<Arc<Inventory>>,
    pub(super) files: Arc<Files>,
    /// Mirror of the checkpoint directory, by claim UID.
    pub(super) records: Mutex<HashMap<String, ClaimRecord>>,
    pub(super) locks: KeyedLocks,
    pub(super) metrics: Option<Arc<Metrics>>,
    /// Damaged records and MIG ledger files start-up set aside.
    pub(super) damaged_at_open: usize,
    /// Where each outcome's `status.devices` goes; `None`: nowhere.
    pub(super) status: Option<StatusQueue>,
}

impl<S: ClaimSource> Preparer<S> {
    /// Opens the checkpoint and reconciles it with the CDI directory (see
    /// [`reconcile`]) before any claim is served.
    pub fn open(
        config: PreparerConfig,
        source: S,
        inventory: watch::Receiver<Arc<Inventory>>,
    ) -> Result<(Self, ReconcileReport), OpenError> {
        let checkpoint = CheckpointDir::open(&config.checkpoint_dir)?;
        durable::create_dir(&config.cdi_dir, 0o755)
            .map_err(|error| OpenError::CdiDir { path: config.cdi_dir.clone(), error })?;
        let snapshot = inventory.borrow().clone();
        let (records, report) = reconcile::reconcile(&config, &checkpoint, &snapshot)?;
        let files = Arc::new(Files { checkpoint, cdi_dir: config.cdi_dir.clone() });
        let damaged_at_open = report.damaged.len() + report.mig.damaged_ledgers;
        let preparer = Self {
            config,
            source,
            files,
            inventory,
            records: Mutex::new(records),
            locks: KeyedLocks::default(),
            metrics: None,
            damaged_at_open,
            status: None,
        };
        preparer.tell_selection();
        preparer.tell_withheld();
        Ok((preparer, report))
    }

    /// Counts failures by kind in `metrics` (`gpu_dra_errors_total`); the
    /// damaged records and MIG ledger files start-up set aside count as
    /// `kind="checkpoint"`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        for _ in 0..self.damaged_at_open {
            metrics.error(ErrorKind::Checkpoint);
        }
        self.metrics = Some(metrics);
        self
    }

    /// Tells each claim's outcome to `queue`, which writes the claim's
    /// `status.devices` without holding up the answer.
    pub fn with_status_queue(mut self, queue: StatusQueue) -> Self {
        self.status = Some(queue);
        self
    }

    /// Waits until the claims' status writes are done (tests).
    pub async fn settled_status(&self) {
        if let Some(queue) = &self.status {
            queue.settled().await;
        }
    }

    /// Hands the claim's wanted status to the queue (under the claim's
    /// lock, so one claim's wishes arrive in the order of its calls).
    fn tell_status(&self, claim: &ValidClaim, wanted: impl FnOnce() -> Wanted) {
        if let Some(queue) = &self.status {
            let name =
                ClaimName { namespace: claim.namespace.clone(), name: claim.name.clone(), uid: claim.uid.to_string() };
            queue.submit(name, wanted());
        }
    }

    /// A prepared claim's devices' UUIDs, by device name: a dynamic MIG
    /// device's is the instance prepare made, others' the inventory's.
    fn device_uuids(&self, uid: &str) -> BTreeMap<String, serde_json::Value> {
        let Some(record) = self.record(uid) else { return BTreeMap::new() };
        let inventory = self.inventory.borrow().clone();
        let uuid_of = |device: &CheckpointDevice| -> Option<String> {
            if let Some(made) = device.dynamic_mig.as_ref().and_then(|m| m.made.as_ref()) {
                return Some(made.uuid.clone());
            }
            let name = DeviceName::new(device.device_name.as_str()).ok()?;
            Some(match inventory.find_device(&name)? {
                PublishedDevice::Gpu(gpu) | PublishedDevice::Vfio(gpu) => gpu.uuid.clone(),
                PublishedDevice::Mig { mig, .. } => mig.uuid.clone(),
                PublishedDevice::DynamicMig { .. } => return None,
            })
        };
        record.devices.iter().filter_map(|d| Some((d.device_name.clone(), uuid_data(&uuid_of(d)?)))).collect()
    }

    fn count<T>(&self, result: Result<T, Failure>) -> Result<T, ClaimError> {
        result.map_err(|failure| {
            if let Some(metrics) = &self.metrics {
                metrics.error(failure.kind);
            }
            ClaimError::from(failure)
        })
    }

    /// How many claims are prepared (completed records).
    pub fn prepared_claims(&self) -> usize {
        self.records().values().filter(|r| r.state == PrepareState::PrepareCompleted).count()
    }

    /// The completed claims and their devices, for telemetry.
    pub fn prepared(&self) -> Vec<PreparedClaim> {
        let mut out: Vec<_> = self
            .records()
            .values()
            .filter(|r| r.state == PrepareState::PrepareCompleted)
            .map(PreparedClaim::of_record)
            .collect();
        out.sort_by(|a, b| a.uid.cmp(&b.uid));
        out
    }

    /// Prepares a batch with the default deadline (see [`Self::prepare_by`]).
    pub async fn prepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, ClaimOutcome> {
        self.prepare_by(claims, Deadline::default_from_now()).await
    }

    /// Prepares a batch; claims run concurrently (a bounded number at a
    /// time), one result per UID. A claim still waiting for a lock or the
    /// API server at the deadline fails with that cause, holding nothing.
    pub async fn prepare_by(&self, claims: Vec<ClaimRef>, deadline: Deadline) -> HashMap<String, ClaimOutcome> {
        let until = deadline.work_until();
        if let [claim] = claims.as_slice() {
            let outcome = ALONE.scope(true, self.prepare_one(claim, deadline, until)).await;
            return HashMap::from([(claim.uid.clone(), self.count(outcome))]);
        }
        let work = claims.into_iter().map(|claim| async move {
            let outcome = self.count(self.prepare_one(&claim, deadline, until).await);
            (claim.uid, outcome)
        });
        futures::stream::iter(work).buffer_unordered(CONCURRENT_CLAIMS).collect().await
    }

    /// Unprepares a batch with the default deadline.
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), ClaimError>> {
        self.unprepare_by(claims, Deadline::default_from_now()).await
    }

    /// Unprepares a batch; a claim that is not prepared succeeds.
    pub async fn unprepare_by(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Deadline,
    ) -> HashMap<String, Result<(), ClaimError>> {
        let until = deadline.work_until();
        if let [claim] = claims.as_slice() {
            let outcome = ALONE.scope(true, self.unprepare_one(claim, deadline, until)).await;
            return HashMap::from([(claim.uid.clone(), self.count(outcome))]);
        }
        let work = claims.into_iter().map(|claim| async move {
            let outcome = self.count(self.unprepare_one(&claim, deadline, until).await);
            (claim.uid, outcome)
        });
        futures::stream::iter(work).buffer_unordered(CONCURRENT_CLAIMS).collect().await
    }

    /// Takes `keys` unless `until` passes first; then fails naming `what`
    /// it waited for. Nothing is held after a failure.
    pub(super) async fn lock_until(
        &self,
        keys: Vec<String>,
        deadline: Deadline,
        until: Instant,
        what: &str,
    ) -> Result<locks::Held<'_>, Failure> {
        tokio::time::timeout_at(until, self.locks.lock(keys)).await.map_err(|_| Failure {
            kind: ErrorKind::Deadline,
            message: format!(
                "gave up after {:.1?} of the kubelet's {:.1?} deadline waiting for {what}; the kubelet retries",
                deadline.received.elapsed(),
                deadline.timeout
            ),
        })
    }

    pub(super) fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, ClaimRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn record(&self, uid: &str) -> Option<ClaimRecord> {
        self.records().get(uid).cloned()
    }

    pub(super) fn completed(&self, uid: &str) -> Option<Vec<PreparedDevice>> {
        let records = self.records();
        let record = records.get(uid).filter(|r| r.state == PrepareState::PrepareCompleted)?;
        Some(record.prepared_devices())
    }

    async fn prepare_one(
        &self,
        claim: &ClaimRef,
        deadline: Deadline,
        until: Instant,
    ) -> Result<Vec<PreparedDevice>, Failure> {
        let claim = validated(claim)?;
        let uid = claim.uid.to_string();
        let _claim_lock =
            self.lock_until(vec![claim_key(&uid)], deadline, until, "another call for this claim to finish").await?;
        let outcome = self.prepare_locked(claim.clone(), deadline, until).await;
        self.tell_status(&claim, || match &outcome {
            Ok(_) => Wanted::ready(self.config.node.as_str(), self.device_uuids(&uid)),
            Err(failure) => Wanted::failed(&failure.message),
        });
        outcome
    }

    async fn unprepare_one(&self, claim: &ClaimRef, deadline: Deadline, until: Instant) -> Result<(), Failure> {
        let claim = validated(claim)?;
        let uid = claim.uid.to_string();
        let _claim_lock =
            self.lock_until(vec![claim_key(&uid)], deadline, until, "another call for this claim to finish").await?;
        let outcome = self.unprepare_locked(&claim, deadline, until).await;
        if outcome.is_ok() {
            self.tell_status(&claim, || Wanted::Unprepared);
        }
        outcome
    }
}

pub(super) fn validated(claim: &ClaimRef) -> Result<ValidClaim, Failure> {
    claim
        .validate()
        .map_err(|e| format!("{e} (the kubelet sent an invalid claim reference)"))
        .map_err(kind(ErrorKind::InvalidRequest))
}

pub(super) fn claim_key(uid: &str) -> String {
    format!("claim:{uid}")
}

pub(super) fn device_key(device: &str) -> String {
    format!("device:{device}")
}

pub(super) fn gpu_keys(daemon: &crate::state::checkpoint::MpsDaemon) -> impl Iterator<Item = String> + '_ {
    daemon.gpus.iter().map(|gpu| format!("gpu:{gpu}"))
}
