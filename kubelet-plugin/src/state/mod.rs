//! What survives a crash: the checkpoint of prepared claims, the
//! crash-safe file writes under it, and the lock that keeps one plugin
//! per state directory.

pub mod checkpoint;
pub mod durable;
pub mod instance_lock;
