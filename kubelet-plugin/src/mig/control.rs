//! The NVML operations dynamic MIG needs, as a trait so that the
//! lifecycle is tested against an in-memory GPU and runs on NVML
//! ([`super::nvml`]) on a node.

use gpu_dra_driver::inventory::Placement;

use crate::state::checkpoint::MigIntent;

/// A GPU instance NVML reports on a GPU, with its compute instance if it
/// has one (the plugin makes one spanning each GPU instance; a GPU
/// instance without one is what a crash between the two creations leaves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedInstance {
    pub gpu_instance_id: u32,
    pub profile_id: u32,
    pub placement: Placement,
    /// Compute instance ids inside it.
    pub compute_instances: Vec<u32>,
}

impl ObservedInstance {
    /// Whether this instance is the one `intent` names (same profile and
    /// placement); here rather than on [`MigIntent`] so the record type
    /// knows nothing of NVML.
    pub fn is(&self, intent: &MigIntent) -> bool {
        self.profile_id == intent.profile_id && self.placement == intent.placement()
    }
}

/// A GPU's MIG mode: `current` is in effect, `pending` takes effect at the
/// next GPU reset (they differ only on GPUs that need one, e.g. A100).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigModeState {
    pub current: bool,
    pub pending: bool,
}

/// Why an NVML operation failed, in the terms the caller acts on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigControlError {
    /// The slices are taken (`NVML_ERROR_INSUFFICIENT_RESOURCES`).
    #[error("{what}: the GPU has no room there (NVML: insufficient resources){hint}")]
    NoRoom { what: String, hint: String },
    /// Processes use it (`NVML_ERROR_IN_USE`).
    #[error("{what}: in use (NVML: processes or instances are still on it); retried at the next attempt")]
    InUse { what: String },
    /// The GPU is not (or no longer) on this node.
    #[error("{what}: GPU {gpu} is not on this node")]
    NoGpu { what: String, gpu: String },
    /// Anything else NVML said.
    #[error("{what}: {message}")]
    Nvml { what: String, message: String },
}

/// The NVML side of dynamic MIG. Implementations are called from blocking
/// tasks and must be safe to call from several threads.
pub trait MigControl: Send + Sync {
    /// Creates a GPU instance of `profile_id` at `placement`; its id.
    fn create_gpu_instance(&self, gpu: &str, profile_id: u32, placement: Placement) -> Result<u32, MigControlError>;

    /// Creates the compute instance of `compute_profile_index` spanning GPU
    /// instance `gi`; its id and the new MIG device's UUID.
    fn create_compute_instance(
        &self,
        gpu: &str,
        gi: u32,
        compute_profile_index: u32,
    ) -> Result<(u32, String), MigControlError>;

    /// Destroys compute instance `ci` of GPU instance `gi`.
    fn destroy_compute_instance(&self, gpu: &str, gi: u32, ci: u32) -> Result<(), MigControlError>;

    /// Destroys GPU instance `gi` (which must have no compute instance).
    fn destroy_gpu_instance(&self, gpu: &str, gi: u32) -> Result<(), MigControlError>;

    /// Every GPU instance on the GPU, with its compute instances.
    fn instances(&self, gpu: &str) -> Result<Vec<ObservedInstance>, MigControlError>;

    /// The GPU's MIG mode.
    fn mig_mode(&self, gpu: &str) -> Result<MigModeState, MigControlError>;

    /// Requests MIG mode on or off; returns the mode now in effect (a GPU
    /// that needs a reset keeps the old one).
    fn set_mig_mode(&self, gpu: &str, on: bool) -> Result<MigModeState, MigControlError>;

    /// The MIG device UUID of compute instance `ci` of `gi`.
    fn mig_uuid(&self, gpu: &str, gi: u32, ci: u32) -> Result<String, MigControlError>;
}

#[cfg(test)]
pub(crate) mod fake {
    //! An in-memory GPU with NVML's rules: placements may not overlap, a
    //! GPU instance with a compute instance cannot be destroyed.

    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    /// A GPU instance: profile id, placement, compute instance and its UUID.
    pub type FakeInstance = (u32, Placement, Option<(u32, String)>);

    #[derive(Debug, Default)]
    pub struct FakeGpu {
        pub mig: MigModeState,
        pub switchable: bool,
        /// gi id -> (profile id, placement, compute instance and its UUID).
        pub instances: BTreeMap<u32, FakeInstance>,
    }

    impl Default for MigModeState {
        fn default() -> Self {
            MigModeState { current: true, pending: true }
        }
    }

    /// GPUs by UUID; every call is logged in `calls`.
    #[derive(Debug, Default)]
    pub struct FakeControl {
        pub gpus: Mutex<BTreeMap<String, FakeGpu>>,
        pub calls: Mutex<Vec<String>>,
        pub next_uuid: Mutex<u32>,
        /// A call whose name starts with this fails with `Nvml`.
        pub fail: Mutex<Option<String>>,
    }

