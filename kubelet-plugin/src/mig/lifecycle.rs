//! Making and destroying dynamic MIG devices, step by step, with a kill
//! point between every two side effects (see [`crate::state::kill_point`]).
//! Every function here is idempotent against the GPU's real state: an
//! instance is found by its profile and placement, so a retry after any
//! crash finds what the earlier attempt left. Each step is written to the
//! claim's ownership ledger ([`super::ledger`]) as it happens, and an
//! instance is destroyed only where the ledger and NVML agree it is the one
//! the plugin made ([`super::ownership`]).

use std::path::PathBuf;
use std::sync::Arc;

use super::caps;
use super::control::ObservedInstance;
use super::control::{MigControl, MigControlError, MigModeState};
use super::error::Error;
use super::ledger::{ClaimOwnership, Ledger};
use super::order;
use super::ownership::{self, Proof};
use crate::state::checkpoint::{MadeInstance, MigIntent};
use crate::state::kill_point::{self, Step};

/// What dynamic MIG works with on a node: NVML, the `/proc` that shows
/// new instances' capabilities, and who must hear of a MIG mode switch.
#[derive(Clone)]
pub struct MigHost {
    pub control: Arc<dyn MigControl>,
    pub proc_root: PathBuf,
    /// Told after every MIG mode switch; `None` where nothing follows it.
    pub mode_observer: Option<Arc<dyn MigModeObserver>>,
    /// What the plugin made, recorded as it made it.
    pub ledger: Arc<Ledger>,
}

/// Hears that the plugin switched a GPU's MIG mode, so what the node
/// publishes follows the GPU: out of MIG mode it is one whole GPU, back in
/// MIG mode it offers its MIG devices again. Called from blocking threads.
pub trait MigModeObserver: Send + Sync {
    fn mig_mode_switched(&self, gpu_uuid: &str);
}

/// How messages name a device: profile, memory slices and GPU.
fn device_text(intent: &MigIntent) -> String {
    format!(
        "MIG device {} at memory slices {}..{} of GPU {} ({})",
        intent.profile,
        intent.placement_start,
        intent.placement_start + intent.placement_size,
        intent.gpu_minor,
        intent.gpu_uuid
    )
}

/// `intent`'s step of making failed with `source`.
fn making(intent: &MigIntent, source: impl Into<Error>) -> Error {
    Error::Making { device: device_text(intent), source: Box::new(source.into()) }
}

/// `intent`'s step of removing failed with `source`.
fn removing(intent: &MigIntent, source: impl Into<Error>) -> Error {
    Error::Removing { device: device_text(intent), source: Box::new(source.into()) }
}

impl std::fmt::Debug for MigHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigHost").field("proc_root", &self.proc_root).finish_non_exhaustive()
    }
}

/// Makes one device: its GPU instance at its placement, the compute
/// instance spanning it, then reads its UUID and caps minors. The ledger
/// hears of each step: before the create call, right after it returned
/// (the GPU-instance id), right after the compute instance (the first is
/// skipped when [`make_all`] already wrote it for the claim). A failure
/// after the GPU instance destroys it again (best effort: the caller's
/// roll-back retries, through the ledger).
pub fn make(host: &MigHost, own: &mut ClaimOwnership<'_>, intent: &MigIntent) -> Result<MadeInstance, Error> {
    let control = &*host.control;
    own.creating(intent).map_err(|e| making(intent, e))?;
    let gi = match control.create_gpu_instance(&intent.gpu_uuid, intent.profile_id, intent.placement()) {
        Ok(gi) => gi,
        Err(error) => {
            // Nothing was made: the entry must not adopt whatever is there.
            if let Err(undo) = own.destroyed(intent) {
                tracing::warn!(%undo, "recording a MIG device that was not made failed");
            }
            return Err(making(intent, error));
        }
    };
    let finish = |own: &mut ClaimOwnership<'_>| -> Result<MadeInstance, Error> {
        own.made_gpu_instance(intent, gi)?;
        kill_point::reached(Step::AfterGpuInstance);
        let (ci, uuid) = control.create_compute_instance(&intent.gpu_uuid, gi, intent.compute_profile_index)?;
        own.made_compute_instance(intent, gi, ci, &uuid)?;
        kill_point::reached(Step::AfterComputeInstance);
        let (gi_cap, ci_cap) = caps::read(&host.proc_root, intent.gpu_minor, gi, ci)?;
        Ok(MadeInstance {
            gpu_instance_id: gi,
            compute_instance_id: ci,
            uuid,
            gpu_instance_cap: gi_cap,
            compute_instance_cap: ci_cap,
        })
    };
    finish(own).map_err(|error| {
        // NVML returned `gi` to this call: it is ours, whatever the ledger holds.
        match destroy(control, &intent.gpu_uuid, gi).map_err(Error::from).and_then(|()| own.destroyed(intent)) {
            Ok(()) => {}
            Err(undo) => tracing::warn!(%undo, "removing a half-made MIG device failed; the roll-back retries"),
        }
        making(intent, error)
    })
}

