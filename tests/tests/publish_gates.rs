//! The publisher against an API server whose DRA feature gates are off, as
//! Kubernetes 1.34's and 1.35's are by default: the server drops the gated
//! fields from every slice write (`dropDisabledFields` in
//! `pkg/registry/resource/resourceslice/strategy.go`; the stand-in's
//! `apiserver::gates`). The publisher must learn that once rather than
//! rewrite its slices forever, and a faulty GPU must not be offered without
//! the taint that kept it from claims.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_dra_driver::feature_gates::{FeatureGates, Gate};
use gpu_dra_driver::slices::consumable_shares::SharesMode;
use gpu_dra_driver::slices::served::GatedField;
use gpu_kubelet_plugin::publish::publisher::{
    PublishError, PublishObserver, PublishStatus, PublisherConfig, SliceWrite,
};
use integration_tests::apiserver::{ApiServer, gates};
use integration_tests::publisher::{self, FOUR_GPUS, NODE, SELECTOR};
use integration_tests::wait;
use k8s_openapi::api::resource::v1::ResourceSlice;

/// How long an idle publisher is watched for writes it should not make. The
/// old publisher rewrote ~85 times a second; this is a window to count in,
/// not a deadline.
const IDLE_WINDOW: Duration = Duration::from_secs(2);

/// What the publisher told its metrics.
#[derive(Default)]
struct Seen {
    writes: Mutex<BTreeMap<&'static str, usize>>,
    not_served: Mutex<BTreeMap<&'static str, bool>>,
}

impl PublishObserver for Seen {
    fn published(&self, _devices: usize, _generation: i64) {}
    fn failed(&self, _error: &PublishError) {}
    fn wrote(&self, op: SliceWrite) {
        *self.writes.lock().unwrap().entry(op.as_str()).or_default() += 1;
    }
    fn field_served(&self, field: GatedField, served: bool) {
        self.not_served.lock().unwrap().insert(field.name(), !served);
    }
}

impl Seen {
    fn writes(&self) -> usize {
        self.writes.lock().unwrap().values().sum()
    }

    fn not_served(&self) -> Vec<&'static str> {
        self.not_served.lock().unwrap().iter().filter(|(_, off)| **off).map(|(f, _)| *f).collect()
    }
}

/// The publisher and the slice writes it was told of.
struct Running {
    run: publisher::Running,
    seen: Arc<Seen>,
}

impl std::ops::Deref for Running {
    type Target = publisher::Running;

    fn deref(&self) -> &publisher::Running {
        &self.run
    }
}

/// A stand-in that is Kubernetes 1.`minor` with its default gates, and the
/// publisher with `inventory` and `configure`d.
async fn start(minor: u32, inventory: &str, configure: impl FnOnce(&mut PublisherConfig)) -> Running {
    let server = ApiServer::start().await.unwrap();
    server.use_release_defaults(minor);
    let seen = Arc::new(Seen::default());
    let status = Arc::new(PublishStatus::with_observer(seen.clone()));
    Running { run: publisher::start(server, inventory, configure, status).await, seen }
}

/// Waits until `condition` holds (a hang guard, not a timing assertion).
async fn eventually(what: &str, condition: impl FnMut() -> bool) {
    wait::eventually(what, Duration::from_secs(30), condition, String::new).await;
}

fn slices(server: &ApiServer) -> Vec<ResourceSlice> {
    server.list::<ResourceSlice>(None, SELECTOR).unwrap()
}

fn device_names(server: &ApiServer) -> Vec<String> {
    slices(server).iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone()).collect()
}

