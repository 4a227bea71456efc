//! What survives a crash: the checkpoint of prepared claims, the
//! crash-safe file writes under it, and the lock that keeps one plugin
//! per state directory; the crash tests' kill points; NVIDIA's checkpoint, read
//! to adopt the claims their plugin prepared.

pub mod checkpoint;
pub mod durable;
pub mod instance_lock;
pub mod kill_point;
pub mod nvidia_checkpoint;