/// Makes `intents` in creation order (see [`order::creation_order`]);
/// returns what was made, by the intents' own order. On failure, what this
/// call made is destroyed again (in reverse), then the error returned.
pub fn make_all(
    host: &MigHost,
    own: &mut ClaimOwnership<'_>,
    intents: &[&MigIntent],
) -> Result<Vec<MadeInstance>, Error> {
    let mut made: Vec<Option<MadeInstance>> = vec![None; intents.len()];
    own.creating_all(intents).map_err(|e| Error::RecordingIntents(Box::new(e)))?;
    let order = order::creation_order(intents);
    for (step, &index) in order.iter().enumerate() {
        match make(host, own, intents[index]) {
            Ok(instance) => made[index] = Some(instance),
            Err(error) => {
                let untried: Vec<&MigIntent> = order[step + 1..].iter().map(|&i| intents[i]).collect();
                if let Err(undo) = own.never_made(&untried) {
                    tracing::warn!(%undo, "recording MIG devices that were not made failed");
                }
                let done: Vec<&MigIntent> =
                    intents.iter().zip(&made).filter(|(_, m)| m.is_some()).map(|(i, _)| *i).collect();
                if let Err(undo) = unmake_all(host, own, &done) {
                    tracing::warn!(%undo, "removing the MIG devices of a failed prepare failed; the roll-back retries");
                }
                return Err(error);
            }
        }
    }
    Ok(made.into_iter().flatten().collect())
}

/// Destroys the instance `intent` names if it exists *and* the claim's
/// ledger proves it the plugin's: its compute instances, then the GPU
/// instance. Absent is success; an instance the ledger does not prove
/// (someone else's, or one a crash left before its identity was recorded)
/// is left where it is, with one log line, and is success too.
pub fn unmake(host: &MigHost, own: &mut ClaimOwnership<'_>, intent: &MigIntent) -> Result<(), Error> {
    let control = &*host.control;
    let observed = match control.instances(&intent.gpu_uuid) {
        Ok(observed) => observed,
        // The GPU is gone from the node: nothing of it to destroy.
        Err(MigControlError::NoGpu { .. }) => return Ok(()),
        Err(error) => return Err(removing(intent, error)),
    };
    let Some(found) = observed.iter().find(|o| o.is(intent)) else {
        return own.destroyed(intent).map_err(|e| removing(intent, e));
    };
    let uuid_of = |gi: u32, ci: u32| control.mig_uuid(&intent.gpu_uuid, gi, ci).ok();
    let proof = own.entry().instance(intent).map(|entry| ownership::judge(entry, found, &uuid_of));
    if proof != Some(Proof::Ours) {
        tracing::warn!(
            claim_uid = %own.entry().uid,
            gpu_instance = found.gpu_instance_id,
            "{} exists but nothing proves the plugin made it for this claim (its MIG ledger): left alone; if no one \
             uses it, remove it with nvidia-smi mig -dci -gi {gi} -i {minor} and nvidia-smi mig -dgi -gi {gi} -i \
             {minor}",
            device_text(intent),
            gi = found.gpu_instance_id,
            minor = intent.gpu_minor,
        );
        return Ok(());
    }
    destroy_observed(control, &intent.gpu_uuid, found)
        .map_err(Error::from)
        .and_then(|()| own.destroyed(intent))
        .map_err(|e| removing(intent, e))
}

/// Destroys `intents` in destruction order (the reverse of creation);
/// stops at the first failure, leaving the rest for the retry.
pub fn unmake_all(host: &MigHost, own: &mut ClaimOwnership<'_>, intents: &[&MigIntent]) -> Result<(), Error> {
    for index in order::destruction_order(intents) {
        unmake(host, own, intents[index])?;
    }
    Ok(())
}

