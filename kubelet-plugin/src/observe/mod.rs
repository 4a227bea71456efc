//! What an operator reads: the metrics endpoint and per-device and
//! per-claim telemetry with idle-claim warnings. (The offline
//! `print-slices` / `print-cdi` views are commands: [`crate::inspect`].)

pub mod metrics;
pub mod telemetry;
