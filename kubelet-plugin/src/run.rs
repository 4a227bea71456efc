//! `gpu-kubelet-plugin run`: wires the inventory, the ResourceSlice
//! publisher, the preparer, the gRPC servers and the HTTP port, then waits
//! for SIGTERM or SIGINT.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use gpu_dra_driver::inventory::Inventory;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::claim_status::queue::StatusQueue;
use crate::cli::{MetricsAddr, RunArgs};
use crate::kubelet_api::grpc::serve::{self, PluginServers, ServeConfig};
use crate::kubelet_api::sockets::SocketPaths;
use crate::mig::selection::DynamicMigSelection;
use crate::observe::metrics::Metrics;
use crate::observe::telemetry::TelemetryStore;
use crate::observe::telemetry::holders::ClaimPods;
use crate::observe::telemetry::idle::IdleTracker;
use crate::observe::telemetry::idle_events::IdleEvents;
use crate::observe::telemetry::sampler::NvmlReader;
use crate::observe::telemetry::series_cap::ClaimSeriesCap;
use crate::observe::telemetry::task::TelemetryTask;
use crate::prepare::claims::{ClaimSourceConfig, KubeClaimSource};
use crate::prepare::{Preparer, PreparerConfig};
use crate::publish::inventory_watch;
use crate::publish::publisher::{self, PublishStatus, PublisherConfig};
use crate::state::checkpoint;
use crate::state::durable;
use crate::state::instance_lock;
use gpu_dra_driver::service::http::{HttpState, ReadyCheck};
use gpu_dra_driver::service::kube_client;

/// Period of the health stream's re-sends when nothing changes.
const HEALTH_RESEND: Duration = Duration::from_secs(20);

/// Runs the node agent until SIGTERM or SIGINT. Needs a tokio runtime.
pub async fn run(args: &RunArgs) -> anyhow::Result<()> {
    args.check_paths().map_err(anyhow::Error::msg)?;
    args.check_drivers().map_err(anyhow::Error::msg)?;
    args.node.check_consumable_shares(args.feature_gates).map_err(anyhow::Error::msg)?;
    let node = &args.node.node_name;
    let driver = &args.node.driver_name;
    let telemetry = telemetry_store(args);
    let metrics = Arc::new(match &telemetry {
        Some(store) => Metrics::with_telemetry(store.clone()),
        None => Metrics::new(),
    });
    let mut signals = Signals::new()?;

    let state_dir = args.state_dir();
    durable::create_dir(&state_dir, 0o700).with_context(|| format!("creating --state-dir {}", state_dir.display()))?;
    // Held until the process ends: one instance publishes and prepares.
    let _instance = tokio::select! {
        lock = instance_lock::acquire(&state_dir) => {
            lock.with_context(|| format!("locking {}", state_dir.join(instance_lock::LOCK_FILE).display()))?
        }
        name = signals.next() => {
            tracing::info!(signal = name, "stopping before start-up finished");
            return Ok(());
        }
    };

    // Shared with prepare, which tells it the instances it made.
    let dynamic_mig = DynamicMigSelection::new(args.feature_gates, args.node.dynamic_mig_gpus.clone());
    let mig = if dynamic_mig.enabled() && args.gpus { mig_host(args) } else { None };
    seed_ours(args, &dynamic_mig, mig.as_ref())?;
    let (inventory, mode_refresh) = watch_inventory(args, &dynamic_mig)?;
    // Every MIG mode switch (prepare, unprepare, start-up) re-reads the GPU.
    let mig = mig.map(|host| crate::mig::lifecycle::MigHost { mode_observer: mode_refresh, ..host });
    tracing::info!(devices = inventory.borrow().published_devices().len(), "inventory loaded");

    let user_agent = concat!("gpu-kubelet-plugin/", env!("CARGO_PKG_VERSION"));
    let timeouts = kube_client::ApiTimeouts::with_read(Duration::from_millis(args.api_timeout_ms));
    let (client, source) = kube_client::client(args.kubeconfig.as_deref(), user_agent, timeouts)
        .await
        .context("connecting to the API server")?;
    tracing::info!(config = %source, "API client ready");
    // The GPU driver, unless ComputeDomains are served alone (--gpus=false).
    let publish_status = Arc::new(PublishStatus::with_observer(metrics.clone()));
    let publisher_task = args.gpus.then(|| {
        tokio::spawn(publisher::run(
            client.clone(),
            PublisherConfig {
                additional_ignored_xids: args.node.additional_xids_to_ignore.clone(),
                gates: args.feature_gates,
                consumable_shares: args.node.consumable_shares,
                watch_timeout_seconds: timeouts.watch_timeout_seconds(),
                ..PublisherConfig::new(node.clone(), driver.clone())
            },
            inventory.clone(),
            publish_status.clone(),
        ))
    });
    let service = match args.gpus {
        true => Some(Arc::new(
            open_preparer(args, client.clone(), inventory.clone(), mig, dynamic_mig.clone())?
                .with_metrics(metrics.clone())
                .with_status_queue(StatusQueue::new(
                    client.clone(),
                    driver.as_str(),
                    node.as_str(),
                    Some(metrics.clone()),
                )),
        )),
        false => None,
    };
    let mut compute_domains = match args.compute_domains {
        true => {
            let boot_id = checkpoint::boot_id(&args.host.proc_root).context("reading the boot id")?;
            let side = crate::compute_domain::serve::start(
                args,
                client.clone(),
                inventory.clone(),
                boot_id,
                metrics.clone(),
                HEALTH_RESEND,
            );
            Some(side.await?)
        }
        false => None,
    };
    let telemetry_task = telemetry
        .zip(service.as_ref())
        .and_then(|(store, service)| start_telemetry(args, store, &client, &inventory, service, &metrics));

    let mut servers = match service {
        Some(service) => {
            let config = ServeConfig {
                paths: SocketPaths::new(&args.plugins_dir, &args.registry_dir, driver),
                driver: driver.clone(),
                node: node.clone(),
                health_resend: HEALTH_RESEND,
            };
            Some(serve::start(&config, service, inventory.clone(), metrics.clone()).await?)
        }
        None => None,
    };

    // /readyz and the wait below follow the GPU driver's servers, or the
    // ComputeDomain driver's when it is served alone.
    let (watched, watched_status) = match (servers.as_mut(), compute_domains.as_mut()) {
        (Some(servers), _) => (servers, publish_status),
        (None, Some(side)) => (&mut side.servers, side.status.clone()),
        (None, None) => anyhow::bail!("no driver is served (--gpus=false needs --compute-domains)"),
    };
    let (http_stop, http_task) = start_http(args.metrics_addr, &*watched, &watched_status, &metrics).await?;

    let result = tokio::select! {
        name = signals.next() => {
            tracing::info!(signal = name, "stopping");
            Ok(())
        }
        error = watched.failed() => Err(anyhow::Error::new(error)),
    };
    if let Some(servers) = servers {
        servers.stop().await;
    }
    if let Some(side) = compute_domains {
        side.stop().await;
    }
    if let Some(task) = publisher_task {
        task.abort();
    }
    if let Some(task) = telemetry_task {
        task.abort();
    }
    let _ = http_stop.send(());
    if let Some(task) = http_task {
        let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
    }
    result
}