/// Destroys one observed instance: compute instances first.
pub fn destroy_observed(control: &dyn MigControl, gpu: &str, found: &ObservedInstance) -> Result<(), MigControlError> {
    for &ci in &found.compute_instances {
        control.destroy_compute_instance(gpu, found.gpu_instance_id, ci)?;
        kill_point::reached(Step::AfterComputeDestroyed);
    }
    control.destroy_gpu_instance(gpu, found.gpu_instance_id)?;
    kill_point::reached(Step::AfterGpuDestroyed);
    Ok(())
}

/// Destroys GPU instance `gi` and whatever compute instances it has.
fn destroy(control: &dyn MigControl, gpu: &str, gi: u32) -> Result<(), MigControlError> {
    let observed = control.instances(gpu)?;
    match observed.iter().find(|o| o.gpu_instance_id == gi) {
        Some(found) => destroy_observed(control, gpu, found),
        None => Ok(()),
    }
}

/// Turns a whole GPU's MIG mode `on` or off, where that takes effect
/// without a reset; an error says why not (instances or processes on it,
/// or a GPU that needs a reset).
pub fn switch_mig_mode(host: &MigHost, gpu: &str, on: bool) -> Result<(), Error> {
    let control = &*host.control;
    if control.mig_mode(gpu)?.current == on {
        return Ok(());
    }
    let MigModeState { current, .. } = control.set_mig_mode(gpu, on)?;
    kill_point::reached(Step::AfterMigMode);
    if let Some(observer) = host.mode_observer.as_ref().filter(|_| current == on) {
        observer.mig_mode_switched(gpu);
    }
    if current != on {
        return Err(Error::NeedsReset { gpu: gpu.to_owned(), on });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::control::fake::FakeControl;
    use super::*;

    fn intent(profile_id: u32, start: u32, size: u32) -> MigIntent {
        MigIntent {
            gpu_uuid: "GPU-a".into(),
            gpu_minor: 0,
            profile: format!("{size}g"),
            profile_id,
            compute_profile_index: 0,
            placement_start: start,
            placement_size: size,
        }
    }

    const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    /// An instance at the intent's exact placement that the ledger does not
    /// prove ours (someone else's, or one whose create a kill cut short of
    /// its ledger write) is never destroyed; ours is.
    #[test]
    fn unmake_destroys_only_what_the_ledger_proves() {
        let control = Arc::new(FakeControl::with_gpus(&["GPU-a"]));
        let (host, _dir) = host(control.clone());
        let theirs = intent(19, 6, 1);
        let gi = control.create_gpu_instance("GPU-a", 19, theirs.placement()).unwrap();
        control.create_compute_instance("GPU-a", gi, 0).unwrap();
        let mut own = host.ledger.claim(UID, "boot");
        unmake(&host, &mut own, &theirs).unwrap();
        own.creating(&theirs).unwrap();
        unmake(&host, &mut own, &theirs).unwrap();
        own.made_compute_instance(&theirs, gi, 0, "MIG-not-this-one").unwrap();
        unmake(&host, &mut own, &theirs).unwrap();
        assert_eq!(control.count("GPU-a"), 1, "not proven ours: kept");
        let uuid = control.mig_uuid("GPU-a", gi, 0).unwrap();
        own.made_compute_instance(&theirs, gi, 0, &uuid).unwrap();
        unmake(&host, &mut own, &theirs).unwrap();
        assert_eq!(control.count("GPU-a"), 0, "the identity NVML returned: ours");
    }

    fn host(control: Arc<FakeControl>) -> (MigHost, tempfile::TempDir) {
        let proc_root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(proc_root.path().join("driver/nvidia-caps")).unwrap();
        let mut minors = String::new();
        for gi in 0..15 {
            minors.push_str(&format!("gpu0/gi{gi}/access {}\n", 3 + 9 * gi));
            minors.push_str(&format!("gpu0/gi{gi}/ci0/access {}\n", 4 + 9 * gi));
        }
        std::fs::write(proc_root.path().join("driver/nvidia-caps/mig-minors"), minors).unwrap();
        let ledger = Arc::new(Ledger::new(proc_root.path().join("mig-ledger")));
        (MigHost { control, proc_root: proc_root.path().to_path_buf(), mode_observer: None, ledger }, proc_root)
    }

    #[test]
    fn make_all_creates_largest_first_and_unmake_all_reverses() {
        let control = Arc::new(FakeControl::with_gpus(&["GPU-a"]));
        let (host, _dir) = host(control.clone());
        let (small, big, mid) = (intent(19, 6, 1), intent(5, 0, 4), intent(14, 4, 2));
        let mut own = host.ledger.claim(UID, "boot");
        let made = make_all(&host, &mut own, &[&small, &big, &mid]).unwrap();
        assert_eq!(made.len(), 3);
        assert_eq!(made[1].gpu_instance_id, 1, "the 4g was made first");
        assert_eq!((made[1].gpu_instance_cap, made[1].compute_instance_cap), (12, 13));
        assert_eq!(control.count("GPU-a"), 3);
        unmake_all(&host, &mut own, &[&small, &big, &mid]).unwrap();
        assert_eq!(control.count("GPU-a"), 0);
        let calls = control.calls.lock().unwrap().clone();
        let destroys: Vec<&str> = calls.iter().filter(|c| c.starts_with("destroy-gi")).map(String::as_str).collect();
        assert_eq!(destroys, ["destroy-gi GPU-a 3", "destroy-gi GPU-a 2", "destroy-gi GPU-a 1"], "1g, 2g, then 4g");
        unmake_all(&host, &mut own, &[&small, &big, &mid]).unwrap();
        assert!(own.entry().instances.iter().all(|o| o.made == super::super::ledger::Made::Destroyed));
    }

    #[test]
    fn a_failure_half_way_leaves_nothing() {
        let control = Arc::new(FakeControl::with_gpus(&["GPU-a"]));
        let (host, _dir) = host(control.clone());
        // Someone else's instance sits where the 1g wants to go.
        control.create_gpu_instance("GPU-a", 19, gpu_dra_driver::inventory::Placement { start: 6, size: 1 }).unwrap();
        let mut own = host.ledger.claim(UID, "boot");
        let error = make_all(&host, &mut own, &[&intent(5, 0, 4), &intent(19, 6, 1)]).unwrap_err().to_string();
        assert!(error.contains("no room"), "{error}");
        assert_eq!(control.count("GPU-a"), 1, "the 4g made before was destroyed; the other instance kept");
        *control.fail.lock().unwrap() = Some("create-ci".into());
        let error = make_all(&host, &mut own, &[&intent(5, 0, 4)]).unwrap_err().to_string();
        assert!(error.contains("injected"), "{error}");
        assert_eq!(control.count("GPU-a"), 1, "a GPU instance whose compute instance failed is destroyed");
    }

    #[test]
    fn mig_mode_switches_only_where_no_reset_is_needed() {
        let control = Arc::new(FakeControl::with_gpus(&["GPU-a"]));
        let (host, _dir) = host(control.clone());
        switch_mig_mode(&host, "GPU-a", false).unwrap();
        assert!(!control.mig_mode("GPU-a").unwrap().current);
        switch_mig_mode(&host, "GPU-a", true).unwrap();
        control.gpus.lock().unwrap().get_mut("GPU-a").unwrap().switchable = false;
        let error = switch_mig_mode(&host, "GPU-a", false).unwrap_err().to_string();
        assert!(error.contains("needs a reset"), "{error}");
    }

    #[derive(Default)]
    struct Heard(std::sync::Mutex<Vec<String>>);

    impl MigModeObserver for Heard {
        fn mig_mode_switched(&self, gpu_uuid: &str) {
            self.0.lock().unwrap().push(gpu_uuid.to_string());
        }
    }

    #[test]
    fn the_observer_hears_each_switch_that_took_effect() {
        let control = Arc::new(FakeControl::with_gpus(&["GPU-a"]));
        let (mut host, _dir) = host(control.clone());
        let heard = Arc::new(Heard::default());
        host.mode_observer = Some(heard.clone());
        switch_mig_mode(&host, "GPU-a", false).unwrap();
        switch_mig_mode(&host, "GPU-a", false).unwrap();
        switch_mig_mode(&host, "GPU-a", true).unwrap();
        assert_eq!(*heard.0.lock().unwrap(), ["GPU-a", "GPU-a"], "off, then on; the no-op is not a switch");
        control.gpus.lock().unwrap().get_mut("GPU-a").unwrap().switchable = false;
        switch_mig_mode(&host, "GPU-a", false).unwrap_err();
        assert_eq!(heard.0.lock().unwrap().len(), 2, "a switch pending a reset changed nothing yet");
    }
}
