//! A kubelet stand-in: the DRA side of the kubelet, as a gRPC client over
//! the plugin's unix sockets. Each behaviour cites the kubelet code it
//! copies (see `../shared/dra-facts.md` §1.3 and §2).
//!
//! - Plugin discovery: the plugin watcher (`pkg/kubelet/pluginmanager/
//!   pluginwatcher`) watches the registry directory with inotify and ignores
//!   names starting with '.'; here the directory is polled.
//! - Registration: `GetInfo`, validate (`type` must be "DRAPlugin", the name
//!   must be the expected driver, one advertised version must be known),
//!   pick the FIRST advertised DRAPlugin version the kubelet knows
//!   (`dra_plugin_manager.go`), then `NotifyRegistrationStatus`.
//! - Calls: one connection to the advertised endpoint ("unix:" + endpoint,
//!   `dra_plugin.go`), 45 s per call (`defaultClientCallTimeout`), every
//!   claim must come back and no other (`manager.go` prepareResources /
//!   unprepareResources), a per-claim `error` fails the call, and the
//!   kubelet retries on its next pod sync (here: [`Kubelet::prepare_until_ok`]).
//! - v1beta1 is called through a conversion to v1 types
//!   (`V1Beta1ClientWrapper`), so callers always see v1 messages.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use hyper_util::rt::TokioIo;
use kubelet_proto::dra_v1::{self, Claim, Device};
use kubelet_proto::health_v1alpha1::dra_resource_health_client::DraResourceHealthClient;
use kubelet_proto::health_v1alpha1::{NodeWatchResourcesRequest, NodeWatchResourcesResponse};
use kubelet_proto::registration::registration_client::RegistrationClient;
use kubelet_proto::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use kubelet_proto::{DRA_PLUGIN_TYPE, dra_v1beta1, versions};
use tonic::transport::{Channel, Endpoint, Uri};

/// `defaultClientCallTimeout` in the kubelet's `dra_plugin.go`.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// The DRA API version the stand-in talks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraVersion {
    V1,
    V1beta1,
}

impl DraVersion {
    /// The string a plugin advertises for this version.
    pub fn advertised(self) -> &'static str {
        match self {
            DraVersion::V1 => versions::DRA_V1,
            DraVersion::V1beta1 => versions::DRA_V1BETA1,
        }
    }
}

/// How the stand-in behaves.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    pub registry_dir: PathBuf,
    /// The driver the plugin must register as.
    pub driver: String,
    /// The versions this kubelet knows. A 1.34+ kubelet knows both; a list
    /// with only v1beta1 forces the plugin's v1beta1 service.
    pub known_versions: Vec<DraVersion>,
    pub call_timeout: Duration,
    pub poll_interval: Duration,
}

impl KubeletConfig {
    pub fn new(registry_dir: impl Into<PathBuf>, driver: impl Into<String>) -> Self {
        Self {
            registry_dir: registry_dir.into(),
            driver: driver.into(),
            known_versions: vec![DraVersion::V1, DraVersion::V1beta1],
            call_timeout: CALL_TIMEOUT,
            poll_interval: Duration::from_millis(50),
        }
    }

    /// A kubelet that knows only v1beta1 (as 1.32/1.33 did).
    pub fn v1beta1_only(mut self) -> Self {
        self.known_versions = vec![DraVersion::V1beta1];
        self
    }
}

