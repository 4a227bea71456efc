//! The sampling loop: on each tick, read every published device through
//! NVML (in a blocking thread), join the readings with the prepared claims
//! and their pods, judge idleness, write the idle-claim Events and publish
//! the snapshot for `/metrics`. Its cost is one NVML pass per interval,
//! whatever the scrape rate; the prepare path never waits for it.

use std::sync::Arc;
use std::time::Duration;

use gpu_dra_driver::inventory::Inventory;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use super::holders::ClaimPods;
use super::idle::IdleTracker;
use super::idle_events::IdleEvents;
use super::readings::Snapshot;
use super::sampler::{DeviceReader, sample_all};
use super::series_cap::ClaimSeriesCap;
use super::snapshot::{self, PreparedClaim};
use super::store::TelemetryStore;

/// The prepared claims, asked for on each tick.
pub type PreparedClaims = Arc<dyn Fn() -> Vec<PreparedClaim> + Send + Sync>;

pub struct TelemetryTask {
    pub store: Arc<TelemetryStore>,
    pub inventory: watch::Receiver<Arc<Inventory>>,
    pub claims: PreparedClaims,
    pub pods: ClaimPods,
    pub reader: Box<dyn DeviceReader>,
    /// The idle watch and its Events; `None` when off.
    pub idle: Option<(IdleTracker, IdleEvents)>,
    pub interval: Duration,
    /// Which claims get series (`--max-claim-series`).
    pub cap: ClaimSeriesCap,
    /// Claims refused series (`gpu_dra_claim_series_dropped_total`).
    pub dropped: prometheus_client::metrics::counter::Counter,
}

impl TelemetryTask {
    /// Runs until the task is aborted (or NVML's thread panics).
    pub async fn run(mut self) {
        let start = Instant::now();
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !self.pass(start.elapsed()).await {
                return;
            }
        }
    }

    async fn pass(&mut self, now: Duration) -> bool {
        // The claims first: the dynamic MIG devices they made are sampled too.
        let claims = (self.claims)();
        let devices = snapshot::identities(&self.inventory.borrow(), &claims);
        let uuids: Vec<String> = devices.iter().map(|(d, ..)| d.uuid.clone()).collect();
        let mut reader = std::mem::replace(&mut self.reader, Box::new(NoReader));
        let sampled = tokio::task::spawn_blocking(move || {
            let result = sample_all(reader.as_mut(), &uuids);
            (reader, result)
        })
        .await;
        let (samples, took) = match sampled {
            Ok((reader, result)) => {
                self.reader = reader;
                result
            }
            Err(error) => {
                tracing::error!(%error, "the NVML sampling thread failed; telemetry stops");
                return false;
            }
        };
        let pods = self.pods.refresh(&claims).await;
        let (readings, loads) = snapshot::join(devices, samples, &claims, &pods);
        let idle = match &mut self.idle {
            Some((tracker, events)) => {
                let changes = tracker.observe(now, loads);
                events.apply(changes).await;
                tracker.idle()
            }
            None => Vec::new(),
        };
        let mut snapshot = Snapshot {
            devices: readings,
            prepared_claims: claims.len(),
            idle,
            sample_seconds: Some(took.as_secs_f64()),
            ..Snapshot::default()
        };
        self.dropped.inc_by(self.cap.apply(&mut snapshot, self.store.naming()));
        self.store.publish(snapshot);
        true
    }
}

/// Stands in while the real reader is in the blocking thread.
struct NoReader;

impl DeviceReader for NoReader {
    fn read(&mut self, _uuid: &str) -> super::readings::DeviceSample {
        super::readings::DeviceSample::default()
    }
}