/// Where telemetry goes, when it is on: an interval, and NVML (a fake
/// inventory has no numbers to give).
fn telemetry_store(args: &RunArgs) -> Option<Arc<TelemetryStore>> {
    args.telemetry.interval()?;
    if !args.gpus {
        return None;
    }
    if args.node.fake_inventory.is_some() {
        tracing::info!("no device telemetry with --fake-inventory (NVML gives the numbers)");
        return None;
    }
    Some(Arc::new(TelemetryStore::new(
        args.telemetry.telemetry_names,
        args.node.node_name.to_string(),
        args.node.driver_name.to_string(),
    )))
}

/// Starts the sampling loop (and the idle-claim watch); `None` when NVML
/// does not initialize (logged: the plugin works without telemetry).
fn start_telemetry(
    args: &RunArgs,
    store: Arc<TelemetryStore>,
    client: &kube::Client,
    inventory: &watch::Receiver<Arc<Inventory>>,
    preparer: &Arc<Preparer<KubeClaimSource>>,
    metrics: &Metrics,
) -> Option<tokio::task::JoinHandle<()>> {
    let interval = args.telemetry.interval()?;
    let nvml = match crate::host::driver_files::nvml_source(&args.driver_root, &args.host).init_nvml() {
        Ok(nvml) => nvml,
        Err(error) => {
            tracing::warn!(%error, "NVML does not initialize for telemetry; no device telemetry");
            return None;
        }
    };
    let claims_of = preparer.clone();
    let idle = args.telemetry.idle_policy().map(|policy| {
        (
            IdleTracker::new(policy),
            IdleEvents::new(client.clone(), args.node.node_name.as_str(), policy.threshold_percent),
        )
    });
    let task = TelemetryTask {
        store,
        inventory: inventory.clone(),
        claims: Arc::new(move || claims_of.prepared()),
        pods: ClaimPods::new(client.clone()),
        reader: Box::new(NvmlReader::new(nvml)),
        idle,
        interval,
        cap: ClaimSeriesCap::new(args.telemetry.max_claim_series),
        dropped: metrics.claim_series_dropped(),
    };
    tracing::info!(interval_ms = args.telemetry.telemetry_interval_ms, "device telemetry on");
    Some(tokio::spawn(task.run()))
}

