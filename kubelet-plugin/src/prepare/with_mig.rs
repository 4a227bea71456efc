//! The preparer's dynamic MIG steps: the checkpoint discipline of
//! [`super`] around [`crate::mig::lifecycle`]. A claim with dynamic MIG
//! devices is prepared as
//! 1. record `PrepareStarted` with each device's GPU, profile and
//!    placement (and each whole GPU to take out of MIG mode);
//! 2. switch those GPUs' MIG mode off, make the instances (largest first),
//!    read their UUIDs and caps minors;
//! 3. with the instances in the claim's view of the inventory, plan its
//!    MPS daemon and write its CDI spec (through the shared path when it
//!    shares GPUs, which records the instances before starting a daemon);
//! 4. record `PrepareCompleted` with the instances.
//!
//! Steps 1 to 4 run in one blocking task (1 and 2 for a claim that shares
//! its devices): each hand-off between the async workers and a blocking
//! thread adds a wake-up to the kubelet's wait.
//!
//! Any failure after 1 rolls back: the instances (found by placement, so
//! also those a crash left half-made) are destroyed in reverse creation
//! order, MIG mode is turned on again, then the spec and the record go.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_dra_driver::cdi::{self, DriverEdits};
use gpu_dra_driver::inventory::Inventory;
use gpu_dra_driver::names::{ClaimUid, DeviceName, DriverName};

use super::dynamic_mig::{self, DynamicPlan};
use super::error::UndoError;
use super::failure::{Failure, kind};
use super::files::Files;
use super::mps;
use super::offload::blocking;
use super::plan::PlannedDevice;
use super::preparer::Preparer;
use super::types::{ClaimSource, ValidClaim};
use crate::mig::lifecycle;
use crate::mig::lifecycle::MigHost;
use crate::observe::metrics::{ErrorKind, Operation};
use crate::prepared::PreparedDevice;
use crate::state::checkpoint::MigIntent;
use crate::state::checkpoint::{ClaimRecord, DynamicMigDevice};
use crate::state::kill_point::{self, Step};
use gpu_dra_driver::opaque_config::ResolvedConfig;

/// What the prepare planned before the dynamic MIG steps.
pub(super) struct Context<'a> {
    pub planned: &'a [PlannedDevice],
    pub resolved: &'a [ResolvedConfig],
    /// The node's inventory (not the claim's provisional view).
    pub inventory: &'a Arc<Inventory>,
}

impl<S: ClaimSource> Preparer<S> {
    pub(super) async fn prepare_dynamic(
        &self,
        claim: &ValidClaim,
        mut record: ClaimRecord,
        dynamic: DynamicPlan,
        cx: Context<'_>,
    ) -> Result<Vec<PreparedDevice>, Failure> {
        let uid = claim.uid.to_string();
        let Some(host) = self.config.mig.clone() else {
            return Err(Failure { kind: ErrorKind::Prepare, message: "no NVML for dynamic MIG".into() });
        };
        for (index, intent) in &dynamic.devices {
            record.devices[*index].dynamic_mig = Some(DynamicMigDevice { intent: intent.clone(), made: None });
        }
        for (index, off) in &dynamic.whole_gpus {
            record.devices[*index].mig_mode_off = Some(off.clone());
        }
        // Planned on stand-ins for the instances; planned again once they exist.
        let wants_daemon = record.mps.take().is_some();
        let shares = wants_daemon || record.devices.iter().any(|d| d.time_slice.is_some());
        let spec = SpecParts {
            driver: self.config.driver.clone(),
            edits: self.config.driver_edits.get(),
            inventory: Arc::clone(cx.inventory),
            uid: claim.uid.clone(),
            names: cx.planned.iter().map(|d| d.device.clone()).collect(),
            dev_root: self.config.dev_root.clone(),
        };
        let task = MakeTask {
            uid: claim.uid.clone(),
            files: self.files.clone(),
            host,
            started: record.clone(),
            made: dynamic.devices.iter().map(|(index, intent)| (*index, intent.clone())).collect(),
            whole: dynamic.whole_gpus.iter().map(|(_, w)| w.gpu_uuid.clone()).collect(),
            // A claim that shares its devices plans its MPS daemon on the
            // instances and writes its spec through the shared path.
            spec: (!shares).then_some(spec.clone()),
        };
        let done = match blocking(move || task.run()).await {
            Ok(done) => done,
            Err(error) => {
                // The task died (a panic): its record may be on disk.
                self.records().insert(uid.clone(), record);
                return Err(self.undo(claim, kind(ErrorKind::Prepare)(error)).await);
            }
        };
        if let Some(took) = done.nvml {
            self.nvml_took(Operation::Prepare, took);
        }
        match done.reached {
            Reached::NotRecorded(message) => Err(Failure { kind: ErrorKind::Checkpoint, message }),
            Reached::Failed(failure) => {
                self.records().insert(uid.clone(), record);
                Err(self.undo(claim, failure).await)
            }
            Reached::Completed(record) => {
                let devices = record.prepared_devices();
                self.records().insert(uid, record);
                self.tell_selection();
                tracing::info!(claim = %claim, devices = devices.len(), "prepared (dynamic MIG)");
                Ok(devices)
            }
            Reached::Made(mut made) => {
                self.records().insert(uid.clone(), made.clone());
                let bytes = match self.shared_spec(claim, &mut made, wants_daemon, &cx, &spec) {
                    Ok(bytes) => bytes,
                    Err(failure) => return Err(self.undo(claim, failure).await),
                };
                let prepared = self.prepare_shared(claim, made, bytes).await;
                self.tell_selection();
                prepared
            }
        }
    }

