//! Why NVML discovery, or reading one GPU, failed.

use nvml_wrapper::error::NvmlError;

/// Why NVML discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum NvmlDiscoveryError {
    /// The library could not be loaded or initialized.
    #[error(
        "NVML is unavailable ({0}): run on a node with the NVIDIA driver installed, or pass --fake-inventory FILE to use a fake GPU inventory"
    )]
    LibraryUnavailable(String),
    /// A node-wide query failed.
    #[error("NVML cannot report the {what}: {error}")]
    Query { what: &'static str, error: NvmlError },
    /// NVML reported a version we cannot read.
    #[error("NVML reports the {what} as {value:?}, which is not a MAJOR[.MINOR[.PATCH]] version")]
    InvalidVersion { what: &'static str, value: String },
}

/// Why a GPU's details could not be read.
#[cfg(target_os = "linux")]
pub(super) enum GpuError {
    /// NVML says the GPU fell off the bus (`NVML_ERROR_GPU_IS_LOST`).
    Lost,
    /// A query the model needs failed; the GPU is skipped.
    Failed { what: &'static str, error: String },
}

#[cfg(target_os = "linux")]
impl GpuError {
    pub(super) fn nvml(what: &'static str, error: NvmlError) -> Self {
        match error {
            NvmlError::GpuLost => Self::Lost,
            error => Self::Failed { what, error: error.to_string() },
        }
    }
}
