//! What the controller knows of the cluster, kept up to date from watch
//! events, and the decisions taken on it. Pure: no I/O, so it is tested
//! without a server.
//!
//! The fleet lives in the allocator's compact model (slices are not kept
//! as objects); claims are kept as objects (the controller writes them),
//! pods only as the claims they reference.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use dra_allocator::{AllocateError, Allocator, FatalError, SearchBudget, TaintRule, TaintRuleError};
use dra_cel::CelEnvironment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};

use crate::events::Verdict;

/// The annotation that delegates a claim's allocation to this controller.
pub const ALLOCATE_ANNOTATION: &str = "gpu.nvidia.com/allocate";
/// The finalizer on claims this controller allocated: it deallocates them.
pub const FINALIZER: &str = "gpu.nvidia.com/delegated-allocation";
/// How long one claim's search (explanation or delegated allocation) may
/// hold the cluster state: the webhook waits for it at most this long.
pub const SEARCH_BUDGET: Duration = Duration::from_secs(2);

/// `namespace/name`.
pub type ClaimKey = String;

pub fn key_of(namespace: Option<&str>, name: Option<&str>) -> ClaimKey {
    format!("{}/{}", namespace.unwrap_or_default(), name.unwrap_or_default())
}

pub fn claim_key(claim: &ResourceClaim) -> ClaimKey {
    key_of(claim.metadata.namespace.as_deref(), claim.metadata.name.as_deref())
}

/// A pod, as far as the controller cares: which claims it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaims {
    pub uid: String,
    pub pending: bool,
    /// Keys of the claims it uses (named ones and generated ones).
    pub claims: Vec<ClaimKey>,
}

impl PodClaims {
    pub fn of(pod: &Pod) -> PodClaims {
        let namespace = pod.metadata.namespace.as_deref();
        let mut claims: Vec<ClaimKey> = Vec::new();
        for entry in pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).into_iter().flatten() {
            if let Some(name) = entry.resource_claim_name.as_deref() {
                claims.push(key_of(namespace, Some(name)));
            }
        }
        // Claims generated from templates are named in the pod's status.
        for status in pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref()).into_iter().flatten() {
            if let Some(name) = status.resource_claim_name.as_deref() {
                claims.push(key_of(namespace, Some(name)));
            }
        }
        claims.sort();
        claims.dedup();
        PodClaims {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            pending: pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"),
            claims,
        }
    }
}

/// A claim allocation seen on the server that collides with one already
/// recorded: two allocators took the same device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoubleAllocation {
    pub claim: ClaimKey,
    pub others: Vec<String>,
}

pub struct ClusterState {
    allocator: Allocator,
    driver: String,
    /// DeviceClasses whose selectors name our driver.
    our_classes: HashSet<String>,
    claims: HashMap<ClaimKey, ResourceClaim>,
    /// What the allocator holds for each claim, to release it exactly.
    recorded: HashMap<ClaimKey, AllocationResult>,
    pods: HashMap<ClaimKey, PodClaims>,
    /// The DeviceTaintRules by name, as the allocator applies them.
    taint_rules: BTreeMap<String, TaintRule>,
    /// Bumped by every change that can change an allocation's outcome.
    version: u64,
    /// Why claims of a given spec do not fit, at `version`: claims made
    /// from one template share a spec, and are explained once.
    verdicts: (u64, HashMap<String, (ClaimKey, AllocateError)>),
}

impl ClusterState {
    pub fn new(driver: &str, cel: CelEnvironment) -> Self {
        let mut allocator = Allocator::new(&[], &[], &[]).with_cel_environment(cel);
        allocator.set_search_budget(Some(SearchBudget::time(SEARCH_BUDGET)));
        ClusterState {
            allocator,
            driver: driver.to_owned(),
            our_classes: HashSet::new(),
            claims: HashMap::new(),
            recorded: HashMap::new(),
            pods: HashMap::new(),
            taint_rules: BTreeMap::new(),
            version: 0,
            verdicts: (0, HashMap::new()),
        }
    }

    fn changed(&mut self) {
        self.version += 1;
    }

    pub fn apply_slice(&mut self, slice: &ResourceSlice) {
        self.changed();
        self.allocator.apply_slice(slice);
    }

    pub fn remove_slice(&mut self, name: &str) {
        self.changed();
        self.allocator.remove_slice(name);
    }

    pub fn apply_node(&mut self, node: &Node) {
        self.changed();
        self.allocator.set_node(node);
    }

    pub fn remove_node(&mut self, name: &str) {
        self.changed();
        self.allocator.remove_node(name);
    }

