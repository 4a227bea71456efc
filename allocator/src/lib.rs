//! The structured allocator: which devices of which ResourceSlices a set of
//! ResourceClaims gets on a node, with the kube-scheduler's semantics
//! (`k8s.io/dynamic-resource-allocation/structured`, 1.34–1.36). Where the
//! releases differ we follow 1.36's "incubating" allocator, i.e. with the
//! gates that are on by default there: prioritized lists, admin access,
//! device taints, partitionable devices, consumable capacity and binding
//! conditions. List-type attributes (DRAListTypeAttributes, alpha) follow
//! 1.37's experimental allocator when the CEL environment's gate is on
//! (`constraints`: lists match by a common element, are distinct when
//! disjoint).
//!
//! Plain Kubernetes objects in and out (k8s-openapi's ResourceSlices,
//! DeviceClasses, ResourceClaims, Nodes, DeviceTaintRules), selectors
//! through [`dra_cel`]: nothing here knows GPUs, so any DRA driver's slices
//! can be allocated.
//!
//! Pure: no I/O, and no clock unless a [`SearchBudget`] gives a time. One [`Allocator`] holds the fleet (pools,
//! device index, compiled selectors and their cached results) and the
//! allocated state; [`Allocator::allocate`] searches one node without
//! committing, [`Allocator::allocate_first_fit`] tries nodes in order,
//! [`Allocator::commit`] records results, [`Allocator::place`] does both.
//!
//! Data flow: slices + classes + nodes → `pools` (highest generation,
//! complete, valid) → `index` (devices per node in search order) →
//! `selectors` (compiled once, results cached per device) → `search`
//! (backtracking) → `AllocationResult` (`result`) or an [`Explanation`]
//! (`diagnose`, `explain`).
//!
//! Semantics, briefly (details in each module):
//! - claims in order, requests in order, devices in pool/slice/device order,
//!   exhaustive backtracking, first complete solution;
//! - `ExactCount` and `All` (all matching devices visible to the node; an
//!   incomplete or invalid pool visible to the node makes `All` an error);
//! - `firstAvailable` alternatives in order, results named `req/sub`;
//! - `matchAttribute`/`distinctAttribute` scoped to their requests;
//! - `adminAccess` ignores other claims' use and is not itself "in use";
//! - taints `NoSchedule`/`NoExecute` need a toleration; tolerations are
//!   copied into the results;
//! - shared counters bound partitionable devices; consumable capacity with
//!   request policies and a fresh `shareID` per share;
//! - class then claim opaque config in the result; at most 32 results;
//! - a CEL compile or runtime error on a device the search evaluates is a
//!   [`FatalError`] naming claim, class or request, selector index and
//!   device; it is never a silent "no match".
//!
//! Deliberate differences from upstream are listed where they live
//! (`pools`, `constraints`, `counters`, `search`, `result`). Two can change
//! an outcome for valid input: `distinctAttribute` compares devices of the
//! same request too, and a node's search gives up after a step budget
//! (upstream: a 10 s filter timeout). Nodes that counting rules out
//! (`counting`) are not searched: same answer, found at once. A call may
//! be bounded as a whole ([`SearchBudget`]): past it the answer is
//! [`AllocateError::Undecided`], neither yes nor no.

mod budget;
mod capacity;
mod compact;
mod constraints;
mod counters;
mod counting;
mod decode;
mod diagnose;
mod error;
mod explain;
mod index;
mod key_hints;
mod node_selection;
mod placement;
mod pools;
mod request;
mod result;
mod search;
mod selectors;
mod share_id;
mod state;
mod taint_rules;
mod taints;
mod why;

#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

pub use budget::SearchBudget;
pub use error::{AllocateError, FatalError, InputError};
pub use explain::{
    CapacityShortfall, ConstraintKind, ConstraintReport, CounterShortfall, Explanation, MAX_OWNERS, OtherOwners,
    OwnerCount, PoolIssue, PoolProblem, RequestReport, TaintedDevice, ValueCount, Wanted,
};
pub use node_selection::{BadSelector, NodeInfo, selector_matches};
pub use placement::Placement;
pub use share_id::{RandomShareIds, SequentialShareIds, ShareIdSource};
pub use taint_rules::{TaintRule, TaintRuleError};
pub use taints::describe as describe_taint;
pub use why::{ClauseCount, SelectorBreakdown};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};