    /// The MPS daemon (now that its MIG UUIDs exist) and the CDI spec of a
    /// claim that shares its dynamic MIG devices.
    fn shared_spec(
        &self,
        claim: &ValidClaim,
        record: &mut ClaimRecord,
        wants_daemon: bool,
        cx: &Context<'_>,
        spec: &SpecParts,
    ) -> Result<Vec<u8>, Failure> {
        if wants_daemon {
            let view = dynamic_mig::overlay_record(cx.inventory, record);
            record.mps =
                mps::plan_daemon(&claim.uid, cx.planned, cx.resolved, &view, &self.config.gates, &self.config.mps_dir)
                    .map_err(kind(ErrorKind::Config))?;
        }
        spec.build(record)
    }

    /// Tells the dynamic GPU selection which MIG instances are the
    /// plugin's: those its ownership ledger holds, never a record's word.
    pub(super) fn tell_selection(&self) {
        let (Some(selection), Some(host)) = (&self.config.selection, &self.config.mig) else { return };
        selection.set_ours(crate::mig::ownership::owned_uuids(&host.ledger.all(), &self.config.boot_id));
    }

    /// Tells the selection which instances the plugin may have made but
    /// cannot prove (see [`crate::mig::ownership::withheld`]).
    pub(super) fn tell_withheld(&self) {
        let (Some(selection), Some(host)) = (&self.config.selection, &self.config.mig) else { return };
        let withheld = crate::mig::ownership::withheld(&host.ledger.all(), &self.config.boot_id, &*host.control);
        selection.set_withheld(withheld);
    }

    /// Rolls a failed dynamic prepare back; returns the failure to report.
    async fn undo(&self, claim: &ValidClaim, failure: Failure) -> Failure {
        if let Some(stale) = self.record(claim.uid.as_str())
            && let Err(undo) = self.roll_back(&claim.uid, stale).await
        {
            tracing::error!(claim = %claim, error = %undo, "rolling back a failed prepare failed; the next attempt or start-up retries");
        }
        failure
    }

    /// Destroys what the plugin made for the claim (reverse creation order)
    /// and turns MIG mode on again on the GPUs it turned off for it: all of
    /// it as the claim's ownership ledger proves, whatever the record (if
    /// any: a damaged one was set aside) names. Only on GPUs managed
    /// dynamically now for instances: a record never makes the plugin touch
    /// the instances of a GPU an administrator partitioned.
    pub(super) async fn unmake_dynamic(&self, uid: &str) -> Result<(), UndoError> {
        let Some(host) = self.config.mig.clone() else { return Ok(()) };
        if host.ledger.get(uid).is_none() {
            return Ok(());
        }
        let inventory = self.inventory.borrow().clone();
        let (uid, boot) = (uid.to_owned(), self.config.boot_id.clone());
        let (unmade, took) =
            blocking(move || timed(|| super::reconcile_mig::release(&host, &inventory, &uid, &boot))).await?;
        self.nvml_took(Operation::Unprepare, took);
        Ok(unmade?)
    }

    /// `gpu:<uuid>` lock keys of the GPUs the claim's ledger names.
    pub(super) fn ledger_gpu_keys(&self, uid: &str) -> Vec<String> {
        let Some(ledger) = self.config.mig.as_ref().and_then(|h| h.ledger.get(uid)) else { return Vec::new() };
        let mut gpus: Vec<&str> = ledger.instances.iter().map(|o| o.gpu_uuid.as_str()).collect();
        gpus.extend(ledger.mig_mode_off.iter().map(String::as_str));
        gpus.sort_unstable();
        gpus.dedup();
        gpus.into_iter().map(|gpu| format!("gpu:{gpu}")).collect()
    }

    /// Once the claim's record is gone: forgets its ledger (see
    /// [`super::reconcile_mig::forget`]) and tells the selection.
    pub(super) async fn forget_dynamic(&self, uid: &str) -> Result<(), UndoError> {
        let Some(host) = self.config.mig.clone() else { return Ok(()) };
        if host.ledger.get(uid).is_none() {
            return Ok(());
        }
        let owned_uid = uid.to_owned();
        blocking(move || super::reconcile_mig::forget(&host, &owned_uid)).await??;
        self.tell_selection();
        Ok(())
    }

