//! What one ComputeDomain needs, decided from what the cluster shows: its
//! workload ResourceClaimTemplate, its status (each node's address, clique,
//! index and IMEX readiness; the domain Ready or NotReady), the finalizer,
//! and what to explain when the domain cannot be what it asks. Pure: the
//! reconciler gathers the inputs and carries the plan out.
//!
//! A node joins the domain when a channel claim of the domain is allocated
//! on it (the workload's pods landed there); it leaves when no such claim
//! remains. Its IMEX daemon's readiness is what the node agent reports on
//! that claim (`status.devices[].conditions`, type `Ready`).

use std::collections::{BTreeMap, BTreeSet};

use gpu_dra_driver::compute_domain::api::{
    AllocationMode, ChannelConfig, ComputeDomain, ComputeDomainNode, ComputeDomainStatus, DomainConfig, Readiness,
    decode_config,
};
use gpu_dra_driver::compute_domain::binding;
use gpu_dra_driver::compute_domain::{CHANNEL_CLASS, DOMAIN_LABEL, DRIVER_NAME, FINALIZER, MAX_NODES_PER_DOMAIN};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClaimConfiguration, DeviceRequest, ExactDeviceRequest, OpaqueDeviceConfiguration, ResourceClaim,
    ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

/// The request name in the workload template (NVIDIA's).
pub const CHANNEL_REQUEST: &str = "channel";
/// The device condition the node agent sets on a channel claim.
pub const READY_CONDITION: &str = "Ready";

/// What the reconciler knows about one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node's `InternalIP` (else first address), for the IMEX peer list.
    pub address: Option<String>,
    /// The fabric clique its compute-domain slice states.
    pub clique: Option<String>,
}

/// A channel claim of some domain, allocated on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelClaim {
    pub namespace: String,
    pub name: String,
    pub domain_id: String,
    pub node: String,
    /// The node agent's `Ready` condition on the channel device: `None`
    /// before it said anything.
    pub ready: Option<bool>,
    /// The scheduler holds the pod's binding until the node agent says the
    /// channel is ready or that it failed ([`binding::waits_for_binding`]).
    pub waiting: bool,
}

impl ChannelClaim {
    /// The claim's domain and node when it is an allocated
    /// `compute-domain.nvidia.com` channel claim; `None` otherwise.
    pub fn of(claim: &ResourceClaim) -> Option<Self> {
        let result = gpu_dra_driver::claim_status::allocation_results(claim).find(|r| r.driver == DRIVER_NAME)?;
        let configs =
            claim.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.config.as_ref()).into_iter().flatten();
        let domain_id =
            configs.filter_map(|c| c.opaque.as_ref()).filter(|o| o.driver == DRIVER_NAME).find_map(|o| {
                match decode_config("spec.devices.config", &o.parameters.0) {
                    Ok(DomainConfig::Channel(c)) => Some(c.domain_id),
                    _ => None,
                }
            })?;
        let ready = claim.status.as_ref()?.devices.iter().flatten().find_map(|d| {
            (d.driver == DRIVER_NAME && d.pool == result.pool && d.device == result.device)
                .then(|| d.conditions.iter().flatten().find(|c| c.type_ == READY_CONDITION).map(|c| c.status == "True"))
                .flatten()
        });
        Some(Self {
            namespace: claim.metadata.namespace.clone().unwrap_or_default(),
            name: claim.metadata.name.clone().unwrap_or_default(),
            domain_id,
            waiting: binding::waits_for_binding(claim, &result.pool),
            node: result.pool.clone(),
            ready,
        })
    }
}

/// Why a domain is not what it asks; each becomes a Warning Event on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Problem {
    /// `spec.channel` is missing (the CRD requires it; an older stored object may lack it).
    NoChannel,
    /// The template name is taken by a template of something else.
    TemplateTaken { name: String },
    /// Workload pods landed on nodes of other cliques than the domain's.
    OtherCliques { clique: String, outside: Vec<(String, String)> },
    /// Nodes with a channel claim that publish no clique.
    NoClique { nodes: Vec<String> },
    /// Nodes without an address for the IMEX peer list.
    NoAddress { nodes: Vec<String> },
    /// `numNodes` is more than the domain's clique has.
    CliqueTooSmall { clique: String, has: usize, wants: u32 },
    /// More nodes than one IMEX domain holds.
    TooManyNodes { wants: usize },
}

