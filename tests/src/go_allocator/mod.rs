//! Our allocator side by side with the kube-scheduler's
//! (`k8s.io/dynamic-resource-allocation/structured`, the Go module in
//! `tests/go-allocator/`): the same generated fleet, DeviceClasses and
//! claims are written to files once; `gpu-dra-controller simulate` and the
//! Go program each read them and allocate every claim in order on the first
//! node in name order that fits; both are measured as processes (wall
//! time, peak RSS from `wait4`, their own phase timings) and every claim's
//! chosen node and devices are compared.
//!
//! Used by `cargo bench -p integration-tests --bench go_allocator` (the
//! four benchmark fleets, figures) and `tests/tests/go_allocator.rs` (small
//! fleets, identical choices asserted).

mod compare;
mod fleet;
mod go_build;
mod measure;

#[allow(dead_code)]
#[path = "../../../allocator/benches/common/fleets.rs"]
mod bench_fleets;

pub use compare::{Choice, Comparison, Mismatch, compare};
pub use fleet::{Fleet, Layout, thousands};
pub use go_build::go_allocator;
pub use measure::{Measured, Side, measured, run_go, run_simulate};

use std::path::{Path, PathBuf};

/// What can go wrong running the comparison.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{what}: {source}")]
    Json { what: String, source: serde_json::Error },
    #[error("{0}")]
    Failed(String),
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

pub(crate) fn json(what: impl Into<String>) -> impl FnOnce(serde_json::Error) -> Error {
    let what = what.into();
    move |source| Error::Json { what, source }
}

/// The input files of one fleet, written once and read by both sides.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub classes: PathBuf,
    pub slices: PathBuf,
    pub claims: PathBuf,
    /// Devices published, slices, bytes of the slices file.
    pub devices: usize,
    pub slice_count: usize,
    pub slice_bytes: u64,
}

/// One fleet run on both sides.
#[derive(Debug)]
pub struct SideBySide {
    pub inputs: Inputs,
    pub ours: Side,
    pub go: Side,
    pub comparison: Comparison,
}

/// Writes `fleet`'s inputs into `dir` (the shipped DeviceClasses from
/// `classes_dir`), runs `simulate` (the binary `controller`) and the Go
/// program `go` on them, and compares their choices.
pub fn side_by_side(fleet: &Fleet, dir: &Path, classes_dir: &Path, controller: &Path, go: &Path) -> Result<SideBySide> {
    let inputs = fleet.write(dir, classes_dir)?;
    let ours = run_simulate(controller, &inputs)?;
    let go = run_go(go, &inputs)?;
    let comparison = compare(&ours.choices, &go.choices);
    Ok(SideBySide { inputs, ours, go, comparison })
}
