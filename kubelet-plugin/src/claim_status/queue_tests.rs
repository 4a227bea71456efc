//! The queue through the preparer against an in-process API server that
//! keeps one claim and can refuse (403), fail (500) or stall.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use serde_json::{Value, json};

use super::*;
use crate::observe::metrics::Metrics;
use crate::prepare::test_support::{Harness, allocated, claim_ref};

const A: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
const OURS: &str = "gpu.nvidia.com";

/// What the server holds and how it answers.
#[derive(Default)]
struct State {
    claim: Option<Value>,
    /// Every status write answers this code.
    refuse_writes: Option<u16>,
    /// Every answer waits this long.
    delay: Duration,
    /// Drop `status.devices` from every write, as a server with the
    /// DRAResourceClaimDeviceStatus gate off does for a claim without
    /// entries (`dropDisabledDRAResourceClaimDeviceStatusFields`).
    drop_devices: bool,
    puts: usize,
    events: Vec<Value>,
}

#[derive(Clone, Default)]
struct Server(Arc<Mutex<State>>);

fn status(code: u16, message: &str) -> http::Response<kube::client::Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
        "reason": if code == 403 { "Forbidden" } else { "InternalError" }, "code": code});
    http::Response::builder().status(code).body(kube::client::Body::from(body.to_string().into_bytes())).unwrap()
}

fn ok(value: &Value) -> http::Response<kube::client::Body> {
    http::Response::builder().status(200).body(kube::client::Body::from(value.to_string().into_bytes())).unwrap()
}

impl Server {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }

    fn put(&self, claim: &ResourceClaim) {
        let mut value = serde_json::to_value(claim).unwrap();
        value["metadata"]["resourceVersion"] = json!("1");
        self.state().claim = Some(value);
    }

    fn claim(&self) -> ResourceClaim {
        serde_json::from_value(self.state().claim.clone().unwrap()).unwrap()
    }

    fn ours(&self) -> Vec<AllocatedDeviceStatus> {
        let devices = self.claim().status.and_then(|s| s.devices).unwrap_or_default();
        devices.into_iter().filter(|d| d.driver == OURS).collect()
    }

    async fn answer(self, request: http::Request<kube::client::Body>) -> http::Response<kube::client::Body> {
        let delay = self.state().delay;
        tokio::time::sleep(delay).await;
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        let body = request.into_body().collect_bytes().await.unwrap_or_default();
        let mut state = self.state();
        if path.ends_with("/events") {
            state.events.push(serde_json::from_slice(&body).unwrap());
            return ok(&json!({}));
        }
        let Some(claim) = state.claim.clone() else { return status(404, "not found") };
        match method.as_str() {
            "GET" => ok(&claim),
            "PUT" if path.ends_with("/status") => {
                state.puts += 1;
                if let Some(code) = state.refuse_writes {
                    return status(code, "no \u{1b}[31mway\u{1b}[0m");
                }
                let mut written: Value = serde_json::from_slice(&body).unwrap();
                if written["metadata"]["resourceVersion"] != claim["metadata"]["resourceVersion"] {
                    return status(409, "conflict");
                }
                let version: u64 = claim["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
                written["metadata"]["resourceVersion"] = json!((version + 1).to_string());
                if state.drop_devices
                    && let Some(status) = written["status"].as_object_mut()
                {
                    status.remove("devices");
                }
                state.claim = Some(written.clone());
                ok(&written)
            }
            _ => status(405, "unexpected"),
        }
    }

    fn client(&self) -> kube::Client {
        let server = self.clone();
        let service = tower::service_fn(move |request| {
            let server = server.clone();
            async move { Ok::<_, std::convert::Infallible>(server.answer(request).await) }
        });
        kube::Client::new(service, "default")
    }
}

struct Setup {
    harness: Harness,
    server: Server,
    metrics: Arc<Metrics>,
}

