//! An in-process API server stand-in that the real kube client talks to.
//!
//! It serves ResourceSlices, ResourceClaims (with `/status`), DeviceClasses,
//! Nodes, Pods (with `/status`), `events.k8s.io/v1` Events and Leases over
//! plain HTTP on `127.0.0.1`, with the semantics the
//! driver relies on: one global, increasing resourceVersion; uid,
//! creationTimestamp and generation set by the server; 409 AlreadyExists and
//! 409 Conflict on a stale resourceVersion; 404 with a `Status` body; lists
//! with label and field selectors; watches with bookmarks and 410 for an
//! expired resourceVersion; DeleteCollection; the status subresource; JSON
//! merge patch and server-side apply; finalizers and graceful deletion
//! (`deletionTimestamp`, removal with the last finalizer); the pod proxy
//! subresource (GET, `proxy.rs`). Each rule cites the real server in the
//! module that implements it. Tests inject faults through [`Faults`] and
//! read or change objects directly through the typed helpers here (as the
//! kubelet or a scheduler would).
//!
//! Discovery is the legacy documents (`discovery.rs`), enough for kubectl.
//! Not implemented: authentication, aggregated discovery, grace periods
//! (deletion is immediate once no finalizer holds an object), strategic merge patch and JSON patch (415),
//! protobuf. Lists page with `limit` and `continue` (`paging.rs`; later pages from the current objects, not
//! the first page's snapshot).

pub mod apply;
pub mod audit;
mod defaults;
mod discovery;
pub mod errors;
pub mod faults;
pub mod gates;
mod handlers;
pub mod kinds;
mod paging;
pub mod proxy;
pub mod selectors;
pub mod store;
mod validate;
mod watch;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::oneshot;

pub use errors::ApiError;
pub use faults::{Faults, Matcher, RequestRecord};
use handlers::Shared;
use kinds::Kind;
use selectors::{FieldSelector, LabelSelector};
pub use store::Store;

/// The Kubernetes release the stand-in is unless a test sets another
/// ([`ApiServer::set_server_minor`]): its `/version`, and the ResourceSlice
/// rules it validates with. The newest release the real-cluster tests run.
pub const DEFAULT_SERVER_MINOR: u32 = 37;

/// How often an idle watch that allows bookmarks gets one (the real server
/// sends them about once a minute; tests want them sooner).
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(2);

/// A running stand-in; stops when dropped.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, shutdown: oneshot::Receiver<()>) {
    let app = axum::Router::new().fallback(handlers::handle).with_state(shared);
    tokio::select! {
        result = axum::serve(listener, app) => {
            if let Err(e) = result {
                eprintln!("API server stand-in stopped: {e}");
            }
        }
        _ = shutdown => {}
    }
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared { store: Store::new(), faults: Faults::default(), bookmark_interval: DEFAULT_BOOKMARK_INTERVAL })
}

