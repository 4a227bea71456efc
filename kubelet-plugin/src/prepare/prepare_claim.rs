//! The prepare of one claim whose lock the caller holds: read and plan it,
//! refuse what cannot be served, record it, make its changes (time-slices,
//! an MPS daemon, GPUs passed through), write its spec and complete, or
//! roll back.

use std::sync::Arc;

use gpu_dra_driver::cdi;
use tokio::time::Instant;

use super::failure::{Failure, kind};
use super::offload::blocking;
use super::plan::{self, PlanError, PlannedDevice};
use super::preparer::{Preparer, device_key, gpu_keys};
use super::reconcile;
use super::types::{ClaimSource, ValidClaim};
use super::{configs, dynamic_mig, mps, passthrough, sharing, with_mig};
use crate::deadline::Deadline;
use crate::observe::metrics::ErrorKind;
use crate::prepared::PreparedDevice;
use crate::state::checkpoint::{CheckpointDevice, ClaimRecord, PrepareState, TimeSlice, derived};

impl<S: ClaimSource> Preparer<S> {
    /// Prepares a claim whose lock the caller holds.
    pub(super) async fn prepare_locked(
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
        self.check_conflicts(&uid, &planned)?;
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
                let devices = record.prepared_devices();
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
    pub(super) async fn prepare_shared(
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
    pub(super) async fn record_started(&self, claim: &ValidClaim, record: &ClaimRecord) -> Result<(), Failure> {
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
    pub(super) async fn complete_or_roll_back(
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
                let devices = record.prepared_devices();
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

    /// A prepared claim's spec, written again when it is missing: someone
    /// emptied the CDI directory (a tmpfs) while the plugin ran, and the
    /// kubelet asks again because it is about to start the pod's
    /// containers, which the runtime cannot give their devices without it
    /// (kubernetes#141433: CreateContainerError for good). A stat when the
    /// spec is there.
    pub(super) async fn restore_spec(&self, claim: &ValidClaim) -> Result<(), Failure> {
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

    /// Refuses a device another claim holds, unless both share it (a
    /// `shareID` each) or either has admin access. The scheduler should
    /// never allocate that way, but the kubelet can ask to prepare a new
    /// claim before it unprepared the old one (kubernetes#136269).
    fn check_conflicts(&self, uid: &str, planned: &[PlannedDevice]) -> Result<(), Failure> {
        let records = self.records();
        for ours in planned.iter().filter(|d| !d.admin_access) {
            for other in records.values().filter(|r| r.uid != uid) {
                let clash = other.devices.iter().any(|theirs| {
                    theirs.device_name == ours.device.as_str()
                        && !theirs.admin_access
                        && (ours.share_id.is_none() || theirs.share_id.is_none())
                });
                if clash {
                    return Err(Failure {
                        kind: ErrorKind::Prepare,
                        message: format!(
                            "device {} is already prepared for ResourceClaim {}/{} ({}); a device serves one claim \
                             at a time unless both share it: wait for that claim to be unprepared",
                            ours.device, other.namespace, other.name, other.uid
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    pub(super) fn started_record(
        &self,
        claim: &ValidClaim,
        planned: &[PlannedDevice],
        spec: &cdi::ClaimSpec,
    ) -> ClaimRecord {
        ClaimRecord {
            uid: claim.uid.to_string(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: PrepareState::PrepareStarted,
            boot_id: self.config.boot_id.clone(),
            cdi_spec_file: Some(spec.file_name.clone()),
            devices: planned
                .iter()
                .map(|d| {
                    let prepared = PreparedDevice {
                        request_names: vec![d.request.clone()],
                        pool_name: d.pool.clone(),
                        device_name: d.device.to_string(),
                        cdi_device_ids: spec.device_id(&d.device).map(str::to_string).into_iter().collect(),
                        share_id: d.share_id.clone(),
                    };
                    CheckpointDevice::new(prepared, d.admin_access)
                })
                .collect(),
            mps: None,
            compute_domain: None,
            adopted: None,
        }
    }
}