/// What went wrong, with the kubelet's own wording where it has one.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("no registration socket for {driver} in {} after {waited:?}", dir.display())]
    NoPlugin { driver: String, dir: PathBuf, waited: Duration },
    #[error("connecting to {}: {error}", path.display())]
    Connect { path: PathBuf, error: tonic::transport::Error },
    #[error("{call}: {status}")]
    Rpc { call: &'static str, status: tonic::Status },
    #[error("{call}: deadline of {timeout:?} exceeded")]
    Deadline { call: &'static str, timeout: Duration },
    #[error("plugin validation failed: {0}")]
    Validation(String),
    #[error("{call} returned result for unknown claim UID {uid}")]
    UnknownClaim { call: &'static str, uid: String },
    #[error("{call} failed for ResourceClaim {claim}: {error}")]
    ClaimFailed { call: &'static str, claim: String, error: String },
    #[error("{call} skipped {count} ResourceClaims")]
    Skipped { call: &'static str, count: usize },
}

/// A plugin the stand-in registered.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub info: PluginInfo,
    pub registration_socket: PathBuf,
    pub version: DraVersion,
    channel: Channel,
}

/// Opens a gRPC channel over a unix socket.
pub async fn connect(path: &Path) -> Result<Channel, KubeletError> {
    let socket = path.to_path_buf();
    // The URI is required by the API and ignored by the connector.
    Endpoint::from_static("http://kubelet-plugin.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { tokio::net::UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|error| KubeletError::Connect { path: path.to_path_buf(), error })
}

/// The kubelet stand-in.
#[derive(Debug, Clone)]
pub struct Kubelet {
    config: KubeletConfig,
}

impl Kubelet {
    pub fn new(config: KubeletConfig) -> Self {
        Self { config }
    }

    /// Registration sockets now in the registry directory: sockets only,
    /// names not starting with '.' (plugin watcher rule).
    pub fn registration_sockets(&self) -> Vec<PathBuf> {
        use std::os::unix::fs::FileTypeExt;
        let Ok(entries) = std::fs::read_dir(&self.config.registry_dir) else { return Vec::new() };
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
            .map(|e| e.path())
            .collect();
        found.sort();
        found
    }

    /// Waits for a registration socket, then registers the plugin behind it
    /// the way the plugin watcher and the DRA plugin manager do.
    pub async fn wait_and_register(&self, wait: Duration) -> Result<Plugin, KubeletError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut last_error = None;
        loop {
            for socket in self.registration_sockets() {
                match self.register(&socket).await {
                    Ok(plugin) => return Ok(plugin),
                    // A socket that exists but does not answer yet is
                    // retried, as the plugin watcher re-adds on failure.
                    Err(e) => last_error = Some(e),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(last_error.unwrap_or_else(|| KubeletError::NoPlugin {
                    driver: self.config.driver.clone(),
                    dir: self.config.registry_dir.clone(),
                    waited: wait,
                }));
            }
            tokio::time::sleep(self.config.poll_interval).await;
        }
    }

    /// GetInfo, validate, pick the version, NotifyRegistrationStatus.
    pub async fn register(&self, socket: &Path) -> Result<Plugin, KubeletError> {
        let mut client = RegistrationClient::new(connect(socket).await?);
        let info = self.with_deadline("GetInfo", client.get_info(self.request(InfoRequest {}))).await?.into_inner();
        let chosen = self.validate(&info);
        let status = match &chosen {
            Ok(_) => RegistrationStatus { plugin_registered: true, error: String::new() },
            Err(e) => RegistrationStatus { plugin_registered: false, error: e.to_string() },
        };
        let notified = self
            .with_deadline("NotifyRegistrationStatus", client.notify_registration_status(self.request(status)))
            .await;
        let version = chosen?;
        notified?;
        // The kubelet dials "unix:" + endpoint and keeps the connection.
        let channel = connect(Path::new(&info.endpoint)).await?;
        Ok(Plugin { info, registration_socket: socket.to_path_buf(), version, channel })
    }

    /// The kubelet's checks (`dra_plugin_manager.go` ValidatePlugin): the
    /// plugin type, the driver name, and the first advertised version it
    /// knows. Unknown entries (health services) are skipped.
    fn validate(&self, info: &PluginInfo) -> Result<DraVersion, KubeletError> {
        if info.r#type != DRA_PLUGIN_TYPE {
            return Err(KubeletError::Validation(format!("type {:?} is not {DRA_PLUGIN_TYPE:?}", info.r#type)));
        }
        if info.name != self.config.driver {
            return Err(KubeletError::Validation(format!(
                "name {:?} is not driver {:?}",
                info.name, self.config.driver
            )));
        }
        if !Path::new(&info.endpoint).is_absolute() {
            return Err(KubeletError::Validation(format!("endpoint {:?} is not an absolute path", info.endpoint)));
        }
        info.supported_versions
            .iter()
            .find_map(|v| self.config.known_versions.iter().copied().find(|k| k.advertised() == v))
            .ok_or_else(|| {
                KubeletError::Validation(format!(
                    "none of the advertised versions {:?} is supported",
                    info.supported_versions
                ))
            })
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        // Sent as grpc-timeout, as the Go client's context deadline is.
        request.set_timeout(self.config.call_timeout);
        request
    }

    async fn with_deadline<T>(
        &self,
        call: &'static str,
        future: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, KubeletError> {
        match tokio::time::timeout(self.config.call_timeout, future).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(status)) => Err(KubeletError::Rpc { call, status }),
            Err(_) => Err(KubeletError::Deadline { call, timeout: self.config.call_timeout }),
        }
    }

    /// NodePrepareResources with the raw per-claim answers (v1 types).
    pub async fn prepare_raw(
        &self,
        plugin: &Plugin,
        claims: &[Claim],
    ) -> Result<HashMap<String, dra_v1::NodePrepareResourceResponse>, KubeletError> {
        const CALL: &str = "NodePrepareResources";
        match plugin.version {
            DraVersion::V1 => {
                let mut client = dra_v1::dra_plugin_client::DraPluginClient::new(plugin.channel.clone());
                let request = self.request(dra_v1::NodePrepareResourcesRequest { claims: claims.to_vec() });
                Ok(self.with_deadline(CALL, client.node_prepare_resources(request)).await?.into_inner().claims)
            }
            DraVersion::V1beta1 => {
                let mut client = dra_v1beta1::dra_plugin_client::DraPluginClient::new(plugin.channel.clone());
                let request = self.request(dra_v1beta1::NodePrepareResourcesRequest {
                    claims: claims.iter().map(claim_to_v1beta1).collect(),
                });
                let response = self.with_deadline(CALL, client.node_prepare_resources(request)).await?.into_inner();
                Ok(response.claims.into_iter().map(|(uid, r)| (uid, prepare_response_to_v1(r))).collect())
            }
        }
    }

    /// NodePrepareResources as the kubelet judges it (`manager.go`
    /// prepareResources): an unknown UID, a claim's error or a skipped
    /// claim fails the whole call. Returns each claim's devices.
    pub async fn prepare(
        &self,
        plugin: &Plugin,
        claims: &[Claim],
    ) -> Result<HashMap<String, Vec<Device>>, KubeletError> {
        const CALL: &str = "NodePrepareResources";
        let response = self.prepare_raw(plugin, claims).await?;
        let mut out = HashMap::new();
        for (uid, result) in response {
            let claim = claims
                .iter()
                .find(|c| c.uid == uid)
                .ok_or(KubeletError::UnknownClaim { call: CALL, uid: uid.clone() })?;
            if !result.error.is_empty() {
                return Err(KubeletError::ClaimFailed { call: CALL, claim: claim.name.clone(), error: result.error });
            }
            out.insert(uid, result.devices);
        }
        let unfinished = distinct_uids(claims) - out.len();
        if unfinished != 0 {
            return Err(KubeletError::Skipped { call: CALL, count: unfinished });
        }
        Ok(out)
    }

    /// NodeUnprepareResources with the raw per-claim errors.
    pub async fn unprepare_raw(
        &self,
        plugin: &Plugin,
        claims: &[Claim],
    ) -> Result<HashMap<String, String>, KubeletError> {
        const CALL: &str = "NodeUnprepareResources";
        match plugin.version {
            DraVersion::V1 => {
                let mut client = dra_v1::dra_plugin_client::DraPluginClient::new(plugin.channel.clone());
                let request = self.request(dra_v1::NodeUnprepareResourcesRequest { claims: claims.to_vec() });
                let response = self.with_deadline(CALL, client.node_unprepare_resources(request)).await?.into_inner();
                Ok(response.claims.into_iter().map(|(uid, r)| (uid, r.error)).collect())
            }
            DraVersion::V1beta1 => {
                let mut client = dra_v1beta1::dra_plugin_client::DraPluginClient::new(plugin.channel.clone());
                let request = self.request(dra_v1beta1::NodeUnprepareResourcesRequest {
                    claims: claims.iter().map(claim_to_v1beta1).collect(),
                });
                let response = self.with_deadline(CALL, client.node_unprepare_resources(request)).await?.into_inner();
                Ok(response.claims.into_iter().map(|(uid, r)| (uid, r.error)).collect())
            }
        }
    }

    /// NodeUnprepareResources as the kubelet judges it (`manager.go`
    /// unprepareResources: the same every-claim-must-come-back rule).
    pub async fn unprepare(&self, plugin: &Plugin, claims: &[Claim]) -> Result<(), KubeletError> {
        const CALL: &str = "NodeUnprepareResources";
        let response = self.unprepare_raw(plugin, claims).await?;
        let mut done = 0;
        for (uid, error) in response {
            let claim = claims
                .iter()
                .find(|c| c.uid == uid)
                .ok_or(KubeletError::UnknownClaim { call: CALL, uid: uid.clone() })?;
            if !error.is_empty() {
                return Err(KubeletError::ClaimFailed { call: CALL, claim: claim.name.clone(), error });
            }
            done += 1;
        }
        let unfinished = distinct_uids(claims) - done;
        if unfinished != 0 {
            return Err(KubeletError::Skipped { call: CALL, count: unfinished });
        }
        Ok(())
    }

    /// Prepares until it succeeds or `attempts` calls failed, pausing
    /// `backoff` in between: the kubelet retries a failed prepare on the
    /// pod's next sync, and only sends claims not yet prepared. Returns the
    /// result and the errors seen on the way.
    pub async fn prepare_until_ok(
        &self,
        plugin: &Plugin,
        claims: &[Claim],
        attempts: usize,
        backoff: Duration,
    ) -> (Result<HashMap<String, Vec<Device>>, KubeletError>, Vec<KubeletError>) {
        let mut errors = Vec::new();
        for attempt in 1..=attempts.max(1) {
            match self.prepare(plugin, claims).await {
                Ok(devices) => return (Ok(devices), errors),
                Err(e) if attempt == attempts.max(1) => return (Err(e), errors),
                Err(e) => errors.push(e),
            }
            tokio::time::sleep(backoff).await;
        }
        (Err(KubeletError::Skipped { call: "NodePrepareResources", count: claims.len() }), errors)
    }

    /// Opens the device health stream (`v1alpha1.DRAResourceHealth`).
    pub async fn watch_health(
        &self,
        plugin: &Plugin,
    ) -> Result<impl futures::Stream<Item = Result<NodeWatchResourcesResponse, tonic::Status>> + use<>, KubeletError>
    {
        let mut client = DraResourceHealthClient::new(plugin.channel.clone());
        // A stream has no deadline (the kubelet's health client keeps it open).
        let response = client
            .node_watch_resources(NodeWatchResourcesRequest {})
            .await
            .map_err(|status| KubeletError::Rpc { call: "NodeWatchResources", status })?;
        Ok(response.into_inner().boxed())
    }
}

fn distinct_uids(claims: &[Claim]) -> usize {
    let mut uids: Vec<&str> = claims.iter().map(|c| c.uid.as_str()).collect();
    uids.sort_unstable();
    uids.dedup();
    uids.len()
}

fn claim_to_v1beta1(c: &Claim) -> dra_v1beta1::Claim {
    dra_v1beta1::Claim { namespace: c.namespace.clone(), uid: c.uid.clone(), name: c.name.clone() }
}

fn prepare_response_to_v1(r: dra_v1beta1::NodePrepareResourceResponse) -> dra_v1::NodePrepareResourceResponse {
    dra_v1::NodePrepareResourceResponse {
        devices: r
            .devices
            .into_iter()
            .map(|d| Device {
                request_names: d.request_names,
                pool_name: d.pool_name,
                device_name: d.device_name,
                cdi_device_ids: d.cdi_device_ids,
                share_id: None,
            })
            .collect(),
        error: r.error,
    }
}

/// A claim reference as the kubelet sends it.
pub fn claim(namespace: &str, name: &str, uid: &str) -> Claim {
    Claim { namespace: namespace.to_owned(), uid: uid.to_owned(), name: name.to_owned() }
}
