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
//! Any failure after 1 rolls back: the instances (found by placement, so
//! also those a crash left half-made) are destroyed in reverse creation
//! order, MIG mode is turned on again, then the spec and the record go.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_dra_driver::cdi;
use gpu_dra_driver::inventory::Inventory;

use super::dynamic_mig::{self, DynamicPlan};
use super::plan::PlannedDevice;
use super::types::{ClaimSource, PreparedDevice, ValidClaim};
use super::{Failure, Preparer, blocking, kind, mps};
use crate::mig::kill_point::{self, Step};
use crate::mig::{MigIntent, lifecycle};
use crate::observe::metrics::{ErrorKind, Operation};
use crate::state::checkpoint::{ClaimRecord, DynamicMigDevice};
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

        let (files, owned_uid, started) = (self.files.clone(), claim.uid.clone(), record.clone());
        blocking(move || files.record_started(&owned_uid, &started))
            .await
            .and_then(|r| r)
            .map_err(kind(ErrorKind::Checkpoint))?;
        self.records().insert(uid.clone(), record.clone());
        kill_point::reached(Step::AfterRecord);

        let intents: Vec<MigIntent> = dynamic.devices.iter().map(|(_, i)| i.clone()).collect();
        let whole: Vec<String> = dynamic.whole_gpus.iter().map(|(_, w)| w.gpu_uuid.clone()).collect();
        let made = blocking(move || {
            timed(|| {
                for gpu in &whole {
                    lifecycle::switch_mig_mode(&host, gpu, false)?;
                }
                let refs: Vec<&MigIntent> = intents.iter().collect();
                lifecycle::make_all(&host, &refs)
            })
        })
        .await
        .and_then(|(made, took)| {
            self.nvml_took(Operation::Prepare, took);
            made
        });
        let made = match made {
            Ok(made) => made,
            Err(message) => return Err(self.undo(claim, Failure { kind: ErrorKind::Prepare, message }).await),
        };
        for ((index, _), instance) in dynamic.devices.iter().zip(made) {
            if let Some(mig) = record.devices[*index].dynamic_mig.as_mut() {
                mig.made = Some(instance);
            }
        }

        let spec = self.spec_with_instances(claim, &mut record, wants_daemon, &cx);
        let bytes = match spec {
            Ok(bytes) => bytes,
            Err(failure) => return Err(self.undo(claim, failure).await),
        };
        if record.mps.is_some() || record.devices.iter().any(|d| d.time_slice.is_some()) {
            let prepared = self.prepare_shared(claim, record, bytes).await;
            self.tell_selection();
            return prepared;
        }
        let (files, owned_uid) = (self.files.clone(), claim.uid.clone());
        let completed = blocking(move || files.complete(&owned_uid, record, &bytes))
            .await
            .map_err(|e| (ErrorKind::Checkpoint, e))
            .and_then(|r| r);
        match completed {
            Ok(record) => {
                let devices = record.prepared_devices();
                self.records().insert(uid, record);
                self.tell_selection();
                tracing::info!(claim = %claim, devices = devices.len(), "prepared (dynamic MIG)");
                Ok(devices)
            }
            Err((kind, message)) => Err(self.undo(claim, Failure { kind, message }).await),
        }
    }

    /// The claim's MPS daemon (now that its MIG UUIDs exist) and CDI spec.
    fn spec_with_instances(
        &self,
        claim: &ValidClaim,
        record: &mut ClaimRecord,
        wants_daemon: bool,
        cx: &Context<'_>,
    ) -> Result<Vec<u8>, Failure> {
        let view = dynamic_mig::overlay_record(cx.inventory, record);
        if wants_daemon {
            record.mps =
                mps::plan_daemon(&claim.uid, cx.planned, cx.resolved, &view, &self.config.gates, &self.config.mps_dir)
                    .map_err(kind(ErrorKind::Config))?;
        }
        let names: Vec<_> = cx.planned.iter().map(|d| d.device.clone()).collect();
        let edits = self.config.driver_edits.get();
        let mut spec = cdi::claim_spec(&self.config.driver, &view, &edits, &claim.uid, &names)
            .map_err(|e| format!("building the CDI spec: {e}"))
            .map_err(kind(ErrorKind::Cdi))?;
        if let Some(daemon) = &record.mps {
            mps::add_edits(&mut spec.spec, daemon, claim.uid.as_str());
        }
        dynamic_mig::add_uuid_env(&mut spec.spec, claim.uid.as_str(), record);
        if let Some(dev_root) = &self.config.dev_root {
            let edits = spec.spec.devices.iter().map(|d| &d.container_edits).chain([&spec.spec.container_edits]);
            crate::host::device_nodes::create_missing(dev_root, edits.flat_map(|e| &e.device_nodes));
        }
        spec.to_json().map_err(|e| format!("encoding the CDI spec: {e}")).map_err(kind(ErrorKind::Cdi))
    }

    /// Tells the dynamic GPU selection which MIG instances the records hold.
    pub(super) fn tell_selection(&self) {
        let Some(selection) = &self.config.selection else { return };
        let owned: Vec<String> = self
            .records()
            .values()
            .flat_map(|r| r.devices.iter())
            .filter_map(|d| d.dynamic_mig.as_ref()?.made.as_ref().map(|m| m.uuid.clone()))
            .collect();
        selection.set_ours(owned);
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

    /// Destroys a record's dynamic MIG devices (reverse creation order) and
    /// turns MIG mode on again on its whole GPUs. Only on GPUs managed
    /// dynamically now: a record never makes the plugin touch the instances
    /// of a GPU an administrator partitioned.
    pub(super) async fn unmake_dynamic(&self, record: &ClaimRecord) -> Result<(), String> {
        let intents: Vec<MigIntent> =
            record.devices.iter().filter_map(|d| d.dynamic_mig.as_ref()).map(|m| m.intent.clone()).collect();
        let whole: Vec<String> =
            record.devices.iter().filter_map(|d| d.mig_mode_off.as_ref()).map(|w| w.gpu_uuid.clone()).collect();
        if intents.is_empty() && whole.is_empty() {
            return Ok(());
        }
        let Some(host) = self.config.mig.clone() else {
            tracing::warn!(claim_uid = %record.uid, "the record names dynamic MIG devices but the plugin runs without NVML; left alone");
            return Ok(());
        };
        let inventory = self.inventory.borrow().clone();
        let (ours, foreign): (Vec<MigIntent>, Vec<MigIntent>) =
            intents.into_iter().partition(|i| dynamic_mig::is_dynamic(&inventory, &i.gpu_uuid));
        for intent in &foreign {
            tracing::warn!(claim_uid = %record.uid, gpu = %intent.gpu_uuid, "the record names a MIG device on a GPU not managed dynamically; its instances are left alone");
        }
        // (Once out of MIG mode, a GPU is no longer listed as dynamic.)
        let whole: Vec<String> =
            whole.into_iter().filter(|gpu| inventory.gpus.iter().any(|g| &g.uuid == gpu)).collect();
        let (unmade, took) = blocking(move || {
            timed(|| {
                let refs: Vec<&MigIntent> = ours.iter().collect();
                lifecycle::unmake_all(&host, &refs)?;
                for gpu in &whole {
                    lifecycle::switch_mig_mode(&host, gpu, true)?;
                }
                Ok(())
            })
        })
        .await?;
        self.nvml_took(Operation::Unprepare, took);
        unmade
    }

    /// `gpu_dra_mig_nvml_duration_seconds`: NVML's share of a claim.
    fn nvml_took(&self, operation: Operation, took: Duration) {
        if let Some(metrics) = &self.metrics {
            metrics.mig_nvml(operation, took);
        }
    }
}

/// `work`'s result and how long it took.
fn timed<T>(work: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let result = work();
    (result, started.elapsed())
}
