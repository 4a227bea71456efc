//! The node's inventory as a stream of snapshots: a
//! `watch::Receiver<Arc<Inventory>>` that the publisher and the health
//! stream subscribe to. Health events change the inventory (faults), never
//! the slices directly.
//!
//! - Fake file: polled every `interval`; when its content changes it is
//!   re-read. Adding `faults:` to a GPU is the fault injection. A file that
//!   becomes invalid keeps the last good inventory and logs the error.
//! - NVML: a blocking thread waits on an NVML event set for critical XID
//!   errors and adds them as faults; a lost GPU gets `Fault::Lost`. This
//!   path needs a GPU and is not exercised by the tests here.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpu_dra_driver::inventory::fake::{self, FakeInventoryError};
use gpu_dra_driver::inventory::nvml::NvmlSource;
use gpu_dra_driver::inventory::{DiscoveryError, Inventory, InventorySource};
use gpu_dra_driver::names::NodeName;
use tokio::sync::watch;

use crate::mig::selection::DynamicMigSelection;

/// How often the fake file is checked by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Loads the fake inventory, then follows the file. Fails only when the
/// first read fails (the plugin cannot start without an inventory).
/// Must be called inside a tokio runtime; the task ends when every
/// receiver is gone.
pub fn watch_fake_file(
    path: PathBuf,
    node: NodeName,
    interval: Duration,
    selection: Arc<DynamicMigSelection>,
) -> Result<watch::Receiver<Arc<Inventory>>, FakeInventoryError> {
    let text = read(&path);
    let mut first = fake::load(&path, &node)?;
    selection.apply(&mut first);
    let (tx, rx) = watch::channel(Arc::new(first));
    tokio::spawn(follow_file(path, node, interval, text, tx, selection));
    Ok(rx)
}

/// The file's bytes to compare with the last seen: a regular file within
/// the fake inventory's size limit (a FIFO or a device is never read).
fn read(path: &std::path::Path) -> Option<Vec<u8>> {
    use gpu_dra_driver::bounded_file::{self, Links};
    bounded_file::read(path, fake::MAX_FILE_BYTES, Links::Follow).ok()
}

async fn follow_file(
    path: PathBuf,
    node: NodeName,
    interval: Duration,
    mut last_text: Option<Vec<u8>>,
    tx: watch::Sender<Arc<Inventory>>,
    selection: Arc<DynamicMigSelection>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = tx.closed() => return,
        }
        // Comparing content rather than mtime: editors and `cp` may keep
        // the mtime within one second, and the file is small.
        let text = read(&path);
        if text == last_text {
            continue;
        }
        last_text = text;
        match fake::load(&path, &node) {
            Ok(mut inventory) => {
                selection.apply(&mut inventory);
                let changed = tx.send_if_modified(|current| {
                    if **current == inventory {
                        return false;
                    }
                    *current = Arc::new(inventory);
                    true
                });
                if changed {
                    tracing::info!(file = %path.display(), "fake inventory changed");
                }
            }
            Err(error) => {
                tracing::error!(%error, "fake inventory file is invalid; keeping the last good inventory");
            }
        }
    }
}

/// Discovers through NVML, then follows critical XID events in a blocking
/// thread and the MIG mode switches the plugin makes (through the returned
/// [`MigModeRefresh`]). Must be called inside a tokio runtime.
pub fn watch_nvml(
    source: NvmlSource,
    selection: Arc<DynamicMigSelection>,
) -> Result<(watch::Receiver<Arc<Inventory>>, Arc<MigModeRefresh>), DiscoveryError> {
    let mut first = source.discover()?;
    selection.apply(&mut first);
    let (tx, rx) = watch::channel(Arc::new(first));
    let refresh = Arc::new(MigModeRefresh { source: source.clone(), tx: tx.clone(), selection });
    std::thread::Builder::new().name("nvml-events".into()).spawn(move || nvml_events::run(&source, tx)).map_err(
        |e| {
            DiscoveryError::Nvml(gpu_dra_driver::inventory::nvml::NvmlDiscoveryError::LibraryUnavailable(format!(
                "cannot start the NVML event thread: {e}"
            )))
        },
    )?;
    Ok((rx, refresh))
}

