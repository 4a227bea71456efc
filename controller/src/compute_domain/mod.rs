//! The ComputeDomain reconciler of `gpu-dra-controller run
//! --compute-domains`: for each domain its workload ResourceClaimTemplate,
//! its status, its finalizer and its explanations ([`plan`] decides; this
//! module watches and writes).
//!
//! It watches domains, the domains' templates and claims (by the
//! `resource.nvidia.com/computeDomain` label the template puts on its
//! claims), the `compute-domain.nvidia.com` slices (each node's clique) and
//! Nodes (their addresses) into reflector stores, and while this replica
//! leads, plans every domain each pass and carries out what differs.
//! Domains are decoded one at a time ([`decoded_watch`]): one the code
//! cannot hold is left out and explained by a Warning Event on itself,
//! and the others are reconciled.
//! Nothing it writes needs a node agent: a domain is released when its
//! template is gone, whatever claims or agents remain.

pub mod plan;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use gpu_dra_driver::compute_domain::api::ComputeDomain;
use gpu_dra_driver::compute_domain::binding::with_binding_failure;
use gpu_dra_driver::compute_domain::devices::slice_clique;
use gpu_dra_driver::compute_domain::{DOMAIN_LABEL, DRIVER_NAME, FINALIZER};
use gpu_dra_driver::service::decoded_watch::{self, Decoder, Rejection, Rejections};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;

use crate::events::{EventWriter, Regarding, Verdict};
use crate::leadership::{WriteError, Writes};
use plan::{ChannelClaim, Inputs, NodeFacts, Plan, RefusedBinding, TemplateAction};

/// How often the reconciler plans every domain.
const PASS: Duration = Duration::from_millis(500);

struct Stores {
    domains: Store<ComputeDomain>,
    /// Domains that do not decode (left out of `domains`).
    rejected: Rejections,
    templates: Store<ResourceClaimTemplate>,
    claims: Store<ResourceClaim>,
    slices: Store<ResourceSlice>,
    nodes: Store<Node>,
}

fn watch<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config).default_backoff().reflect(writer).touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Err(error) = item {
                tracing::warn!(%error, "compute-domain watch failed; retrying");
            }
        }
    });
    reader
}

/// The domains, each decoded on its own; one that does not is counted in
/// `rejected_total` and left out.
fn watch_domains(client: &Client, rejected: &Rejections, rejected_total: Counter) -> Store<ComputeDomain> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &decoded_watch::api_resource::<ComputeDomain>());
    let mut decoder = Decoder::<ComputeDomain>::new(
        rejected.clone(),
        Box::new(move |_| {
            rejected_total.inc();
        }),
    );
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |item| std::future::ready(item.map(|e| decoder.decode(e)).transpose()))
        .reflect(writer)
        .touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Err(error) = item {
                tracing::warn!(%error, "ComputeDomain watch failed; retrying");
            }
        }
    });
    reader
}

/// Runs until the process ends; `rejected_total` counts domains found
/// undecodable.
pub async fn run(client: Client, writes: Writes, events: EventWriter, rejected_total: Counter) {
    let rejected = Rejections::default();
    let stores = Stores {
        domains: watch_domains(&client, &rejected, rejected_total),
        rejected,
        templates: watch(Api::all(client.clone()), watcher::Config::default().labels(DOMAIN_LABEL)),
        claims: watch(Api::all(client.clone()), watcher::Config::default().labels(DOMAIN_LABEL)),
        slices: watch(
            Api::all(client.clone()),
            watcher::Config::default().fields(&format!("spec.driver={DRIVER_NAME}")),
        ),
        nodes: watch(Api::all(client.clone()), watcher::Config::default()),
    };
    for ready in [
        stores.domains.wait_until_ready().await,
        stores.templates.wait_until_ready().await,
        stores.claims.wait_until_ready().await,
        stores.slices.wait_until_ready().await,
        stores.nodes.wait_until_ready().await,
    ] {
        if ready.is_err() {
            tracing::error!("a compute-domain watch ended before its first list; ComputeDomains are not reconciled");
            return;
        }
    }
    tracing::info!("reconciling ComputeDomains");
    let mut reconciler =
        Reconciler { client, writes, events, explained_rejections: HashSet::new(), binding_failures: HashMap::new() };
    loop {
        if reconciler.writes.leadership.is_leading() {
            reconciler.pass(&stores).await;
        }
        tokio::time::sleep(PASS).await;
    }
}

