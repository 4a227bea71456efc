//! Publishes the node's ResourceSlices and keeps them published.
//!
//! One pool named after the node; the slices are built by
//! [`SliceBuilder`] and found with the field selector
//! `spec.nodeName=<node>,spec.driver=<driver>`. A sync lists them, creates
//! the missing, replaces the changed (re-reading and retrying on 409
//! Conflict) and deletes the extra. The pool generation is bumped whenever
//! the inventory (including its faults, which become taints) changes, so
//! consumers never mix old and new slices of the pool.
//!
//! A sync runs when the inventory changes, when the watch of the node's
//! slices shows them deleted or changed by someone else (the kubelet wipes
//! all of a node's slices at its start, and a driver's after 30 s without a
//! plugin), after the watch re-lists, and every `resync` period. Failures
//! back off exponentially up to `max_backoff`.
//!
//! A field whose feature gate is off on the API server is dropped from what
//! we write ([`served`](gpu_dra_driver::slices::served)). Each write's answer
//! is compared with what was sent; a dropped field is learned once, logged
//! once with the gate that serves it, shown in a metric, and from then on
//! left out of every comparison (else every sync would see a difference and
//! write again, without end). Where the field is what keeps a device from
//! being misused (taints, counters) the device is withheld instead.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use gpu_dra_driver::feature_gates::FeatureGates;
use gpu_dra_driver::feature_gates::Gate;
use gpu_dra_driver::inventory::Inventory;
use gpu_dra_driver::names::{DriverName, NodeName};
use gpu_dra_driver::slices::consumable_shares::SharesMode;
use gpu_dra_driver::slices::served::{GatedField, NotServed, WriteVerdict, judge_write};
use gpu_dra_driver::slices::{ServerRules, SliceBuilder, SliceError};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::time::Instant;

/// How many times one slice write is retried after 409s before the sync
/// gives up and backs off.
const CONFLICT_RETRIES: usize = 5;

/// What to publish and how patiently.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    pub node: NodeName,
    pub driver: DriverName,
    /// Full re-sync period even when nothing is seen to change.
    pub resync: Duration,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// XIDs that leave a GPU allocatable besides NVIDIA's application ones.
    pub additional_ignored_xids: Vec<u32>,
    /// What the slices show of the gates (`ConsumableCapacity`: shareable GPUs).
    pub gates: FeatureGates,
    /// NVIDIA's `--consumable-shares` mode (with its gate).
    pub consumable_shares: gpu_dra_driver::slices::consumable_shares::SharesMode,
    /// The `timeoutSeconds` of the slice watch: below the client's read
    /// timeout, so a quiet watch ends cleanly and resumes
    /// (`ApiTimeouts::watch_timeout_seconds`).
    pub watch_timeout_seconds: u32,
    /// What the slices hold: the GPUs, or the node's ComputeDomain devices.
    pub kind: SliceKind,
}

/// Which driver's devices a publisher publishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SliceKind {
    #[default]
    Gpus,
    /// `compute-domain.nvidia.com`: a channel and a daemon device when the
    /// node's GPUs are in a fabric clique.
    ComputeDomains,
}

impl PublisherConfig {
    pub fn new(node: NodeName, driver: DriverName) -> Self {
        Self {
            node,
            driver,
            resync: Duration::from_secs(300),
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            additional_ignored_xids: Vec::new(),
            gates: FeatureGates::default(),
            consumable_shares: Default::default(),
            watch_timeout_seconds: gpu_dra_driver::service::kube_client::ApiTimeouts::default().watch_timeout_seconds(),
            kind: SliceKind::Gpus,
        }
    }

    /// `spec.nodeName=<node>,spec.driver=<driver>`.
    pub fn field_selector(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.node, self.driver)
    }
}