    pub fn apply_class(&mut self, class: &DeviceClass) {
        self.changed();
        let name = class.metadata.name.clone().unwrap_or_default();
        // A class is ours when one of its selectors names our driver
        // (`device.driver == "gpu.nvidia.com"`), as the chart's do.
        let ours = class
            .spec
            .as_ref()
            .and_then(|s| s.selectors.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|s| s.cel.as_ref())
            .any(|cel| {
                cel.expression.contains(&format!("'{}'", self.driver))
                    || cel.expression.contains(&format!("\"{}\"", self.driver))
            });
        if ours {
            self.our_classes.insert(name);
        } else {
            self.our_classes.remove(&name);
        }
        self.allocator.set_class(class);
    }

    /// Takes in a DeviceTaintRule: its taint is on the devices it names.
    /// One the allocator cannot apply (no name, no taint key: the API
    /// server refuses both) is left out, and the error says which.
    pub fn apply_taint_rule(&mut self, rule: &DeviceTaintRule) -> Result<(), TaintRuleError> {
        let name = rule.metadata.name.clone().unwrap_or_default();
        match TaintRule::from_api(rule) {
            Ok(rule) => {
                self.taint_rules.insert(name, rule);
                self.rules_changed();
                Ok(())
            }
            Err(error) => {
                if self.taint_rules.remove(&name).is_some() {
                    self.rules_changed();
                }
                Err(error)
            }
        }
    }

    pub fn remove_taint_rule(&mut self, name: &str) {
        if self.taint_rules.remove(name).is_some() {
            self.rules_changed();
        }
    }

    fn rules_changed(&mut self) {
        self.changed();
        self.allocator.set_taint_rules(self.taint_rules.values().cloned().collect());
    }

    pub fn remove_class(&mut self, name: &str) {
        self.changed();
        self.our_classes.remove(name);
        self.allocator.remove_class(name);
    }

    /// Takes in a claim as the server has it now. Returns the double
    /// allocation when its allocation collides with another claim's.
    pub fn apply_claim(&mut self, claim: ResourceClaim) -> Option<DoubleAllocation> {
        let key = claim_key(&claim);
        // A watch event older than what is stored (the controller's own
        // write is stored before its echo arrives) changes nothing.
        if let Some(stored) = self.claims.get(&key)
            && revision(stored).zip(revision(&claim)).is_some_and(|(stored, seen)| seen < stored)
        {
            return None;
        }
        let new = claim.status.as_ref().and_then(|s| s.allocation.clone());
        let mut double = None;
        if self.recorded.get(&key) != new.as_ref() {
            self.changed();
            if let Some(old) = self.recorded.remove(&key) {
                let base = self.claims.get(&key).unwrap_or(&claim);
                let _ = self.allocator.release(&with_allocation(base, old));
            }
            if let Some(allocation) = new {
                let others = self.allocator.conflicting_holders(&claim);
                if !others.is_empty() {
                    double = Some(DoubleAllocation { claim: key.clone(), others });
                }
                if self.allocator.record_allocated(&claim).is_ok() {
                    self.recorded.insert(key.clone(), allocation);
                }
            }
        }
        self.claims.insert(key, claim);
        double
    }

    pub fn remove_claim(&mut self, key: &str) {
        let claim = self.claims.remove(key);
        if let (Some(claim), Some(old)) = (claim, self.recorded.remove(key)) {
            self.changed();
            let _ = self.allocator.release(&with_allocation(&claim, old));
        }
    }

    pub fn apply_pod(&mut self, key: ClaimKey, pod: PodClaims) {
        if pod.claims.is_empty() {
            self.pods.remove(&key);
        } else {
            self.pods.insert(key, pod);
        }
    }

    pub fn remove_pod(&mut self, key: &str) {
        self.pods.remove(key);
    }

    pub fn claim(&self, key: &str) -> Option<&ResourceClaim> {
        self.claims.get(key)
    }

    pub fn claim_keys(&self) -> Vec<ClaimKey> {
        self.claims.keys().cloned().collect()
    }

    /// Pending pods that use `claim`: `(namespace/name, uid)`.
    pub fn pending_pods_of(&self, claim: &str) -> Vec<(ClaimKey, String)> {
        let mut pods: Vec<(ClaimKey, String)> = self
            .pods
            .iter()
            .filter(|(_, p)| p.pending && p.claims.iter().any(|c| c == claim))
            .map(|(k, p)| (k.clone(), p.uid.clone()))
            .collect();
        pods.sort();
        pods
    }

    /// Whether a pending pod waits for `claim`.
    pub fn has_pending_pod(&self, claim: &str) -> bool {
        self.pods.values().any(|p| p.pending && p.claims.iter().any(|c| c == claim))
    }