struct Reconciler {
    client: Client,
    writes: Writes,
    events: EventWriter,
    /// Undecodable domains given an Event, to forget once they are gone.
    explained_rejections: HashSet<Regarding>,
    /// The last error failing a channel's binding, by claim (logged once).
    binding_failures: HashMap<String, String>,
}

fn regarding(namespace: &str, name: &str, uid: &str) -> Regarding {
    Regarding {
        api_version: gpu_dra_driver::compute_domain::api::API_VERSION,
        kind: gpu_dra_driver::compute_domain::api::KIND,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
    }
}

/// Each node's address and clique.
fn node_facts(stores: &Stores) -> (BTreeMap<String, NodeFacts>, BTreeMap<String, usize>) {
    let mut facts: BTreeMap<String, NodeFacts> = BTreeMap::new();
    for node in stores.nodes.state() {
        let addresses = node.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default();
        let address = addresses
            .iter()
            .find(|a| a.type_ == "InternalIP")
            .or_else(|| addresses.iter().find(|a| a.type_.ends_with("IP")))
            .map(|a| a.address.clone());
        facts.entry(node.metadata.name.clone().unwrap_or_default()).or_default().address = address;
    }
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    for slice in stores.slices.state() {
        let (Some(node), Some(clique)) = (slice.spec.node_name.as_ref(), slice_clique(&slice)) else { continue };
        facts.entry(node.clone()).or_default().clique = Some(clique.to_owned());
        *sizes.entry(clique.to_owned()).or_default() += 1;
    }
    (facts, sizes)
}

impl Reconciler {
    /// One Warning Event on each undecodable domain (the writer keeps it
    /// once written); an Event of one gone is forgotten.
    async fn explain_rejected(&mut self, rejected: &[Rejection]) {
        let mut now = HashSet::new();
        for rejection in rejected {
            let about = regarding(&rejection.namespace, &rejection.name, &rejection.uid);
            let note = rejection
                .note(gpu_dra_driver::compute_domain::api::KIND, gpu_dra_driver::compute_domain::api::UNDECODABLE_FIX);
            let verdict = Verdict { reason: rejection.reason(), note };
            if let Err(error) = self.events.ensure(&about, &verdict).await
                && !matches!(error, WriteError::NotLeading)
            {
                tracing::warn!(%error, domain = %rejection.object("ComputeDomain"), "explaining an undecodable ComputeDomain failed; retrying");
            }
            now.insert(about);
        }
        let gone: Vec<Regarding> = self.explained_rejections.difference(&now).cloned().collect();
        for about in gone {
            if self.events.clear(&about).await.is_ok() {
                self.explained_rejections.remove(&about);
            }
        }
        self.explained_rejections.extend(now);
    }

    async fn pass(&mut self, stores: &Stores) {
        self.explain_rejected(&stores.rejected.current()).await;
        let (nodes, clique_sizes) = node_facts(stores);
        let mut channels: BTreeMap<String, Vec<ChannelClaim>> = BTreeMap::new();
        for claim in stores.claims.state() {
            if let Some(channel) = ChannelClaim::of(&claim) {
                channels.entry(channel.domain_id.clone()).or_default().push(channel);
            }
        }
        let templates = stores.templates.state();
        for domain in stores.domains.state() {
            let uid = plan::domain_uid(&domain).to_owned();
            let namespace = domain.metadata.namespace.clone().unwrap_or_default();
            let template_name = domain.spec.channel.as_ref().map(|c| c.resource_claim_template.name.as_str());
            let template = templates
                .iter()
                .find(|t| {
                    t.metadata.namespace.as_deref() == Some(namespace.as_str())
                        && t.metadata.name.as_deref() == template_name
                })
                .map(Arc::as_ref);
            let mine = channels.get(&uid).map(Vec::as_slice).unwrap_or_default();
            // A template of another owner carries no label: ask the server.
            let foreign = match (template, template_name) {
                (None, Some(name)) => self.foreign_template(&namespace, name).await,
                _ => None,
            };
            let mut plan = plan::plan(&Inputs {
                domain: &domain,
                template: template.or(foreign.as_ref()),
                channels: mine,
                nodes: &nodes,
                clique_sizes: &clique_sizes,
            });
            for refused in std::mem::take(&mut plan.refused_bindings) {
                self.refuse_binding(stores, &refused).await;
            }
            if let Err(error) = self.carry_out(&domain, plan).await
                && !matches!(error, WriteError::NotLeading)
                && !error.is_conflict()
            {
                let name = domain.metadata.name.as_deref().unwrap_or_default();
                tracing::warn!(%error, domain = %format!("{namespace}/{name}"), "ComputeDomain write failed; retrying");
            }
        }
    }

