//! The plugin's ResourceSlice publisher against the API server stand-in.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpu_kubelet_plugin::publish::publisher::PublishStatus;
use integration_tests::apiserver::{ApiServer, Matcher};
use integration_tests::publisher::{self, FOUR_GPUS, NODE, Running, SELECTOR};
use integration_tests::wait;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;

/// Starts the stand-in, lets `prepare` inject faults, then starts the publisher.
async fn start(prepare: impl FnOnce(&ApiServer)) -> Running {
    start_with(FOUR_GPUS, prepare).await
}

async fn start_with(inventory_text: &str, prepare: impl FnOnce(&ApiServer)) -> Running {
    let server = ApiServer::start().await.unwrap();
    prepare(&server);
    publisher::start(server, inventory_text, |_| {}, Arc::new(PublishStatus::new())).await
}

async fn spawn_publisher(
    server: &ApiServer,
    dir: &Path,
    inventory_file: &Path,
) -> (Arc<PublishStatus>, tokio::task::JoinHandle<()>) {
    let status = Arc::new(PublishStatus::new());
    let task = publisher::spawn(server, dir, inventory_file, |_| {}, status.clone()).await;
    (status, task)
}

/// Waits until `condition` holds (a hang guard, not a timing assertion).
async fn eventually(what: &str, condition: impl FnMut() -> bool) {
    wait::eventually(what, Duration::from_secs(30), condition, String::new).await;
}

fn slices(server: &ApiServer) -> Vec<ResourceSlice> {
    server.list::<ResourceSlice>(None, SELECTOR).unwrap()
}

fn device_count(slices: &[ResourceSlice]) -> usize {
    slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum()
}

fn generation(slices: &[ResourceSlice]) -> Option<i64> {
    slices.first().map(|s| s.spec.pool.generation)
}

/// The taints of device `name` in `slices` (none when it is not there).
fn device_taints(slices: &[ResourceSlice], name: &str) -> Vec<k8s_openapi::api::resource::v1::DeviceTaint> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == name)
        .and_then(|d| d.taints.clone())
        .unwrap_or_default()
}

fn write_inventory(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn publishes_the_nodes_slices() {
    let run = start(|server| {
        let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": NODE}})).unwrap();
        server.create(&node).unwrap();
    })
    .await;
    eventually("the slices are published", || run.status.is_published()).await;
    let published = slices(&run.server);
    assert_eq!(published.len(), 1);
    let slice = &published[0];
    assert_eq!(slice.spec.node_name.as_deref(), Some(NODE));
    assert_eq!(slice.spec.driver, "gpu.nvidia.com");
    assert_eq!((slice.spec.pool.name.as_str(), slice.spec.pool.generation), (NODE, 1));
    assert_eq!(device_count(&published), 4);
    assert_eq!(run.status.published_devices(), 4);
    // Owned by the Node, for garbage collection with it.
    let node: Node = run.server.get(None, NODE).unwrap();
    let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), Some(&owner.uid)),
        ("Node", NODE, node.metadata.uid.as_ref())
    );
    // Found by the kubelet's own selector too.
    assert_eq!(run.server.list::<ResourceSlice>(None, "spec.nodeName=node-a").unwrap().len(), 1);
}

#[tokio::test]
async fn slices_wiped_by_the_kubelet_are_recreated() {
    let run = start(|_| {}).await;
    eventually("the slices are published", || !slices(&run.server).is_empty()).await;
    let before = slices(&run.server);
    // The kubelet at its start: DeleteCollection spec.nodeName=<node>.
    assert_eq!(run.server.delete_collection::<ResourceSlice>(None, "spec.nodeName=node-a").unwrap(), 1);
    eventually("the slices are back", || !slices(&run.server).is_empty()).await;
    let after = slices(&run.server);
    assert_eq!(device_count(&after), 4);
    assert_ne!(after[0].metadata.uid, before[0].metadata.uid, "re-created, not left over");
    // Same inventory, same pool content: the generation stays.
    assert_eq!(generation(&after), generation(&before));
}

#[tokio::test]
async fn a_fault_in_the_fake_file_bumps_the_generation_and_taints() {
    let run = start(|_| {}).await;
    eventually("the slices are published", || !slices(&run.server).is_empty()).await;
    let first = generation(&slices(&run.server)).unwrap();
    write_inventory(
        &run.inventory_file,
        &format!("{FOUR_GPUS}    faults:\n      - {{gpu: 2, xid: 79}}\n      - {{gpu: 3, lost: true}}\n"),
    );
    eventually("the generation is bumped", || generation(&slices(&run.server)) > Some(first)).await;
    let published = slices(&run.server);
    let taints = |name: &str| {
        device_taints(&published, name)
            .into_iter()
            .map(|t| (t.key, t.value.unwrap_or_default(), t.effect))
            .collect::<Vec<_>>()
    };
    assert_eq!(taints("gpu-2"), [("gpu.nvidia.com/xid".to_string(), "79".to_string(), "NoSchedule".to_string())]);
    assert!(
        taints("gpu-3").iter().any(|(k, _, e)| k == "gpu.nvidia.com/gpu-lost" && e == "NoExecute"),
        "{:?}",
        taints("gpu-3")
    );
    assert!(taints("gpu-0").is_empty());
    assert_eq!(run.status.generation(), first + 1);
}

