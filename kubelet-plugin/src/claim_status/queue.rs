//! GPU claims' `status.devices`, written off the kubelet's path.
//!
//! Prepare and unprepare answer the kubelet first; each hands the queue
//! what the claim's status should say (while it still holds the claim's
//! lock, so the hand-offs of one claim come in the order of its calls).
//! One writer per claim takes the latest wish and writes it (read, edit,
//! write with the read's resourceVersion: [`edit_status`]); a wish that
//! comes while it writes replaces any older one still waiting, so a late
//! prepare's entries never come back after unprepare removed them.
//!
//! A write is bounded ([`WRITE_TIMEOUT`], and the client's own timeouts)
//! and never fails the call it follows: a failure is counted
//! (`gpu_dra_errors_total{kind="claim_status"}`), logged once per claim
//! and error, and a refusal that retrying cannot cure (RBAC, admission)
//! is explained once by a Warning Event on the claim. The next prepare or
//! unprepare of the claim tries again; nothing loops.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::{Notify, Semaphore};

use super::claim::{self, Writer};
use super::refusal::{Explanation, REFUSED_REASON, Stakes, WriteFailures, claim_reference, post_event, refusal_note};
use super::write::{ConditionError, edit_status};
use crate::observe::metrics::{ErrorKind, Metrics};
use gpu_dra_driver::claim_status::Readiness;

/// The longest one claim's write (reads, writes and conflict retries) may
/// take before it is given up.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(20);

/// Claims whose status is written at once (each holds a connection).
pub const CONCURRENT_WRITES: usize = 4;

/// The claim whose status is written, as the kubelet named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimName {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// What a claim's status should say.
#[derive(Debug, Clone, PartialEq)]
pub enum Wanted {
    /// Each allocated device of ours `Ready` as `readiness` says, with
    /// its `data` (by device name).
    Prepared { readiness: Readiness, data: BTreeMap<String, serde_json::Value> },
    /// No entry of ours.
    Unprepared,
}

impl Wanted {
    /// A successful prepare on `node`.
    pub fn ready(node: &str, data: BTreeMap<String, serde_json::Value>) -> Self {
        let readiness = Readiness {
            ready: true,
            reason: "Prepared",
            message: format!("prepared on node {node}: the container gets the device through its CDI spec"),
        };
        Self::Prepared { readiness, data }
    }

    /// A failed prepare, with the error the kubelet got.
    pub fn failed(error: &str) -> Self {
        let readiness = Readiness { ready: false, reason: "PrepareFailed", message: error.to_owned() };
        Self::Prepared { readiness, data: BTreeMap::new() }
    }
}

/// A device's `data`: its UUID (`GPU-…` or `MIG-…`).
pub fn uuid_data(uuid: &str) -> serde_json::Value {
    serde_json::json!({ "uuid": uuid })
}

/// Writes GPU claims' status, one writer per claim.
pub struct StatusQueue {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    driver: String,
    node: String,
    /// The claims with a writer, by UID, and the wish it has not taken yet.
    pending: Mutex<HashMap<String, Option<(ClaimName, Wanted)>>>,
    /// Told each time a claim's writer finishes.
    finished: Notify,
    writes: Semaphore,
    failures: WriteFailures,
    metrics: Option<Arc<Metrics>>,
    timeout: Duration,
}

impl StatusQueue {
    /// Writes through `client` as `driver`'s agent on `node` (its pool).
    pub fn new(client: kube::Client, driver: &str, node: &str, metrics: Option<Arc<Metrics>>) -> Self {
        Self::with_timeout(client, driver, node, metrics, WRITE_TIMEOUT)
    }

    /// As [`Self::new`], giving a write up after `timeout`.
    pub fn with_timeout(
        client: kube::Client,
        driver: &str,
        node: &str,
        metrics: Option<Arc<Metrics>>,
        timeout: Duration,
    ) -> Self {
        let inner = Inner {
            client,
            driver: driver.to_owned(),
            node: node.to_owned(),
            pending: Mutex::new(HashMap::new()),
            finished: Notify::new(),
            writes: Semaphore::new(CONCURRENT_WRITES),
            failures: WriteFailures::default(),
            metrics,
            timeout,
        };
        Self { inner: Arc::new(inner) }
    }