/// Re-reads a GPU's MIG state through NVML after the plugin switched its
/// MIG mode (a claim for the whole GPU): out of MIG mode it is published
/// as one GPU, back in MIG mode with its MIG devices and counters. Only
/// that GPU's MIG fields change; faults seen meanwhile stay.
pub struct MigModeRefresh {
    source: NvmlSource,
    tx: watch::Sender<Arc<Inventory>>,
    selection: Arc<DynamicMigSelection>,
}

impl crate::mig::lifecycle::MigModeObserver for MigModeRefresh {
    fn mig_mode_switched(&self, gpu_uuid: &str) {
        let mut fresh = match self.source.discover() {
            Ok(fresh) => fresh,
            Err(error) => {
                tracing::error!(gpu = %gpu_uuid, %error, "re-reading the GPU after a MIG mode switch failed; its slices stay as they were until the plugin restarts");
                return;
            }
        };
        fresh.gpus.retain(|g| g.uuid == gpu_uuid);
        self.selection.apply(&mut fresh);
        let Some(found) = fresh.gpus.pop() else {
            tracing::error!(gpu = %gpu_uuid, "NVML no longer lists the GPU whose MIG mode was switched");
            return;
        };
        let changed = self.tx.send_if_modified(|current| replace_mig_state(current, found));
        tracing::info!(gpu = %gpu_uuid, changed, "MIG mode switched; the inventory follows");
    }
}

/// Puts `found`'s MIG mode and profiles in place of the same GPU's in
/// `current`; whether anything changed.
fn replace_mig_state(current: &mut Arc<Inventory>, found: gpu_dra_driver::inventory::Gpu) -> bool {
    let Some(index) = current.gpus.iter().position(|g| g.uuid == found.uuid) else { return false };
    let gpu = &current.gpus[index];
    if gpu.mig == found.mig && gpu.mig_capabilities == found.mig_capabilities {
        return false;
    }
    let next = Arc::make_mut(current);
    next.gpus[index].mig = found.mig;
    next.gpus[index].mig_capabilities = found.mig_capabilities;
    true
}

/// Adds `fault` to the GPU with `uuid` (or, with instance ids, to its MIG
/// device); returns whether anything changed.
pub fn add_fault(
    inventory: &mut Inventory,
    uuid: &str,
    instance: Option<(u32, u32)>,
    fault: gpu_dra_driver::inventory::Fault,
) -> bool {
    use gpu_dra_driver::inventory::MigMode;
    let Some(gpu) = inventory.gpus.iter_mut().find(|g| g.uuid == uuid) else { return false };
    let faults = match (&mut gpu.mig, instance) {
        (MigMode::Enabled(migs), Some((gi, ci))) => {
            match migs.iter_mut().find(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci) {
                Some(mig) => &mut mig.faults,
                None => &mut gpu.faults,
            }
        }
        _ => &mut gpu.faults,
    };
    if faults.contains(&fault) {
        return false;
    }
    faults.push(fault);
    true
}

#[cfg(target_os = "linux")]
mod nvml_events {
    use std::sync::Arc;

    use gpu_dra_driver::inventory::nvml::NvmlSource;
    use gpu_dra_driver::inventory::{Fault, Inventory};
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    use nvml_wrapper::error::NvmlError;
    use tokio::sync::watch;

    use super::add_fault;

    const WAIT_MS: u32 = 5000;

    pub fn run(source: &NvmlSource, tx: watch::Sender<Arc<Inventory>>) {
        if let Err(error) = watch_events(source, &tx) {
            tracing::error!(%error, "NVML health monitoring stopped; device faults will not be detected");
        }
    }

