//! Where a prepare's file work runs (see [`blocking`]). Apart from
//! `mod.rs` so the prepare steps in sibling files call it as a sibling.

use super::error::TaskError;

tokio::task_local! {
    /// Set while a call for one claim runs: its file work blocks the worker
    /// it runs on (see [`blocking`]).
    pub(super) static ALONE: bool;
}

/// Runs file work (fsync blocks for milliseconds) where it does not hold
/// up other work: on a blocking thread when claims of one call run side
/// by side, so their writes overlap; in place (`block_in_place`, which
/// hands the worker's other tasks to another thread) for a call with one
/// claim, which saves waking a parked thread, on a VM an idle vCPU, twice
/// per hand-off.
pub(super) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, TaskError> {
    let alone = ALONE.try_with(|alone| *alone).unwrap_or(false);
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if alone && multi_thread {
        return tokio::task::block_in_place(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)))
            .map_err(|_| TaskError::Panicked);
    }
    tokio::task::spawn_blocking(work).await.map_err(TaskError::Failed)
}
