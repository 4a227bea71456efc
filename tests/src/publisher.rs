//! The plugin's ResourceSlice publisher run inside a test's runtime against
//! the API server stand-in, on a fake inventory file the test rewrites: the
//! set-up `publish_slices` and `publish_gates` share.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_kubelet_plugin::mig::selection::DynamicMigSelection;
use gpu_kubelet_plugin::publish::inventory_watch::watch_fake_file;
use gpu_kubelet_plugin::publish::publisher::{self, PublishStatus, PublisherConfig};

use crate::apiserver::ApiServer;

/// The node the publisher publishes for.
pub const NODE: &str = "node-a";
/// The field selector of [`NODE`]'s slices of our driver.
pub const SELECTOR: &str = "spec.nodeName=node-a,spec.driver=gpu.nvidia.com";
/// An inventory of four H100s, to which a test appends faults.
pub const FOUR_GPUS: &str = "gpus:\n  - model: H100-80GB\n    count: 4\n";

/// Spawns the publisher of [`NODE`] on `inventory_file` against `server`
/// (its kubeconfig written in `dir`), with backoffs short enough for a
/// test; `configure` changes the rest. It reports to `status`.
pub async fn spawn(
    server: &ApiServer,
    dir: &Path,
    inventory_file: &Path,
    configure: impl FnOnce(&mut PublisherConfig),
    status: Arc<PublishStatus>,
) -> tokio::task::JoinHandle<()> {
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("writing the kubeconfig");
    let client = gpu_dra_driver::service::kube_client::client_from_file(&kubeconfig).await.expect("a kube client");
    let node = NodeName::new(NODE).expect("a node name");
    let inventory = watch_fake_file(
        inventory_file.to_path_buf(),
        node.clone(),
        Duration::from_millis(100),
        DynamicMigSelection::disabled(),
    )
    .expect("watching the inventory file");
    let mut config = PublisherConfig::new(node, DriverName::nvidia_default());
    config.min_backoff = Duration::from_millis(20);
    config.max_backoff = Duration::from_millis(200);
    configure(&mut config);
    tokio::spawn(publisher::run(client, config, inventory, status))
}

/// A publisher [`start`]ed for a test, stopped when dropped.
pub struct Running {
    pub server: ApiServer,
    pub status: Arc<PublishStatus>,
    /// The inventory the publisher watches; a test rewrites it.
    pub inventory_file: PathBuf,
    pub task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes `inventory` to a file of a new directory and [`spawn`]s the
/// publisher on it against `server`.
pub async fn start(
    server: ApiServer,
    inventory: &str,
    configure: impl FnOnce(&mut PublisherConfig),
    status: Arc<PublishStatus>,
) -> Running {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let inventory_file = dir.path().join("inventory.yaml");
    std::fs::write(&inventory_file, inventory).expect("writing the inventory");
    let task = spawn(&server, dir.path(), &inventory_file, configure, status.clone()).await;
    Running { server, status, inventory_file, task, _dir: dir }
}
