//! MPS at prepare: one control daemon per claim for the claim's MPS
//! devices, as NVIDIA's plugin runs it (`nvidia-cuda-mps-control -d` with
//! `CUDA_VISIBLE_DEVICES`, limits piped to `nvidia-cuda-mps-control`, the
//! GPUs in `EXCLUSIVE_PROCESS`, a pipe directory and a `/dev/shm` tmpfs
//! bind-mounted into the containers).
//!
//! A device gets MPS when its config says `sharing: {strategy: MPS}` or
//! when its allocation carries `consumedCapacity` (a share of a GPU): the
//! share's `memory` becomes the device's pinned memory limit and its
//! `smPercent` the daemon's active thread percentage, so
//! what the scheduler counted is what the GPU enforces. Shares are
//! enforced with either `ConsumableCapacity` (which publishes them) or
//! `MPSSupport` on.
//!
//! This module decides (pure); [`lifecycle`] does, through [`host`].

mod error;
pub mod host;
pub mod launch;
mod launch_request;
pub mod lifecycle;
pub mod supervisor;

use std::path::Path;

use dra_cel::quantity::Quantity;
use gpu_dra_driver::cdi::spec::{ContainerEdits, Mount};
use gpu_dra_driver::feature_gates::{FeatureGates, Gate};
use gpu_dra_driver::inventory::{Inventory, PublishedDevice};
use gpu_dra_driver::names::ClaimUid;
use gpu_dra_driver::opaque_config::{ConfigSource, DeviceConfig, ResolvedConfig};

pub use error::{Error, PlanError};

use super::plan::PlannedDevice;
use crate::state::checkpoint::{ClaimRecord, MpsDaemon, PinnedLimit};

/// Where containers find the daemon's pipe directory (as NVIDIA's).
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// The consumable capacity that sets a share's active thread percentage,
/// as the slices publish it (`consumedCapacity` is keyed by the device's
/// capacity names).
pub const SM_PERCENT: &str = gpu_dra_driver::slices::attributes::name::SM_PERCENT;
const MIB: i128 = 1024 * 1024;

/// The MPS settings one device asked for, before they are merged into the
/// claim's daemon.
#[derive(Debug, Default)]
struct DeviceMps {
    thread_percentage: Option<u8>,
    pinned_mib: Option<u64>,
}

/// The daemon `planned` needs, or `None` when no device uses MPS.
pub fn plan_daemon(
    uid: &ClaimUid,
    planned: &[PlannedDevice],
    resolved: &[ResolvedConfig],
    inventory: &Inventory,
    gates: &FeatureGates,
    mps_dir: &Path,
) -> Result<Option<MpsDaemon>, PlanError> {
    let mut daemon = MpsDaemon::at(mps_dir.join(uid.as_str()));
    let mut percentage_from: Option<String> = None;
    for (device, config) in planned.iter().zip(resolved) {
        let published =
            inventory.find_device(&device.device).ok_or_else(|| PlanError::NotOnNode(device.device.to_string()))?;
        let (uuid, parent) = match published {
            PublishedDevice::Gpu(gpu) => (gpu.uuid.clone(), gpu.uuid.clone()),
            PublishedDevice::Mig { parent, mig } => (mig.uuid.clone(), parent.uuid.clone()),
            PublishedDevice::DynamicMig { .. } => {
                return Err(PlanError::NoInstanceYet(device.device.to_string()));
            }
            // Bound to vfio-pci: no CUDA, no MPS (its config is a VfioDeviceConfig).
            PublishedDevice::Vfio(_) => continue,
        };
        let group = group_uuids(planned, resolved, inventory, config.source);
        let Some(settings) = device_mps(device, config, &uuid, &group, gates)? else { continue };
        if let Some(p) = settings.thread_percentage {
            match (daemon.active_thread_percentage, &percentage_from) {
                (Some(q), Some(other)) if q != p => {
                    return Err(PlanError::PercentagesDiffer {
                        device: device.device.to_string(),
                        percentage: p,
                        other: other.clone(),
                        other_percentage: q,
                    });
                }
                _ => {
                    daemon.active_thread_percentage = Some(p);
                    percentage_from = Some(device.device.to_string());
                }
            }
        }
        if let Some(mib) = settings.pinned_mib {
            daemon.pinned_limits.push(PinnedLimit { uuid: uuid.clone(), mib });
        }
        daemon.devices.push(device.device.to_string());
        if !daemon.visible.contains(&uuid) {
            daemon.visible.push(uuid);
        }
        if !daemon.gpus.contains(&parent) {
            daemon.gpus.push(parent);
        }
    }
    Ok((!daemon.visible.is_empty()).then_some(daemon))
}