/// Told about each publish outcome (metrics hook; grpc's metrics implement it).
pub trait PublishObserver: Send + Sync {
    /// The slices on the server match the inventory.
    fn published(&self, devices: usize, generation: i64);
    /// A sync failed; it is retried after a backoff.
    fn failed(&self, error: &PublishError);
    /// One slice write was sent to the server.
    fn wrote(&self, _op: SliceWrite) {}
    /// The server was found to drop (`served: false`) or to keep a gated
    /// field.
    fn field_served(&self, _field: GatedField, _served: bool) {}
}

/// A write of one ResourceSlice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SliceWrite {
    Create,
    Update,
    Delete,
}

impl SliceWrite {
    pub fn as_str(self) -> &'static str {
        match self {
            SliceWrite::Create => "create",
            SliceWrite::Update => "update",
            SliceWrite::Delete => "delete",
        }
    }
}

/// The publisher's state for `/readyz` and metrics.
#[derive(Default)]
pub struct PublishStatus {
    published: AtomicBool,
    devices: AtomicUsize,
    generation: AtomicI64,
    observer: Option<Arc<dyn PublishObserver>>,
}

impl PublishStatus {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_observer(observer: Arc<dyn PublishObserver>) -> Self {
        Self { observer: Some(observer), ..Self::default() }
    }

    /// Whether the last sync succeeded (ready to be scheduled onto).
    pub fn is_published(&self) -> bool {
        self.published.load(Ordering::Acquire)
    }

    /// Devices in the published slices.
    pub fn published_devices(&self) -> usize {
        self.devices.load(Ordering::Acquire)
    }

    /// The pool generation last published.
    pub fn generation(&self) -> i64 {
        self.generation.load(Ordering::Acquire)
    }

    fn set_published(&self, devices: usize, generation: i64) {
        self.devices.store(devices, Ordering::Release);
        self.generation.store(generation, Ordering::Release);
        self.published.store(true, Ordering::Release);
        if let Some(o) = &self.observer {
            o.published(devices, generation);
        }
    }

    fn set_failed(&self, error: &PublishError) {
        self.published.store(false, Ordering::Release);
        if let Some(o) = &self.observer {
            o.failed(error);
        }
    }

    fn wrote(&self, op: SliceWrite) {
        if let Some(o) = &self.observer {
            o.wrote(op);
        }
    }

