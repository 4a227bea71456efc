//! The owner of the cluster state: applies watch events, and while leading
//! explains and allocates.
//!
//! Delegated allocation races with the kube-scheduler: both may pick the
//! same free device in the same instant, and each writes its own claim's
//! status (the API server checks each claim's resourceVersion, not the
//! devices). The controller sees the other allocation when its watch event
//! arrives: if the device is also in one of its own delegated claims that no
//! pod has reserved yet, it deallocates its own claim (which is then
//! allocated again, elsewhere) and records a `DoubleAllocation` warning
//! event; if its claim is already reserved by a pod, it cannot take it
//! back, and the warning event names both claims for an operator.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::mpsc;

use super::cluster::{
    ALLOCATE_ANNOTATION, ClaimKey, ClusterState, DoubleAllocation, FINALIZER, PodClaims, claim_key, key_of,
};
use super::log_limit::LogLimit;
use super::metrics::Metrics;
use super::watch::{Change, Event};
use crate::args::RunArgs;
use crate::events::{EventWriter, Regarding, Verdict};
use crate::leadership::{WriteError, Writes};

/// Kinds whose initial list is complete.
const KINDS: usize = 6;

pub struct Owner {
    client: Client,
    /// The gate of every write: leadership, checked by the clock, and a
    /// time bound.
    writes: Writes,
    /// Warnings of failed writes, at most one per kind per interval.
    log_limit: LogLimit,
    /// Shared with the webhook, which reads it to warn about selectors;
    /// locked per call, never across an `.await`.
    state: Arc<Mutex<ClusterState>>,
    events: EventWriter,
    metrics: Arc<Metrics>,
    synced: Arc<AtomicBool>,
    explain_after: Duration,
    deallocate_after: Duration,
    /// Names seen since each kind's last `Init`, to drop the vanished.
    relisting: HashMap<&'static str, HashSet<String>>,
    /// Names of the objects of each kind (slices, classes, nodes, pods).
    names: HashMap<&'static str, HashSet<String>>,
    listed: HashSet<&'static str>,
    /// Delegated claims a consumer has reserved since their allocation,
    /// and when the last consumer left (`None` while one holds it).
    unreserved_since: HashMap<ClaimKey, Option<Instant>>,
    /// Double allocations seen, handled at the next pass.
    doubles: Vec<DoubleAllocation>,
    /// Something changed since the last full pass.
    dirty: bool,
    last_pass: Option<Instant>,
}

fn is_delegated(claim: &ResourceClaim) -> bool {
    claim.metadata.annotations.as_ref().and_then(|a| a.get(ALLOCATE_ANNOTATION)).is_some_and(|v| v == "true")
}

fn has_finalizer(claim: &ResourceClaim) -> bool {
    claim.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER)
}

fn allocation(claim: &ResourceClaim) -> Option<&AllocationResult> {
    claim.status.as_ref().and_then(|s| s.allocation.as_ref())
}

fn reserved(claim: &ResourceClaim) -> bool {
    claim.status.as_ref().and_then(|s| s.reserved_for.as_ref()).is_some_and(|r| !r.is_empty())
}

fn claim_regarding(claim: &ResourceClaim) -> Regarding {
    Regarding {
        api_version: "resource.k8s.io/v1",
        kind: "ResourceClaim",
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
        uid: claim.metadata.uid.clone().unwrap_or_default(),
    }
}

fn pod_regarding(key: &str, uid: &str) -> Regarding {
    let (namespace, name) = key.split_once('/').unwrap_or(("", key));
    Regarding {
        api_version: "v1",
        kind: "Pod",
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
    }
}

/// How often one kind of failed write is logged at most.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How often the owner acts when nothing changes (explanations of claims
/// whose wait just passed `--explain-after`, reservation grace periods).
const TICK: Duration = Duration::from_millis(500);

