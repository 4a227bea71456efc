//! Allocating the workload unit by unit with the driver's allocator, each
//! unit seeing the allocations before it, and turning the allocator's
//! answers into per-claim outcomes.

use dra_allocator::{AllocateError, Allocator, AllocatorBuilder, SequentialShareIds};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim};

use super::workload::{Unit, Workload};
use dra_allocator::{NodeInfo as NodeLabels, selector_matches};

/// A claim whose `status.allocation` the allocator cannot take in: where
/// it was read, the claim, and the allocator's reason.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: ResourceClaim {key}: status.allocation: {error}")]
pub struct BadAllocation {
    pub origin: String,
    pub key: String,
    pub error: dra_allocator::InputError,
}

/// What happened to one claim.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub node: Option<String>,
    pub allocation: Option<AllocationResult>,
    /// A fatal error (bad selector, pool not ready for `All`, ...) rather
    /// than "does not fit".
    pub error: bool,
    /// Why it is not allocated; `None` when it is.
    pub reason: Option<String>,
}

impl Outcome {
    pub fn allocated(&self) -> bool {
        self.allocation.is_some()
    }
}

/// Allocates `workload` on the fleet; one outcome per claim, in claim order.
pub fn allocate(
    workload: &Workload,
    mut fleet: AllocatorBuilder,
    classes: &[DeviceClass],
    nodes: &[Node],
    cel: dra_cel::CelEnvironment,
) -> Result<Vec<Outcome>, BadAllocation> {
    for node in nodes {
        fleet.add_node(node);
    }
    let mut allocator =
        fleet.build(classes).with_cel_environment(cel).with_share_ids(Box::new(SequentialShareIds::new()));
    let known: Vec<NodeLabels> = allocator
        .nodes()
        .iter()
        .map(|name| NodeLabels {
            name: name.clone(),
            labels: nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(name))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default(),
        })
        .collect();
    let mut outcomes = vec![Outcome::default(); workload.claims.len()];
    for (i, c) in workload.claims.iter().enumerate() {
        if !c.preallocated {
            continue;
        }
        allocator.record_allocated(&c.claim).map_err(|error| BadAllocation {
            origin: c.origin.clone(),
            key: c.key.clone(),
            error,
        })?;
        let allocation = c.claim.status.as_ref().and_then(|s| s.allocation.clone());
        let selector = allocation.as_ref().and_then(|a| a.node_selector.as_ref());
        let admitted: Vec<&NodeLabels> = known.iter().filter(|n| admits(selector, n)).collect();
        let node = match (selector, admitted.as_slice()) {
            (Some(_), [only]) => Some(only.name.clone()),
            _ => None,
        };
        if let Some(o) = outcomes.get_mut(i) {
            *o = Outcome { node, allocation, error: false, reason: None };
        }
    }
    for unit in &workload.units {
        if unit.claims.is_empty() {
            continue;
        }
        let unit_outcome = allocate_unit(&mut allocator, workload, unit, &outcomes, &known);
        for (&i, o) in unit.claims.iter().zip(unit_outcome) {
            if let Some(slot) = outcomes.get_mut(i) {
                *slot = o;
            }
        }
    }
    Ok(outcomes)
}

/// Nodes the unit may use because of claims it shares with earlier units:
/// `None` when unrestricted, `Err` with a reason when a shared claim failed.
fn bound_nodes(
    workload: &Workload,
    unit: &Unit,
    outcomes: &[Outcome],
    known: &[NodeLabels],
) -> Result<Option<Vec<String>>, String> {
    let mut allowed: Option<Vec<String>> = None;
    for &b in &unit.bound {
        let (Some(claim), Some(o)) = (workload.claims.get(b), outcomes.get(b)) else { continue };
        let Some(allocation) = &o.allocation else {
            return Err(format!(
                "claim {} of the same pod could not be allocated, so this pod cannot start",
                claim.key
            ));
        };
        let here: Vec<String> = match &o.node {
            Some(n) => vec![n.clone()],
            None => {
                known.iter().filter(|n| admits(allocation.node_selector.as_ref(), n)).map(|n| n.name.clone()).collect()
            }
        };
        allowed = Some(match allowed {
            None => here,
            Some(prev) => prev.into_iter().filter(|n| here.contains(n)).collect(),
        });
    }
    Ok(allowed)
}