    fn field_served(&self, field: GatedField, served: bool) {
        if let Some(o) = &self.observer {
            o.field_served(field, served);
        }
    }
}

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("building the node's ResourceSlices: {0}")]
    Build(#[from] SliceError),
    #[error("listing ResourceSlices with {selector}: {}", gpu_dra_driver::service::api_call::describe(error))]
    List { selector: String, error: kube::Error },
    #[error("{action} ResourceSlice {slice}: {}", gpu_dra_driver::service::api_call::describe(error))]
    Write { action: &'static str, slice: String, error: kube::Error },
    #[error("ResourceSlice {0} kept changing under us ({CONFLICT_RETRIES} conflicts in a row)")]
    Conflicts(String),
}

/// Publishes until every inventory sender is gone. The entry point the
/// `run` command spawns.
pub async fn run(
    client: kube::Client,
    config: PublisherConfig,
    inventory: watch::Receiver<Arc<Inventory>>,
    status: Arc<PublishStatus>,
) {
    Publisher::new(client, config, status).run(inventory).await
}

struct Publisher {
    client: kube::Client,
    /// The server's version was asked for (its rules are in `builder`).
    server_known: bool,
    api: Api<ResourceSlice>,
    config: PublisherConfig,
    builder: SliceBuilder,
    status: Arc<PublishStatus>,
    /// The inventory, and the dropped fields that withhold devices, that the
    /// current generation describes.
    target: Option<(Arc<Inventory>, NotServed)>,
    generation: i64,
    /// What the last sync wanted on the server, by slice name.
    desired: BTreeMap<String, ResourceSliceSpec>,
    /// The gated fields this server was seen to drop.
    not_served: NotServed,
    /// The server's minor release, once known (for what we log).
    server_minor: Option<u32>,
    nodes: Api<Node>,
    /// The Node as the slices' owner, so the garbage collector removes them
    /// with the Node (as NVIDIA's and the Go helper's slices are owned).
    owner: Option<OwnerReference>,
}

impl Publisher {
    fn new(client: kube::Client, config: PublisherConfig, status: Arc<PublishStatus>) -> Self {
        let builder = SliceBuilder::new(config.driver.clone(), config.node.clone())
            .ignoring_xids(config.additional_ignored_xids.iter().copied())
            .with_gates(config.gates)
            .with_consumable_shares(config.gates, config.consumable_shares);
        Self {
            api: Api::all(client.clone()),
            nodes: Api::all(client.clone()),
            client,
            server_known: false,
            owner: None,
            config,
            builder,
            status,
            target: None,
            generation: 0,
            desired: BTreeMap::new(),
            not_served: NotServed::none(),
            server_minor: None,
        }
    }

    async fn run(mut self, mut inventory: watch::Receiver<Arc<Inventory>>) {
        let watch_config =
            watcher::Config::default().fields(&self.config.field_selector()).timeout(self.config.watch_timeout_seconds);
        let mut events = watcher(self.api.clone(), watch_config).default_backoff().boxed();
        let mut dirty = true;
        let mut backoff = self.config.min_backoff;
        let mut retry_at = Instant::now();
        let mut resync_at = Instant::now() + self.config.resync;
        loop {
            if dirty && Instant::now() >= retry_at {
                let current = inventory.borrow_and_update().clone();
                match self.sync(&current).await {
                    Ok(devices) => {
                        dirty = false;
                        backoff = self.config.min_backoff;
                        resync_at = Instant::now() + self.config.resync;
                        self.status.set_published(devices, self.generation);
                        tracing::info!(devices, generation = self.generation, "ResourceSlices published");
                        // Building the slices is the agent's largest burst.
                        crate::heap::release_free_pages();
                    }
                    Err(error) => {
                        tracing::warn!(%error, retry_in = ?backoff, "publishing ResourceSlices failed");
                        self.status.set_failed(&error);
                        retry_at = Instant::now() + backoff;
                        backoff = (backoff * 2).min(self.config.max_backoff);
                    }
                }
                continue;
            }
            tokio::select! {
                changed = inventory.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    dirty = true;
                }
                event = events.next() => match event {
                    Some(Ok(event)) => dirty |= self.drifted(&event),
                    Some(Err(error)) => tracing::debug!(%error, "watching ResourceSlices"),
                    None => {
                        let watch_config = watcher::Config::default()
            .fields(&self.config.field_selector())
            .timeout(self.config.watch_timeout_seconds);
                        events = watcher(self.api.clone(), watch_config).default_backoff().boxed();
                    }
                },
                _ = tokio::time::sleep_until(retry_at), if dirty => {}
                _ = tokio::time::sleep_until(resync_at) => {
                    dirty = true;
                    resync_at = Instant::now() + self.config.resync;
                }
            }
        }
    }

    /// Whether a watch event shows the server away from what we published.
    fn drifted(&self, event: &watcher::Event<ResourceSlice>) -> bool {
        match event {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) => s
                .metadata
                .name
                .as_ref()
                .and_then(|n| self.desired.get(n))
                .is_none_or(|d| !as_published(&s.spec, d, &self.not_served)),
            watcher::Event::Delete(_) => true,
            // A re-list may have missed deletions: compare after it.
            watcher::Event::InitDone => true,
            watcher::Event::Init => false,
        }
    }

    /// One pass; returns the number of devices published.
    async fn sync(&mut self, inventory: &Arc<Inventory>) -> Result<usize, PublishError> {
        if !self.server_known {
            self.server_known = true;
            match self.client.apiserver_version().await {
                Ok(info) => {
                    let rules = server_rules(&info.minor);
                    tracing::info!(version = %info.git_version, minor = rules.minor, "publishing for this server's rules");
                    self.server_minor = Some(rules.minor);
                    self.builder = self.builder.clone().for_server(rules);
                }
                Err(error) => {
                    tracing::warn!(
                        error = %gpu_dra_driver::service::api_call::describe(&error),
                        "the server's version is unknown: publishing for Kubernetes 1.34's rules"
                    )
                }
            }
        }
        // Each round that learns of a dropped field publishes again without
        // it. Fields are few and each is learned once, so this ends; should
        // a server keep flipping (slices stored under different gates), the
        // last round stands and the watch's next difference syncs again.
        for _ in 0..GatedField::ALL.len() {
            if let Some(devices) = self.publish(inventory).await? {
                return Ok(devices);
            }
        }
        self.publish(inventory).await.map(|devices| devices.unwrap_or_else(|| self.published_devices()))
    }

    /// Devices in what the last round wanted published.
    fn published_devices(&self) -> usize {
        self.desired.values().map(|s| s.devices.as_ref().map_or(0, Vec::len)).sum()
    }

    /// Lists, then creates, replaces and deletes slices until the server
    /// holds what the inventory says; `None` when a write showed the server
    /// dropping a field we did not know it drops (publish again).
    async fn publish(&mut self, inventory: &Arc<Inventory>) -> Result<Option<usize>, PublishError> {
        let selector = self.config.field_selector();
        let existing = self
            .api
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|error| PublishError::List { selector: selector.clone(), error })?
            .items;
        let withheld = withholding(&self.not_served);
        if self.target.as_ref().is_none_or(|(i, w)| **i != **inventory || *w != withheld) {
            self.generation = self.next_generation(inventory, &existing)?;
            self.target = Some((inventory.clone(), withheld));
        }
        self.resolve_owner().await;
        let mut desired = match self.config.kind {
            SliceKind::Gpus => self.builder.clone().serving(&self.not_served).build(inventory, self.generation)?,
            SliceKind::ComputeDomains => {
                let clique = gpu_dra_driver::compute_domain::devices::node_clique(inventory).unwrap_or_else(|error| {
                    tracing::warn!(%error, "publishing no ComputeDomain devices");
                    None
                });
                vec![gpu_dra_driver::compute_domain::devices::slice(
                    self.config.node.as_str(),
                    clique.as_deref(),
                    self.generation,
                )]
            }
        };
        if let Some(owner) = &self.owner {
            for slice in &mut desired {
                slice.metadata.owner_references = Some(vec![owner.clone()]);
            }
        }
        self.desired = desired.iter().filter_map(|s| Some((s.metadata.name.clone()?, s.spec.clone()))).collect();
        let mut by_name: BTreeMap<String, ResourceSlice> =
            existing.into_iter().filter_map(|s| Some((s.metadata.name.clone()?, s))).collect();
        for slice in &desired {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let current = by_name.remove(&name);
            if let Some(verdict) = self.write(slice, &name, current).await?
                && self.learn(&name, &verdict)
            {
                return Ok(None);
            }
        }
        for name in by_name.into_keys() {
            self.status.wrote(SliceWrite::Delete);
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(slice = %name, "deleted a ResourceSlice the inventory no longer has"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => return Err(PublishError::Write { action: "deleting", slice: name, error }),
            }
        }
        Ok(Some(desired.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum()))
    }

    /// Takes in what a write's answer says of the gated fields; whether the
    /// slices must be built again (a field that withholds devices is newly
    /// known dropped, or served again). Each change is logged once and shown
    /// in the metric.
    fn learn(&mut self, slice: &str, verdict: &WriteVerdict) -> bool {
        let before = withholding(&self.not_served);
        for &field in &verdict.dropped {
            if self.not_served.insert(field) {
                self.status.field_served(field, false);
                let release = self.server_minor.map_or_else(|| "unknown".to_string(), |m| format!("1.{m}"));
                tracing::warn!(
                    slice,
                    field = field.name(),
                    gate = field.gate(),
                    kubernetes = %release,
                    "{}",
                    not_served_message(field, self.server_minor, &self.config)
                );
            }
        }
        for &field in &verdict.served {
            if self.not_served.remove(field) {
                self.status.field_served(field, true);
                tracing::info!(slice, field = field.name(), gate = field.gate(), "the API server now keeps this field");
            }
        }
        withholding(&self.not_served) != before
    }

    /// Looks the Node up once; without it (not created yet, or no RBAC to
    /// read it) slices are published unowned and the lookup is retried on
    /// the next sync.
    async fn resolve_owner(&mut self) {
        if self.owner.is_some() {
            return;
        }
        match self.nodes.get_opt(self.config.node.as_str()).await {
            Ok(Some(node)) => {
                self.owner = node.metadata.uid.map(|uid| OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.config.node.to_string(),
                    uid,
                    controller: Some(true),
                    block_owner_deletion: None,
                });
            }
            Ok(None) => tracing::debug!(node = %self.config.node, "Node not found; publishing slices without owner"),
            Err(error) => tracing::debug!(%error, "cannot read the Node; publishing slices without owner"),
        }
    }

    /// The generation for a new inventory: on the first sync, adopt the
    /// server's generation if its slices already say exactly this (a plugin
    /// restart with nothing changed); otherwise one above anything seen.
    fn next_generation(&self, inventory: &Inventory, existing: &[ResourceSlice]) -> Result<i64, PublishError> {
        let server_max = existing.iter().map(|s| s.spec.pool.generation).max();
        if self.target.is_none()
            && let Some(generation) = server_max
        {
            let same = self.builder.clone().serving(&self.not_served).build(inventory, generation)?;
            let unchanged = same.len() == existing.len()
                && same.iter().all(|d| {
                    existing
                        .iter()
                        .any(|e| e.metadata.name == d.metadata.name && as_published(&e.spec, &d.spec, &self.not_served))
                });
            if unchanged {
                return Ok(generation);
            }
        }
        Ok(self.generation.max(server_max.unwrap_or(0)) + 1)
    }

    /// Creates or replaces one slice, re-reading and retrying on 409;
    /// what the server's answer says of the gated fields (`None`: nothing
    /// written, the server already held it).
    async fn write(
        &self,
        desired: &ResourceSlice,
        name: &str,
        mut current: Option<ResourceSlice>,
    ) -> Result<Option<WriteVerdict>, PublishError> {
        let err = |action, error| PublishError::Write { action, slice: name.to_string(), error };
        for _ in 0..CONFLICT_RETRIES {
            let result = match &current {
                Some(cur)
                    if as_published(&cur.spec, &desired.spec, &self.not_served)
                        && cur.metadata.owner_references == desired.metadata.owner_references =>
                {
                    return Ok(None);
                }
                Some(cur) => {
                    let mut next = desired.clone();
                    next.metadata.resource_version = cur.metadata.resource_version.clone();
                    self.status.wrote(SliceWrite::Update);
                    self.api.replace(name, &PostParams::default(), &next).await.map_err(|e| ("updating", e))
                }
                None => {
                    self.status.wrote(SliceWrite::Create);
                    self.api.create(&PostParams::default(), desired).await.map_err(|e| ("creating", e))
                }
            };
            match result {
                Ok(written) => return Ok(Some(judge_write(&desired.spec, &written.spec))),
                // 409: AlreadyExists on create or Conflict on a stale
                // resourceVersion. Re-read and try again.
                Err((_, kube::Error::Api(s))) if s.code == 409 => {
                    current = self.api.get_opt(name).await.map_err(|e| err("reading", e))?;
                }
                // Deleted between list and update: create it.
                Err(("updating", kube::Error::Api(s))) if s.code == 404 => current = None,
                Err((action, error)) => return Err(err(action, error)),
            }
        }
        Err(PublishError::Conflicts(name.to_string()))
    }
}