impl Setup {
    fn new(devices: &[&str]) -> Self {
        let harness = Harness::new();
        let claim = allocated(A, "a", devices);
        harness.source.put(claim.clone());
        let server = Server::default();
        server.put(&claim);
        Self { harness, server, metrics: Arc::new(Metrics::new()) }
    }

    fn preparer(&self, timeout: Duration) -> crate::prepare::Preparer<crate::prepare::test_support::MapSource> {
        let queue =
            StatusQueue::with_timeout(self.server.client(), OURS, "node-a", Some(self.metrics.clone()), timeout);
        self.harness.open().0.with_status_queue(queue)
    }

    fn failures(&self) -> usize {
        let text = self.metrics.encode().unwrap();
        let line = text.lines().find(|l| l.starts_with("gpu_dra_errors_total{kind=\"claim_status\"}"));
        line.and_then(|l| l.rsplit(' ').next()).map_or(0, |n| n.parse().unwrap())
    }
}

fn ready(entry: &AllocatedDeviceStatus) -> (String, String) {
    let condition = &entry.conditions.as_ref().unwrap()[0];
    (condition.status.clone(), condition.reason.clone())
}

#[tokio::test]
async fn a_prepared_claim_shows_each_device_ready_with_its_uuid_until_unprepared() {
    let setup = Setup::new(&["gpu-0", "gpu-1-mig-1g10gb-19-0"]);
    let p = setup.preparer(WRITE_TIMEOUT);
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    p.settled_status().await;
    let ours = setup.server.ours();
    assert_eq!(ours.iter().map(|d| d.device.as_str()).collect::<Vec<_>>(), ["gpu-0", "gpu-1-mig-1g10gb-19-0"]);
    let uuids: Vec<Value> = ours.iter().map(|d| d.data.clone().unwrap().0["uuid"].clone()).collect();
    assert!(uuids[0].as_str().unwrap().starts_with("GPU-") && uuids[1].as_str().unwrap().starts_with("MIG-"));
    assert!(ours.iter().all(|d| ready(d) == ("True".into(), "Prepared".into())));

    let puts = setup.server.state().puts;
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    p.settled_status().await;
    assert_eq!(setup.server.state().puts, puts, "a repeat reads, finds it said, and writes nothing");

    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
    p.settled_status().await;
    assert!(setup.server.ours().is_empty());
    assert_eq!(setup.failures(), 0);
}

#[tokio::test]
async fn a_failed_prepare_shows_not_ready_with_the_reason() {
    let setup = Setup::new(&["gpu-7"]);
    let p = setup.preparer(WRITE_TIMEOUT);
    let error = p.prepare(vec![claim_ref(A, "a")]).await[A].clone().unwrap_err().to_string();
    p.settled_status().await;
    let ours = setup.server.ours();
    assert_eq!(ready(&ours[0]), ("False".into(), "PrepareFailed".into()));
    let message = &ours[0].conditions.as_ref().unwrap()[0].message;
    assert!(message.contains("gpu-7") && error.contains(message.as_str()), "{message} / {error}");
}

#[tokio::test]
async fn a_refused_write_fails_nothing_and_is_explained_once() {
    let setup = Setup::new(&["gpu-0"]);
    setup.server.state().refuse_writes = Some(403);
    let p = setup.preparer(WRITE_TIMEOUT);
    for _ in 0..2 {
        assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
        p.settled_status().await;
    }
    assert_eq!(setup.failures(), 2, "each failed write counts");
    let events = setup.server.state().events.clone();
    assert_eq!(events.len(), 1, "explained once: {events:#?}");
    let note = events[0]["note"].as_str().unwrap();
    assert!(note.contains("HTTP 403 Forbidden") && note.contains("resourceclaims/driver for gpu.nvidia.com"), "{note}");
    assert!(!note.contains('\u{1b}') && note.contains("\\u{1b}[31m"), "the server's words are escaped: {note}");
    assert_eq!(events[0]["regarding"]["kind"], "ResourceClaim");
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
}

