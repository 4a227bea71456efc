//! Starting and stopping the two gRPC servers on their unix sockets.
//!
//! Order as the Go helper (`kubeletplugin/draplugin.go`): the DRA socket
//! serves before the registration socket exists, because "the kubelet might
//! try to use the service immediately" after `GetInfo` (plugin watcher
//! README). On stop the registration socket goes first (that deregisters
//! the plugin), then the DRA server drains its calls and its socket goes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpu_dra_driver::inventory::Inventory;
use gpu_dra_driver::names::{DriverName, NodeName};
use kubelet_proto::dra_v1::dra_plugin_server::DraPluginServer as V1Server;
use kubelet_proto::dra_v1beta1::dra_plugin_server::DraPluginServer as V1beta1Server;
use kubelet_proto::health_v1::dra_resource_health_server::DraResourceHealthServer as HealthV1Server;
use kubelet_proto::health_v1alpha1::dra_resource_health_server::DraResourceHealthServer as HealthV1alpha1Server;
use kubelet_proto::registration::registration_server::RegistrationServer;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::service::{DraCore, DraService, InFlight};
use super::versions::{DraPluginV1, DraPluginV1beta1};
use crate::kubelet_api::health_service::HealthService;
use crate::kubelet_api::registration::{RegistrationService, RegistrationState};
use crate::kubelet_api::sockets::{self, SocketError, SocketPaths};
use crate::observe::metrics::Metrics;

/// How long in-flight kubelet calls may run after a stop was asked for.
/// Less than the kubelet's 45 s deadline and the usual 30 s grace period.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// How often stopping checks for the end of in-flight calls.
const STOP_POLL: Duration = Duration::from_millis(10);

/// Time for the answers of calls that just ended to be written out.
const FLUSH_GRACE: Duration = Duration::from_millis(100);

/// What the servers need to know.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub paths: SocketPaths,
    pub driver: DriverName,
    pub node: NodeName,
    /// Period of the health stream's unchanged re-sends.
    pub health_resend: Duration,
}

/// Why a server could not start or stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("the {server} gRPC server failed: {error}")]
    Server { server: &'static str, error: tonic::transport::Error },
    #[error("the {server} gRPC server stopped unexpectedly")]
    Stopped { server: &'static str },
}

struct Server {
    name: &'static str,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Server {
    fn spawn<F>(name: &'static str, serve: impl FnOnce(oneshot::Receiver<()>) -> F) -> Self
    where
        F: std::future::Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        Self { name, shutdown: Some(tx), task: tokio::spawn(serve(rx)) }
    }

    /// Asks the server to stop, waits until `in_flight` is idle (at most
    /// `drain`), then ends it. Waiting for the server itself is not enough:
    /// hyper's graceful shutdown also waits for idle client connections,
    /// which the kubelet never closes.
    async fn stop(mut self, drain: Duration, in_flight: &InFlight) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let deadline = tokio::time::Instant::now() + drain;
        loop {
            if self.task.is_finished() {
                match (&mut self.task).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::warn!(server = self.name, %error, "gRPC server ended with an error"),
                    Err(join) => tracing::warn!(server = self.name, error = %join, "gRPC server task failed"),
                }
                return;
            }
            if in_flight.is_idle() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(server = self.name, ?drain, "calls still running after the drain timeout; aborting");
                break;
            }
            tokio::time::sleep(STOP_POLL).await;
        }
        // Let the last answers reach the socket before cutting connections.
        let _ = tokio::time::timeout(FLUSH_GRACE, &mut self.task).await;
        self.task.abort();
    }
}

/// The running servers. Dropping it removes the sockets too (stop is the
/// orderly way).
pub struct PluginServers {
    paths: SocketPaths,
    registration_state: Arc<RegistrationState>,
    serving: Arc<AtomicBool>,
    /// Tells long-lived streams to end when stopping.
    stopping: watch::Sender<bool>,
    in_flight: InFlight,
    dra: Option<Server>,
    registration: Option<Server>,
}