/// What re-reads a GPU after dynamic MIG switched its MIG mode (NVML
/// only: a fake inventory has no MIG mode to switch).
type ModeRefresh = Option<Arc<dyn crate::mig::lifecycle::MigModeObserver>>;

/// The inventory as a stream of snapshots: the fake file (re-read when it
/// changes), else NVML with critical XID events, and then also what
/// follows the MIG mode switches of dynamic MIG.
fn watch_inventory(
    args: &RunArgs,
    dynamic_mig: &Arc<DynamicMigSelection>,
) -> anyhow::Result<(watch::Receiver<Arc<Inventory>>, ModeRefresh)> {
    let node = args.node.node_name.clone();
    match &args.node.fake_inventory {
        Some(file) => {
            let interval = Duration::from_millis(args.fake_inventory_poll_ms);
            Ok((inventory_watch::watch_fake_file(file.clone(), node, interval, Arc::clone(dynamic_mig))?, None))
        }
        None => {
            let source = crate::host::driver_files::nvml_source(&args.driver_root, &args.host);
            let (inventory, refresh) = inventory_watch::watch_nvml(source, Arc::clone(dynamic_mig))
                .context("discovering GPUs through NVML (use --fake-inventory on nodes without GPUs)")?;
            Ok((inventory, Some(refresh as Arc<dyn crate::mig::lifecycle::MigModeObserver>)))
        }
    }
}

/// Opens the checkpoint and reconciles it with the CDI directory; claims
/// are served only after that.
fn open_preparer(
    args: &RunArgs,
    client: kube::Client,
    inventory: watch::Receiver<Arc<Inventory>>,
    mig: Option<crate::mig::lifecycle::MigHost>,
    dynamic_mig: Arc<DynamicMigSelection>,
) -> anyhow::Result<Preparer<KubeClaimSource>> {
    let boot_id = checkpoint::boot_id(&args.host.proc_root).with_context(|| {
        format!("reading the boot id under --proc-root {} (sys/kernel/random/boot_id)", args.host.proc_root.display())
    })?;
    let driver_edits = {
        let snapshot = Arc::clone(&inventory.borrow());
        crate::host::driver_files::SharedDriverEdits::new(crate::host::driver_files::driver_edits(
            &args.driver_root,
            &args.node,
            &snapshot,
        )?)
    };
    tokio::spawn(crate::host::driver_files::follow_driver_version(
        args.driver_root.clone(),
        args.node.clone(),
        inventory.clone(),
        driver_edits.clone(),
    ));
    let config = PreparerConfig {
        driver: args.node.driver_name.clone(),
        node: args.node.node_name.clone(),
        cdi_dir: args.cdi_dir.clone(),
        checkpoint_dir: args.state_dir().join("checkpoint"),
        boot_id,
        driver_edits,
        dev_root: match (&args.dev_root, &args.node.fake_inventory) {
            (Some(root), _) => Some(root.clone()),
            (None, Some(_)) => None,
            (None, None) => Some("/".into()),
        },
        gates: args.feature_gates,
        gpu_control: crate::host::driver_files::nvidia_smi(&args.driver_root, &args.node)
            .map(crate::prepare::sharing::NvidiaSmi::from_driver)
            .map(|smi| Arc::new(smi) as Arc<dyn crate::prepare::sharing::GpuControl>),
        mps_dir: args.state_dir().join("mps"),
        mps_host: {
            use gpu_dra_driver::feature_gates::Gate;
            let wanted =
                [Gate::MpsSupport, Gate::ConsumableCapacity].into_iter().any(|g| args.feature_gates.enabled(g));
            crate::host::driver_files::mps_control(&args.driver_root, &args.node, wanted)
                .and_then(crate::prepare::mps::host::LocalMps::from_driver)
                .map(|host| if args.mps_supervisor { host.supervised() } else { host })
                .map(|host| Arc::new(host) as Arc<dyn crate::prepare::mps::host::MpsHost>)
        },
        mps_timeouts: crate::prepare::mps::lifecycle::Timeouts {
            ready: Duration::from_millis(args.mps_ready_timeout_ms),
            ..Default::default()
        },
        mig,
        selection: Some(dynamic_mig),
        // Always on a real node, so that a claim passed through before a
        // restart with PassthroughSupport off is still given back.
        vfio: args.node.fake_inventory.is_none().then(|| crate::vfio::VfioHost {
            binding: Arc::new(crate::vfio::sysfs::Sysfs {
                sys_root: args.host.sys_root.clone(),
                dev_root: args.dev_root.clone().unwrap_or_else(|| "/".into()),
            }),
            holders: Arc::new(crate::vfio::holders::ProcHolders { proc_root: args.host.proc_root.clone() }),
            timing: Default::default(),
        }),
        nvidia_dir: Some(args.plugins_dir.join(args.node.driver_name.as_str())),
    };
    let source = KubeClaimSource::new(client, ClaimSourceConfig::default());
    let (preparer, report) = Preparer::open(config, source, inventory).context("opening the checkpoint")?;
    tracing::info!(
        kept = report.kept,
        rolled_back = report.rolled_back.len(),
        other_boot = report.other_boot.len(),
        damaged = report.damaged.len(),
        rewritten = report.rewritten.len(),
        orphan_specs = report.orphans.len(),
        "checkpoint reconciled"
    );
    crate::prepare::adopt::log(&report.adopted);
    Ok(preparer)
}

