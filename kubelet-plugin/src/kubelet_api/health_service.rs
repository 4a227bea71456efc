//! `v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth` (the same
//! messages): streams the health of every published
//! device to the kubelet, which shows it in pods'
//! `status.containerStatuses[].allocatedResourcesStatus`.
//!
//! Each message is the complete list for the driver (dra-health
//! `api.proto`: "the complete list of devices"), sent when the stream opens,
//! whenever the inventory changes (faults come and go), and every
//! `resend` period so that the kubelet never sees a status older than
//! `health_check_timeout_seconds` (after which it would fall back to
//! Unknown).

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::Stream;
use gpu_dra_driver::inventory::{Fault, Inventory};
use gpu_dra_driver::names::NodeName;
use kubelet_proto::health_v1alpha1::dra_resource_health_server::DraResourceHealth;
use kubelet_proto::health_v1alpha1::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The kubelet caps `DeviceHealth.message` at 1024 characters.
const MAX_MESSAGE_CHARS: usize = 1024;

/// The health stream server.
pub struct HealthService {
    inventory: watch::Receiver<Arc<Inventory>>,
    pool: String,
    resend: Duration,
    /// Becomes true when the plugin stops: open streams end, so the
    /// server's graceful shutdown does not wait for them until its timeout.
    stopping: watch::Receiver<bool>,
}

impl HealthService {
    /// `node` names the pool (one pool per node, as the slices publish it).
    pub fn new(
        inventory: watch::Receiver<Arc<Inventory>>,
        node: &NodeName,
        resend: Duration,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        Self { inventory, pool: node.to_string(), resend, stopping }
    }

    /// How long the kubelet may trust one message: three resend periods.
    fn timeout_seconds(&self) -> i64 {
        i64::try_from(self.resend.as_secs().saturating_mul(3)).unwrap_or(i64::MAX).max(1)
    }
}

/// The health of every published device of `inventory`: UNHEALTHY with the
/// faults as message when it (or, for a MIG device, its parent GPU) has
/// faults, HEALTHY otherwise.
pub fn device_health(inventory: &Inventory, pool: &str, now_unix: i64, timeout_seconds: i64) -> Vec<DeviceHealth> {
    let mut out = Vec::new();
    for device in inventory.published_devices() {
        let Ok(name) = device.name() else {
            // Such a device is not published either (the slice builder
            // rejects it), so the kubelet cannot have allocated it.
            continue;
        };
        let faults = device.faults();
        let (health, message) = if faults.is_empty() {
            (HealthStatus::Healthy, String::new())
        } else {
            (HealthStatus::Unhealthy, fault_message(&faults))
        };
        out.push(DeviceHealth {
            device: Some(DeviceIdentifier { pool_name: pool.to_owned(), device_name: name.to_string() }),
            health: health.into(),
            last_updated_time: now_unix,
            health_check_timeout_seconds: timeout_seconds,
            message,
        });
    }
    out
}

fn fault_message(faults: &[Fault]) -> String {
    let text = faults
        .iter()
        .map(|f| match f {
            Fault::Xid(code) => format!("critical XID {code}"),
            Fault::Lost => "GPU is lost (NVML_ERROR_GPU_IS_LOST)".to_owned(),
        })
        .collect::<Vec<_>>()
        .join("; ");
    text.chars().take(MAX_MESSAGE_CHARS).collect()
}

fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

type HealthStream = Pin<Box<dyn Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send>>;

/// Per-stream state: the inventory subscription, whether the first message
/// went out, and the resend timer.
struct StreamState {
    inventory: watch::Receiver<Arc<Inventory>>,
    first: bool,
    ticker: tokio::time::Interval,
    pool: String,
    timeout_seconds: i64,
    stopping: watch::Receiver<bool>,
}

impl HealthService {
    /// One stream: the full list now, then on every change and resend.
    fn open(&self) -> HealthStream {
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + self.resend, self.resend);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let state = StreamState {
            inventory: self.inventory.clone(),
            first: true,
            ticker,
            pool: self.pool.clone(),
            timeout_seconds: self.timeout_seconds(),
            stopping: self.stopping.clone(),
        };
        let stream = futures::stream::unfold(state, |mut state| async move {
            if *state.stopping.borrow() {
                return None;
            }
            if state.first {
                state.first = false;
            } else {
                tokio::select! {
                    changed = state.inventory.changed() => {
                        // The inventory is gone: the plugin is stopping.
                        changed.ok()?;
                    }
                    _ = state.ticker.tick() => {}
                    _ = state.stopping.wait_for(|stopping| *stopping) => return None,
                }
            }
            let inventory = state.inventory.borrow_and_update().clone();
            let devices = device_health(&inventory, &state.pool, now_unix(), state.timeout_seconds);
            Some((Ok(NodeWatchResourcesResponse { devices }), state))
        });
        Box::pin(stream)
    }
}

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        tracing::info!(version = "v1alpha1", "kubelet opened the device health stream");
        Ok(Response::new(self.open()))
    }
}