/// Binds both sockets and serves: DRAPlugin v1, v1beta1 and
/// DRAResourceHealth v1 and v1alpha1 on dra.sock, then Registration on the registry socket.
pub async fn start<S: DraService>(
    config: &ServeConfig,
    service: Arc<S>,
    inventory: watch::Receiver<Arc<Inventory>>,
    metrics: Arc<Metrics>,
) -> Result<PluginServers, ServeError> {
    let paths = config.paths.clone();
    sockets::ensure_dir(&paths.plugin_dir, true)?;
    let registry_dir =
        paths.registration.parent().ok_or_else(|| SocketError::NoParent { path: paths.registration.clone() })?;
    sockets::ensure_dir(registry_dir, false)?;

    let mut servers = PluginServers {
        paths: paths.clone(),
        registration_state: Arc::new(RegistrationState::default()),
        serving: Arc::new(AtomicBool::new(false)),
        stopping: watch::Sender::new(false),
        in_flight: InFlight::default(),
        dra: None,
        registration: None,
    };

    let dra_listener = sockets::bind(&paths.dra)?;
    let core = DraCore::new(service, metrics.clone(), servers.in_flight.clone());
    let health =
        Arc::new(HealthService::new(inventory, &config.node, config.health_resend, servers.stopping.subscribe()));
    let router = tonic::transport::Server::builder()
        .add_service(V1Server::new(DraPluginV1(core.clone())))
        .add_service(V1beta1Server::new(DraPluginV1beta1(core)))
        .add_service(HealthV1Server::from_arc(health.clone()))
        .add_service(HealthV1alpha1Server::from_arc(health));
    servers.dra = Some(Server::spawn("DRA", move |stop| {
        router.serve_with_incoming_shutdown(super::any_client::incoming(dra_listener), async {
            let _ = stop.await;
        })
    }));
    tracing::info!(socket = %paths.dra.display(), "serving DRAPlugin v1, v1beta1 and DRAResourceHealth v1, v1alpha1");

    let reg_listener = sockets::bind(&paths.registration)?;
    let registration =
        RegistrationService::new(&config.driver, &paths.dra, servers.registration_state.clone(), metrics);
    let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(registration));
    servers.registration = Some(Server::spawn("registration", move |stop| {
        router.serve_with_incoming_shutdown(super::any_client::incoming(reg_listener), async {
            let _ = stop.await;
        })
    }));
    tracing::info!(socket = %paths.registration.display(), "waiting for the kubelet to register the plugin");
    servers.serving.store(true, Ordering::Release);
    Ok(servers)
}

impl PluginServers {
    /// What the kubelet said about the registration (for `/readyz`).
    pub fn registration_state(&self) -> Arc<RegistrationState> {
        self.registration_state.clone()
    }

    /// True while both servers run (for `/readyz`).
    pub fn serving_flag(&self) -> Arc<AtomicBool> {
        self.serving.clone()
    }

    pub fn paths(&self) -> &SocketPaths {
        &self.paths
    }

    /// Resolves when a server stops without being asked to.
    pub async fn failed(&mut self) -> ServeError {
        let result = match (self.dra.as_mut(), self.registration.as_mut()) {
            (Some(dra), Some(reg)) => tokio::select! {
                r = &mut dra.task => ("DRA", r),
                r = &mut reg.task => ("registration", r),
            },
            (Some(dra), None) => ("DRA", (&mut dra.task).await),
            (None, Some(reg)) => ("registration", (&mut reg.task).await),
            (None, None) => return ServeError::Stopped { server: "every" },
        };
        self.serving.store(false, Ordering::Release);
        match result {
            (server, Ok(Err(error))) => ServeError::Server { server, error },
            (server, _) => ServeError::Stopped { server },
        }
    }

    /// Deregisters (removes the registration socket), stops the
    /// registration server, drains the DRA server and removes its socket.
    pub async fn stop(mut self) {
        self.serving.store(false, Ordering::Release);
        remove(&self.paths.registration);
        if let Some(server) = self.registration.take() {
            // Registration calls are quick and idempotent; nothing to drain.
            server.stop(Duration::ZERO, &InFlight::default()).await;
        }
        self.stopping.send_replace(true);
        if let Some(server) = self.dra.take() {
            server.stop(DRAIN_TIMEOUT, &self.in_flight).await;
        }
        remove(&self.paths.dra);
        tracing::info!("sockets removed");
    }
}

impl Drop for PluginServers {
    fn drop(&mut self) {
        if self.registration.is_some() || self.dra.is_some() {
            remove(&self.paths.registration);
            remove(&self.paths.dra);
        }
        for server in [self.registration.take(), self.dra.take()].into_iter().flatten() {
            server.task.abort();
        }
    }
}

fn remove(path: &std::path::Path) {
    if let Err(error) = sockets::remove_socket(path) {
        tracing::warn!(%error, "cannot remove socket");
    }
}