    /// Fails the binding of a channel on a node that cannot join its
    /// domain (the claim's `status.devices`, written as the driver's
    /// controller). A failed write is retried next pass and logged once
    /// per claim until its error changes.
    async fn refuse_binding(&mut self, stores: &Stores, refused: &RefusedBinding) {
        let claim = stores.claims.state().into_iter().find(|c| {
            c.metadata.namespace.as_deref() == Some(refused.namespace.as_str())
                && c.metadata.name.as_deref() == Some(refused.name.as_str())
        });
        let Some(edited) = claim.and_then(|c| with_binding_failure(&c, &refused.node, &refused.reason)) else { return };
        let key = format!("{}/{}", refused.namespace, refused.name);
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &refused.namespace);
        match self.writes.run(api.replace_status(&refused.name, &PostParams::default(), &edited)).await {
            Ok(_) => {
                self.binding_failures.remove(&key);
                tracing::info!(
                    claim = key,
                    node = refused.node,
                    reason = refused.reason,
                    "failed the binding of a channel on a node that cannot join its ComputeDomain"
                );
            }
            Err(WriteError::NotLeading) => {}
            Err(error) if error.is_conflict() => {}
            Err(error) => {
                let text = error.to_string();
                if self.binding_failures.insert(key.clone(), text.clone()).as_ref() != Some(&text) {
                    tracing::warn!(
                        claim = key,
                        error = text,
                        "cannot fail the binding of a channel on a node outside its ComputeDomain; retrying every pass, logged again only if the error changes"
                    );
                }
            }
        }
    }

    async fn foreign_template(&self, namespace: &str, name: &str) -> Option<ResourceClaimTemplate> {
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), namespace);
        self.writes.read(api.get_opt(name)).await.ok().flatten()
    }

    async fn carry_out(&mut self, domain: &ComputeDomain, plan: Plan) -> Result<(), WriteError> {
        let namespace = domain.metadata.namespace.clone().unwrap_or_default();
        let name = domain.metadata.name.clone().unwrap_or_default();
        let api: Api<ComputeDomain> = Api::namespaced(self.client.clone(), &namespace);
        let mut current = domain.clone();
        if plan.add_finalizer {
            current.metadata.finalizers.get_or_insert_default().push(FINALIZER.to_owned());
            current = self.writes.run(api.replace(&name, &PostParams::default(), &current)).await?;
        }
        match &plan.template {
            TemplateAction::Keep => {}
            TemplateAction::Create(template) => {
                let templates: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), &namespace);
                match self.writes.run(templates.create(&PostParams::default(), template)).await {
                    Ok(_) => {
                        tracing::info!(domain = %name, template = ?template.metadata.name, "created the workload template")
                    }
                    Err(error) if error.is_conflict() => {}
                    Err(error) => return Err(error),
                }
            }
            TemplateAction::Delete { namespace, name: template } => {
                let templates: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), namespace);
                match self.writes.run(templates.delete(template, &DeleteParams::default())).await {
                    Ok(_) => {}
                    Err(error) if error.is_not_found() => {}
                    Err(error) => return Err(error),
                }
            }
        }
        if let Some(status) = plan.status {
            current.status = Some(status);
            current = self.writes.run(api.replace_status(&name, &PostParams::default(), &current)).await?;
        }
        let regarding = regarding(&namespace, &name, plan::domain_uid(domain));
        if plan.problems.is_empty() || plan.remove_finalizer {
            self.events.clear(&regarding).await?;
        } else {
            let note: Vec<String> = plan.problems.iter().map(plan::Problem::note).collect();
            let verdict = Verdict { reason: plan.problems[0].reason(), note: note.join("; ") };
            self.events.ensure(&regarding, &verdict).await?;
        }
        if plan.remove_finalizer {
            current.metadata.finalizers.get_or_insert_default().retain(|f| f != FINALIZER);
            self.writes.run(api.replace(&name, &PostParams::default(), &current)).await?;
            tracing::info!(domain = %name, "released the deleted ComputeDomain");
        }
        Ok(())
    }
}
