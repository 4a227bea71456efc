//! The plugin's ResourceSlice publisher against the API server stand-in.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_kubelet_plugin::inventory_watch::watch_fake_file;
use gpu_kubelet_plugin::publisher::{self, PublishStatus, PublisherConfig};
use integration_tests::apiserver::{ApiServer, Matcher};
use k8s_openapi::api::resource::v1::ResourceSlice;

const NODE: &str = "node-a";
const SELECTOR: &str = "spec.nodeName=node-a,spec.driver=gpu.nvidia.com";
const FOUR_GPUS: &str = "gpus:\n  - model: H100-80GB\n    count: 4\n";

struct Running {
    server: ApiServer,
    status: Arc<PublishStatus>,
    inventory_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the stand-in, lets `prepare` inject faults, then starts the publisher.
async fn start(prepare: impl FnOnce(&ApiServer)) -> Running {
    let server = ApiServer::start().await.unwrap();
    prepare(&server);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let inventory_file = dir.path().join("inventory.yaml");
    std::fs::write(&inventory_file, FOUR_GPUS).unwrap();
    let client = gpu_kubelet_plugin::kube_client::client_from_file(&kubeconfig).await.unwrap();
    let node = NodeName::new(NODE).unwrap();
    let inventory = watch_fake_file(inventory_file.clone(), node.clone(), Duration::from_millis(100)).unwrap();
    let mut config = PublisherConfig::new(node, DriverName::nvidia_default());
    config.min_backoff = Duration::from_millis(20);
    config.max_backoff = Duration::from_millis(200);
    let status = Arc::new(PublishStatus::new());
    let task = tokio::spawn(publisher::run(client, config, inventory, status.clone()));
    Running { server, status, inventory_file, _dir: dir, task }
}

/// Waits until `condition` holds (a hang guard, not a timing assertion).
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..600 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
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

fn write_inventory(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn publishes_the_nodes_slices() {
    let run = start(|_| {}).await;
    eventually("the slices are published", || run.status.is_published()).await;
    let published = slices(&run.server);
    assert_eq!(published.len(), 1);
    let slice = &published[0];
    assert_eq!(slice.spec.node_name.as_deref(), Some(NODE));
    assert_eq!(slice.spec.driver, "gpu.nvidia.com");
    assert_eq!((slice.spec.pool.name.as_str(), slice.spec.pool.generation), (NODE, 1));
    assert_eq!(device_count(&published), 4);
    assert_eq!(run.status.published_devices(), 4);
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
        published
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == name)
            .and_then(|d| d.taints.clone())
            .unwrap_or_default()
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
