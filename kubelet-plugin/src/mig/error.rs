//! What can go wrong making, destroying and recording dynamic MIG devices.
//! Each message is the one the kubelet and the log show, so a variant says
//! which device or file and what was being done to it.

use std::path::PathBuf;

use gpu_dra_driver::bounded_file::ReadError;
use gpu_dra_driver::names::{ClaimUid, InvalidName};

use super::control::MigControlError;

/// An error of dynamic MIG: NVML's, the ledger's, or the caps files'.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// NVML refused or failed a call.
    #[error(transparent)]
    Control(#[from] MigControlError),
    /// A ledger is named after something that is not a claim UID.
    #[error("MIG ledger: {0}")]
    LedgerUid(#[source] InvalidName),
    #[error("encoding the MIG ledger of {uid}: {source}")]
    EncodeLedger { uid: ClaimUid, source: serde_json::Error },
    #[error("writing the MIG ledger {}: {source}", path.display())]
    WriteLedger { path: PathBuf, source: std::io::Error },
    #[error("removing the MIG ledger {}: {source}", path.display())]
    RemoveLedger { path: PathBuf, source: std::io::Error },
    /// Neither the capability files nor the driver's minors table name the
    /// new instance's caps minors.
    #[error(
        "the access capabilities of MIG instance gi{gi}/ci{ci} on GPU {gpu_minor} cannot be read ({cause}), nor found \
         in {}",
        table.display()
    )]
    Caps { gpu_minor: u32, gi: u32, ci: u32, cause: CapFileError, table: PathBuf },
    /// A step of making one device failed; `device` names it (profile,
    /// memory slices, GPU).
    #[error("making {device}: {source}")]
    Making { device: String, source: Box<Error> },
    /// The ledger could not record the claim's devices before any was made.
    #[error("recording the MIG devices to make: {0}")]
    RecordingIntents(#[source] Box<Error>),
    /// A step of removing one device failed; `device` names it.
    #[error("removing {device}: {source}")]
    Removing { device: String, source: Box<Error> },
    /// The driver holds the MIG mode change until the GPU is reset.
    #[error(
        "GPU {gpu} needs a reset to turn MIG mode {} (the change is pending): reset it with nvidia-smi -r -i {gpu} when \
         nothing runs on it",
        if *on { "on" } else { "off" }
    )]
    NeedsReset { gpu: String, on: bool },
}

/// Why one `/proc` capability file gave no minor.
#[derive(Debug, thiserror::Error)]
pub enum CapFileError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{}: no DeviceFileMinor line", .0.display())]
    NoMinor(PathBuf),
}