impl Owner {
    fn state(&self) -> MutexGuard<'_, ClusterState> {
        // A panic while holding the lock leaves the state as it was before
        // the call; carry on with it rather than stop the controller.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn new(
        client: Client,
        state: Arc<Mutex<ClusterState>>,
        args: &RunArgs,
        identity: &str,
        metrics: Arc<Metrics>,
        synced: Arc<AtomicBool>,
        writes: Writes,
    ) -> Self {
        Owner {
            events: EventWriter::new(client.clone(), identity, args.event_qps, writes.clone()),
            writes,
            log_limit: LogLimit::new(LOG_INTERVAL),
            client,
            state,
            metrics,
            synced,
            explain_after: args.explain_after,
            deallocate_after: args.deallocate_after,
            relisting: HashMap::new(),
            names: HashMap::new(),
            listed: HashSet::new(),
            unreserved_since: HashMap::new(),
            doubles: Vec::new(),
            dirty: true,
            last_pass: None,
        }
    }

    /// Applies changes as they come and acts every tick while leading.
    pub async fn run(&mut self, mut changes: mpsc::Receiver<Change>) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                change = changes.recv() => {
                    let Some(change) = change else { anyhow::bail!("the watches stopped") };
                    self.apply(change).await;
                    // Drain what is queued before acting on it.
                    while let Ok(change) = changes.try_recv() {
                        self.apply(change).await;
                    }
                }
                _ = tick.tick() => {
                    let leader = self.writes.leadership.is_leading();
                    self.metrics.leader.set(i64::from(leader));
                    if leader && self.listed.len() == KINDS {
                        self.pass().await;
                    }
                }
            }
        }
    }

    fn track(&mut self, kind: &'static str, name: String, present: bool) {
        if let Some(seen) = self.relisting.get_mut(kind) {
            seen.insert(name.clone());
        }
        let names = self.names.entry(kind).or_default();
        if present {
            names.insert(name);
        } else {
            names.remove(&name);
        }
    }

    /// The names of `kind` that a finished relist did not see.
    fn vanished(&mut self, kind: &'static str) -> Vec<String> {
        self.listed.insert(kind);
        if self.listed.len() == KINDS {
            self.synced.store(true, Ordering::Relaxed);
        }
        let seen = self.relisting.remove(kind).unwrap_or_default();
        let names = self.names.entry(kind).or_default();
        let gone: Vec<String> = names.iter().filter(|n| !seen.contains(*n)).cloned().collect();
        for name in &gone {
            names.remove(name);
        }
        gone
    }

    async fn apply(&mut self, change: Change) {
        self.dirty = true;
        match change {
            Change::Slice(event) => match event {
                Event::Apply(slice) => {
                    self.track("slice", slice.metadata.name.clone().unwrap_or_default(), true);
                    self.state().apply_slice(&slice);
                }
                Event::Delete(slice) => {
                    let name = slice.metadata.name.clone().unwrap_or_default();
                    self.track("slice", name.clone(), false);
                    self.state().remove_slice(&name);
                }
                Event::Init => {
                    self.relisting.insert("slice", HashSet::new());
                }
                Event::InitDone => {
                    for name in self.vanished("slice") {
                        self.state().remove_slice(&name);
                    }
                }
            },
            Change::Class(event) => match event {
                Event::Apply(class) => {
                    self.track("class", class.metadata.name.clone().unwrap_or_default(), true);
                    self.state().apply_class(&class);
                }
                Event::Delete(class) => {
                    let name = class.metadata.name.clone().unwrap_or_default();
                    self.track("class", name.clone(), false);
                    self.state().remove_class(&name);
                }
                Event::Init => {
                    self.relisting.insert("class", HashSet::new());
                }
                Event::InitDone => {
                    for name in self.vanished("class") {
                        self.state().remove_class(&name);
                    }
                }
            },
            Change::Node(event) => match event {
                Event::Apply(node) => {
                    self.track("node", node.metadata.name.clone().unwrap_or_default(), true);
                    self.state().apply_node(&node);
                }
                Event::Delete(node) => {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    self.track("node", name.clone(), false);
                    self.state().remove_node(&name);
                }
                Event::Init => {
                    self.relisting.insert("node", HashSet::new());
                }
                Event::InitDone => {
                    for name in self.vanished("node") {
                        self.state().remove_node(&name);
                    }
                }
            },
            Change::Claim(event) => match event {
                Event::Apply(claim) => {
                    let key = claim_key(&claim);
                    self.track("claim", key.clone(), true);
                    let double = self.state().apply_claim(*claim);
                    self.doubles.extend(double);
                }
                Event::Delete(claim) => {
                    let key = claim_key(&claim);
                    self.track("claim", key.clone(), false);
                    self.state().remove_claim(&key);
                    let _ = self.events.clear(&claim_regarding(&claim)).await;
                }
                Event::Init => {
                    self.relisting.insert("claim", HashSet::new());
                }
                Event::InitDone => {
                    for key in self.vanished("claim") {
                        self.state().remove_claim(&key);
                    }
                }
            },
            Change::Pod(event) => match event {
                Event::Apply(pod) => {
                    let key = key_of(pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref());
                    self.track("pod", key.clone(), true);
                    self.state().apply_pod(key, PodClaims::of(&pod));
                }
                Event::Delete(pod) => {
                    let key = key_of(pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref());
                    self.track("pod", key.clone(), false);
                    self.state().remove_pod(&key);
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    let _ = self.events.clear(&pod_regarding(&key, &uid)).await;
                }
                Event::Init => {
                    self.relisting.insert("pod", HashSet::new());
                }
                Event::InitDone => {
                    for key in self.vanished("pod") {
                        self.state().remove_pod(&key);
                    }
                }
            },
            Change::TaintRule(event) => match event {
                Event::Apply(rule) => {
                    let name = rule.metadata.name.clone().unwrap_or_default();
                    self.track("taintrule", name.clone(), true);
                    if let Err(error) = self.state().apply_taint_rule(&rule) {
                        tracing::warn!(rule = name.escape_debug().to_string(), %error, "a DeviceTaintRule is left out");
                    }
                }
                Event::Delete(rule) => {
                    let name = rule.metadata.name.clone().unwrap_or_default();
                    self.track("taintrule", name.clone(), false);
                    self.state().remove_taint_rule(&name);
                }
                Event::Init => {
                    self.relisting.insert("taintrule", HashSet::new());
                }
                Event::InitDone => {
                    for name in self.vanished("taintrule") {
                        self.state().remove_taint_rule(&name);
                    }
                }
            },
        }
    }

    /// One pass over the claims: deallocate, allocate, explain.
    async fn pass(&mut self) {
        let due = self.last_pass.is_none_or(|t| t.elapsed() >= Duration::from_secs(5));
        if !self.dirty && !due && self.doubles.is_empty() {
            return;
        }
        self.dirty = false;
        self.last_pass = Some(Instant::now());
        let started = Instant::now();
        for double in std::mem::take(&mut self.doubles) {
            self.double_allocation(double).await;
        }
        let mut keys = self.state().claim_keys();
        keys.sort();
        for key in &keys {
            // Leadership can lapse in the middle of a pass: stop at once.
            if !self.writes.leadership.is_leading() {
                tracing::info!("leadership lapsed; the pass stops");
                self.dirty = true;
                return;
            }
            self.reconcile_claim(key).await;
        }
        // Events of claims and pods that no longer exist or need none.
        for regarding in self.events.regarding() {
            let key = format!("{}/{}", regarding.namespace, regarding.name);
            let gone = match regarding.kind {
                "ResourceClaim" => self.state().claim(&key).is_none_or(|c| allocation(c).is_some()),
                _ => !self.names.get("pod").is_some_and(|p| p.contains(&key)),
            };
            if gone {
                let _ = self.events.clear(&regarding).await;
            }
        }
        let took = started.elapsed();
        self.metrics.reconcile.observe(took.as_secs_f64());
        if took > Duration::from_secs(1) {
            tracing::info!(claims = keys.len(), seconds = took.as_secs_f64(), "slow pass");
        }
        self.metrics.fleet_devices.set(self.state().fleet_devices() as i64);
        self.metrics.claims.set(keys.len() as i64);
        self.metrics.sample_memory();
    }

    async fn reconcile_claim(&mut self, key: &str) {
        let Some(claim) = self.state().claim(key).cloned() else { return };
        let deleting = claim.metadata.deletion_timestamp.is_some();
        if allocation(&claim).is_some() {
            let _ = self.clear_explanations(&claim, key).await;
            if !has_finalizer(&claim) {
                return;
            }
            // Deallocated once its consumers have been gone for the grace
            // period, as the claim controller deallocates the scheduler's
            // claims; a claim nobody has used yet keeps its devices (it
            // would only be allocated again on the next pass).
            if reserved(&claim) {
                self.unreserved_since.insert(key.to_owned(), None);
            } else if let Some(left) = self.unreserved_since.get_mut(key) {
                left.get_or_insert_with(Instant::now);
            }
            let idle = !reserved(&claim)
                && self
                    .unreserved_since
                    .get(key)
                    .copied()
                    .flatten()
                    .is_some_and(|t| t.elapsed() >= self.deallocate_after);
            if deleting || idle {
                self.deallocate(&claim).await;
            }
            return;
        }
        self.unreserved_since.remove(key);
        if deleting {
            if has_finalizer(&claim) {
                self.remove_finalizer(&claim).await;
            }
            return;
        }
        let delegated = is_delegated(&claim);
        let ours = delegated || self.state().uses_our_classes(&claim);
        if !ours {
            return;
        }
        let waited = claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t.0))
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default();
        let explain = waited >= self.explain_after || self.state().has_pending_pod(key);
        if !delegated && !explain {
            return;
        }
        let outcome = self.state().try_allocate(key);
        match outcome {
            Some(Ok(result)) if delegated => self.write_allocation(&claim, result).await,
            Some(Ok(_)) => {
                let _ = self.clear_explanations(&claim, key).await;
            }
            Some(Err(verdict)) if explain => self.explain(&claim, key, &verdict).await,
            _ => {}
        }
    }

    async fn explain(&mut self, claim: &ResourceClaim, key: &str, verdict: &Verdict) {
        match self.events.ensure(&claim_regarding(claim), verdict).await {
            Ok(true) => {
                self.metrics
                    .explained
                    .get_or_create(&super::metrics::ReasonLabel { reason: verdict.reason.to_owned() })
                    .inc();
            }
            Ok(false) => {}
            Err(error) => {
                self.warn("event", key, "writing the explanation event failed", &error);
                self.metrics.error("event");
            }
        }
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let pods = self.state().pending_pods_of(key);
        for (pod, uid) in pods {
            let note = Verdict { reason: verdict.reason, note: format!("claim {name}: {}", verdict.note) };
            if let Err(error) = self.events.ensure(&pod_regarding(&pod, &uid), &note).await {
                self.warn("event", &pod, "writing the pod's explanation event failed", &error);
                self.metrics.error("event");
            }
        }
    }

    /// A warning, unless one of its kind was logged within [`LOG_INTERVAL`]
    /// (then counted, and the next says how many were left out).
    fn warn(&mut self, kind: &'static str, object: &str, message: &str, error: &WriteError) {
        if matches!(error, WriteError::NotLeading) {
            tracing::debug!(object, "{message}: not leading");
            return;
        }
        if let Some(skipped) = self.log_limit.admit(kind) {
            tracing::warn!(object, %error, skipped, "{message}");
        }
    }

    async fn clear_explanations(&mut self, claim: &ResourceClaim, key: &str) -> Result<(), WriteError> {
        self.events.clear(&claim_regarding(claim)).await?;
        let pods = self.state().pending_pods_of(key);
        for (pod, uid) in pods {
            self.events.clear(&pod_regarding(&pod, &uid)).await?;
        }
        Ok(())
    }

    fn api_for(&self, claim: &ResourceClaim) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), claim.metadata.namespace.as_deref().unwrap_or_default())
    }

    /// Re-reads a claim after a conflict, so the next pass works on the
    /// current object.
    async fn reread(&mut self, claim: &ResourceClaim) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let api = self.api_for(claim);
        match self.writes.read(api.get_opt(&name)).await {
            Ok(Some(current)) => {
                let double = self.state().apply_claim(current);
                self.doubles.extend(double);
            }
            Ok(None) => self.state().remove_claim(&claim_key(claim)),
            Err(error) => self.warn("reread", &claim_key(claim), "re-reading the claim failed", &error),
        }
        self.dirty = true;
    }

    /// Adds the finalizer, then writes `status.allocation`, each with the
    /// resourceVersion just read; a 409 at either step re-reads the claim
    /// and leaves the rest to the next pass. An allocation already there is
    /// never touched: the status write carries the version that had none.
    async fn write_allocation(&mut self, claim: &ResourceClaim, result: AllocationResult) {
        let api = self.api_for(claim);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut current = claim.clone();
        if !has_finalizer(&current) {
            current.metadata.finalizers.get_or_insert_default().push(FINALIZER.to_owned());
            current = match self.writes.run(api.replace(&name, &PostParams::default(), &current)).await {
                Ok(updated) => updated,
                Err(error) => return self.write_failed(claim, "finalizer", &error).await,
            };
        }
        let mut allocated = current.clone();
        allocated.status.get_or_insert_default().allocation = Some(result);
        match self.writes.run(api.replace_status(&name, &PostParams::default(), &allocated)).await {
            Ok(written) => {
                self.metrics.allocated.inc();
                tracing::info!(claim = %claim_key(&written), "allocated");
                let double = self.state().record_written(written);
                self.doubles.extend(double);
            }
            Err(error) => {
                // The finalizer is in place; the claim is stored as it is
                // now, without the allocation that was not written (or
                // whose answer was lost: the re-read, or the watch, shows
                // it, and a retry with this resourceVersion gets 409).
                self.state().apply_claim(current);
                self.write_failed(claim, "allocation", &error).await
            }
        }
    }

    async fn write_failed(&mut self, claim: &ResourceClaim, what: &str, error: &WriteError) {
        if matches!(error, WriteError::NotLeading) {
            tracing::debug!(claim = %claim_key(claim), what, "not written: no longer leading");
            self.dirty = true;
            return;
        }
        if error.is_conflict() {
            self.metrics.error("conflict");
            tracing::debug!(claim = %claim_key(claim), what, "conflict; re-reading");
        } else {
            self.metrics.error("write");
            self.warn("write", &claim_key(claim), &format!("writing the claim failed ({what})"), error);
        }
        self.reread(claim).await;
    }

    /// Clears `status.allocation`, then removes the finalizer.
    async fn deallocate(&mut self, claim: &ResourceClaim) {
        let api = self.api_for(claim);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut cleared = claim.clone();
        if let Some(status) = cleared.status.as_mut() {
            status.allocation = None;
        }
        match self.writes.run(api.replace_status(&name, &PostParams::default(), &cleared)).await {
            Ok(written) => {
                self.metrics.deallocated.inc();
                tracing::info!(claim = %claim_key(&written), "deallocated");
                self.unreserved_since.remove(&claim_key(&written));
                self.state().apply_claim(written.clone());
                self.remove_finalizer(&written).await;
            }
            Err(error) => self.write_failed(claim, "deallocation", &error).await,
        }
    }

    async fn remove_finalizer(&mut self, claim: &ResourceClaim) {
        let api = self.api_for(claim);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut updated = claim.clone();
        if let Some(finalizers) = updated.metadata.finalizers.as_mut() {
            finalizers.retain(|f| f != FINALIZER);
        }
        match self.writes.run(api.replace(&name, &PostParams::default(), &updated)).await {
            Ok(written) => {
                self.state().apply_claim(written);
            }
            Err(error) if error.is_not_found() => self.state().remove_claim(&claim_key(claim)),
            Err(error) => self.write_failed(claim, "finalizer removal", &error).await,
        }
    }

    /// Two allocations hold one device (see the module docs).
    async fn double_allocation(&mut self, double: DoubleAllocation) {
        self.metrics.error("double_allocation");
        tracing::error!(claim = %double.claim, others = ?double.others, "a device is allocated to two claims");
        let mut involved = vec![double.claim.clone()];
        involved.extend(double.others.iter().cloned());
        for key in involved {
            let Some(claim) = self.state().claim(&key).cloned() else { continue };
            if has_finalizer(&claim) && !reserved(&claim) && allocation(&claim).is_some() {
                self.deallocate(&claim).await;
                return;
            }
        }
        let claim = self.state().claim(&double.claim).cloned();
        if let Some(claim) = claim {
            let verdict = Verdict {
                reason: "DoubleAllocation",
                note: format!(
                    "a device of this claim is also allocated to {}; both are in use, so neither can be moved: delete one of the pods",
                    double.others.join(", ")
                ),
            };
            let _ = self.events.ensure(&claim_regarding(&claim), &verdict).await;
        }
    }
}
