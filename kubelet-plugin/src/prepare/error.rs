//! Why undoing a claim stopped (its roll-back after a failed prepare, or
//! its unprepare): the record stays, and the next attempt or start-up
//! retries. The kubelet and the log read the message.

use std::path::PathBuf;

use super::{mps, passthrough, sharing};
use crate::state::checkpoint::CheckpointError;

/// A step of undoing a claim that failed.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    #[error(transparent)]
    Task(#[from] TaskError),
    /// Setting a GPU's time-slice or compute mode back.
    #[error(transparent)]
    GpuControl(#[from] sharing::GpuControlError),
    #[error(
        "the claim's MPS daemon in {} cannot be stopped: no nvidia-cuda-mps-control in the driver root",
        .0.display()
    )]
    NoMpsControl(PathBuf),
    #[error("MPS: {0}")]
    Mps(#[source] mps::Error),
    #[error(transparent)]
    Passthrough(#[from] passthrough::Error),
    #[error(transparent)]
    Mig(#[from] crate::mig::Error),
    #[error("removing CDI spec {file}: {source}")]
    RemoveSpec { file: String, source: std::io::Error },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// File or NVML work handed to a blocking thread that did not finish.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("internal error: file task panicked")]
    Panicked,
    #[error("internal error: file task failed: {0}")]
    Failed(#[source] tokio::task::JoinError),
}

/// Why the preparer could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("CDI directory {path}: {error}")]
    CdiDir { path: PathBuf, error: std::io::Error },
    #[error(
        "adopting NVIDIA's checkpoint {path}: {error}; its claims' records are written, renaming it failed: \
         the plugin serves nothing until it can set the file aside (check the directory's permissions and space)"
    )]
    Adopt { path: PathBuf, error: std::io::Error },
}
