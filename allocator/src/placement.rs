//! Running searches: on one node, or on the first node that fits.
//!
//! First fit remembers, per claim shape (the claims' specs), which nodes
//! already failed it. Allocations only accumulate, so a node that could not
//! take a shape cannot take it later either: in steady state a full node
//! costs one bit test, not a search. The explanation for a shape that fits
//! nowhere is reused while nothing new was allocated.

use std::collections::HashMap;

use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim};

use super::budget::{Meter, SearchBudget};
use super::diagnose;
use super::error::{AllocateError, FatalError};
use super::explain::Explanation;
use super::index::Fleet;
use super::request::{self, ClaimPlan};
use super::result;
use super::search::{self, NodeOutcome};
use super::selectors::SelectorCache;
use super::share_id::ShareIdSource;
use super::state::AllocatedState;

/// Where a pod's claims fit: the node and one result per claim, in claim order.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub node: String,
    pub allocations: Vec<AllocationResult>,
}

#[derive(Debug, Default)]
struct ShapeMemo {
    /// By node position: this shape did not fit there.
    failed: Vec<bool>,
    /// Explanation when it fit nowhere, the state version it was made at,
    /// and the index of the claim it is about.
    explanation: Option<(u64, usize, Explanation)>,
}

#[derive(Debug, Default)]
pub(crate) struct FirstFitMemo {
    shapes: HashMap<String, ShapeMemo>,
}

pub(crate) struct Context<'a> {
    pub(crate) fleet: &'a Fleet,
    pub(crate) classes: &'a HashMap<String, DeviceClass>,
    pub(crate) selectors: &'a mut SelectorCache,
    pub(crate) state: &'a AllocatedState,
    pub(crate) share_ids: &'a mut dyn ShareIdSource,
    pub(crate) memo: &'a mut FirstFitMemo,
    pub(crate) budget: Option<SearchBudget>,
}

fn shape(claims: &[&ResourceClaim]) -> String {
    let specs: Vec<_> = claims.iter().map(|c| &c.spec).collect();
    serde_json::to_string(&specs).unwrap_or_default()
}

impl<'a> Context<'a> {
    fn plans<'c>(&mut self, claims: &[&'c ResourceClaim]) -> Result<Vec<ClaimPlan<'c>>, FatalError>
    where
        'a: 'c,
    {
        claims.iter().map(|c| request::plan(c, self.classes, self.selectors)).collect()
    }

    pub(crate) fn allocate_on(
        &mut self,
        node: &str,
        claims: &[&ResourceClaim],
    ) -> Result<Vec<AllocationResult>, AllocateError> {
        let plans = self.plans(claims)?;
        let mut meter = Meter::start(self.budget);
        match search::search_node(self.fleet, self.selectors, self.state, &plans, node, &mut meter)? {
            NodeOutcome::Fits(solution) => Ok(result::build(self.fleet, &plans, &solution, node, self.share_ids)?),
            NodeOutcome::NoFit { gave_up } => {
                let (_, e) =
                    diagnose::explain(self.fleet, self.selectors, self.state, &plans, &[node], gave_up, &mut meter);
                Err(AllocateError::Unsatisfiable(Box::new(e)))
            }
            NodeOutcome::Undecided => Err(undecided(&plans, self.budget, 0, 1)),
        }
    }

    pub(crate) fn first_fit(
        &mut self,
        nodes: Option<&[String]>,
        claims: &[&ResourceClaim],
    ) -> Result<Placement, AllocateError> {
        let plans = self.plans(claims)?;
        let fleet = self.fleet;
        let candidates: &[String] = nodes.unwrap_or(fleet.node_names());
        let memo = self.memo.shapes.entry(shape(claims)).or_default();
        if memo.failed.len() < fleet.node_names().len() {
            memo.failed.resize(fleet.node_names().len(), false);
        }
        // Positions of the candidate nodes; unknown names get `None`.
        let order: Vec<(Option<usize>, &str)> = match nodes {
            None => candidates.iter().enumerate().map(|(p, n)| (Some(p), n.as_str())).collect(),
            Some(list) => list.iter().map(|n| (fleet.node_position(n), n.as_str())).collect(),
        };
        let mut gave_up = false;
        let mut meter = Meter::start(self.budget);
        for (searched, &(position, node)) in order.iter().enumerate() {
            if let Some(p) = position
                && memo.failed.get(p).copied().unwrap_or(false)
            {
                continue;
            }
            match search::search_node(fleet, self.selectors, self.state, &plans, node, &mut meter)? {
                NodeOutcome::Fits(solution) => {
                    let allocations = result::build(fleet, &plans, &solution, node, self.share_ids)?;
                    return Ok(Placement { node: node.to_string(), allocations });
                }
                NodeOutcome::NoFit { gave_up: g } => {
                    gave_up |= g;
                    if let Some(slot) = position.and_then(|p| memo.failed.get_mut(p)) {
                        *slot = true;
                    }
                }
                NodeOutcome::Undecided => return Err(undecided(&plans, self.budget, searched, order.len())),
            }
        }
        let tried: Vec<&str> = order.iter().map(|(_, n)| *n).collect();
        if let Some((version, culprit, e)) = &memo.explanation
            && *version == self.state.version
            && nodes.is_none()
            && let Some(plan) = plans.get(*culprit)
        {
            let mut e = e.clone();
            e.claim = plan.name.clone();
            return Err(AllocateError::Unsatisfiable(Box::new(e)));
        }
        let (culprit, e) = diagnose::explain(fleet, self.selectors, self.state, &plans, &tried, gave_up, &mut meter);
        if nodes.is_none() {
            memo.explanation = Some((self.state.version, culprit, e.clone()));
        }
        Err(AllocateError::Unsatisfiable(Box::new(e)))
    }
}

/// The answer when the budget ran out after `searched` of `nodes`.
fn undecided(plans: &[ClaimPlan<'_>], budget: Option<SearchBudget>, searched: usize, nodes: usize) -> AllocateError {
    AllocateError::Undecided {
        claim: plans.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
        within: budget.map(|b| b.to_string()).unwrap_or_default(),
        searched,
        nodes,
    }
}