/// The UUIDs of the devices sharing the config `source`: a per-device
/// limit's index counts within them, as NVIDIA's does within the devices
/// its config applies to.
fn group_uuids(
    planned: &[PlannedDevice],
    resolved: &[ResolvedConfig],
    inventory: &Inventory,
    source: ConfigSource,
) -> Vec<String> {
    planned
        .iter()
        .zip(resolved)
        .filter(|(_, c)| c.source == source)
        .filter_map(|(d, _)| inventory.find_device(&d.device))
        .filter_map(|p| match p {
            PublishedDevice::Gpu(gpu) => Some(gpu.uuid.clone()),
            PublishedDevice::Mig { mig, .. } => Some(mig.uuid.clone()),
            PublishedDevice::DynamicMig { .. } | PublishedDevice::Vfio(_) => None,
        })
        .collect()
}

/// One device's MPS settings from its config and its consumed capacity;
/// `None`: the device does not use MPS.
fn device_mps(
    device: &PlannedDevice,
    config: &ResolvedConfig,
    uuid: &str,
    group: &[String],
    gates: &FeatureGates,
) -> Result<Option<DeviceMps>, PlanError> {
    let mps_config = match &config.config {
        DeviceConfig::Gpu(gpu) => gpu.sharing.as_ref().filter(|s| s.strategy == "MPS").map(|s| s.mps_config.clone()),
        DeviceConfig::Mig(mig) => mig.sharing.as_ref().filter(|s| s.strategy == "MPS").map(|s| s.mps_config.clone()),
        DeviceConfig::Vfio(_) => None,
    };
    let memory = device.consumed_capacity.get("memory");
    let sm_percent = device.consumed_capacity.get(SM_PERCENT);
    if gates.enabled(Gate::ConsumableShares) {
        // NVIDIA's shares are not enforced, and its driver refuses MPS
        // beside them: a daemon would hold the GPU exclusive.
        return match mps_config {
            Some(_) => Err(PlanError::UnderConsumableShares { at: config_path(config.source) }),
            None => Ok(None),
        };
    }
    if mps_config.is_none() && memory.is_none() && sm_percent.is_none() {
        return Ok(None);
    }
    // An MPS config with the gate off was refused when it was decoded; a
    // share needs one of the gates that let the scheduler allocate it.
    if !gates.enabled(Gate::MpsSupport) && !gates.enabled(Gate::ConsumableCapacity) {
        return Err(PlanError::ShareWithoutGate {
            device: device.device.to_string(),
            request: device.request.to_string(),
            consumed: device.consumed_capacity.clone(),
        });
    }
    let mut settings = DeviceMps::default();
    let at = config_path(config.source);
    if let Some(mps) = mps_config.flatten() {
        settings.thread_percentage =
            mps.default_active_thread_percentage.map(|p| u8::try_from(p.clamp(0, 100)).unwrap_or(100));
        if let Some(text) = &mps.default_pinned_device_memory_limit {
            settings.pinned_mib = Some(mib(text, &format!("{at}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"))?);
        }
        for (key, text) in mps.default_per_device_pinned_memory_limit.iter().flatten() {
            let target = match key.parse::<usize>() {
                Ok(i) => group.get(i).cloned(),
                Err(_) => group.iter().find(|u| *u == key).cloned(),
            };
            let field = format!("{at}.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.{key}");
            let Some(target) = target else {
                return Err(PlanError::UnknownPinnedTarget {
                    field,
                    key: key.clone(),
                    last: group.len().saturating_sub(1),
                });
            };
            if target == uuid {
                settings.pinned_mib = Some(mib(text, &field)?);
            }
        }
    }
    let what = format!("consumedCapacity of device {} (request {})", device.device, device.request);
    if let Some(text) = memory {
        let share = mib(text, &format!("{what}: memory"))?;
        // The share is what the scheduler counted: a config may lower it,
        // never raise it.
        settings.pinned_mib = Some(settings.pinned_mib.map_or(share, |m| m.min(share)));
    }
    if let Some(text) = sm_percent {
        let value = Quantity::parse(text)
            .map_err(|source| PlanError::Quantity { field: format!("{what}: {SM_PERCENT}"), source })?
            .nanos();
        if value % 1_000_000_000 != 0 || !(1..=100).contains(&(value / 1_000_000_000)) {
            return Err(PlanError::NotWholePercent { what, text: text.clone() });
        }
        // As with memory: a config may lower the share, never raise it.
        let share = u8::try_from(value / 1_000_000_000).unwrap_or(100);
        settings.thread_percentage = Some(settings.thread_percentage.map_or(share, |p| p.min(share)));
    }
    Ok(Some(settings))
}

