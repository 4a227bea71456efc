//! The core both API versions share: the [`DraService`] the servers hand
//! batches to, and [`DraCore`], which runs a batch and completes it to
//! exactly the requested UIDs. Apart from `mod.rs` so the servers
//! ([`super::versions`], [`super::serve`]) read it as a sibling.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::deadline::Deadline;
use crate::observe::metrics::{ApiVersion, Metrics, Operation, Outcome};
use crate::prepare::Preparer;
use crate::prepare::types::{ClaimError, ClaimOutcome, ClaimRef, ClaimSource};

/// What the gRPC servers need from the core: prepare and unprepare a batch
/// of claims, one result per claim UID, answered before `deadline` (the
/// kubelet's). Implemented by the preparer in `run`, and by tests.
pub trait DraService: Send + Sync + 'static {
    fn prepare(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Deadline,
    ) -> impl Future<Output = HashMap<String, ClaimOutcome>> + Send;
    fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Deadline,
    ) -> impl Future<Output = HashMap<String, Result<(), ClaimError>>> + Send;
}

/// The GPU preparer serves the kubelet here, at the edge, so that
/// `prepare` knows nothing of the gRPC servers.
impl<S: ClaimSource> DraService for Preparer<S> {
    async fn prepare(&self, claims: Vec<ClaimRef>, deadline: Deadline) -> HashMap<String, ClaimOutcome> {
        Preparer::prepare_by(self, claims, deadline).await
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>, deadline: Deadline) -> HashMap<String, Result<(), ClaimError>> {
        Preparer::unprepare_by(self, claims, deadline).await
    }
}

/// Counts prepare and unprepare batches still running, so that stopping
/// waits for them and no longer: the kubelet keeps its connection open,
/// so the server's own graceful shutdown would wait for that instead.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<AtomicUsize>);

/// One running batch; dropping it ends it.
pub struct InFlightGuard(Arc<AtomicUsize>);

impl InFlight {
    pub fn enter(&self) -> InFlightGuard {
        self.0.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self.0.clone())
    }

    pub fn is_idle(&self) -> bool {
        self.0.load(Ordering::Acquire) == 0
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Shared by both API versions: runs a batch, completes it and counts it.
pub struct DraCore<S> {
    service: Arc<S>,
    metrics: Arc<Metrics>,
    in_flight: InFlight,
}

impl<S> Clone for DraCore<S> {
    fn clone(&self) -> Self {
        Self { service: self.service.clone(), metrics: self.metrics.clone(), in_flight: self.in_flight.clone() }
    }
}

impl<S: DraService> DraCore<S> {
    pub fn new(service: Arc<S>, metrics: Arc<Metrics>, in_flight: InFlight) -> Self {
        Self { service, metrics, in_flight }
    }

    /// Prepares `claims`; the result has exactly the request's UIDs.
    pub async fn prepare(
        &self,
        api: ApiVersion,
        claims: Vec<ClaimRef>,
        deadline: Deadline,
    ) -> HashMap<String, ClaimOutcome> {
        let service = self.service.clone();
        let batch = move |claims| async move { service.prepare(claims, deadline).await };
        self.run(Operation::Prepare, api, claims, batch).await
    }

    /// Unprepares `claims`; the result has exactly the request's UIDs.
    pub async fn unprepare(
        &self,
        api: ApiVersion,
        claims: Vec<ClaimRef>,
        deadline: Deadline,
    ) -> HashMap<String, Result<(), ClaimError>> {
        let service = self.service.clone();
        let batch = move |claims| async move { service.unprepare(claims, deadline).await };
        self.run(Operation::Unprepare, api, claims, batch).await
    }

    /// Runs one batch in a task of its own: the batch stops waiting (for
    /// locks, for the API server) at its deadline and answers, but the
    /// steps after its last wait run to their end even if the caller went
    /// away, instead of being dropped between two of them. Then completes,
    /// counts and logs it.
    async fn run<T, F, Fut>(
        &self,
        operation: Operation,
        api: ApiVersion,
        claims: Vec<ClaimRef>,
        batch: F,
    ) -> HashMap<String, Result<T, ClaimError>>
    where
        T: Send + 'static,
        F: FnOnce(Vec<ClaimRef>) -> Fut,
        Fut: Future<Output = HashMap<String, Result<T, ClaimError>>> + Send + 'static,
    {
        let started = Instant::now();
        let uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
        let guard = self.in_flight.enter();
        let work = batch(claims);
        let what = operation.as_str();
        let results = match tokio::spawn(async move {
            let _guard = guard;
            work.await
        })
        .await
        {
            Ok(results) => results,
            Err(join) => {
                tracing::error!(error = %join, "{what} task failed");
                HashMap::new()
            }
        };
        let results = complete(&uids, results, what);
        for result in results.values() {
            self.metrics.claim(operation, if result.is_ok() { Outcome::Ok } else { Outcome::Error });
        }
        self.metrics.request(operation, api, started.elapsed());
        let call = match operation {
            Operation::Prepare => "NodePrepareResources",
            Operation::Unprepare => "NodeUnprepareResources",
        };
        log_batch(call, api, &results, started);
        results
    }
}

/// Keeps exactly the requested UIDs: a missing one gets an error (the
/// kubelet would otherwise fail the whole batch with "skipped N
/// ResourceClaims"), an extra one is dropped (it would fail it with
/// "returned result for unknown claim UID").
fn complete<T>(
    requested: &[String],
    mut results: HashMap<String, Result<T, ClaimError>>,
    what: &'static str,
) -> HashMap<String, Result<T, ClaimError>> {
    let mut out = HashMap::with_capacity(requested.len());
    for uid in requested {
        if out.contains_key(uid) {
            continue;
        }
        let result = results.remove(uid).unwrap_or(Err(ClaimError::NoResult(what)));
        out.insert(uid.clone(), result);
    }
    for uid in results.keys() {
        tracing::warn!(claim_uid = %uid, "dropping a {what} result for a claim the kubelet did not ask for");
    }
    out
}

fn log_batch<T>(call: &str, api: ApiVersion, results: &HashMap<String, Result<T, ClaimError>>, started: Instant) {
    let failed: Vec<(&String, &ClaimError)> =
        results.iter().filter_map(|(uid, r)| r.as_ref().err().map(|e| (uid, e))).collect();
    if failed.is_empty() {
        tracing::info!(call, api = api.as_str(), claims = results.len(), elapsed = ?started.elapsed(), "done");
    } else {
        for (uid, error) in failed {
            tracing::warn!(call, api = api.as_str(), claim_uid = %uid, %error, "claim failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_fills_missing_and_drops_extra_claims() {
        let requested = vec!["a".to_owned(), "b".to_owned(), "a".to_owned()];
        let mut results: HashMap<String, Result<u8, ClaimError>> = HashMap::new();
        results.insert("a".into(), Ok(1));
        results.insert("z".into(), Ok(9));
        let out = complete(&requested, results, "prepare");
        assert_eq!(out.len(), 2);
        assert_eq!(out["a"], Ok(1));
        assert!(out["b"].as_ref().unwrap_err().to_string().contains("no prepare result"));
        assert!(!out.contains_key("z"));
    }
}