/// Slice writes the server accepted (create, update, delete).
fn slice_writes(server: &ApiServer) -> usize {
    server
        .faults()
        .requests()
        .iter()
        .filter(|r| {
            matches!(r.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
                && r.path.contains("/resourceslices")
                && (200..300).contains(&r.status)
        })
        .count()
}

/// The writes made while the publisher is left alone for [`IDLE_WINDOW`].
async fn writes_while_idle(run: &Running) -> usize {
    let before = slice_writes(&run.server);
    tokio::time::sleep(IDLE_WINDOW).await;
    slice_writes(&run.server) - before
}

#[tokio::test]
async fn a_faulty_gpu_on_a_server_without_taints_is_withheld_without_a_rewrite_loop() {
    let faulty = format!("{FOUR_GPUS}    faults:\n      - {{gpu: 2, xid: 79}}\n");
    let run = start(34, &faulty, |_| {}).await;
    eventually("the slices are published", || run.status.is_published()).await;
    eventually("the faulty GPU is withheld", || !device_names(&run.server).contains(&"gpu-2".to_string())).await;
    assert_eq!(device_names(&run.server), ["gpu-0", "gpu-1", "gpu-3"], "a claim for any H100 cannot get gpu-2");
    assert!(slices(&run.server).iter().all(|s| s.spec.devices.iter().flatten().all(|d| d.taints.is_none())));
    let learning = slice_writes(&run.server);
    assert!(learning <= 2, "the create that showed taints dropped, then the slice without gpu-2: {learning} writes");

    assert_eq!(writes_while_idle(&run).await, 0, "an idle node writes nothing");
    assert_eq!(run.seen.not_served(), ["taints"], "said once in the metric");
    assert_eq!(run.seen.writes(), slice_writes(&run.server), "every write is counted");

    // The GPU recovers: back in the slice with one write.
    std::fs::write(&run.inventory_file, FOUR_GPUS).unwrap();
    eventually("the GPU is back", || device_names(&run.server).contains(&"gpu-2".to_string())).await;
    assert_eq!(writes_while_idle(&run).await, 0);
    assert_eq!(slice_writes(&run.server), learning + 1, "one write for one real change");
    // And fails again: withheld again, one write, no loop.
    std::fs::write(&run.inventory_file, format!("{FOUR_GPUS}    faults:\n      - {{gpu: 1, lost: true}}\n")).unwrap();
    eventually("the lost GPU is withheld", || !device_names(&run.server).contains(&"gpu-1".to_string())).await;
    assert_eq!(writes_while_idle(&run).await, 0);
    assert_eq!(slice_writes(&run.server), learning + 2);
    assert_eq!(run.seen.writes(), slice_writes(&run.server));
}

#[tokio::test]
async fn with_the_gate_on_the_faulty_gpu_is_published_tainted() {
    let faulty = format!("{FOUR_GPUS}    faults:\n      - {{gpu: 2, xid: 79}}\n");
    let run = start(34, &faulty, |_| {}).await;
    run.server.set_feature_gate(gates::DEVICE_TAINTS, true);
    eventually("the slices are published", || run.status.is_published()).await;
    eventually("the taint is published", || {
        slices(&run.server).iter().flat_map(|s| s.spec.devices.iter().flatten()).any(|d| d.taints.is_some())
    })
    .await;
    assert_eq!(device_names(&run.server), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    assert_eq!(writes_while_idle(&run).await, 0);
    assert_eq!(slice_writes(&run.server), 1, "one create");
    assert!(run.seen.not_served().is_empty(), "{:?}", run.seen.not_served());
}

#[tokio::test]
async fn consumable_shares_on_a_server_dropping_multiple_allocations_publish_once_and_say_why() {
    let run = start(34, FOUR_GPUS, |config| {
        config.gates = FeatureGates::default().with(Gate::ConsumableShares, true);
        config.consumable_shares = SharesMode::Memory;
    })
    .await;
    eventually("the slices are published", || run.status.is_published()).await;
    eventually("the dropped fields are known", || run.seen.not_served().len() == 2).await;
    assert_eq!(run.seen.not_served(), ["allowMultipleAllocations", "requestPolicy"]);
    assert_eq!(device_names(&run.server), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], "whole GPUs, one claim each");
    assert_eq!(writes_while_idle(&run).await, 0);
    assert!(run.status.is_published(), "a dropped share is no failure to retry");
    assert_eq!(slice_writes(&run.server), 1, "the create; nothing to write again");
}

#[tokio::test]
async fn an_idle_node_on_a_current_server_writes_nothing() {
    let run = start(37, FOUR_GPUS, |_| {}).await;
    eventually("the slices are published", || run.status.is_published()).await;
    assert_eq!(writes_while_idle(&run).await, 0);
    assert_eq!(run.seen.writes(), 1);
    assert_eq!(*run.seen.writes.lock().unwrap(), BTreeMap::from([("create", 1)]));
}

/// The stand-in's gate switch itself, against the real server's rule: a
/// write with taints loses them while no stored copy uses them.
#[tokio::test]
async fn the_standin_drops_taints_as_the_real_server_does() {
    let server = ApiServer::start().await.unwrap();
    server.set_feature_gate(gates::DEVICE_TAINTS, false);
    let slice: ResourceSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": NODE, "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]}]}
    }))
    .unwrap();
    let stored = server.create(&slice).unwrap();
    assert_eq!(stored.spec.devices.as_ref().unwrap()[0].taints, None, "dropped on create");
    let taints = serde_json::json!({"spec": {"devices": [{"name": "gpu-0",
        "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]}]}});
    let updated: ResourceSlice = server.merge_patch(None, "s", false, &taints).unwrap();
    assert_eq!(updated.spec.devices.as_ref().unwrap()[0].taints, None, "dropped on update");
    server.set_feature_gate(gates::DEVICE_TAINTS, true);
    let served: ResourceSlice = server.merge_patch(None, "s", false, &taints).unwrap();
    assert!(served.spec.devices.as_ref().unwrap()[0].taints.is_some(), "kept with the gate on");
    server.set_feature_gate(gates::DEVICE_TAINTS, false);
    let value = serde_json::json!({"spec": {"devices": [{"name": "gpu-0",
        "taints": [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]}]}});
    let in_use: ResourceSlice = server.merge_patch(None, "s", false, &value).unwrap();
    let kept = in_use.spec.devices.as_ref().unwrap()[0].taints.as_ref().unwrap();
    assert_eq!(kept[0].value.as_deref(), Some("48"), "a stored slice that uses taints keeps them");
}