/// v1 (kubelet 1.37+) is v1alpha1 under another package name.
#[tonic::async_trait]
impl kubelet_proto::health_v1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        tracing::info!(version = "v1", "kubelet opened the device health stream");
        Ok(Response::new(self.open()))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use gpu_dra_driver::inventory::fake;

    use super::*;

    fn node() -> NodeName {
        NodeName::new("node-a").unwrap()
    }

    fn parse(yaml: &str) -> Inventory {
        fake::parse(yaml, &node()).unwrap()
    }

    fn status(d: &DeviceHealth) -> (String, HealthStatus, String) {
        let id = d.device.clone().unwrap();
        assert_eq!(id.pool_name, "node-a");
        (id.device_name, HealthStatus::try_from(d.health).unwrap(), d.message.clone())
    }

    #[test]
    fn faults_make_devices_unhealthy_with_a_message() {
        let inv = parse(
            "gpus:\n- model: H100-80GB\n  count: 4\n  mig:\n  - gpus: [1]\n    instances: [3g.40gb, 3g.40gb]\n  \
             faults:\n  - {gpu: 0, xid: 79}\n  - {gpu: 0, lost: true}\n  - {gpu: 1, xid: 48}\n  \
             - {gpu: 1, migInstance: 1, xid: 94}\n",
        );
        let list = device_health(&inv, "node-a", 100, 60);
        let got: Vec<_> = list.iter().map(status).collect();
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(got[0].0, "gpu-0");
        assert_eq!(got[0].1, HealthStatus::Unhealthy);
        assert_eq!(got[0].2, "critical XID 79; GPU is lost (NVML_ERROR_GPU_IS_LOST)");
        // MIG devices inherit their parent's faults and add their own.
        let migs: Vec<_> = got.iter().filter(|e| e.0.starts_with("gpu-1-mig-")).collect();
        assert_eq!(migs.len(), 2, "{got:?}");
        assert!(migs.iter().all(|e| e.1 == HealthStatus::Unhealthy && e.2.starts_with("critical XID 48")), "{migs:?}");
        assert!(migs.iter().any(|e| e.2 == "critical XID 48; critical XID 94"), "{migs:?}");
        let healthy: Vec<_> = got.iter().filter(|e| e.1 == HealthStatus::Healthy).map(|e| e.0.as_str()).collect();
        assert_eq!(healthy, ["gpu-2", "gpu-3"]);
        assert!(list.iter().all(|d| d.last_updated_time == 100 && d.health_check_timeout_seconds == 60));
    }

    #[tokio::test]
    async fn the_stream_sends_the_full_list_at_start_and_on_every_change() {
        let (tx, rx) = watch::channel(Arc::new(parse("gpus:\n- model: H100-80GB\n  count: 2\n")));
        let (stop_tx, stop_rx) = watch::channel(false);
        let svc = HealthService::new(rx, &node(), Duration::from_secs(3600), stop_rx);
        let request = Request::new(NodeWatchResourcesRequest {});
        let mut stream = svc.node_watch_resources(request).await.unwrap().into_inner();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 2);
        assert!(first.devices.iter().all(|d| d.health == i32::from(HealthStatus::Healthy)));

        tx.send(Arc::new(parse("gpus:\n- model: H100-80GB\n  count: 2\n  faults: [{gpu: 1, xid: 48}]\n"))).unwrap();
        let second = stream.next().await.unwrap().unwrap();
        let got: Vec<_> = second.devices.iter().map(status).collect();
        assert_eq!(got[0].1, HealthStatus::Healthy);
        assert_eq!((got[1].0.as_str(), got[1].1), ("gpu-1", HealthStatus::Unhealthy));

        drop(tx);
        assert!(stream.next().await.is_none(), "the stream ends when the inventory is gone");
        drop(stop_tx);
    }

    #[tokio::test]
    async fn the_stream_ends_when_the_plugin_stops() {
        let (_tx, rx) = watch::channel(Arc::new(parse("gpus:\n- model: H100-80GB\n  count: 1\n")));
        let (stop_tx, stop_rx) = watch::channel(false);
        let svc = HealthService::new(rx, &node(), Duration::from_secs(3600), stop_rx);
        let mut stream =
            svc.node_watch_resources(Request::new(NodeWatchResourcesRequest {})).await.unwrap().into_inner();
        assert!(stream.next().await.is_some());
        stop_tx.send(true).unwrap();
        assert!(stream.next().await.is_none(), "a stopping plugin ends its health streams");
    }

    #[test]
    fn long_messages_are_capped() {
        let faults: Vec<Fault> = (0..500).map(Fault::Xid).collect();
        assert_eq!(fault_message(&faults).chars().count(), MAX_MESSAGE_CHARS);
    }
}
