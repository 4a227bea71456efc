//! ResourceClaim lookup for prepare: GET by namespace/name with retries on
//! transient errors, behind a small bounded cache.
//!
//! Why not a watch of claims: the plugin's RSS target is 16 MiB, and a watch
//! (reflector) of all ResourceClaims keeps every claim of the cluster in
//! memory (a few KiB each decoded; tens of MiB for a large cluster). The API
//! offers no field selector that narrows claims to one node (ResourceClaim
//! supports only `metadata.name`/`metadata.namespace`), so the only
//! node-scoped watch is one per claim, i.e. one long-lived connection per
//! prepared claim over HTTP/1.1. A GET per prepare is what the kubelet
//! itself does before calling us, so it is cheap by comparison.
//!
//! What the cache holds is safe to reuse: only *allocated* claims, whose
//! allocation cannot change for the life of their UID (the API allows it to
//! be removed, never modified), for a short time (`ttl`), bounded to
//! `capacity` entries. It absorbs the kubelet's retries and repeated,
//! idempotent prepares. A claim that was deleted and re-created under the
//! same name within `ttl` shows the old UID; the preparer's UID check then
//! refuses it and the kubelet retries after the entry expired, or the
//! preparer calls [`KubeClaimSource::forget`].

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use tokio::time::Instant;

/// Cache and retry settings.
#[derive(Debug, Clone)]
pub struct ClaimSourceConfig {
    /// At most this many claims are cached.
    pub capacity: usize,
    /// How long a cached claim is served.
    pub ttl: Duration,
    /// Attempts per lookup (first try included) on transient errors.
    pub attempts: usize,
    /// Backoff before the second attempt; doubles after each failure.
    pub backoff: Duration,
}

impl Default for ClaimSourceConfig {
    fn default() -> Self {
        Self { capacity: 256, ttl: Duration::from_secs(10), attempts: 4, backoff: Duration::from_millis(100) }
    }
}

/// Why a claim could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClaimLookupError {
    #[error("reading ResourceClaim {namespace}/{name}: {error}")]
    Api { namespace: String, name: String, error: kube::Error },
    #[error(
        "reading ResourceClaim {namespace}/{name}: the API server is unavailable after {attempts} attempts: {error}"
    )]
    Unavailable { namespace: String, name: String, attempts: usize, error: kube::Error },
}

type Key = (String, String);

#[derive(Default)]
struct Cache {
    entries: HashMap<Key, (Instant, ResourceClaim)>,
    /// Insertion order, for eviction of the oldest.
    order: VecDeque<Key>,
}

/// Reads claims from the API server.
pub struct KubeClaimSource {
    client: kube::Client,
    config: ClaimSourceConfig,
    cache: Mutex<Cache>,
}

/// Errors worth another try: server-side (5xx), throttling (429) and
/// anything below HTTP (connection refused or reset, timeouts).
fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

impl KubeClaimSource {
    pub fn new(client: kube::Client, config: ClaimSourceConfig) -> Self {
        Self { client, config, cache: Mutex::new(Cache::default()) }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The claim, `None` when it does not exist.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, ClaimLookupError> {
        let key = (namespace.to_string(), name.to_string());
        if let Some((at, claim)) = self.cache().entries.get(&key)
            && at.elapsed() < self.config.ttl
        {
            return Ok(Some(claim.clone()));
        }
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let mut backoff = self.config.backoff;
        let attempts = self.config.attempts.max(1);
        let mut attempt = 1;
        let claim = loop {
            match api.get_opt(name).await {
                Ok(claim) => break claim,
                Err(error) if transient(&error) && attempt < attempts => {
                    tracing::debug!(%error, namespace, name, attempt, "retrying ResourceClaim lookup");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                Err(error) if transient(&error) => {
                    return Err(ClaimLookupError::Unavailable {
                        namespace: namespace.into(),
                        name: name.into(),
                        attempts,
                        error,
                    });
                }
                Err(error) => {
                    return Err(ClaimLookupError::Api { namespace: namespace.into(), name: name.into(), error });
                }
            }
        };
        match &claim {
            Some(c) if c.status.as_ref().is_some_and(|s| s.allocation.is_some()) => self.remember(key, c.clone()),
            _ => self.forget(namespace, name),
        }
        Ok(claim)
    }

    fn remember(&self, key: Key, claim: ResourceClaim) {
        if self.config.capacity == 0 {
            return;
        }
        let mut cache = self.cache();
        if cache.entries.insert(key.clone(), (Instant::now(), claim)).is_none() {
            cache.order.push_back(key);
        }
        while cache.entries.len() > self.config.capacity {
            let Some(oldest) = cache.order.pop_front() else { break };
            cache.entries.remove(&oldest);
        }
    }

    /// Drops a cached claim (e.g. after its UID did not match).
    pub fn forget(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let mut cache = self.cache();
        if cache.entries.remove(&key).is_some() {
            cache.order.retain(|k| *k != key);
        }
    }

    /// How many claims are cached (for tests and metrics).
    pub fn cached(&self) -> usize {
        self.cache().entries.len()
    }
}
