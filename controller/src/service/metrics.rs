//! The controller's Prometheus metrics.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `gpu_dra_controller_claims_explained_total` | counter | `reason` |
//! | `gpu_dra_controller_claims_allocated_total` | counter | |
//! | `gpu_dra_controller_claims_deallocated_total` | counter | |
//! | `gpu_dra_controller_errors_total` | counter | `kind` |
//! | `gpu_dra_controller_invalid_objects_total` | counter | `kind` (objects found undecodable, once each; ignored, with a Warning Event on each) |
//! | `gpu_dra_controller_reconcile_duration_seconds` | histogram | |
//! | `gpu_dra_controller_fleet_devices` | gauge | |
//! | `gpu_dra_controller_claims` | gauge | |
//! | `gpu_dra_controller_leader` | gauge | 1 while this replica leads |
//! | `gpu_dra_controller_resident_memory_bytes` | gauge | the process's RSS (fleet model and claims) |

use std::fmt;
use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// Every `kind` of `gpu_dra_controller_errors_total`: each series exists
/// from the start at 0, so that `increase()` sees the first error and
/// dashboards and alerts find the family before anything fails.
pub const ERROR_KINDS: [&str; 7] =
    ["conflict", "double_allocation", "event", "webhook_body", "webhook_denied", "webhook_timeout", "write"];

pub struct Metrics {
    registry: Registry,
    pub explained: Family<ReasonLabel, Counter>,
    pub allocated: Counter,
    pub deallocated: Counter,
    pub errors: Family<KindLabel, Counter>,
    pub invalid_objects: Family<KindLabel, Counter>,
    pub reconcile: Histogram,
    pub fleet_devices: Gauge<i64, AtomicI64>,
    pub claims: Gauge<i64, AtomicI64>,
    pub leader: Gauge<i64, AtomicI64>,
    pub resident_bytes: Gauge<i64, AtomicI64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpu_dra_controller");
        let explained = Family::<ReasonLabel, Counter>::default();
        registry.register("claims_explained", "Explanations written as events, by reason", explained.clone());
        let allocated = Counter::default();
        registry.register("claims_allocated", "Delegated claims allocated", allocated.clone());
        let deallocated = Counter::default();
        registry.register("claims_deallocated", "Delegated claims deallocated", deallocated.clone());
        let errors = Family::<KindLabel, Counter>::default();
        registry.register("errors", "Errors by kind", errors.clone());
        for kind in ERROR_KINDS {
            let _ = errors.get_or_create(&KindLabel { kind: kind.to_owned() });
        }
        let invalid_objects = Family::<KindLabel, Counter>::default();
        registry.register(
            "invalid_objects",
            "Objects found undecodable (once each), ignored and explained by a Warning Event on each",
            invalid_objects.clone(),
        );
        let _ = invalid_objects.get_or_create(&KindLabel { kind: "ComputeDomain".to_owned() });
        let reconcile = Histogram::new(exponential_buckets(0.0005, 4.0, 10));
        registry.register_with_unit("reconcile_duration", "One reconcile pass", Unit::Seconds, reconcile.clone());
        let fleet_devices = Gauge::default();
        registry.register("fleet_devices", "Devices in the fleet model", fleet_devices.clone());
        let claims = Gauge::default();
        registry.register("claims", "ResourceClaims known", claims.clone());
        let leader = Gauge::default();
        registry.register("leader", "1 while this replica leads", leader.clone());
        let resident_bytes = Gauge::default();
        registry.register_with_unit(
            "resident_memory",
            "Resident memory of the process, mostly the fleet model and claims",
            Unit::Bytes,
            resident_bytes.clone(),
        );
        Metrics {
            registry,
            explained,
            allocated,
            deallocated,
            errors,
            invalid_objects,
            reconcile,
            fleet_devices,
            claims,
            leader,
            resident_bytes,
        }
    }

    /// Reads the process's resident memory (`/proc/self/statm`).
    pub fn sample_memory(&self) {
        let resident_pages = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<i64>().ok()));
        if let Some(pages) = resident_pages {
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            self.resident_bytes.set(pages.saturating_mul(page.max(1)));
        }
    }

    /// Counts an error of `kind`, one of [`ERROR_KINDS`].
    pub fn error(&self, kind: &str) {
        debug_assert!(ERROR_KINDS.contains(&kind), "{kind} is not in ERROR_KINDS");
        self.errors.get_or_create(&KindLabel { kind: kind.to_owned() }).inc();
    }
}

impl gpu_dra_driver::service::http::MetricsText for Metrics {
    fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use gpu_dra_driver::service::http::MetricsText;

    use super::*;

    #[test]
    fn every_error_kind_is_exported_at_zero_from_the_start() {
        let text = Metrics::new().encode().unwrap();
        for kind in ERROR_KINDS {
            let line = format!("gpu_dra_controller_errors_total{{kind=\"{kind}\"}} 0");
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