fn allocate_unit(
    allocator: &mut Allocator,
    workload: &Workload,
    unit: &Unit,
    outcomes: &[Outcome],
    known: &[NodeLabels],
) -> Vec<Outcome> {
    let claims: Vec<&ResourceClaim> =
        unit.claims.iter().filter_map(|&i| workload.claims.get(i)).map(|c| &c.claim).collect();
    let not_allocated =
        |error: bool, reason: String| Outcome { node: None, allocation: None, error, reason: Some(reason) };
    let nodes = match bound_nodes(workload, unit, outcomes, known) {
        Ok(nodes) => nodes,
        Err(reason) => return claims.iter().map(|_| not_allocated(false, reason.clone())).collect(),
    };
    if nodes.as_ref().is_some_and(Vec::is_empty) {
        let reason = "the claims this pod shares with earlier pods are allocated on different nodes, so no node can \
                      hold all of its claims";
        return claims.iter().map(|_| not_allocated(false, reason.to_string())).collect();
    }
    let placed = allocator.allocate_first_fit(nodes.as_deref(), &claims).and_then(|p| {
        allocator.commit(&claims, &p.allocations).map_err(|e| AllocateError::Fatal(e.into()))?;
        Ok(p)
    });
    match placed {
        Ok(p) => p
            .allocations
            .into_iter()
            .map(|a| Outcome { node: Some(p.node.clone()), allocation: Some(a), error: false, reason: None })
            .collect(),
        Err(AllocateError::Unsatisfiable(explanation)) => {
            let text = explanation.to_string();
            let pod = unit.pod.as_deref().unwrap_or_default();
            workload_keys(workload, unit)
                .map(|key| {
                    if key == explanation.claim || unit.claims.len() == 1 {
                        not_allocated(false, text.clone())
                    } else {
                        not_allocated(
                            false,
                            format!(
                                "pod {pod}'s claims must share a node and {} does not fit: {text}",
                                explanation.claim
                            ),
                        )
                    }
                })
                .collect()
        }
        // Fatal, or (with a search budget, which simulate does not set) undecided.
        Err(e) => claims.iter().map(|_| not_allocated(e.is_fatal(), e.to_string())).collect(),
    }
}

fn workload_keys<'w>(workload: &'w Workload, unit: &'w Unit) -> impl Iterator<Item = &'w str> {
    unit.claims.iter().filter_map(|&i| workload.claims.get(i)).map(|c| c.key.as_str())
}

/// Whether `selector` admits `node`; `None` (no selector) admits every
/// node, a malformed selector none.
fn admits(selector: Option<&k8s_openapi::api::core::v1::NodeSelector>, node: &NodeLabels) -> bool {
    selector.is_none_or(|s| selector_matches(s, node).unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeLabels {
        NodeLabels { name: name.into(), labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    fn selector(yaml: &str) -> k8s_openapi::api::core::v1::NodeSelector {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn name_fields_and_label_expressions() {
        let by_name = selector("nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [a]}]}]");
        assert!(admits(Some(&by_name), &node("a", &[])));
        assert!(!admits(Some(&by_name), &node("b", &[])));
        let zone = selector(
            "nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [z1]}, {key: gpus, operator: Gt, values: ['4']}]}]",
        );
        assert!(admits(Some(&zone), &node("a", &[("zone", "z1"), ("gpus", "8")])));
        assert!(!admits(Some(&zone), &node("a", &[("zone", "z1"), ("gpus", "2")])));
        assert!(!admits(Some(&zone), &node("a", &[("gpus", "8")])));
        assert!(admits(None, &node("x", &[])));
        assert!(!admits(Some(&selector("nodeSelectorTerms: [{}]")), &node("x", &[])));
        let malformed =
            selector("nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: Near, values: [z1]}]}]");
        assert!(!admits(Some(&malformed), &node("a", &[("zone", "z1")])), "a malformed selector admits nothing");
    }
}