fn config_path(source: ConfigSource) -> String {
    match source {
        ConfigSource::Class(i) | ConfigSource::Claim(i) => {
            format!("status.allocation.devices.config[{i}].opaque.parameters")
        }
        ConfigSource::Default => "(default config)".to_owned(),
    }
}

/// A size in whole MiB, rounded down (MPS takes `<N>M`); at least 1.
fn mib(text: &str, field: &str) -> Result<u64, PlanError> {
    let nanos =
        Quantity::parse(text).map_err(|source| PlanError::Quantity { field: field.to_owned(), source })?.nanos();
    let mib = nanos / 1_000_000_000 / MIB;
    u64::try_from(mib)
        .ok()
        .filter(|m| *m >= 1)
        .ok_or_else(|| PlanError::BelowOneMi { field: field.to_owned(), text: text.to_owned() })
}

/// What a container of the claim gets: the pipe directory (where CUDA
/// finds the daemon) and the daemon's `/dev/shm`.
pub fn container_edits(daemon: &MpsDaemon) -> ContainerEdits {
    let bind = |host: &Path, container: &str| Mount {
        host_path: host.to_string_lossy().into_owned(),
        container_path: container.to_owned(),
        mount_type: None,
        options: ["rw", "nosuid", "nodev", "bind"].map(str::to_owned).to_vec(),
    };
    ContainerEdits {
        env: vec![format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}")],
        mounts: vec![bind(&daemon.pipe_dir(), CONTAINER_PIPE_DIR), bind(&daemon.shm_dir(), "/dev/shm")],
        ..Default::default()
    }
}

/// Adds the daemon's edits to the spec devices it serves (by CDI device
/// name `<claimUID>-<device>`), as NVIDIA appends them to each device.
pub fn add_edits(spec: &mut gpu_dra_driver::cdi::spec::Spec, daemon: &MpsDaemon, uid: &str) {
    let edits = container_edits(daemon);
    for device in spec.devices.iter_mut().filter(|d| daemon.devices.iter().any(|n| d.name == format!("{uid}-{n}"))) {
        device.container_edits.env.extend(edits.env.iter().cloned());
        device.container_edits.mounts.extend(edits.mounts.iter().cloned());
    }
}

/// Refuses MPS on a GPU another prepared claim time-slices, and
/// time-slicing on a GPU another claim runs MPS on: the two need
/// different compute modes.
pub fn check_compatible<'a>(
    uid: &str,
    namespace: &str,
    name: &str,
    ours_mps: Option<&MpsDaemon>,
    ours_sliced: &[String],
    others: impl Iterator<Item = &'a ClaimRecord>,
) -> Result<(), PlanError> {
    for other in others.filter(|r| r.uid != uid) {
        let their_sliced = other.devices.iter().filter_map(|d| d.time_slice.as_ref()).map(|t| &t.gpu_uuid);
        let their_mps = other.mps.iter().flat_map(|m| m.gpus.iter());
        let clash = their_sliced
            .filter_map(|g| ours_mps.and_then(|m| m.gpus.iter().find(|o| *o == g)).map(|g| (g, "time-sliced", "MPS")))
            .chain(their_mps.filter_map(|g| ours_sliced.iter().find(|o| *o == g).map(|g| (g, "MPS", "time-sliced"))))
            .next();
        if let Some((gpu, theirs, ours)) = clash {
            return Err(PlanError::SharedOtherwise {
                gpu: gpu.clone(),
                theirs,
                their_claim: format!("{}/{}", other.namespace, other.name),
                ours,
                our_claim: format!("{namespace}/{name}"),
            });
        }
    }
    Ok(())
}

/// The GPUs of `record`'s daemon no other record's daemon uses: those to
/// set back to `DEFAULT` when `record` goes.
pub fn gpus_to_reset<'a>(record: &ClaimRecord, others: impl Iterator<Item = &'a ClaimRecord> + Clone) -> Vec<String> {
    let Some(daemon) = &record.mps else { return Vec::new() };
    daemon
        .gpus
        .iter()
        .filter(|gpu| {
            !others
                .clone()
                .filter(|r| r.uid != record.uid)
                .any(|r| r.mps.as_ref().is_some_and(|m| m.gpus.contains(gpu)))
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests;