    /// Whether one of the claim's requests uses one of our classes.
    pub fn uses_our_classes(&self, claim: &ResourceClaim) -> bool {
        let requests = claim.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref());
        requests.into_iter().flatten().any(|r| {
            let exact = r.exactly.as_ref().map(|e| e.device_class_name.as_str());
            let first = r.first_available.iter().flatten().map(|s| s.device_class_name.as_str());
            exact.into_iter().chain(first).any(|class| self.our_classes.contains(class))
        })
    }

    /// Where the claim would go now, without taking it: the allocation, or
    /// why there is none. Claims of one spec that do not fit are explained
    /// once per change of the cluster.
    pub fn try_allocate(&mut self, key: &str) -> Option<Result<AllocationResult, Verdict>> {
        let claim = self.claims.get(key)?;
        let shape = claim.spec.as_ref().and_then(|s| serde_json::to_string(s).ok()).unwrap_or_default();
        if self.verdicts.0 != self.version {
            self.verdicts = (self.version, HashMap::new());
        }
        if let Some((explained, error)) = self.verdicts.1.get(&shape) {
            return Some(Err(Verdict::of(&renamed(error, explained, key))));
        }
        Some(match self.allocator.allocate_first_fit(None, &[claim]) {
            Ok(mut placement) => placement.allocations.pop().ok_or_else(|| Verdict {
                reason: "Unsatisfiable",
                note: "the allocator returned no result".to_owned(),
            }),
            Err(error) => {
                let verdict = Verdict::of(&error);
                self.verdicts.1.insert(shape, (key.to_owned(), error));
                Err(verdict)
            }
        })
    }

    /// Counts the allocation the controller just wrote as in use at once,
    /// before its watch event arrives, so that the next claim cannot get
    /// the same devices.
    pub fn record_written(&mut self, claim: ResourceClaim) -> Option<DoubleAllocation> {
        self.apply_claim(claim)
    }

    /// Warnings for a claim being created: a request that no device in the
    /// cluster matches today (the explainer's words), a selector that fails
    /// on the devices, or that the search did not finish within `within`.
    /// Empty when it could be allocated, or when it only waits for devices
    /// in use.
    pub fn fleet_warnings(&mut self, claim: &ResourceClaim, within: Duration) -> Vec<String> {
        self.allocator.set_search_budget(Some(SearchBudget::time(within.min(SEARCH_BUDGET))));
        let outcome = self.allocator.allocate_first_fit(None, &[claim]);
        self.allocator.set_search_budget(Some(SearchBudget::time(SEARCH_BUDGET)));
        match outcome {
            Ok(_) => Vec::new(),
            Err(AllocateError::Unsatisfiable(explanation)) => {
                let unmatched: Vec<&str> =
                    explanation.requests.iter().filter(|r| r.matching() == 0).map(|r| r.request.as_str()).collect();
                if unmatched.is_empty() {
                    return Vec::new();
                }
                vec![format!("no device in the cluster matches request {} today: {explanation}", unmatched.join(", "))]
            }
            Err(error @ AllocateError::Fatal(_)) => vec![Verdict::of(&error).note],
            Err(AllocateError::Undecided { within, searched, nodes, .. }) => vec![format!(
                "not checked against the cluster: the search for a node did not finish within {within} ({searched} of {nodes} nodes searched); the claim may wait long to be scheduled"
            )],
        }
    }

    pub fn fleet_devices(&self) -> usize {
        self.allocator.stats().devices
    }
}

/// `error`, found for claim `from`, as it reads for claim `to`.
fn renamed(error: &AllocateError, from: &str, to: &str) -> AllocateError {
    match error {
        AllocateError::Unsatisfiable(explanation) => {
            let mut explanation = explanation.clone();
            explanation.claim = to.to_owned();
            AllocateError::Unsatisfiable(explanation)
        }
        AllocateError::Fatal(fatal) => {
            let mut fatal = fatal.clone();
            rename_fatal(&mut fatal, from, to);
            AllocateError::Fatal(fatal)
        }
        AllocateError::Undecided { claim, within, searched, nodes } => AllocateError::Undecided {
            claim: if claim == from { to.to_owned() } else { claim.clone() },
            within: within.clone(),
            searched: *searched,
            nodes: *nodes,
        },
    }
}

fn rename_fatal(fatal: &mut FatalError, from: &str, to: &str) {
    let claim = match fatal {
        FatalError::CelCompile { claim, .. }
        | FatalError::CelRuntime { claim, .. }
        | FatalError::ClassNotFound { claim, .. }
        | FatalError::InvalidClaim { claim, .. }
        | FatalError::PoolNotReady { claim, .. }
        | FatalError::ConstraintWithAll { claim, .. }
        | FatalError::TooManyResults { claim, .. } => claim,
        FatalError::InvalidSlice { .. } | FatalError::Input(_) => return,
    };
    if claim == from {
        *claim = to.to_owned();
    }
}