impl Problem {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoChannel => "NoChannel",
            Self::TemplateTaken { .. } => "TemplateTaken",
            Self::OtherCliques { .. } => "NodesInOtherCliques",
            Self::NoClique { .. } => "NodeWithoutClique",
            Self::NoAddress { .. } => "NodeWithoutAddress",
            Self::CliqueTooSmall { .. } => "CliqueTooSmall",
            Self::TooManyNodes { .. } => "TooManyNodes",
        }
    }

    pub fn note(&self) -> String {
        match self {
            Self::NoChannel => "spec.channel is missing: set spec.channel.resourceClaimTemplate.name".to_owned(),
            Self::TemplateTaken { name } => format!(
                "ResourceClaimTemplate {name} exists and is not this domain's (label {DOMAIN_LABEL} differs): rename spec.channel.resourceClaimTemplate.name or delete that template"
            ),
            Self::OtherCliques { clique, outside } => {
                let list: Vec<String> = outside.iter().map(|(n, c)| format!("{n} (clique {c})")).collect();
                format!(
                    "the domain's nodes share NVLink clique {clique}; {} cannot join its IMEX domain, so their channels are not prepared: keep the workload on one clique (a nodeAffinity on a clique label, or a smaller job)",
                    list.join(", ")
                )
            }
            Self::NoClique { nodes } => format!(
                "{} publish no NVLink fabric clique (no compute-domain.nvidia.com slice with cliqueID): their channels cannot join an IMEX domain",
                nodes.join(", ")
            ),
            Self::NoAddress { nodes } => {
                format!("{} have no address in status.addresses: IMEX peers cannot reach them", nodes.join(", "))
            }
            Self::CliqueTooSmall { clique, has, wants } => format!(
                "numNodes is {wants} but NVLink clique {clique} has {has} nodes: the domain can never be Ready; lower numNodes to at most {has}"
            ),
            Self::TooManyNodes { wants } => format!(
                "{wants} nodes asked; one IMEX domain holds at most {MAX_NODES_PER_DOMAIN}: split the workload into several ComputeDomains"
            ),
        }
    }
}

/// What to do with the workload template.
#[derive(Debug, Clone, PartialEq)]
pub enum TemplateAction {
    Keep,
    Create(Box<ResourceClaimTemplate>),
    Delete { namespace: String, name: String },
}

/// A channel whose pod waits for binding on a node that cannot join the
/// domain: its binding is failed with `reason`, and the scheduler places
/// the pod again rather than waiting for a daemon that will never start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedBinding {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub reason: String,
}

/// One pass's decisions for one domain.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub add_finalizer: bool,
    /// Deleting, and nothing of ours is left: let it go.
    pub remove_finalizer: bool,
    pub template: TemplateAction,
    /// The status to write, when it differs from the stored one.
    pub status: Option<ComputeDomainStatus>,
    pub problems: Vec<Problem>,
    pub refused_bindings: Vec<RefusedBinding>,
}

/// Everything the plan for `domain` reads.
pub struct Inputs<'a> {
    pub domain: &'a ComputeDomain,
    /// The template named by the domain, if one exists.
    pub template: Option<&'a ResourceClaimTemplate>,
    /// Channel claims of this domain.
    pub channels: &'a [ChannelClaim],
    pub nodes: &'a BTreeMap<String, NodeFacts>,
    /// How many nodes publish each clique.
    pub clique_sizes: &'a BTreeMap<String, usize>,
}

pub fn domain_uid(domain: &ComputeDomain) -> &str {
    domain.metadata.uid.as_deref().unwrap_or_default()
}

fn is_ours(template: &ResourceClaimTemplate, uid: &str) -> bool {
    template.metadata.labels.as_ref().and_then(|l| l.get(DOMAIN_LABEL)).is_some_and(|v| v == uid)
}

