//! What an operator reads: the metrics endpoint, per-device and per-claim
//! telemetry with idle-claim warnings, and the offline `print-slices` /
//! `print-cdi` views.

pub mod inspect;
pub mod metrics;
pub mod telemetry;
