//! Starts the `compute-domain.nvidia.com` side of `run --compute-domains`:
//! its slice publisher, the ComputeDomain watch, the preparer with its
//! health loop, and its own gRPC servers and registration socket.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use gpu_dra_driver::compute_domain::DRIVER_NAME;
use gpu_dra_driver::compute_domain::api::ComputeDomain;
use gpu_dra_driver::inventory::Inventory;
use gpu_dra_driver::names::DriverName;
use gpu_dra_driver::service::decoded_watch::{self, Decoder, Rejections};
use kube::api::DynamicObject;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::DomainConfig;
use super::daemons::{Daemons, ImexPrograms};
use super::preparer::DomainPreparer;
use super::status::{KubeConditions, StoreDomains};
use crate::cli::RunArgs;
use crate::kubelet_api::grpc::serve::{self, PluginServers, ServeConfig};
use crate::kubelet_api::sockets::SocketPaths;
use crate::observe::metrics::Metrics;
use crate::prepare::claims::{ClaimSourceConfig, KubeClaimSource};
use crate::publish::publisher::{self, PublishStatus, PublisherConfig, SliceKind};

/// The running side; stop it with [`Running::stop`].
pub struct Running {
    pub servers: PluginServers,
    /// Whether its slices are published (for `/readyz` when it is served
    /// alone).
    pub status: Arc<PublishStatus>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    pub async fn stop(self) {
        self.servers.stop().await;
        for task in self.tasks {
            task.abort();
        }
    }
}

pub async fn start(
    args: &RunArgs,
    client: kube::Client,
    inventory: watch::Receiver<Arc<Inventory>>,
    boot_id: String,
    metrics: Arc<Metrics>,
    health_resend: Duration,
) -> anyhow::Result<Running> {
    let driver = DriverName::new(DRIVER_NAME).context("the compute-domain driver name")?;
    let node = args.node.node_name.clone();
    let mut tasks = Vec::new();
    let status = Arc::new(PublishStatus::with_observer(metrics.clone()));
    let publisher =
        PublisherConfig { kind: SliceKind::ComputeDomains, ..PublisherConfig::new(node.clone(), driver.clone()) };
    tasks.push(tokio::spawn(publisher::run(client.clone(), publisher, inventory.clone(), status.clone())));

    // Each domain decoded on its own: one the code cannot hold is logged,
    // counted and left out; the controller explains it with an Event.
    let (store, writer) = reflector::store::<ComputeDomain>();
    let api: kube::Api<DynamicObject> =
        kube::Api::all_with(client.clone(), &decoded_watch::api_resource::<ComputeDomain>());
    let counter = metrics.clone();
    let mut decoder = Decoder::<ComputeDomain>::new(
        Rejections::default(),
        Box::new(move |_| counter.invalid_object(gpu_dra_driver::compute_domain::api::KIND)),
    );
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |item| std::future::ready(item.map(|e| decoder.decode(e)).transpose()))
        .reflect(writer);
    tasks.push(tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Err(error) = item {
                tracing::warn!(%error, "ComputeDomain watch failed (is the CRD installed?); retrying");
            }
        }
    }));

    let state_dir = args.state_dir().join("compute-domains");
    let driver_root = match (&args.driver_root.driver_root, &args.node.fake_inventory) {
        (Some(root), _) => Some(root.clone()),
        (None, None) => Some("/".into()),
        (None, Some(_)) => None,
    };
    let programs = driver_root.as_deref().and_then(ImexPrograms::find);
    if programs.is_none() {
        tracing::warn!("no nvidia-imex in the driver root: ComputeDomain claims fail until it is installed");
    }
    let config = DomainConfig {
        driver: driver.clone(),
        node: node.clone(),
        cdi_dir: args.cdi_dir.clone(),
        state_dir: state_dir.clone(),
        boot_id,
        dev_root: match (&args.dev_root, &args.node.fake_inventory) {
            (Some(root), _) => Some(root.clone()),
            (None, Some(_)) => None,
            (None, None) => Some("/".into()),
        },
        proc_root: args.host.proc_root.clone(),
        ready_timeout: Duration::from_millis(args.imex_ready_timeout_ms),
    };
    let preparer = Arc::new(
        DomainPreparer::open(
            config,
            Daemons::new(state_dir.join("domains"), programs),
            KubeClaimSource::new(client.clone(), ClaimSourceConfig::default()),
            StoreDomains::new(store, client.clone()),
            KubeConditions { client: client.clone(), node: node.to_string() },
        )
        .map_err(anyhow::Error::msg)
        .context("opening the compute-domain checkpoint")?,
    );
    preparer.count_damage_in(metrics.clone());
    let interval = Duration::from_millis(args.imex_health_interval_ms);
    tasks.push(tokio::spawn(super::health::run(preparer.clone(), interval)));

    // The health stream of this driver has no GPU to report on.
    let snapshot = Arc::clone(&inventory.borrow());
    let no_gpus = Inventory { gpus: Vec::new(), ..(*snapshot).clone() };
    let (_keep, devices) = watch::channel(Arc::new(no_gpus));
    let serve_config = ServeConfig {
        paths: SocketPaths::new(&args.plugins_dir, &args.registry_dir, &driver),
        driver,
        node,
        health_resend,
    };
    let servers = serve::start(&serve_config, preparer, devices, metrics).await?;
    tasks.push(tokio::spawn(async move {
        let _keep = _keep;
        std::future::pending::<()>().await
    }));
    Ok(Running { servers, status, tasks })
}
