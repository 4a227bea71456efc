//! Prepare and unprepare: turn an allocated ResourceClaim into a CDI spec
//! the container runtime reads, and take it away again, so that a SIGKILL
//! at any instant loses nothing and doubles nothing.
//!
//! The protocol for one claim (under the claim's lock and its devices'
//! locks):
//! 1. a completed record answers at once (idempotent repeat), its spec
//!    written again first if it went missing (kubernetes#141433);
//! 2. read the claim, check UID, allocation, pool, inventory, configs;
//!    refuse a device another claim holds exclusively;
//! 3. record `PrepareStarted` with the devices and the spec file name (and
//!    what sharing will change: time-slices, the MPS daemon), then make
//!    those changes;
//! 4. write the CDI spec (atomic);
//! 5. record `PrepareCompleted`; answer.
//!
//! A failure after step 3 rolls back (spec file, then record). A kill
//! leaves a `PrepareStarted` record, which start-up rolls back
//! ([`reconcile`]); the kubelet then retries and gets a fresh prepare. A
//! spec file is never written without a record that names it, so start-up
//! can delete any spec file no record owns.

pub mod adopt;
pub mod claims;
mod config;
pub mod configs;
pub mod dynamic_mig;
mod error;
mod files;
pub mod locks;
pub mod mps;
mod offload;
pub mod passthrough;
pub mod plan;
pub mod reconcile;
mod reconcile_mig;
pub mod sharing;
pub mod types;
mod with_mig;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use gpu_dra_driver::cdi;
use gpu_dra_driver::inventory::{Inventory, PublishedDevice};
use gpu_dra_driver::names::{ClaimUid, DeviceName};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::claim_status::queue::{ClaimName, StatusQueue, Wanted, uuid_data};
use crate::deadline::Deadline;
use crate::observe::metrics::{ErrorKind, Metrics};
use crate::state::checkpoint::{CheckpointDevice, CheckpointDir, ClaimRecord, PrepareState, TimeSlice, derived};
use crate::state::durable;
pub use config::PreparerConfig;
use error::{Failure, kind};
pub use error::{OpenError, TaskError, UndoError};
use files::Files;
use locks::KeyedLocks;
use offload::{ALONE, blocking};
use plan::{PlanError, PlannedDevice};
pub use reconcile::ReconcileReport;
use types::{ClaimOutcome, ClaimRef, ClaimSource, PreparedDevice, ValidClaim};

/// Claims of one batch worked on at once: a batch of 10,000 claims holds
/// this many claim futures, not 10,000 (the API lookups have their own,
/// smaller bound: `ClaimSourceConfig::max_in_flight`).
const CONCURRENT_CLAIMS: usize = 64;

/// Prepares and unprepares claims; one per plugin process.
pub struct Preparer<S> {
    config: PreparerConfig,
    source: S,
    inventory: watch::Receiver<Arc<Inventory>>,
    files: Arc<Files>,
    /// Mirror of the checkpoint directory, by claim UID.
    records: Mutex<HashMap<String, ClaimRecord>>,
    locks: KeyedLocks,
    metrics: Option<Arc<Metrics>>,
    /// Damaged records and MIG ledger files start-up set aside.
    damaged_at_open: usize,
    /// Where each outcome's `status.devices` goes; `None`: nowhere.
    status: Option<StatusQueue>,
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

    fn count<T>(&self, result: Result<T, Failure>) -> Result<T, String> {
        result.map_err(|failure| {
            if let Some(metrics) = &self.metrics {
                metrics.error(failure.kind);
            }
            failure.message
        })
    }

    /// How many claims are prepared (completed records).
    pub fn prepared_claims(&self) -> usize {
        self.records().values().filter(|r| r.state == PrepareState::PrepareCompleted).count()
    }