/// The dropped fields that change what the slice builder publishes (it
/// withholds the devices they would have kept from misuse); the others only
/// change how the server's copy is compared.
fn withholding(not_served: &NotServed) -> NotServed {
    let mut out = NotServed::none();
    for field in not_served.iter().filter(|f| matches!(f, GatedField::Taints | GatedField::SharedCounters)) {
        out.insert(field);
    }
    out
}

/// What a dropped field means for this node and how to serve it, said once.
fn not_served_message(field: GatedField, minor: Option<u32>, config: &PublisherConfig) -> String {
    let release = minor.map_or_else(|| "this Kubernetes release".to_string(), |m| format!("Kubernetes 1.{m}"));
    let default = match field.served_by_default_from() {
        Some(from) => format!("on by default from 1.{from}"),
        None => "alpha, off by default".to_string(),
    };
    let cause = format!(
        "the API server ({release}) drops the ResourceSlice field {} because its feature gate {} is off ({default})",
        field.name(),
        field.gate()
    );
    let turn_on = format!("turn the {} feature gate on on the API server and the scheduler", field.gate());
    match field {
        GatedField::Taints => format!(
            "{cause}: faulty GPUs are left out of the slices until they recover, rather than published tainted \
             (untainted, a claim could be given one); to publish them tainted, {turn_on}"
        ),
        GatedField::AllowMultipleAllocations | GatedField::RequestPolicy => {
            let setting =
                if config.gates.enabled(Gate::ConsumableShares) && config.consumable_shares != SharesMode::Disabled {
                    format!("--consumable-shares={} (ConsumableShares)", config.consumable_shares)
                } else if config.gates.enabled(Gate::ConsumableCapacity) {
                    "ConsumableCapacity".to_string()
                } else {
                    "this plugin's settings".to_string()
                };
            format!(
                "{cause}: the devices {setting} publishes for sharing are whole devices to this cluster, one claim \
                 each (a second replica does not schedule on the same GPU); fix: {turn_on}, or share one \
                 ResourceClaim between the pods (a GPU sharing config: time-slicing or MPS)"
            )
        }
        GatedField::SharedCounters => format!(
            "{cause}: dynamic MIG devices are left out of the slices (without counters, overlapping MIG devices \
             could be allocated together); fix: {turn_on}, or turn this driver's DynamicMIG off"
        ),
        GatedField::BindingConditions | GatedField::ListAttributes | GatedField::NodeAllocatableResources => {
            format!("{cause}: the scheduler does not see it; fix: {turn_on}")
        }
    }
}