/// An application XID (43: a user's kernel stopped) leaves the GPU
/// allocatable: on this 1.37 server it is published with effect None; XID
/// 79 (fallen off the bus) blocks it; a cleared fault takes its taint away.
#[tokio::test]
async fn application_xids_do_not_block_and_cleared_faults_untaint() {
    let run = start(|_| {}).await;
    eventually("the slices are published", || !slices(&run.server).is_empty()).await;
    let taints = |name: &str| {
        device_taints(&slices(&run.server), name)
            .into_iter()
            .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
            .collect::<Vec<_>>()
    };
    write_inventory(
        &run.inventory_file,
        &format!("{FOUR_GPUS}    faults:\n      - {{gpu: 1, xid: 43}}\n      - {{gpu: 2, xid: 79}}\n"),
    );
    eventually("the faults are published", || !taints("gpu-2").is_empty()).await;
    assert_eq!(taints("gpu-1"), ["gpu.nvidia.com/xid=43:None"]);
    assert_eq!(taints("gpu-2"), ["gpu.nvidia.com/xid=79:NoSchedule"]);
    write_inventory(&run.inventory_file, FOUR_GPUS);
    eventually("the cleared faults are untainted", || taints("gpu-1").is_empty() && taints("gpu-2").is_empty()).await;
}

#[tokio::test]
async fn server_errors_and_conflicts_are_retried() {
    let run = start(|server| {
        server.faults().fail_next(Matcher::new("GET", "/resourceslices").watches(false), 2, 500);
        server.faults().fail_next(Matcher::new("POST", "/resourceslices"), 2, 503);
    })
    .await;
    eventually("the slices are published", || run.status.is_published()).await;
    let faults = run.server.faults();
    assert_eq!(faults.count(&Matcher::new("GET", "/resourceslices").watches(false), 500), 2);
    assert_eq!(faults.count(&Matcher::new("POST", "/resourceslices"), 503), 2);
    assert_eq!(device_count(&slices(&run.server)), 4);

    // The next update meets two conflicts, re-reads and still lands.
    faults.fail_next(Matcher::new("PUT", "/resourceslices/"), 2, 409);
    write_inventory(&run.inventory_file, &format!("{FOUR_GPUS}    faults:\n      - {{gpu: 0, xid: 48}}\n"));
    eventually("the tainted slice is published", || {
        slices(&run.server).iter().flat_map(|s| s.spec.devices.iter().flatten()).any(|d| d.taints.is_some())
    })
    .await;
    assert_eq!(faults.count(&Matcher::new("PUT", "/resourceslices/"), 409), 2);
    assert!(faults.count(&Matcher::new("GET", "/resourceslices/node-a"), 200) >= 2, "re-read after each 409");
}

#[tokio::test]
async fn a_dropped_watch_recovers() {
    let run = start(|_| {}).await;
    eventually("the slices are published", || !slices(&run.server).is_empty()).await;
    let watches = || run.server.faults().count(&Matcher::new("GET", "/resourceslices").watches(true), 200);
    eventually("the publisher watches", || watches() >= 1).await;
    let before = watches();
    run.server.faults().drop_watches();
    eventually("the publisher watches again", || watches() > before).await;
    run.server.delete_collection::<ResourceSlice>(None, SELECTOR).unwrap();
    eventually("the slices are back", || !slices(&run.server).is_empty()).await;
}

#[tokio::test]
async fn a_restart_with_the_same_inventory_keeps_the_generation_and_the_objects() {
    let run = start(|_| {}).await;
    eventually("the slices are published", || run.status.is_published()).await;
    let before = slices(&run.server);
    run.task.abort();
    let dir = tempfile::tempdir().unwrap();
    let (status, task) = spawn_publisher(&run.server, dir.path(), &run.inventory_file).await;
    eventually("the second publisher is ready", || status.is_published()).await;
    task.abort();
    let after = slices(&run.server);
    assert_eq!(status.generation(), 1);
    assert_eq!(after[0].metadata.resource_version, before[0].metadata.resource_version, "nothing rewritten");
}

#[tokio::test]
async fn a_smaller_inventory_deletes_the_extra_slices() {
    // 130 devices need two slices (at most 128 per slice).
    let run = start_with("gpus:\n  - model: H100-80GB\n    count: 130\n", |_| {}).await;
    eventually("two slices are published", || slices(&run.server).len() == 2).await;
    assert!(slices(&run.server).iter().all(|s| s.spec.pool.resource_slice_count == 2));
    write_inventory(&run.inventory_file, FOUR_GPUS);
    eventually("one slice is left", || slices(&run.server).len() == 1).await;
    let left = slices(&run.server);
    assert_eq!((device_count(&left), left[0].spec.pool.resource_slice_count, generation(&left)), (4, 1, Some(2)));
}

#[tokio::test]
async fn a_watch_that_expired_relists_and_recovers() {
    let run = start(|_| {}).await;
    eventually("the slices are published", || !slices(&run.server).is_empty()).await;
    let relists = || run.server.faults().count(&Matcher::new("GET", "/resourceslices").watches(false), 200);
    let before = relists();
    // While the watch is down, the pool changes (the kubelet wipes it) and
    // history is compacted past the watcher's resourceVersion: its next
    // watch gets 410 Expired and it must list again to see the deletion.
    run.server.faults().delay(Matcher::any().watches(true), Duration::from_millis(500));
    run.server.faults().drop_watches();
    run.server.delete_collection::<ResourceSlice>(None, SELECTOR).unwrap();
    run.server.store().compact();
    eventually("the publisher re-lists", || relists() > before).await;
    eventually("the slices are back", || !slices(&run.server).is_empty()).await;
}
