//! Why a simulation could not run: input it cannot understand, or output
//! it cannot write. Claims that do not fit are outcomes, not errors.

use crate::configs::DeniedConfig;
use crate::engine::BadAllocation;
use crate::fleet::FleetError;
use crate::inputs::InputsError;
use crate::manifests::ReadError;
use crate::output::OutputError;
use crate::workload::WorkloadError;

/// Each variant says what is wrong and where, as its source does.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Inputs(#[from] InputsError),
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Config(#[from] DeniedConfig),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Allocation(#[from] BadAllocation),
    #[error(transparent)]
    Output(#[from] OutputError),
    /// Writing a note failed.
    #[error(transparent)]
    Note(#[from] std::io::Error),
    /// The thread that loads the fleet file panicked.
    #[error("loading the fleet failed")]
    FleetThread,
    /// The fleet file and the manifests define the same node.
    #[error("{fleet}: node {name} is also defined in {origin}; fix: define each node once")]
    DuplicateNode { fleet: String, name: String, origin: String },
    /// `run_manifests` or a [`crate::Feed`] was given a fleet file.
    #[error("a fleet file is read by `run`, not `run_manifests`; add its slices to the manifests")]
    FleetNotRead,
}