/// The rules of a server whose `/version` says `minor` (`"35"`, or `"35+"`
/// from managed clusters); older or unreadable ones get 1.34's.
fn server_rules(minor: &str) -> ServerRules {
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    let minor = digits.parse::<u32>().unwrap_or(ServerRules::STRICTEST.minor);
    ServerRules { minor: minor.max(ServerRules::STRICTEST.minor) }
}

/// Whether the server's copy of a slice says what we published: equal but
/// for what the server fills in on every write (a taint's `timeAdded`,
/// ResourceSlice strategy's defaulting) and for the fields it drops
/// (`not_served`, on both sides: a server keeps a gated field an older copy
/// already used). Compared exactly, a tainted slice would look changed after
/// every write and be rewritten forever, and a restarted plugin would never
/// keep its generation.
fn as_published(server: &ResourceSliceSpec, desired: &ResourceSliceSpec, not_served: &NotServed) -> bool {
    if server == desired {
        return true;
    }
    let (mut server, desired) = (not_served.strip(server), not_served.strip(desired));
    for (device, wanted) in server.devices.iter_mut().flatten().zip(desired.devices.iter().flatten()) {
        for (taint, wanted) in device.taints.iter_mut().flatten().zip(wanted.taints.iter().flatten()) {
            if wanted.time_added.is_none() {
                taint.time_added = None;
            }
        }
    }
    server == desired
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taint_the_server_stamped_is_what_we_published() {
        use k8s_openapi::api::resource::v1::{Device, DeviceTaint};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let spec = |time: Option<Time>, effect: &str| ResourceSliceSpec {
            devices: Some(vec![Device {
                name: "gpu-0".into(),
                taints: Some(vec![DeviceTaint {
                    key: "gpu.nvidia.com/xid".into(),
                    value: Some("79".into()),
                    effect: effect.into(),
                    time_added: time,
                }]),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let stamped = Some(Time("2026-11-26T10:00:00Z".parse().unwrap()));
        let all = NotServed::none();
        assert!(as_published(&spec(stamped.clone(), "NoSchedule"), &spec(None, "NoSchedule"), &all));
        assert!(!as_published(&spec(stamped.clone(), "NoExecute"), &spec(None, "NoSchedule"), &all), "a real change");
        assert!(!as_published(&spec(None, "NoSchedule"), &spec(stamped, "NoSchedule"), &all), "a time we set is ours");
    }

    #[test]
    fn server_rules_come_from_the_minor_version() {
        assert_eq!(server_rules("35").minor, 35);
        assert_eq!(server_rules("36+").minor, 36);
        assert_eq!(server_rules("").minor, 34);
        assert_eq!(server_rules("20").minor, 34, "older servers get the strictest rules");
        assert!(!server_rules("34").taint_effect_none() && server_rules("35").taint_effect_none());
    }

    fn device(name: &str) -> k8s_openapi::api::resource::v1::Device {
        k8s_openapi::api::resource::v1::Device { name: name.into(), ..Default::default() }
    }

    fn tainted(name: &str) -> k8s_openapi::api::resource::v1::Device {
        k8s_openapi::api::resource::v1::Device {
            taints: Some(vec![k8s_openapi::api::resource::v1::DeviceTaint {
                key: "gpu.nvidia.com/xid".into(),
                value: Some("43".into()),
                effect: "None".into(),
                time_added: None,
            }]),
            ..device(name)
        }
    }

    fn devices(devices: Vec<k8s_openapi::api::resource::v1::Device>) -> ResourceSliceSpec {
        ResourceSliceSpec { devices: Some(devices), ..Default::default() }
    }

    #[test]
    fn a_field_the_server_drops_is_no_difference_once_known() {
        let desired = devices(vec![device("gpu-0"), tainted("gpu-1")]);
        let stored = devices(vec![device("gpu-0"), device("gpu-1")]);
        assert!(!as_published(&stored, &desired, &NotServed::none()), "unknown, it is a difference");
        let taints_dropped = NotServed::by_default_on(35);
        assert!(as_published(&stored, &desired, &taints_dropped));
        // A server keeps a gated field that its stored copy already used.
        assert!(as_published(&desired, &devices(vec![device("gpu-0"), device("gpu-1")]), &taints_dropped));
        assert!(
            !as_published(&stored, &devices(vec![device("gpu-0")]), &taints_dropped),
            "a device withheld is a real change"
        );
    }

    #[test]
    fn what_is_said_of_dropped_shares_names_the_cause_and_the_fix() {
        let mut config = PublisherConfig::new(NodeName::new("n").unwrap(), DriverName::nvidia_default());
        config.gates = FeatureGates::default().with(Gate::ConsumableShares, true);
        config.consumable_shares = SharesMode::Memory;
        let text = not_served_message(GatedField::AllowMultipleAllocations, Some(34), &config);
        assert!(text.contains("Kubernetes 1.34") && text.contains("allowMultipleAllocations"), "{text}");
        assert!(text.contains("turn the DRAConsumableCapacity feature gate on on the API server and the scheduler"));
        assert!(text.contains("--consumable-shares=memory") && !text.contains("turn this driver's"), "{text}");
        let taints = not_served_message(GatedField::Taints, Some(34), &config);
        assert!(taints.contains("DRADeviceTaints") && taints.contains("left out of the slices"), "{taints}");
    }
}