    impl FakeControl {
        pub fn with_gpus(uuids: &[&str]) -> Self {
            let control = FakeControl::default();
            for uuid in uuids {
                control
                    .gpus
                    .lock()
                    .unwrap()
                    .insert(uuid.to_string(), FakeGpu { switchable: true, ..Default::default() });
            }
            control
        }

        pub fn count(&self, gpu: &str) -> usize {
            self.gpus.lock().unwrap().get(gpu).map_or(0, |g| g.instances.len())
        }

        fn call(&self, call: String) -> Result<(), MigControlError> {
            let failing = self.fail.lock().unwrap().clone();
            let result = match failing {
                Some(prefix) if call.starts_with(&prefix) => {
                    Err(MigControlError::Nvml { what: call.clone(), message: "injected".into() })
                }
                _ => Ok(()),
            };
            self.calls.lock().unwrap().push(call);
            result
        }

        fn with<T>(
            &self,
            gpu: &str,
            f: impl FnOnce(&mut FakeGpu) -> Result<T, MigControlError>,
        ) -> Result<T, MigControlError> {
            let mut gpus = self.gpus.lock().unwrap();
            let g = gpus.get_mut(gpu).ok_or_else(|| MigControlError::NoGpu { what: "fake".into(), gpu: gpu.into() })?;
            f(g)
        }
    }

    impl MigControl for FakeControl {
        fn create_gpu_instance(
            &self,
            gpu: &str,
            profile_id: u32,
            placement: Placement,
        ) -> Result<u32, MigControlError> {
            self.call(format!("create-gi {gpu} {profile_id} {}+{}", placement.start, placement.size))?;
            self.with(gpu, |g| {
                if g.instances.values().any(|(_, p, _)| p.overlaps(placement)) {
                    return Err(MigControlError::NoRoom { what: "create".into(), hint: String::new() });
                }
                let id = (1..).find(|id| !g.instances.contains_key(id)).unwrap_or(0);
                g.instances.insert(id, (profile_id, placement, None));
                Ok(id)
            })
        }

        fn create_compute_instance(&self, gpu: &str, gi: u32, _profile: u32) -> Result<(u32, String), MigControlError> {
            self.call(format!("create-ci {gpu} {gi}"))?;
            let uuid = {
                let mut next = self.next_uuid.lock().unwrap();
                *next += 1;
                format!("MIG-fake-{next}")
            };
            self.with(gpu, |g| {
                let entry = g
                    .instances
                    .get_mut(&gi)
                    .ok_or(MigControlError::Nvml { what: "ci".into(), message: "no gi".into() })?;
                entry.2 = Some((0, uuid.clone()));
                Ok((0, uuid))
            })
        }

        fn destroy_compute_instance(&self, gpu: &str, gi: u32, ci: u32) -> Result<(), MigControlError> {
            self.call(format!("destroy-ci {gpu} {gi} {ci}"))?;
            self.with(gpu, |g| {
                if let Some(entry) = g.instances.get_mut(&gi) {
                    entry.2 = None;
                }
                Ok(())
            })
        }

        fn destroy_gpu_instance(&self, gpu: &str, gi: u32) -> Result<(), MigControlError> {
            self.call(format!("destroy-gi {gpu} {gi}"))?;
            self.with(gpu, |g| {
                if g.instances.get(&gi).is_some_and(|e| e.2.is_some()) {
                    return Err(MigControlError::InUse { what: "destroy".into() });
                }
                g.instances.remove(&gi);
                Ok(())
            })
        }

        fn instances(&self, gpu: &str) -> Result<Vec<ObservedInstance>, MigControlError> {
            self.with(gpu, |g| {
                Ok(g.instances
                    .iter()
                    .map(|(&id, (profile_id, placement, ci))| ObservedInstance {
                        gpu_instance_id: id,
                        profile_id: *profile_id,
                        placement: *placement,
                        compute_instances: ci.iter().map(|(c, _)| *c).collect(),
                    })
                    .collect())
            })
        }

        fn mig_mode(&self, gpu: &str) -> Result<MigModeState, MigControlError> {
            self.with(gpu, |g| Ok(g.mig))
        }

        fn set_mig_mode(&self, gpu: &str, on: bool) -> Result<MigModeState, MigControlError> {
            self.call(format!("set-mig-mode {gpu} {on}"))?;
            self.with(gpu, |g| {
                if !g.instances.is_empty() {
                    return Err(MigControlError::InUse { what: "mig mode".into() });
                }
                g.mig.pending = on;
                if g.switchable {
                    g.mig.current = on;
                }
                Ok(g.mig)
            })
        }

        fn mig_uuid(&self, gpu: &str, gi: u32, _ci: u32) -> Result<String, MigControlError> {
            self.with(gpu, |g| {
                g.instances
                    .get(&gi)
                    .and_then(|e| e.2.as_ref().map(|(_, u)| u.clone()))
                    .ok_or(MigControlError::Nvml { what: "uuid".into(), message: "none".into() })
            })
        }
    }
}
