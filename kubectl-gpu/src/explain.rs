//! Running `simulate`'s engine (`gpu-dra-simulate`) on a cluster's objects:
//! the live slices, classes and nodes, the claims already allocated (they
//! hold their devices), and the claims in question. The outcomes are
//! simulate's own, typed; the reasons its text.

use gpu_dra_driver::feature_gates::{FeatureGates, Gate};
use std::collections::HashSet;

use anyhow::{Context, Result};
use gpu_dra_simulate::manifests::Manifest;
use gpu_dra_simulate::{ClaimOutcome, Feed, Format, Options, Source};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

/// One claim's outcome as `kubectl gpu` prints it: simulate's, without the
/// pod and workload it names (`why` and `fit` say those themselves).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub allocated: bool,
    pub node: Option<String>,
    pub allocation: Option<AllocationResult>,
    pub error: bool,
    pub reason: Option<String>,
}

impl From<ClaimOutcome> for Outcome {
    fn from(o: ClaimOutcome) -> Self {
        Outcome {
            namespace: o.namespace,
            name: o.name,
            allocated: o.allocated,
            node: o.node,
            allocation: o.allocation,
            error: o.error,
            reason: o.reason,
        }
    }
}

impl Outcome {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace.as_deref().unwrap_or_default(), self.name.as_deref().unwrap_or_default())
    }
}

/// `namespace/name` of a claim.
pub fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

