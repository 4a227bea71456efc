//! ResourceClaim lookup for prepare: GET by namespace/name with retries on
//! transient errors until the kubelet's deadline, at most a few at a time,
//! behind a small bounded cache.
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

use gpu_dra_driver::service::api_call::{self, CallError};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Cache and concurrency settings.
#[derive(Debug, Clone)]
pub struct ClaimSourceConfig {
    /// At most this many claims are cached.
    pub capacity: usize,
    /// How long a cached claim is served.
    pub ttl: Duration,
    /// At most this many lookups are in flight at once, process-wide. Each
    /// one holds an HTTP/1.1 connection while it runs, so this bounds the
    /// plugin's connections to the API server (and their fds): one
    /// NodePrepareResources of 10,000 claims opened ~6,000 without it.
    pub max_in_flight: usize,
}

impl Default for ClaimSourceConfig {
    fn default() -> Self {
        Self { capacity: 256, ttl: Duration::from_secs(10), max_in_flight: 8 }
    }
}

/// Why a claim could not be read, in words (see [`api_call::describe`]).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ClaimLookupError(#[from] pub CallError);

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
    in_flight: Semaphore,
}

impl KubeClaimSource {
    pub fn new(client: kube::Client, config: ClaimSourceConfig) -> Self {
        let permits = config.max_in_flight.max(1);
        Self { client, config, cache: Mutex::new(Cache::default()), in_flight: Semaphore::new(permits) }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The claim, `None` when it does not exist. Transient failures (429,
    /// 5xx, connection faults, an answer cut short) are retried with
    /// backoff until `deadline`; waiting for a free connection counts too.
    pub async fn get(
        &self,
        namespace: &str,
        name: &str,
        deadline: Instant,
    ) -> Result<Option<ResourceClaim>, ClaimLookupError> {
        let key = (namespace.to_string(), name.to_string());
        if let Some((at, claim)) = self.cache().entries.get(&key)
            && at.elapsed() < self.config.ttl
        {
            return Ok(Some(claim.clone()));
        }
        let what = format!("reading ResourceClaim {namespace}/{name}");
        let budget = deadline.saturating_duration_since(Instant::now());
        let _permit = match tokio::time::timeout_at(deadline, self.in_flight.acquire()).await {
            Ok(Ok(permit)) => permit,
            // Closed never happens (the semaphore is never closed); both
            // mean no lookup could start in time.
            Ok(Err(_)) | Err(_) => {
                return Err(CallError::Deadline {
                    what,
                    budget,
                    attempts: 0,
                    last: Some(format!(
                        "waited for one of the {} API connections other claims of this node were using",
                        self.config.max_in_flight.max(1)
                    )),
                }
                .into());
            }
        };
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let claim = api_call::with_deadline(&what, deadline, || api.get_opt(name)).await?;
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