/// The size of the fleet an [`Allocator`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetStats {
    pub nodes: usize,
    pub slices: usize,
    pub devices: usize,
}

/// The fleet as the allocator sees it, plus what is already allocated.
///
/// Built from a snapshot of slices, classes and nodes, then kept up to date
/// one object at a time ([`Allocator::apply_slice`], [`Allocator::remove_slice`],
/// [`Allocator::set_node`], [`Allocator::set_class`], [`Allocator::release`], ...):
/// a slice event re-derives only its pool. Allocation reuses compiled
/// selectors and selector results cached per device, so steady-state
/// allocation does no CEL work.
pub struct Allocator {
    fleet: index::Fleet,
    classes: std::collections::HashMap<String, DeviceClass>,
    selectors: selectors::SelectorCache,
    state: state::AllocatedState,
    share_ids: Box<dyn ShareIdSource>,
    memo: placement::FirstFitMemo,
    budget: Option<SearchBudget>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("nodes", &self.fleet.node_names().len())
            .field("devices", &self.fleet.device_count())
            .field("classes", &self.classes.len())
            .finish_non_exhaustive()
    }
}

/// Collects slices and nodes for an [`Allocator`]; see [`Allocator::builder`].
#[derive(Debug, Default)]
pub struct AllocatorBuilder {
    fleet: index::FleetBuilder,
    slices: usize,
}

impl AllocatorBuilder {
    /// Adds a ResourceSlice; what the allocator needs of it is kept, the
    /// slice itself can be dropped.
    pub fn add_slice(&mut self, slice: &ResourceSlice) {
        self.fleet.add_slice(slice);
        self.slices += 1;
    }

    /// Adds a Node (its labels steer node selectors).
    pub fn add_node(&mut self, node: &Node) {
        self.fleet.add_node(node);
    }

    /// Adds a DeviceTaintRule: its taint is on the devices it names, those
    /// added before it and after.
    pub fn add_taint_rule(&mut self, rule: TaintRule) {
        self.fleet.add_taint_rule(rule);
    }

    /// How many slices were added.
    pub fn slice_count(&self) -> usize {
        self.slices
    }

    /// The allocator for the slices and nodes added, and `classes`.
    pub fn build(self, classes: &[DeviceClass]) -> Allocator {
        Allocator::with_fleet(self.fleet.finish(), classes)
    }
}

impl Allocator {
    /// The allocator for these objects. Nodes supply the labels that slice
    /// and device node selectors match; a node named only by a slice's
    /// `nodeName` is known too, without labels. Invalid or incomplete pools
    /// are kept aside (they explain failures and make `All` requests fail).
    pub fn new(slices: &[ResourceSlice], classes: &[DeviceClass], nodes: &[Node]) -> Self {
        Self::with_fleet(index::Fleet::build(slices, nodes), classes)
    }

    fn with_fleet(fleet: index::Fleet, classes: &[DeviceClass]) -> Self {
        let classes = classes.iter().filter_map(|c| c.metadata.name.clone().map(|name| (name, c.clone()))).collect();
        Self {
            fleet,
            classes,
            selectors: selectors::SelectorCache::new(),
            state: state::AllocatedState::default(),
            share_ids: Box::new(RandomShareIds),
            memo: placement::FirstFitMemo::default(),
            budget: None,
        }
    }

    /// An allocator built from objects handed over one at a time, e.g. while
    /// a large file is read: nothing but the compact fleet is kept.
    pub fn builder() -> AllocatorBuilder {
        AllocatorBuilder::default()
    }

    /// Adds or replaces a ResourceSlice (by name): only its pool is
    /// re-derived, allocations on its devices carry over by device name.
    pub fn apply_slice(&mut self, slice: &ResourceSlice) {
        let changes = self.fleet.apply_slice(slice);
        self.after_fleet_change(&changes);
    }

    /// Deletes a ResourceSlice by name (unknown names are ignored).
    pub fn remove_slice(&mut self, name: &str) {
        let changes: Vec<_> = self.fleet.remove_slice(name).into_iter().collect();
        self.after_fleet_change(&changes);
    }