fn is_allocated(claim: &ResourceClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

fn manifest<T: serde::Serialize>(kind: &str, name: &str, object: &T) -> Result<Manifest> {
    let object = serde_json::to_value(object).with_context(|| format!("{kind} {name}"))?;
    Ok(Manifest::tree(format!("cluster {kind} {name}"), object))
}

/// The cluster's fleet and current allocations as simulate's input, fed a
/// page at a time so that no page is kept: slices go into simulate's
/// compact fleet, nodes are kept as their name and labels (all that node
/// selectors read), claims only when allocated (they hold devices).
pub struct ClusterInput {
    feed: Feed,
    /// Claims whose keys the caller excepted, kept whole for it.
    except: HashSet<String>,
    kept: Vec<ResourceClaim>,
    /// Keys of the allocated claims fed.
    allocated: HashSet<String>,
}

impl ClusterInput {
    /// An empty input; the claims whose keys are in `except` are not fed
    /// but kept ([`ClusterInput::kept`]): the ones in question.
    pub fn new(except: HashSet<String>) -> Self {
        ClusterInput { feed: Feed::default(), except, kept: Vec::new(), allocated: HashSet::new() }
    }

    /// Feeds one object.
    pub fn add<T: serde::Serialize>(&mut self, kind: &str, name: &str, object: &T) -> Result<()> {
        // Only used kinds are fed: there is nothing to note.
        Ok(self.feed.add(manifest(kind, name, object)?, &mut std::io::sink())?)
    }

    /// Feeds one manifest as read from a file.
    pub fn add_manifest(&mut self, manifest: Manifest) -> Result<()> {
        Ok(self.feed.add(manifest, &mut std::io::sink())?)
    }

    /// Feeds a DeviceTaintRule: its taint is on the devices it names.
    pub fn add_taint_rule(&mut self, rule: dra_allocator::TaintRule) {
        self.feed.add_taint_rule(rule);
    }

    pub fn add_slices(&mut self, page: &[ResourceSlice]) -> Result<()> {
        page.iter().try_for_each(|s| self.add("ResourceSlice", s.metadata.name.as_deref().unwrap_or_default(), s))
    }

    pub fn add_classes(&mut self, page: &[DeviceClass]) -> Result<()> {
        page.iter().try_for_each(|c| self.add("DeviceClass", c.metadata.name.as_deref().unwrap_or_default(), c))
    }

    /// Each node as its name and labels: a node's status (images,
    /// conditions) is most of it, and simulate reads neither.
    pub fn add_nodes(&mut self, page: &[Node]) -> Result<()> {
        for n in page {
            let compact = Node {
                metadata: ObjectMeta {
                    name: n.metadata.name.clone(),
                    labels: n.metadata.labels.clone(),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            };
            self.add("Node", n.metadata.name.as_deref().unwrap_or_default(), &compact)?;
        }
        Ok(())
    }

    /// Feeds the allocated claims of the page not excepted; keeps the
    /// excepted ones.
    pub fn add_claims(&mut self, page: Vec<ResourceClaim>) -> Result<()> {
        for c in page {
            let key = claim_key(&c);
            if self.except.contains(&key) {
                self.kept.push(c);
            } else if is_allocated(&c) {
                self.add("ResourceClaim", &key, &c)?;
                self.allocated.insert(key);
            }
        }
        Ok(())
    }

    /// The excepted claims the cluster holds, taken out.
    pub fn take_kept(&mut self) -> Vec<ResourceClaim> {
        std::mem::take(&mut self.kept)
    }

    /// The keys of the cluster's allocated claims fed, taken out.
    pub fn take_allocated(&mut self) -> HashSet<String> {
        std::mem::take(&mut self.allocated)
    }

    /// Runs simulate on what was fed; every claim's outcome, in its order.
    pub fn simulate(self) -> Result<Vec<Outcome>> {
        let outcomes = self.feed.evaluate(&options(), &mut std::io::sink())?;
        Ok(outcomes.into_iter().map(Outcome::from).collect())
    }
}

fn options() -> Options<'static> {
    Options {
        fleet: None,
        // Not printed: `evaluate` hands the outcomes back.
        format: Format::default(),
        timings: false,
        cel: dra_cel::CelEnvironment::stored_expressions(dra_cel::NEWEST_MINOR),
        // The newest release serves extended resources through classes.
        extended_resources: true,
        // Objects in the cluster were admitted by its webhook under the
        // gates it runs with, which a client cannot read: judge configs
        // with every gate on, so only a config no gate allows is refused.
        gates: Some(Gate::ALL.into_iter().fold(FeatureGates::default(), |gates, gate| gates.with(gate, true))),
        // Slices read from the cluster are as its API server stored them.
        not_served: Default::default(),
        source: Source::Cluster,
    }
}

/// `request=device,device ...` of an allocation (the pool shown when it is
/// not the node's).
pub fn devices(allocation: Option<&AllocationResult>, node: Option<&str>) -> String {
    let Some(results) = allocation.and_then(|a| a.devices.as_ref()).and_then(|d| d.results.as_deref()) else {
        return "-".to_string();
    };
    let mut groups: Vec<(&str, Vec<String>)> = Vec::new();
    for r in results {
        let shown = if Some(r.pool.as_str()) == node { r.device.clone() } else { format!("{}/{}", r.pool, r.device) };
        match groups.last_mut() {
            Some((last, list)) if *last == r.request => list.push(shown),
            _ => groups.push((r.request.as_str(), vec![shown])),
        }
    }
    if groups.is_empty() {
        return "(none)".to_string();
    }
    groups.iter().map(|(r, l)| format!("{r}={}", l.join(","))).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn outcomes_are_printed_without_the_pod_and_workload() {
        let outcome = ClaimOutcome {
            namespace: Some("ns".into()),
            name: Some("c".into()),
            pod: Some("ns/p".into()),
            workload: Some("Deployment ns/d".into()),
            reason: Some("no GPU left".into()),
            key: "ns/c".into(),
            ..ClaimOutcome::default()
        };
        let printed = serde_json::to_value(Outcome::from(outcome)).unwrap();
        assert_eq!(
            printed,
            json!({"namespace": "ns", "name": "c", "allocated": false, "node": null, "allocation": null,
                   "error": false, "reason": "no GPU left"})
        );
    }
}
