//! What an operator reads: the metrics endpoint and the offline
//! `print-slices` / `print-cdi` views.

pub mod inspect;
pub mod metrics;