    /// `gpu_dra_mig_nvml_duration_seconds`: NVML's share of a claim.
    fn nvml_took(&self, operation: Operation, took: Duration) {
        if let Some(metrics) = &self.metrics {
            metrics.mig_nvml(operation, took);
        }
    }
}

/// What a dynamic prepare's spec is built from, owned so that the
/// blocking task that makes the instances also writes the spec.
#[derive(Clone)]
struct SpecParts {
    driver: DriverName,
    edits: Arc<DriverEdits>,
    /// The node's inventory; the record's instances are laid over it.
    inventory: Arc<Inventory>,
    uid: ClaimUid,
    names: Vec<DeviceName>,
    dev_root: Option<PathBuf>,
}

impl SpecParts {
    /// The claim's CDI spec with the record's instances (and MPS daemon).
    fn build(&self, record: &ClaimRecord) -> Result<Vec<u8>, Failure> {
        let view = dynamic_mig::overlay_record(&self.inventory, record);
        let mut spec = cdi::claim_spec(&self.driver, &view, &self.edits, &self.uid, &self.names)
            .map_err(|e| format!("building the CDI spec: {e}"))
            .map_err(kind(ErrorKind::Cdi))?;
        if let Some(daemon) = &record.mps {
            mps::add_edits(&mut spec.spec, daemon, self.uid.as_str());
        }
        dynamic_mig::add_uuid_env(&mut spec.spec, self.uid.as_str(), record);
        if let Some(dev_root) = &self.dev_root {
            let edits = spec.spec.devices.iter().map(|d| &d.container_edits).chain([&spec.spec.container_edits]);
            crate::host::device_nodes::create_missing(dev_root, edits.flat_map(|e| &e.device_nodes));
        }
        spec.to_json().map_err(|e| format!("encoding the CDI spec: {e}")).map_err(kind(ErrorKind::Cdi))
    }
}

/// A dynamic prepare's blocking part, run on one thread so that the
/// kubelet's call waits for one hand-off rather than three: record
/// `PrepareStarted`, switch MIG mode and make the instances, then (for a
/// claim that shares nothing) write the spec and record `PrepareCompleted`.
struct MakeTask {
    uid: ClaimUid,
    files: Arc<Files>,
    host: MigHost,
    /// The `PrepareStarted` record, naming every intent.
    started: ClaimRecord,
    /// Each intent, by index in the record's devices, in the claim's order.
    made: Vec<(usize, MigIntent)>,
    /// Whole GPUs to take out of MIG mode.
    whole: Vec<String>,
    /// Set when the task also writes the spec and completes.
    spec: Option<SpecParts>,
}

/// How far a [`MakeTask`] got.
struct Done {
    reached: Reached,
    /// NVML's share, when the task got to call it.
    nvml: Option<Duration>,
}

enum Reached {
    /// `PrepareStarted` was not written: nothing to undo.
    NotRecorded(String),
    /// Failed after the record: the caller rolls back.
    Failed(Failure),
    /// The instances exist (in the record); the spec is the caller's.
    Made(ClaimRecord),
    /// The spec is written and the record says completed.
    Completed(ClaimRecord),
}

impl MakeTask {
    fn run(self) -> Done {
        let uid = self.uid;
        if let Err(error) = self.files.record_started(&uid, &self.started) {
            return Done { reached: Reached::NotRecorded(error.to_string()), nvml: None };
        }
        kill_point::reached(Step::AfterRecord);
        let mut own = self.host.ledger.claim(uid.as_str(), &self.started.boot_id);
        let (made, took) = timed(|| {
            for gpu in &self.whole {
                // Recorded before the switch: only the ledger lets it be undone.
                own.mig_mode_off(gpu)?;
                lifecycle::switch_mig_mode(&self.host, gpu, false)?;
            }
            let intents: Vec<&MigIntent> = self.made.iter().map(|(_, i)| i).collect();
            lifecycle::make_all(&self.host, &mut own, &intents)
        });
        let nvml = Some(took);
        let made = match made {
            Ok(made) => made,
            Err(error) => {
                let message = error.to_string();
                return Done { reached: Reached::Failed(Failure { kind: ErrorKind::Prepare, message }), nvml };
            }
        };
        let mut record = self.started;
        for ((index, _), instance) in self.made.iter().zip(made) {
            if let Some(mig) = record.devices.get_mut(*index).and_then(|d| d.dynamic_mig.as_mut()) {
                mig.made = Some(instance);
            }
        }
        let Some(spec) = self.spec else { return Done { reached: Reached::Made(record), nvml } };
        let reached = match spec.build(&record) {
            Ok(bytes) => match self.files.complete(&uid, record, &bytes) {
                Ok(record) => Reached::Completed(record),
                Err((kind, message)) => Reached::Failed(Failure { kind, message }),
            },
            Err(failure) => Reached::Failed(failure),
        };
        Done { reached, nvml }
    }
}

/// `work`'s result and how long it took.
fn timed<T>(work: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let result = work();
    (result, started.elapsed())
}