/// `metadata.resourceVersion` as a number, when it is one (the API server's
/// are; the order of two is then the order of the writes).
fn revision(claim: &ResourceClaim) -> Option<u64> {
    claim.metadata.resource_version.as_deref()?.parse().ok()
}

fn with_allocation(claim: &ResourceClaim, allocation: AllocationResult) -> ResourceClaim {
    let mut claim = claim.clone();
    claim.status.get_or_insert_default().allocation = Some(allocation);
    claim
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(node: &str, gpus: usize) -> ResourceSlice {
        let devices: Vec<_> =
            (0..gpus).map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"type": {"string": "gpu"}}})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-slice")},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
        }))
        .unwrap()
    }

    fn class() -> DeviceClass {
        serde_json::from_value(json!({
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
        }))
        .unwrap()
    }

    fn claim(name: &str, count: u32) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}},
        }))
        .unwrap()
    }

    fn state() -> ClusterState {
        let mut state = ClusterState::new("gpu.nvidia.com", CelEnvironment::default());
        state.apply_class(&class());
        state.apply_slice(&slice("n1", 2));
        state
    }

    #[test]
    fn a_written_allocation_counts_at_once_and_its_echo_changes_nothing() {
        let mut state = state();
        state.apply_claim(claim("a", 2));
        assert!(state.uses_our_classes(state.claim("ns/a").unwrap()));
        let allocation = state.try_allocate("ns/a").unwrap().unwrap();
        let written = with_allocation(&claim("a", 2), allocation);
        assert_eq!(state.record_written(written.clone()), None);
        state.apply_claim(claim("b", 1));
        let verdict = state.try_allocate("ns/b").unwrap().unwrap_err();
        assert_eq!(verdict.reason, "Unsatisfiable");
        assert!(verdict.note.contains("ns/b"), "{}", verdict.note);
        // The watch echo of the same allocation is not a double allocation.
        assert_eq!(state.apply_claim(written), None);
        // Deleting the claim gives the devices back.
        state.remove_claim("ns/a");
        assert!(state.try_allocate("ns/b").unwrap().is_ok());
    }

    #[test]
    fn another_allocators_claim_on_the_same_device_is_a_double_allocation() {
        let mut state = state();
        state.apply_claim(claim("a", 1));
        let allocation = state.try_allocate("ns/a").unwrap().unwrap();
        state.record_written(with_allocation(&claim("a", 1), allocation.clone()));
        let double = state.apply_claim(with_allocation(&claim("s", 1), allocation));
        assert_eq!(double, Some(DoubleAllocation { claim: "ns/s".into(), others: vec!["ns/a".into()] }));
    }

    #[test]
    fn claims_of_one_spec_share_the_search_but_not_the_name() {
        let mut state = state();
        state.apply_claim(claim("x", 3));
        state.apply_claim(claim("y", 3));
        let x = state.try_allocate("ns/x").unwrap().unwrap_err();
        let y = state.try_allocate("ns/y").unwrap().unwrap_err();
        assert!(x.note.contains("ns/x") && !x.note.contains("ns/y"), "{}", x.note);
        assert_eq!(y.note, x.note.replace("ns/x", "ns/y"));
        // A change to the fleet invalidates what was found.
        state.apply_slice(&slice("n2", 4));
        assert!(state.try_allocate("ns/y").unwrap().is_ok());
    }

    #[test]
    fn selector_errors_are_their_own_reason() {
        let mut state = state();
        let mut bad = claim("bad", 1);
        let request = &mut bad.spec.as_mut().unwrap().devices.as_mut().unwrap().requests.as_mut().unwrap()[0];
        request.exactly.as_mut().unwrap().selectors =
            Some(vec![serde_json::from_value(json!({"cel": {"expression": "device.driver > 1"}})).unwrap()]);
        state.apply_claim(bad);
        let verdict = state.try_allocate("ns/bad").unwrap().unwrap_err();
        assert_eq!(verdict.reason, "SelectorError");
        assert!(verdict.note.contains("found no matching overload"), "{}", verdict.note);
    }

    #[test]
    fn pods_point_to_their_claims() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimName": "a"}, {"name": "t", "resourceClaimTemplateName": "tpl"}]},
            "status": {"phase": "Pending", "resourceClaimStatuses": [{"name": "t", "resourceClaimName": "p-t-xyz"}]},
        }))
        .unwrap();
        let mut state = state();
        state.apply_pod("ns/p".into(), PodClaims::of(&pod));
        assert_eq!(state.pending_pods_of("ns/a"), vec![("ns/p".to_owned(), "u".to_owned())]);
        assert!(state.has_pending_pod("ns/p-t-xyz") && !state.has_pending_pod("ns/other"));
    }
}