/// Tells the selection which MIG instances the plugin made (its ownership
/// ledger, never the checkpoint's records) before the first inventory is
/// read, so a GPU holding only those stays dynamic across a restart (and
/// start-up can settle it), and which it may have made but cannot prove.
fn seed_ours(
    args: &RunArgs,
    selection: &DynamicMigSelection,
    mig: Option<&crate::mig::lifecycle::MigHost>,
) -> anyhow::Result<()> {
    let Some(host) = mig.filter(|_| selection.enabled()) else { return Ok(()) };
    let boot_id = checkpoint::boot_id(&args.host.proc_root).with_context(|| {
        format!("reading the boot id under --proc-root {} (sys/kernel/random/boot_id)", args.host.proc_root.display())
    })?;
    // A missing directory is a first start; damaged files are dealt with
    // when the preparer opens it.
    let ledger = crate::mig::ledger::Ledger::new(host.ledger.path());
    ledger.peek();
    let all = ledger.all();
    selection.set_ours(crate::mig::ownership::owned_uuids(&all, &boot_id));
    selection.set_withheld(crate::mig::ownership::withheld(&all, &boot_id, &*host.control));
    Ok(())
}

/// NVML for dynamic MIG (one session for the process's life), unless the
/// inventory is fake.
#[cfg(target_os = "linux")]
fn mig_host(args: &RunArgs) -> Option<crate::mig::lifecycle::MigHost> {
    if args.node.fake_inventory.is_some() {
        return None;
    }
    let source = crate::host::driver_files::nvml_source(&args.driver_root, &args.host);
    match source.init_nvml() {
        Ok(nvml) => Some(crate::mig::lifecycle::MigHost {
            control: Arc::new(crate::mig::nvml::NvmlMigControl::new(nvml)),
            proc_root: args.host.proc_root.clone(),
            mode_observer: None,
            ledger: Arc::new(crate::mig::ledger::Ledger::new(args.state_dir().join("mig-ledger"))),
        }),
        Err(error) => {
            tracing::warn!(%error, "NVML cannot be opened for dynamic MIG; claims for dynamic MIG devices will fail");
            None
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn mig_host(_args: &RunArgs) -> Option<crate::mig::lifecycle::MigHost> {
    None
}

type HttpTask = Option<tokio::task::JoinHandle<()>>;

/// Binds the HTTP port (unless `off`) and serves it in a task.
async fn start_http(
    addr: MetricsAddr,
    servers: &PluginServers,
    publish_status: &Arc<PublishStatus>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<(tokio::sync::oneshot::Sender<()>, HttpTask)> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let MetricsAddr::Listen(addr) = addr else {
        return Ok((stop_tx, None));
    };
    let registration = servers.registration_state();
    let serving = servers.serving_flag();
    let published = publish_status.clone();
    let state = Arc::new(HttpState {
        metrics: metrics.clone(),
        ready: vec![
            ReadyCheck::new("registered", move || registration.is_registered()),
            ReadyCheck::new("slices-published", move || published.is_published()),
            ReadyCheck::new("grpc-serving", move || serving.load(Ordering::Acquire)),
        ],
    });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --metrics-addr {addr} (use another port or `off`)"))?;
    let bound = listener.local_addr().with_context(|| format!("reading the address bound for {addr}"))?;
    tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = stop_rx.await;
        };
        if let Err(error) = gpu_dra_driver::service::http::serve(listener, state, shutdown).await {
            tracing::error!(%error, "HTTP server failed");
        }
    });
    Ok((stop_tx, Some(task)))
}

/// SIGTERM (the kubelet or the container runtime stopping the pod) and
/// SIGINT (a terminal).
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