    /// Asks for `claim`'s status to say `wanted`; returns at once (the
    /// write runs on its own task). Call it in the order of the claim's
    /// calls (under the claim's lock).
    pub fn submit(&self, claim: ClaimName, wanted: Wanted) {
        let uid = claim.uid.clone();
        let mut pending = self.inner.pending();
        if let Some(waiting) = pending.get_mut(&uid) {
            *waiting = Some((claim, wanted));
            return;
        }
        pending.insert(uid.clone(), Some((claim, wanted)));
        drop(pending);
        tokio::spawn(self.inner.clone().drain(uid));
    }

    /// Waits until no claim's status is waiting or being written.
    pub async fn settled(&self) {
        loop {
            let finished = self.inner.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            if self.inner.pending().is_empty() {
                return;
            }
            finished.await;
        }
    }
}

impl Inner {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<(ClaimName, Wanted)>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the claim's wishes, the latest each time, until none waits.
    async fn drain(self: Arc<Self>, uid: String) {
        loop {
            let next = {
                let mut pending = self.pending();
                match pending.get_mut(&uid).and_then(Option::take) {
                    Some(next) => next,
                    None => {
                        pending.remove(&uid);
                        drop(pending);
                        self.finished.notify_waiters();
                        return;
                    }
                }
            };
            self.write(&next.0, &next.1).await;
        }
    }

    /// One bounded write; its failure is logged, counted and explained.
    async fn write(&self, claim: &ClaimName, wanted: &Wanted) {
        let writer = Writer { driver: &self.driver, node: &self.node };
        let edit = |current: &ResourceClaim| -> Option<ResourceClaim> {
            // The name may since belong to a new claim: not ours to edit.
            if current.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
                return None;
            }
            match wanted {
                Wanted::Prepared { readiness, data } => claim::prepared(current, writer, readiness, data),
                Wanted::Unprepared => claim::unprepared(current, writer),
            }
        };
        let result = match self.writes.acquire().await {
            Ok(_permit) => {
                tokio::time::timeout(self.timeout, edit_status(&self.client, &claim.namespace, &claim.name, edit))
                    .await
                    .unwrap_or_else(|_| {
                        Err(ConditionError::Failed(format!(
                            "writing the status of claim {}/{}: no answer within {:?}",
                            claim.namespace, claim.name, self.timeout
                        )))
                    })
            }
            Err(_) => Err(ConditionError::Failed("internal error: the status writes' semaphore is closed".into())),
        };
        let name = format!("{}/{}", claim.namespace, claim.name);
        let error = match result {
            Ok(()) => {
                if self.failures.clear(&claim.uid) {
                    tracing::info!(claim = name, "wrote the claim's device status after earlier failures");
                }
                return;
            }
            Err(error) => error,
        };
        if let Some(metrics) = &self.metrics {
            metrics.error(ErrorKind::ClaimStatus);
        }
        let new = self.failures.record(&claim.uid, &error);
        if matches!(wanted, Wanted::Unprepared) {
            // The claim's last write: nothing retries it.
            self.failures.clear(&claim.uid);
        }
        if !new {
            tracing::debug!(claim = name, %error, "cannot write the claim's device status (again)");
            return;
        }
        tracing::warn!(
            claim = name,
            %error,
            "cannot write the claim's device status (status.devices); the prepare or unprepare itself is unaffected, \
             and the next one of this claim tries again"
        );
        if let ConditionError::Refused { .. } = error {
            let stakes = Stakes {
                driver: &self.driver,
                role: "its kubelet-plugin ClusterRole",
                cost: "The claim's devices are prepared or unprepared as asked; only their status is missing.",
            };
            let devices = format!("its {} devices", self.driver);
            let explanation = Explanation {
                namespace: claim.namespace.clone(),
                regarding: claim_reference(&claim.namespace, &claim.name, &claim.uid),
                related: None,
                reason: REFUSED_REASON,
                note: refusal_note(&self.node, &name, &devices, &error, &stakes),
            };
            if let Err(more) = post_event(&self.client, &self.node, &explanation).await {
                tracing::warn!(claim = name, error = %more, "cannot write the Event explaining the refused status write");
            }
        }
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
