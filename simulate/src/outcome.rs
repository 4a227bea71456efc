//! What `simulate` decided for each claim: the typed answer the printers
//! render and `kubectl gpu` reads.

use k8s_openapi::api::resource::v1::AllocationResult;
use serde::Serialize;

use super::engine::Outcome;
use super::workload::SimClaim;

/// One claim's outcome. Serialized, it is one entry of `-o json`'s
/// `results`, fields in the documented order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClaimOutcome {
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// `namespace/name` of the pod the claim was made for or first used by.
    pub pod: Option<String>,
    /// The workload that made the pod (`Deployment namespace/name`).
    pub workload: Option<String>,
    /// Whether `allocation` is set.
    pub allocated: bool,
    pub node: Option<String>,
    /// As it would be written to `status.allocation`.
    pub allocation: Option<AllocationResult>,
    /// A fatal error (bad selector, pool not ready for `All`, ...) rather
    /// than "does not fit".
    pub error: bool,
    /// Why it is not allocated; `None` when it is.
    pub reason: Option<String>,
    /// `namespace/name`, the namespace defaulted as the apiserver does:
    /// the table's first column.
    #[serde(skip)]
    pub key: String,
}

impl ClaimOutcome {
    /// `claim`'s entry, given the engine's `outcome` for it.
    pub(crate) fn new(claim: &SimClaim, outcome: Outcome) -> Self {
        ClaimOutcome {
            namespace: claim.claim.metadata.namespace.clone(),
            name: claim.claim.metadata.name.clone(),
            pod: claim.pod.clone(),
            workload: claim.workload.clone(),
            allocated: outcome.allocated(),
            node: outcome.node,
            allocation: outcome.allocation,
            error: outcome.error,
            reason: outcome.reason,
            key: claim.key.clone(),
        }
    }
}