impl ApiServer {
    /// Binds `127.0.0.1:0` and serves on the current tokio runtime.
    pub async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = shared();
        let (tx, rx) = oneshot::channel();
        tokio::spawn(serve(listener, shared.clone(), rx));
        Ok(Self { shared, addr, shutdown: Some(tx) })
    }

    /// Serves from a thread with its own runtime, for tests that are not
    /// async themselves (e.g. ones that only run the plugin binary).
    pub fn start_in_thread() -> std::io::Result<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let shared = shared();
        let (tx, rx) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let for_thread = shared.clone();
        std::thread::Builder::new().name("apiserver-standin".into()).spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(std_listener) {
                    Ok(listener) => serve(listener, for_thread, rx).await,
                    Err(e) => eprintln!("API server stand-in cannot listen: {e}"),
                }
            });
        })?;
        Ok(Self { shared, addr, shutdown: Some(tx) })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Makes the stand-in report (`/version`) and validate ResourceSlices as
    /// Kubernetes 1.`minor`, e.g. 34 for the oldest supported release's rules.
    pub fn set_server_minor(&self, minor: u32) {
        self.shared.store.set_server_minor(minor);
    }

    /// Turns one of the API server's feature gates (`gates::DEVICE_TAINTS`,
    /// ...) on or off: with it off, ResourceSlice writes lose its fields as
    /// on the real server ([`gates`]). All are on unless turned off.
    pub fn set_feature_gate(&self, gate: &str, on: bool) {
        self.shared.store.set_feature_gate(gate, on);
    }

    /// Makes the stand-in Kubernetes 1.`minor` with that release's default
    /// gates: its `/version`, its ResourceSlice rules, and the fields of
    /// its alpha gates dropped.
    pub fn use_release_defaults(&self, minor: u32) {
        self.set_server_minor(minor);
        for gate in gates::off_by_default(minor) {
            self.set_feature_gate(gate, false);
        }
    }

    /// Fault injection and the request log.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Direct access to the objects (untyped).
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Writes a kubeconfig whose only context points at this server, without
    /// credentials.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, kubeconfig_yaml(&self.url()))
    }

    /// Creates `object` as a client's POST would (status dropped for types
    /// with a status subresource).
    pub fn create<K: Resource + Serialize + DeserializeOwned>(&self, object: &K) -> Result<K, ApiError> {
        let (kind, ns, value) = untyped(object)?;
        typed(self.store().create(kind, ns.as_deref(), value, "test")?)
    }

    /// Creates `object` including its status (e.g. an allocated claim).
    pub fn create_with_status<K: Resource + Serialize + DeserializeOwned>(&self, object: &K) -> Result<K, ApiError> {
        let (kind, ns, value) = untyped(object)?;
        typed(self.store().create_with_status(kind, ns.as_deref(), value)?)
    }

    pub fn get<K: Resource + DeserializeOwned>(&self, namespace: Option<&str>, name: &str) -> Result<K, ApiError> {
        typed(self.store().get(kind_of::<K>()?, namespace, name)?)
    }

    /// Objects matching `field_selector` (e.g. `spec.nodeName=n1`; empty for all).
    pub fn list<K: Resource + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        field_selector: &str,
    ) -> Result<Vec<K>, ApiError> {
        let kind = kind_of::<K>()?;
        let fields = FieldSelector::parse(field_selector, kind)?;
        let (items, _) = self.store().list(kind, namespace, &LabelSelector::default(), &fields);
        items.into_iter().map(typed).collect()
    }

    pub fn delete<K: Resource>(&self, namespace: Option<&str>, name: &str) -> Result<(), ApiError> {
        self.store().delete(kind_of::<K>()?, namespace, name, None, None).map(drop)
    }

    /// DeleteCollection with a field selector, as the kubelet wipes a node's
    /// slices (`spec.nodeName=<node>`); returns how many were deleted.
    pub fn delete_collection<K: Resource>(
        &self,
        namespace: Option<&str>,
        field_selector: &str,
    ) -> Result<usize, ApiError> {
        let kind = kind_of::<K>()?;
        let fields = FieldSelector::parse(field_selector, kind)?;
        Ok(self.store().delete_collection(kind, namespace, &LabelSelector::default(), &fields).len())
    }

    /// Changes an object through the status-preserving update path with a
    /// JSON merge patch (`/status` when `status`), as another client would.
    pub fn merge_patch<K: Resource + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
        status: bool,
        patch: &Value,
    ) -> Result<K, ApiError> {
        let kind = kind_of::<K>()?;
        let write = store::Write { kind, namespace, name, status, manager: "test", put: false };
        typed(self.store().update(&write, |current, _| {
            let mut next = current.clone();
            apply::merge_patch(&mut next, patch);
            Ok(next)
        })?)
    }
}

fn kind_of<K: Resource>() -> Result<&'static Kind, ApiError> {
    kinds::by_kind(K::KIND).ok_or_else(|| ApiError::bad_request(format!("the stand-in does not serve {}", K::KIND)))
}

fn untyped<K: Resource + Serialize>(object: &K) -> Result<(&'static Kind, Option<String>, Value), ApiError> {
    let kind = kind_of::<K>()?;
    let value = serde_json::to_value(object).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let ns = value.pointer("/metadata/namespace").and_then(Value::as_str).map(str::to_string);
    if kind.namespaced && ns.is_none() {
        return Err(ApiError::bad_request(format!("a {} needs metadata.namespace", kind.kind)));
    }
    Ok((kind, ns, value))
}

fn typed<K: DeserializeOwned>(value: Value) -> Result<K, ApiError> {
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("stored object does not decode: {e}")))
}

/// A kubeconfig for `server` (plain http, no credentials).
pub fn kubeconfig_yaml(server: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster:
    server: {server}
contexts:
- name: standin
  context:
    cluster: standin
    user: standin
    namespace: default
current-context: standin
users:
- name: standin
  user: {{}}
"
    )
}
