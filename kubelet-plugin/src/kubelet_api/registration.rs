//! The kubelet's plugin registration service, served on the registration
//! socket.
//!
//! The kubelet's plugin watcher sees the socket, calls `GetInfo`, validates
//! the type and versions, registers the endpoint and then calls
//! `NotifyRegistrationStatus` (kubelet `pluginwatcher/README.md`). The answer
//! follows the Go helper (`kubeletplugin/registrationserver.go`).

use std::path::Path;
use std::sync::{Arc, Mutex};

use gpu_dra_driver::names::DriverName;
use kubelet_proto::registration::registration_server::Registration;
use kubelet_proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use kubelet_proto::{DRA_PLUGIN_TYPE, versions};
use tonic::{Request, Response, Status};

use crate::observe::metrics::{ErrorKind, Metrics};

/// The services the plugin serves on dra.sock, in the order the kubelet
/// reads them: it uses the first DRAPlugin version it knows, so v1 comes
/// first (dra-facts §1.3, `dra_plugin_manager.go`). Both health versions:
/// the kubelet of 1.37 picks v1 (`pickHealthService`), older ones always
/// dial v1alpha1 and skip names they do not know.
pub const SUPPORTED_VERSIONS: [&str; 4] =
    [versions::DRA_V1, versions::DRA_V1BETA1, versions::HEALTH_V1, versions::HEALTH_V1ALPHA1];

/// What the kubelet last told us about our registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationOutcome {
    /// The kubelet has not called `NotifyRegistrationStatus` yet.
    Pending,
    Registered,
    Failed(String),
}

/// Registration state shared with `/readyz`.
#[derive(Debug)]
pub struct RegistrationState {
    outcome: Mutex<RegistrationOutcome>,
}

impl Default for RegistrationState {
    fn default() -> Self {
        Self { outcome: Mutex::new(RegistrationOutcome::Pending) }
    }
}

impl RegistrationState {
    pub fn outcome(&self) -> RegistrationOutcome {
        match self.outcome.lock() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn is_registered(&self) -> bool {
        self.outcome() == RegistrationOutcome::Registered
    }

    fn set(&self, outcome: RegistrationOutcome) {
        match self.outcome.lock() {
            Ok(mut guard) => *guard = outcome,
            Err(poisoned) => *poisoned.into_inner() = outcome,
        }
    }
}

/// The `pluginregistration.Registration` server.
#[derive(Debug)]
pub struct RegistrationService {
    info: PluginInfo,
    state: Arc<RegistrationState>,
    metrics: Arc<Metrics>,
}

impl RegistrationService {
    /// `endpoint` is the absolute path of dra.sock: the kubelet dials it as
    /// given, so it must be the same path inside and outside the container.
    pub fn new(driver: &DriverName, endpoint: &Path, state: Arc<RegistrationState>, metrics: Arc<Metrics>) -> Self {
        let info = PluginInfo {
            r#type: DRA_PLUGIN_TYPE.to_owned(),
            name: driver.to_string(),
            endpoint: endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        };
        Self { info, state, metrics }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _request: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!(endpoint = %self.info.endpoint, "kubelet asked for plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.info.name, endpoint = %self.info.endpoint, "registered with the kubelet");
            self.state.set(RegistrationOutcome::Registered);
            self.metrics.set_registered(true);
            return Ok(Response::new(RegistrationStatusResponse {}));
        }
        tracing::error!(error = %status.error, "the kubelet rejected the plugin's registration");
        self.state.set(RegistrationOutcome::Failed(status.error.clone()));
        self.metrics.set_registered(false);
        self.metrics.error(ErrorKind::Registration);
        // As the Go helper: an error tells the kubelet the plugin noticed.
        Err(Status::unknown(format!("failed registration process: {}", status.error)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> (RegistrationService, Arc<RegistrationState>) {
        let state = Arc::new(RegistrationState::default());
        let svc = RegistrationService::new(
            &DriverName::nvidia_default(),
            Path::new("/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"),
            state.clone(),
            Arc::new(Metrics::new()),
        );
        (svc, state)
    }

    #[tokio::test]
    async fn get_info_describes_a_dra_plugin() {
        let (svc, _) = service();
        let info = svc.get_info(Request::new(InfoRequest {})).await.unwrap().into_inner();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "gpu.nvidia.com");
        assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock");
        assert_eq!(
            info.supported_versions,
            ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
        );
    }

    #[tokio::test]
    async fn the_status_is_stored_and_a_failure_is_an_error() {
        let (svc, state) = service();
        assert_eq!(state.outcome(), RegistrationOutcome::Pending);
        let failed = RegistrationStatus { plugin_registered: false, error: "version mismatch".into() };
        let err = svc.notify_registration_status(Request::new(failed)).await.unwrap_err();
        assert!(err.message().contains("version mismatch"), "{err}");
        assert_eq!(state.outcome(), RegistrationOutcome::Failed("version mismatch".into()));
        assert!(!state.is_registered());
        let ok = RegistrationStatus { plugin_registered: true, error: String::new() };
        svc.notify_registration_status(Request::new(ok)).await.unwrap();
        assert!(state.is_registered());
    }
}
