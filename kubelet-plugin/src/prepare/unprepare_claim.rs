//! The unprepare of one claim whose lock the caller holds, and the
//! roll-back it shares with a failed prepare: walk the claim's record
//! backwards, then remove the record.

use gpu_dra_driver::cdi;
use gpu_dra_driver::names::ClaimUid;
use tokio::time::Instant;

use super::error::UndoError;
use super::failure::{Failure, kind};
use super::offload::blocking;
use super::preparer::{Preparer, device_key, gpu_keys};
use super::types::{ClaimSource, ValidClaim};
use super::{mps, passthrough, sharing};
use crate::deadline::Deadline;
use crate::observe::metrics::ErrorKind;
use crate::state::checkpoint::{ClaimRecord, derived};
use crate::state::durable;

impl<S: ClaimSource> Preparer<S> {
    /// Unprepares a claim whose lock the caller holds.
    pub(super) async fn unprepare_locked(
        &self,
        claim: &ValidClaim,
        deadline: Deadline,
        until: Instant,
    ) -> Result<(), Failure> {
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

    /// Resets the time-slices only this claim needed, gives the GPUs it
    /// passed through back to their drivers, removes the claim's spec
    /// file, then its record (see [`Files::remove_claim`]), then
    /// forgets it. The reset comes first: if it fails the record stays, and
    /// the next attempt or start-up retries.
    pub(super) async fn roll_back(&self, uid: &ClaimUid, record: ClaimRecord) -> Result<(), UndoError> {
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
