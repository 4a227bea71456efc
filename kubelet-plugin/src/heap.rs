//! The process's heap after a burst of allocation.
//!
//! glibc keeps freed heap pages resident until they reach the top of the
//! heap, so a start-up peak stays in the node agent's RSS for good: after
//! publishing a dynamic-MIG node's 208 devices, 6.3 MiB of the agent's
//! 20.7 MiB were free heap (a `malloc_trim` brought it to 14.9 MiB;
//! `cargo bench -p integration-tests --bench prepare`). The agent runs on
//! every GPU node, so it gives such pages back after each burst.

/// Returns the heap's free pages to the kernel (glibc's `malloc_trim`).
/// Costs a walk of the allocator's free lists, so it is for after rare
/// bursts (a publish), not for every request; a no-op without glibc.
pub fn release_free_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the allocator's own locks and touches only
    // memory the allocator owns and has marked free.
    unsafe {
        libc::malloc_trim(0);
    }
}