    /// The completed claims and their devices, for telemetry.
    pub fn prepared(&self) -> Vec<crate::observe::telemetry::snapshot::PreparedClaim> {
        let mut out: Vec<_> = self
            .records()
            .values()
            .filter(|r| r.state == PrepareState::PrepareCompleted)
            .map(|r| crate::observe::telemetry::snapshot::PreparedClaim {
                uid: r.uid.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                devices: r.devices.iter().map(|d| d.device_name.clone()).collect(),
                made_mig: r
                    .devices
                    .iter()
                    .filter_map(|d| {
                        let made = d.dynamic_mig.as_ref()?.made.as_ref()?;
                        Some(crate::observe::telemetry::snapshot::MadeMigDevice {
                            device: d.device_name.clone(),
                            uuid: made.uuid.clone(),
                            gpu_instance_id: made.gpu_instance_id,
                        })
                    })
                    .collect(),
            })
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
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), String>> {
        self.unprepare_by(claims, Deadline::default_from_now()).await
    }

    /// Unprepares a batch; a claim that is not prepared succeeds.
    pub async fn unprepare_by(&self, claims: Vec<ClaimRef>, deadline: Deadline) -> HashMap<String, Result<(), String>> {
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
    async fn lock_until(
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

    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, ClaimRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Prepares a claim whose lock the caller holds.
    async fn prepare_locked(
        &self,
        claim: ValidClaim,
        deadline: Deadline,
        until: Instant,
    ) -> Result<Vec<PreparedDevice>, Failure> {
        let uid = claim.uid.to_string();
        if let Some(reason) = self.record(&uid).and_then(|r| r.adopted).and_then(|a| a.not_served) {
            return Err(Failure {
                kind: ErrorKind::Prepare,
                message: format!(
                    "ResourceClaim {}/{} was prepared on this node by NVIDIA's DRA driver, and this driver does not \
                     serve it: {reason}. Delete the pods that use it (the kubelet then unprepares it) and create \
                     them again with a new claim",
                    claim.namespace, claim.name
                ),
            });
        }
        if let Some(devices) = self.completed(&uid) {
            self.restore_spec(&claim).await?;
            return Ok(devices);
        }
        let lookup =
            self.source.get(&claim.namespace, &claim.name, until).await.map_err(kind(ErrorKind::ClaimLookup))?;
        let resource_claim = lookup
            .ok_or_else(|| {
                format!(
                    "ResourceClaim {}/{} not found: it was deleted; re-create the pod's claim",
                    claim.namespace, claim.name
                )
            })
            .map_err(kind(ErrorKind::ClaimLookup))?;
        let inventory = self.inventory.borrow().clone();
        let planned = match plan::plan(&resource_claim, &claim, &self.config.driver, &self.config.node, &inventory) {
            Ok(planned) => planned,
            Err(error) => {
                if matches!(error, PlanError::UidMismatch { .. }) {
                    self.source.forget(&claim.namespace, &claim.name);
                }
                return Err(kind(ErrorKind::Prepare)(error));
            }
        };
        let dynamic = dynamic_mig::plan(&planned, &inventory).map_err(kind(ErrorKind::Prepare))?;
        let passthrough = passthrough::plan(&planned, &inventory).map_err(kind(ErrorKind::Prepare))?;
        let base_inventory = inventory.clone();
        let inventory =
            if dynamic.is_empty() { inventory } else { Arc::new(dynamic_mig::provisional(&inventory, &dynamic)) };
        let resolved = configs::resolve(&self.config.driver, &resource_claim, &planned, &self.config.gates)
            .map_err(kind(ErrorKind::Config))?;
        let slices = sharing::time_slices(&planned, &resolved, &inventory).map_err(kind(ErrorKind::Config))?;
        let daemon =
            mps::plan_daemon(&claim.uid, &planned, &resolved, &inventory, &self.config.gates, &self.config.mps_dir)
                .map_err(kind(ErrorKind::Config))?;
        if planned.is_empty() {
            return Ok(Vec::new());
        }
        // An MPS daemon's GPUs are locked too: MIG devices of one GPU are
        // different devices, but share its compute mode.
        // Dynamic MIG devices of one GPU are different devices whose
        // placements must not overlap: their GPU is locked too.
        let keys = planned
            .iter()
            .map(|d| device_key(d.device.as_str()))
            .chain(daemon.iter().flat_map(gpu_keys))
            .chain(dynamic.gpus().map(|gpu| format!("gpu:{gpu}")))
            .chain(passthrough.iter().map(|t| device_key(&t.plain_name)));
        let _device_locks = self
            .lock_until(keys.collect(), deadline, until, "the claim's devices (another claim's call holds them)")
            .await?;
        self.check_conflicts(&uid, &planned).map_err(kind(ErrorKind::Prepare))?;
        passthrough::check_records(&uid, &planned, self.records().values()).map_err(kind(ErrorKind::Prepare))?;
        if !dynamic.is_empty() {
            if self.config.mig.is_none() {
                return Err(Failure {
                    kind: ErrorKind::Prepare,
                    message: "the claim has dynamic MIG devices, which are made through NVML, and this plugin runs                               without it (a fake inventory)"
                        .into(),
                });
            }
            dynamic_mig::check_records(&uid, &dynamic, self.records().values()).map_err(kind(ErrorKind::Prepare))?;
        }
        let time_sliced = slices.iter().any(Option::is_some);
        if !passthrough.is_empty() {
            let refuse = |message: &str| Failure { kind: ErrorKind::Prepare, message: message.to_owned() };
            if self.config.vfio.is_none() {
                return Err(refuse(
                    "the claim passes GPUs through (vfio-pci), which needs the node's sysfs, and this plugin runs \
                     on a fake inventory",
                ));
            }
            if time_sliced || daemon.is_some() || !dynamic.is_empty() {
                return Err(refuse(
                    "a claim that passes GPUs through (vfio-pci) cannot also share GPUs or make MIG devices: split \
                     it into two claims",
                ));
            }
        }
        if time_sliced || daemon.is_some() {
            let refuse = |message: &str| Failure { kind: ErrorKind::Config, message: message.to_owned() };
            if self.config.gpu_control.is_none() {
                return Err(refuse(
                    "GPU sharing (time-slicing, MPS) needs nvidia-smi from the NVIDIA driver: run the plugin with \
                     --driver-root",
                ));
            }
            if daemon.is_some() && self.config.mps_host.is_none() {
                return Err(refuse(
                    "MPS needs nvidia-cuda-mps-control from the NVIDIA driver, and there is none in the driver root: \
                     run the plugin with --driver-root pointing at a full driver installation",
                ));
            }
            let records = self.records();
            sharing::check_agreement(&uid, &claim.namespace, &claim.name, &slices, records.values())
                .map_err(kind(ErrorKind::Config))?;
            let sliced: Vec<String> = slices.iter().flatten().map(|s| s.gpu_uuid.clone()).collect();
            mps::check_compatible(&uid, &claim.namespace, &claim.name, daemon.as_ref(), &sliced, records.values())
                .map_err(kind(ErrorKind::Config))?;
        }
        if let Some(stale) = self.record(&uid) {
            // A previous attempt failed half-way and its roll-back failed too.
            self.roll_back(&claim.uid, stale).await.map_err(kind(ErrorKind::Cdi))?;
        }
        let names: Vec<_> = planned.iter().map(|d| d.device.clone()).collect();
        let edits = self.config.driver_edits.get();
        let mut spec = cdi::claim_spec(&self.config.driver, &inventory, &edits, &claim.uid, &names)
            .map_err(|e| format!("building the CDI spec: {e}"))
            .map_err(kind(ErrorKind::Cdi))?;
        if let Some(daemon) = &daemon {
            mps::add_edits(&mut spec.spec, daemon, &uid);
        }
        let mut record = self.started_record(&claim, &planned, &spec);
        for (device, slice) in record.devices.iter_mut().zip(slices) {
            device.time_slice = slice;
        }
        record.mps = daemon;
        if !dynamic.is_empty() {
            // The spec of stand-ins showed one can be built; the real one is
            // built once the instances exist (their device nodes with it).
            let context = with_mig::Context { planned: &planned, resolved: &resolved, inventory: &base_inventory };
            return self.prepare_dynamic(&claim, record, dynamic, context).await;
        }
        let bytes = spec.to_json().map_err(|e| format!("encoding the CDI spec: {e}")).map_err(kind(ErrorKind::Cdi))?;
        if let Some(dev_root) = &self.config.dev_root {
            let edits = spec.spec.devices.iter().map(|d| &d.container_edits).chain([&spec.spec.container_edits]);
            crate::host::device_nodes::create_missing(dev_root, edits.flat_map(|e| &e.device_nodes));
        }
        if !passthrough.is_empty() {
            return self.prepare_passthrough(&claim, record, passthrough, bytes).await;
        }
        if time_sliced || record.mps.is_some() {
            return self.prepare_shared(&claim, record, bytes).await;
        }
        let files = self.files.clone();
        let uid_for_files = claim.uid.clone();
        let written = blocking(move || files.write_prepared(&uid_for_files, record, &bytes))
            .await
            .map_err(kind(ErrorKind::Checkpoint))?;
        match written {
            Ok(record) => {
                let devices = PreparedDevice::of_record(&record);
                self.records().insert(uid, record);
                tracing::info!(claim = %claim, devices = names.len(), "prepared");
                Ok(devices)
            }
            Err(failure) => {
                if let Some(stale) = failure.left_behind {
                    self.records().insert(uid, *stale);
                }
                Err(Failure { kind: failure.kind, message: failure.message })
            }
        }
    }

    /// The prepare of a claim that shares GPUs: record the intent, set the
    /// time-slices and bring up the MPS daemon, then write the spec and
    /// complete; any failure after the record rolls back, resetting what
    /// no other claim needs.
    async fn prepare_shared(
        &self,
        claim: &ValidClaim,
        record: ClaimRecord,
        spec: Vec<u8>,
    ) -> Result<Vec<PreparedDevice>, Failure> {
        self.record_started(claim, &record).await?;
        let control = self.config.gpu_control.clone();
        let host = self.config.mps_host.clone();
        let timeouts = self.config.mps_timeouts;
        let to_set: Vec<TimeSlice> = record.devices.iter().filter_map(|d| d.time_slice.clone()).collect();
        let (files, owned_uid, mut started) = (self.files.clone(), claim.uid.clone(), record.clone());
        let applied = blocking(move || -> Result<ClaimRecord, (ErrorKind, String)> {
            let Some(control) = control else { return Ok(started) };
            for slice in &to_set {
                control
                    .set_time_slice(&slice.gpu_uuid, slice.interval)
                    .map_err(|e| (ErrorKind::Prepare, format!("setting the GPU time-slice: {e}")))?;
            }
            if let (Some(mut daemon), Some(host)) = (started.mps.clone(), host) {
                let mut progress = started.clone();
                let mut save = |d: &crate::state::checkpoint::MpsDaemon| {
                    progress.mps = Some(d.clone());
                    files.record_started(&owned_uid, &progress)
                };
                mps::lifecycle::bring_up(&*host, &*control, &mut daemon, timeouts, &mut save)
                    .map_err(|e| (ErrorKind::Prepare, format!("MPS: {e}")))?;
                started.mps = Some(daemon);
            }
            Ok(started)
        })
        .await
        .map_err(|e| (ErrorKind::Prepare, e.to_string()))
        .and_then(|r| r);
        self.complete_or_roll_back(claim, applied, spec, "prepared (shared)").await
    }

    /// The prepare of a claim that passes GPUs through: read each group's
    /// devices and drivers, record them (`PrepareStarted`), bind each group
    /// to `vfio-pci`, then write the spec and complete; any failure after
    /// the record gives every group back and rolls back (see
    /// [`crate::vfio`]).
    async fn prepare_passthrough(
        &self,
        claim: &ValidClaim,
        mut record: ClaimRecord,
        targets: Vec<passthrough::Target>,
        spec: Vec<u8>,
    ) -> Result<Vec<PreparedDevice>, Failure> {
        let host = self.config.vfio.clone().ok_or_else(|| Failure {
            kind: ErrorKind::Prepare,
            message: "the claim passes GPUs through, and this plugin has no sysfs".into(),
        })?;
        let reader = host.clone();
        let switches = blocking(move || -> Result<Vec<_>, String> {
            for t in &targets {
                crate::vfio::holders::wait_free(&*reader.holders, t.minor, reader.timing).map_err(|e| e.to_string())?;
            }
            targets
                .into_iter()
                .map(|t| {
                    let planned = crate::vfio::switch::plan(&*reader.binding, &t.gpu, t.group, &t.other_gpus);
                    planned.map(|s| (t.index, s)).map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(kind(ErrorKind::Prepare))?
        .map_err(kind(ErrorKind::Prepare))?;
        for (index, switch) in switches {
            if let Some(device) = record.devices.get_mut(index) {
                device.vfio = Some(switch);
            }
        }
        self.record_started(claim, &record).await?;
        crate::state::kill_point::reached(crate::state::kill_point::Step::VfioRecorded);
        let started = record.clone();
        let bound = blocking(move || -> Result<ClaimRecord, (ErrorKind, String)> {
            for recorded in started.devices.iter().filter_map(|d| d.vfio.as_ref()) {
                crate::vfio::switch::bind(&*host.binding, recorded, &mut crate::vfio::switch::kill_points, host.timing)
                    .map_err(|e| (ErrorKind::Prepare, e.to_string()))?;
            }
            Ok(started)
        })
        .await
        .map_err(|e| (ErrorKind::Prepare, e.to_string()))
        .and_then(|r| r);
        self.complete_or_roll_back(claim, bound, spec, "prepared (passed through)").await
    }

    /// Records `PrepareStarted` before a prepare's side effects.
    async fn record_started(&self, claim: &ValidClaim, record: &ClaimRecord) -> Result<(), Failure> {
        let files = self.files.clone();
        let (owned_uid, started) = (claim.uid.clone(), record.clone());
        blocking(move || files.record_started(&owned_uid, &started))
            .await
            .map_err(kind(ErrorKind::Checkpoint))?
            .map_err(kind(ErrorKind::Checkpoint))?;
        self.records().insert(claim.uid.to_string(), record.clone());
        Ok(())
    }

    /// After a recorded prepare's side effects: writes the spec and
    /// completes, or (they failed, or writing did) rolls everything back.
    async fn complete_or_roll_back(
        &self,
        claim: &ValidClaim,
        applied: Result<ClaimRecord, (ErrorKind, String)>,
        spec: Vec<u8>,
        done: &'static str,
    ) -> Result<Vec<PreparedDevice>, Failure> {
        let uid = claim.uid.to_string();
        let completed = match applied {
            Ok(record) => {
                let files = self.files.clone();
                let owned_uid = claim.uid.clone();
                blocking(move || files.complete(&owned_uid, record, &spec))
                    .await
                    .map_err(|e| (ErrorKind::Checkpoint, e.to_string()))
                    .and_then(|r| r)
            }
            Err(failure) => Err(failure),
        };
        match completed {
            Ok(record) => {
                let devices = PreparedDevice::of_record(&record);
                self.records().insert(uid, record);
                tracing::info!(claim = %claim, devices = devices.len(), "{done}");
                Ok(devices)
            }
            Err((kind, message)) => {
                if let Some(stale) = self.record(&uid)
                    && let Err(undo) = self.roll_back(&claim.uid, stale).await
                {
                    tracing::error!(claim = %claim, error = %undo, "rolling back a failed prepare failed; start-up retries");
                }
                Err(Failure { kind, message })
            }
        }
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

    /// Unprepares a claim whose lock the caller holds.
    async fn unprepare_locked(&self, claim: &ValidClaim, deadline: Deadline, until: Instant) -> Result<(), Failure> {
        let uid = claim.uid.to_string();
        match self.record(&uid) {
            Some(record) => {
                let keys = record.devices.iter().map(|d| device_key(&d.device_name));
                let keys = keys.chain(record.mps.iter().flat_map(gpu_keys)).collect();
                let _device_locks = self
                    .lock_until(keys, deadline, until, "the claim's devices (another claim's call holds them)")
                    .await?;
                self.roll_back(&claim.uid, record).await.map_err(kind(ErrorKind::Cdi))?;
                tracing::info!(claim = %claim, "unprepared");
            }
            None => {
                // Not prepared, or its record was damaged and set aside:
                // what the plugin provably made for it goes (no claim holds
                // it now), and no spec is left behind either way.
                let keys = self.ledger_gpu_keys(&uid);
                let _gpu_locks = if keys.is_empty() {
                    None
                } else {
                    Some(self.lock_until(keys, deadline, until, "the GPUs of the claim's MIG devices").await?)
                };
                self.unmake_dynamic(&uid).await.map_err(kind(ErrorKind::Unprepare))?;
                self.forget_dynamic(&uid).await.map_err(kind(ErrorKind::Unprepare))?;
                // NVIDIA's spec too: the kubelet says the claim is done, and a
                // claim prepared by NVIDIA's plugin and not adopted (its
                // checkpoint unreadable) leaves its spec under their name.
                let dir = self.config.cdi_dir.clone();
                let names = [
                    cdi::claim_spec_file_name(&self.config.driver, &claim.uid),
                    cdi::nvidia_claim_spec_file_name(&self.config.driver, &claim.uid),
                ];
                blocking(move || names.iter().try_for_each(|name| durable::remove(&dir, name).map(|_| ())))
                    .await
                    .map_err(kind(ErrorKind::Cdi))?
                    .map_err(|e| format!("removing CDI spec: {e}"))
                    .map_err(kind(ErrorKind::Cdi))?;
            }
        }
        Ok(())
    }

    /// A prepared claim's spec, written again when it is missing: someone
    /// emptied the CDI directory (a tmpfs) while the plugin ran, and the
    /// kubelet asks again because it is about to start the pod's
    /// containers, which the runtime cannot give their devices without it
    /// (kubernetes#141433: CreateContainerError for good). A stat when the
    /// spec is there.
    async fn restore_spec(&self, claim: &ValidClaim) -> Result<(), Failure> {
        let Some(record) = self.record(claim.uid.as_str()) else { return Ok(()) };
        let name = derived::spec_file(&record, &self.config.driver, &claim.uid);
        if self.config.cdi_dir.join(&name).exists() {
            return Ok(());
        }
        let (config, inventory, uid) = (self.config.clone(), self.inventory.borrow().clone(), claim.uid.clone());
        let rewritten = blocking(move || reconcile::restore_missing_spec(&config, &inventory, &uid, &record))
            .await
            .map_err(kind(ErrorKind::Cdi))?
            .map_err(kind(ErrorKind::Cdi))?;
        if rewritten {
            tracing::warn!(claim = %claim, "the CDI spec of a prepared claim was missing; written again");
        }
        Ok(())
    }

    fn record(&self, uid: &str) -> Option<ClaimRecord> {
        self.records().get(uid).cloned()
    }

    fn completed(&self, uid: &str) -> Option<Vec<PreparedDevice>> {
        let records = self.records();
        let record = records.get(uid).filter(|r| r.state == PrepareState::PrepareCompleted)?;
        Some(PreparedDevice::of_record(record))
    }

    /// Refuses a device another claim holds, unless both share it (a
    /// `shareID` each) or either has admin access. The scheduler should
    /// never allocate that way, but the kubelet can ask to prepare a new
    /// claim before it unprepared the old one (kubernetes#136269).
    fn check_conflicts(&self, uid: &str, planned: &[PlannedDevice]) -> Result<(), String> {
        let records = self.records();
        for ours in planned.iter().filter(|d| !d.admin_access) {
            for other in records.values().filter(|r| r.uid != uid) {
                let clash = other.devices.iter().any(|theirs| {
                    theirs.device_name == ours.device.as_str()
                        && !theirs.admin_access
                        && (ours.share_id.is_none() || theirs.share_id.is_none())
                });
                if clash {
                    return Err(format!(
                        "device {} is already prepared for ResourceClaim {}/{} ({}); a device serves one claim \
                         at a time unless both share it: wait for that claim to be unprepared",
                        ours.device, other.namespace, other.name, other.uid
                    ));
                }
            }
        }
        Ok(())
    }

    fn started_record(&self, claim: &ValidClaim, planned: &[PlannedDevice], spec: &cdi::ClaimSpec) -> ClaimRecord {
        ClaimRecord {
            uid: claim.uid.to_string(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: PrepareState::PrepareStarted,
            boot_id: self.config.boot_id.clone(),
            cdi_spec_file: Some(spec.file_name.clone()),
            devices: planned
                .iter()
                .map(|d| CheckpointDevice {
                    request_names: vec![d.request.clone()],
                    pool_name: d.pool.clone(),
                    device_name: d.device.to_string(),
                    cdi_device_ids: spec.device_id(&d.device).map(str::to_string).into_iter().collect(),
                    share_id: d.share_id.clone(),
                    admin_access: d.admin_access,
                    time_slice: None,
                    dynamic_mig: None,
                    mig_mode_off: None,
                    vfio: None,
                })
                .collect(),
            mps: None,
            compute_domain: None,
            adopted: None,
        }
    }

    /// Resets the time-slices only this claim needed, gives the GPUs it
    /// passed through back to their drivers, removes the claim's spec
    /// file, then its record (see [`Files::remove_claim`]), then
    /// forgets it. The reset comes first: if it fails the record stays, and
    /// the next attempt or start-up retries.
    async fn roll_back(&self, uid: &ClaimUid, record: ClaimRecord) -> Result<(), UndoError> {
        let all: Vec<ClaimRecord> = self.records().values().cloned().collect();
        let reset = sharing::to_reset(&record, all.iter());
        if !reset.is_empty()
            && let Some(control) = self.config.gpu_control.clone()
        {
            blocking(move || reset.iter().try_for_each(|gpu| control.reset_time_slice(gpu))).await??;
        }
        if let Some(daemon) = record.mps.clone() {
            let host = self.config.mps_host.clone().ok_or_else(|| UndoError::NoMpsControl(daemon.root.clone()))?;
            let control = self.config.gpu_control.clone();
            let to_default = mps::gpus_to_reset(&record, all.iter());
            let timeouts = self.config.mps_timeouts;
            blocking(move || -> Result<(), UndoError> {
                mps::lifecycle::tear_down(&*host, &daemon, timeouts).map_err(UndoError::Mps)?;
                let Some(control) = control else { return Ok(()) };
                to_default
                    .iter()
                    .try_for_each(|gpu| control.set_compute_mode(gpu, sharing::ComputeMode::Default))
                    .map_err(UndoError::from)
            })
            .await??;
        }
        let host = self.config.vfio.clone();
        let passed = record.clone();
        blocking(move || passthrough::give_back(host.as_ref(), &passed)).await??;
        self.unmake_dynamic(uid.as_str()).await?;
        // Derived, never taken from the record (see `checkpoint::derived`).
        let name = derived::spec_file(&record, &self.config.driver, uid);
        let (files, owned_uid) = (self.files.clone(), uid.clone());
        blocking(move || files.remove_claim(&owned_uid, &name)).await??;
        self.records().remove(uid.as_str());
        self.forget_dynamic(uid.as_str()).await
    }
}

fn validated(claim: &ClaimRef) -> Result<ValidClaim, Failure> {
    claim
        .validate()
        .map_err(|e| format!("{e} (the kubelet sent an invalid claim reference)"))
        .map_err(kind(ErrorKind::InvalidRequest))
}

fn claim_key(uid: &str) -> String {
    format!("claim:{uid}")
}

fn device_key(device: &str) -> String {
    format!("device:{device}")
}

fn gpu_keys(daemon: &crate::state::checkpoint::MpsDaemon) -> impl Iterator<Item = String> + '_ {
    daemon.gpus.iter().map(|gpu| format!("gpu:{gpu}"))
}

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_mig;
#[cfg(test)]
mod tests_mps;
#[cfg(test)]
mod tests_vfio;