    fn watch_events(source: &NvmlSource, tx: &watch::Sender<Arc<Inventory>>) -> Result<(), NvmlError> {
        let nvml = source.init_nvml()?;
        let mut set = nvml.create_event_set()?;
        for i in 0..nvml.device_count()? {
            let device = nvml.device_by_index(i)?;
            set = device.register_events(EventTypes::CRITICAL_XID_ERROR, set).map_err(|e| e.error)?;
        }
        while !tx.is_closed() {
            match set.wait(WAIT_MS) {
                Ok(event) => {
                    let Ok(uuid) = event.device.uuid() else { continue };
                    let Some(XidError::Value(xid)) = event.event_data else { continue };
                    let Ok(xid) = u32::try_from(xid) else { continue };
                    // nvml-wrapper's event data has no GPU/compute instance
                    // ids, so a MIG device's XID taints its parent GPU (and
                    // with it every MIG device on it).
                    let instance = None;
                    tracing::warn!(%uuid, xid, "critical XID error");
                    tx.send_if_modified(|inv| {
                        let mut next = (**inv).clone();
                        let changed = add_fault(&mut next, &uuid, instance, Fault::Xid(xid));
                        if changed {
                            *inv = Arc::new(next);
                        }
                        changed
                    });
                }
                Err(NvmlError::Timeout) => {}
                Err(NvmlError::GpuLost) => {
                    // NVIDIA's driver marks every device lost: the event set
                    // cannot say which GPU fell off the bus.
                    tracing::error!("NVML reports a GPU lost; tainting all GPUs");
                    tx.send_modify(|inv| {
                        let mut next = (**inv).clone();
                        for gpu in &mut next.gpus {
                            if !gpu.faults.contains(&Fault::Lost) {
                                gpu.faults.push(Fault::Lost);
                            }
                        }
                        *inv = Arc::new(next);
                    });
                    return Ok(());
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
mod nvml_events {
    pub fn run(_tx: tokio::sync::watch::Sender<std::sync::Arc<gpu_dra_driver::inventory::Inventory>>) {}
}

#[cfg(test)]
mod tests {
    use gpu_dra_driver::inventory::Fault;

    use super::*;

    const TWO_GPUS: &str = "gpus:\n  - model: H100-80GB\n    count: 2\n";

    #[tokio::test]
    async fn follows_the_file_and_keeps_the_last_good_inventory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inv.yaml");
        std::fs::write(&path, TWO_GPUS).unwrap();
        let node = NodeName::new("n1").unwrap();
        let mut rx =
            watch_fake_file(path.clone(), node, Duration::from_millis(100), DynamicMigSelection::disabled()).unwrap();
        assert!(rx.borrow_and_update().gpus.iter().all(|g| g.faults.is_empty()));

        std::fs::write(&path, format!("{TWO_GPUS}    faults:\n      - {{gpu: 1, xid: 79}}\n")).unwrap();
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().gpus[1].faults, [Fault::Xid(79)]);

        // Invalid: nothing is sent; then a valid file again is.
        std::fs::write(&path, "gpus: [").unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!rx.has_changed().unwrap());
        std::fs::write(&path, TWO_GPUS).unwrap();
        rx.changed().await.unwrap();
        assert!(rx.borrow().gpus[1].faults.is_empty());
    }

    #[test]
    fn a_mig_mode_refresh_replaces_only_that_gpus_mig_state() {
        use gpu_dra_driver::inventory::MigMode;
        let yaml = "gpus: [{model: H100-80GB, count: 2, mig: [{gpus: [0], dynamic: true}]}]";
        let before = fake::parse(yaml, &NodeName::new("n").unwrap()).unwrap();
        let mut current = Arc::new(before.clone());
        Arc::make_mut(&mut current).gpus[0].faults.push(Fault::Xid(79));
        // NVML after the switch: GPU 0 out of MIG mode.
        let mut found = before.gpus[0].clone();
        found.mig = MigMode::Disabled;
        assert!(replace_mig_state(&mut current, found.clone()));
        assert_eq!(current.gpus[0].mig, MigMode::Disabled);
        assert_eq!(current.gpus[0].faults, [Fault::Xid(79)], "faults seen meanwhile stay");
        assert_eq!(current.gpus[1], before.gpus[1], "the other GPU is untouched");
        assert!(!replace_mig_state(&mut current, found.clone()), "the same state again is no change");
        let mut stranger = found;
        stranger.uuid = "GPU-not-here".into();
        assert!(!replace_mig_state(&mut current, stranger));
    }

    #[test]
    fn a_missing_file_fails_at_start() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let err = rt
            .block_on(async {
                watch_fake_file(
                    "/nonexistent.yaml".into(),
                    NodeName::new("n").unwrap(),
                    DEFAULT_POLL_INTERVAL,
                    DynamicMigSelection::disabled(),
                )
            })
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent.yaml"));
    }
}
