//! The last snapshot, served to `/metrics`.

use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::families::{self, Naming};
use super::readings::Snapshot;

/// The last snapshot, shared between the sampling task (writer) and the
/// metrics endpoint (reader, through [`Collector`]).
#[derive(Debug)]
pub struct TelemetryStore {
    naming: Naming,
    hostname: String,
    driver: String,
    snapshot: RwLock<Arc<Snapshot>>,
}

impl TelemetryStore {
    pub fn new(naming: Naming, hostname: impl Into<String>, driver: impl Into<String>) -> Self {
        Self {
            naming,
            hostname: hostname.into(),
            driver: driver.into(),
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
        }
    }

    pub fn publish(&self, snapshot: Snapshot) {
        match self.snapshot.write() {
            Ok(mut guard) => *guard = Arc::new(snapshot),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(snapshot),
        }
    }

    pub fn naming(&self) -> Naming {
        self.naming
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        match self.snapshot.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn context(&self) -> families::Context<'_> {
        families::Context { naming: self.naming, hostname: &self.hostname, driver: &self.driver }
    }
}

impl Collector for TelemetryStore {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.snapshot();
        for family in families::families(&snapshot, &self.context()) {
            let mut metric = encoder.encode_descriptor(
                family.name,
                family.help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for row in &family.rows {
                if row.labels.is_empty() {
                    metric.encode_gauge(&row.value)?;
                } else {
                    metric.encode_family(&row.labels)?.encode_gauge(&row.value)?;
                }
            }
        }
        Ok(())
    }
}