#[tokio::test]
async fn a_failing_or_stalled_server_holds_up_no_call() {
    let setup = Setup::new(&["gpu-0"]);
    setup.server.state().refuse_writes = Some(500);
    let p = setup.preparer(WRITE_TIMEOUT);
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    p.settled_status().await;
    assert_eq!(setup.failures(), 1);
    assert!(setup.server.state().events.is_empty(), "a server error is retried by the next call, not explained");

    setup.server.state().delay = Duration::from_secs(30);
    let p = setup.preparer(Duration::from_millis(300));
    let start = Instant::now();
    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    assert!(start.elapsed() < Duration::from_secs(2), "calls answer without the server: {:?}", start.elapsed());
    tokio::time::timeout(Duration::from_secs(5), p.settled_status()).await.expect("writes give up at their bound");
    let failures = setup.failures();
    assert!((2..=3).contains(&failures), "each stalled write is given up and counted: {failures}");
}

#[tokio::test]
async fn a_late_prepare_write_never_follows_the_unprepare() {
    let setup = Setup::new(&["gpu-0"]);
    setup.server.state().delay = Duration::from_millis(200);
    let p = setup.preparer(WRITE_TIMEOUT);
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
    p.settled_status().await;
    assert!(setup.server.ours().is_empty(), "{:#?}", setup.server.ours());
}

#[tokio::test]
async fn forged_entries_of_ours_go_and_others_stay() {
    let setup = Setup::new(&["gpu-0"]);
    let entry = |driver: &str, pool: &str, device: &str| AllocatedDeviceStatus {
        driver: driver.into(),
        pool: pool.into(),
        device: device.into(),
        data: Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(json!({"uuid": "GPU-forged"}))),
        ..AllocatedDeviceStatus::default()
    };
    let mut claim = setup.server.claim();
    let theirs = entry("nic.example.com", "node-a", "nic-0");
    let other_pool = entry(OURS, "node-b", "gpu-0");
    claim.status.as_mut().unwrap().devices =
        Some(vec![theirs.clone(), entry(OURS, "node-a", "gpu-5"), other_pool.clone(), entry(OURS, "node-a", "gpu-0")]);
    setup.server.put(&claim);
    let p = setup.preparer(WRITE_TIMEOUT);
    assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
    p.settled_status().await;
    let devices = setup.server.claim().status.unwrap().devices.unwrap();
    assert_eq!(devices.len(), 3, "{devices:#?}");
    assert_eq!((&devices[0], &devices[1]), (&theirs, &other_pool), "another driver's and another pool's stay");
    assert_eq!(devices[2].device, "gpu-0");
    assert_ne!(devices[2].data.as_ref().unwrap().0["uuid"], "GPU-forged", "our data replaces the forged one");

    // A claim of the same name but another UID is not the prepared one.
    let mut other = setup.server.claim();
    other.metadata.uid = Some("9b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a".into());
    setup.server.put(&other);
    let puts = setup.server.state().puts;
    assert_eq!(p.unprepare(vec![claim_ref(A, "a")]).await[A], Ok(()));
    p.settled_status().await;
    assert_eq!(setup.server.state().puts, puts, "nothing written to another claim");
}

#[tokio::test]
async fn a_server_that_drops_the_field_gets_one_write_per_call_not_a_loop() {
    let setup = Setup::new(&["gpu-0"]);
    setup.server.state().drop_devices = true;
    let p = setup.preparer(WRITE_TIMEOUT);
    for _ in 0..2 {
        assert!(p.prepare(vec![claim_ref(A, "a")]).await[A].is_ok());
        p.settled_status().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(setup.server.state().puts, 2, "one write per prepare call");
    assert!(setup.server.ours().is_empty());
    assert_eq!(setup.failures(), 0, "the server said yes: nothing to report");
}