pub fn plan(inputs: &Inputs<'_>) -> Plan {
    let domain = inputs.domain;
    let uid = domain_uid(domain);
    let has_finalizer = domain.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER);
    let ours = inputs.template.filter(|t| is_ours(t, uid));
    if domain.metadata.deletion_timestamp.is_some() {
        let template = match ours {
            Some(t) if t.metadata.deletion_timestamp.is_none() => TemplateAction::Delete {
                namespace: t.metadata.namespace.clone().unwrap_or_default(),
                name: t.metadata.name.clone().unwrap_or_default(),
            },
            _ => TemplateAction::Keep,
        };
        return Plan {
            add_finalizer: false,
            remove_finalizer: has_finalizer && template == TemplateAction::Keep,
            template,
            status: None,
            problems: Vec::new(),
            refused_bindings: Vec::new(),
        };
    }
    let mut problems = Vec::new();
    let template = match (&domain.spec.channel, inputs.template) {
        (None, _) => {
            problems.push(Problem::NoChannel);
            TemplateAction::Keep
        }
        (Some(_), Some(_)) if ours.is_none() => {
            let name = domain.spec.channel.as_ref().map(|c| c.resource_claim_template.name.clone());
            problems.push(Problem::TemplateTaken { name: name.unwrap_or_default() });
            TemplateAction::Keep
        }
        (Some(_), Some(_)) => TemplateAction::Keep,
        (Some(_), None) => TemplateAction::Create(Box::new(workload_template(domain))),
    };
    let status = desired_status(inputs, &mut problems);
    let refused_bindings = refused_bindings(inputs, &status, &problems);
    let stored = domain.status.clone().unwrap_or_default();
    Plan {
        add_finalizer: !has_finalizer,
        remove_finalizer: false,
        template,
        status: (domain.status.is_none() || status != stored).then_some(status),
        problems,
        refused_bindings,
    }
}

/// The template whose claims give each workload pod a channel of the
/// domain (NVIDIA's `compute-domain-workload-claim-template`).
pub fn workload_template(domain: &ComputeDomain) -> ResourceClaimTemplate {
    let uid = domain_uid(domain);
    let channel = domain.spec.channel.clone().unwrap_or_default();
    let mode = channel.allocation_mode.unwrap_or(AllocationMode::Single);
    let parameters = serde_json::to_value(ChannelConfig::new(uid, mode)).unwrap_or_default();
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(channel.resource_claim_template.name.clone()),
            namespace: domain.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([(DOMAIN_LABEL.to_owned(), uid.to_owned())])),
            owner_references: Some(vec![OwnerReference {
                api_version: domain.api_version.clone(),
                kind: domain.kind.clone(),
                name: domain.metadata.name.clone().unwrap_or_default(),
                uid: uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            // Copied into each claim made from the template, so that the
            // reconciler watches only the domains' claims.
            metadata: Some(ObjectMeta {
                labels: Some(BTreeMap::from([(DOMAIN_LABEL.to_owned(), uid.to_owned())])),
                ..ObjectMeta::default()
            }),
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: CHANNEL_REQUEST.to_owned(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: CHANNEL_CLASS.to_owned(),
                            ..ExactDeviceRequest::default()
                        }),
                        ..DeviceRequest::default()
                    }]),
                    config: Some(vec![DeviceClaimConfiguration {
                        requests: Some(vec![CHANNEL_REQUEST.to_owned()]),
                        opaque: Some(OpaqueDeviceConfiguration {
                            driver: DRIVER_NAME.to_owned(),
                            parameters: RawExtension(parameters),
                        }),
                    }]),
                    constraints: None,
                }),
            }),
        }),
    }
}

