//! The preparer's file work, synchronous so that a prepare's three durable
//! writes run in one blocking task (one thread hop, not three).

use std::path::PathBuf;

use gpu_dra_driver::names::ClaimUid;

use super::error::UndoError;
use crate::observe::metrics::ErrorKind;
use crate::state::checkpoint::{CheckpointDir, CheckpointError, ClaimRecord, PrepareState};
use crate::state::durable;

/// CDI spec files are read by the container runtime (root); others may
/// read them too, as with NVIDIA's toolkit.
pub(super) const CDI_FILE_MODE: u32 = 0o644;

/// The checkpoint and the CDI directory.
#[derive(Debug, Clone)]
pub struct Files {
    pub checkpoint: CheckpointDir,
    pub cdi_dir: PathBuf,
}

/// A prepare whose files could not be written; `left_behind` is the
/// record still on disk when the roll-back failed too.
#[derive(Debug)]
pub struct WriteFailure {
    pub kind: ErrorKind,
    pub message: String,
    pub left_behind: Option<Box<ClaimRecord>>,
}

impl Files {
    /// Records `PrepareStarted`, writes the spec, records
    /// `PrepareCompleted`; on failure rolls back what was written.
    pub fn write_prepared(
        &self,
        uid: &ClaimUid,
        mut record: ClaimRecord,
        spec: &[u8],
    ) -> Result<ClaimRecord, WriteFailure> {
        let spec_file = record.cdi_spec_file.clone().unwrap_or_default();
        record.state = PrepareState::PrepareStarted;
        let result = self
            .checkpoint
            .write(uid, &record)
            .map_err(|e| (ErrorKind::Checkpoint, e.to_string()))
            .and_then(|()| {
                durable::write(&self.cdi_dir, &spec_file, spec, CDI_FILE_MODE).map_err(|e| {
                    (ErrorKind::Cdi, format!("writing CDI spec {}: {e}", self.cdi_dir.join(&spec_file).display()))
                })
            })
            .and_then(|()| {
                record.state = PrepareState::PrepareCompleted;
                self.checkpoint.write(uid, &record).map_err(|e| (ErrorKind::Checkpoint, e.to_string()))
            });
        match result {
            Ok(()) => Ok(record),
            Err((kind, message)) => {
                record.state = PrepareState::PrepareStarted;
                let left_behind = self.remove_claim(uid, &spec_file).err().map(|_| Box::new(record));
                Err(WriteFailure { kind, message, left_behind })
            }
        }
    }

    /// Records `PrepareStarted`, before a prepare changes anything outside
    /// its files (a GPU's time-slice): start-up then knows to undo it.
    pub fn record_started(&self, uid: &ClaimUid, record: &ClaimRecord) -> Result<(), CheckpointError> {
        let mut record = record.clone();
        record.state = PrepareState::PrepareStarted;
        self.checkpoint.write(uid, &record)
    }

    /// Writes the spec, then records `PrepareCompleted`. On failure the
    /// `PrepareStarted` record stays for the caller's roll-back.
    pub fn complete(
        &self,
        uid: &ClaimUid,
        mut record: ClaimRecord,
        spec: &[u8],
    ) -> Result<ClaimRecord, (ErrorKind, String)> {
        let spec_file = record.cdi_spec_file.clone().unwrap_or_default();
        durable::write(&self.cdi_dir, &spec_file, spec, CDI_FILE_MODE).map_err(|e| {
            (ErrorKind::Cdi, format!("writing CDI spec {}: {e}", self.cdi_dir.join(&spec_file).display()))
        })?;
        crate::state::kill_point::reached(crate::state::kill_point::Step::AfterSpec);
        record.state = PrepareState::PrepareCompleted;
        self.checkpoint.write(uid, &record).map_err(|e| (ErrorKind::Checkpoint, e.to_string()))?;
        Ok(record)
    }

    /// Removes the claim's spec, then its record. If the spec cannot be
    /// removed the record stays, so the next attempt or start-up retries.
    pub fn remove_claim(&self, uid: &ClaimUid, spec_file: &str) -> Result<(), UndoError> {
        durable::remove(&self.cdi_dir, spec_file)
            .map_err(|source| UndoError::RemoveSpec { file: spec_file.to_owned(), source })?;
        crate::state::kill_point::reached(crate::state::kill_point::Step::AfterSpecRemoved);
        Ok(self.checkpoint.remove(uid)?)
    }
}