    /// Adds or updates a Node (its labels steer node selectors).
    pub fn set_node(&mut self, node: &Node) {
        if self.fleet.set_node(node)
            && let Some(name) = node.metadata.name.as_deref()
        {
            self.node_changed(name);
        }
    }

    /// Forgets a Node's labels; it stays known while slices name it.
    pub fn remove_node(&mut self, name: &str) {
        if self.fleet.remove_node(name) {
            self.node_changed(name);
        }
    }

    /// Replaces the DeviceTaintRules (all of them, as a watch holds them):
    /// the devices they name carry their taints, whenever the devices came.
    pub fn set_taint_rules(&mut self, rules: Vec<TaintRule>) {
        let changes = self.fleet.set_taint_rules(rules);
        self.after_fleet_change(&changes);
    }

    /// Adds or replaces a DeviceClass.
    pub fn set_class(&mut self, class: &DeviceClass) {
        if let Some(name) = class.metadata.name.clone() {
            self.classes.insert(name, class.clone());
            self.memo = placement::FirstFitMemo::default();
        }
    }

    /// Deletes a DeviceClass by name.
    pub fn remove_class(&mut self, name: &str) {
        if self.classes.remove(name).is_some() {
            self.memo = placement::FirstFitMemo::default();
        }
    }

    /// Gives back what an allocated claim holds (it was deallocated or
    /// deleted): devices, consumed capacity, counters. A claim without an
    /// allocation is ignored.
    pub fn release(&mut self, claim: &ResourceClaim) -> Result<(), InputError> {
        let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
            return Ok(());
        };
        self.state.release(&self.fleet, &state::owner_of(claim), allocation)?;
        self.memo = placement::FirstFitMemo::default();
        Ok(())
    }

    /// How big the fleet is: nodes, slices held, live devices.
    pub fn stats(&self) -> FleetStats {
        FleetStats {
            nodes: self.fleet.node_names().len(),
            slices: self.fleet.slice_count(),
            devices: self.fleet.device_count(),
        }
    }

    fn node_changed(&mut self, name: &str) {
        let moved = self.fleet.node_changed(name);
        let positions: Vec<usize> = self.fleet.node_position(name).into_iter().collect();
        self.selectors.forget_nodes(if moved { None } else { Some(&positions) });
        self.memo = placement::FirstFitMemo::default();
    }

    fn after_fleet_change(&mut self, changes: &[index::PoolChange]) {
        if changes.is_empty() {
            return;
        }
        let mut all_nodes = false;
        let mut positions = Vec::new();
        for change in changes {
            self.state.pool_changed(&self.fleet, change);
            self.selectors.forget_signatures(&change.released_signatures);
            match &change.nodes {
                Some(nodes) if !change.node_set_changed => {
                    positions.extend(nodes.iter().filter_map(|n| self.fleet.node_position(n)));
                }
                _ => all_nodes = true,
            }
        }
        self.selectors.forget_nodes(if all_nodes { None } else { Some(&positions) });
        self.memo = placement::FirstFitMemo::default();
        self.fleet.prune_if_needed();
    }

    /// Evaluates selectors as Kubernetes does in `environment` (by default
    /// the newest modelled version's stored expressions): an older version
    /// lacks some functions, and new expressions are held to the
    /// apiserver's cost limit. Call before the first claim.
    pub fn with_cel_environment(mut self, environment: dra_cel::CelEnvironment) -> Self {
        self.selectors = selectors::SelectorCache::for_environment(environment);
        self
    }

    /// Bounds each later allocation call (all the nodes it tries and its
    /// explanation): past it, the call answers [`AllocateError::Undecided`].
    /// `None` (the default) leaves only each node's own step budget.
    pub fn set_search_budget(&mut self, budget: Option<SearchBudget>) {
        self.budget = budget;
    }

    /// Replaces the source of `shareID`s (random v4 UUIDs by default), e.g.
    /// with [`SequentialShareIds`] for reproducible output.
    pub fn with_share_ids(mut self, source: Box<dyn ShareIdSource>) -> Self {
        self.share_ids = source;
        self
    }

    /// All known node names, in name order: the order [`Allocator::place`] tries.
    pub fn nodes(&self) -> &[String] {
        self.fleet.node_names()
    }

    /// Records a claim that already has `status.allocation`: its devices (or
    /// the capacity it consumed on shareable devices) count as in use, owned
    /// by `namespace/name`. A claim without an allocation is ignored.
    pub fn record_allocated(&mut self, claim: &ResourceClaim) -> Result<(), InputError> {
        let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
            return Ok(());
        };
        self.state.record(&self.fleet, &state::owner_of(claim), allocation)
    }

    /// The claims (`namespace/name`) that already hold a device of this
    /// claim's allocation: recording it too would be a double allocation
    /// (two allocators picked the same device in the same instant).
    pub fn conflicting_holders(&self, claim: &ResourceClaim) -> Vec<String> {
        match claim.status.as_ref().and_then(|s| s.allocation.as_ref()) {
            Some(allocation) => self.state.other_holders(&self.fleet, &state::owner_of(claim), allocation),
            None => Vec::new(),
        }
    }

    /// Allocates `claims` together (a pod's claims) on `node`, without
    /// committing: one result per claim, in order. Claims that already have
    /// an allocation must not be passed (record them instead).
    pub fn allocate(&mut self, node: &str, claims: &[&ResourceClaim]) -> Result<Vec<AllocationResult>, AllocateError> {
        let result = self.context().allocate_on(node, claims);
        result.map_err(|e| key_hints::improve(e, claims, &self.classes, || self.published_domains()))
    }

    /// The domains of every attribute and capacity the fleet's devices
    /// publish (a name without one is in its driver's domain).
    fn published_domains(&self) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for d in 0..u32::try_from(self.fleet.device_numbers()).unwrap_or(u32::MAX) {
            let Some(device) = self.fleet.device(d) else { continue };
            let (driver, _, _) = self.fleet.id(d);
            let names = device.attributes.iter().map(|(n, _)| n).chain(device.capacity.iter().map(|(n, _)| n));
            for name in names {
                let domain = name.split_once('/').map_or(driver, |(domain, _)| domain);
                if !out.contains(domain) {
                    out.insert(domain.to_string());
                }
            }
        }
        out
    }

    /// The first node in `nodes` (or in [`Allocator::nodes`] order when
    /// `None`) on which all `claims` fit, without committing. Nodes that
    /// cannot hold the claims' device counts are skipped without a search.
    /// When none fits, the explanation is for the node that came closest.
    pub fn allocate_first_fit(
        &mut self,
        nodes: Option<&[String]>,
        claims: &[&ResourceClaim],
    ) -> Result<Placement, AllocateError> {
        let result = self.context().first_fit(nodes, claims);
        result.map_err(|e| key_hints::improve(e, claims, &self.classes, || self.published_domains()))
    }

    /// One search over the fleet, borrowing the caches and the allocated state.
    fn context(&mut self) -> placement::Context<'_> {
        placement::Context {
            fleet: &self.fleet,
            classes: &self.classes,
            selectors: &mut self.selectors,
            state: &self.state,
            share_ids: self.share_ids.as_mut(),
            memo: &mut self.memo,
            budget: self.budget,
        }
    }

    /// Records results returned by [`Allocator::allocate`] (one per claim)
    /// as in use, owned by the claims.
    pub fn commit(&mut self, claims: &[&ResourceClaim], results: &[AllocationResult]) -> Result<(), InputError> {
        if claims.len() != results.len() {
            return Err(InputError::ResultCount { claims: claims.len(), results: results.len() });
        }
        for (claim, result) in claims.iter().zip(results) {
            self.state.record(&self.fleet, &state::owner_of(claim), result)?;
        }
        Ok(())
    }

    /// [`Allocator::allocate_first_fit`] over all nodes, then
    /// [`Allocator::commit`].
    pub fn place(&mut self, claims: &[&ResourceClaim]) -> Result<Placement, AllocateError> {
        let placement = self.allocate_first_fit(None, claims)?;
        self.commit(claims, &placement.allocations).map_err(|e| AllocateError::Fatal(FatalError::Input(e)))?;
        Ok(placement)
    }
}

#[cfg(test)]
mod tests_budget;
#[cfg(test)]
mod tests_core;
#[cfg(test)]
mod tests_features;
#[cfg(test)]
mod tests_incremental;
#[cfg(test)]
mod tests_lists;
#[cfg(test)]
mod tests_more;