/// Status from the channel claims: one entry per node of the domain's
/// clique, indexes kept from the stored status.
fn desired_status(inputs: &Inputs<'_>, problems: &mut Vec<Problem>) -> ComputeDomainStatus {
    let domain = inputs.domain;
    let stored = domain.status.clone().unwrap_or_default();
    // Per node: ready only if every channel claim there says so.
    let mut members: BTreeMap<&str, Option<bool>> = BTreeMap::new();
    for claim in inputs.channels {
        let entry = members.entry(claim.node.as_str()).or_insert(Some(true));
        *entry = match (*entry, claim.ready) {
            (Some(true), Some(true)) => Some(true),
            (Some(false), _) | (_, Some(false)) => Some(false),
            _ => None,
        };
    }
    let (mut no_clique, mut no_address) = (Vec::new(), Vec::new());
    let mut by_clique: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for node in members.keys() {
        let facts = inputs.nodes.get(*node).cloned().unwrap_or_default();
        match (facts.clique, facts.address) {
            (None, _) => no_clique.push(node.to_string()),
            (Some(_), None) => no_address.push(node.to_string()),
            (Some(clique), Some(_)) => by_clique.entry(clique).or_default().push(node),
        }
    }
    // The domain's clique: the one its stored nodes have, else the one with
    // the most nodes (ties: the lowest name, so every pass agrees).
    let stored_clique = stored.nodes.first().map(|n| n.clique_id.clone()).filter(|c| by_clique.contains_key(c));
    let clique = stored_clique.or_else(|| {
        by_clique.iter().max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0))).map(|(c, _)| c.clone())
    });
    let mut outside = Vec::new();
    for (other, nodes) in &by_clique {
        if Some(other) != clique.as_ref() {
            outside.extend(nodes.iter().map(|n| (n.to_string(), other.clone())));
        }
    }
    if !no_clique.is_empty() {
        problems.push(Problem::NoClique { nodes: no_clique });
    }
    if !no_address.is_empty() {
        problems.push(Problem::NoAddress { nodes: no_address });
    }
    let wants = domain.spec.num_nodes;
    if let Some(clique) = &clique {
        if !outside.is_empty() {
            outside.sort();
            problems.push(Problem::OtherCliques { clique: clique.clone(), outside });
        }
        let has = inputs.clique_sizes.get(clique).copied().unwrap_or(0);
        if wants as usize > has {
            problems.push(Problem::CliqueTooSmall { clique: clique.clone(), has, wants });
        }
    }
    let joined = clique.as_ref().and_then(|c| by_clique.get(c)).cloned().unwrap_or_default();
    if joined.len().max(wants as usize) > MAX_NODES_PER_DOMAIN {
        problems.push(Problem::TooManyNodes { wants: joined.len().max(wants as usize) });
    }
    // Indexes: kept while a node stays; a new node takes the lowest free one.
    let kept: BTreeMap<&str, u32> = stored
        .nodes
        .iter()
        .filter(|n| Some(&n.clique_id) == clique.as_ref())
        .map(|n| (n.name.as_str(), n.index))
        .collect();
    let mut used: BTreeSet<u32> = joined.iter().filter_map(|n| kept.get(n).copied()).collect();
    let mut nodes = Vec::new();
    for name in joined.iter().take(MAX_NODES_PER_DOMAIN) {
        let facts = inputs.nodes.get(*name).cloned().unwrap_or_default();
        let index = kept.get(name).copied().unwrap_or_else(|| {
            let free = (0..).find(|i| !used.contains(i)).unwrap_or_default();
            used.insert(free);
            free
        });
        nodes.push(ComputeDomainNode {
            name: name.to_string(),
            ip_address: facts.address.clone().unwrap_or_default(),
            clique_id: facts.clique.clone().unwrap_or_default(),
            index,
            status: if members.get(name).copied().flatten() == Some(true) {
                Readiness::Ready
            } else {
                Readiness::NotReady
            },
        });
    }
    let ready = nodes.iter().filter(|n| n.status == Readiness::Ready).count();
    let complete = !nodes.is_empty() && ready == nodes.len() && ready >= wants as usize;
    let blocking = problems.iter().any(|p| !matches!(p, Problem::TemplateTaken { .. }));
    ComputeDomainStatus { status: if complete && !blocking { Readiness::Ready } else { Readiness::NotReady }, nodes }
}

/// The waiting channels on nodes the status leaves out, each with the
/// problem that names its node (else the domain being full).
fn refused_bindings(inputs: &Inputs<'_>, status: &ComputeDomainStatus, problems: &[Problem]) -> Vec<RefusedBinding> {
    let domain = format!(
        "{}/{}",
        inputs.domain.metadata.namespace.as_deref().unwrap_or_default(),
        inputs.domain.metadata.name.as_deref().unwrap_or_default()
    );
    let names_node = |problem: &Problem, node: &str| match problem {
        Problem::OtherCliques { outside, .. } => outside.iter().any(|(n, _)| n == node),
        Problem::NoClique { nodes } | Problem::NoAddress { nodes } => nodes.iter().any(|n| n == node),
        _ => false,
    };
    inputs
        .channels
        .iter()
        .filter(|c| c.waiting && !status.nodes.iter().any(|n| n.name == c.node))
        .map(|c| {
            let why = problems.iter().find(|p| names_node(p, &c.node)).map_or_else(
                || format!("the domain already has {MAX_NODES_PER_DOMAIN} nodes, the most one IMEX domain holds"),
                Problem::note,
            );
            RefusedBinding {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                node: c.node.clone(),
                reason: format!("node {} cannot join ComputeDomain {domain}: {why}", c.node),
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
